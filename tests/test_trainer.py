"""The training loop end to end: logs, determinism, resume, bad input."""

import csv
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import TINY
from hang import HANG_S
from marks import parametrize_first_fast, slow_case

from pomdp_ffm import evaluation as evaluation_module
from pomdp_ffm import rollout as rollout_module
from pomdp_ffm.algos import SAC
from pomdp_ffm.catalog import BASELINES, CHALLENGER
from pomdp_ffm.evaluation import Due
from pomdp_ffm.metrics import TIMING as TIME_COLUMNS
from pomdp_ffm.metrics import columns
from pomdp_ffm.rollout import play_all
from pomdp_ffm.run.exits import EXIT_DIVERGED
from pomdp_ffm.train import Refused, train_job
from pomdp_ffm.trainer import Trainer, TrainingDiverged


def train(cfg, run_dir, trainer_cls=Trainer):
    """The entry point's own path (validate, lock, verify, train) on a composed config."""
    return train_job(cfg, run_dir, trainer_cls=trainer_cls)


def collect(trainer):
    """One episode of the trainer's next unit (the initial pool's) into its buffer, as its loop collects; its length."""
    if trainer.progress is None:  # (its progress bar counts the steps)
        trainer.rundir.path.mkdir(parents=True, exist_ok=True)
        trainer._open()
    rollout = trainer._next_episode()
    rollout.play()
    trainer._store(rollout)
    return rollout.episodes()[0].length


def read(run_dir):
    return pd.read_csv(run_dir / "progress.csv")


def eval_rows(df):
    return df[df["z/env_steps"].notna()]


def test_run_writes_reference_log_and_checkpoints(composed, tmp_path):
    cfg = composed("env=Pendulum-V-v0", "algo=sac")
    out = train(cfg, tmp_path / "run")
    df = read(tmp_path / "run")
    assert list(df.columns) == columns(SAC.metrics, False)
    ev = eval_rows(df)
    # pool of 200 steps, then 3 episodes; the env-step clock evaluates at 400, 600, 800
    assert ev["z/env_steps"].tolist() == [400, 600, 800]
    assert ev["z/rl_steps"].tolist() == [8, 12, 16]  # int(200 * 0.02) burst, then ceil(200 * 0.02) per episode
    assert ev["z/rollouts"].tolist() == [2, 3, 4]
    assert (ev["metrics/total_steps_eval"] == 200).all()
    train_rows = df[df["z/env_steps"].isna()]
    assert len(train_rows) == 4 and train_rows["rl_loss/qf1_loss"].notna().all()
    assert train_rows["rl_loss/alpha"].between(0, 1.5).all()
    assert (tmp_path / "run" / "DONE").exists() and (tmp_path / "run" / "checkpoints" / "last.pt").exists()
    assert out.standing.env_steps == 800 and not out.stopped
    assert not (tmp_path / "run" / "tb").exists()  # TensorBoard is opt-in (patches/010)


def test_pool_actions_come_from_the_native_range(run_cfg, tmp_path):
    trainer = Trainer(run_cfg("env=Pendulum-V-v0"), tmp_path / "r")
    collect(trainer)
    acts = trainer.buffer.state_dict()["actions"]
    assert abs(acts).max() > 1.0 and abs(acts).max() <= 2.0  # stored unclipped, like the reference
    trainer.close()


def test_same_seed_same_progress(composed, tmp_path):
    for name in ("a", "b"):
        train(composed("algo=td3", "seq_model=gru", "seed=3"), tmp_path / name)
    a, b = read(tmp_path / "a").drop(columns=TIME_COLUMNS), read(tmp_path / "b").drop(columns=TIME_COLUMNS)
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    train(composed("algo=td3", "seq_model=gru", "seed=4"), tmp_path / "c")
    assert not read(tmp_path / "c").drop(columns=TIME_COLUMNS).equals(a)


