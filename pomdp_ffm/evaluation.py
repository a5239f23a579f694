"""A run's evaluations (docs/reference.md#evaluation). ``eval.episodes_together`` plays the deterministic episodes on
env copies, copy k from the RNG state the training env would have after k resets: the reference's episodes (a
stochastic one stays sequential: a batch would draw its noise in another order). ``eval.workers`` steps the copies
in worker processes; ``eval.during_updates`` plays with an actor copy during the next burst (patches/017)."""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from .agent import ActorSnapshot, OffStreamActing
from .config import RunConfig
from .envs import EnvInWorker, make_env, worker_start_method
from .rollout import AgentPolicy, Rollout, play_all

log = logging.getLogger("pomdp_ffm")


@dataclass(frozen=True)
class EvalResult:
    """An evaluation's means over its episodes."""

    ret: float
    length: float
    success: float


@dataclass(frozen=True)
class Clocks:
    """Where the run stood when an evaluation was due: its row's clocks."""

    env_steps: int
    rollouts: int
    rl_steps: int
    time: float


@dataclass(frozen=True)
class Due:
    """When an evaluation was due, and what waits for it."""

    at: Clocks | None = None  # its row's clocks; None: the clocks when its row is written
    snapshot: bool = False  # the reference's weights-only snapshot, named by the return
    checkpoint: bool = False
    iters: int = 0  # the eval clock's value
    deferred: bool = False  # played during the next burst (eval.during_updates)


@dataclass(frozen=True)
class Schedule:
    """When evaluations fall due, as in the reference's learner.py: every ``eval.log_interval`` iterations of its
    env-step clock (env steps // an iteration's length), a snapshot with one every ``eval.save_interval`` in the last
    quarter of the budget, a checkpoint every ``checkpoint.interval``. With ``eval.during_updates`` one that nothing
    waits for (a snapshot, a checkpoint, the end) is deferred into the next burst."""

    iter_len: int
    budget: int
    log_interval: int
    save_interval: int
    checkpoint_interval: int
    during_updates: bool

    @classmethod
    def of(cls, cfg: RunConfig, iter_len: int, budget: int) -> Schedule:
        ev = cfg.eval
        return cls(iter_len, budget, ev.log_interval, ev.save_interval, cfg.checkpoint.interval, ev.during_updates)

    def due(self, env_steps: int, last_iters: int) -> Due | None:
        """The evaluation due at ``env_steps`` (``last_iters``: the clock at the last one), or None."""
        iters = env_steps // self.iter_len
        if iters == last_iters or iters % self.log_interval != 0:
            return None
        snapshot = self.save_interval > 0 and env_steps > 0.75 * self.budget and iters % self.save_interval == 0
        checkpoint = iters % self.checkpoint_interval == 0
        deferred = self.during_updates and not (snapshot or checkpoint) and env_steps < self.budget
        return Due(snapshot=snapshot, checkpoint=checkpoint, iters=iters, deferred=deferred)


class Evaluation:
    """One evaluation's rollouts, each made (its envs reset) once the one before has ended: the deterministic
    episodes, then with ``stochastic`` the stochastic ones, through ``next`` and ``ended`` (rollout.play_all plays
    them in turn; a seed axis steps several seeds' at once). ``due``: its row's clocks and what waits for it."""

    def __init__(self, evaluator: Evaluator, due: Due, acting=None, on_copies: bool = False, stochastic: bool = False):
        self.evaluator, self.due = evaluator, due
        kinds = [True, False] if stochastic else [True]
        self.parts = [(d, evaluator.rollouts(AgentPolicy(acting or evaluator.acting, d), on_copies)) for d in kinds]
        self.played: list[list] = [[] for _ in kinds]
        self.timers = [Counter() for _ in kinds]
        self.part, self.made = 0, 0

    def next(self) -> Rollout | None:
        """The next rollout, started; None once all have been."""
        while self.part < len(self.parts) and self.made == len(self.parts[self.part][1]):
            self.part, self.made = self.part + 1, 0
        if self.part == len(self.parts):
            return None
        self.made += 1
        return self.parts[self.part][1][self.made - 1](self.timers[self.part])

    def ended(self, rollout: Rollout) -> None:
        self.played[self.part] += rollout.episodes()

    def results(self) -> tuple[EvalResult, EvalResult | None]:
        """The deterministic result, and the stochastic one or None; their time charged to the evaluator's timers."""
        out = []
        for eps, timers in zip(self.played, self.timers):
            self.evaluator.charge(timers, eps)
            out.append(
                EvalResult(*(float(np.mean([getattr(e, k) for e in eps])) for k in ("ret", "length", "success")))
            )
        return out[0], (out[1] if len(out) > 1 else None)


