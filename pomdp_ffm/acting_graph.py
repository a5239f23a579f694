"""The acting step as the replay of a captured CUDA graph (``train.cuda_graph``, patches/015-cuda-graph-update.md):
``ActingRunner(agent)`` is called as the agent is (``initial_state``, ``act``) and computes what it computes. The
capture machinery (``CudaGraphs``, the warm-up count, ``CaptureError``) is pomdp_ffm/graph.py's.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable

import numpy as np
import torch

from .agent import RecurrentAgent
from .graph import WARMUP_UPDATES, CaptureError, CudaGraphs
from .seq_models.ffm import FFM


def _state_tensors(state) -> list[torch.Tensor]:
    """The tensors of a memory state (FFM, GRU: a tensor; LSTM: a pair; MLP: None), in a fixed order."""
    if state is None:
        return []
    if torch.is_tensor(state):
        return [state]
    return [t for s in state for t in _state_tensors(s)]


class _Carried:
    """The memory state of a batch of envs acted for by an ActingRunner: eager tensors for its first steps, then
    the static state of the graph that replays its steps."""

    def __init__(self, batch_size: int):
        self.batch_size = batch_size
        self.key: tuple[int, bool] | None = None  # (batch size, deterministic) of its first step
        self.eager = None  # the state while steps run eagerly
        self.graphed = False  # its steps are replays of the graph of its key, whose static state it holds


class _ActingGraph:
    """One captured acting step of n envs. Its inputs (observations, previous actions and rewards) are views of
    one device buffer, filled from one pinned host buffer by one copy; its action comes back through a pinned
    host buffer: two copies and one wait per step."""

    def __init__(self, runner: "ActingRunner", key: tuple[int, bool], state):
        agent, (n, deterministic) = runner.agent, key
        dev = agent.device
        self.acting_stream = runner.backend.acting_stream
        self.cuda = dev.type == "cuda"
        sizes = [n * agent.obs_dim, n * agent.act_dim, n]
        self.host = torch.zeros(sum(sizes), pin_memory=self.cuda)
        self.flat = torch.zeros(sum(sizes), device=dev)
        host_views, dev_views = self.host.numpy(), []
        self.host_in, at = [], 0
        for size, last in zip(sizes, (agent.obs_dim, agent.act_dim, 1)):
            self.host_in.append(host_views[at:at + size].reshape(n, last))
            dev_views.append(self.flat[at:at + size].view(1, n, last))
            at += size
        self.obs, self.prev_action, self.prev_reward = dev_views
        self.action_host = torch.zeros(n, agent.act_dim, pin_memory=self.cuda)
        self.done = torch.cuda.Event() if self.cuda else None
        self.in_flight = False
        self.state = None if state is None else _clone_state(state)
        self.owner: _Carried | None = None  # the one memory state the static state is (one episode at a time)

        @torch.no_grad()
        def step():
            out, new_state = agent.actor(self.prev_action, self.prev_reward, self.obs, self.state)
            for old, new in zip(_state_tensors(self.state), _state_tensors(new_state)):
                old.copy_(new)
            return [{"action": agent.algo.act(out, deterministic).view(n, agent.act_dim)}]

        self.captured = runner.backend.capture(step)

    def set_state(self, state) -> None:
        for dst, src in zip(_state_tensors(self.state), _state_tensors(state)):
            dst.copy_(src)

    def submit(self, obs, prev_action, prev_reward) -> Callable[[], np.ndarray]:
        """The step queued on the acting stream (after the work queued so far on the current one, e.g. the
        updates); the function returned waits for it and returns the action. A seed axis submits every seed's
        step before waiting for any: one wait for the GPU per seed, the host's launches overlapping the GPU."""
        if self.in_flight:
            raise RuntimeError("an acting step was submitted before the previous one of its graph was waited for")
        # The previous step's copies are done (its wait): the host buffers are free to rewrite.
        for dst, src in zip(self.host_in, (obs, prev_action, prev_reward)):
            dst[...] = np.asarray(src, np.float32).reshape(dst.shape)
        with self.acting_stream():
            self.flat.copy_(self.host, non_blocking=True)
            self.captured.replay()
            self.action_host.copy_(self.captured.outputs[0]["action"], non_blocking=True)
            if self.done is not None:
                self.done.record()
        self.in_flight = True

        def wait() -> np.ndarray:
            if self.done is not None:
                self.done.synchronize()  # acting needs the action on the host
            self.in_flight = False
            return self.action_host.numpy().copy()
        return wait


def _clone_state(state):
    if torch.is_tensor(state):
        return state.clone()
    return type(state)(_clone_state(s) for s in state)


