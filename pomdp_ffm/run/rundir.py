"""The run directory: the one place that knows its file names, its status, its lock and its checkpoints.
``python -m pomdp_ffm.run.rundir restore-config <dir>`` rewrites config.yaml from the checkpoint's own copy (exit
codes as a run's: 2 refused, nothing written; 74 a file cannot be written)."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import errno
import fcntl
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple

from .checkpoint import CheckpointError, load_checkpoint, other_format
from .unwritable import REFUSED_WRITES, Unwritable, writing


class Status(str, Enum):
    """A run directory's status, as ``jobs.plan.status`` and ``python -m pomdp_ffm.jobs.grid status`` name it."""

    DONE = "done"
    RUNNING = "running"
    DAMAGED = "damaged"
    FAILED = "failed"
    RESUMABLE = "resumable"
    NEW = "new"

    __str__ = str.__str__  # the value in messages and tables, on every Python (3.12 would print "Status.DONE")


# What jobs.plan.status says of a run directory, worst first after done.
STATUSES = tuple(s.value for s in Status)


class RunStatus(NamedTuple):
    """What jobs.plan.status says of a run directory: its kind and, for "damaged" and "running", why."""

    kind: Status
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}" if self.detail else str(self.kind)


@dataclass(frozen=True)
class JobResult:
    """What a job ends with: pomdp_ffm.train's ``run`` (a run, or a seed axis's runs in ``seeds``), which Hydra hands
    to grid.SweepOutcomes in the launching process. In a sweep, a job refused or failed says why here instead of
    raising, so that the sweep goes on. The stop signals a run answered stay with its caller."""

    skipped: bool = False  # finished before: nothing ran
    stopped: bool = False  # a stop signal ended it, its checkpoint saved
    signal: int | None = None
    standing: Any = None  # where it stands (trainer.Standing), for one run that ran
    seeds: dict[int, JobResult] = field(default_factory=dict)  # a seed axis: each seed's, by its index
    started: bool = True  # False: a sweep's job that the sweep's stop kept from starting
    refused: str = ""
    failed: str = ""

    @property
    def kind(self) -> str:
        """How it ended, as the sweep's summary counts it."""
        return "refused" if self.refused else "failed" if self.failed else "stopped" if self.stopped else "finished"


class RunDirError(RuntimeError):
    """A run directory cannot be used as asked; the message names the file and what to do."""


class LockLost(RunDirError):
    """The run's lock file was removed or replaced while this process held it: another process may be training in
    the directory now, so this one writes nothing more there (not even ERROR.txt or attempts.log)."""

    def __init__(self, run: RunDir, what: str):
        super().__init__(
            f"refusing to write {what} in {run.path}: its lock file was removed or replaced while this "
            "process held it, so another process may be training here too"
        )
        self.fix = f"check that no other process trains there (`python -m pomdp_ffm.jobs.grid status {run.path}`)"


def tmp_path(target: Path) -> Path:
    """A temporary file beside ``target``, unique to this process: two writers never share one."""
    return target.with_name(f".{target.name}.{socket.gethostname()}.{os.getpid()}.tmp")


def replace_file(target: Path, write: Callable[[Path], Any]) -> None:
    """``write(tmp)`` a whole file beside ``target``, then swap it in: a crash never leaves half a file."""
    tmp = tmp_path(target)
    try:
        with writing(target):
            write(tmp)
            # Without the syncs a machine crash (not only a killed process) may leave the new name on the old
            # file's place with data never written: an empty or half checkpoint where a whole one was.
            _fsync(tmp)
            os.replace(tmp, target)
            _fsync(target.parent, folder=True)
    finally:
        tmp.unlink(missing_ok=True)


def _fsync(path: Path, folder: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if folder else 0))
    try:
        os.fsync(fd)
    except OSError as e:
        # Some FUSE and network file systems cannot sync a folder: the rename is then as durable as they make it,
        # which is no reason to stop a run. A file that cannot be synced may not be on the disk: Unwritable.
        if not (folder and e.errno in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF)):
            raise
    finally:
        os.close(fd)


def replace_text(target: Path, text: str) -> None:
    replace_file(target, lambda tmp: tmp.write_text(text))


