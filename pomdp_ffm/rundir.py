"""The run directory: the one place that knows its file names, its status, its lock and its checkpoints.

    <run>/config.yaml          the composed config the run was started with
    <run>/progress.csv         the reference's log, one row per update burst and per evaluation
    <run>/experiment.log       human-readable log
    <run>/attempts.log         one line per start, stop, finish, skip or failure of the run
    <run>/checkpoints/last.pt  the resume checkpoint (tensors and plain containers only)
    <run>/save/agent_*.pt      the reference's agent snapshots
    <run>/tb/                  TensorBoard events (eval.log_tensorboard=true)
    <run>/DONE                 the budget was reached and the evaluations were logged
    <run>/ERROR.txt            the traceback of the last failed attempt
    <run>/.lock                held (flock) by the process training in this directory

Status, first match wins: ``done`` (DONE), ``running`` (another process holds the lock), ``failed`` (ERROR.txt:
the last attempt failed; a rerun resumes it), ``resumable`` (a checkpoint), ``new``.

``python -m pomdp_ffm.rundir status <dir>...`` prints the status of run directories;
``python -m pomdp_ffm.rundir restore-config <dir>`` rewrites config.yaml from the checkpoint's own copy.
"""
from __future__ import annotations

import argparse
import datetime
import errno
import fcntl
import os
import pickle
import re
import socket
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any

STATUSES = ("done", "running", "failed", "resumable", "new")  # the order status() tests them in
CHECKPOINT_FORMAT = 3  # the layout of checkpoints/last.pt that this version writes and resumes


class RunDirError(RuntimeError):
    """A run directory cannot be used as asked; the message names the file and what to do."""


class RunDirLocked(RunDirError):
    pass


class CheckpointError(RunDirError):
    pass


