"""The update as the replay of a captured CUDA graph (``train.cuda_graph``, patches/015-cuda-graph-update.md):
each host path (grad_norms, actor step due) is captured after ``warmup`` eager updates on the side stream, then
replayed, with the eager RNG stream. The agents' Adam must be capturable (their ``AdamForm``, chosen when they are
built); a loaded optimiser state or a moved parameter drops the graphs. ``backend`` is ``CudaGraphs`` or a test
double. With ``compile`` (``train.compile``), the update, captured or not, runs its losses through torch.compile
(update.compiled_losses), its Adam fused (the agents' form again): ``warm_up`` compiles them before the run acts
(else the first update does), the capture records inductor's kernels. No runner changes an agent's optimisers."""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np
import torch

from .agent import RecurrentAgent
from .buffer import Batch
from .compiling import compile_errors_named, compiles
from .seq_models import drop_caches
from .update import Aligned, update

WARMUP_UPDATES = 3  # eager updates on the side stream before the first capture (PyTorch's recipe uses 3)
HOST_RING = 3  # pinned host buffers the batches rotate through
_ALIGN = 64  # bytes: every array of the flat buffers starts on this boundary


class CaptureError(RuntimeError):
    """A failed capture; the message is one line naming the switch."""


def guarded_capture(what: str, instead: str, modules, make: Callable):
    """``make()`` (a capture) without the memories' acting caches (FFM's gamma), which would be constants computed
    outside the graph; a failure is a CaptureError."""
    drop_caches(*modules)
    try:
        return make()
    except Exception as e:
        detail = (str(e).strip().splitlines() or [""])[0]
        raise CaptureError(
            f"capturing {what} in a CUDA graph failed: {type(e).__name__}: {detail}; "
            f"set train.cuda_graph=false to {instead}"
        ) from e


def bump_versions(tensors: list[torch.Tensor]) -> None:
    """As an in-place write would: a replay writes unseen by Python, and FFM's gamma cache is keyed on versions."""
    try:
        torch.autograd.graph.increment_version(tensors)
    except TypeError:  # an older torch takes one tensor at a time
        for t in tensors:
            torch.autograd.graph.increment_version(t)


class Staging:
    """Static device tensors for a batch of fixed shapes (views into one flat buffer), filled from a ring of
    (pinned) host buffers by one non-blocking copy; an event after each copy guards its host buffer on CUDA."""

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
        self.next = 0

    def _views(self, flat: torch.Tensor) -> Batch:
        return Batch(*(flat[o : o + n].view(dtype).view(shape) for shape, dtype, o, n in self.specs))

    def fill(self, batch: Batch) -> None:
        arrays = [x if torch.is_tensor(x) else torch.as_tensor(np.asarray(x)) for x in batch]
        got = [(tuple(t.shape), t.dtype) for t in arrays]
        want = [(shape, dtype) for shape, dtype, _, _ in self.specs]
        if got != want:
            raise ValueError(
                f"a CUDA-graph update needs batches of one fixed layout: got {got}, the graph's inputs "
                f"are {want} (train.cuda_graph=false runs the update eagerly)"
            )
        # numpy arrays (the buffer's batches) go through the host ring; tensors already on the device are copied
        host = [j for j, x in enumerate(batch) if not (torch.is_tensor(x) and x.device == self.device)]
        if host:
            i, self.next = self.next, (self.next + 1) % len(self.host)
            if self.cuda and not self.events[i].query():  # (a never recorded event is complete)
                self.events[i].synchronize()  # the host waits for a copy a ring of updates old; no stream sync
            for j in host:
                self.host_views[i][j].copy_(arrays[j])
            if len(host) == len(arrays):
                self.flat.copy_(self.host[i], non_blocking=True)  # one copy for the whole batch
            else:
                for j in host:
                    self.static[j].copy_(self.host_views[i][j], non_blocking=True)
            if self.cuda:
                self.events[i].record()
        for j, t in enumerate(arrays):
            if j not in host:
                self.static[j].copy_(t)  # a device copy, queued on the current stream


