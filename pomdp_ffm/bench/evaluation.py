"""``bench eval``: ways to play an evaluation; ``bench overlap``: an evaluation after or during a burst of updates;
timed interleaved (docs/benchmarks.md, "Evaluation" and "Evaluation during the next burst"). For ``overlap``, prefer a
task whose episodes run to the time limit (HalfCheetah): others' lengths change as the actor trains."""

from __future__ import annotations

import tempfile

import gymnasium
import numpy as np

from ..burst import update_bursts
from ..envs import EnvInWorker, make_env
from ..evaluation import Clocks, Due
from ..rollout import AgentPolicy, RandomPolicy, Rollout
from ..run.rundir import RunDir
from ..trainer import Trainer
from .common import Row, interleaved_medians
from .loop import compose_run


def _vector_episodes(venv, policy: AgentPolicy, n: int) -> None:
    # Gymnasium's vector envs reset a finished env on the next step: play until each has finished once.
    obs, _ = venv.reset()
    prev_a, prev_r = np.zeros((n, venv.single_action_space.shape[0]), np.float32), np.zeros(n, np.float32)
    state, done = policy.initial_state(n), np.zeros(n, bool)
    while not done.all():
        actions, state = policy(obs, prev_a, prev_r, state, ~done)
        obs, rew, term, trunc, _ = venv.step(actions)
        prev_a, prev_r = actions, rew.astype(np.float32)
        done |= term | trunc


def run(overrides: list[str], repeats: int, device: str, threads: int | None) -> list[Row]:
    cfg = compose_run(overrides, device, threads)
    trainer = Trainer(cfg, RunDir(tempfile.gettempdir()))  # the actor, seeded and on its device; writes nothing
    task, n = cfg.env.env_name, cfg.env.num_eval_tasks
    policy = AgentPolicy(trainer.agent, deterministic=True)
    single = make_env(task, seed=0)
    envs = [make_env(task, seed=i) for i in range(n)]
    workers = [EnvInWorker(task, seed=i) for i in range(n)]
    sync, asyn = (
        v([lambda: make_env(task) for _ in range(n)])
        for v in (gymnasium.vector.SyncVectorEnv, gymnasium.vector.AsyncVectorEnv)
    )
    fns = {
        "one-after-another": lambda: [Rollout([single], policy, record=False).play() for _ in range(n)],
        "together": lambda: Rollout(envs, policy, record=False).play(),
        "workers": lambda: Rollout(workers, policy, record=False).play(),
        "sync-vector": lambda: _vector_episodes(sync, policy, n),
        "async-vector": lambda: _vector_episodes(asyn, policy, n),
    }
    try:
        med = interleaved_medians(fns, repeats, trainer.device, warmup=1)
    finally:
        for c in [single, *envs, *workers, sync, asyn, trainer]:
            c.close()
    shape = f"{task} x{n} {cfg.policy.algo_name}+{cfg.policy.seq_model}"
    return [Row("eval", shape, k, "seconds per evaluation", v, "s") for k, v in med.items()]


def run_overlap(overrides: list[str], updates: int, repeats: int, device: str, threads: int | None) -> list[Row]:
    cfg = compose_run([*overrides, "eval.during_updates=true"], device, threads)
    trainer = Trainer(cfg, RunDir(tempfile.gettempdir()))
    env, evaluator, steps = trainer.env, trainer.evaluator, 0
    while steps < trainer.max_len:  # at least one full episode's worth of windows, from random actions
        (ep,) = Rollout([env], RandomPolicy([env]), record=True).play()
        if ep.length >= 2:
            trainer.buffer.add_episode(ep)
        steps += ep.length

    def burst() -> None:
        trainer.standing.begin_burst(updates, trainer.device)
        update_bursts([trainer], trainer.updater)
        trainer.standing.burst.close()

    def evaluation(meanwhile=lambda: None) -> None:  # as "during" plays it: the actor's copy, taken now
        evaluator.defer(Due(at=Clocks(0, 0, 0, 0.0)))  # (its row's clocks: no row is written here)
        meanwhile()
        evaluator.finish_deferred()

    evaluation()  # builds the actor's copy and its acting
    fns = {
        "updates": burst,
        "evaluation": evaluation,
        "after": lambda: (burst(), evaluation()),
        "during": lambda: evaluation(meanwhile=burst),
    }
    try:
        med = interleaved_medians(fns, repeats, trainer.device, warmup=1)
    finally:
        trainer.close()
    shape = (
        f"{cfg.env.env_name} {cfg.policy.algo_name}+{cfg.policy.seq_model} {updates} updates, "
        f"{cfg.env.num_eval_tasks} eval episodes{' eval.workers' if cfg.eval.workers else ''}"
    )
    return [Row("overlap", shape, k, "seconds", v, "s") for k, v in med.items()]
