"""The update as the replay of a captured CUDA graph (``train.cuda_graph``, patches/015-cuda-graph-update.md).

``UpdateRunner(agent, cuda_graph)`` is called as ``agent.update(batch, grad_norms=...)`` is, and returns what it
returns: the statistics as detached 0-d tensors on the agent's device. On a CPU, or with ``cuda_graph=False``,
it *is* ``agent.update`` (looked up at each call). On CUDA with the switch on:

* Inputs. The runner owns static device tensors for the batch's arrays at their fixed shapes (one flat device
  buffer), filled from a ring of pinned host buffers by one non-blocking copy per update on the current stream.
  A host buffer is written again only once the event recorded after its copy has completed (a wait for the GPU
  there, when the host runs a whole ring ahead, is a throttle, not a synchronisation of the stream).
* Graphs. One graph per path the host's control flow can take: gradient-norm diagnostics on or off, and, with a
  TD3 policy delay d > 1, the updates that move the actor and targets and those that do not, chosen by
  ``agent.actor_step_due()`` (the host counter ``agent.num_updates``) exactly as the eager update chooses. Each
  graph captures ``update.update`` on the static inputs (PyTorch's whole-network recipe: capture on a side
  stream, replay on the current one); its statistics are static outputs, cloned after each replay.
* Warm-up. The first ``warmup`` updates (and the first one of each path) run eagerly on the capture's side
  stream: real updates, counted like any other, which also create the optimisers' state before any capture.
  A path is captured at its next update after that, then replayed at once: capturing runs nothing on the GPU,
  so no update is added, repeated or lost, and the RNG stream is the eager one (graph-safe Philox offsets).
* Optimisers. Adam(capturable=True) for the actor, the critic and SAC's temperature: step counters on the
  device, bias corrections computed there (patches/015 records the arithmetic). What
  ``agent.training_state()`` holds is unchanged: a state-dict hook gives the eager form (capturable=False, step
  counters on the CPU), so a checkpoint resumes with the graph off, or on a CPU.
* Loads. ``load_training_state`` (a resume) replaces the optimisers' state: the runner notices (the state objects,
  the parameters' storage), drops its graphs, makes the optimisers capturable again and warms up and captures
  anew. Module weights are loaded in place, into the tensors the graphs read.
* Host state. After a replay the parameters' version counters are moved, as the eager in-place updates move
  them, so that FFM's acting cache of gamma (keyed on them) is recomputed; before a capture those caches are
  dropped, so that no graph reads a gamma computed outside it.
* A capture that raises stops the run with one line naming ``train.cuda_graph=false`` (``CaptureError``).

``backend`` is what captures and replays: ``CudaGraphs`` on CUDA; tests pass a Python double on a CPU to run the
runner's own logic (staging, paths, warm-up, counting, loads) without a GPU.
"""
from __future__ import annotations

import contextlib
from collections import Counter
from typing import Callable, Sequence

import numpy as np
import torch

from .agent import RecurrentAgent
from .buffer import Batch
from .seq_models.ffm import FFM
from .update import Aligned, update

WARMUP_UPDATES = 3  # eager updates on the side stream before the first capture (PyTorch's recipe uses 3)
HOST_RING = 3  # pinned host buffers the batches rotate through
_ALIGN = 64  # bytes: every array of the flat buffers starts on this boundary


class CaptureError(RuntimeError):
    """Capturing the update in a CUDA graph failed; the message is one line naming the switch."""


def bump_versions(tensors: list[torch.Tensor]) -> None:
    """Move version counters as an in-place write through these tensors would: a graph replay writes without
    Python seeing it, and FFM's acting cache of gamma is keyed on them."""
    try:
        torch.autograd.graph.increment_version(tensors)
    except TypeError:  # an older torch takes one tensor at a time
        for t in tensors:
            torch.autograd.graph.increment_version(t)


# --- optimisers ---------------------------------------------------------------------------------------------
def make_capturable_(optimizer: torch.optim.Optimizer) -> None:
    """Adam(capturable=True) in place: every group capturable, step counters moved to their parameter's device
    (same dtype). Its state_dict() keeps the eager form (see _eager_state_dict)."""
    for group in optimizer.param_groups:
        group["capturable"] = True
    for p, st in optimizer.state.items():
        step = st.get("step")
        if torch.is_tensor(step) and step.device != p.device:
            st["step"] = step.to(p.device)
    # The warm-up updates run the capturable step eagerly on purpose: no warning about it.
    optimizer._warned_capturable_if_run_uncaptured = True
    if not getattr(optimizer, "_eager_state_dict_hook", False):
        optimizer.register_state_dict_post_hook(_eager_state_dict)
        optimizer._eager_state_dict_hook = True