_ACTING_STREAMS: dict[int, torch.cuda.Stream] = {}  # by device index


class CudaGraphs:
    """Capture on a side stream (PyTorch's whole-network recipe), replay on the current (or acting) stream."""

    needs_capturable = True

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
        """One stream per device, after the current stream's work. Shared by every runner: a replay writes the RNG
        seed and offset into tensors that (in some torch releases) all graphs share."""
        current = torch.cuda.current_stream(self.device)
        key = current.device_index  # "cuda" and "cuda:0" are one device, with one acting stream
        stream = _ACTING_STREAMS.get(key)
        if stream is None:
            stream = _ACTING_STREAMS[key] = torch.cuda.Stream(device=self.device)
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            yield

    def capture(self, fn: Callable[[], list[dict[str, torch.Tensor]]]) -> torch.cuda.CUDAGraph:
        """The graph, with ``outputs``: what ``fn`` returned, which each ``replay()`` rewrites."""
        graph = torch.cuda.CUDAGraph()
        with self.side_stream(), torch.cuda.graph(graph, stream=self.side):
            graph.outputs = fn()
        return graph

    @contextlib.contextmanager
    def branches(self, n: int):
        """n > 1 streams forked from the current one and joined back on exit: a capture's concurrent branches."""
        self._branches += [torch.cuda.Stream(device=self.device) for _ in range(n - len(self._branches))]
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
        """Tensors made on the side stream and used on the current one: not reused before its work on them."""
        current = torch.cuda.current_stream(self.device)
        for t in tensors:
            t.record_stream(current)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)


