"""The one rollout loop, for collecting and for evaluating.

``play_episodes`` plays one episode in each of the given envs, in lockstep: one batched policy call per step,
finished episodes masked (their envs are no longer stepped and their actions are ignored). Collection and the
reference's evaluation use one env (the reference evaluates its episodes one after another on the training
env); several envs step their episodes together.

It is a generator that hands each step's policy call to its caller as an ``ActRequest``: ``answered`` answers
them at once, with the policy; a seed axis (pomdp_ffm/seeds.py) gathers the requests of several seeds'
rollouts and submits them together.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Generator, Protocol, Sequence

import numpy as np


@dataclass
class Episode:
    observs: np.ndarray       # [L, O]  o_t
    actions: np.ndarray       # [L, A]  a_t as sent to the env (random ones in the native range)
    rewards: np.ndarray       # [L]     r_t
    terminals: np.ndarray     # [L]     1 where the env ended the episode itself (a time-out bootstraps)
    next_observs: np.ndarray  # [L, O]  o_{t+1}
    ret: float
    length: int
    success: bool


class Policy(Protocol):
    def initial_state(self, batch_size: int): ...

    def __call__(self, obs: np.ndarray, prev_action: np.ndarray, prev_reward: np.ndarray, state,
                 active: np.ndarray) -> tuple[np.ndarray, object]: ...


class AgentPolicy:
    """The agent's actor with its memory state carried across steps."""

    def __init__(self, agent, deterministic: bool):
        self.agent, self.deterministic = agent, deterministic

    def initial_state(self, batch_size: int):
        return self.agent.initial_state(batch_size)

    def __call__(self, obs, prev_action, prev_reward, state, active):
        return self.agent.act(obs, prev_action, prev_reward, state, self.deterministic)

    def submit(self, obs, prev_action, prev_reward, state, active) -> Callable[[], tuple[np.ndarray, object]]:
        """The step started; the function returned waits for it and returns (actions, state). An actor of CUDA
        graph replays queues the step, so that several actors' steps run at once; any other computes it now."""
        submit = getattr(self.agent, "submit", None)
        if submit is None:
            out = self(obs, prev_action, prev_reward, state, active)
            return lambda: out
        return submit(obs, prev_action, prev_reward, state, self.deterministic)


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


@dataclass
class ActRequest:
    """One step's policy call of a rollout: the actions (and the next memory state) for its envs. Whoever
    answers it charges the time to ``timers["act"]``."""

    policy: Policy
    obs: np.ndarray
    prev_action: np.ndarray
    prev_reward: np.ndarray
    state: object
    active: np.ndarray
    timers: Counter | None

    def answer(self) -> tuple[np.ndarray, object]:
        t0 = time.perf_counter()
        try:
            return self.policy(self.obs, self.prev_action, self.prev_reward, self.state, self.active)
        finally:
            self.charge(time.perf_counter() - t0)

    @property
    def by_agent(self) -> bool:
        """An acting step of the agent (not the initial pool's uniform draws): one a seed axis may gather."""
        return isinstance(self.policy, AgentPolicy)

    def submit(self) -> Callable[[], tuple[np.ndarray, object]]:
        return self.policy.submit(self.obs, self.prev_action, self.prev_reward, self.state, self.active)

    def charge(self, seconds: float) -> None:
        if self.timers is not None:
            self.timers["act"] += seconds


class EnvsStepping:
    """Yielded by a rollout whose envs step in worker processes (``envs.EnvInWorker``), between sending the
    actions and reading the results: its caller may do other work meanwhile (a seed axis: the other seeds'; a
    burst of updates: its next updates), then resumes it with None."""

    def __init__(self, envs: Sequence):
        self.envs = envs

    def answer(self) -> None:
        return None

    def ready(self) -> bool:
        """Whether every env has its step's result in, so that resuming would not wait."""
        return all(env.step_ready() for env in self.envs if getattr(env, "runs_elsewhere", False))


Rollout = Generator["ActRequest | EnvsStepping", "tuple | None", list[Episode]]


