"""Every registered memory trains in SAC and TD3 with separate actor and critic memories, through the seed axis and
a stop and resume: the models' own tests hold each to its reference, these to the loop that uses them."""

from __future__ import annotations

import signal

import numpy as np
import pandas as pd
import pytest
import torch

from pomdp_ffm.catalog import COMPARED
from pomdp_ffm.metrics import TIMING as TIME_COLUMNS
from pomdp_ffm.run.rundir import RunDir
from pomdp_ffm.seq_models import available
from pomdp_ffm.train import train_job
from pomdp_ffm.trainer import Trainer


class StopSeed1(Trainer):
    """Seed 1 asks to stop, as a SIGTERM would, once it has collected 400 steps (at its first evaluation)."""

    def _end_burst(self):
        evaluation = super()._end_burst()
        if self.cfg.seed == 1 and self.standing.env_steps >= 400:
            self.stop.request(signal.SIGTERM)
        return evaluation


def progress(run_dir) -> pd.DataFrame:
    return pd.read_csv(run_dir / "progress.csv").drop(columns=TIME_COLUMNS)


def axis_stopped_and_resumed(composed, run_dir, overrides):
    out = train_job(composed(*overrides, "seeds=[0,1]"), run_dir, trainer_cls=StopSeed1)
    assert out.stopped and RunDir(run_dir.parent / "seed-1").status() == "resumable"
    assert not train_job(composed(*overrides, "seeds=[0,1]", "resume=true"), run_dir).stopped


@pytest.mark.parametrize("model", available())
def test_every_memory_trains(run_cfg, tmp_path, model):
    # SAC: a pool episode, an iteration, an evaluation (TD3's updates with every memory: tests/test_agent.py; both
    # through a seed axis and a resume: below).
    run_dir = RunDir(tmp_path)
    run_dir.acquire()  # (as a start does, before the trainer writes)
    trainer = Trainer(run_cfg("env=Pendulum-V-v0", "algo=sac", f"seq_model={model}", "train.num_iters=1"), run_dir)
    memories = [trainer.agent.actor.encoder.memory, trainer.agent.critic.encoder.memory]
    before = [[p.detach().clone() for p in m.parameters()] for m in memories]
    trainer.train()
    trainer.close()
    run_dir.release()
    log = progress(tmp_path)
    assert log["z/env_steps"].dropna().tolist() == [400]
    losses = log[["rl_loss/qf1_loss", "rl_loss/qf2_loss", "rl_loss/policy_loss"]].dropna()
    assert len(losses) > 0 and np.isfinite(losses.to_numpy()).all()
    for memory, params in zip(memories, before):  # both memories were trained
        assert any(not torch.equal(p, q) for p, q in zip(memory.parameters(), params, strict=True))


# Every memory through one algorithm, the algorithms taken in turn down the registry (both for the paper's comparison):
# each memory's state crosses a checkpoint and the seed axis once, and both algorithms' state handling is covered, at
# half the cost of every memory through both.
AXIS_CASES = [
    (model, algo)
    for i, model in enumerate(available())
    for algo in (("sac", "td3") if model in COMPARED else (("sac", "td3")[i % 2],))
]


@pytest.mark.slow
@pytest.mark.parametrize("model, algo", AXIS_CASES, ids=[f"{m}-{a}" for m, a in AXIS_CASES])
def test_every_memory_trains_through_the_seed_axis_and_a_resume(composed, tmp_path, model, algo):
    # Each seed of the axis, stopped and resumed, is the run it would be alone and uninterrupted.
    overrides = ("env=Pendulum-V-v0", f"algo={algo}", f"seq_model={model}", "device=cpu", "train.num_iters=2")
    axis_stopped_and_resumed(composed, tmp_path / "axis" / "seed-0", overrides)
    for k in (0, 1):
        run_dir = tmp_path / "axis" / f"seed-{k}"
        assert RunDir(run_dir).status() == "done"
        assert progress(run_dir)["z/env_steps"].dropna().tolist() == [400, 600]
        train_job(composed(*overrides, f"seed={k}"), tmp_path / "solo" / f"seed-{k}")
        pd.testing.assert_frame_equal(progress(run_dir), progress(tmp_path / "solo" / f"seed-{k}"), check_exact=True)