class Evaluator:
    """One run's evaluations, on its training env or on copies (made when first needed), and the one deferred."""

    def __init__(self, cfg: RunConfig, env, acting, agent, timers: Counter):
        self.cfg, self.env, self.acting, self.agent, self.timers = cfg, env, acting, agent, timers
        self.envs: list = []
        self.deferred: Evaluation | None = None
        self.deferred_rollout: Rollout | None = None  # the deferred evaluation's rollout in play
        self.error: Exception | None = None  # raised by the deferred evaluation in a seed axis's joint round
        self.actor_copy: ActorSnapshot | OffStreamActing | None = None
        self.queued: deque = deque(maxlen=2)  # CUDA events of the latest updates
        if cfg.eval.workers and not cfg.eval_in_workers():
            log.warning(
                "eval.workers=true changes nothing here: with eval.episodes_together=false or one "
                "evaluation episode, the evaluation plays on the training env"
            )
        if cfg.eval_in_workers():
            worker_start_method()  # one the workers cannot use is refused before any starts

    def evaluation(self, due: Due) -> Evaluation:
        """The evaluation of a row: deterministic, and stochastic with eval.eval_stochastic."""
        return Evaluation(self, due, stochastic=self.cfg.eval.eval_stochastic)

    def rollouts(self, policy: AgentPolicy, on_copies: bool) -> list[Callable[[Counter], Rollout]]:
        """The rollouts of one evaluation, each to be made when due. ``on_copies``: on env copies even for one
        episode (a deferred evaluation, while the training env collects)."""
        n = self.cfg.env.num_eval_tasks
        if policy.deterministic and self.cfg.eval.episodes_together and (n > 1 or on_copies):
            return [lambda timers: self._together(policy, n, timers)]
        return [lambda timers: Rollout([self.env], policy, record=False, timers=timers)] * n

    def _together(self, policy: AgentPolicy, n: int, timers: Counter) -> Rollout:
        while len(self.envs) < n:
            env = (EnvInWorker if self.cfg.eval.workers else make_env)(self.cfg.env.env_name)
            self.envs.append(env)  # closed with the evaluator, even if its first reset fails
            # A PyBullet env's first reset is unlike its later ones with the same RNG (envs.POMDPWrapper
            # .set_rng_state); the training env is always past its first reset here.
            env.reset()
        envs, chain = self.envs[:n], [self.env.rng_state()]

        def reset(i: int) -> np.ndarray:
            obs, rng = envs[i].reset_from(chain[-1])
            chain.append(rng)
            if i == n - 1:  # all resets happen before the first step: a deferred evaluation's too
                self.env.set_rng_state(rng)
            return obs

        return Rollout(envs, policy, record=False, reset=reset, timers=timers)

    def charge(self, timers: Counter, episodes: list) -> None:
        # Its parts, not its wall time: in a seed axis an evaluation waits while the other seeds act and step.
        self.timers["eval"] += timers["act"] + timers["env"]
        self.timers.update({f"eval_{k}": v for k, v in timers.items()})
        self.timers.update(n_eval_steps=sum(e.length for e in episodes), n_evals=1)

    def defer(self, due: Due) -> None:
        """Start the evaluation due now with a copy of the actor, its envs reset now (so the training env's RNG moves
        on before the next episode), and leave the rest to the next burst. ``due.at``: its row's clocks."""
        if self.actor_copy is None:
            copy = ActorSnapshot(self.agent)
            self.actor_copy = OffStreamActing(copy) if self.agent.device.type == "cuda" else copy
        self.actor_copy.take()
        self.deferred = Evaluation(self, due, self.actor_copy, on_copies=True)
        self.deferred_rollout = self.deferred.next()

    def between_updates(self, hold_errors: bool = False) -> None:
        """The deferred evaluation advanced as far as it costs the updates nothing. ``hold_errors`` (a seed axis's
        joint rounds) keeps its error for ``finish_deferred`` to raise in this seed's own turn."""
        rollout = self.deferred_rollout
        if rollout is None:
            return
        if self.agent.device.type == "cuda":
            self.queued.append(torch.cuda.Event())
            self.queued[-1].record(torch.cuda.current_stream(self.agent.device))
        try:
            while not rollout.done and self.costs_nothing(rollout):
                if rollout.sent is None:
                    rollout.send(rollout.act())
                else:
                    rollout.receive()
        except Exception as e:
            self.deferred = self.deferred_rollout = None  # its rollout is in no known state
            if not hold_errors:
                raise
            self.error = e

    def costs_nothing(self, rollout: Rollout) -> bool:
        """Whether the rollout's next phase costs the updates nothing now: its worker envs' steps are in, or the
        device is busy anyway, or its envs would otherwise idle in their workers."""
        if rollout.sent is not None:
            return rollout.ready()
        return self.device_busy() or self.cfg.eval.workers

    def device_busy(self) -> bool:
        """Whether the device still runs updates queued before the latest (not waited for; never on a CPU)."""
        return len(self.queued) == 2 and not self.queued[0].query()

    def finish_deferred(self) -> Evaluation | None:
        """The deferred evaluation, its rest played now, or None."""
        if self.error is not None:
            e, self.error = self.error, None
            raise e
        evaluation, rollout, self.deferred, self.deferred_rollout = self.deferred, self.deferred_rollout, None, None
        if evaluation is None:
            return None
        if rollout is not None:
            rollout.play()
            evaluation.ended(rollout)
        play_all(evaluation.next, evaluation.ended)
        return evaluation

    def close(self) -> None:
        if self.deferred is not None:
            log.warning(
                "the evaluation due at env step %d was not finished: progress.csv has no row for it",
                self.deferred.due.at.env_steps,
            )
            self.deferred = self.deferred_rollout = None
        for env in self.envs:  # (an env in a worker never raises on close)
            env.close()
        self.envs = []