class ActingRunner:
    """``agent.act`` as replays of captured CUDA graphs (``train.cuda_graph``): one graph per (batch size,
    deterministic), i.e. one for collection and one for the evaluation's episodes played together. On a GPU a
    batch-1 acting step eagerly is a dozen tiny kernels, each launched from Python; a replay launches them at
    once.

    Called as the agent is (``initial_state(n)``, ``act(obs, prev_action, prev_reward, state, deterministic)``)
    and computing what it computes, with the same random draws: the first ``warmup`` steps of a key run eagerly
    (real steps, as in the update runner), its next step is captured and replayed at once. The memory state of a
    graph's envs lives in the graph's static tensors, which a replay updates in place; ``initial_state`` returns
    a handle to it. The actor's parameters are read where they are, so updates (eager or replayed) and loads are
    seen by the next step; FFM's acting cache of gamma is dropped around a capture so that the graph computes
    gamma from the parameters at each step."""

    def __init__(self, agent: RecurrentAgent, *, warmup: int = WARMUP_UPDATES, backend=None):
        self.agent, self.warmup = agent, max(int(warmup), 1)
        self.backend = backend if backend is not None else CudaGraphs(agent.device)
        self._graphs: dict[tuple[int, bool], _ActingGraph] = {}
        self._eager_steps: Counter = Counter()
        self._ptrs: tuple | None = None
        self.captures = self.replays = self.eager_steps = 0

    def initial_state(self, batch_size: int = 1) -> _Carried:
        return _Carried(batch_size)

    def act(self, obs, prev_action, prev_reward, state: _Carried, deterministic: bool):
        return self.submit(obs, prev_action, prev_reward, state, deterministic)()

    def submit(self, obs, prev_action, prev_reward, state: _Carried, deterministic: bool):
        """``act`` in two halves: the step started (a replay queued on the GPU), and the function returned,
        which waits for it and returns (action, state). A seed axis submits its seeds' steps, then waits."""
        self._check_params()
        o = np.asarray(obs, np.float32)
        single = o.ndim == 1
        n = 1 if single else o.shape[0]
        key = (n, bool(deterministic))
        if state.key is None:
            state.key = key
            state.eager = self.agent.initial_state(n)
        elif state.key != key:
            raise ValueError(f"a memory state started as (batch size, deterministic)={state.key} is now used as "
                             f"{key}: start a new one with initial_state()")
        graph = self._graphs.get(key)
        if graph is None and not state.graphed and self._eager_steps[key] >= self.warmup:
            graph = self._capture(key, state)
        if graph is None or not state.graphed:
            if graph is not None:  # a new episode of a captured key: its state goes into the graph's
                graph.set_state(state.eager)
                graph.owner, state.graphed, state.eager = state, True, None
            else:
                with self.backend.side_stream():  # as the update runner warms up: on the capture's stream
                    action, state.eager = self.agent.act(obs, prev_action, prev_reward, state.eager, deterministic)
                self._eager_steps[key] += 1
                self.eager_steps += 1
                return lambda: (action, state)
        elif graph.owner is not state:
            raise ValueError(f"this memory state's graph {key} has been taken by a newer episode: one episode at a "
                             "time per (batch size, deterministic)")
        wait = graph.submit(o, prev_action, prev_reward)
        self.replays += 1

        def result():
            action = wait()
            return (action[0] if single else action), state
        return result

    def _capture(self, key: tuple[int, bool], state: _Carried) -> _ActingGraph:
        ffms = [m for m in self.agent.actor.modules() if isinstance(m, FFM)]
        for m in ffms:
            m.drop_gamma_cache()
        try:
            graph = _ActingGraph(self, key, state.eager)
        except Exception as e:
            detail = (str(e).strip().splitlines() or [""])[0]
            raise CaptureError(f"capturing the acting step {key} in a CUDA graph failed: {type(e).__name__}: "
                               f"{detail}; set train.cuda_graph=false to act eagerly") from e
        for m in ffms:
            m.drop_gamma_cache()  # it holds the graph's gamma now: an eager call computes its own
        self._graphs[key] = graph
        self.captures += 1
        # The state a graph was captured with is its static state: the episode goes on in the graph.
        graph.owner, state.graphed, state.eager = state, True, None
        return graph

    def _check_params(self) -> None:
        """A parameter re-allocated (moved, or loaded by assignment) is not where the graphs read: drop them; an
        episode on a graph goes on eagerly from the graph's memory state, and is captured again later."""
        ptrs = tuple(p.data_ptr() for p in self.agent.actor.parameters())
        if ptrs != self._ptrs:
            for graph in self._graphs.values():
                if graph.owner is not None:
                    graph.owner.eager, graph.owner.graphed = graph.state, False
                    graph.owner = None
            self._graphs.clear()
            self._eager_steps.clear()
            self._ptrs = ptrs


def make_actor(agent: RecurrentAgent, cuda_graph: bool):
    """What acts (collection, evaluation): graph replays on CUDA with ``train.cuda_graph``, else the agent."""
    return ActingRunner(agent) if cuda_graph and agent.device.type == "cuda" else agent
