"""A run that cannot write its files (a full disk, a file it may not write, something in the way) or whose update
cannot fit in memory ends with one line naming the file or the value, its exit code, and nothing half-written.
Injected in-process (as root, chmod stops no write): the failures are the OSErrors the kernel gives."""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY
from hang import HANG_S
from omegaconf import OmegaConf

from pomdp_ffm import agent as agent_module
from pomdp_ffm.jobs.plan import Refused
from pomdp_ffm.run.exits import EXIT_UNWRITABLE
from pomdp_ffm.run.unwritable import Unwritable
from pomdp_ffm.train import train_job
from pomdp_ffm.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
GRU = ("algo=sac", "seq_model=gru")
RERUN = ", then rerun (resume=true continues from the last checkpoint)"


def temporaries(run_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*.tmp"))


def last_attempt(run_dir: Path) -> str:
    return (run_dir / "attempts.log").read_text().splitlines()[-1].split(" ", 4)[-1]


class StopAfterFirstCheckpoint(Trainer):
    def _end_burst(self):
        evaluation = super()._end_burst()
        if self.standing.env_steps >= 600:
            self.stop.request(15)
        return evaluation


@pytest.fixture
def stopped(composed, tmp_path):
    """A run stopped with its checkpoint (600 env steps), and the config that resumes it."""
    run_dir = tmp_path / "run"
    assert train_job(composed(*GRU, "train.num_iters=5"), run_dir, trainer_cls=StopAfterFirstCheckpoint).stopped
    return run_dir, composed(*GRU, "train.num_iters=5", "resume=true")


def test_a_read_only_progress_file_at_resume_is_named_and_the_failure_recorded(stopped, monkeypatch):
    run_dir, cfg = stopped
    before = (run_dir / "progress.csv").read_bytes()

    def replace(src, dst):  # what an immutable (chattr +i) or read-only-mounted progress.csv gives
        if Path(dst).name == "progress.csv":
            raise PermissionError(errno.EPERM, "Operation not permitted", str(src), None, str(dst))
        return os.rename(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(Unwritable) as e:
        train_job(cfg, run_dir)
    assert str(e.value) == f"{run_dir / 'progress.csv'} cannot be written (Operation not permitted)"
    assert e.value.fix == "make it writable"
    assert (run_dir / "progress.csv").read_bytes() == before and temporaries(run_dir) == []
    assert last_attempt(run_dir) == "failed (see ERROR.txt)"
    assert "Unwritable" in (run_dir / "ERROR.txt").read_text()
    monkeypatch.undo()
    assert train_job(cfg, run_dir).stopped is False and (run_dir / "DONE").exists()  # writable again: it resumes


def test_a_full_disk_leaves_no_temporary_file_and_records_the_failure_in_attempts_log(composed, tmp_path, monkeypatch):
    # torch.save, handed a file object, raises the failed write's OSError as the context of its RuntimeError; the
    # 0-byte temporary of ERROR.txt is what a full disk left before.
    def save(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a checkpoint")
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0") from None

    write_text = pathlib.Path.write_text

    def full(self, *args, **kwargs):
        if self.name.startswith(".ERROR.txt."):
            self.touch()
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_text(self, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    monkeypatch.setattr(pathlib.Path, "write_text", full)
    run_dir = tmp_path / "run"
    with pytest.raises(Unwritable) as e:
        train_job(composed(*GRU), run_dir)
    line = f"{run_dir / 'checkpoints' / 'last.pt'} cannot be written (No space left on device)"
    assert str(e.value) == line and e.value.fix == "free some space"
    assert temporaries(run_dir) == [] and not (run_dir / "ERROR.txt").exists()
    assert not (run_dir / "checkpoints" / "last.pt").exists()
    assert last_attempt(run_dir) == f"failed: {line} (ERROR.txt not written: No space left on device)"


def test_a_file_where_the_checkpoints_folder_belongs_is_named(composed, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "checkpoints").write_text("not a folder")
    with pytest.raises(Unwritable) as e:
        train_job(composed(*GRU), run_dir)
    assert str(e.value) == f"{run_dir / 'checkpoints'} cannot be written (File exists)"
    assert e.value.fix == "move away what is in its way"
    assert temporaries(run_dir) == [] and last_attempt(run_dir) == "failed (see ERROR.txt)"


def command(module: str, *args: str) -> subprocess.CompletedProcess:
    """``python -m module args`` in a process of its own, this checkout's package first on its path."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, "-m", module, *args], env=env, capture_output=True, text=True, timeout=HANG_S
    )


def test_the_entry_point_says_an_unwritable_file_in_one_line_with_its_exit_code(tmp_path):
    # A real process: attempts.log is a folder (as an immutable one would refuse its append), so the start fails
    # to record itself.
    run_dir = tmp_path / "run"
    (run_dir / "attempts.log").mkdir(parents=True)
    proc = command("pomdp_ffm.train", "env=Pendulum-V-v0", *TINY, *GRU, f"hydra.run.dir={run_dir}")
    assert proc.returncode == EXIT_UNWRITABLE, proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [
        f"error: {run_dir / 'attempts.log'} cannot be written (Is a directory); move away what is in its way{RERUN}"
    ]
    assert temporaries(run_dir) == [] and not (run_dir / "checkpoints").exists()


@contextlib.contextmanager
def not_writable(path: Path):
    """``path``, a folder or file, one this process may not write: immutable (chattr +i) as root, whom permissions
    do not stop; read-only otherwise."""
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(0o500 if path.is_dir() else 0o400)
        try:
            yield
        finally:
            path.chmod(mode)
        return
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("as root only an immutable file refuses a write, and chattr +i is not allowed here")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_a_run_directory_that_cannot_be_written_in_is_one_line_with_its_exit_code(tmp_path):
    # Found before anything starts (nothing written), as a file of the run that cannot be written (exit 74, not a
    # refusal: the command is right, the folder is not writable): the run directory itself, or the folder where it
    # is to be made.
    parent = tmp_path / "runs"
    (parent / "run").mkdir(parents=True)
    with not_writable(parent / "run"), not_writable(parent):
        for run_dir, where in ((parent / "run", parent / "run"), (parent / "new", parent)):
            proc = command("pomdp_ffm.train", "env=Pendulum-V-v0", *TINY, f"hydra.run.dir={run_dir}")
            assert proc.returncode == EXIT_UNWRITABLE, proc.stderr[-2000:]
            assert proc.stderr.splitlines() == [
                f"error: hydra.run.dir={run_dir} cannot be written (no permission to write in {where}); make it "
                "writable, then rerun"
            ]
    assert [p.name for p in parent.iterdir()] == ["run"] and not any((parent / "run").iterdir())


def test_a_lock_file_that_cannot_be_written_is_named_with_its_exit_code(composed, tmp_path):
    # A lock file left by an earlier run, made immutable or read-only since: a start names it (exit 74), where it
    # failed with PermissionError's traceback; the folder is left as it was.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / ".lock").write_text("")
    with not_writable(run_dir / ".lock"):
        with pytest.raises(Unwritable) as e:
            train_job(composed(*GRU), run_dir)
    assert str(e.value).startswith(f"{run_dir / '.lock'} cannot be written (") and e.value.fix == "make it writable"
    assert [p.name for p in run_dir.iterdir()] == [".lock"]


def test_a_duplicated_key_in_a_runs_config_is_named_with_its_line(stopped):
    run_dir, cfg = stopped
    text = (run_dir / "config.yaml").read_text()
    (run_dir / "config.yaml").write_text(text + "seed: 3\n")  # seed: is already a key at the top level
    with pytest.raises(Refused) as e:
        train_job(cfg, run_dir)
    line = len(text.splitlines()) + 1
    assert str(e.value).startswith(f"{run_dir / 'config.yaml'}, line {line}: found duplicate key seed; ")
    assert "\n" not in str(e.value) and "restore-config" in str(e.value)


def test_an_update_that_cannot_fit_in_memory_is_refused_at_the_start(composed, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    trainer = Trainer(OmegaConf.to_object(composed(*GRU)), tmp_path / "unused")
    try:
        fixed, per_row = trainer.agent.update_memory()
    finally:
        trainer.close()
    # The memory a batch of 4 windows of 100 steps needs, no more: Pendulum's whole episodes (200 steps, the longest
    # window it takes) do not fit.
    free = fixed + per_row * 4 * 101
    monkeypatch.setattr(agent_module, "free_memory", lambda device: (free, "of host memory available"))
    fits = lambda b, t: fixed + per_row * b * (t + 1) <= free
    # The window too long (the case), then the batch too large: each named, with the largest that fits.
    for overrides, limit in (
        (("train.sampled_seq_len=200",), "train.sampled_seq_len"),
        (("train.batch_size=1000000", "train.sampled_seq_len=8"), "train.batch_size"),
    ):
        with pytest.raises(Refused) as e:
            train_job(composed(*GRU, *overrides), run_dir)
        msg = str(e.value)
        t, b = (200, 4) if limit == "train.sampled_seq_len" else (8, 1_000_000)
        m = re.fullmatch(
            rf"train.sampled_seq_len={t} with train.batch_size={b} needs about [\d.]+ GiB for an update, "
            rf"more than the {re.escape(f'{free / 2**30:.1f}')} GiB of host memory available; "
            rf"(?:\S+ <= \d+ or )?{limit} <= (\d+)(?: or \S+ <= \d+)? fits",
            msg,
        )
        assert m is not None, msg
        n = int(m.group(1))
        assert (
            (fits(4, n) and not fits(4, n + 1))
            if limit == "train.sampled_seq_len"
            else (fits(n, 8) and not fits(n + 1, 8))
        )
        assert not run_dir.exists()


def test_a_log_record_that_cannot_be_written_is_one_warning_and_the_run_goes_on(tmp_path, capsys):
    import logging

    from pomdp_ffm.jobs.start import RunLog

    handler = RunLog(tmp_path / "experiment.log")
    record = logging.LogRecord("pomdp_ffm", logging.INFO, __file__, 1, "a record", None, None)

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    handler.stream.write = full
    handler.handle(record)
    handler.handle(record)
    handler.close()
    assert capsys.readouterr().err.splitlines() == [
        f"warning: {tmp_path / 'experiment.log'} cannot be written (No space left on device): records left out"
    ]


def test_restore_config_says_an_unwritable_file_or_a_refusal_in_one_line_with_its_exit_code(tmp_path, capsys):
    from pomdp_ffm.run.checkpoint import CHECKPOINT_FORMAT
    from pomdp_ffm.run.exits import EXIT_REFUSED
    from pomdp_ffm.run.rundir import RunDir
    from pomdp_ffm.run.rundir import main as rundir_main

    run = RunDir(tmp_path / "run")
    run.checkpoint.parent.mkdir(parents=True)
    torch.save({"format": CHECKPOINT_FORMAT, "config": {"seed": 0}}, run.checkpoint)
    run.config.mkdir()  # (as an immutable config.yaml would refuse its replacement)
    # A real process: the exit code and stderr are what `python -m pomdp_ffm.run.rundir` gives, no traceback.
    proc = command("pomdp_ffm.run.rundir", "restore-config", str(run.path))
    assert proc.returncode == EXIT_UNWRITABLE, proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [
        (f"error: {run.config} cannot be written (Is a directory); move away what is in its way, then rerun")
    ]
    assert temporaries(run.path) == [] and proc.stdout == ""

    run.config.rmdir()
    torch.save({"format": CHECKPOINT_FORMAT + 1, "config": {"seed": 0}}, run.checkpoint)
    assert rundir_main(["restore-config", str(run.path)]) == EXIT_REFUSED
    assert capsys.readouterr().err.splitlines() == [
        (
            f"error: {run.checkpoint} was written by another version of pomdp-ffm (format {CHECKPOINT_FORMAT + 1}, "
            f"this one reads {CHECKPOINT_FORMAT}): its config copy is not used"
        )
    ]
    assert not run.config.exists()
    run.checkpoint.unlink()
    assert rundir_main(["restore-config", str(run.path)]) == EXIT_REFUSED
    assert capsys.readouterr().err.splitlines() == [f"error: {run.checkpoint} does not exist"]
