"""A run's evaluations: mean return, length and success rate over num_eval_tasks episodes of the actor,
deterministic, and stochastic with ``eval.eval_stochastic`` (docs/reference.md#evaluation).

The reference plays them one after another on the training env. With ``eval.episodes_together`` the deterministic
episodes are played together, one batched actor forward per step, on copies of the env: copy k starts from the
RNG state the training env would have after k resets, and the training env is left where the k-th reset would
leave it, so the episodes and the env's random draws are the reference's. (This needs env steps that draw nothing from
the env's RNG: true of every registered task, see tests/test_trainer.py.) A stochastic evaluation stays one after
another: its action noise is drawn per step, and a batch would draw it in another order. With ``eval.workers``
the copies step in worker processes.

With ``eval.during_updates`` the evaluation due after a burst of updates is started then, acted by a copy of the
actor as it is then, and played between the next burst's updates wherever that costs them nothing
(patches/017).
"""
from __future__ import annotations

import logging
from collections import Counter, deque

import numpy as np
import torch

from .agent import ActorSnapshot, OffStreamActing
from .config import RunConfig
from .envs import EnvInWorker, make_env, worker_start_method
from .rollout import AgentPolicy, EnvsStepping, Work, play_episodes

log = logging.getLogger("pomdp_ffm")


class Evaluator:
    """Plays the evaluations of one run, on its training env or on copies of it (``envs``, made at the first
    evaluation that needs them and closed with the evaluator), and holds the evaluation deferred to the next burst
    of updates. The timers count its acting and env seconds, its episodes' steps and its evaluations."""

    def __init__(self, cfg: RunConfig, env, acting, agent, timers: Counter):
        self.cfg, self.env, self.acting, self.agent, self.timers = cfg, env, acting, agent, timers
        self.envs: list = []
        self.deferred: _Deferred | None = None
        self.error: Exception | None = None  # one the deferred evaluation raised in a seed axis's joint round
        self.actor_copy: ActorSnapshot | OffStreamActing | None = None  # what a deferred evaluation acts with
        self.queued = QueuedUpdates(agent.device)
        if cfg.eval.workers and not cfg.eval_in_workers():
            log.warning("eval.workers=true changes nothing here: with eval.episodes_together=false or one "
                        "evaluation episode, the evaluation plays on the training env")
        if cfg.eval_in_workers():
            worker_start_method()  # one the workers cannot use is refused before any starts

    def evaluations(self):
        """The evaluations a row logs (a generator of their acting steps): deterministic, and stochastic with
        ``eval.eval_stochastic`` (else None)."""
        deterministic = yield from self.play(deterministic=True)
        stochastic = (yield from self.play(deterministic=False)) if self.cfg.eval.eval_stochastic else None
        return deterministic, stochastic

    def play(self, deterministic: bool, acting=None, on_copies: bool = False):
        """One evaluation, as a generator of its acting steps: (mean return, mean length, success rate).
        ``acting``: what acts (default: the run's); ``on_copies``: on copies of the env even for one episode (a
        deferred evaluation, while the training env collects)."""
        n, timers = self.cfg.env.num_eval_tasks, Counter()
        policy = AgentPolicy(self.acting if acting is None else acting, deterministic)
        if deterministic and self.cfg.eval.episodes_together and (n > 1 or on_copies):
            eps = yield from self._together(policy, n, timers)
        else:
            eps = []
            for _ in range(n):
                eps += yield from play_episodes([self.env], policy, record=False, timers=timers)
        # Its parts, not its wall time: in a seed axis an evaluation waits while the other seeds act and step.
        self.timers["eval"] += timers["act"] + timers["env"]
        self.timers.update({f"eval_{k}": v for k, v in timers.items()})
        self.timers.update(n_eval_steps=sum(e.length for e in eps), n_evals=1)
        return (float(np.mean([e.ret for e in eps])), float(np.mean([e.length for e in eps])),
                float(np.mean([e.success for e in eps])))

    def _together(self, policy: AgentPolicy, n: int, timers: Counter):
        while len(self.envs) < n:
            env = (EnvInWorker if self.cfg.eval.workers else make_env)(self.cfg.env.env_name)
            self.envs.append(env)  # closed with the evaluator, even if its first reset fails
            # A PyBullet env's first reset builds its scene and starts from a slightly different state than
            # later resets with the same RNG; the training env is always past its first reset here.
            env.reset()
        envs, chain = self.envs[:n], [self.env.rng_state()]

        def reset(i: int) -> np.ndarray:
            obs, rng = envs[i].reset_from(chain[-1])
            chain.append(rng)
            if i == n - 1:  # all resets happen before the first step: a deferred evaluation's too
                self.env.set_rng_state(rng)
            return obs

        return (yield from play_episodes(envs, policy, record=False, reset=reset, timers=timers))

    # --- eval.during_updates ----------------------------------------------------------------------------------
    def defer(self, at: dict) -> None:
        """Start the evaluation due now and leave the rest of it to the next burst of updates: a copy of the
        actor as it is now acts, its envs are reset now (so the training env's RNG moves on as the evaluation
        would move it, before the next episode is collected); ``at``: the clocks its row keeps."""
        if self.actor_copy is None:
            copy = ActorSnapshot(self.agent)
            self.actor_copy = OffStreamActing(copy) if self.agent.device.type == "cuda" else copy
        self.actor_copy.take()
        self.deferred = _Deferred(self.play(True, self.actor_copy, on_copies=True), at,
                                  elsewhere=self.cfg.eval.workers)

    def between_updates(self, hold_errors: bool = False) -> None:
        """After an update has been issued: the deferred evaluation (if any) advanced as far as it goes without
        waiting for the updates, i.e. while the device is still busy with the updates queued, or while its envs
        step in workers (on a CPU with envs in this process it waits for the burst's end, which costs the same).
        An error in it ends it; ``hold_errors`` (a seed axis's joint rounds, which run every seed's) keeps the
        error for this seed's own turn, where ``rest`` raises it."""
        d = self.deferred
        if d is None:
            return
        self.queued.mark()
        try:
            while d.work.item is not None and d.ready(self.queued.busy()):
                d.advance()
        except Exception as e:
            self.deferred = None  # its generator is dead: nothing of it is left to play or to log
            if not hold_errors:
                raise
            self.error = e

    def rest(self):
        """The rest of the deferred evaluation, its acting steps yielded as any evaluation's: (its result, the
        clocks when it was due), or None where none is deferred."""
        if self.error is not None:
            e, self.error = self.error, None
            raise e
        d, self.deferred = self.deferred, None
        if d is None:
            return None
        return (yield from d.rest()), d.at

    def close(self) -> None:
        if self.deferred is not None:
            log.warning("the evaluation due at env step %d was not finished: progress.csv has no row for it",
                        self.deferred.at["env_steps"])
            self.deferred = None
        for env in self.envs:  # (an env in a worker never raises on close)
            env.close()
        self.envs = []


