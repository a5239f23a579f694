"""Launching: the paper grid's dry run, real multiruns through joblib and submitit's local backend,
failure isolation, skip-finished, and checkpoint-requeue-resume on the scheduler's warning signal."""

from __future__ import annotations

import csv
import importlib.util
import io
import os
import shlex
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from hang import HANG_S
from marks import parametrize_first_fast, slow_case

from pomdp_ffm.catalog import BASELINES, CHALLENGER
from pomdp_ffm.jobs.grid import sweep_jobs
from pomdp_ffm.jobs.plan import Refused, config_differences
from pomdp_ffm.jobs.precheck import precheck
from pomdp_ffm.run.checkpoint import CheckpointError, load_checkpoint
from pomdp_ffm.run.exits import EXIT_FAILED, EXIT_REFUSED
from pomdp_ffm.run.rundir import RunDir
from pomdp_ffm.run.unwritable import Unwritable
from pomdp_ffm.seq_models import available

ROOT = Path(__file__).resolve().parent.parent
BLT_PAPER = {f"{n}BLT-{v}-v0" for n in ("Ant", "HalfCheetah", "Hopper", "Walker") for v in "PV"}


def _paper_grid():
    spec = importlib.util.spec_from_file_location("paper_grid", ROOT / "launch" / "paper_grid.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def train(cwd: Path, *overrides: str, check: bool = True, timeout: float = HANG_S) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "pomdp_ffm.train", *overrides],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def eval_steps(run: Path) -> list[int]:
    with open(run / "progress.csv", newline="") as f:
        return [int(r["z/env_steps"]) for r in csv.DictReader(f) if r["z/env_steps"]]


# ---------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_dry_run_counts_the_paper_grid(tmp_path, capsys):
    grid = _paper_grid()
    root = tmp_path / "grid"
    assert grid.main(["--dry-run", "--root", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "160 jobs: 0 done, 0 running, 0 damaged, 0 failed, 0 resumable, 160 new"
    jobs = [l.split()[1] for l in lines[:-1]]
    assert len(set(jobs)) == 160  # one directory per (task, algo, model, seed): reruns find them again
    parts = {tuple(Path(j).relative_to(root).parts) for j in jobs}
    assert {p[0] for p in parts} == BLT_PAPER
    assert {p[1] for p in parts} == {"sac_ffm", "sac_gru", "td3_ffm", "td3_gru"}
    assert {p[2] for p in parts} == {f"seed-{k}" for k in range(5)}
    for algo in ("sac", "td3"):
        assert grid.main(["--dry-run", "--algo", algo, "--root", str(root)]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[-1] == "80 jobs: 0 done, 0 running, 0 damaged, 0 failed, 0 resumable, 80 new"
        assert all(f"/{algo}_" in l for l in out[:-1])
    assert not root.exists()  # a dry run starts nothing


@pytest.mark.slow
def test_dry_run_reports_run_status(tmp_path, capsys):
    # Each job's status is what its start would do under the job's own config (pomdp_ffm.jobs.plan.status):
    # marker files alone, another task's finished run, or a file where the run belongs are damaged, each with its
    # reason.
    from conftest import TINY, compose_cfg

    from pomdp_ffm.train import train_job

    root = tmp_path / "grid"
    slot = {
        name: root / task / model / f"seed-{k}"
        for name, task, model, k in [
            ("only DONE", "HopperBLT-P-v0", "sac_ffm", 0),
            ("empty last.pt", "HopperBLT-P-v0", "sac_gru", 3),
            ("failed", "AntBLT-V-v0", "td3_ffm", 1),
            ("a Pendulum run", "HopperBLT-V-v0", "sac_gru", 0),
            ("a file", "WalkerBLT-P-v0", "td3_gru", 4),
            ("locked", "AntBLT-P-v0", "sac_ffm", 2),
        ]
    }
    for d in slot.values():
        d.parent.mkdir(parents=True, exist_ok=True)
    (slot["only DONE"] / "checkpoints").mkdir(parents=True)
    (slot["only DONE"] / "DONE").write_text("env_steps=1510000\n")
    (slot["empty last.pt"] / "checkpoints").mkdir(parents=True)
    (slot["empty last.pt"] / "checkpoints" / "last.pt").write_bytes(b"")
    slot["failed"].mkdir()
    (slot["failed"] / "ERROR.txt").write_text("Traceback ...")
    train_job(compose_cfg([*TINY, "algo=sac", "seq_model=gru"]), slot["a Pendulum run"])
    slot["a file"].write_text("")
    held = RunDir(slot["locked"])
    held.acquire()
    try:
        status = {j.run_dir: str(j.status) for j in sweep_jobs(["experiment=paper", f"hydra.sweep.dir={root}"])}
        assert sum(s == "new" for s in status.values()) == 154
        got = {name: status[d] for name, d in slot.items()}
        assert got["only DONE"].startswith(f"damaged: {slot['only DONE']} is finished but config.yaml is missing")
        assert got["empty last.pt"].startswith(
            f"damaged: {slot['empty last.pt']}/checkpoints/last.pt cannot be read as a tensors-only checkpoint"
        )
        assert got["failed"] == "failed"
        assert got["locked"].startswith(f"running: locked by pid {os.getpid()} on host ")
        pendulum = got["a Pendulum run"]
        assert pendulum.startswith(f"damaged: {slot['a Pendulum run']} was finished with a different config")
        assert "env.env_name: 'Pendulum-V-v0' -> 'HopperBLT-V-v0'" in pendulum
        assert got["a file"] == f"damaged: {slot['a file']} is not a directory"
        # The dry run lists them, one line each (a damaged one with its reason), and exits 2: a launch refuses them.
        grid = _paper_grid()
        assert grid.main(["--dry-run", "--root", str(root)]) == EXIT_REFUSED
        lines = capsys.readouterr().out.splitlines()
        assert len(lines) == 161
        assert lines[-1] == "160 jobs: 0 done, 1 running, 4 damaged, 1 failed, 0 resumable, 154 new"
        assert (
            f"damaged   {slot['a file']}  [env=WalkerBLT-P-v0 algo=td3 seq_model=gru seed=4 experiment=paper "
            f"hydra/launcher=local hydra.sweep.dir={root}]  {slot['a file']} is not a directory" in lines
        )
    finally:
        held.release()
    # Command-line sweeps override the preset's, as in Hydra's BasicSweeper.
    assert len(sweep_jobs(["experiment=paper_td3", "seed=0,1", f"hydra.sweep.dir={root}"])) == 32


def test_config_differences_ignore_where_it_runs():
    a = {
        "seed": 0,
        "device": "cpu",
        "resume": True,
        "policy": {"lr": 3e-4, "ffm": {"beta": 0.01}},
        "checkpoint": {"interval": 20},
    }
    b = {
        "seed": 0,
        "device": "cuda",
        "resume": True,
        "policy": {"lr": 1e-3, "ffm": {"beta": 0.01}},
        "checkpoint": {"interval": 5},
    }
    assert config_differences(a, b) == ["policy.lr: 0.0003 -> 0.001"]
    assert config_differences(a, a) == []
    # How evaluation episodes are stepped and whether the update is a CUDA graph change no result.
    how = {"eval": {"episodes_together": True}, "train": {"cuda_graph": True}}
    assert config_differences(how, {"eval": {"episodes_together": False}, "train": {"cuda_graph": False}}) == []
    # A GRU run never reads policy.ffm; an FFM run does.
    gru = {"policy": {"seq_model": "gru", "algo_name": "sac", "ffm": {"beta": 0.01}, "td3": {"target_noise": 0.2}}}
    changed = {"policy": {"seq_model": "gru", "algo_name": "sac", "ffm": {"beta": 0.1}, "td3": {"target_noise": 0.3}}}
    assert config_differences(gru, changed) == []
    gru["policy"]["seq_model"] = changed["policy"]["seq_model"] = "ffm"
    assert config_differences(gru, changed) == ["policy.ffm.beta: 0.01 -> 0.1"]


@pytest.mark.slow  # (17 s)
def test_a_bad_job_refuses_the_sweep_before_anything_runs(tmp_path):
    # Job #0 (FFM) cannot take an FFM sizing that its hidden size cannot split; the GRU job would ignore it.
    # The whole sweep is refused up front, in one line naming the job, and nothing is launched or written.
    root = tmp_path / "sweep"
    models = (CHALLENGER, BASELINES[0])  # FFM reads policy.ffm, GRU does not
    proc = train(
        tmp_path,
        "experiment=smoke",
        f"hydra.sweep.dir={root}",
        "seed=0",
        f"seq_model={','.join(models)}",
        "policy.ffm.context_size=5",
        check=False,
    )
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and proc.stderr.strip().count("\n") == 0
    assert "policy.rnn_hidden_size=32 must be a multiple of policy.ffm.context_size=5 with" in proc.stderr
    assert "(in the job seq_model=ffm " in proc.stderr
    assert not root.exists()
    # Fixed, both run; rerun, both are skipped.
    train(
        tmp_path,
        "experiment=smoke",
        f"hydra.sweep.dir={root}",
        "seed=0",
        f"seq_model={','.join(models)}",
        "policy.ffm.context_size=1",
    )
    runs = [root / "Pendulum-V-v0" / f"sac_{m}" / "seed-0" for m in models]
    assert all((r / "DONE").exists() and len(eval_steps(r)) > 0 for r in runs)
    assert "context_size: 1" in (runs[0] / "config.yaml").read_text()
    train(
        tmp_path,
        "experiment=smoke",
        f"hydra.sweep.dir={root}",
        "seed=0",
        f"seq_model={','.join(models)}",
        "policy.ffm.context_size=1",
    )
    assert all((r / "attempts.log").read_text().splitlines()[-1].endswith("skipped (finished)") for r in runs)


@parametrize_first_fast(
    "override,needle",
    [
        ("policy.lrr=1e-3", "Could not override 'policy.lrr': Key 'lrr' not in 'PolicyConfig'"),
        ("env=Nope-v0", "Could not find 'env/Nope-v0'; the choices are AntBLT-F-v0"),
        ("algo=ppo", "Could not find 'algo/ppo'; the choices are sac, td3"),
        ("seq_model=hyena", f"the choices are {', '.join(sorted(available()))}"),
        ("seed=abc", "could not be converted to Integer"),
    ],
)
def test_composition_errors_are_one_line_and_exit_2(tmp_path, override, needle):
    proc = train(tmp_path, override, f"hydra.run.dir={tmp_path / 'run'}", check=False)
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and needle in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and not (tmp_path / "run").exists()


def test_an_override_of_hydras_sweep_that_hydra_would_fail_is_one_line_naming_the_sweep_that_works(tmp_path):
    # A sweep of a setting of Hydra's own: Hydra's three-line error and exit 1, after the check passed it.
    root = tmp_path / "sweep"
    proc = train(tmp_path, "experiment=smoke", "hydra.sweeper.params.seed=0,1", f"hydra.sweep.dir={root}", check=False)
    assert proc.returncode == EXIT_REFUSED and proc.stderr.splitlines() == [
        "error: hydra.sweeper.params.seed=0,1 sweeps a setting of Hydra's own (hydra.*), which Hydra does not do; "
        "sweep the setting itself: -m seed=0,1"
    ], proc.stderr[-3000:]
    assert not root.exists()
    # hydra.sweeper.params set where no preset gives it a value (Hydra fails to merge into its empty one): named,
    # not OmegaConf's "Unexpected type for root: NoneType"; a preset's can still be replaced or extended.
    sweep = ["-m", f"hydra.sweep.dir={root}"]
    for override in ('hydra.sweeper.params={seed:"0,1"}', 'hydra.sweeper.params.seed="0,1"'):
        with pytest.raises(Refused) as e:
            precheck([*sweep, override])
        assert str(e.value) == (
            f"{override}: only an experiment preset (conf/experiment/) gives hydra.sweeper.params a value to "
            "override, and none here does; sweep the settings themselves: -m seed=0,1"
        )
    assert precheck([*sweep, "experiment=smoke", 'hydra.sweeper.params={seed:"0,1"}']) is not None
    assert not root.exists()


@pytest.mark.slow
def test_a_presets_sweep_is_checked_before_anything_runs(tmp_path):
    # experiment=smoke sweeps seed=0,1 in its hydra.sweeper.params: with seeds=[0,2] its seed=1 jobs cannot name
    # their seed axis (by its first seed), and they are refused before the seed=0 jobs run, not after.
    root = tmp_path / "sweep"
    proc = train(tmp_path, "experiment=smoke", f"hydra.sweep.dir={root}", "seeds=[0,2]", check=False)
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and proc.stderr.strip().count("\n") == 0
    assert "needs seed=0" in proc.stderr and "seed=1" in proc.stderr
    assert not root.exists()


@pytest.mark.slow
def test_env_workers_under_joblibs_workers_are_refused_before_the_sweep_starts(tmp_path):
    # loky's workers cannot start env workers: the sweep is refused up front (one line, exit 2, nothing written)
    # instead of its first job failing inside a worker. Where joblib runs one job at a time, in the launching
    # process, they can start, and the check lets them.

    root = tmp_path / "sweep"
    proc = train(
        tmp_path,
        "experiment=smoke",
        "hydra/launcher=local",
        f"hydra.sweep.dir={root}",
        "eval.workers=true",
        "env.num_eval_tasks=2",
        check=False,
    )
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and proc.stderr.strip().count("\n") == 0
    assert "this sweep's jobs use 'loky'" in proc.stderr and "(in the job " in proc.stderr
    assert not root.exists()
    common = ["-m", "experiment=smoke", "hydra/launcher=local", f"hydra.sweep.dir={root}", "env.num_eval_tasks=2"]
    with pytest.raises(Refused, match="this sweep's jobs use 'loky'"):
        precheck([*common, "eval.workers=true"])
    assert precheck([*common, "eval.workers=true", "hydra.launcher.n_jobs=1"]) is not None
    assert precheck([*common, "eval.workers=true", "hydra/launcher=basic"]) is not None
    assert precheck([*common, "eval.workers=true", "eval.episodes_together=false"]) is not None  # no workers then


def test_the_run_directory_is_checked_up_front_where_it_can_be_resolved(tmp_path):
    # The working directory is tmp_path (conftest). A file named like the default run directory's first folder is
    # in the way of a run, not of a benchmark (which trains in a folder of its own); a directory named through
    # Hydra's runtime values cannot be resolved before Hydra starts, and is left to it. The check writes nothing.
    (tmp_path / "runs").write_text("")
    with pytest.raises(
        Refused,
        match=r"^hydra.run.dir=runs/Pendulum-V-v0/.* cannot be made a directory \(Not a "
        r"directory: ",
    ):
        precheck(["env=Pendulum-V-v0"])
    assert precheck(["env=Pendulum-V-v0"], check_dirs=False) is not None
    assert precheck(["env=Pendulum-V-v0", "hydra.run.dir=${hydra:runtime.cwd}/r"]) is not None
    assert precheck(["env=Pendulum-V-v0", f"hydra.run.dir={tmp_path / 'x' / 'y'}"]) is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
    os.chmod(tmp_path, 0o500)
    try:
        if not os.access(tmp_path, os.W_OK):  # (root writes anyway; tests/test_write_failures.py: immutable)
            with pytest.raises(Unwritable, match=r"cannot be written \(no permission to write in "):
                precheck(["env=Pendulum-V-v0", f"hydra.run.dir={tmp_path / 'x'}"])
    finally:
        os.chmod(tmp_path, 0o700)


@pytest.mark.slow
def test_a_seed_axis_refusal_is_one_line_and_leaves_nothing(tmp_path):
    # The seed axis refuses in pomdp_ffm/jobs/seeds.py, a module of the package, while `python -m pomdp_ffm.train`
    # runs train.py as __main__: the refusal is still caught as one (one line, exit 2, its folder removed).
    proc = train(
        tmp_path,
        "experiment=smoke",
        "seq_model=ffm",
        "seed=0",
        "seeds=[0,1]",
        "hydra.mode=RUN",
        f"hydra.run.dir={tmp_path / 'job' / 'x'}",
        check=False,
    )
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and proc.stderr.strip().count("\n") == 0
    assert "needs a run directory with a path component seed-0" in proc.stderr
    assert not (tmp_path / "job").exists()


@parametrize_first_fast(
    "extra,needle",
    [
        (["env=Foo-V-v0"], "Could not find 'env/Foo-V-v0'"),
        (["polcy.lr=1"], "Could not override 'polcy.lr'"),
        (["seq_model=ffm,hyena"], "Could not find 'seq_model/hyena'"),
        (["policy.lr=-1"], "policy.lr=-1.0 must be > 0"),
        (["--seed-axis", "seeds=[0,0]"], "must be null or a list of distinct seeds"),
        (["--seed-axis", "seed=0,1"], "needs seed=0 (the first seed names the job's run directory), not seed=1"),
    ],
)
def test_the_paper_grid_checks_every_job_before_listing_or_launching(tmp_path, capsys, extra, needle):
    grid = _paper_grid()
    assert grid.main(["--dry-run", "--root", str(tmp_path / "grid"), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and needle in err and err.strip().count("\n") == 0
    assert not (tmp_path / "grid").exists()


def _sigterm_when(cwd: Path, overrides: list[str], wait) -> tuple[int, str]:
    """``python -m pomdp_ffm.train OVERRIDES``, sent SIGTERM once ``wait(proc)`` returns: its exit code and output."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pomdp_ffm.train", *overrides],
        cwd=cwd,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait(proc)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out


def _wait_for_evaluations(proc, runs, n=1, timeout=HANG_S):
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if all((r / "progress.csv").exists() and len(eval_steps(r)) >= n for r in runs):
            return
        time.sleep(0.2)
    raise AssertionError(f"the runs did not start: {proc.communicate(timeout=HANG_S)[0][-3000:]}")


@pytest.mark.parametrize("launcher", [slow_case("basic"), slow_case("local")])
def test_a_stop_signal_to_a_sweep_stops_it(tmp_path, launcher):
    # SIGTERM to the launching process: the runs in hand (in this process, or in joblib's workers, to which it
    # is forwarded) save their checkpoints, the later jobs do not start, and the sweep exits 75, leaving no
    # process behind (a rerun resumes a checkpointed run: test_scheduler_warning_checkpoints_requeues_and_resumes).
    root = tmp_path / "sweep"
    cmd = ["experiment=smoke", f"hydra.sweep.dir={root}", f"hydra/launcher={launcher}", "train.num_iters=60"]
    first = [root / "Pendulum-V-v0" / "sac_ffm" / "seed-0"]
    if launcher == "local":
        cmd.append("hydra.launcher.n_jobs=2")
        first.append(root / "Pendulum-V-v0" / "sac_ffm" / "seed-1")
    rc, out = _sigterm_when(tmp_path, cmd, lambda proc: _wait_for_evaluations(proc, first))
    assert rc == 75, out[-3000:]
    assert "later jobs did not start; rerun the same command to resume" in out
    runs = sorted(p.parent for p in root.glob("*/*/seed-*/config.yaml"))
    assert runs == first  # the jobs after them did not start, and left no folder
    for run in runs:
        assert RunDir(run).status() == "resumable"  # checkpointed, and no process holds its lock any more
        last = (run / "attempts.log").read_text().splitlines()[-1]
        assert last.split(maxsplit=4)[-1].startswith("stopped by signal 15")


def _train_signalled(cwd: Path, target: str, signum: int, after: bool, *overrides: str):
    """``python -m pomdp_ffm.train OVERRIDES`` in a process whose ``target`` ("module:Owner.attr") sends it
    ``signum`` once, before (or ``after``) its first call: a signal at a chosen moment, without timing."""
    module, attr = target.split(":")
    code = (
        "import importlib, os, runpy, sys\n"
        f"owner = importlib.import_module({module!r})\n"
        f"*path, name = {attr!r}.split('.')\n"
        "for part in path:\n"
        "    owner = getattr(owner, part)\n"
        "real, sent = getattr(owner, name), []\n"
        "def send():\n"
        "    if not sent:\n"
        "        sent.append(1)\n"
        f"        os.kill(os.getpid(), {int(signum)})\n"
        "def wrapped(*a, **k):\n"
        f"    {'pass' if after else 'send()'}\n"
        "    out = real(*a, **k)\n"
        f"    {'send()' if after else 'pass'}\n"
        "    return out\n"
        "setattr(owner, name, wrapped)\n"
        "sys.argv = ['train', *sys.argv[1:]]\n"
        "runpy.run_module('pomdp_ffm.train', run_name='__main__')\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *overrides], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=HANG_S
    )


@pytest.mark.slow
def test_a_stop_signal_while_a_sweeps_job_is_set_up_stops_that_job(tmp_path):
    # The signal comes while the first job builds its trainer, before the job's own handler is installed: the
    # job still stops (with its checkpoint) instead of training to its end, and the sweep stops after it.
    root = tmp_path / "sweep"
    proc = _train_signalled(
        tmp_path,
        "pomdp_ffm.trainer:Trainer.__init__",
        signal.SIGUSR1,
        False,
        "experiment=smoke",
        f"hydra.sweep.dir={root}",
        "train.num_iters=30",
    )
    assert proc.returncode == 75, proc.stderr[-3000:]
    runs = sorted(p.parent for p in root.glob("*/*/seed-*/config.yaml"))
    assert runs == [root / "Pendulum-V-v0" / "sac_ffm" / "seed-0"]
    assert RunDir(runs[0]).status() == "resumable"
    assert "stopped by signal 10" in (runs[0] / "attempts.log").read_text()


@pytest.mark.slow
@parametrize_first_fast(
    "target,after", [("pomdp_ffm.trainer:Trainer.__init__", False), ("pomdp_ffm.run.rundir:RunDir.acquire", True)]
)
def test_a_stop_signal_while_a_single_run_starts_stops_it_with_a_checkpoint(tmp_path, target, after):
    # Before the trainer's own handler is in (the trainer being built; the lock just taken), a stop signal is
    # remembered and taken by that handler: exit 75 and a checkpoint to resume from, not death by the signal
    # (143), which left a lock file, or an empty directory, and no line in attempts.log.
    run = tmp_path / "run"
    proc = _train_signalled(
        tmp_path,
        target,
        signal.SIGTERM,
        after,
        "experiment=smoke",
        "hydra.mode=RUN",
        "seq_model=ffm",
        "seed=0",
        "train.num_iters=30",
        f"hydra.run.dir={run}",
    )
    assert proc.returncode == 75, proc.stderr[-3000:]
    assert RunDir(run).status() == "resumable"
    assert "stopped by signal 15" in (run / "attempts.log").read_text()


def _check_smoke_grid(root: Path) -> None:
    runs = sorted(root.glob("Pendulum-V-v0/sac_*/seed-*"))
    assert [str(r.relative_to(root)) for r in runs] == [
        "Pendulum-V-v0/sac_ffm/seed-0",
        "Pendulum-V-v0/sac_ffm/seed-1",
        "Pendulum-V-v0/sac_gru/seed-0",
        "Pendulum-V-v0/sac_gru/seed-1",
    ]
    for run in runs:
        steps = eval_steps(run)
        assert steps and steps == sorted(steps)
        assert (run / "DONE").exists() and (run / "config.yaml").exists()
        assert not (run / ".hydra").exists()  # config.yaml is the run's one record of its config


# The launchers pickle the entry point's functions, and only runs through them show it when something they
# reference cannot be pickled: joblib's here (12 s, not slow); submitit's (20 s, slow) also in
# test_scheduler_warning_checkpoints_requeues_and_resumes and tests/test_seeds.py's launcher test, in the
# default suite.
@pytest.mark.parametrize("launcher", [slow_case("local"), slow_case("slurm_local")])
def test_smoke_multirun_and_rerun_skips(tmp_path, launcher):
    root = tmp_path / "sweep"
    train(tmp_path, "experiment=smoke", f"hydra.sweep.dir={root}", f"hydra/launcher={launcher}")
    _check_smoke_grid(root)
    if launcher == "slurm_local":
        assert list((root / ".submitit").iterdir())  # the jobs really went through submitit
    before = {p: p.read_text() for p in root.glob("*/*/*/progress.csv")}
    train(tmp_path, "experiment=smoke", f"hydra.sweep.dir={root}", f"hydra/launcher={launcher}")
    for p, text in before.items():
        assert p.read_text() == text
        assert (p.parent / "attempts.log").read_text().splitlines()[-1].endswith("skipped (finished)")


@pytest.mark.slow
def test_scheduler_warning_checkpoints_requeues_and_resumes(tmp_path):
    # submitit's local backend runs the cluster code path: its signal handler, the pickled job and the
    # requeue (a restart of the same job). USR2 is submitit's warning signal (SLURM's --signal=USR2@delay).
    root = tmp_path / "sweep"
    run = root / "Pendulum-V-v0" / "sac_ffm" / "seed-0"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pomdp_ffm.train",
            "experiment=smoke",
            f"hydra.sweep.dir={root}",
            "hydra/launcher=slurm_local",
            "seed=0",
            "seq_model=ffm",
            "train.num_iters=30",
        ],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.time() + HANG_S
        while time.time() < deadline and not ((run / "progress.csv").exists() and len(eval_steps(run)) >= 2):
            time.sleep(0.2)
        assert len(eval_steps(run)) >= 2, "the job did not start"
        start = [l for l in (run / "attempts.log").read_text().splitlines() if l.endswith(" start")][-1]
        os.kill(int(start.split("pid=")[1].split()[0]), signal.SIGUSR2)
        out, _ = proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    attempts = (run / "attempts.log").read_text().splitlines()
    events = [" ".join(l.split()[4:]) for l in attempts]
    assert events[0] == "start" and events[1].startswith("stopped by signal") and events[2] == "start"
    assert events[3].startswith("finished at")
    assert len({l.split()[2] for l in attempts[:2]} | {l.split()[2] for l in attempts[2:]}) == 2  # a new process
    log = (run / "experiment.log").read_text()
    assert "checkpoint saved" in log and "resumed from" in log
    steps = eval_steps(run)
    assert steps == sorted(set(steps)) and steps[-1] >= 200 * 31  # monotone, no duplicated rows, complete
    assert (run / "DONE").exists()


def test_slurm_preset_overrides_reach_sbatch(tmp_path, monkeypatch):
    # Every resource named in the issue is overridable on the command line and ends up in the sbatch
    # script. submitit refuses to build a SLURM executor without srun on PATH, hence the stand-in.
    import submitit
    from hydra import compose, initialize_config_dir
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from omegaconf import OmegaConf

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text("#!/bin/sh\nexit 0\n")
    (fake / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(
            "config",
            return_hydra_config=True,
            overrides=[
                "hydra/launcher=slurm",
                "hydra.launcher.partition=gpu",
                "hydra.launcher.account=proj",
                "hydra.launcher.timeout_min=720",
                "hydra.launcher.gpus_per_node=2",
                "hydra.launcher.cpus_per_task=4",
                "hydra.launcher.mem_gb=32",
                "hydra.launcher.array_parallelism=10",
                "+hydra.launcher.additional_parameters.reservation=res1",
                f"hydra.sweep.dir={tmp_path}",
            ],
        )
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=False)
    assert launcher["_target_"].endswith("SlurmLauncher")
    # The plugin's own mapping (hydra_submitit_launcher.submitit_launcher.BaseSubmititLauncher.launch).
    ex = submitit.AutoExecutor(
        cluster="slurm", folder=tmp_path / "submitit", slurm_max_num_timeout=launcher["max_num_timeout"]
    )
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    ex.update_parameters(
        **{
            k if k in base else f"slurm_{k}": v
            for k, v in launcher.items()
            if k not in ("_target_", "submitit_folder", "max_num_timeout", "name")
        },
        name="job",
    )
    text = ex._executor._make_submission_file_text("python -c pass", "uid")
    for line in (
        "--partition=gpu",
        "--account=proj",
        "--time=720",
        "--gpus-per-node=2",
        "--cpus-per-task=4",
        "--mem=32GB",
        "--reservation=res1",
        f"--signal=USR2@{launcher['signal_delay_s']}",
    ):
        assert f"#SBATCH {line}\n" in text, (line, text)
    assert launcher["array_parallelism"] == 10 and launcher["max_num_timeout"] > 0


def test_scheduler_warning_defers_submitit_until_checkpoint():
    from pomdp_ffm.run.signals import StopSignals

    calls = []
    old2 = signal.signal(signal.SIGUSR2, lambda s, f: calls.append("requeue"))  # stands in for submitit
    try:
        with StopSignals() as stop:
            os.kill(os.getpid(), signal.SIGUSR2)
            time.sleep(0.05)
            assert stop.requested == signal.SIGUSR2 and calls == []  # the requeue waits for the checkpoint
        stop.hand_over()
        assert calls == ["requeue"]
        calls.clear()
        # Outside training the warning goes straight to submitit: there is nothing new to save.
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.05)
        assert calls == ["requeue"]
        # SIGTERM stops the run but never requeues it.
        calls.clear()
        with StopSignals() as stop:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        stop.hand_over()
        assert stop.requested == signal.SIGTERM and calls == []
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)
        with StopSignals() as stop:  # outside submitit the warning signal is left alone
            assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGUSR2, old2)


@pytest.mark.slow
def test_a_stop_after_a_jobs_last_look_still_stops_the_sweep(tmp_path):
    # The signal comes once the first job has trained (its final evaluation, checkpoint and DONE being written),
    # when nothing in the job looks at it any more: that job is done, and the sweep still stops after it.
    root = tmp_path / "sweep"
    proc = _train_signalled(
        tmp_path, "pomdp_ffm.trainer:Trainer.train", signal.SIGUSR1, True, "experiment=smoke", f"hydra.sweep.dir={root}"
    )
    assert proc.returncode == 75, proc.stderr[-3000:]
    runs = sorted(p.parent for p in root.glob("*/*/seed-*/config.yaml"))
    assert runs == [root / "Pendulum-V-v0" / "sac_ffm" / "seed-0"] and RunDir(runs[0]).status() == "done"


@pytest.mark.slow
def test_a_stop_while_the_command_is_checked_starts_nothing(tmp_path):
    root = tmp_path / "sweep"
    proc = _train_signalled(
        tmp_path,
        "pomdp_ffm.jobs.grid:job_overrides",
        signal.SIGTERM,
        False,
        "experiment=smoke",
        f"hydra.sweep.dir={root}",
    )
    assert proc.returncode == 75 and "before anything started" in proc.stderr, proc.stderr[-3000:]
    assert not root.exists()


def test_a_stop_while_the_entry_point_imports_torch_starts_nothing(tmp_path):
    # SIGTERM as `python -m pomdp_ffm.train` first imports torch (its first seconds): held, not the end of the
    # process by the signal (143), and the process exits 75 in one line, having written nothing.
    run = tmp_path / "run"
    code = (
        "import os, runpy, signal, sys\n"
        "class SignalAtTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch':\n"
        "            sys.meta_path.remove(self)\n"
        "            os.kill(os.getpid(), signal.SIGTERM)\n"
        "sys.meta_path.insert(0, SignalAtTorch())\n"
        "sys.argv = ['train', *sys.argv[1:]]\n"
        "runpy.run_module('pomdp_ffm.train', run_name='__main__')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "env=Pendulum-V-v0", f"hydra.run.dir={run}"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert proc.returncode == 75, (proc.returncode, proc.stderr[-3000:])
    assert proc.stderr.splitlines() == ["stopped by signal 15 before anything started; rerun the same command"]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_stop_before_a_joblib_sweeps_workers_exist_starts_no_job(tmp_path):
    # The launcher takes the signal before joblib has started a worker: the workers it starts afterwards are sent
    # it too (blocked until their first job, they take it there), so no job starts and the sweep exits 75.
    root = tmp_path / "sweep"

    def sweep_started(proc):
        deadline = time.time() + HANG_S
        while not (root / "multirun.yaml").exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.01)  # Hydra writes it as the sweep starts, before it hands the jobs to joblib

    rc, out = _sigterm_when(
        tmp_path,
        ["experiment=smoke", f"hydra.sweep.dir={root}", "hydra/launcher=local", "hydra.launcher.n_jobs=2"],
        sweep_started,
    )
    assert rc == 75, out[-3000:]
    assert not list(root.glob("*/*/seed-*/config.yaml")), out[-3000:]


def test_a_workers_stop_signal_waits_until_its_handler_is_in(tmp_path):
    # A joblib sweep's launcher blocks the stop signals (SweepSignals(workers=True)), so a worker it starts keeps a
    # signal forwarded before its first job installed a handler pending instead of dying of it; the worker's
    # handler then receives it (signals.unblock_in_worker). The launcher's own thread takes the signals sent to it.
    child = (
        "import os, signal, sys, time\n"
        "from pomdp_ffm.run import signals\n"
        "print('up', flush=True)\n"
        "while signal.SIGUSR1 not in signal.sigpending(): time.sleep(0.01)\n"
        "got = []\n"
        "signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))\n"
        "signals.unblock_in_worker()\n"
        "print('handled', got, flush=True)\n"
    )
    parent = (
        "import os, signal, subprocess, sys, time\n"
        "from joblib import Parallel, delayed\n"
        "from pomdp_ffm.run import signals\n"
        "def blocked():\n"
        "    return sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))\n"
        "with signals.SweepSignals(workers=True):\n"
        "    print('joblib workers', Parallel(n_jobs=2)(delayed(blocked)() for _ in range(2)), flush=True)\n"
        "    worker = subprocess.Popen([sys.executable, '-c', sys.argv[1]], stdout=subprocess.PIPE, text=True)\n"
        "    assert worker.stdout.readline().strip() == 'up'\n"
        "    os.kill(worker.pid, signal.SIGUSR1)\n"
        "    print(worker.stdout.readline().strip(), worker.wait(), flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        f"    deadline = time.time() + {HANG_S}\n"
        "    while signals.sweep_stopped() is None and time.time() < deadline: time.sleep(0.01)\n"
        "print('launcher', signals.sweep_stopped(), flush=True)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", parent, child], env=_env(), capture_output=True, text=True, timeout=HANG_S
    )
    assert proc.returncode == 0, proc.stderr
    stops = sorted(int(s) for s in (signal.SIGUSR1, signal.SIGTERM))
    # joblib's workers start with both blocked (the resource trackers it starts unblock SIGTERM where they start)
    assert proc.stdout.split("\n")[:3] == [
        f"joblib workers {[stops, stops]}",
        f"handled [{int(signal.SIGUSR1)}] 0",
        f"launcher {int(signal.SIGTERM)}",
    ]


def test_a_paused_and_continued_launcher_is_not_stopped():
    # SIGSTOP then SIGCONT (a job-control pause, `kill -STOP`) while the launcher's thread waits for stop signals
    # ends its wait with no signal taken; the sweep goes on, and a stop signal after it is still taken.
    code = (
        "import os, signal, subprocess, sys, time\n"
        "from pomdp_ffm.run import signals\n"
        "with signals.SweepSignals(workers=True):\n"
        "    pause = 'for i in $(seq 20); do kill -STOP $0; sleep 0.05; kill -CONT $0; sleep 0.05; done'\n"
        "    subprocess.run(['sh', '-c', pause, str(os.getpid())], check=True)\n"
        "    time.sleep(0.5)\n"
        "    print('after pauses', signals.sweep_stopped(), flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGUSR1)\n"
        f"    deadline = time.time() + {HANG_S}\n"
        "    while signals.sweep_stopped() is None and time.time() < deadline: time.sleep(0.01)\n"
        "    print('after a stop', signals.sweep_stopped(), flush=True)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["after pauses None", f"after a stop {int(signal.SIGUSR1)}"]


@pytest.mark.slow
def test_the_paper_grid_exits_as_its_sweep_did(tmp_path, monkeypatch, capsys):
    # A sweep ended by a signal (one that came before it could stop its runs) reports the shell's 128 + N, not
    # Python's sys.exit of a negative number (241 for SIGTERM).
    grid = _paper_grid()

    class EndedBySigterm:
        def __init__(self, cmd, env):
            self.cmd = cmd

        def wait(self):
            return -signal.SIGTERM

    monkeypatch.setattr(grid.subprocess, "Popen", EndedBySigterm)
    assert grid.main(["--algo", "sac", "--root", str(tmp_path / "grid")]) == 128 + signal.SIGTERM


def test_a_stop_just_before_a_runs_handler_is_in_is_not_lost(monkeypatch):
    # The signal lands while StopSignals installs its handlers, after the last look at what came before: it is
    # remembered by the handler still in place (SweepSignals) and must still be taken.
    from pomdp_ffm.run import signals

    real, sent = signal.signal, []

    def installing(sig, handler):
        if not sent:
            sent.append(sig)
            os.kill(os.getpid(), signal.SIGUSR1)  # delivered to the handler in place, now
        return real(sig, handler)

    monkeypatch.setattr(signals, "_sweep_stop", None)
    around = signals.SweepSignals(forward=False).__enter__()
    try:
        monkeypatch.setattr(signals.signal, "signal", installing)
        with signals.StopSignals() as stop:
            monkeypatch.setattr(signals.signal, "signal", real)
            assert stop.requested == signal.SIGUSR1
    finally:
        monkeypatch.setattr(signals.signal, "signal", real)
        around.__exit__()


def _files(root: Path) -> dict:
    return {p: (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("launcher", [slow_case("basic"), slow_case("local")])  # (local: 11 s)
def test_a_sweep_names_every_refused_job_and_sums_up(tmp_path, launcher):
    # Two of the smoke sweep's four runs are damaged (DONE alone; a checkpoint that cannot be read): each is named
    # with its reason, nothing is written into either, the other two train, and the sweep ends with its summary
    # and exit 1 (launch/README.md), instead of the first refusal's traceback.
    root = tmp_path / "sweep"
    only_done, cut = root / "Pendulum-V-v0" / "sac_ffm" / "seed-0", root / "Pendulum-V-v0" / "sac_gru" / "seed-1"
    (cut / "checkpoints").mkdir(parents=True)
    (cut / "checkpoints" / "last.pt").write_bytes(b"PK\x03\x04 cut short")
    only_done.mkdir(parents=True)
    (only_done / "DONE").write_text("env_steps=600\n")
    before = {d: _files(d) for d in (only_done, cut)}
    proc = train(tmp_path, "experiment=smoke", f"hydra.sweep.dir={root}", f"hydra/launcher={launcher}", check=False)
    assert proc.returncode == EXIT_FAILED, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert lines[-1] == "2 finished, 2 refused, 0 failed"
    assert (
        lines[-3] == f"refused: {only_done}: {only_done} is finished but config.yaml is missing, so it cannot be "
        "checked against this config; there is no checkpoint to restore it from: put it back from "
        "a backup, or choose another run directory"
    )
    assert lines[-2].startswith(
        f"refused: {cut}: {cut}/checkpoints/last.pt cannot be read as a tensors-only checkpoint ("
    ) and lines[-2].endswith("Delete it to start this run again from scratch, or choose another run directory")
    assert "Traceback" not in proc.stderr
    assert {d: _files(d) for d in (only_done, cut)} == before
    trained = [root / "Pendulum-V-v0" / "sac_ffm" / "seed-1", root / "Pendulum-V-v0" / "sac_gru" / "seed-0"]
    assert all((d / "DONE").exists() for d in trained)
    assert sorted(p.name for p in root.iterdir()) == ["Pendulum-V-v0", "multirun.yaml"]  # no outcome files left


def _foreign_zip() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("notes.txt", "not a checkpoint")
    return out.getvalue()


NOT_CHECKPOINTS = {
    "empty": (b"", "an empty file, not a checkpoint pomdp-ffm wrote"),
    "garbage": (
        b"garbage",
        "not a checkpoint pomdp-ffm wrote: not the zip archive torch.save writes, but another program's file or "
        "one cut short",
    ),
    "another zip": (
        _foreign_zip(),
        "not a checkpoint pomdp-ffm wrote: a zip archive, but one without torch.save's data.pkl",
    ),
}


@pytest.mark.parametrize("case", NOT_CHECKPOINTS)
def test_a_file_pomdp_ffm_did_not_write_is_named_as_such(tmp_path, case):
    # torch's own reason for these, where a resume maps the checkpoint, was "mmap can only be used with files saved
    # with `_use_new_zipfile_serialization=True`", which says nothing of the file.
    data, why = NOT_CHECKPOINTS[case]
    path = tmp_path / "last.pt"
    path.write_bytes(data)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path, mmap=True)
    assert str(e.value) == f"{path} cannot be read as a tensors-only checkpoint ({why})"


@pytest.mark.slow
def test_a_resume_from_a_checkpoint_pomdp_ffm_did_not_write_is_refused_in_one_line(tmp_path):
    data, why = NOT_CHECKPOINTS["garbage"]
    ckpt = tmp_path / "run" / "checkpoints" / "last.pt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(data)
    proc = train(tmp_path, "env=Pendulum-V-v0", "resume=true", "hydra.run.dir=run", check=False)
    assert proc.returncode == EXIT_REFUSED and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"error: {ckpt} cannot be read as a tensors-only checkpoint ({why}): it cannot be resumed. Delete it to "
        "start this run again from scratch, or choose another run directory"
    ]
    assert [p.relative_to(tmp_path) for p in sorted(tmp_path.rglob("*"))] == [
        Path("run"),
        Path("run/checkpoints"),
        Path("run/checkpoints/last.pt"),
    ] and ckpt.read_bytes() == data  # nothing written


@pytest.mark.slow
def test_an_override_hydra_cannot_lex_gets_a_quoting_hint(tmp_path):
    # Hydra's lexer takes a non-ASCII letter only in quotes; it said "LexerNoViableAltException" and nothing more.
    proc = train(tmp_path, "hydra.run.dir=runs/ünïcødé", check=False)
    assert proc.returncode == EXIT_REFUSED and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "error: Hydra cannot read the override hydra.run.dir=runs/ünïcødé: 'ü' is read only in quotes; quote it "
        "for the shell and Hydra: 'hydra.run.dir=\"runs/ünïcødé\"'"
    ]
    assert list(tmp_path.iterdir()) == []  # nothing started
    # The override as the hint writes it is read, to the path asked for.
    (word,) = shlex.split(proc.stderr.split("Hydra: ", 1)[1])
    assert precheck([word], check_dirs=False).hydra.run.dir == "runs/ünïcødé"


UNLEXABLE = [
    (["hydra.run.dir=ünï", "x"], "'ü' is read only in quotes", "'hydra.run.dir=\"ünï x\"'"),  # split by the shell
    (["hydra.run.dir=a\"b"], "'\"' is read only in quotes", "\"hydra.run.dir='a\\\"b'\""),
    (["-m", "hydra.sweep.dir=a,ü"], "'ü' is read only in quotes", "'hydra.sweep.dir=a,\"ü\"'"),  # still a sweep
    (["+a.ü=1"], "'ü' cannot be in a key (keys are ASCII letters, digits, _ and -, joined by .)", None),
]


@parametrize_first_fast("argv,why,hint", UNLEXABLE, ids=[" ".join(a) for a, _, _ in UNLEXABLE])
def test_every_override_hydra_cannot_lex_is_named_with_its_character(argv, why, hint):
    with pytest.raises(Refused) as e:
        precheck(argv, check_dirs=False)
    override = next(a for a in argv if "=" in a)
    expected = f"Hydra cannot read the override {override}: {why}"
    assert str(e.value) == expected + (f"; quote it for the shell and Hydra: {hint}" if hint else "")
    if hint:  # the shell gives the hinted override as one word, which Hydra reads
        (word,) = shlex.split(hint)
        hinted = [*(a for a in argv if a.startswith("-")), word]
        if "-m" not in argv:
            precheck(hinted, check_dirs=False)
        else:  # read as the sweep it is, of a setting of Hydra's own, which is then refused as such
            with pytest.raises(Refused, match=r"sweeps a setting of Hydra's own \(hydra\.\*\)"):
                precheck(hinted, check_dirs=False)


@pytest.mark.slow
@parametrize_first_fast("file", ["Pendulum-V-v0/sac_gru/seed-1", "Pendulum-V-v0/sac_gru"])
def test_a_file_where_a_jobs_run_directory_belongs_refuses_the_sweep_before_it_starts(tmp_path, file):
    # Hydra makes a job's directory before the job runs, so such a job cannot be refused alone: the command is, in
    # one line, before any job starts or anything is written. The file may stand where a folder above it belongs.
    root = tmp_path / "sweep"
    (root / file).parent.mkdir(parents=True)
    (root / file).write_text("not a run\n")
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    proc = train(tmp_path, "experiment=smoke", f"hydra.sweep.dir={root}", check=False)
    assert proc.returncode == EXIT_REFUSED, proc.stderr[-3000:]
    job = root / "Pendulum-V-v0" / "sac_gru" / "seed-0"  # the first job under it
    where = "a job's run directory" if file.endswith("seed-1") else f"a folder of the job's run directory {job}"
    assert proc.stderr.strip().splitlines() == [f"error: {root / file} is a file where {where} belongs; move it away"]
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before


@pytest.mark.slow
def test_the_paper_grid_names_a_damaged_slot_up_front_and_the_sweep_refuses_it(tmp_path, capfd):
    # One job of the grid, whose slot holds DONE alone: the grid lists it with its reason before the launch; the
    # sweep refuses it (the others it would train: test_a_sweep_names_every_refused_job_and_sums_up), writing
    # nothing, and the grid exits with the sweep's code.
    grid = _paper_grid()
    root = tmp_path / "grid"
    slot = root / "HopperBLT-P-v0" / "sac_ffm" / "seed-0"
    slot.mkdir(parents=True)
    (slot / "DONE").write_text("env_steps=1510000\n")
    before = _files(root)
    rc = grid.main(
        [
            "--algo",
            "sac",
            "--launcher",
            "basic",
            "--root",
            str(root),
            "env=HopperBLT-P-v0",
            "seq_model=ffm",
            "seed=0",
            "train.buffer_size=10000",
        ]
    )
    out, err = capfd.readouterr()
    assert rc == EXIT_FAILED, err[-3000:]
    why = f"{slot} is finished but config.yaml is missing"
    assert out.splitlines()[0].startswith(f"damaged   {slot}  [") and why in out.splitlines()[0]
    assert "1 jobs: 0 done, 0 running, 1 damaged, 0 failed, 0 resumable, 0 new" in out
    lines = err.strip().splitlines()
    assert lines[-2].startswith(f"refused: {slot}: {why}") and lines[-1] == "0 finished, 1 refused, 0 failed"
    after = _files(root)
    assert after.pop(root / "multirun.yaml") and after == before


# --- no orphans; a second stop signal -----------------------------------------------------------------------
def _proc_stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name: state, ppid, ..., start time (index 19); None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def _descendants(pid: int) -> dict[int, tuple[int, str]]:
    """The processes below ``pid``: each one's parent and start time (which tells it from a later process that
    reuses its pid)."""
    stats = {int(p.name): _proc_stat(int(p.name)) for p in Path("/proc").iterdir() if p.name.isdigit()}
    found, todo = {}, [pid]
    while todo:
        parent = todo.pop()
        for child, stat in stats.items():
            if stat is not None and int(stat[1]) == parent:
                found[child] = (parent, stat[19])
                todo.append(child)
    return found


def _alive(procs: dict[int, tuple[int, str]]) -> list[int]:
    """Those of ``procs`` that still run (a zombie, which nobody may reap in a container, has ended)."""
    return [
        pid
        for pid, (_, start) in procs.items()
        if (stat := _proc_stat(pid)) is not None and stat[19] == start and stat[0] != "Z"
    ]


def _alive_after(procs: dict[int, tuple[int, str]], timeout: float) -> list[int]:
    deadline = time.time() + timeout
    while _alive(procs) and time.time() < deadline:
        time.sleep(0.1)
    return _alive(procs)


def _kill_all(proc: subprocess.Popen, procs: dict[int, tuple[int, str]]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=HANG_S)
    for pid in _alive(procs):
        os.kill(pid, signal.SIGKILL)


def _poll(what, timeout: float, proc: subprocess.Popen, out: Path) -> None:
    deadline = time.time() + timeout
    while not what():
        if time.time() > deadline or proc.poll() is not None:
            raise AssertionError(f"exit {proc.poll()}\n{out.read_text()[-3000:]}")
        time.sleep(0.2)


def _start(tmp_path: Path, *overrides: str) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / "out.txt"
    with open(out, "w") as f:  # a file, not a pipe: the orphans, if any, keep writing to it
        proc = subprocess.Popen(
            [sys.executable, "-m", "pomdp_ffm.train", *overrides],
            cwd=tmp_path,
            env=_env(),
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    return proc, out


LINUX_ONLY = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a parent's death signal is Linux's")


@LINUX_ONLY
@pytest.mark.slow
def test_a_joblib_sweep_killed_by_sigkill_leaves_no_worker(tmp_path):
    # The kernel sends every worker SIGTERM when the launching process dies (PR_SET_PDEATHSIG, set as it starts):
    # the idle one (its job over) obeys it at once; the one training stops its run with a checkpoint, as a stop
    # signal does, and exits; joblib's third worker, which never got a job, and the trackers end too.
    from conftest import TINY

    root = tmp_path / "sweep"
    tiny = [o for o in TINY if not o.startswith("train.num_iters=")]
    proc, out = _start(
        tmp_path,
        "-m",
        *tiny,
        "train.num_iters=2,400",
        "resume=true",
        "hydra/launcher=local",
        "hydra.launcher.n_jobs=3",
        f"hydra.sweep.dir={root}",
        "hydra.sweep.subdir=iters-${train.num_iters}",
    )
    short, long = RunDir(root / "iters-2"), RunDir(root / "iters-400")
    procs: dict = {}
    try:
        # the short run finished and gave its lock back (an empty lock file); the long one is training
        _poll(
            lambda: (
                short.status() == "done"
                and (short.path / RunDir.LOCK).stat().st_size == 0
                and (long.path / "progress.csv").exists()
                and len(eval_steps(long.path)) >= 1
            ),
            HANG_S,
            proc,
            out,
        )
        procs = _descendants(proc.pid)
        workers = [pid for pid in procs if b"popen_loky" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(workers) == 3, procs
        idle = int((short.path / "attempts.log").read_text().split("pid=")[1].split()[0])
        assert idle in workers
        proc.kill()
        proc.wait(timeout=HANG_S)
        assert _alive_after({idle: procs[idle]}, HANG_S) == []
        assert _alive_after(procs, HANG_S) == [], out.read_text()[-3000:]
    finally:
        _kill_all(proc, procs)
    assert long.status() == "resumable"
    last = (long.path / "attempts.log").read_text().splitlines()[-1]
    assert "stopped by signal 15" in last and "checkpoint saved" in last


def _start_grid(tmp_path: Path, out: Path, *args: str) -> subprocess.Popen:
    with open(out, "w") as f:  # a file, not a pipe: an orphan sweep, if any, keeps writing to it
        return subprocess.Popen(
            [sys.executable, str(ROOT / "launch" / "paper_grid.py"), *args],
            cwd=tmp_path,
            env=_env(),
            stdout=f,
            stderr=subprocess.STDOUT,
        )


@LINUX_ONLY
def test_the_paper_grids_sweep_follows_the_script(tmp_path, monkeypatch):
    # What the slow test below relies on, in a second: the script names itself to the sweep it starts; a process so
    # named is sent SIGTERM when that one is gone, at once where it was gone before the process could ask the
    # kernel (the race end_with_parent closes); and the name is not passed on to the process's own children.
    from pomdp_ffm.run.signals import END_WITH_ENV

    grid, started = _paper_grid(), []

    class Sweep:
        def __init__(self, cmd, env):
            started.append(env)

        def wait(self):
            return 0

    one = ["env=HopperBLT-P-v0", "seq_model=ffm", "seed=0"]
    with monkeypatch.context() as m:  # (subprocess's own Popen back for the processes below)
        m.setattr(grid.subprocess, "Popen", Sweep)
        assert grid.main(["--algo", "sac", "--launcher", "basic", "--root", str(tmp_path / "grid"), *one]) == 0
    assert [env[END_WITH_ENV] for env in started] == [str(os.getpid())]
    code = (
        "import os, signal\n"
        "from pomdp_ffm.run import signals\n"
        "got = []\n"
        "signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))\n"
        "signals.end_with_launcher()\n"
        "print(got, os.environ.get(signals.END_WITH_ENV))\n"
    )
    # Named by its parent (this process): nothing yet. Named by a pid that is not its parent, as when the script
    # ended before the process started and it was handed to another: SIGTERM at once.
    for parent, got in [(os.getpid(), "[] None"), (os.getppid(), f"[{int(signal.SIGTERM)}] None")]:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            env={**_env(), END_WITH_ENV: str(parent)},
            capture_output=True,
            text=True,
            timeout=HANG_S,
        )
        assert proc.returncode == 0 and proc.stdout.strip() == got, proc.stderr


@LINUX_ONLY
@pytest.mark.parametrize("launcher", [slow_case("basic"), slow_case("local")])  # (36-52 s, 47-65 s: 2 cores at load 9)
def test_a_paper_grid_killed_by_sigkill_leaves_no_sweep_and_a_rerun_resumes(tmp_path, launcher):
    # The script runs the sweep as its child (python -m pomdp_ffm.train --multirun), which trained on after a
    # SIGKILL of the script (and joblib's workers with it), its run still locked: a rerun found it "running". Now the
    # kernel sends the sweep SIGTERM when the script dies (signals.end_with_launcher): the run in hand checkpoints,
    # the sweep and its workers end, and the rerun resumes the run.
    from conftest import TINY

    root = tmp_path / "grid"
    tiny = [o for o in TINY if not o.startswith("train.num_iters=")]
    args = [
        "--algo",
        "sac",
        "--launcher",
        launcher,
        "--root",
        str(root),
        "env=HopperBLT-P-v0",
        "seq_model=ffm",
        "seed=0",
        "train.buffer_size=10000",
        *tiny,
        "train.num_iters=400",
        *(["hydra.launcher.n_jobs=2"] if launcher == "local" else []),  # (one job: joblib starts two workers)
    ]
    run = RunDir(root / "HopperBLT-P-v0" / "sac_ffm" / "seed-0")
    out = tmp_path / "out.txt"
    proc, procs = _start_grid(tmp_path, out, *args), {}
    try:
        _poll(lambda: (run.path / "progress.csv").exists() and len(eval_steps(run.path)) >= 1, HANG_S, proc, out)
        procs = _descendants(proc.pid)
        workers = [pid for pid in procs if b"popen_loky" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(workers) == (2 if launcher == "local" else 0), procs
        proc.kill()
        proc.wait(timeout=HANG_S)
        assert _alive_after(procs, HANG_S) == [], out.read_text()[-3000:]
    finally:
        _kill_all(proc, procs)
    assert run.status() == "resumable", out.read_text()[-3000:]
    last = (run.path / "attempts.log").read_text().splitlines()[-1]
    assert "stopped by signal 15" in last and "checkpoint saved" in last
    rows = len(eval_steps(run.path))

    # The rerun finds the run resumable, not running, and continues it; killed again, it too leaves nothing.
    out = tmp_path / "rerun.txt"
    proc, procs = _start_grid(tmp_path, out, *args), {}
    try:
        _poll(lambda: (run.path / "progress.csv").exists() and len(eval_steps(run.path)) > rows, HANG_S, proc, out)
        assert "1 jobs: 0 done, 0 running, 0 damaged, 0 failed, 1 resumable, 0 new" in out.read_text()
        assert (run.path / "attempts.log").read_text().splitlines()[-1].endswith(" start")
        procs = _descendants(proc.pid)
        proc.kill()
        proc.wait(timeout=HANG_S)
        assert _alive_after(procs, HANG_S) == [], out.read_text()[-3000:]
    finally:
        _kill_all(proc, procs)
    assert run.status() == "resumable"


@LINUX_ONLY
@pytest.mark.slow
def test_env_workers_start_without_warnings_and_end_quietly_with_a_run_killed_by_sigkill(tmp_path):
    # The workers' parent, the forkserver, ends with the run, and they with it (PR_SET_PDEATHSIG). Each starts by
    # running the entry point again as its __main__, which runpy warned about where the forkserver had imported it.
    # A worker that sees its pipe close before that signal comes exits without a word: killing the run is not an
    # error of each of its workers (Gymnasium's worker would print two tracebacks each).
    from conftest import TINY

    run, n = tmp_path / "run", 8
    proc, out = _start(
        tmp_path,
        *TINY,
        "train.num_iters=100000",
        "eval.workers=true",
        f"env.num_eval_tasks={n}",
        f"hydra.run.dir={run}",
    )
    procs: dict = {}
    try:

        def workers_up():
            return (
                (run / "progress.csv").exists()
                and len(eval_steps(run)) >= 1
                and sum(parent != proc.pid for parent, _ in _descendants(proc.pid).values()) >= n
            )

        _poll(workers_up, HANG_S, proc, out)
        procs = _descendants(proc.pid)
        proc.kill()  # the main process only, not its group: the workers learn of it by themselves
        proc.wait(timeout=HANG_S)
        assert _alive_after(procs, HANG_S) == [], procs
    finally:
        _kill_all(proc, procs)
    text = out.read_text()  # what the run and its workers wrote, all of them gone
    assert "Traceback" not in text and "Process Worker" not in text, text[-3000:]
    assert "RuntimeWarning" not in text, text[-3000:]


@pytest.mark.slow
def test_a_second_stop_signal_does_not_undo_the_first(tmp_path):
    # Two SIGTERMs 0.2 s apart: the second comes while the run saves its checkpoint or exits (when Python has put
    # the default handlers back), and changes nothing: exit 75 with the checkpoint saved, not death by the signal.
    run = tmp_path / "run"

    def twice(proc):
        _wait_for_evaluations(proc, [run])
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)

    rc, out = _sigterm_when(
        tmp_path,
        ["experiment=smoke", "hydra.mode=RUN", "seq_model=ffm", "seed=0", "train.num_iters=60", f"hydra.run.dir={run}"],
        twice,
    )
    assert rc == 75 and "checkpoint saved" in out, out[-3000:]
    state = load_checkpoint(RunDir(run).checkpoint)
    assert 0 < state["counters"]["env_steps"] < 60 * 200 and RunDir(run).status() == "resumable"


def test_a_failing_job_is_named_and_counted_and_the_sweep_goes_on(tmp_path):
    # seed 1's training raises: its traceback goes to its ERROR.txt, the sweep names it and exits 1 after seed 0.
    root = tmp_path / "sweep"
    code = (
        "import runpy, sys\n"
        "from pomdp_ffm.trainer import Trainer\n"
        "real = Trainer.train\n"
        "def train(self, *a, **k):\n"
        "    if self.cfg.seed == 1:\n"
        "        raise RuntimeError('boom in seed 1')\n"
        "    return real(self, *a, **k)\n"
        "Trainer.train = train\n"
        "sys.argv = ['train', *sys.argv[1:]]\n"
        "runpy.run_module('pomdp_ffm.train', run_name='__main__')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "experiment=smoke", "seq_model=ffm", f"hydra.sweep.dir={root}"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert proc.returncode == EXIT_FAILED, proc.stderr[-3000:]
    failed = root / "Pendulum-V-v0" / "sac_ffm" / "seed-1"
    assert proc.stderr.strip().splitlines()[-2:] == [
        f"failed: {failed}: RuntimeError: boom in seed 1",
        "1 finished, 0 refused, 1 failed",
    ]
    assert "RuntimeError: boom in seed 1" in (failed / "ERROR.txt").read_text()
    assert (root / "Pendulum-V-v0" / "sac_ffm" / "seed-0" / "DONE").exists()


def test_the_zoo_check_sweeps_every_registered_memory():
    # seq_model=glob(*) (conf/experiment/zoo_check.yaml) lists the config group's options, one per registry entry.
    from pomdp_ffm.jobs.grid import job_overrides
    from pomdp_ffm.seq_models import available

    jobs, cfg = job_overrides(["experiment=zoo_check"])
    assert sorted(job[0] for job in jobs) == sorted(f"seq_model={m}" for m in available())
    assert cfg.seeds == [0, 1, 2] and cfg.env.env_name == "Pendulum-V-v0" and cfg.policy.algo_name == "sac"