@parametrize_first_fast("algo", ["sac", "td3"])
def test_interrupted_run_resumes_to_the_same_log(composed, tmp_path, algo):
    overrides = (f"algo={algo}", "seq_model=ffm", "train.num_iters=6")
    train(composed(*overrides), tmp_path / "full")

    class Interrupt(Trainer):
        def _end_burst(self):
            evaluation = super()._end_burst()
            if self.standing.env_steps >= 600:
                self.stop.request(15)  # what SIGTERM does
            return evaluation

    assert train(composed(*overrides), tmp_path / "cut", Interrupt).stopped
    with pytest.raises(Refused, match="resume=true"):
        train(composed(*overrides), tmp_path / "cut")
    out = train(composed(*overrides, "resume=true"), tmp_path / "cut")
    assert not out.stopped and out.standing.env_steps == 1400
    cut = read(tmp_path / "cut")
    steps = eval_rows(cut)["z/env_steps"]
    assert steps.is_monotonic_increasing and steps.tolist() == [400, 600, 800, 1000, 1200, 1400]
    # Pendulum is deterministic and every RNG is restored: the resumed run is the uninterrupted one.
    pd.testing.assert_frame_equal(
        cut.drop(columns=TIME_COLUMNS), read(tmp_path / "full").drop(columns=TIME_COLUMNS), check_exact=True
    )


@pytest.mark.parametrize("task", ["Pendulum-V-v0", slow_case("HopperMJ-V-v0")])
def test_envs_in_workers_train_and_resume_as_envs_here(composed, tmp_path, task):
    # The evaluation's envs in worker processes (their resets' RNG chained from the training env's, the
    # checkpoint's env state), stopped and resumed: the log of the run with every env here.
    overrides = (f"env={task}", "algo=sac", "seq_model=gru", "train.num_iters=4", "env.num_eval_tasks=3")
    workers = ("eval.workers=true",)
    train(composed(*overrides), tmp_path / "here")

    class Interrupt(Trainer):
        iterations = 0

        def _end_burst(self):
            evaluation = super()._end_burst()
            Interrupt.iterations += 1
            if Interrupt.iterations == 3:  # the pool's burst, then two iterations'
                self.stop.request(15)
            return evaluation

    assert train(composed(*overrides, *workers), tmp_path / "there", Interrupt).stopped
    train(composed(*overrides, *workers, "resume=true"), tmp_path / "there")
    here, there = read(tmp_path / "here"), read(tmp_path / "there")
    pd.testing.assert_frame_equal(there.drop(columns=TIME_COLUMNS), here.drop(columns=TIME_COLUMNS), check_exact=True)


def test_killed_run_keeps_its_rows(composed, tmp_path):
    class Kill(Trainer):
        def _log_evaluation(self, *results):
            ret = super()._log_evaluation(*results)
            if self.standing.env_steps >= 600:
                raise KeyboardInterrupt  # as if killed right after logging
            return ret

    with pytest.raises(KeyboardInterrupt):
        train(composed(), tmp_path / "k", Kill)
    with open(tmp_path / "k" / "progress.csv") as f:
        rows = list(csv.reader(f))
    # header + pool train row + (train, eval) rows at 400 and at 600 env steps
    assert rows[0] == columns(SAC.metrics, False) and len(rows) == 1 + 5
    assert not (tmp_path / "k" / "DONE").exists()


def test_unknown_task_fails_with_the_list(run_cfg, tmp_path):
    with pytest.raises(ValueError, match=r"HopperBLT-X-v0.*HopperBLT-V-v0"):
        Trainer(run_cfg("env.env_name=HopperBLT-X-v0"), tmp_path / "u")


def test_non_finite_loss_stops_with_checkpoint(composed, tmp_path):
    class NaN(Trainer):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            real_update = self.updater.update_all
            calls = [0]

            def nan_from_the_second(batches, grad_norms=False):
                calls[0] += 1
                (stats,) = real_update(batches, grad_norms)
                return [{**stats, "qf1_loss": torch.tensor(math.nan)} if calls[0] >= 2 else stats]

            self.updater.update_all = nan_from_the_second

    # The pool's burst is 4 updates: the first non-finite one is found when the burst ends.
    with pytest.raises(
        TrainingDiverged,
        match=r"non-finite loss first at update 2 \(env step 200; the burst ran on "
        r"to update 4.*'qf1_loss': nan",
    ):
        train(composed(), tmp_path / "nan", NaN)
    assert (tmp_path / "nan" / "checkpoints" / "diverged.pt").exists()
    assert "non-finite loss" in (tmp_path / "nan" / "ERROR.txt").read_text()
    assert "diverged" in (tmp_path / "nan" / "attempts.log").read_text()