class _Deferred:
    """An evaluation (``Evaluator.play``) started when it was due, advanced between updates, and finished
    (``rest``) by the burst that follows."""

    def __init__(self, evaluation, at: dict, elsewhere: bool):
        self.work = Work(evaluation)  # its resets, up to its first acting step
        self.at, self.elsewhere = at, elsewhere

    def ready(self, device_busy: bool) -> bool:
        """Whether advancing now costs the updates nothing: envs in workers whose steps are done, or an acting
        step while the device is busy anyway or while the envs it feeds would otherwise idle in their workers."""
        if isinstance(self.work.item, EnvsStepping):
            return self.work.item.ready()
        return device_busy or self.elsewhere

    def advance(self) -> None:
        self.work.send(self.work.item.answer)

    def rest(self):
        while self.work.item is not None:
            answer = yield self.work.item
            self.work.send(lambda: answer)
        return self.work.result


class QueuedUpdates:
    """Whether the device is still busy with updates queued before the latest one (CUDA events, queried without
    waiting): then host work done now (a deferred evaluation's steps) hides behind the device's. Always false on
    a CPU, where an update is done when its call returns."""

    DEPTH = 2

    def __init__(self, device: torch.device):
        self.device, self.cuda = device, device.type == "cuda"
        self.events: deque = deque(maxlen=self.DEPTH)

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
            self.events.append(event)

    def busy(self) -> bool:
        return len(self.events) == self.DEPTH and not self.events[0].query()