class RunDir:
    CONFIG = "config.yaml"
    PROGRESS = "progress.csv"
    LOG = "experiment.log"
    ATTEMPTS = "attempts.log"
    CHECKPOINT = "checkpoints/last.pt"
    DIVERGED = "checkpoints/diverged.pt"
    SNAPSHOTS = "save"
    TENSORBOARD = "tb"
    DONE = "DONE"
    ERROR = "ERROR.txt"
    LOCK = ".lock"

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock_fd: int | None = None
        self._made: list[Path] = []

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    # --- names -----------------------------------------------------------------------------------------
    @property
    def config(self) -> Path:
        return self.path / self.CONFIG

    @property
    def progress(self) -> Path:
        return self.path / self.PROGRESS

    @property
    def checkpoint(self) -> Path:
        return self.path / self.CHECKPOINT

    @property
    def done(self) -> Path:
        return self.path / self.DONE

    @property
    def error(self) -> Path:
        return self.path / self.ERROR

    def snapshot(self, iters: int, perf: float) -> Path:
        """The reference's agent snapshot name: save/agent_<iters>_perf<return>.pt."""
        return self.path / self.SNAPSHOTS / f"agent_{iters}_perf{perf:.3f}.pt"

    def checkpoint_files(self) -> list[Path]:
        """Every checkpoint of the run: the resume checkpoint first, then the others, newest first."""
        found = [self.checkpoint] if self.checkpoint.is_file() else []
        others = [p for sub in (self.SNAPSHOTS, "checkpoints") for p in (self.path / sub).glob("*.pt")
                  if p.is_file() and p not in found]
        return found + sorted(others, key=lambda p: p.stat().st_mtime, reverse=True)

    def tmp_path(self, target: Path) -> Path:
        """A temporary file beside ``target``, unique to this process: two writers never share one."""
        return target.with_name(f".{target.name}.{socket.gethostname()}.{os.getpid()}.tmp")

    def remove_stale_temps(self) -> list[tuple[str, int]]:
        """Remove the temporary files of writes that never finished (a process killed while saving a checkpoint
        or rewriting progress.csv), which nothing else would ever remove; only the lock holder may, since no other
        process writes here then. Returns each file's name (relative to the run) and size, for the caller to say."""
        self._require_lock("temporary files")
        removed = []
        for folder in (self.path, self.path / "checkpoints", self.path / self.SNAPSHOTS):
            for p in sorted(folder.glob(".*.tmp")):
                if p.is_file():
                    removed.append((str(p.relative_to(self.path)), p.stat().st_size))
                    p.unlink()
        return removed

    # --- status ----------------------------------------------------------------------------------------
    def status(self) -> str:
        if self.done.exists():
            return "done"
        if self.holder() is not None and not self.holds_lock:
            return "running"
        if self.error.exists():
            return "failed"
        if self.checkpoint.exists():
            return "resumable"
        return "new"

    # --- the lock --------------------------------------------------------------------------------------
    @property
    def holds_lock(self) -> bool:
        return self._lock_fd is not None

    def holder(self) -> str | None:
        """'pid P on host H' of the process holding the lock, or None when nobody holds it."""
        path = self.path / self.LOCK
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # (also one that a refused start took back just now)
            return None
        except NotADirectoryError:
            raise RunDirError(f"{self.path} is not a directory") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno in (errno.EAGAIN, errno.EACCES):
                    return _describe(_read_lock_text(path))
                raise
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    def ensure_free(self) -> None:
        """Raise RunDirLocked, naming the holder, while another process holds the lock; touches nothing."""
        holder = self.holder()
        if holder is not None:
            raise self._in_use(holder)

    def _in_use(self, holder: str) -> "RunDirLocked":
        return RunDirLocked(f"{self.path} is in use by {holder}: another process is training in it; wait for it to "
                            "finish or stop it first")

    def acquire(self) -> str | None:
        """Take the exclusive lock for the life of this process's run, or raise RunDirLocked naming the holder.

        The lock is an flock on ``.lock``: the kernel releases it when its process dies, however it dies, so a
        lock file left by a dead process is detected (its lock is free) and taken over. Returns a note naming
        the dead holder in that case, else None."""
        if self._lock_fd is not None:
            return None
        # What this start creates, for release(untouched=True) to take back.
        self._made = self._make_folders()
        path = self.path / self.LOCK
        for _ in range(10):
            try:
                fd, made = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), True
            except FileNotFoundError:  # the folder itself was taken back by a start refused meanwhile
                self._made[:0] = self._make_folders()
                continue
            except FileExistsError:
                try:
                    # (a symbolic link to a file not there yet is followed and the file made, as a plain open would)
                    flags = os.O_RDWR | (os.O_CREAT if path.is_symlink() else 0)
                    fd, made = os.open(path, flags, 0o644), False
                except FileNotFoundError:  # removed meanwhile (a refused start taking back its lock file)
                    continue
                except IsADirectoryError:
                    raise RunDirError(f"{path} is a folder, where the run's lock file belongs; remove it") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if _same_file(fd, path):
                    break
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.EAGAIN, errno.EACCES):
                    raise self._in_use(_describe(_read_lock_text(path))) from None
                raise
            os.close(fd)  # the file was removed after we opened it, and its lock excludes nobody: lock the new one
        else:
            raise RunDirError(f"{path} kept being removed while this process tried to lock it; try again")
        if made:
            self._made.insert(0, path)
        self._lock_fd = fd
        try:
            previous = os.pread(fd, 4096, 0).decode(errors="replace").strip()
            stamp = datetime.datetime.now().isoformat(timespec="seconds")
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid={os.getpid()} host={socket.gethostname()} since={stamp}\n".encode(), 0)
        except OSError as e:  # (a full disk): nothing can be written here, and the lock is not kept
            self.release(untouched=True)
            raise RunDirError(f"{path} cannot be written ({e.strerror})") from None
        if previous:
            return f"took over the lock of {_describe(previous)}, which ended without releasing it"
        return None

    def _make_folders(self) -> list[Path]:
        try:
            return make_folders(self.path)
        except OSError as e:
            raise RunDirError(f"{self.path} cannot be made a directory ({e.strerror}: {e.filename})") from None

    def release(self, untouched: bool = False) -> None:
        """Release the lock. ``untouched``: this start wrote nothing but the lock (it was refused under it), so
        the lock file and the folders that acquire() created are removed again, where nothing else is in them."""
        if self._lock_fd is None:
            return
        try:
            if untouched and self.path / self.LOCK in self._made:
                (self.path / self.LOCK).unlink(missing_ok=True)  # before the unlock: no other start holds it
            else:
                os.ftruncate(self._lock_fd, 0)  # an empty lock file means "released cleanly"
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        finally:
            os.close(self._lock_fd)
            self._lock_fd = None
        if untouched:
            remove_made([p for p in self._made if p != self.path / self.LOCK])

    def _require_lock(self, what: str) -> None:
        if self._lock_fd is None:
            raise RunDirError(f"refusing to write {what} in {self.path} without holding its lock")
        # The flock belongs to the file this process opened: a .lock removed (or replaced) meanwhile, by hand, lets
        # another process lock a new file and train here too. Checked at every write through this class.
        if not _same_file(self._lock_fd, self.path / self.LOCK):
            raise RunDirError(f"refusing to write {what} in {self.path}: its lock file was removed or replaced "
                              "while this process held it, so another process may be training here too")

    # --- writing ---------------------------------------------------------------------------------------
    def write_text(self, target: Path, text: str) -> None:
        """Write a whole file next to ``target`` and swap it in: a crash never leaves half a file."""
        self._require_lock(target.name)
        tmp = self.tmp_path(target)
        tmp.write_text(text)
        os.replace(tmp, target)

    def save(self, obj: Any, target: Path) -> Path:
        """torch.save through a per-process temporary file and an atomic rename."""
        import torch  # here, not at the top: analysis reads run directories without paying for torch

        self._require_lock(target.name)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.tmp_path(target)
        try:
            torch.save(obj, tmp)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return target

    def record_attempt(self, event: str) -> None:
        self._require_lock(self.ATTEMPTS)
        # The scheduler's id of this attempt: SLURM array task, SLURM job, or submitit's local job.
        job = os.environ.get("SLURM_ARRAY_JOB_ID")
        job = f"{job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if job else \
            os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID") or "-"
        stamp = datetime.datetime.now().isoformat(timespec="seconds")
        with open(self.path / self.ATTEMPTS, "a") as f:
            f.write(f"{stamp} host={socket.gethostname()} pid={os.getpid()} job={job} {event}\n")

    def record_error(self, text: str) -> None:
        """ERROR.txt, only from the attempt that owns the directory (holds its lock)."""
        self.write_text(self.error, text)


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    held = os.fstat(fd)
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


