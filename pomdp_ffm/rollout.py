"""The one rollout loop, collecting and evaluating. A ``Rollout`` plays one episode on each of its envs in lockstep:
each step one batched policy call (finished envs masked), then one step of every env still running. ``play`` steps
it to its end, and ``play_all`` plays a unit's or an evaluation's rollouts one after another; a caller with other
work steps a rollout a phase at a time (``submit``/``send``/``receive``): ``play_together`` gathers several seeds'
acting steps, a deferred evaluation plays between two updates."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

import numpy as np


class TrainingDiverged(FloatingPointError):
    """The run diverged (exits.EXIT_DIVERGED): a non-finite loss (``Trainer.diverged``), or a non-finite action,
    which the rollout finds (hence here, below the trainer)."""


class NonFiniteAction(TrainingDiverged):
    """The policy gave a non-finite action, found before any env takes it (PyBullet's would fail a bare assert, where
    Pendulum's and MuJoCo's step on into non-finite observations). Its trainer saves the diverged checkpoint
    (``Trainer.diverged``)."""


@dataclass
class Episode:
    observs: np.ndarray  # [L, O]  o_t
    actions: np.ndarray  # [L, A]  a_t as sent to the env (random ones in the native range)
    rewards: np.ndarray  # [L]     r_t
    terminals: np.ndarray  # [L]     1 where the env ended the episode itself (a time-out bootstraps)
    next_observs: np.ndarray  # [L, O]  o_{t+1}
    ret: float
    length: int
    success: bool


class AgentPolicy:
    """The agent's actor with its memory state carried across steps."""

    def __init__(self, agent, deterministic: bool):
        self.agent, self.deterministic = agent, deterministic

    def initial_state(self, batch_size: int):
        return self.agent.initial_state(batch_size)

    def __call__(self, obs, prev_action, prev_reward, state, active):
        return self.agent.act(obs, prev_action, prev_reward, state, self.deterministic)

    def submit(self, obs, prev_action, prev_reward, state, active) -> Callable[[], tuple[np.ndarray, object]]:
        """The step started; the function returned waits for it. CUDA graph replays queue it, so that several actors'
        steps run at once; any other actor computes it now."""
        if hasattr(self.agent, "submit"):
            return self.agent.submit(obs, prev_action, prev_reward, state, self.deterministic)
        out = self(obs, prev_action, prev_reward, state, active)
        return lambda: out


class RandomPolicy:
    """Uniform actions from each env's native action space (the reference's initial pool)."""

    def __init__(self, envs: Sequence):
        self.envs = envs

    def initial_state(self, batch_size: int):
        return None

    def __call__(self, obs, prev_action, prev_reward, state, active):
        actions = np.zeros(prev_action.shape, np.float32)
        for i in np.flatnonzero(active):  # finished envs draw nothing: their samplers' streams stay put
            actions[i] = self.envs[i].action_space.sample()
        return actions, None


