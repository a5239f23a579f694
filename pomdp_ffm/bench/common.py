"""Timing helpers shared by the benchmarks."""
from __future__ import annotations

import collections
import csv
import statistics
import time
from typing import Callable

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode


Row = collections.namedtuple("Row", "benchmark shape model metric value unit")  # value: a float, the rest strings


def interleaved_medians(fns: dict[str, Callable[[], None]], repeats: int, device: torch.device,
                        warmup: int = 2, inner: int = 1) -> dict[str, float]:
    """Median seconds per call of each function, timed round-robin so drift hits all variants alike; the first slot
    rotates (on one H200 the same FFM variant ran 20-60% slower in a round's first slot)."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    names = list(fns)
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(repeats):
        for k in names[r % len(names):] + names[: r % len(names)]:
            sync()
            t0 = time.perf_counter()
            for _ in range(inner):
                fns[k]()
            sync()
            times[k].append((time.perf_counter() - t0) / inner)
    return {k: statistics.median(v) for k, v in times.items()}


class DispatchedOps(TorchDispatchMode):
    """Counts (``ops``, by name) the operators that reach a backend while active but views and profiler marks (on a
    GPU each is a kernel launch). ``optimisers=False`` leaves out optimiser steps, which dispatch per tensor on a CPU
    but ``_foreach`` calls on CUDA, so that the rest counts the same on any device."""

    def __init__(self, optimisers: bool = True):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self.optimisers, self._stepping, self._hooks = optimisers, [], None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)  # aten._unsafe_view: a reshape that aliases without saying so
        if not (self._stepping or func.is_view or name == "aten._unsafe_view.default" or func.namespace == "profiler"):
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        if self._hooks is not None:
            raise RuntimeError("this DispatchedOps is already counting")
        self._stepping = []  # an optimiser step that raises leaves the rest of its count paused, not the next
        entered = super().__enter__()
        self._hooks = [] if self.optimisers else [register_optimizer_step_pre_hook(lambda *_: self._stepping.append(1)),
                                                  register_optimizer_step_post_hook(lambda *_: self._stepping.pop())]
        return entered

    def __exit__(self, *exc):
        for h in self._hooks:
            h.remove()
        self._hooks = None
        return super().__exit__(*exc)

    @property
    def total(self) -> int:
        return sum(self.ops.values())


def saved_tensor_bytes(make_graph: Callable[[], torch.Tensor], device: torch.device) -> int:
    """Memory a forward pass keeps for its backward: peak allocation on CUDA; on a CPU, the bytes of the
    distinct storages autograd saves (what a fwd+bwd must hold at its peak beyond parameters)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        make_graph().backward()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = make_graph()
    out.backward()
    return sum(seen.values())


def print_table(rows: list[Row], baseline: str) -> None:
    """One block per (shape, metric): value and ratio to ``baseline`` (> 1: slower/larger)."""
    width = max([12, *(len(r.model) for r in rows)])
    for shape, metric in dict.fromkeys((r.shape, r.metric) for r in rows):
        block = [r for r in rows if r.shape == shape and r.metric == metric]
        base = next((r.value for r in block if r.model == baseline), None)
        print(f"\n{shape}  {metric}")
        for r in block:
            ratio = f"{r.value / base:6.2f}x {baseline}" if base else ""
            print(f"  {r.model:<{width}} {r.value:12.3f} {r.unit:<3} {ratio}")


def write_csv(rows: list[Row], path: str) -> None:
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([Row._fields, *([*r[:4], f"{r.value:.6g}", r.unit] for r in rows)])
