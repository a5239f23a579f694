"""Timing helpers shared by the benchmarks."""

from __future__ import annotations

import collections
import csv
import errno
import io
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode

from ..run.rundir import replace_file
from ..run.unwritable import Unwritable, writing

Row = collections.namedtuple("Row", "benchmark shape model metric value unit")  # value: a float, the rest strings


def interleaved_medians(
    fns: dict[str, Callable[[], None]], repeats: int, device: torch.device, warmup: int = 2, inner: int = 1
) -> dict[str, float]:
    """Median seconds per call of each function, timed round-robin so drift hits all variants alike.

    The starting variant rotates from round to round: on a GPU the first call after the previous round's last
    variant ran measurably slower (one H200 showed the same FFM variant 20-60% slower in the first slot)."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for fn in fns.values():
        for _ in range(warmup):
            fn()
    names = list(fns)
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(repeats):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            sync()
            t0 = time.perf_counter()
            for _ in range(inner):
                fns[k]()
            sync()
            times[k].append((time.perf_counter() - t0) / inner)
    return {k: statistics.median(v) for k, v in times.items()}


_NO_KERNEL = {"aten._unsafe_view.default"}  # a reshape that aliases without saying so


class DispatchedOps(TorchDispatchMode):
    """Counts the operators that reach a backend while it is active, but views and profiler marks, which launch
    nothing (counted after autograd and vmap: a backward's ops and a batched op count once each). On a GPU each
    is at least one kernel launch, which is what bounds an update of this size there. ``optimisers=False``
    leaves out what optimiser steps dispatch: per tensor on a CPU, multi-tensor ``_foreach`` calls on CUDA, so
    only the rest counts the same on any device. ``ops`` is a Counter by operator name
    (``aten._local_scalar_dense`` is a read of a tensor's value on the host)."""

    def __init__(self, optimisers: bool = True):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self.optimisers = optimisers
        self._stepping: list = []  # one entry per optimiser step under way (optimisers=False): not counted
        self._hooks: list | None = None  # None: not counting

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if not (self._stepping or func.is_view or name in _NO_KERNEL or func.namespace == "profiler"):
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        if self._hooks is not None:
            raise RuntimeError("this DispatchedOps is already counting")
        self._stepping = []  # an optimiser step that raises leaves the rest of its count paused, not the next
        entered = super().__enter__()
        if self.optimisers:
            self._hooks = []
        else:
            self._hooks = [
                register_optimizer_step_pre_hook(lambda *_: self._stepping.append(1)),
                register_optimizer_step_post_hook(lambda *_: self._stepping.pop()),
            ]
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
        return peak_bytes(lambda: make_graph().backward(), device)
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = make_graph()
    out.backward()
    return sum(seen.values())


def peak_bytes(run: Callable[[], None], device: torch.device) -> int:
    """The most bytes ``run`` holds allocated at once beyond what was there before it: torch's peak on CUDA; on a
    CPU, where torch keeps no peak, the largest running sum of what each operator allocates and frees, in the order
    they start (torch.profiler's memory profile)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        run()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    live = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def print_table(rows: list[Row], baseline: str) -> None:
    """One block per (shape, metric): value and ratio to ``baseline`` (ratio > 1 means slower/larger)."""
    width = max([12, *(len(r.model) for r in rows)])
    for shape, metric in dict.fromkeys((r.shape, r.metric) for r in rows):
        block = [r for r in rows if r.shape == shape and r.metric == metric]
        base = next((r.value for r in block if r.model == baseline), None)
        print(f"\n{shape}  {metric}")
        for r in block:
            ratio = f"{r.value / base:6.2f}x {baseline}" if base else ""
            print(f"  {r.model:<{width}} {r.value:12.3f} {r.unit:<3} {ratio}")


# A benchmark's --csv only ever adds rows: a rerun, or a second run where the first was cut short, keeps what the file
# held (``python -m analysis`` averages rows of the same shape, model and metric; give each machine a file of its own).
# Each write is the whole file, old rows and new, written beside it and renamed over it (``rundir.replace_file``):
# a plain append killed mid-write (SIGKILL, a full disk) leaves half a row, a rewrite in place an empty file; a rename
# leaves the old file or the new one. The file is small (hundreds of rows), so rewriting it per trial costs nothing.
# One benchmark a file at a time: two adding to one file at once could each rename over the other's rows.
HEADER = ",".join(Row._fields)


def _held(path: str) -> bytes:
    """The bytes of the benchmark CSV at ``path`` (b"" where there is none, or an empty file); ValueError where it
    holds something else: the benchmark adds to its own files only."""
    try:
        with open(path, "rb") as f:
            old = f.read()
    except FileNotFoundError:
        return b""
    first = old.split(b"\n", 1)[0].rstrip(b"\r")
    if old and first != HEADER.encode():
        raise ValueError(f"holds something other than benchmark rows (its first line is not `{HEADER}`)")
    return old


def check_csv(path: str) -> int:
    """Before anything is measured: the number of rows the CSV at ``path`` holds already (0 for a new file); a
    ValueError where the path is wrong (a folder, no folder, not a benchmark's CSV), Unwritable where the file system
    refuses the write."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError("is a folder; give a file")
    if not os.path.isdir(folder):
        raise ValueError("its folder does not exist")
    try:
        old = _held(path)
        if os.path.exists(path):
            open(path, "ab").close()  # a read-only or immutable file is kept from change: refused, not replaced
        tempfile.TemporaryFile(dir=folder).close()  # where the rows are written before they are renamed into place
    except OSError as e:  # the file system refuses: exit 74, as a run's directory (launch/README.md)
        raise Unwritable(e.errno, e.strerror or str(e), path) from None
    return max(len(old.splitlines()) - 1, 0)


def write_csv(rows: list[Row], path: str) -> None:
    """Add the rows to the benchmark CSV at ``path``, made with its header where there is none; what it held stays.
    Unwritable (naming the file) where it cannot be written, the file then as it was."""
    target = Path(os.path.realpath(path))  # a symbolic link stays one: its target gets the rows
    with writing(target):
        try:
            old = _held(str(target))
        except ValueError as e:  # put there since check_csv: not ours to change
            raise Unwritable(errno.EEXIST, str(e), str(target)) from None
        if old and not old.endswith(b"\n"):  # a last line cut short by an older writer: a line of its own, not
            old = old.rstrip(b"\r") + b"\r\n"  # glued to a row (the csv module ends its rows with CRLF)
        text = io.StringIO()
        w = csv.writer(text)
        if not old:
            w.writerow(Row._fields)
        for r in rows:
            w.writerow([r.benchmark, r.shape, r.model, r.metric, f"{r.value:.6g}", r.unit])
        data = old + text.getvalue().encode()
        mode = os.stat(target).st_mode & 0o7777 if old else None

        def write(tmp: Path) -> None:
            tmp.write_bytes(data)
            if mode is not None:
                os.chmod(tmp, mode)  # the file keeps its permissions

        replace_file(target, write)
