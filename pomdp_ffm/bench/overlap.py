"""``python -m pomdp_ffm.bench overlap env=<task> [overrides] --updates N``: an evaluation played during a burst of
updates (``eval.during_updates``) against one played after it, as the reference does.

Variants, timed interleaved on one trainer (its buffer filled with random episodes; its actor trained only by the
benchmark's own bursts):
  - ``updates``: a burst of N updates alone;
  - ``evaluation``: one evaluation alone (num_eval_tasks episodes together, acted by the actor's copy);
  - ``after``: the burst, then the evaluation: the reference's order;
  - ``during``: the evaluation started, the burst with the evaluation's steps between its updates wherever they
    cost the updates nothing, then what is left of the evaluation.
Median seconds per variant, ratios to ``after``. The best ``during`` can reach is the larger of ``updates`` and
``evaluation``: on a GPU the host steps the envs while the device runs the queued updates. Episodes that end
early (Hopper, Walker, Ant) can differ in length from variant to variant as the actor trains: prefer a task
whose episodes run to the time limit (HalfCheetah).
"""
from __future__ import annotations

import tempfile

from ..burst import Burst
from ..rollout import RandomPolicy, answered, play_episodes
from ..rundir import RunDir
from ..trainer import Trainer
from .common import Row, interleaved_medians
from .loop import compose_run


def run(overrides: list[str], updates: int, repeats: int, device: str, threads: int | None) -> list[Row]:
    cfg, _ = compose_run([*overrides, "eval.during_updates=true"], device, threads)
    trainer = Trainer(cfg, RunDir(tempfile.gettempdir()))  # writes nothing
    env, steps = trainer.env, 0
    while steps < trainer.max_len:  # at least one full episode's worth of windows, from random actions
        (ep,) = answered(play_episodes([env], RandomPolicy([env]), record=True))
        if ep.length >= 2:
            trainer.buffer.add_episode(ep)
        steps += ep.length
    evaluator = trainer.evaluator

    def burst() -> None:
        b = Burst(trainer, {"n": updates, "done": 0, "sums": {}, "counts": {}})
        trainer.run_updates(b)
        b.close()

    def evaluation() -> None:  # as "during" plays it: the actor's copy, taken now
        evaluator.defer({"env_steps": 0})
        answered(evaluator.rest())

    def after() -> None:
        burst()
        evaluation()

    def during() -> None:
        evaluator.defer({"env_steps": 0})
        burst()
        answered(evaluator.rest())

    evaluation()  # builds the actor's copy and its acting

    fns = {"updates": burst, "evaluation": evaluation, "after": after, "during": during}
    try:
        med = interleaved_medians(fns, repeats, trainer.device, warmup=1)
    finally:
        trainer.close()
    workers = " eval.workers" if cfg.eval.workers else ""
    shape = (f"{cfg.env.env_name} {cfg.policy.algo_name}+{cfg.policy.seq_model} {updates} updates, "
             f"{cfg.env.num_eval_tasks} eval episodes{workers}")
    return [Row("overlap", shape, k, "seconds", v, "s") for k, v in med.items()]