def _eager_state_dict(optimizer: torch.optim.Optimizer, state_dict: dict) -> dict:
    """state_dict post-hook: what the eager optimiser's state_dict holds (capturable=False, step counters on the
    CPU), so that checkpoints do not depend on the switch or the device. (Module-level, not a bound method: a
    deep copy of the agent copies its optimisers' hooks.)"""
    for group in state_dict["param_groups"]:
        group["capturable"] = False
    # state_dict()["state"] holds the live per-parameter dicts: replace them, never write into them.
    state_dict["state"] = {
        k: {**st, "step": st["step"].cpu()} if torch.is_tensor(st.get("step")) and st["step"].device.type != "cpu"
        else st
        for k, st in state_dict["state"].items()}
    return state_dict


# --- inputs -------------------------------------------------------------------------------------------------
class Staging:
    """Static device tensors for a batch of fixed shapes (a ``Batch`` of views into one flat device buffer),
    filled from a ring of host buffers (pinned on CUDA) with one non-blocking copy. On CUDA an event recorded
    after each copy guards its host buffer; on a CPU the copy is synchronous and the ring is only exercised."""

    def __init__(self, batch: Batch, device: torch.device, ring: int = HOST_RING):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        specs, offset = [], 0
        for x in batch:
            t = x if torch.is_tensor(x) else torch.as_tensor(np.asarray(x))
            specs.append((tuple(t.shape), t.dtype, offset, t.numel() * t.element_size()))
            offset += -(-specs[-1][3] // _ALIGN) * _ALIGN
        self.specs, self.nbytes = specs, max(offset, _ALIGN)
        self.flat = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
        self.static = self._views(self.flat)
        self.host = [torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=self.cuda) for _ in range(ring)]
        self.host_views = [self._views(h) for h in self.host]
        self.events = [torch.cuda.Event() if self.cuda else None for _ in range(ring)]
        self._recorded = [False] * ring
        self.next = 0

    def _views(self, flat: torch.Tensor) -> Batch:
        return Batch(*(flat[o:o + n].view(dtype).view(shape) for shape, dtype, o, n in self.specs))

    def check(self, batch: Batch) -> list[torch.Tensor]:
        """The batch's arrays as tensors, checked against the layout."""
        arrays = [x if torch.is_tensor(x) else torch.as_tensor(np.asarray(x)) for x in batch]
        got = [(tuple(t.shape), t.dtype) for t in arrays]
        want = [(shape, dtype) for shape, dtype, _, _ in self.specs]
        if got != want:
            raise ValueError(f"a CUDA-graph update needs batches of one fixed layout: got {got}, the graph's inputs "
                             f"are {want} (train.cuda_graph=false runs the update eagerly)")
        return arrays

    def fill(self, batch: Batch) -> None:
        """Copy in a batch."""
        # (array j, tensor, on the device already)
        items = [(j, t, torch.is_tensor(x) and x.device == self.device)
                 for j, (x, t) in enumerate(zip(batch, self.check(batch)))]
        # numpy arrays (the buffer's batches) go through the host ring; tensors already on the device are copied
        if not all(dev for *_, dev in items):
            i = self.next
            self.next = (i + 1) % len(self.host)
            if self._recorded[i] and not self.events[i].query():
                self.events[i].synchronize()  # the host waits for a copy a ring of updates old; no stream sync
            for j, t, dev in items:
                if not dev:
                    self.host_views[i][j].copy_(t)
            if not any(dev for *_, dev in items):
                self.flat.copy_(self.host[i], non_blocking=True)  # one copy for the whole batch
            else:
                for j, t, dev in items:
                    if not dev:
                        self.static[j].copy_(self.host_views[i][j], non_blocking=True)
            if self.cuda:
                self.events[i].record()
                self._recorded[i] = True
        for j, t, dev in items:
            if dev:
                self.static[j].copy_(t)  # already on the device: a device copy, queued on the current stream