def non_finite_policy(value: float):
    """The agent's policy giving ``value`` for every action (its weights gone non-finite), as AgentPolicy.__call__:
    the acting step on a CPU (a CUDA-graph actor's go through AgentPolicy.submit instead)."""
    return lambda self, obs, prev_action, reward, state, active: (np.full_like(prev_action, value), state)


def test_a_non_finite_action_is_the_runs_divergence_before_the_env_takes_it(tmp_path):
    # A real process on HopperBLT-V, whose PyBullet env fails a bare assert on a NaN action (exit 1, a traceback):
    # the run diverged, as with a non-finite loss: one line, exit 3, the checkpoint saved.
    run_dir = tmp_path / "run"
    script = (
        "import numpy as np, runpy; from pomdp_ffm import rollout; "
        "rollout.AgentPolicy.__call__ = lambda self, obs, prev_action, reward, state, active: "
        "(np.full_like(prev_action, np.nan), state); "  # (non_finite_policy, before pomdp_ffm.train is imported)
        "runpy.run_module('pomdp_ffm.train', run_name='__main__', alter_sys=True)"  # (python -m pomdp_ffm.train)
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, "env=HopperBLT-V-v0", *TINY, "device=cpu", f"hydra.run.dir={run_dir}"],
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert proc.returncode == EXIT_DIVERGED, proc.stderr[-2000:]
    (line,) = [ln for ln in proc.stderr.splitlines() if not ln.startswith("pybullet build time")]  # (its banner)
    assert line.startswith(
        "error: non-finite action [nan, nan, nan] from the policy at step 1 of a training episode, before the env "
        "took it (env step "
    ), line
    assert line.endswith(f"; checkpoint saved to {run_dir / 'checkpoints' / 'diverged.pt'}"), line
    assert (run_dir / "checkpoints" / "diverged.pt").exists()
    assert "diverged (see ERROR.txt)" in (run_dir / "attempts.log").read_text()


def test_a_non_finite_action_in_a_seed_axis_is_its_seeds_divergence(composed, tmp_path, monkeypatch):
    # Each seed diverges on its own (its checkpoint, its attempts.log), as the run would alone; inf as NaN.
    monkeypatch.setattr(rollout_module.AgentPolicy, "__call__", non_finite_policy(math.inf))
    with pytest.raises(TrainingDiverged, match=r"^non-finite action \[inf\] from the policy at step 1 of a training"):
        train(composed("env=Pendulum-V-v0", "device=cpu", "seeds=[0,1]"), tmp_path / "axis" / "seed-0")
    for k in (0, 1):
        seed_dir = tmp_path / "axis" / f"seed-{k}"
        assert (seed_dir / "checkpoints" / "diverged.pt").exists()
        assert "diverged (see ERROR.txt)" in (seed_dir / "attempts.log").read_text()


@pytest.mark.parametrize("bad_at", [None, 1])
def test_a_bursts_bookkeeping_is_a_few_operators_whatever_the_statistics(run_cfg, tmp_path, bad_at):
    # On a GPU each operation between two update replays is a kernel launch: an update's statistics are checked
    # and summed as one vector (13 operators for SAC's nine statistics where one at a time took 53), to the same
    # float64 sums as one at a time, and a non-finite one is still found at its update.
    from pomdp_ffm.bench.common import DispatchedOps
    from pomdp_ffm.metrics import GRAD_NORMS, UPDATE

    t = Trainer(run_cfg(), tmp_path / "t")
    collect(t)  # (a burst needs something to sample)
    ops = {}
    summed = [name for name in UPDATE if name not in GRAD_NORMS]
    for n_stats in (2, 5):
        stats = [{name: torch.tensor((i + 1) / 3 + j / 7) for i, name in enumerate(summed[:n_stats])} for j in range(3)]
        stats[2]["q_grad_norm"] = torch.tensor(5.0)  # logged as the last value, not summed
        if bad_at is not None:
            stats[bad_at]["qf2_loss"] = torch.tensor(math.inf)
        t.standing.begin_burst(3, t.agent.device)
        burst, start = t.standing.burst, t.standing.rl_steps
        for j, st in enumerate(stats):
            with DispatchedOps() as counted:
                burst.add(st, start + j + 1)
            ops[n_stats, j] = counted.total
        assert burst.done == 3
        assert burst.close() == (-1 if bad_at is None else start + bad_at + 1)
        as64 = lambda x: float(x.double())
        want = {k: (as64(stats[0][k]) + as64(stats[1][k])) + as64(stats[2][k]) for k in stats[0]}
        assert burst.sums == pytest.approx(want, rel=0, abs=0, nan_ok=True)
        assert burst.counts == {k: 3 for k in stats[0]} and float(burst.last["q_grad_norm"]) == 5.0
    assert ops[2, 1] == ops[5, 1] <= 13
    t.close()


