"""``python -m pomdp_ffm.bench eval env=<task> [overrides]``: ways to play an evaluation's episodes.

Variants, each playing num_eval_tasks deterministic episodes of the agent's actor (its initial weights):
  - ``one-after-another``: the reference's way, one episode at a time at batch 1;
  - ``together``: the trainer's way, all episodes in lockstep in this process, one batched forward per step;
  - ``workers``: the same with each env in a worker process (``eval.workers=true``, ``envs.EnvInWorker``);
  - ``sync-vector`` / ``async-vector``: the same lockstep over Gymnasium's SyncVectorEnv / AsyncVectorEnv
    (envs in worker processes). These two are timed only: the trainer's RNG chaining, which makes the episodes
    the reference's, is not applied to them.
Timed interleaved, median seconds per evaluation, with ratios to one-after-another.
"""
from __future__ import annotations

import tempfile

import gymnasium
import numpy as np

from ..envs import EnvInWorker, make_env
from ..rollout import AgentPolicy, answered, play_episodes
from ..rundir import RunDir
from ..trainer import Trainer
from .common import Row, interleaved_medians
from .loop import compose_run


def _vector_episodes(venv, policy: AgentPolicy, n: int) -> None:
    # Gymnasium's vector envs reset a finished env on the next step: play until each has finished once.
    obs, _ = venv.reset()
    act_dim = venv.single_action_space.shape[0]
    prev_a, prev_r = np.zeros((n, act_dim), np.float32), np.zeros(n, np.float32)
    state, done = policy.initial_state(n), np.zeros(n, bool)
    while not done.all():
        actions, state = policy(obs, prev_a, prev_r, state, ~done)
        obs, rew, term, trunc, _ = venv.step(actions)
        prev_a, prev_r = actions, rew.astype(np.float32)
        done |= term | trunc


def run(overrides: list[str], repeats: int, device: str, threads: int | None) -> list[Row]:
    cfg, _ = compose_run(overrides, device, threads)
    trainer = Trainer(cfg, RunDir(tempfile.gettempdir()))  # the actor, seeded and on its device; writes nothing
    task, n = cfg.env.env_name, cfg.env.num_eval_tasks
    policy = AgentPolicy(trainer.agent, deterministic=True)
    single = make_env(task, seed=0)
    envs = [make_env(task, seed=i) for i in range(n)]
    workers = [EnvInWorker(task, seed=i) for i in range(n)]
    sync = gymnasium.vector.SyncVectorEnv([lambda: make_env(task) for _ in range(n)])
    asyn = gymnasium.vector.AsyncVectorEnv([lambda: make_env(task) for _ in range(n)])
    fns = {
        "one-after-another": lambda: [answered(play_episodes([single], policy, record=False)) for _ in range(n)],
        "together": lambda: answered(play_episodes(envs, policy, record=False)),
        "workers": lambda: answered(play_episodes(workers, policy, record=False)),
        "sync-vector": lambda: _vector_episodes(sync, policy, n),
        "async-vector": lambda: _vector_episodes(asyn, policy, n),
    }
    try:
        med = interleaved_medians(fns, repeats, trainer.device, warmup=1)
    finally:
        for e in [single, *envs, *workers, sync, asyn]:
            e.close()
        trainer.close()
    shape = f"{task} x{n} {cfg.policy.algo_name}+{cfg.policy.seq_model}"
    return [Row("eval", shape, k, "seconds per evaluation", v, "s") for k, v in med.items()]