# --- capture and replay -------------------------------------------------------------------------------------
class _Captured:
    def __init__(self, graph, outputs: dict[str, torch.Tensor]):
        self.graph, self.outputs = graph, outputs

    def replay(self) -> None:
        self.graph.replay()


_ACTING_STREAMS: dict[int, "torch.cuda.Stream"] = {}  # by device index


class CudaGraphs:
    """Capture on a side stream (PyTorch's whole-network recipe), replay on the current stream (acting: on the
    acting stream)."""

    make_capturable = True

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.side = torch.cuda.Stream(device=self.device)
        self._branches: list[torch.cuda.Stream] = []

    @contextlib.contextmanager
    def side_stream(self):
        current = torch.cuda.current_stream(self.device)
        self.side.wait_stream(current)
        with torch.cuda.stream(self.side):
            yield
        current.wait_stream(self.side)

    @contextlib.contextmanager
    def acting_stream(self):
        """Acting replays, queued after the current stream's work on one stream per device shared by every
        runner, and waited for on the host. Shared, not one per runner: a replay first writes the generator's
        seed and offset into tensors that, in some torch releases, all graphs of the default generator share,
        so two runners' replays on two streams could read each other's (a seed axis's runners would)."""
        current = torch.cuda.current_stream(self.device)
        key = current.device_index  # "cuda" and "cuda:0" are one device, with one acting stream
        stream = _ACTING_STREAMS.get(key)
        if stream is None:
            stream = _ACTING_STREAMS[key] = torch.cuda.Stream(device=self.device)
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            yield

    def capture(self, fn: Callable[[], dict[str, torch.Tensor]]) -> _Captured:
        graph = torch.cuda.CUDAGraph()
        current = torch.cuda.current_stream(self.device)
        self.side.wait_stream(current)
        with torch.cuda.graph(graph, stream=self.side):
            outputs = fn()
        current.wait_stream(self.side)
        return _Captured(graph, outputs)

    @contextlib.contextmanager
    def branches(self, n: int):
        """n streams forked from the current one and joined back into it on exit: inside one capture, the
        graph's branches (one per seed of a seed axis), which the GPU may run concurrently."""
        if n <= 1:
            yield [None] * n
            return
        while len(self._branches) < n:
            self._branches.append(torch.cuda.Stream(device=self.device))
        current = torch.cuda.current_stream(self.device)
        streams = self._branches[:n]
        for s in streams:
            s.wait_stream(current)
        try:
            yield streams
        finally:
            for s in streams:
                current.wait_stream(s)

    def keep_for_current_stream(self, tensors) -> None:
        """Tensors allocated on the side stream and used on the current one: the allocator must not reuse their
        memory before the current stream's work on them is done."""
        current = torch.cuda.current_stream(self.device)
        for t in tensors:
            t.record_stream(current)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)