class UpdateRunner:
    """The one caller of ``update.update``: ``update_all(batches, grad_norms)`` updates each agent on its own batch,
    eagerly, or on CUDA as one graph with a branch stream per agent (a seed axis's agents); ``runner(batch)`` for
    one agent."""

    def __init__(
        self,
        agents: RecurrentAgent | Sequence[RecurrentAgent],
        cuda_graph: bool = True,
        *,
        compile: bool = False,
        warmup: int = WARMUP_UPDATES,
        ring: int = HOST_RING,
        backend=None,
    ):
        self.agents = [agents] if isinstance(agents, RecurrentAgent) else list(agents)
        self.agent, self.device = self.agents[0], self.agents[0].device
        self.compiled = compiles(bool(compile), self.agents, self.device)  # (a compile known to fail: CompileError)
        if self.compiled:
            _check_adam(self.agents, "fused", "train.compile")
        delays = sorted({a.algo.policy_delay for a in self.agents})
        if len(delays) > 1:
            raise ValueError(f"agents updated together must share their policy delay: got {delays}")
        if backend is None and cuda_graph and self.device.type == "cuda":
            backend = CudaGraphs(self.device)
        self.backend, self.graphed = backend, backend is not None
        if self.graphed and self.backend.needs_capturable:
            _check_adam(self.agents, "capturable", "train.cuda_graph")
        self.warmup, self.ring = max(int(warmup), 1), int(ring)
        self.stagings, self._graphs, self._eager_runs, self._fingerprint = None, {}, Counter(), None
        self._params: list[torch.Tensor] = []  # the agents' parameters, listed at the last rearm
        self.eager_updates = self.replays = self.captures = self.rearms = 0

    @property
    def captured_paths(self) -> set[tuple[bool, bool]]:  # (grad_norms, actor_step) of each graph held
        return set(self._graphs)

    def warm_up(self, batch: Batch) -> bool:
        """``train.compile``: the update compiled now, before the run acts, so that no update of the run waits for a
        compile (nor does a stop signal, which is looked at between updates; patches/020). One update of a throwaway
        copy of the first agent on ``batch``, a batch of the run's layout (the graphs are specialised on shapes,
        never on values: ``SeqReplayBuffer.blank_batch``), its actor's step included, forward and backward
        (AOTAutograd compiles a backward at its first call). The agents of one runner share one architecture, hence
        one set of graphs (update.compiled_losses), which the copy's going leaves valid: dynamo guards on the
        modules' structure, not on which ones they are. The agents, their optimisers and torch's generators
        (``fallback_random`` draws the noise from them) are left as they were, so that the run draws, updates and
        checkpoints as one whose first update compiled. Any error is a CompileError. False where nothing compiles."""
        if not self.compiled:
            return False
        cuda = self.device.type == "cuda"
        devices = [self.device.index if self.device.index is not None else torch.cuda.current_device()] if cuda else []
        with compile_errors_named(everything=True), torch.random.fork_rng(devices=devices):
            twin = copy.deepcopy(self.agent)
            update(twin, Aligned.from_batch(batch, self.device), actor_step_due=True, compiled=True)
            if cuda:
                torch.cuda.synchronize(self.device)  # a failure of its kernels surfaces here, named, not in an update
        return True

    def __call__(self, batch, grad_norms: bool = False) -> dict[str, torch.Tensor]:
        if len(self.agents) != 1:
            raise TypeError(f"this runner updates {len(self.agents)} agents together: call update_all(batches)")
        return self.update_all([batch], grad_norms)[0]

    def update_all(self, batches: Sequence, grad_norms: bool = False) -> list[dict[str, torch.Tensor]]:
        if len(batches) != len(self.agents):
            raise ValueError(f"update_all needs one batch per agent: got {len(batches)} for {len(self.agents)}")
        due = [a.actor_step_due() for a in self.agents]
        if len(set(due)) != 1:
            raise ValueError(
                f"agents updated together must agree on whether this update moves their actors (a "
                f"TD3 policy delay): got {due} after {[a.num_updates for a in self.agents]} updates"
            )
        with compile_errors_named() if self.compiled else contextlib.nullcontext():
            if self.graphed:
                return self._graphed(batches, grad_norms)
            stats = []
            for a, b in zip(self.agents, batches):
                aligned = Aligned.from_batch(b, a.device)
                stats.append(update(a, aligned, actor_step_due=due[0], grad_norms=grad_norms, compiled=self.compiled))
                a.count_update()
            return stats

    def _graphed(self, agents_batches: Sequence, grad_norms: bool) -> list[dict[str, torch.Tensor]]:
        self._check_state()
        path = (bool(grad_norms), self.agent.actor_step_due())
        self.stagings = self.stagings or [Staging(b, self.device, self.ring) for b in agents_batches]
        for staging, b in zip(self.stagings, agents_batches):
            staging.fill(b)
        captured = self._graphs.get(path)
        if captured is None and self._eager_runs[path] >= 1 and sum(self._eager_runs.values()) >= self.warmup:
            captured = self._capture(path)
        stats = self._eager(path) if captured is None else self._replay(captured)
        for a in self.agents:
            a.count_update()
        return stats

    def _update_on_static(self, k: int, grad_norms: bool, actor_step: bool, stream=None) -> dict[str, torch.Tensor]:
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            aligned = Aligned.from_batch(self.stagings[k].static, self.device)
            return update(
                self.agents[k], aligned, actor_step_due=actor_step, grad_norms=grad_norms, compiled=self.compiled
            )

    def _device_updates(self, grad_norms: bool, actor_step: bool) -> list[dict[str, torch.Tensor]]:
        if len(self.agents) == 1:
            return [self._update_on_static(0, grad_norms, actor_step)]
        with self.backend.branches(len(self.agents)) as streams:
            return [self._update_on_static(k, grad_norms, actor_step, s) for k, s in enumerate(streams)]

    def _eager(self, path: tuple[bool, bool]) -> list[dict[str, torch.Tensor]]:
        with self.backend.side_stream(), warnings.catch_warnings():
            # The warm-up updates run the capturable step eagerly on purpose.
            warnings.filterwarnings("ignore", message="This instance was constructed with capturable=True")
            stats = [self._update_on_static(k, *path) for k in range(len(self.agents))]
        self.backend.keep_for_current_stream([v for st in stats for v in st.values()])
        self._eager_runs[path] += 1
        self.eager_updates += 1
        return stats

    def _capture(self, path: tuple[bool, bool]) -> torch.cuda.CUDAGraph:
        grad_norms, actor_step = path
        # The optimisers' state was created on the side stream (warm-up) and is used by replays on this one.
        self.backend.keep_for_current_stream(
            [
                v
                for a in self.agents
                for o in a.optimizers().values()
                for st in o.state.values()
                for v in st.values()
                if torch.is_tensor(v)
            ]
        )
        captured = guarded_capture(
            f"the update (grad_norms={grad_norms}, actor_step={actor_step})",
            "run the update eagerly",
            self.agents,
            lambda: self.backend.capture(lambda: self._device_updates(grad_norms, actor_step)),
        )
        # The caches now hold the graph's tensors: stale for an eager call until a bump.
        bump_versions(self._params)
        self._graphs[path] = captured
        self.captures += 1
        return captured

    def _replay(self, captured: torch.cuda.CUDAGraph) -> list[dict[str, torch.Tensor]]:
        captured.replay()
        bump_versions(self._params)
        self.replays += 1
        return _copied(captured.outputs)

    def _current_fingerprint(self) -> tuple:
        # The parameters listed at the last rearm (walking the modules costs more than the rest of an update's host
        # work): a move or re-allocation shows in their data pointers.
        optims = [o for a in self.agents for o in a.optimizers().values()]
        return (
            tuple(o.state for o in optims),
            tuple(p.data_ptr() for p in self._params),
            self._params[0].device if self._params else self.device,
        )

    def _check_state(self) -> None:
        """Rearm after a loaded optimiser state (a resume) or a moved or re-allocated parameter."""
        now, was = self._current_fingerprint(), self._fingerprint
        if (
            was is not None
            and all(a is b for a, b in zip(now[0], was[0]))
            and len(now[0]) == len(was[0])
            and now[1:] == was[1:]
        ):
            return
        if now[2] != self.device:
            raise ValueError(
                f"the agent moved from {self.device} to {now[2]} after its UpdateRunner was built; build a new runner"
            )
        self._rearm()

    def _rearm(self) -> None:
        if self._graphs:
            self.backend.synchronize()  # replays still queued read what the graphs own
        self._graphs, self._eager_runs = {}, Counter()
        self._params = [p for a in self.agents for p in a.parameters()]
        self._fingerprint = self._current_fingerprint()
        self.rearms += 1


