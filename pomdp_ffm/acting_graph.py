"""The acting step as the replay of a captured CUDA graph (``train.cuda_graph``, patches/015-cuda-graph-update.md),
on pomdp_ffm/cuda_graph.py's capture machinery."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np
import torch

from .agent import RecurrentAgent
from .cuda_graph import WARMUP_UPDATES, CudaGraphs, guarded_capture
from .seq_models import drop_caches


class _Carried:
    """The memory state of a batch of envs: eager tensors for its first steps, then its graph's static state."""

    key: tuple[int, bool] | None = None  # (batch size, deterministic) of its first step
    eager = None  # the state while steps run eagerly
    graphed = False  # its steps are replays of its key's graph, whose static state it holds


class _ActingGraph:
    """One captured acting step of n envs: its inputs are views of one device buffer filled from one pinned host
    buffer, its action comes back through another: two copies and one wait per step."""

    def __init__(self, runner: ActingRunner, key: tuple[int, bool], state):
        agent, (n, deterministic), self.acting_stream = runner.agent, key, runner.backend.acting_stream
        cuda, dims = agent.device.type == "cuda", (agent.obs_dim, agent.act_dim, 1)  # obs, previous action, reward
        self.host = torch.zeros(n * sum(dims), pin_memory=cuda)
        self.flat = torch.zeros(n * sum(dims), device=agent.device)
        self.host_in = [v.view(n, d).numpy() for v, d in zip(self.host.split([n * d for d in dims]), dims)]
        self.obs, self.prev_action, self.prev_reward = (
            v.view(1, n, d) for v, d in zip(self.flat.split([n * d for d in dims]), dims)
        )
        self.action_host = torch.zeros(n, agent.act_dim, pin_memory=cuda)
        self.done = torch.cuda.Event() if cuda else None
        self.in_flight = False
        self.memory = memory = agent.actor.encoder.memory  # what reads inside its states
        self.state = memory.clone_state(state)
        self.owner: _Carried | None = None  # the one episode whose memory state the static state is

        @torch.no_grad()
        def step():
            out, new_state = agent.actor(self.prev_action, self.prev_reward, self.obs, self.state)
            for old, new in zip(memory.state_tensors(self.state), memory.state_tensors(new_state)):
                old.copy_(new)
            return [{"action": agent.algo.act(out, deterministic).view(n, agent.act_dim)}]

        self.captured = runner.backend.capture(step)

    def submit(self, obs, prev_action, prev_reward) -> Callable[[], np.ndarray]:
        """The step queued on the acting stream (after the current one's work); the function returned waits for
        it and returns the action, so a seed axis can submit every seed's step before waiting for any."""
        if self.in_flight:
            raise RuntimeError("an acting step was submitted before the previous one of its graph was waited for")
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


class ActingRunner:
    """``agent.act`` as replays of one CUDA graph per (batch size, deterministic), which launch at once the dozen
    tiny kernels of an eager step. A key's first ``warmup`` steps run eagerly, the next is captured; a graph's
    memory state lives in its static tensors (``initial_state`` returns a handle to it)."""

    def __init__(self, agent: RecurrentAgent, *, warmup: int = WARMUP_UPDATES, backend=None):
        self.agent, self.warmup = agent, max(int(warmup), 1)
        self.backend = backend if backend is not None else CudaGraphs(agent.device)
        self._graphs, self._eager_steps, self._ptrs = {}, Counter(), None  # by key: graphs, eager steps run
        self.captures = self.replays = self.eager_steps = 0

    def initial_state(self, batch_size: int = 1) -> _Carried:
        return _Carried()  # its batch size is its first step's

    def act(self, obs, prev_action, prev_reward, state: _Carried, deterministic: bool):
        return self.submit(obs, prev_action, prev_reward, state, deterministic)()

    def submit(self, obs, prev_action, prev_reward, state: _Carried, deterministic: bool):
        """``act`` in two halves: the step queued, and a function that waits for it and returns (action, state)."""
        self._check_params()
        o = np.asarray(obs, np.float32)
        single = o.ndim == 1
        key = (1 if single else o.shape[0], bool(deterministic))
        if state.key is None:
            state.key, state.eager = key, self.agent.initial_state(key[0])
        elif state.key != key:
            raise ValueError(
                f"a memory state started as (batch size, deterministic)={state.key} is now used as "
                f"{key}: start a new one with initial_state()"
            )
        graph = self._graphs.get(key)
        if graph is None and not state.graphed and self._eager_steps[key] >= self.warmup:
            graph = self._capture(key, state.eager)
        if graph is None:
            with self.backend.side_stream():  # as the update runner warms up: on the capture's stream
                action, state.eager = self.agent.act(obs, prev_action, prev_reward, state.eager, deterministic)
            self._eager_steps[key] += 1
            self.eager_steps += 1
            return lambda: (action, state)
        if not state.graphed:  # the episode goes on in the graph, from its state
            for dst, src in zip(graph.memory.state_tensors(graph.state), graph.memory.state_tensors(state.eager)):
                dst.copy_(src)
            graph.owner, state.graphed, state.eager = state, True, None
        elif graph.owner is not state:
            raise ValueError(
                f"this memory state's graph {key} has been taken by a newer episode: one episode at a "
                "time per (batch size, deterministic)"
            )
        wait = graph.submit(o, prev_action, prev_reward)
        self.replays += 1
        return lambda: (wait()[0] if single else wait(), state)

    def _capture(self, key: tuple[int, bool], state) -> _ActingGraph:
        graph = self._graphs[key] = guarded_capture(
            f"the acting step {key}", "act eagerly", [self.agent.actor], lambda: _ActingGraph(self, key, state)
        )
        drop_caches(self.agent.actor)  # it holds the graph's gamma now: an eager call computes its own
        self.captures += 1
        return graph

    def _check_params(self) -> None:
        """A re-allocated parameter is not where the graphs read: drop them; their episodes go on eagerly."""
        ptrs = tuple(p.data_ptr() for p in self.agent.actor.parameters())
        if ptrs != self._ptrs:
            for graph in self._graphs.values():
                if graph.owner is not None:
                    graph.owner.eager, graph.owner.graphed = graph.state, False
            self._graphs, self._eager_steps, self._ptrs = {}, Counter(), ptrs


def make_actor(agent: RecurrentAgent, cuda_graph: bool):
    return ActingRunner(agent) if cuda_graph and agent.device.type == "cuda" else agent


def gathers(actings: list) -> bool:
    """Whether several seeds' acting steps are gathered (rollout.play_together): each one's submitted, from its own
    torch generators, before any is waited for, so that on CUDA with graphs the host launches one seed's step or steps
    its env while the GPU runs another's (on a CPU a submit computes it)."""
    return len(actings) >= 2 and all(isinstance(a, ActingRunner) for a in actings)
