"""SAC+FFM learns Pendulum-V (velocities hidden) within a fixed budget: the end-to-end learning check.

The run goes through the project's real entry point (``python -m pomdp_ffm.train``, Hydra, Trainer) with the
reference's Pendulum-V settings (gamma 0.9, one update per env step, 5 random pool episodes, deterministic
evaluation) except for what makes it fit a few minutes on 2 CPU cores: 64-unit memory and MLPs, batches of
32 windows of 32 steps, lr 1e-3, and a budget of 10k env steps (5 pool + 45 learning episodes, ~10k updates),
evaluated every 1000 steps on 10 episodes.

Criterion: the best evaluation of the run (the running maximum, the FFM paper's score) beats -400. A policy
that cannot swing up scores about -1200 to -1500; the swing-up solved scores about -150 to -200.

Measured with the current code, one run at a time on a shared 2-core VM (load average 2-3), wall times of
the whole subprocess:

    seed  best eval (at env step)  last eval (10k)  first eval (2k)  wall
    0     -178.1 (9k)              -218.4           -1424            149 s
    1     -143.9 (8k)              -206.5           -1302            197 s
    2     -204.5 (9k)              -321.3           -1235            216 s

All three pass with a margin of ~200 on the best eval; the last eval alone would pass too, with a margin of
only ~80 on seed 2, so it is not the criterion. The test runs seed 0.
"""
import subprocess
import sys

import pandas as pd
import pytest

THRESHOLD = -400.0
OVERRIDES = [
    "env=Pendulum-V-v0", "algo=sac", "seq_model=ffm",
    "train.num_iters=45", "train.batch_size=32", "train.sampled_seq_len=32",
    "eval.log_interval=5", "env.num_eval_tasks=10",
    "policy.rnn_hidden_size=64", "policy.dqn_layers=[64,64]", "policy.policy_layers=[64,64]", "policy.lr=0.001",
    "checkpoint.interval=1000", "progress=false",
]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", [0])
def test_sac_ffm_solves_pendulum_v(tmp_path, seed):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "pomdp_ffm.train", *OVERRIDES, f"seed={seed}", f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    df = pd.read_csv(run_dir / "progress.csv")
    ev = df[df["z/env_steps"].notna()]
    returns = ev["metrics/return_eval_total"]
    curve = ", ".join(f"{int(s)}: {r:.0f}" for s, r in zip(ev["z/env_steps"], returns))
    assert ev["z/env_steps"].iloc[-1] == 10_000 and len(ev) == 9, curve  # the whole budget ran
    assert returns.iloc[0] < -900, f"the first evaluation already solves the task: {curve}"
    assert returns.max() > THRESHOLD, f"best eval return {returns.max():.1f} <= {THRESHOLD} in 10k steps: {curve}"
