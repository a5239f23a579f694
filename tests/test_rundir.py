"""Run directories you can trust: one writer at a time, verified resume, refusals that write nothing, exit codes."""

from __future__ import annotations

import csv
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import TINY, compose_cfg
from hang import HANG_S
from marks import parametrize_first_fast

from pomdp_ffm import agent as agent_module
from pomdp_ffm.jobs.grid import combined_status
from pomdp_ffm.jobs.grid import main as grid_main
from pomdp_ffm.jobs.plan import status
from pomdp_ffm.metrics import TIMING as TIME_COLUMNS
from pomdp_ffm.run.checkpoint import CHECKPOINT_FORMAT, CheckpointError, load_checkpoint
from pomdp_ffm.run.exits import EXIT_OK, EXIT_REFUSED, EXIT_STOPPED, EXIT_UNWRITABLE
from pomdp_ffm.run.rundir import RunDir, RunDirError, RunStatus, Status
from pomdp_ffm.run.rundir import main as rundir_main
from pomdp_ffm.run.unwritable import Unwritable
from pomdp_ffm.train import Refused, train_job
from pomdp_ffm.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
CLI_TINY = [
    "env=Pendulum-V-v0",
    "train.num_init_rollouts_pool=1",
    "train.batch_size=4",
    "train.sampled_seq_len=8",
    "train.num_updates_per_iter=0.02",
    "env.num_eval_tasks=1",
    "eval.log_interval=1",
    "progress=false",
    "policy.rnn_hidden_size=32",
    "policy.dqn_layers=[32,32]",
    "policy.policy_layers=[32,32]",
    "checkpoint.interval=1",
]


def cli(run_dir: Path, *overrides: str, wait: bool = True, timeout: float = HANG_S):
    cmd = [sys.executable, "-m", "pomdp_ffm.train", *CLI_TINY, *overrides, f"hydra.run.dir={run_dir}"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    if not wait:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def eval_steps(run_dir: Path) -> list[int]:
    if not (run_dir / "progress.csv").exists():
        return []
    with open(run_dir / "progress.csv", newline="") as f:
        return [int(r["z/env_steps"]) for r in csv.DictReader(f) if r["z/env_steps"]]


def read(run_dir: Path) -> pd.DataFrame:
    return pd.read_csv(run_dir / "progress.csv").drop(columns=TIME_COLUMNS)


class StopAt600(Trainer):
    def _end_burst(self):
        evaluation = super()._end_burst()
        if self.standing.env_steps >= 600:
            self.stop.request(signal.SIGTERM)
        return evaluation


@pytest.fixture
def cut_run(composed, tmp_path):
    """A run stopped by a signal at 600 env steps (checkpoint saved), and the config that resumes it."""
    overrides = ("algo=sac", "seq_model=gru", "train.num_iters=5")
    run_dir = tmp_path / "cut"
    assert train_job(composed(*overrides), run_dir, trainer_cls=StopAt600).stopped
    return run_dir, composed(*overrides, "resume=true")


@pytest.fixture
def full_run(composed, tmp_path):
    run_dir = tmp_path / "full"
    train_job(composed("algo=sac", "seq_model=gru", "train.num_iters=5"), run_dir)
    return run_dir


# --- the lock ---------------------------------------------------------------------------------------------
def test_lock_refuses_a_second_holder_and_names_it(tmp_path):
    a, b = RunDir(tmp_path / "r"), RunDir(tmp_path / "r")
    assert a.acquire() is None and a.holds_lock
    with pytest.raises(RunDirError, match=rf"in use by pid {os.getpid()} on host "):
        b.acquire()
    assert b.status() == "running"
    a.release()
    assert b.status() == "new" and b.acquire() is None
    b.release()


def test_writes_stop_when_the_lock_file_was_removed(tmp_path):
    # Removed by hand while a run holds it, .lock no longer excludes anyone: a second process can lock a new file.
    # The holder's next write is refused instead of both writing here.
    a = RunDir(tmp_path / "r")
    a.acquire()
    a.write_text(a.config, "x")
    (tmp_path / "r" / ".lock").unlink()
    b = RunDir(tmp_path / "r")
    assert b.acquire() is None
    with pytest.raises(RunDirError, match="its lock file was removed or replaced while this process held it"):
        a.write_text(a.config, "y")
    with pytest.raises(RunDirError, match="its lock file was removed or replaced"):
        a.save({"x": 1}, a.checkpoint)
    b.write_text(b.config, "z")  # the new holder writes
    assert a.config.read_text() == "z"
    a.release()
    b.release()


@pytest.mark.slow
def test_a_lock_file_removed_under_a_running_job_ends_it_in_one_line(tmp_path):
    # The job rightly stops writing at its next checkpoint; recording that failure (ERROR.txt, attempts.log) would be
    # refused the same way, as another process may own the directory now: one line naming the directory and the
    # check to make, exit 74 (a file of the run could not be written), no traceback, nothing more written there.
    run_dir = tmp_path / "run"
    job = cli(run_dir, "train.num_iters=100000", wait=False)
    try:
        deadline = time.time() + HANG_S
        while time.time() < deadline and not eval_steps(run_dir) and job.poll() is None:
            time.sleep(0.1)
        assert eval_steps(run_dir), "the job did not start"
        attempts = (run_dir / "attempts.log").read_text()
        (run_dir / ".lock").unlink()
        _, err = job.communicate(timeout=HANG_S)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait(timeout=HANG_S)
    assert job.returncode == EXIT_UNWRITABLE, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err == (
        f"error: refusing to write last.pt in {run_dir}: its lock file was removed or replaced while this "
        "process held it, so another process may be training here too; check that no other process "
        f"trains there (`python -m pomdp_ffm.jobs.grid status {run_dir}`), then rerun (resume=true continues "
        "from the last checkpoint)\n"
    )
    assert (run_dir / "attempts.log").read_text() == attempts and not (run_dir / "ERROR.txt").exists()
    assert not list(run_dir.rglob("*.tmp")) and not (run_dir / ".lock").exists()
    assert RunDir(run_dir).status() == "resumable"


def test_a_lock_file_removed_while_it_is_being_locked_is_not_the_one_held(tmp_path, monkeypatch):
    # Another start, refused under its lock, takes back the .lock it made just after this one opened it: locking
    # that removed file would exclude nobody, so the lock is taken on the file that .lock names now.
    from pomdp_ffm.run import rundir

    (tmp_path / "r").mkdir()
    (tmp_path / "r" / ".lock").write_text("")
    real, done = os.open, []

    def opening(path, flags, *args):
        fd = real(path, flags, *args)
        if not done and str(path).endswith(".lock"):
            done.append(path)
            os.unlink(path)
        return fd

    monkeypatch.setattr(rundir.os, "open", opening)
    a = RunDir(tmp_path / "r")
    a.acquire()
    monkeypatch.setattr(rundir.os, "open", real)
    assert done and (tmp_path / "r" / ".lock").exists()
    with pytest.raises(RunDirError, match="is in use by pid"):
        RunDir(tmp_path / "r").acquire()
    a.release()


def test_a_run_folder_taken_back_while_it_is_being_locked_is_made_again(tmp_path, monkeypatch):
    # Another start, refused under its lock, takes back the (empty) folder it made, just after this start found
    # the folder there: the folder is made again and locked, not a FileNotFoundError.
    from pomdp_ffm.run import rundir

    real, calls = rundir.make_folders, []

    def racing(path):
        made = real(path)
        if not calls:
            calls.append(path)
            path.rmdir()
        return made

    monkeypatch.setattr(rundir, "make_folders", racing)
    a = RunDir(tmp_path / "new" / "run")
    a.acquire()
    assert calls and a.holds_lock and (tmp_path / "new" / "run" / ".lock").is_file()
    a.release(untouched=True)  # what it made, it takes back
    assert not (tmp_path / "new").exists()


def test_a_lock_file_that_is_a_link_to_a_missing_file_is_followed(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / ".lock").symlink_to(tmp_path / "elsewhere")
    a = RunDir(tmp_path / "r")
    assert a.acquire() is None and (tmp_path / "elsewhere").is_file()
    with pytest.raises(RunDirError, match="is in use by pid"):
        RunDir(tmp_path / "r").acquire()
    a.release()


def test_a_lock_that_cannot_be_written_is_not_kept(tmp_path, monkeypatch):
    import errno

    from pomdp_ffm.run import rundir

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rundir.os, "pwrite", full)
    a = RunDir(tmp_path / "r")
    with pytest.raises(Unwritable, match=r"\.lock cannot be written \(No space left on device\)"):  # (exit 74)
        a.acquire()
    monkeypatch.undo()
    assert not a.holds_lock and not (tmp_path / "r").exists()  # released, and what it made taken back
    b = RunDir(tmp_path / "r")
    assert b.acquire() is None
    b.release()