class RunDir:
    CONFIG = "config.yaml"  # the composed config the run was started with
    PROGRESS = "progress.csv"  # the reference's log, one row per update burst and per evaluation
    LOG = "experiment.log"  # human-readable
    ATTEMPTS = "attempts.log"  # one line per start, stop, finish, skip or failure of the run
    CHECKPOINT = "checkpoints/last.pt"  # the resume checkpoint (tensors and plain containers only)
    DIVERGED = "checkpoints/diverged.pt"  # the state at a non-finite loss
    SNAPSHOTS = "save"  # the reference's agent snapshots, agent_*.pt
    TENSORBOARD = "tb"  # TensorBoard events (eval.log_tensorboard=true)
    DONE = "DONE"  # the budget was reached and the evaluations were logged
    ERROR = "ERROR.txt"  # the traceback of the last failed attempt
    LOCK = ".lock"  # held (flock) by the process training in this directory

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock_fd: int | None = None
        self._made: list[Path] = []

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    config = property(lambda self: self.path / self.CONFIG)
    progress = property(lambda self: self.path / self.PROGRESS)
    checkpoint = property(lambda self: self.path / self.CHECKPOINT)
    done = property(lambda self: self.path / self.DONE)
    error = property(lambda self: self.path / self.ERROR)
    holds_lock = property(lambda self: self._lock_fd is not None)

    def snapshot(self, iters: int, perf: float) -> Path:
        return self.path / self.SNAPSHOTS / f"agent_{iters}_perf{perf:.3f}.pt"

    def checkpoint_files(self) -> list[Path]:
        """Every checkpoint of the run: the resume checkpoint first, then the others, newest first."""
        found = [self.checkpoint] if self.checkpoint.is_file() else []
        others = [
            p
            for sub in (self.SNAPSHOTS, "checkpoints")
            for p in (self.path / sub).glob("*.pt")
            if p.is_file() and p not in found
        ]
        return found + sorted(others, key=lambda p: p.stat().st_mtime, reverse=True)

    def remove_stale_temps(self) -> list[tuple[str, int]]:
        """Remove (under the lock) the temporary files of writes a killed process left; returns each name and size."""
        self._require_lock("temporary files")
        removed = []
        for folder in (self.path, self.path / "checkpoints", self.path / self.SNAPSHOTS):
            for p in sorted(folder.glob(".*.tmp")):
                if p.is_file():
                    removed.append((str(p.relative_to(self.path)), p.stat().st_size))
                    p.unlink()
        return removed

    def status(self) -> Status:
        """What the files say, first match first (``jobs.plan.status`` checks them as a start would)."""
        if self.done.exists():
            return Status.DONE
        if self.holder() is not None and not self.holds_lock:
            return Status.RUNNING
        if self.error.exists():
            return Status.FAILED
        return Status.RESUMABLE if self.checkpoint.exists() else Status.NEW

    def holder(self) -> str | None:
        """'pid P on host H' of the process holding the lock, or None when nobody holds it."""
        path = self.path / self.LOCK
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # (also one that a refused start took back just now)
            return None
        except NotADirectoryError:  # the run directory, or a folder above it, is a file: name that file
            file = next((p for p in (self.path, *self.path.parents) if p.exists()), self.path)
            raise RunDirError(
                f"{self.path} is not a directory"
                if file == self.path
                else f"{file} is a file where a folder of {self.path} belongs"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.EACCES):
                return _describe(path)
            raise
        finally:
            os.close(fd)

    def ensure_free(self) -> None:
        if (holder := self.holder()) is not None:
            raise self._in_use(holder)

    def _in_use(self, holder: str) -> RunDirError:
        return RunDirError(
            f"{self.path} is in use by {holder}: another process is training in it; wait for it to "
            "finish or stop it first"
        )

    def acquire(self) -> str | None:
        """Take the lock (an flock on .lock) or raise naming the holder; a dead holder's is taken over, with a note."""
        if self._lock_fd is not None:
            return None
        self._made = self._make_folders()  # what this start made, for release(untouched=True) to take back
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
                except OSError as e:  # (an immutable or read-only lock file)
                    raise self._unwritable(e, path) from None
            except OSError as e:  # (a folder that is immutable or read-only, a read-only file system, a full disk)
                raise self._unwritable(e, path) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if _same_file(fd, path):
                    break
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.EAGAIN, errno.EACCES):
                    raise self._in_use(_describe(path)) from None
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
            raise Unwritable(e.errno, e.strerror, str(path)) from None
        return f"took over the lock of {_describe(previous)}, which ended without releasing it" if previous else None

    def _make_folders(self) -> list[Path]:
        try:
            return make_folders(self.path)
        except OSError as e:
            if e.errno in REFUSED_WRITES:
                raise Unwritable(e.errno, e.strerror, e.filename or str(self.path)) from None
            raise RunDirError(f"{self.path} cannot be made a directory ({e.strerror}: {e.filename})") from None

    def _unwritable(self, e: OSError, lock: Path) -> OSError:
        """The lock file could not be opened to be written: Unwritable where the file system refused (the folders
        acquire() made taken back), else the error itself."""
        if e.errno not in REFUSED_WRITES:
            return e
        remove_made(self._made)
        return Unwritable(e.errno, e.strerror, str(lock))

    def release(self, untouched: bool = False) -> None:
        """``untouched`` (refused under the lock): also remove the lock file and the empty folders acquire() made."""
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
        if not _same_file(self._lock_fd, self.path / self.LOCK):
            raise LockLost(self, what)

    def write_text(self, target: Path, text: str) -> None:
        self._require_lock(target.name)
        replace_text(target, text)

    def save(self, obj: Any, target: Path) -> Path:
        def write(tmp: Path) -> None:
            import torch  # here, not at the top: analysis reads run directories without paying for torch

            with open(tmp, "wb") as f:  # (a file object: torch then raises the write's OSError)
                torch.save(obj, f)

        self._require_lock(target.name)
        with writing(target.parent):
            target.parent.mkdir(parents=True, exist_ok=True)
        replace_file(target, write)
        return target

    def record_attempt(self, event: str) -> None:
        self._require_lock(self.ATTEMPTS)
        # The scheduler's id of this attempt: SLURM array task, SLURM job, or submitit's local job.
        job = os.environ.get("SLURM_ARRAY_JOB_ID")
        job = (
            f"{job}_{os.environ['SLURM_ARRAY_TASK_ID']}"
            if job
            else os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID") or "-"
        )
        stamp = datetime.datetime.now().isoformat(timespec="seconds")
        with writing(self.path / self.ATTEMPTS), open(self.path / self.ATTEMPTS, "a") as f:
            f.write(f"{stamp} host={socket.gethostname()} pid={os.getpid()} job={job} {event}\n")


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def make_folders(path: Path) -> list[Path]:
    """``mkdir -p``, returning the folders this call made (not another process), deepest first; OSError: none left."""
    made: list[Path] = []
    for attempt in range(10):
        try:
            for p in reversed([path, *path.parents]):
                try:
                    if not p.is_dir():  # (raises some OSErrors too: a name too long)
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