class Work:
    """The one driver of the generators that hand their work to their caller (a rollout, an evaluation, a trainer's
    unit of work): each item they yield has an ``answer()`` (an ``ActRequest``, an ``EnvsStepping``, a burst of
    updates) whose value is sent back in. Suspended at ``item`` between two answers; None once the generator has
    ended, with its return value in ``result``. An exception raised answering is thrown into the generator, so that
    it records how far it got (a burst of updates, its partial sums)."""

    def __init__(self, gen: Generator):
        self.gen, self.item, self.result = gen, None, None
        self.send(lambda: None)  # started: up to its first item

    def send(self, answer: Callable[[], object]):
        """Resume with ``answer()`` (or the exception it raises); the next item."""
        try:
            try:
                value = answer()
            except BaseException as e:
                self.item = self.gen.throw(e)
            else:
                self.item = self.gen.send(value)
        except StopIteration as end:
            self.item, self.result = None, end.value
        return self.item

    def throw(self, e: BaseException):
        return self.send(lambda: _raise(e))

    def run(self, until: Callable[[object], bool] | None = None):
        """Answer each item at once, up to the first for which ``until(item)`` (left unanswered); that item, or None
        once the generator has ended."""
        while self.item is not None and not (until is not None and until(self.item)):
            self.send(self.item.answer)
        return self.item


def _raise(e: BaseException):
    raise e


def answered(gen: Generator):
    """Run a generator of requests to its end, answering each at once; its return value."""
    work = Work(gen)
    work.run()
    return work.result


def play_episodes(envs: Sequence, policy: Policy, record: bool,
                  on_step: Callable[[int], None] | None = None,
                  reset: Callable[[int], np.ndarray] | None = None,
                  timers: Counter | None = None) -> Rollout:
    """One episode per env, each step's policy call yielded as an ActRequest and answered with (actions,
    state); returns the episodes. ``record`` keeps the transitions; ``on_step(n)`` is told of n env steps taken;
    ``reset(i)`` resets env i and returns its first observation (default: ``envs[i].reset()``), called for
    i = 0, 1, ... in order; ``timers`` accumulates the seconds spent in the envs ("env"; the answerer adds
    "act")."""
    n = len(envs)
    elsewhere = any(getattr(env, "runs_elsewhere", False) for env in envs)
    clock = time.perf_counter
    t0 = clock()
    obs = np.stack([reset(i) if reset is not None else envs[i].reset()[0] for i in range(n)]).astype(np.float32)
    t_env = clock() - t0
    act_dim = envs[0].action_space.shape[0]
    prev_action = np.zeros((n, act_dim), np.float32)
    prev_reward = np.zeros(n, np.float32)
    state = policy.initial_state(n)
    active = np.ones(n, bool)
    trans = [[] for _ in range(n)]
    ret, length, success = np.zeros(n), np.zeros(n, int), np.zeros(n, bool)
    while active.any():
        actions, state = yield ActRequest(policy, obs, prev_action, prev_reward, state, active, timers)
        t1 = clock()
        stepping = np.flatnonzero(active)
        for i in stepping:  # envs in workers step at once from here; the others in step_wait
            envs[i].step_async(actions[i])
        if elsewhere:
            t_env += clock() - t1
            yield EnvsStepping([envs[i] for i in stepping])
            t1 = clock()
        stepped = 0
        for i in stepping:
            next_obs, reward, terminated, truncated, info = envs[i].step_wait()
            if record:
                # A time-out bootstraps, a fall does not (the reference's terminal flag for pomdp tasks).
                trans[i].append((obs[i].copy(), actions[i].copy(), float(reward), terminated and not truncated,
                                 next_obs))
            ret[i] += float(reward)
            length[i] += 1
            success[i] |= bool(info.get("success", False))
            obs[i], prev_action[i], prev_reward[i] = next_obs, actions[i], reward
            stepped += 1
            if terminated or truncated:
                active[i] = False
        t_env += clock() - t1
        if on_step is not None:
            on_step(stepped)
    if timers is not None:
        timers["env"] += t_env
    episodes = []
    for i in range(n):
        o, a, r, d, o2 = zip(*trans[i]) if trans[i] else ((),) * 5
        episodes.append(Episode(
            observs=np.asarray(o, np.float32), actions=np.asarray(a, np.float32),
            rewards=np.asarray(r, np.float32), terminals=np.asarray(d, np.float32),
            next_observs=np.asarray(o2, np.float32), ret=float(ret[i]), length=int(length[i]),
            success=bool(success[i])))
    return episodes