def make_folders(path: Path) -> list[Path]:
    """``mkdir -p``, one folder at a time from the top: returns those this call made, deepest first, so that
    ``remove_made`` can take back exactly these (never one another process made meanwhile). Raises OSError
    after taking back its own."""
    made: list[Path] = []
    for attempt in range(10):
        try:
            for p in reversed([path, *path.parents]):
                if p.is_dir():  # (raises some OSErrors too: a name too long)
                    continue
                try:
                    p.mkdir()
                    made.insert(0, p)
                except FileExistsError:
                    if not p.is_dir():
                        raise  # a file in the way; else another process made it meanwhile
            return made
        except OSError as e:
            if isinstance(e, FileNotFoundError) and attempt < 9:
                continue  # a parent taken back meanwhile by another start (its remove_made): again
            remove_made(made)
            raise
    raise AssertionError("unreachable: the last attempt returns or raises")


def remove_made(made: list[Path]) -> None:
    """Remove the folders ``make_folders`` made, each only while empty: something put in since is someone else's."""
    for p in made:
        try:
            p.rmdir()
        except OSError:
            pass


def set_aside(path: Path, label: str) -> Path:
    """Move ``path`` to ``<name>.<label>-<time>`` beside it, under a name no earlier file has (two set-asides
    within a second keep both), and return the new path."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    aside, n = path.with_name(f"{path.name}.{label}-{stamp}"), 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.{label}-{stamp}-{n}")
    path.replace(aside)
    return aside


# --- checkpoints -----------------------------------------------------------------------------------------
def load_checkpoint(path: str | Path, map_location="cpu", mmap: bool = False) -> dict:
    """A checkpoint, loaded tensors-only (``torch.load(weights_only=True)``). Anything else (a pickle with code in
    it, a truncated file, an old format holding numpy objects) raises CheckpointError naming the file; the file is
    never unpickled in full, so a downloaded tree of runs cannot run code."""
    import torch

    path = Path(path)
    try:
        with warnings.catch_warnings():  # torch warns about the pickle protocol of files it then refuses
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except FileNotFoundError:
        raise CheckpointError(f"{path} does not exist") from None
    except (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError,
            AttributeError, TypeError) as e:
        raise CheckpointError(f"{path} cannot be read as a tensors-only checkpoint ({_why(e)})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not a checkpoint dict")
    return state


def _why(e: Exception) -> str:
    """The useful part of a loader error. Torch's own text opens with paragraphs that suggest loading the file
    unsafely, which is never the advice here; the reason comes after "WeightsUnpickler error:"."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    m = re.search(r"unsupported global:? GLOBAL (\S+)", text, re.IGNORECASE)
    if m:
        return f"it holds the Python object {m.group(1).rstrip('.,')}, which a tensors-only checkpoint never does"
    if "Weights only load failed" in text:
        tail = text.split("WeightsUnpickler error:", 1)[1] if "WeightsUnpickler error:" in text else ""
        reason = next((ln.strip() for ln in tail.splitlines() if ln.strip()), "")
        if reason.startswith("Unsupported operand"):
            return "it is not a tensors-only checkpoint: the safe unpickler stopped at an instruction it refuses"
        return f"the safe unpickler refused it: {reason[:120]}" if reason else "the safe unpickler refused it"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return (lines[0] if lines else type(e).__name__)[:160]