def test_pybullet_task_end_to_end(composed, tmp_path):
    cfg = composed(
        "env=HopperBLT-V-v0", "algo=td3", "train.num_iters=1", "train.num_updates_per_iter=0.002", "eval.log_interval=1"
    )
    out = train(cfg, tmp_path / "blt")
    assert out.standing.env_steps >= 1000 and out.standing.rollouts > 1
    df = read(tmp_path / "blt")
    assert df["rl_loss/qf1_loss"].notna().any()


def test_hydra_entry_point_smoke(tmp_path):
    run_dir = tmp_path / "hydra_run"
    cmd = [
        sys.executable,
        "-m",
        "pomdp_ffm.train",
        "env=Pendulum-P-v0",
        "algo=td3",
        "seq_model=lstm",
        "train.num_iters=2",
        "train.num_init_rollouts_pool=1",
        "train.batch_size=4",
        "train.sampled_seq_len=8",
        "train.num_updates_per_iter=0.02",
        "env.num_eval_tasks=1",
        "eval.log_interval=1",
        "progress=false",
        f"hydra.run.dir={run_dir}",
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=HANG_S)
    assert (run_dir / "config.yaml").exists() and not (run_dir / ".hydra").exists()
    assert len(eval_rows(read(run_dir))) == 2


def test_misspelt_key_fails_at_start(tmp_path):
    cmd = [sys.executable, "-m", "pomdp_ffm.train", "train.batch_sise=4", f"hydra.run.dir={tmp_path / 'x'}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode != 0 and "batch_sise" in proc.stderr


def test_tensorboard_logging_when_asked(composed, tmp_path):
    pytest.importorskip("tensorboard")
    train(composed("eval.log_tensorboard=true", "train.num_iters=1"), tmp_path / "tb_run")
    events = list((tmp_path / "tb_run" / "tb").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0


@parametrize_first_fast("stop_at_update", [2, 6])  # inside the post-pool burst; inside an iteration's burst
def test_stop_between_two_updates_resumes_to_the_same_log(composed, tmp_path, stop_at_update):
    # A scheduler's warning can come in the middle of a long burst of updates (BLT: 10k after the pool):
    # the run stops after the update in hand, and the resumed run owes exactly the remaining ones.
    overrides = ("algo=sac", "seq_model=gru", "train.num_iters=4")
    train(composed(*overrides), tmp_path / "full")

    class StopMidBurst(Trainer):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            update, calls = self.updater.update_all, [0]

            def counted(*args, **kwargs):
                calls[0] += 1
                if calls[0] == stop_at_update:
                    self.stop.request(10)
                return update(*args, **kwargs)

            self.updater.update_all = counted

    out = train(composed(*overrides), tmp_path / "cut", StopMidBurst)
    assert out.stopped and out.standing.rl_steps == stop_at_update and out.standing.burst.done > 0
    out = train(composed(*overrides, "resume=true"), tmp_path / "cut")
    assert not out.stopped and out.standing.burst is None
    pd.testing.assert_frame_equal(
        read(tmp_path / "cut").drop(columns=TIME_COLUMNS),
        read(tmp_path / "full").drop(columns=TIME_COLUMNS),
        check_exact=True,
    )


@pytest.mark.parametrize("axis", [False, True], ids=["alone", "seed-axis"])
def test_an_int_update_count_leaves_the_pool_without_a_burst_and_finishes(composed, tmp_path, axis):
    # As the reference: an int num_updates_per_iter runs no burst after the random pool (an empty burst, which the
    # loop ends like any other: no row), then that many updates per iteration.
    cfg = composed("train.num_updates_per_iter=2", "train.num_iters=2", *(["seeds=[0,1]"] if axis else []))
    run = tmp_path / "axis" / "seed-0"
    out = train(cfg, run)
    for seed_run in [run, tmp_path / "axis" / "seed-1"] if axis else [run]:
        rows = read(seed_run)
        assert (seed_run / "DONE").exists() and rows["rl_loss/qf1_loss"].notna().sum() == 2
        assert rows["z/rl_steps"].max() == 4
    assert not out.stopped


def test_length_1_episode_is_counted_but_not_stored(run_cfg, tmp_path, caplog):
    # patches/011-length-1-episodes.md: the sequence buffer needs two steps; the step still counts.
    trainer = Trainer(run_cfg(), tmp_path / "one")
    step = trainer.env.step

    def ends_at_once(action):
        obs, reward, _, truncated, info = step(action)
        return obs, reward, True, truncated, info

    trainer.env.step = ends_at_once
    with caplog.at_level("WARNING", logger="pomdp_ffm"):
        assert collect(trainer) == 1
    assert len(trainer.buffer) == 0
    assert (trainer.standing.env_steps, trainer.standing.rollouts) == (1, 1)
    assert any("episode of length 1 not stored" in r.getMessage() for r in caplog.records)
    trainer.close()


@parametrize_first_fast("task", ["Pendulum-V-v0", "HopperBLT-P-v0", "HopperMJ-V-v0"])
@parametrize_first_fast("seq_model", [CHALLENGER, BASELINES[0]])
def test_evaluation_episodes_together_equal_one_after_another(run_cfg, tmp_path, task, seq_model):
    # patches/013: the batched evaluation plays the reference's episodes (same starts, same returns) and
    # leaves the training env's RNG where the one-after-another evaluation leaves it.
    # With eval.workers the envs step in worker processes: exactly the episodes played together here.
    results = {}
    for way, settings in {
        "one after another": ("eval.episodes_together=false",),
        "together": ("eval.episodes_together=true",),
        "workers": ("eval.episodes_together=true", "eval.workers=true"),
    }.items():
        trainer = Trainer(
            run_cfg(f"env={task}", f"seq_model={seq_model}", "env.num_eval_tasks=4", *settings), tmp_path / way
        )
        collect(trainer)  # the training env mid-stream, as at a real evaluation
        evaluation = trainer.evaluator.evaluation(Due())
        play_all(evaluation.next, evaluation.ended)
        result, _ = evaluation.results()  # (deterministic only: the default)
        results[way] = (result.ret, result.length, trainer.env.rng_state(), trainer.timers["n_eval_steps"])
        if way == "workers":
            assert {type(e).__name__ for e in trainer.evaluator.envs} == {"EnvInWorker"}
        trainer.close()
    (r0, l0, s0, n0), (r1, l1, s1, n1) = results["one after another"], results["together"]
    assert l0 == l1 and n0 == n1
    # Batched matmuls may round differently in the last bits; 1e-4 relative covers 4 x 200-1000 steps.
    assert r1 == pytest.approx(r0, rel=1e-4, abs=1e-3)
    assert s0 == s1
    assert results["workers"] == results["together"]


def test_tf32_is_a_switch_off_by_default(run_cfg, tmp_path):
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        for value, flag in (("true", True), ("false", False)):
            t = Trainer(run_cfg(f"train.tf32={value}"), tmp_path / value)
            assert torch.backends.cuda.matmul.allow_tf32 is flag
            t.close()
        assert run_cfg().train.tf32 is False
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def test_env_workers_are_refused_only_where_they_would_start(run_cfg, tmp_path, monkeypatch, caplog):
    # Under a start method the workers cannot use (joblib's loky), a run that would start them is refused at
    # once; a setting that starts none (the evaluation then plays on the training env) is only warned about.
    import multiprocessing

    monkeypatch.setattr(multiprocessing, "get_start_method", lambda allow_none=False: "loky")
    with pytest.raises(ValueError, match="uses 'loky'"):
        Trainer(run_cfg("eval.workers=true", "env.num_eval_tasks=3"), tmp_path / "a")
    with caplog.at_level("WARNING", logger="pomdp_ffm"):
        Trainer(
            run_cfg("eval.workers=true", "eval.episodes_together=false", "env.num_eval_tasks=3"), tmp_path / "c"
        ).close()
    assert any("eval.workers=true changes nothing here" in r.getMessage() for r in caplog.records)


# --- eval.during_updates ----------------------------------------------------------------------------------------
# Evaluations every iteration, a checkpoint every third (those evaluate at once), enough updates per burst for an
# evaluation's steps to be spread over them.
DURING = (
    "train.num_iters=6",
    "eval.log_interval=1",
    "checkpoint.interval=3",
    "env.num_eval_tasks=3",
    "train.num_updates_per_iter=0.2",
)


class Spread:
    """``Evaluator.device_busy`` as on a GPU whose queue is busy every other time it is asked, so that an
    evaluation's steps are spread over the burst; counts the steps so played."""

    def __init__(self, monkeypatch):
        self.calls, self.between = 0, 0
        spread, costs_nothing = self, evaluation_module.Evaluator.costs_nothing

        def busy(evaluator):
            spread.calls += 1
            return spread.calls % 2 == 1

        def counted(evaluator, rollout):
            played = costs_nothing(evaluator, rollout)  # then played at once
            spread.between += played
            return played

        monkeypatch.setattr(evaluation_module.Evaluator, "device_busy", busy)
        monkeypatch.setattr(evaluation_module.Evaluator, "costs_nothing", counted)


def after_defer(trainer, then) -> None:
    """``then()`` after each evaluation the trainer defers (eval.during_updates) has started."""
    defer = trainer.evaluator.defer

    def deferred(at):
        defer(at)
        then()

    trainer.evaluator.defer = deferred


class CountDeferred(Trainer):
    deferred: list = []

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        after_defer(self, lambda: CountDeferred.deferred.append(self.standing.env_steps))


@pytest.mark.parametrize(
    "task,algo,seq_model,way",
    [
        slow_case("Pendulum-V-v0", "sac", "ffm", "spread"),
        slow_case("Pendulum-V-v0", "td3", "gru", "spread"),
        slow_case("Pendulum-V-v0", "sac", "lstm", "at the burst's end"),  # (8 s)
        slow_case("HopperMJ-V-v0", "sac", "ffm", "spread"),
        slow_case("Pendulum-V-v0", "sac", "gru", "workers"),
        slow_case("HopperBLT-V-v0", "td3", "ffm", "workers"),
    ],
)
def test_evaluation_during_updates_writes_the_same_log(composed, tmp_path, monkeypatch, task, algo, seq_model, way):
    # The evaluation due after a burst, played during the next one with a copy of the actor as it was: the same
    # episodes, the same rows in the same order, the same training (the env's RNG moves on as before).
    overrides = (f"env={task}", f"algo={algo}", f"seq_model={seq_model}", *DURING)
    if task != "Pendulum-V-v0":  # 1000-step iterations: three of them
        overrides += ("train.num_iters=3",)
    train(composed(*overrides), tmp_path / "before")
    spread = Spread(monkeypatch) if way == "spread" else None
    CountDeferred.deferred = []
    extra = ("eval.workers=true",) if way == "workers" else ()
    out = train(composed(*overrides, "eval.during_updates=true", *extra), tmp_path / "during", CountDeferred)
    before, during = read(tmp_path / "before"), read(tmp_path / "during")
    pd.testing.assert_frame_equal(
        during.drop(columns=TIME_COLUMNS), before.drop(columns=TIME_COLUMNS), check_exact=True
    )
    # Deferred: the evaluations at clock iterations 2, 4, 5 (the pool is the first; 3 and 6 are checkpoints, 7 the
    # end). With 200-step episodes the env-step clock counts an iteration per episode.
    if task == "Pendulum-V-v0":
        assert CountDeferred.deferred == [400, 800, 1000] and out.standing.env_steps == 1400
    else:
        assert CountDeferred.deferred and out.standing.env_steps not in CountDeferred.deferred
    if spread is not None:
        assert spread.between > 0  # some steps were played between two updates
    if way == "workers":  # steps played between updates while the workers step
        assert before.shape == during.shape


@pytest.mark.slow
def test_stop_inside_the_burst_of_a_deferred_evaluation_resumes_to_the_same_log(composed, tmp_path, monkeypatch):
    # The checkpoint of a stop holds the rows: the deferred evaluation is played to its end and logged first.
    overrides = ("algo=sac", "seq_model=ffm", *DURING)
    train(composed(*overrides), tmp_path / "full")
    Spread(monkeypatch)
    calls = [0]

    class StopMidBurst(Trainer):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            update_all = self.updater.update_all

            def counted(*a, **kw):
                if self.evaluator.deferred is not None:  # the burst that plays a deferred evaluation: stopped
                    calls[0] += 1  # after its third update
                    if calls[0] == 3:
                        self.stop.request(10)
                return update_all(*a, **kw)

            self.updater.update_all = counted

    cut = composed(*overrides, "eval.during_updates=true")
    out = train(cut, tmp_path / "cut", StopMidBurst)
    assert out.stopped and out.standing.burst.done > 0
    rows = read(tmp_path / "cut")
    assert eval_rows(rows)["z/env_steps"].tolist()[-1] < out.standing.env_steps  # the deferred one, logged at the stop
    out = train(composed(*overrides, "eval.during_updates=true", "resume=true"), tmp_path / "cut")
    assert not out.stopped
    pd.testing.assert_frame_equal(
        read(tmp_path / "cut").drop(columns=TIME_COLUMNS),
        read(tmp_path / "full").drop(columns=TIME_COLUMNS),
        check_exact=True,
    )


@pytest.mark.parametrize(
    "bad,message",
    [
        (("eval.eval_stochastic=true",), "needs eval.eval_stochastic=false"),
        (("eval.episodes_together=false",), "needs eval.episodes_together=true"),
    ],
)
def test_evaluation_during_updates_refuses_what_it_cannot_defer(composed, tmp_path, bad, message):
    with pytest.raises(Refused, match=message):
        train(composed("eval.during_updates=true", *bad), tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_a_failing_deferred_evaluation_fails_the_run_with_its_own_error(composed, tmp_path, monkeypatch):
    # An eval env that fails between two updates ends the evaluation: the run fails with that error (its
    # checkpoint-on-failure path must not try to finish or log what is left of it).
    Spread(monkeypatch)

    class EvalEnvDies(Trainer):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            after_defer(self, self.break_an_eval_env)

        def break_an_eval_env(self):
            env, calls = self.evaluator.envs[1], [0]
            step_wait = env.step_wait

            def dying():
                calls[0] += 1
                if calls[0] == 2:
                    raise RuntimeError("eval env died")
                return step_wait()

            env.step_wait = dying

    with pytest.raises(RuntimeError, match="eval env died"):
        train(composed("algo=sac", "seq_model=gru", *DURING, "eval.during_updates=true"), tmp_path / "r", EvalEnvDies)
    assert "eval env died" in (tmp_path / "r" / "ERROR.txt").read_text()


def test_envs_in_workers_for_one_deferred_evaluation_episode_are_checked_at_start(run_cfg, tmp_path, monkeypatch):
    # A deferred evaluation plays on copies of the env even for one episode: with eval.workers those are workers,
    # and a start method they cannot use is refused when the run starts, not at its first evaluation.
    from pomdp_ffm import envs as envs_mod

    monkeypatch.setattr(envs_mod.multiprocessing, "get_start_method", lambda allow_none=False: "loky")
    with pytest.raises(ValueError, match="start method"):
        Trainer(run_cfg("eval.workers=true", "eval.during_updates=true", "env.num_eval_tasks=1"), tmp_path / "a")