def _check_adam(agents: Sequence[RecurrentAgent], switch: str, setting: str) -> None:
    forms = [a.adam for a in agents]
    if not all(getattr(f, switch) for f in forms):
        raise ValueError(
            f"{setting} needs every agent's Adam built {switch} (RecurrentAgent(..., adam=AdamForm({switch}=True))); "
            f"got {forms}"
        )


def _copied(outputs: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    """The statistics copied out of the graph's memory (the next replay overwrites them): one stack, one launch,
    where they are all scalars of one dtype."""
    values = [v for out in outputs for v in out.values()]
    if not values or any(v.dim() or v.dtype != values[0].dtype for v in values):
        return [{k: v.clone() for k, v in out.items()} for out in outputs]
    flat = iter(torch.stack(values).unbind())
    return [{k: next(flat) for k in out} for out in outputs]


def joint_runner(trainers: list) -> UpdateRunner | None:
    """One graph updating these trainers (trainer.Trainer) together (CUDA with ``train.cuda_graph``), or None: on a
    CPU a joint update would cost the same as turns, which keep each seed's own generators."""
    first = trainers[0]
    if len(trainers) < 2 or first.agent.device.type != "cuda" or not first.cfg.train.cuda_graph:
        return None
    return UpdateRunner([t.agent for t in trainers], cuda_graph=True, compile=first.updater.compiled)