def _read_lock_text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _describe(lock_text: str) -> str:
    fields = dict(part.split("=", 1) for part in lock_text.split() if "=" in part)
    if "pid" not in fields:
        return "another process (its lock file names none)"
    since = f", since {fields['since']}" if "since" in fields else ""
    return f"pid {fields['pid']} on host {fields.get('host', '?')}{since}"


# --- command line ----------------------------------------------------------------------------------------
def _restore_config(run: RunDir) -> int:
    from omegaconf import OmegaConf

    state = load_checkpoint(run.checkpoint)
    if state.get("format") != CHECKPOINT_FORMAT or not isinstance(state.get("config"), dict):
        raise RunDirError(f"{run.checkpoint} was written by another version of pomdp-ffm (format "
                          f"{state.get('format')!r}, this one reads {CHECKPOINT_FORMAT}): its config copy is not used")
    run.acquire()
    try:
        run.write_text(run.config, OmegaConf.to_yaml(OmegaConf.create(state["config"])))
    finally:
        run.release()
    print(f"{run.config}: restored from {run.checkpoint}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pomdp_ffm.rundir", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    st = sub.add_parser("status", help="print each run directory's status")
    st.add_argument("dirs", nargs="+")
    rc = sub.add_parser("restore-config", help="rewrite config.yaml from the resume checkpoint's copy")
    rc.add_argument("dir")
    args = ap.parse_args(argv)
    try:
        if args.command == "status":
            missing = 0
            for d in args.dirs:
                run = RunDir(d)
                if not run.path.is_dir():
                    print(f"{'missing':9s} {d}  (no such directory)")
                    missing += 1
                    continue
                holder = run.holder()
                print(f"{run.status():9s} {d}" + (f"  (locked by {holder})" if holder else ""))
            return 2 if missing else 0
        return _restore_config(RunDir(args.dir))
    except RunDirError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