def remove_made(made: list[Path]) -> None:
    """Remove the folders ``make_folders`` made, each only while empty: something put in since is someone else's."""
    for p in made:
        with contextlib.suppress(OSError):
            p.rmdir()


def set_aside(path: Path, label: str) -> Path:
    """Move ``path`` to ``<name>.<label>-<time>[-<n>]`` beside it, a name no earlier file has; returns that."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    aside, n = path.with_name(f"{path.name}.{label}-{stamp}"), 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.{label}-{stamp}-{n}")
    with writing(path):
        path.replace(aside)
    return aside


def _describe(lock: Path | str) -> str:
    try:
        text = lock.read_text() if isinstance(lock, Path) else lock
    except OSError:
        text = ""
    fields = dict(part.split("=", 1) for part in text.split() if "=" in part)
    if "pid" not in fields:
        return "another process (its lock file names none)"
    since = f", since {fields['since']}" if "since" in fields else ""
    return f"pid {fields['pid']} on host {fields.get('host', '?')}{since}"


def main(argv: list[str] | None = None) -> int:
    from omegaconf import OmegaConf

    from .exits import EXIT_OK, EXIT_REFUSED, EXIT_UNWRITABLE

    ap = argparse.ArgumentParser(prog="python -m pomdp_ffm.run.rundir", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("restore-config", help="rewrite config.yaml from the resume checkpoint's copy").add_argument("dir")
    run = RunDir(ap.parse_args(argv).dir)
    try:
        state = load_checkpoint(run.checkpoint)
        if (why := other_format(run.checkpoint, state)) is not None:
            raise RunDirError(f"{why}: its config copy is not used")
        run.acquire()
        try:
            run.write_text(run.config, OmegaConf.to_yaml(OmegaConf.create(state["config"])))
        finally:
            run.release()
    # As a run's (train.py): a lost lock is a write that could not be made, the rest a refusal.
    except (Unwritable, LockLost) as e:
        print(f"error: {e}; {e.fix}, then rerun", file=sys.stderr)
        return EXIT_UNWRITABLE
    except (RunDirError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_REFUSED
    print(f"{run.config}: restored from {run.checkpoint}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
