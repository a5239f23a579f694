"""What the runtime asks of a memory beyond computing it: for CUDA graphs (``drop_caches``), for compiling the update
(``compile_pays``, ``compile_failure``), for the memory estimate at a run's start (``activation_floats``) and for the
owner that bounds parameters after its writes (``bounded_by_owner``). Every hook has a default, so that a memory's
author implements only the model (seq_models/base.py, ``SeqModel``) and overrides one of these where the default is
wrong or loose for it (docs/memory_models.md, "Adding a memory")."""

from __future__ import annotations

from typing import ClassVar

import torch

# The window the default activation_floats measures: long and wide enough that per-step costs dominate.
_PROBE_STEPS, _PROBE_ROWS = 16, 2


class Runtime:
    # Where train.compile=null compiles the update on CUDA: measured to pay for this memory (docs/benchmarks.md).
    compile_pays: ClassVar[bool] = False

    def activation_floats(self) -> int:
        """Floats an update saves per batch row and step for this memory's backward (its gates, state and output):
        the memory estimate's share (RecurrentAgent.update_memory). Default: measured once, what autograd keeps of a
        [16, 2] window from a fresh state, parameters not counted (the built-in memories state theirs, within 2x of
        this measurement at a [64, 8] window: tests/test_seq_models.py)."""
        if getattr(self, "_measured_floats", None) is None:
            self._measured_floats = saved_floats(self)
        return self._measured_floats

    def bounded_by_owner(self, owner: bool = True) -> Runtime:
        """Leave ``bound_`` to the owner after each of its writes, not a check per call; ``owner=False`` undoes."""
        return self

    def drop_caches(self) -> None:
        """Forget what acting caches between calls: a CUDA-graph capture must compute it inside the graph, and a
        weight copy that bypasses the parameters' versions would leave it stale."""

    def compile_failure(self) -> str | None:
        """Why torch.compile of the update is known to fail on CUDA with this memory (a CompileError's words), or
        None."""
        return None


def saved_floats(model, steps: int = _PROBE_STEPS, rows: int = _PROBE_ROWS) -> int:
    """What autograd keeps for the backward of one window of ``model`` (float32 words per row and step, rounded up;
    its parameters and buffers not counted), from inputs of a private generator: the global ones are not drawn."""
    weights = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    storages: dict[int, int] = {}

    def keep(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    first = next(iter(model.parameters()), None)
    device = first.device if first is not None else None
    dtype = first.dtype if first is not None and first.is_floating_point() else torch.float32
    x = torch.randn(steps, rows, model.input_size, generator=torch.Generator().manual_seed(0), dtype=dtype)
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        model(x.to(device), None)
    return max(1, -(-sum(storages.values()) // (4 * steps * rows)))
