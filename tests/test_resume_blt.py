"""A PyBullet run stopped (as SIGTERM / SIGUSR1 stop it) and killed at several points, resumed each time: its log is the
uninterrupted run's, cell for cell but the timing columns. Pendulum's stop tests (test_trainer.py) cannot see what
only a PyBullet env carries: a resumed run's new env is at its first reset, unlike the saved one
(envs.POMDPWrapper.set_rng_state; tests/test_envs.py::test_a_restored_env_replays_the_saved_ones_episodes)."""

import pandas as pd
import pytest

from pomdp_ffm.metrics import TIMING as TIME_COLUMNS
from pomdp_ffm.train import train_job
from pomdp_ffm.trainer import Trainer

# HopperBLT-V's random pool (about 40 episodes, 1k steps), a 50-update burst after it, then short episodes of a
# few updates each and an evaluation at every 1k env steps, to 4k.
BASE = (
    "env=HopperBLT-V-v0",
    "seq_model=ffm",
    "seed=1",
    "train.num_iters=3",
    "train.batch_size=8",
    "train.num_updates_per_iter=0.05",
)


def read(run_dir):
    return pd.read_csv(run_dir / "progress.csv").drop(columns=TIME_COLUMNS)


class Plan:
    """The stops still to take, in order, each (where, when): the first whose ``when(trainer)`` holds at a hook
    ``where`` of the current attempt stops it ("kill": raises as if the process were killed)."""

    def __init__(self, stops):
        self.stops, self.taken = list(stops), []

    def at(self, where: str, trainer) -> str | None:
        if self.stops and self.stops[0][0] == where and self.stops[0][1](trainer):
            self.taken.append(self.stops.pop(0)[0])
            return self.taken[-1]
        return None


class PlannedStop:
    """A trainer's stop signals, with the plan's stops at its checks: before an iteration's episodes (its burst
    none yet) and before each update (then "update": after the update before it)."""

    def __init__(self, signals, trainer):
        self.signals, self.trainer = signals, trainer

    @property
    def requested(self):
        return self.signals.requested

    def request(self, signum):
        self.signals.request(signum)

    def check(self):
        if self.trainer.standing.burst is None:
            if self.trainer.plan_at("iteration start"):
                self.request(15)
        elif self.trainer.plan_at("update"):
            self.request(10)
        self.signals.check()


def stopping_trainer(plan: Plan):
    class Stopping(Trainer):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.stop = PlannedStop(self.stop, self)

        def _log_evaluation(self, *results, **kw):
            ret = super()._log_evaluation(*results, **kw)
            if self.plan_at("evaluation"):
                self.stop.request(15)  # taken at the next iteration's start, after this one's checkpoint
            if self.plan_at("kill after evaluation"):
                raise KeyboardInterrupt  # before this evaluation's checkpoint: resumed from the previous one
            return ret

        def plan_at(self, where):
            return plan.at(where, self)

    return Stopping


@pytest.mark.parametrize(
    "setting",
    [
        # the evaluation on the training env (one episode), as in the runs
        pytest.param(("algo=sac",), marks=pytest.mark.slow, id="sac-eval-on-training-env"),  # (23 s; the cause is
        # pinned in the default suite by tests/test_envs.py::test_a_restored_env_replays_the_saved_ones_episodes)
        # on two env copies (new ones in a resumed run), each evaluation played during the next burst
        pytest.param(
            ("algo=td3", "env.num_eval_tasks=2", "eval.during_updates=true"),
            marks=pytest.mark.slow,
            id="td3-eval-on-copies-during-updates",
        ),
    ],
)
def test_a_pybullet_run_stopped_and_resumed_at_each_point_writes_the_uninterrupted_log(composed, tmp_path, setting):
    # Two runs' worth of HopperBLT steps and updates, and six starts: about 20 s on 2 cores.
    overrides = (*BASE, *setting)
    full, cut = tmp_path / "full", tmp_path / "cut"
    train_job(composed(*overrides), full)
    want = read(full)
    in_pool_burst = ("update", lambda t: not t.standing.pool_done and t.standing.rl_steps == 10)
    # an iteration's burst of several updates, after its first
    mid_burst = (
        "update",
        lambda t: (
            t.standing.pool_done and t.standing.burst.n >= 2 and t.standing.burst.done == 1 and t.standing.rl_steps > 60
        ),
    )
    at_start = ("iteration start", lambda t: t.standing.env_steps >= 1500)  # some iterations after the resume
    after_evaluation = ("evaluation", lambda t: t.standing.env_steps >= 2000)
    kill = ("kill after evaluation", lambda t: t.standing.env_steps >= 3000)
    plan = Plan([in_pool_burst, mid_burst, at_start, after_evaluation, kill])
    stopping = stopping_trainer(plan)
    for attempt in range(6):
        try:
            out = train_job(composed(*overrides, *(("resume=true",) if attempt else ())), cut, stopping)
        except KeyboardInterrupt:
            out = None
        got = read(cut)
        # every row written so far, the rows of a killed attempt past its checkpoint included, is the full run's
        # (no dtypes to compare in a header alone)
        pd.testing.assert_frame_equal(got, want.iloc[: len(got)], check_exact=True, check_dtype=len(got) > 0)
        if attempt < 5:
            assert len(plan.taken) == attempt + 1, f"attempt {attempt} took no stop: {plan.taken}"
            assert out is None if attempt == 4 else out.stopped
        if attempt == 0:
            assert out.standing.burst.done == 10 and not out.standing.pool_done
        if attempt == 1:
            assert 0 < out.standing.burst.done < out.standing.burst.n
    assert not plan.stops and not out.stopped
    pd.testing.assert_frame_equal(read(cut), want, check_exact=True)