def test_paths_that_are_no_directory_are_refused_not_tracebacks(tmp_path):
    (tmp_path / "f").write_text("")
    for rundir, named in (
        (RunDir(tmp_path / "f"), "is not a directory"),
        (RunDir(tmp_path / "f" / "run"), f"{tmp_path / 'f'} is a file where a folder of"),
    ):
        with pytest.raises(RunDirError, match=f"cannot be made a directory|{re.escape(named)}"):
            rundir.ensure_free()
            rundir.acquire()
    (tmp_path / "r" / ".lock").mkdir(parents=True)
    with pytest.raises(RunDirError, match=r"\.lock is a folder, where the run's lock file belongs"):
        RunDir(tmp_path / "r").acquire()


def test_folders_are_made_again_when_a_parent_is_taken_back_meanwhile(tmp_path, monkeypatch):
    from pathlib import Path as P

    from pomdp_ffm.run.rundir import make_folders

    real, failed = P.mkdir, []

    def mkdir(self, *args, **kwargs):
        if not failed and self.name == "b":  # its parent "a", just made, is taken back by another start
            failed.append(self)
            raise FileNotFoundError(2, "No such file or directory", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(P, "mkdir", mkdir)
    made = make_folders(tmp_path / "a" / "b" / "c")
    assert failed and made == [tmp_path / "a" / "b" / "c", tmp_path / "a" / "b", tmp_path / "a"]


def test_the_directory_check_leaves_dot_dot_to_the_kernel(tmp_path, monkeypatch):
    # lnk/.. is the link's target's parent, not this folder (where a file named runs is in the way): the path
    # can be made, as mkdir would make it.
    from pomdp_ffm.jobs.precheck import why_not_makeable

    (tmp_path / "real" / "deep").mkdir(parents=True)
    (tmp_path / "lnk").symlink_to(tmp_path / "real" / "deep")
    (tmp_path / "runs").write_text("")
    monkeypatch.chdir(tmp_path)
    assert why_not_makeable(Path("lnk/../runs/x")) is None
    assert why_not_makeable(Path("runs/x")) == (f"Not a directory: {tmp_path / 'runs' / 'x'}", False)


def test_writes_need_the_lock(tmp_path):
    r = RunDir(tmp_path / "r")
    r.path.mkdir()
    with pytest.raises(RunDirError, match="without holding its lock"):
        r.write_text(r.config, "x")
    r.acquire()
    try:
        r.write_text(r.config, "x")
        assert r.config.read_text() == "x"
        assert not list(r.path.glob(".*.tmp"))  # the per-process temporary file was renamed into place
    finally:
        r.release()


def test_set_asides_in_one_second_keep_both(tmp_path, monkeypatch):
    import datetime

    from pomdp_ffm.run import rundir

    class Frozen(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(2026, 1, 2, 3, 4, 5)

    monkeypatch.setattr(rundir.datetime, "datetime", Frozen)
    path = tmp_path / "progress.csv"
    path.write_text("a")
    a = rundir.set_aside(path, "damaged")
    path.write_text("b")
    b = rundir.set_aside(path, "damaged")
    assert a.name == "progress.csv.damaged-20260102-030405" and b.name == a.name + "-2"
    assert a.read_text() == "a" and b.read_text() == "b"


def test_temporary_files_are_unique_to_the_process(tmp_path):
    from pomdp_ffm.run import rundir

    r = RunDir(tmp_path)
    tmp = rundir.tmp_path(r.checkpoint)
    assert str(os.getpid()) in tmp.name and tmp.parent == r.checkpoint.parent and tmp != r.checkpoint


@pytest.mark.slow
def test_two_writers_real_processes_then_a_killed_holder_is_taken_over(tmp_path):
    run_dir = tmp_path / "shared"
    slow = ("train.num_iters=400", "train.num_updates_per_iter=0.5", "resume=true")  # minutes: still running
    first = cli(run_dir, *slow, wait=False)
    try:
        deadline = time.time() + HANG_S
        while time.time() < deadline and len(eval_steps(run_dir)) < 1:
            time.sleep(0.2)
        assert eval_steps(run_dir), "the first process did not start"
        assert RunDir(run_dir).status() == "running"
        before = (run_dir / "progress.csv").read_text()
        second = cli(run_dir, *slow)
        assert second.returncode == EXIT_REFUSED
        assert f"is in use by pid {first.pid} on host" in second.stderr
        assert second.stderr.strip().count("\n") == 0  # one line
        # The second process wrote nothing: the first one's log only grew, no error file appeared.
        assert (run_dir / "progress.csv").read_text().startswith(before)
        assert not (run_dir / "ERROR.txt").exists()
        assert "start" in (run_dir / "attempts.log").read_text().splitlines()[-1]
        first.send_signal(signal.SIGKILL)  # dies holding the lock: the kernel releases it, the file stays
        first.wait(timeout=HANG_S)
    finally:
        if first.poll() is None:
            first.kill()
    assert (run_dir / ".lock").read_text().startswith(f"pid={first.pid} ")
    assert RunDir(run_dir).status() == "resumable"
    lock_before = (run_dir / ".lock").read_text()
    third = cli(run_dir, *slow, "train.num_iters=4")
    # A shorter budget is another experiment: refused before touching anything, the lock file included.
    assert third.returncode == EXIT_REFUSED and "train.num_iters: 400 -> 4" in third.stderr
    assert (run_dir / ".lock").read_text() == lock_before
    # The same command again: the dead holder's lock is taken over, and the run's log says so.
    fourth = cli(run_dir, *slow, wait=False)
    try:
        log = run_dir / "experiment.log"
        deadline = time.time() + HANG_S
        while time.time() < deadline and f"took over the lock of pid {first.pid}" not in log.read_text():
            time.sleep(0.2)
        assert f"took over the lock of pid {first.pid}" in log.read_text()
        assert (run_dir / ".lock").read_text().startswith(f"pid={fourth.pid} ")
    finally:
        fourth.kill()
        fourth.wait(timeout=HANG_S)


def test_sigterm_stops_with_its_own_exit_code_and_resumes(tmp_path):
    run_dir = tmp_path / "term"
    proc = cli(run_dir, "train.num_iters=400", wait=False)
    try:
        deadline = time.time() + HANG_S
        while time.time() < deadline and not eval_steps(run_dir):
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == EXIT_STOPPED
    assert RunDir(run_dir).status() == "resumable" and not (run_dir / "DONE").exists()
    assert "stopped by signal 15" in (run_dir / "attempts.log").read_text()


# --- settings are checked before anything is written ----------------------------------------------------
@parametrize_first_fast(
    "override,needle",
    [
        ("policy.lr=0", "policy.lr=0"),
        ("env.num_eval_tasks=0", "env.num_eval_tasks=0"),
        ("train.num_iters=-5", "train.num_iters=-5"),
        ("eval.log_interval=0", "eval.log_interval=0"),
        ("train.batch_size=-3", "train.batch_size=-3"),
        ("seed=-1", "seed=-1"),
        ("eval.log_interval=50", "no evaluation would ever be logged"),
    ],
)
def test_bad_settings_exit_2_with_one_line_and_write_nothing(tmp_path, override, needle):
    run_dir = tmp_path / "bad"
    proc = cli(run_dir, "train.num_iters=2", override)
    assert proc.returncode == EXIT_REFUSED, proc.stderr[-2000:]
    assert proc.stderr.startswith("error: ") and needle in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert not run_dir.exists()


@parametrize_first_fast("where", ["a file", "under a file", "a name too long"])
def test_a_run_directory_that_cannot_be_made_is_refused_in_one_line(tmp_path, where):
    # ... and leaves none of the folders it made on the way (the third case fails two levels down).
    (tmp_path / "f").write_text("")
    run_dir = {
        "a file": tmp_path / "f",
        "under a file": tmp_path / "f" / "run",
        "a name too long": tmp_path / "a" / "b" / ("z" * 300),
    }[where]
    proc = cli(run_dir, "train.num_iters=2")
    assert proc.returncode == EXIT_REFUSED and proc.stderr.strip().count("\n") == 0, proc.stderr[-2000:]
    assert proc.stderr.startswith(f"error: hydra.run.dir={run_dir} cannot be made a directory (")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_a_run_that_does_not_fit_in_memory_is_refused_naming_its_sizes(composed, tmp_path):
    class Huge(Trainer):
        def __init__(self, *a, **kw):
            raise MemoryError("Unable to allocate 3.64 TiB for an array with shape (1000000000000, 1)")

    with pytest.raises(
        Refused,
        match=r"^the run does not fit in memory as configured \(train.buffer_size=\d+, "
        r"policy.rnn_hidden_size=\d+, .*\): Unable to allocate 3.64 TiB",
    ):
        train_job(composed(), tmp_path / "r", trainer_cls=Huge)

    class Broken(Trainer):
        def __init__(self, *a, **kw):
            raise RuntimeError("a bug, not memory")

    with pytest.raises(RuntimeError, match="a bug, not memory"):  # anything else is not a refusal
        train_job(composed(), tmp_path / "r", trainer_cls=Broken)
    assert not (tmp_path / "r").exists()


def test_weights_that_do_not_fit_the_host_are_refused_before_any_is_allocated(composed, tmp_path, monkeypatch):
    # Counted on the meta device (agent.check_weights_fit): a refusal by type (DoesNotFit), where torch would raise a
    # plain RuntimeError for a failed host allocation. 1 KiB is less than any agent's weights.
    monkeypatch.setattr(agent_module, "host_memory_left", lambda: (2**10, "of host memory available"))
    with pytest.raises(
        Refused,
        match=r"^policy.rnn_hidden_size=\d+, policy.dqn_layers=\[.*\] and policy.policy_layers=\[.*\] need "
        r"[\d.e-]+ GiB of weights, more than the 9.54e-07 GiB of host memory available; smaller networks are needed$",
    ):
        train_job(composed(), tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_a_budget_whose_evaluations_all_fall_in_the_initial_pool_is_refused(tmp_path):
    # Pendulum's pool of 5 episodes is iterations 1-5 of the eval clock; 3 more iterations (6-8) hold no multiple
    # of a log_interval of 5: the run would train to its end and only then fail, so it is refused at the start.
    run_dir = tmp_path / "bad"
    proc = cli(run_dir, "train.num_init_rollouts_pool=5", "train.num_iters=3", "eval.log_interval=5")
    assert proc.returncode == EXIT_REFUSED and proc.stderr.startswith("error: "), proc.stderr[-2000:]
    assert "divides none of the iterations 6-8" in proc.stderr and proc.stderr.strip().count("\n") == 0
    assert not run_dir.exists()


# --- resume verifies before it continues ------------------------------------------------------------------
def test_resume_reproduces_the_uninterrupted_run(cut_run, full_run):
    run_dir, cfg = cut_run
    assert RunDir(run_dir).status() == "resumable"
    assert not train_job(cfg, run_dir).stopped
    pd.testing.assert_frame_equal(read(run_dir), read(full_run), check_exact=True)
    assert RunDir(run_dir).status() == "done"


@pytest.mark.slow
def test_deleted_config_is_refused_with_the_fix(cut_run, full_run, capsys):
    run_dir, cfg = cut_run
    (run_dir / "config.yaml").unlink()
    with pytest.raises(Refused, match=r"config.yaml is missing.*restore-config"):
        train_job(cfg, run_dir)
    assert not (run_dir / "config.yaml").exists() and not (run_dir / "ERROR.txt").exists()
    assert rundir_main(["restore-config", str(run_dir)]) == 0
    train_job(cfg, run_dir)
    pd.testing.assert_frame_equal(read(run_dir), read(full_run), check_exact=True)


def test_edited_config_is_refused(cut_run):
    run_dir, cfg = cut_run
    text = (run_dir / "config.yaml").read_text()
    (run_dir / "config.yaml").write_text(text.replace("seed: 0", "seed: 7"))
    # Which of the two was changed cannot be told (a checkpoint of another seed swapped in reads the same): the
    # message gives the fix for each, not only restore-config, which would copy a foreign config over this one.
    with pytest.raises(
        Refused,
        match=r"config.yaml differs from the copy in .*last.pt \(seed: 0 -> 7\): one of "
        r"them was damaged, edited or replaced. If config.yaml was, restore it with "
        r"`python -m pomdp_ffm.run.rundir restore-config .*`; if the checkpoint was",
    ):
        train_job(cfg, run_dir)


def test_another_config_is_refused(cut_run, composed):
    run_dir, _ = cut_run
    with pytest.raises(Refused, match=r"policy.lr: 0.0003 -> 0.001"):
        train_job(composed("algo=sac", "seq_model=gru", "train.num_iters=5", "resume=true", "policy.lr=1e-3"), run_dir)


@pytest.mark.slow
@parametrize_first_fast("damage", ["delete", "shorten", "edit"])
def test_damaged_progress_is_rebuilt_from_the_checkpoint(cut_run, full_run, damage, caplog):
    run_dir, cfg = cut_run
    path = run_dir / "progress.csv"
    lines = path.read_text().splitlines(keepends=True)
    if damage == "delete":
        path.unlink()
    elif damage == "shorten":
        path.write_text("".join(lines[:3]))
    else:
        path.write_text("".join(lines[:2] + [lines[2].replace(",", ",9", 1)] + lines[3:]))
    with caplog.at_level("WARNING", logger="pomdp_ffm"):
        train_job(cfg, run_dir)
    pd.testing.assert_frame_equal(read(run_dir), read(full_run), check_exact=True)
    warned = " ".join(r.getMessage() for r in caplog.records)
    if damage == "delete":
        assert "progress.csv is missing: rebuilt" in warned
    else:
        aside = list(run_dir.glob("progress.csv.damaged-*"))
        assert len(aside) == 1 and aside[0].name in warned  # nothing discarded without a word


@pytest.mark.slow
def test_rows_after_the_checkpoint_are_dropped_with_a_warning(composed, tmp_path, caplog):
    # Checkpoints every 2 iterations; the stop comes one iteration after the last one.
    overrides = ("algo=td3", "seq_model=mlp", "train.num_iters=5", "checkpoint.interval=2")
    train_job(composed(*overrides), tmp_path / "full")

    class Kill(Trainer):
        def _log_evaluation(self, *results):
            ret = super()._log_evaluation(*results)
            if self.standing.env_steps >= 600:
                raise KeyboardInterrupt
            return ret

    with pytest.raises(KeyboardInterrupt):
        train_job(composed(*overrides), tmp_path / "cut", trainer_cls=Kill)
    with caplog.at_level("WARNING", logger="pomdp_ffm"):
        train_job(composed(*overrides, "resume=true"), tmp_path / "cut")
    assert any("logged after the checkpoint" in r.getMessage() for r in caplog.records)
    pd.testing.assert_frame_equal(read(tmp_path / "cut"), read(tmp_path / "full"), check_exact=True)


def test_run_killed_before_its_first_checkpoint(composed, tmp_path, caplog):
    overrides = ("algo=sac", "seq_model=gru", "train.num_iters=3", "checkpoint.interval=100")

    class Kill(Trainer):
        def _log_evaluation(self, *results):
            super()._log_evaluation(*results)
            raise KeyboardInterrupt

    run_dir = tmp_path / "early"
    with pytest.raises(KeyboardInterrupt):
        train_job(composed(*overrides), run_dir, trainer_cls=Kill)
    assert RunDir(run_dir).status() == "new" and eval_steps(run_dir)
    # Under another config: refused, the directory holds another experiment's (unfinished) rows.
    with pytest.raises(Refused, match="policy.lr"):
        train_job(composed(*overrides, "resume=true", "policy.lr=1e-3"), run_dir)
    # Under the same config: started again, the old rows kept beside it and the user told.
    with caplog.at_level("WARNING", logger="pomdp_ffm"):
        train_job(composed(*overrides, "resume=true"), run_dir)
    aside = list(run_dir.glob("progress.csv.no-checkpoint-*"))
    assert len(aside) == 1 and any(aside[0].name in r.getMessage() for r in caplog.records)
    assert RunDir(run_dir).status() == "done"


@pytest.mark.slow
def test_finished_run_is_skipped_and_a_refusal_leaves_no_error_file(composed, full_run):
    attempts = (full_run / "attempts.log").read_text()
    with pytest.raises(Refused, match="was finished with a different config"):
        train_job(composed("algo=sac", "seq_model=gru", "train.num_iters=5", "resume=true", "seed=1"), full_run)
    assert not (full_run / "ERROR.txt").exists() and (full_run / "attempts.log").read_text() == attempts
    built = []

    class Counted(Trainer):
        def __init__(self, *a, **kw):
            built.append(1)
            super().__init__(*a, **kw)

    cfg = composed("algo=sac", "seq_model=gru", "train.num_iters=5", "resume=true")
    assert train_job(cfg, full_run, trainer_cls=Counted).skipped
    assert built == []  # a finished run builds no trainer: no env, no buffer, no agent
    assert (full_run / "attempts.log").read_text().splitlines()[-1].endswith("skipped (finished)")


def test_failed_run_writes_error_in_its_own_directory(composed, tmp_path):
    class Boom(Trainer):
        def _log_evaluation(self, *results):
            raise RuntimeError("boom")

    run_dir = tmp_path / "boom"
    with pytest.raises(RuntimeError, match="boom"):
        train_job(composed(), run_dir, trainer_cls=Boom)
    assert "RuntimeError: boom" in (run_dir / "ERROR.txt").read_text()
    assert RunDir(run_dir).status() == "failed"
    assert train_job(composed("resume=true"), run_dir).stopped is False  # the rerun starts again and finishes
    assert not (run_dir / "ERROR.txt").exists() and RunDir(run_dir).status() == "done"


# --- checkpoints: tensors only, damage named --------------------------------------------------------------
def test_checkpoint_loads_tensors_only(cut_run):
    run_dir, _ = cut_run
    state = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert state["format"] == CHECKPOINT_FORMAT and state["config"]["seed"] == 0
    assert isinstance(state["buffer"]["observs"], torch.Tensor) and "modules" in state["agent"]
    rows = state["progress"]["rows"]
    assert rows and all(isinstance(c, str) for r in rows for c in r)


def test_truncated_checkpoint_is_one_line_naming_the_file(cut_run):
    run_dir, cfg = cut_run
    path = run_dir / "checkpoints" / "last.pt"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(Refused) as e:
        train_job(cfg, run_dir)
    msg = str(e.value)
    assert str(path) in msg and "Delete it to start this run again" in msg and "\n" not in msg


class _Payload:
    def __init__(self, target: Path):
        self.target = target

    def __reduce__(self):
        return (Path.touch, (self.target,))


def test_crafted_checkpoint_never_runs_its_payload(cut_run, tmp_path):
    run_dir, cfg = cut_run
    marker = tmp_path / "payload-ran"
    with open(run_dir / "checkpoints" / "last.pt", "wb") as f:
        pickle.dump({"format": 2, "x": _Payload(marker)}, f)
    with pytest.raises(CheckpointError):
        load_checkpoint(run_dir / "checkpoints" / "last.pt")
    with pytest.raises(Refused, match="cannot be read as a tensors-only checkpoint"):
        train_job(cfg, run_dir)
    torch.save({"x": _Payload(marker)}, run_dir / "checkpoints" / "last.pt")  # the zip format too
    with pytest.raises(Refused, match="cannot be read as a tensors-only checkpoint"):
        train_job(cfg, run_dir)
    assert not marker.exists()


def test_status_command(cut_run, full_run, capsys):
    assert grid_main(["status", str(cut_run[0]), str(full_run)]) == EXIT_OK
    out = capsys.readouterr().out.split("\n")
    assert out[0] == f"resumable {cut_run[0]}" and out[1] == f"done      {full_run}"


def test_checkpoint_without_its_buffer_is_refused_in_one_line(composed, tmp_path):
    overrides = ("algo=sac", "seq_model=gru", "train.num_iters=5", "checkpoint.save_buffer=false")
    run_dir = tmp_path / "nobuf"
    assert train_job(composed(*overrides), run_dir, trainer_cls=StopAt600).stopped
    attempts = (run_dir / "attempts.log").read_text()
    with pytest.raises(Refused, match=r"saved without its replay buffer \(checkpoint.save_buffer=false\)"):
        train_job(composed(*overrides, "resume=true"), run_dir)
    assert not (run_dir / "ERROR.txt").exists() and (run_dir / "attempts.log").read_text() == attempts


@parametrize_first_fast("counters", [{"env_steps": -5}, {"env_steps": 10**9}, {"rl_steps": 1.5}])
def test_a_checkpoint_with_counters_no_run_reaches_is_refused(cut_run, counters):
    run_dir, cfg = cut_run
    path = run_dir / "checkpoints" / "last.pt"
    state = load_checkpoint(path)
    state["counters"].update(counters)
    torch.save(state, path)
    attempts = (run_dir / "attempts.log").read_text()
    with pytest.raises(Refused, match=r"last.pt holds counters no run reaches \((env_steps|rl_steps)="):
        train_job(cfg, run_dir)
    assert (run_dir / "attempts.log").read_text() == attempts


def test_garbage_checkpoint_gets_a_reason_not_torch_advice(cut_run):
    run_dir, cfg = cut_run
    path = run_dir / "checkpoints" / "last.pt"
    path.write_bytes(os.urandom(4000))
    with pytest.raises(Refused) as e:
        train_job(cfg, run_dir)
    msg = str(e.value)
    assert str(path) in msg and "weights_only" not in msg and "Re-running" not in msg and "\n" not in msg


@pytest.mark.slow
def test_a_key_added_later_is_no_difference_at_its_default(cut_run, full_run, tmp_path):
    # A run directory from before a key existed ran as the key's default says: it resumes and is skipped. (Such a
    # run's config.yaml and its checkpoint's copy both lack the key: they were written from one config.)
    for run_dir in (cut_run[0], full_run):
        text = (run_dir / "config.yaml").read_text()
        assert "  episodes_together: true\n" in text
        (run_dir / "config.yaml").write_text(text.replace("  episodes_together: true\n", ""))
        state = load_checkpoint(run_dir / "checkpoints" / "last.pt")
        del state["config"]["eval"]["episodes_together"]
        torch.save(state, run_dir / "checkpoints" / "last.pt")
    assert train_job(cut_run[1], full_run).skipped
    train_job(cut_run[1], cut_run[0])
    assert RunDir(cut_run[0]).status() == "done"


@pytest.mark.slow
@parametrize_first_fast("which", ["cut", "full"])
def test_a_config_cut_short_at_a_line_is_refused(cut_run, full_run, which):
    # Cut at a line boundary, config.yaml still parses, and its missing keys would read as an older version's at
    # their defaults; the checkpoint's copy has them, so the file is known to be damaged: refused, with the fix.
    run_dir = cut_run[0] if which == "cut" else full_run
    lines = (run_dir / "config.yaml").read_text().splitlines(keepends=True)
    (run_dir / "config.yaml").write_text("".join(lines[: len(lines) * 3 // 4]))
    with pytest.raises(
        Refused,
        match=r"config.yaml differs from the copy in .*last.pt \(it lacks \d+ key\(s\) that "
        r"the copy has \(.*restore-config",
    ):
        train_job(cut_run[1], run_dir)
    assert rundir_main(["restore-config", str(run_dir)]) == 0
    result = train_job(cut_run[1], run_dir)
    assert result.skipped if which == "full" else not result.stopped


@parametrize_first_fast("done", ["", "env_steps=600\n", "env_steps=1200\n", "finished\n"])
def test_a_done_file_that_is_not_the_runs_is_refused(cut_run, full_run, done):
    # DONE must say where the run finished, agree with its final checkpoint and reach its budget: a stray or
    # forged one in an unfinished run (stopped at 600 of 1200 env steps) is refused, not taken as finished.
    run_dir, cfg = cut_run
    (run_dir / "DONE").write_text(done)
    with pytest.raises(
        Refused,
        match=r"DONE (does not say where the run finished|says the run finished at 600 env "
        r"steps, short of its budget of 1200|says the run finished at 1200 env steps, "
        r"but .*last.pt is at 600).*; delete DONE to resume",
    ):
        train_job(cfg, run_dir)
    (run_dir / "DONE").unlink()
    train_job(cfg, run_dir)
    assert (run_dir / "DONE").read_text() == "env_steps=1200\n" and read(run_dir).equals(read(full_run))
    assert train_job(cfg, run_dir).skipped


def test_turning_off_the_buffer_at_resume_is_refused(cut_run):
    # checkpoint.save_buffer=false at a resume would overwrite the checkpoint that holds the buffer with one that
    # cannot be resumed: refused, the checkpoint left as it was.
    run_dir, cfg = cut_run
    before = (run_dir / "checkpoints" / "last.pt").read_bytes()
    cfg.checkpoint.save_buffer = False
    with pytest.raises(
        Refused,
        match=r"checkpoint.save_buffer=false would replace .*last.pt, which holds the "
        r"replay buffer this run resumes from",
    ):
        train_job(cfg, run_dir)
    assert (run_dir / "checkpoints" / "last.pt").read_bytes() == before


def test_a_resume_removes_the_temporary_files_of_a_killed_save(cut_run, full_run, caplog):
    # A process killed while saving leaves its temporary file (named by its host and pid); nothing else would
    # remove it, and a checkpoint's holds the replay buffer. The next start removes it, and says so.
    run_dir, cfg = cut_run
    orphans = [run_dir / "checkpoints" / ".last.pt.somehost.12345.tmp", run_dir / ".progress.csv.12345.tmp"]
    for p in orphans:
        p.write_bytes(b"x" * 100)
    train_job(cfg, run_dir)
    assert not any(p.exists() for p in orphans) and read(run_dir).equals(read(full_run))
    assert (
        "removed 2 half-written file(s) of an attempt that was killed while saving: "
        ".progress.csv.12345.tmp (100 bytes), checkpoints/.last.pt.somehost.12345.tmp (100 bytes)" in caplog.text
    )


def test_status_of_a_missing_directory_and_restore_from_another_format(cut_run, tmp_path, capsys):
    assert grid_main(["status", str(tmp_path / "nope")]) == EXIT_REFUSED
    assert capsys.readouterr().out.startswith("missing")
    run_dir, _ = cut_run
    state = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    state["format"] = CHECKPOINT_FORMAT + 1
    torch.save(state, run_dir / "checkpoints" / "last.pt")
    assert rundir_main(["restore-config", str(run_dir)]) == 2
    assert f"another version of pomdp-ffm (format {CHECKPOINT_FORMAT + 1}" in capsys.readouterr().err
    assert str(status(run_dir)).startswith(
        f"damaged: {run_dir / 'checkpoints' / 'last.pt'} was written by another "
        f"version of pomdp-ffm (format {CHECKPOINT_FORMAT + 1}"
    )


def test_a_failing_close_still_releases_the_lock(composed, tmp_path, monkeypatch):
    # Closing the envs can fail (a worker process that died): the run directory's lock is released anyway.
    from pomdp_ffm import trainer as trainer_mod

    def broken_close(self):
        raise BrokenPipeError("a worker died")

    monkeypatch.setattr(trainer_mod.Trainer, "close", broken_close)
    with pytest.raises(BrokenPipeError):
        train_job(composed(), tmp_path / "r")
    assert RunDir(tmp_path / "r").holder() is None


# --- statuses are the resume check ----------------------------------------------------------------------
GRU = ("algo=sac", "seq_model=gru")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One tiny finished run; each status case is a copy of it, damaged."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    train_job(compose_cfg([*TINY, *GRU]), run_dir)
    return run_dir


def _damage(run_dir: Path, case: str, tmp_path: Path) -> None:
    ckpt = run_dir / "checkpoints" / "last.pt"
    if not case.startswith(("as it is", "finished")):
        (run_dir / "DONE").unlink()  # unfinished: resume would load its checkpoint
    if case.endswith("truncated last.pt"):
        ckpt.write_bytes(ckpt.read_bytes()[:1000])
    elif case == "finished, deleted last.pt":  # (to save the space of its replay buffer)
        ckpt.unlink()
    elif case == "deleted config.yaml":
        (run_dir / "config.yaml").unlink()
    elif case == "crafted checkpoint":
        with open(ckpt, "wb") as f:
            pickle.dump({"format": CHECKPOINT_FORMAT, "x": _Payload(tmp_path / "payload-ran")}, f)
    elif case == "another experiment's config":
        text = (run_dir / "config.yaml").read_text()
        (run_dir / "config.yaml").write_text(text.replace("seed: 0", "seed: 3"))
    elif case == "counters no run reaches":
        state = load_checkpoint(ckpt)
        state["counters"]["env_steps"] = -5
        torch.save(state, ckpt)
    elif case == "a DONE short of the budget":
        (run_dir / "DONE").write_text("env_steps=400\n")
    elif case == "only DONE":
        for p in sorted(run_dir.iterdir()):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        (run_dir / "DONE").write_text("env_steps=600\n")
    elif case == "a plain file":
        shutil.rmtree(run_dir)
        run_dir.write_text("not a run\n")


STATUS_CASES = [
    ("as it is", r"done"),
    ("unfinished", r"resumable"),
    (
        "truncated last.pt",
        r"damaged: \S+/last.pt cannot be read as a tensors-only checkpoint \(.*\): it cannot be "
        r"resumed. Delete it .*",
    ),
    ("deleted config.yaml", r"damaged: \S+/config.yaml is missing, .*restore-config \S+"),
    ("crafted checkpoint", r"damaged: \S+/last.pt cannot be read as a tensors-only checkpoint .*"),
    (
        "another experiment's config",
        r"damaged: \S+/config.yaml differs from the copy in \S+/last.pt \(seed: 0 -> 3\)"
        r".*",
    ),
    ("counters no run reaches", r"damaged: \S+/last.pt holds counters no run reaches \(env_steps=-5\).*"),
    # A finished run's checkpoint must agree with DONE: one that cannot be read leaves DONE unchecked, so the run is
    # not taken as done (launch/README.md); one deleted (to save space) leaves it checked against config.yaml.
    (
        "finished, truncated last.pt",
        r"damaged: \S+/last.pt cannot be read as a tensors-only checkpoint \(.*\), so "
        r"\S+/DONE cannot be checked against it; .*delete the checkpoint.*",
    ),
    ("finished, deleted last.pt", r"done"),
    (
        "a DONE short of the budget",
        r"damaged: \S+/DONE says the run finished at 400 env steps, but \S+/last.pt is "
        r"at 800; delete DONE .*",
    ),
    ("only DONE", r"damaged: \S+ is finished but config.yaml is missing.*"),
    ("a plain file", r"damaged: \S+/run is not a directory"),
]


@pytest.mark.parametrize("case,expected", STATUS_CASES, ids=[case for case, _ in STATUS_CASES])
def test_status_is_what_a_start_would_do(finished, tmp_path, case, expected):
    # status() is plan(), the check every start makes: damaged exactly where a start refuses, with the start's
    # reason in one line; its own config (the status command) and the slot's (a sweep's job) agree here.
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    _damage(run_dir, case, tmp_path)
    cfg = compose_cfg([*TINY, *GRU, "resume=true"])
    before = sorted((p, p.stat().st_mtime_ns) for p in tmp_path.rglob("*"))
    got = str(status(run_dir, cfg))
    assert re.fullmatch(expected, got) and "\n" not in got, got
    assert status(run_dir).kind == status(run_dir, cfg).kind
    assert sorted((p, p.stat().st_mtime_ns) for p in tmp_path.rglob("*")) == before  # read only
    if got.startswith("damaged: "):
        with pytest.raises(Refused) as e:
            train_job(cfg, run_dir)
        assert str(e.value) == got[len("damaged: ") :]
        assert sorted((p, p.stat().st_mtime_ns) for p in tmp_path.rglob("*")) == before
    else:
        assert train_job(cfg, run_dir).skipped == (got == "done")
    assert not (tmp_path / "payload-ran").exists()


def test_a_file_where_a_folder_above_the_run_belongs_is_named(tmp_path):
    above = tmp_path / "above"
    above.write_text("not a folder\n")
    assert str(status(above / "run")) == f"damaged: {above} is a file where a folder of {above / 'run'} belongs"


def test_a_finished_run_does_not_fill_another_tasks_slot(finished):
    assert status(finished) == RunStatus(Status.DONE)
    got = str(status(finished, compose_cfg([*TINY, *GRU, "env=HopperBLT-V-v0"])))
    assert got.startswith(f"damaged: {finished} was finished with a different config (config.yaml); ")
    assert "env.env_name: 'Pendulum-V-v0' -> 'HopperBLT-V-v0'" in got


def test_a_seed_axis_job_is_as_good_as_its_worst_seed(finished, tmp_path, capsys):
    job = tmp_path / "job"
    cases = ["as it is", "truncated last.pt", "deleted config.yaml", "only DONE", "another experiment's config"]
    for k, case in enumerate(cases):
        shutil.copytree(finished, job / f"seed-{k}")
        _damage(job / f"seed-{k}", case, tmp_path)
    assert grid_main(["status", str(job)]) == EXIT_REFUSED
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"damaged   {job}" and len(lines) == 6
    assert lines[1] == "    done      seed-0"
    for k, line in enumerate(lines[2:], start=1):
        assert line.startswith(f"    damaged   seed-{k}  {job / f'seed-{k}'}"), line
    done, new = RunStatus(Status.DONE), RunStatus(Status.NEW)
    damaged, running = RunStatus(Status.DAMAGED, "x"), RunStatus(Status.RUNNING, "locked by y")
    assert combined_status([done, damaged, running, new]) == damaged
    assert combined_status([done, new]) == RunStatus(Status.RESUMABLE) and combined_status([done] * 5) == done


def test_a_write_reaches_the_disk_and_a_folder_that_cannot_sync_does_not_stop_it(tmp_path, monkeypatch):
    import errno
    import stat as stat_mod

    from pomdp_ffm.run.rundir import replace_text
    from pomdp_ffm.run.unwritable import Unwritable

    real, synced = os.fsync, []

    def fsync(fd, fail_files=False):
        folder = stat_mod.S_ISDIR(os.fstat(fd).st_mode)
        synced.append("folder" if folder else "file")
        if folder:  # (as some FUSE and network file systems answer)
            raise OSError(errno.EINVAL, "Invalid argument")
        if fail_files:
            raise OSError(errno.EIO, "Input/output error")
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    replace_text(tmp_path / "a.txt", "whole")
    assert (tmp_path / "a.txt").read_text() == "whole" and synced == ["file", "folder"]
    monkeypatch.setattr(os, "fsync", lambda fd: fsync(fd, fail_files=True))
    with pytest.raises(Unwritable) as e:
        replace_text(tmp_path / "a.txt", "half")
    assert str(e.value) == f"{tmp_path / 'a.txt'} cannot be written (Input/output error)"
    assert (tmp_path / "a.txt").read_text() == "whole" and not list(tmp_path.glob(".*.tmp"))