# --- the runner ---------------------------------------------------------------------------------------------
class UpdateRunner:
    """``runner(batch, grad_norms)`` = ``agent.update(batch, grad_norms)``, as graph replays on CUDA (module
    docstring). The statistics of a replay are fresh tensors (clones of the graph's static outputs).

    Given several agents (the seeds of a seed axis, pomdp_ffm/seeds.py), ``runner.update_all(batches,
    grad_norms)`` updates each agent on its own batch, ``agent.update`` for each in turn when eager; on CUDA all
    of them are one graph, each agent's update a branch of it on its own stream, so that one replay launches the
    S updates and the GPU overlaps their small kernels. Each agent's update is exactly its own: the graph only
    orders the S independent updates differently in time. The agents must agree on the host path of each update
    (with a TD3 policy delay, whether it moves the actors), which is then the first agent's."""

    def __init__(self, agents: RecurrentAgent | Sequence[RecurrentAgent], cuda_graph: bool = True, *,
                 warmup: int = WARMUP_UPDATES, ring: int = HOST_RING, backend=None):
        self.agents = [agents] if isinstance(agents, RecurrentAgent) else list(agents)
        if not self.agents:
            raise ValueError("an UpdateRunner needs at least one agent")
        self.agent = self.agents[0]
        delays = sorted({a.algo.policy_delay for a in self.agents})
        if len(delays) > 1:
            raise ValueError(f"agents updated together must share their policy delay: got {delays}")
        self.device = self.agent.device
        if any(a.device != self.device for a in self.agents):
            raise ValueError(f"the agents of one UpdateRunner must share a device: got "
                             f"{sorted({str(a.device) for a in self.agents})}")
        if backend is None and cuda_graph and self.device.type == "cuda":
            backend = CudaGraphs(self.device)
        self.backend = backend
        self.graphed = backend is not None
        self.warmup, self.ring = max(int(warmup), 1), int(ring)
        self.stagings: list[Staging] | None = None
        self._graphs: dict[tuple[bool, bool], _Captured] = {}
        self._eager_runs: Counter = Counter()
        self._fingerprint: tuple | None = None
        self._params: list[torch.Tensor] = []  # the agents' parameters, listed at the last rearm
        # What a caller (tests, the benchmark) may read: updates run each way, captures made.
        self.eager_updates = self.replays = self.captures = self.rearms = 0

    @property
    def captured_paths(self) -> set[tuple[bool, bool]]:
        """(grad_norms, actor_step) of each graph held now."""
        return set(self._graphs)

    def __call__(self, batch, grad_norms: bool = False) -> dict[str, torch.Tensor]:
        if len(self.agents) != 1:
            raise TypeError(f"this runner updates {len(self.agents)} agents together: call update_all(batches)")
        # A replaced agent.update (a test's or a tool's wrapper on the instance) is honoured: it is then called.
        if not self.graphed or "update" in vars(self.agent):
            return self.agent.update(batch, grad_norms=grad_norms)
        return self._update(agents_batches=[batch], grad_norms=grad_norms)[0]

    def update_all(self, batches: Sequence, grad_norms: bool = False) -> list[dict[str, torch.Tensor]]:
        """One update of every agent, agent k on batches[k]; their statistics, in the agents' order."""
        if len(batches) != len(self.agents):
            raise ValueError(f"update_all needs one batch per agent: got {len(batches)} for {len(self.agents)}")
        due = [a.actor_step_due() for a in self.agents]
        if len(set(due)) != 1:
            raise ValueError(f"agents updated together must agree on whether this update moves their actors (a "
                             f"TD3 policy delay): got {due} after {[a.num_updates for a in self.agents]} updates")
        if not self.graphed:
            return [a.update(b, grad_norms=grad_norms) for a, b in zip(self.agents, batches)]
        return self._update(batches, grad_norms)

    # ------------------------------------------------------------------------------------------------
    def _update(self, agents_batches: Sequence, grad_norms: bool) -> list[dict[str, torch.Tensor]]:
        self._check_state()
        path = (bool(grad_norms), self.agent.actor_step_due())
        if self.stagings is None:
            self.stagings = [Staging(b, self.device, self.ring) for b in agents_batches]
        for staging, b in zip(self.stagings, agents_batches):
            staging.fill(b)
        captured = self._graphs.get(path)
        if captured is None and self._eager_runs[path] >= 1 and sum(self._eager_runs.values()) >= self.warmup:
            captured = self._capture(path)
        stats = self._eager(path) if captured is None else self._replay(captured)
        for a in self.agents:
            a.count_update()
        return stats

    def _update_on_static(self, k: int, grad_norms: bool, actor_step: bool) -> dict[str, torch.Tensor]:
        """Agent k's update on its static inputs: what a graph captures and an eager warm-up runs."""
        aligned = Aligned.from_batch(self.stagings[k].static, self.device)
        return update(self.agents[k], aligned, actor_step_due=actor_step, grad_norms=grad_norms)

    def _device_updates(self, grad_norms: bool, actor_step: bool) -> list[dict[str, torch.Tensor]]:
        """Every agent's device work on its static inputs; inside a capture, each on its own branch stream."""
        if len(self.agents) == 1:
            return [self._update_on_static(0, grad_norms, actor_step)]
        out = []
        with self.backend.branches(len(self.agents)) as streams:
            for k, stream in enumerate(streams):
                with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                    out.append(self._update_on_static(k, grad_norms, actor_step))
        return out

    def _eager(self, path: tuple[bool, bool]) -> list[dict[str, torch.Tensor]]:
        with self.backend.side_stream():
            stats = [self._update_on_static(k, *path) for k in range(len(self.agents))]
        self.backend.keep_for_current_stream([v for st in stats for v in st.values()])
        self._eager_runs[path] += 1
        self.eager_updates += 1
        return stats

    def _capture(self, path: tuple[bool, bool]) -> _Captured:
        grad_norms, actor_step = path
        # A memory called without gradients reuses its cached gamma while its parameters' versions are unchanged:
        # inside a graph that tensor would be a constant computed outside it. Drop the caches, so that every
        # gamma the update uses is computed in the graph.
        for m in self._ffms():
            m.drop_gamma_cache()
        # The optimisers' state was created on the side stream (warm-up) and is used by replays on this one.
        self.backend.keep_for_current_stream(
            [v for a in self.agents for o in a.optimizers().values() for st in o.state.values() for v in st.values()
             if torch.is_tensor(v)])
        try:
            captured = self.backend.capture(lambda: self._device_updates(grad_norms, actor_step))
        except Exception as e:
            detail = (str(e).strip().splitlines() or [""])[0]
            raise CaptureError(f"capturing the update (grad_norms={grad_norms}, actor_step={actor_step}) in a CUDA "
                               f"graph failed: {type(e).__name__}: {detail}; set train.cuda_graph=false to run the "
                               "update eagerly") from e
        # The caches now hold tensors of the graph, filled by its replays: stale for an eager call until a bump.
        bump_versions(self._params)
        self._graphs[path] = captured
        self.captures += 1
        return captured

    def _replay(self, captured: _Captured) -> list[dict[str, torch.Tensor]]:
        captured.replay()
        # The graph wrote the parameters in place without Python seeing it: move their version counters as the
        # eager update's in-place writes do (FFM's acting cache of gamma is keyed on them).
        bump_versions(self._params)
        self.replays += 1
        return _copied(captured.outputs)

    def _ffms(self) -> list[FFM]:
        return [m for a in self.agents for m in a.modules() if isinstance(m, FFM)]

    # ------------------------------------------------------------------------------------------------
    def _current_fingerprint(self) -> tuple:
        # The parameters listed at the last rearm (walking the modules at every update would cost more than the
        # rest of the host's work): an in-place move or re-allocation shows in their data pointers.
        optims = [o for a in self.agents for o in a.optimizers().values()]
        return (tuple(o.state for o in optims),
                tuple(all(g.get("capturable", False) for g in o.param_groups) for o in optims),
                tuple(p.data_ptr() for p in self._params),
                self._params[0].device if self._params else self.device)

    def _check_state(self) -> None:
        """Rearm after anything that replaced what the graphs read: a loaded optimiser state (a resume), a
        parameter moved or re-allocated."""
        now, was = self._current_fingerprint(), self._fingerprint
        if was is not None and all(a is b for a, b in zip(now[0], was[0])) and len(now[0]) == len(was[0]) \
                and now[1:] == was[1:]:
            return
        if now[3] != self.device:
            raise ValueError(f"the agent moved from {self.device} to {now[3]} after its UpdateRunner was built; "
                             "build a new runner")
        self._rearm()

    def _rearm(self) -> None:
        if self._graphs:
            self.backend.synchronize()  # replays still queued read what the graphs own
        self._graphs.clear()
        self._eager_runs.clear()
        self._params = [p for a in self.agents for p in a.parameters()]
        if self.backend.make_capturable:
            for a in self.agents:
                for o in a.optimizers().values():
                    make_capturable_(o)
        self._fingerprint = self._current_fingerprint()
        self.rearms += 1


def _copied(outputs: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    """The graph's statistics copied out of its memory (the next replay overwrites them): as one copy where they
    are scalars of one dtype (one launch, not one per statistic and seed), each seen through a view of it."""
    values = [v for out in outputs for v in out.values()]
    if not values or any(v.dim() or v.dtype != values[0].dtype for v in values):
        return [{k: v.clone() for k, v in out.items()} for out in outputs]
    flat = iter(torch.stack(values).unbind())
    return [{k: next(flat) for k in out} for out in outputs]


def make_updater(agent: RecurrentAgent, cuda_graph: bool) -> UpdateRunner:
    """What the trainer calls for each update: graph replays on CUDA with ``train.cuda_graph``, else the eager
    ``agent.update``."""
    return UpdateRunner(agent, cuda_graph=cuda_graph)
