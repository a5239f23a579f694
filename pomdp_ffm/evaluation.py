"""A run's evaluations (docs/reference.md#evaluation). ``eval.episodes_together`` plays the deterministic episodes on
env copies, copy k from the RNG state the training env would have after k resets: the reference's episodes (a
stochastic one stays sequential: a batch would draw its noise in another order). ``eval.workers`` steps the copies
in worker processes; ``eval.during_updates`` plays with an actor copy during the next burst (patches/017)."""
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
    """One run's evaluations, on its training env or on copies (made when first needed), and the one deferred."""

    def __init__(self, cfg: RunConfig, env, acting, agent, timers: Counter):
        self.cfg, self.env, self.acting, self.agent, self.timers = cfg, env, acting, agent, timers
        self.envs: list = []
        self.deferred: Work | None = None
        self.deferred_at: dict = {}  # the clocks when the deferred evaluation was due
        self.error: Exception | None = None  # raised by the deferred evaluation in a seed axis's joint round
        self.actor_copy: ActorSnapshot | OffStreamActing | None = None
        self.queued: deque = deque(maxlen=2)  # CUDA events of the latest updates
        if cfg.eval.workers and not cfg.eval_in_workers():
            log.warning("eval.workers=true changes nothing here: with eval.episodes_together=false or one "
                        "evaluation episode, the evaluation plays on the training env")
        if cfg.eval_in_workers():
            worker_start_method()  # one the workers cannot use is refused before any starts

    def evaluations(self):
        """A row's evaluations (yielding their acting steps): deterministic, and stochastic or None."""
        deterministic = yield from self.play(deterministic=True)
        stochastic = (yield from self.play(deterministic=False)) if self.cfg.eval.eval_stochastic else None
        return deterministic, stochastic

    def play(self, deterministic: bool, acting=None, on_copies: bool = False):
        """One evaluation (yielding its acting steps): (mean return, mean length, success rate). ``on_copies``:
        on env copies even for one episode (a deferred evaluation, while the training env collects)."""
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
        return tuple(float(np.mean([getattr(e, k) for e in eps])) for k in ("ret", "length", "success"))

    def _together(self, policy: AgentPolicy, n: int, timers: Counter):
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

        return (yield from play_episodes(envs, policy, record=False, reset=reset, timers=timers))

    def defer(self, at: dict) -> None:
        """Start the evaluation due now with a copy of the actor, its envs reset now (so the training env's RNG moves
        on before the next episode), and leave the rest to the next burst. ``at``: its row's clocks."""
        if self.actor_copy is None:
            copy = ActorSnapshot(self.agent)
            self.actor_copy = OffStreamActing(copy) if self.agent.device.type == "cuda" else copy
        self.actor_copy.take()
        self.deferred, self.deferred_at = Work(self.play(True, self.actor_copy, on_copies=True)), at

    def between_updates(self, hold_errors: bool = False) -> None:
        """The deferred evaluation advanced as far as it costs the updates nothing. ``hold_errors`` (a seed axis's
        joint rounds) keeps its error for ``rest`` to raise in this seed's own turn."""
        work = self.deferred
        if work is None:
            return
        if self.agent.device.type == "cuda":
            self.queued.append(torch.cuda.Event())
            self.queued[-1].record(torch.cuda.current_stream(self.agent.device))
        try:
            while work.item is not None and self._costs_nothing(work.item):
                work.send(work.item.answer)
        except Exception as e:
            self.deferred = None  # its generator is dead
            if not hold_errors:
                raise
            self.error = e

    def _costs_nothing(self, item) -> bool:
        """Whether answering ``item`` now costs the updates nothing: its worker envs' steps are in, or the device is
        busy anyway, or its envs would otherwise idle in their workers."""
        if isinstance(item, EnvsStepping):
            return item.ready()
        return self.device_busy() or self.cfg.eval.workers

    def device_busy(self) -> bool:
        """Whether the device still runs updates queued before the latest (not waited for; never on a CPU)."""
        return len(self.queued) == 2 and not self.queued[0].query()

    def rest(self):
        """The rest of the deferred evaluation (yielding its acting steps): (result, clocks when due), or None."""
        if self.error is not None:
            e, self.error = self.error, None
            raise e
        work, self.deferred = self.deferred, None
        if work is None:
            return None
        while work.item is not None:
            answer = yield work.item
            work.send(lambda: answer)
        return work.result, self.deferred_at

    def close(self) -> None:
        if self.deferred is not None:
            log.warning("the evaluation due at env step %d was not finished: progress.csv has no row for it",
                        self.deferred_at["env_steps"])
            self.deferred = None
        for env in self.envs:  # (an env in a worker never raises on close)
            env.close()
        self.envs = []
