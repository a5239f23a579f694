"""The one rollout loop, collecting and evaluating: ``play_episodes`` plays one episode per env in lockstep, a generator
handing each batched policy call (finished envs masked) to its caller as an ``ActRequest``: a seed axis gathers them."""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Generator, Sequence

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


@dataclass
class ActRequest:
    """One step's policy call of a rollout; whoever answers it charges the time to ``timers["act"]``."""

    policy: AgentPolicy | RandomPolicy
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
            self._charge(t0)

    @property
    def by_agent(self) -> bool:  # not the initial pool's uniform draws: one a seed axis may gather
        return isinstance(self.policy, AgentPolicy)

    def submit(self) -> Callable[[], tuple[np.ndarray, object]]:
        """The step started (``AgentPolicy.submit``); the function returned waits for it. Both are acting time."""
        t0 = time.perf_counter()
        wait = self.policy.submit(self.obs, self.prev_action, self.prev_reward, self.state, self.active)
        self._charge(t0)

        def answer():
            t1 = time.perf_counter()
            try:
                return wait()
            finally:
                self._charge(t1)
        return answer

    def _charge(self, since: float) -> None:
        if self.timers is not None:
            self.timers["act"] += time.perf_counter() - since


class EnvsStepping:
    """Yielded while envs in worker processes step, so that the caller may work meanwhile (other seeds', updates)."""

    def __init__(self, envs: Sequence):
        self.envs = envs

    def answer(self) -> None:
        return None

    def submit(self) -> Callable[[], None]:  # nothing to start: the envs step in their workers
        return self.answer

    def ready(self) -> bool:  # whether resuming would not wait
        return all(env.step_ready() for env in self.envs if getattr(env, "runs_elsewhere", False))


class Work:
    """Drives a generator of work items: each item's ``answer()`` sent back in, or the exception it raises thrown in
    (a burst records how far it got). Suspended at ``item``; None once ended, with the return value in ``result``."""

    def __init__(self, gen: Generator):
        self.gen, self.item, self.result = gen, None, None
        self.send(lambda: None)  # started: up to its first item

    def send(self, answer: Callable[[], object]):
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
        def answer():
            raise e
        return self.send(answer)

    def run(self, until: Callable[[object], bool] | None = None):
        """Answer each item up to the first for which ``until(item)`` (left unanswered); that item, or None."""
        while self.item is not None and not (until is not None and until(self.item)):
            self.send(self.item.answer)
        return self.item


def answered(gen: Generator):
    work = Work(gen)
    work.run()
    return work.result


def play_episodes(envs: Sequence, policy: AgentPolicy | RandomPolicy, record: bool,
                  on_step: Callable[[int], None] | None = None, reset: Callable[[int], np.ndarray] | None = None,
                  timers: Counter | None = None) -> Generator[ActRequest | EnvsStepping, tuple | None, list[Episode]]:
    """One episode per env, each policy call yielded. ``record`` keeps the transitions; ``on_step(n)``: n env steps
    taken; ``reset(i)``: env i's first observation, called in order of i; ``timers["env"]``: seconds in the envs."""
    n = len(envs)
    elsewhere = any(getattr(env, "runs_elsewhere", False) for env in envs)
    clock = time.perf_counter
    t0 = clock()
    obs = np.stack([reset(i) if reset is not None else envs[i].reset()[0] for i in range(n)]).astype(np.float32)
    t_env = clock() - t0
    prev_action = np.zeros((n, envs[0].action_space.shape[0]), np.float32)
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
            if terminated or truncated:
                active[i] = False
        t_env += clock() - t1
        if on_step is not None:
            on_step(len(stepping))
    if timers is not None:
        timers["env"] += t_env
    cols = [[np.asarray(x, np.float32) for x in (zip(*tr) if tr else ((),) * 5)] for tr in trans]  # observs, ...
    return [Episode(*c, ret=float(r), length=int(k), success=bool(s)) for c, r, k, s in zip(cols, ret, length, success)]