class Rollout:
    """One episode on each env, in lockstep. Its envs are reset on construction (``reset(i)``: env i's first
    observation, called in order of i). ``record`` keeps the transitions; ``on_step(n)``: n env steps taken;
    ``timers``: seconds acting (``act``) and in the envs (``env``)."""

    def __init__(
        self,
        envs: Sequence,
        policy: AgentPolicy | RandomPolicy,
        record: bool,
        on_step: Callable[[int], None] | None = None,
        reset: Callable[[int], np.ndarray] | None = None,
        timers: Counter | None = None,
    ):
        self.envs, self.policy, self.record, self.on_step = envs, policy, record, on_step
        self.timers = timers if timers is not None else Counter()
        n = len(envs)
        t0 = time.perf_counter()
        first = [reset(i) if reset is not None else envs[i].reset()[0] for i in range(n)]
        self.obs = np.stack(first).astype(np.float32)
        self.timers["env"] += time.perf_counter() - t0
        self.prev_action = np.zeros((n, envs[0].action_space.shape[0]), np.float32)
        self.prev_reward = np.zeros(n, np.float32)
        self.state = policy.initial_state(n)
        self.active = np.ones(n, bool)
        self.transitions: list[list[tuple]] = [[] for _ in range(n)]
        self.ret, self.length, self.success = np.zeros(n), np.zeros(n, int), np.zeros(n, bool)
        self.sent: np.ndarray | None = None  # the actions the envs are stepping with, until received

    @property
    def done(self) -> bool:
        return not self.active.any()

    def act(self) -> tuple[np.ndarray, object]:
        """This step's policy call, computed now: (actions, the policy's next state)."""
        t0 = time.perf_counter()
        try:
            return self.policy(self.obs, self.prev_action, self.prev_reward, self.state, self.active)
        finally:
            self.timers["act"] += time.perf_counter() - t0

    def submit(self) -> Callable[[], tuple[np.ndarray, object]]:
        """This step's policy call started (``AgentPolicy.submit``); the function returned waits for it."""
        t0 = time.perf_counter()
        wait = self.policy.submit(self.obs, self.prev_action, self.prev_reward, self.state, self.active)
        self.timers["act"] += time.perf_counter() - t0

        def answer():
            t1 = time.perf_counter()
            try:
                return wait()
            finally:
                self.timers["act"] += time.perf_counter() - t1

        return answer

    def send(self, acted: tuple[np.ndarray, object]) -> None:
        """The actions sent: envs in worker processes step from here, the others in ``receive``."""
        actions = acted[0]
        # On the host already (the envs step from it): the check costs no device read. Finished envs' rows are
        # never sent.
        if not np.isfinite(actions).all():
            bad = [i for i in np.flatnonzero(self.active) if not np.isfinite(actions[i]).all()]
            if bad:
                kind = "a training" if self.record else "an evaluation"
                raise NonFiniteAction(
                    f"non-finite action {actions[bad[0]].tolist()} from the policy at step {self.length[bad[0]] + 1} "
                    f"of {kind} episode, before the env took it"
                )
        t0 = time.perf_counter()
        self.sent, self.state = acted
        for i in np.flatnonzero(self.active):
            self.envs[i].step_async(self.sent[i])
        self.timers["env"] += time.perf_counter() - t0

    def ready(self) -> bool:
        """Whether ``receive`` would not wait on a worker."""
        return all(
            self.envs[i].step_ready()
            for i in np.flatnonzero(self.active)
            if getattr(self.envs[i], "runs_elsewhere", False)
        )

    def receive(self) -> None:
        """The envs' steps taken in."""
        t0 = time.perf_counter()
        actions, self.sent, stepping = self.sent, None, np.flatnonzero(self.active)
        for i in stepping:
            next_obs, reward, terminated, truncated, info = self.envs[i].step_wait()
            if self.record:
                # A time-out bootstraps, a fall does not (the reference's terminal flag for pomdp tasks).
                self.transitions[i].append(
                    (self.obs[i].copy(), actions[i].copy(), float(reward), terminated and not truncated, next_obs)
                )
            self.ret[i] += float(reward)
            self.length[i] += 1
            self.success[i] |= bool(info.get("success", False))
            self.obs[i], self.prev_action[i], self.prev_reward[i] = next_obs, actions[i], reward
            if terminated or truncated:
                self.active[i] = False
        self.timers["env"] += time.perf_counter() - t0
        if self.on_step is not None:
            self.on_step(len(stepping))

    def step(self) -> None:
        """One step to its end, or the rest of the one sent."""
        if self.sent is None:
            self.send(self.act())
        self.receive()

    def episodes(self) -> list[Episode]:
        """One per env (the transitions empty where not recorded)."""
        cols = [[np.asarray(x, np.float32) for x in (zip(*tr) if tr else ((),) * 5)] for tr in self.transitions]
        return [
            Episode(*c, ret=float(r), length=int(k), success=bool(s))
            for c, r, k, s in zip(cols, self.ret, self.length, self.success)
        ]

    def play(self) -> list[Episode]:
        while not self.done:
            self.step()
        return self.episodes()


def play_all(next_rollout: Callable[[], Rollout | None], ended: Callable[[Rollout], None]) -> None:
    """Rollouts played to their ends one after another: ``next_rollout()`` makes each (its envs reset) once the one
    before has ended, None when there are no more; ``ended`` takes each."""
    while (rollout := next_rollout()) is not None:
        rollout.play()
        ended(rollout)


def play_together(
    plays: list[tuple[Callable[[], Rollout | None], Callable[[Rollout], None]]],
    turns: list[Callable[[], AbstractContextManager]],
    playing: Callable[[int], bool],
) -> None:
    """Several players' rollouts (each ``next`` and ``ended``, as ``play_all`` takes them) in lockstep, each player's
    next acting step submitted before any is waited for: with acting on a GPU the host steps one player's envs while
    the device computes another's action. Each player's calls in its turn (``turns[i]()``), where an error takes it
    out of play (``playing(i)`` false from then)."""
    rollouts: list[Rollout | None] = [None] * len(plays)
    waits: list[Callable | None] = [None] * len(plays)

    def start_next(i: int) -> None:
        rollouts[i] = None
        if (rollout := plays[i][0]()) is not None:
            rollouts[i], waits[i] = rollout, rollout.submit()

    for i in range(len(plays)):
        with turns[i]():
            start_next(i)
    while live := [i for i in range(len(plays)) if playing(i) and rollouts[i] is not None]:
        for i in live:  # the acting steps in; envs in worker processes step from here
            with turns[i]():
                wait, waits[i] = waits[i], None
                rollouts[i].send(wait())
        for i in live:
            if playing(i):
                with turns[i]():
                    rollout = rollouts[i]
                    rollout.receive()
                    if not rollout.done:
                        waits[i] = rollout.submit()
                    else:
                        plays[i][1](rollout)
                        start_next(i)
