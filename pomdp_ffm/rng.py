"""Every random generator's state: the process-wide ones (torch's, CUDA's, numpy's, Python's) as a checkpoint holds
them (``for_checkpoint``, ``set_from_checkpoint``), one seed's swapped in for its turns in a seed axis
(``SeedRNG``), and the check that a gathered phase left numpy's and Python's untouched (``same_host_rng``)."""

from __future__ import annotations

import contextlib
import random
from typing import Any, NamedTuple

import numpy as np
import torch


class HostRNG(NamedTuple):
    """numpy's and Python's global generators' states, as they give them."""

    numpy: tuple
    python: tuple


class RNGState(NamedTuple):
    """Every global generator's state: torch's, CUDA's (None without CUDA), numpy's, Python's."""

    torch: torch.Tensor
    cuda: Any
    numpy: tuple
    python: tuple


def seed_all(seed: int) -> None:
    """Python's, numpy's and torch's global generators seeded."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def host_rng_state() -> HostRNG:
    return HostRNG(np.random.get_state(), random.getstate())


def for_checkpoint(host: HostRNG) -> dict:
    """The process-wide generators' states, tensors and plain containers only (``checkpoint.load_checkpoint`` reads
    tensors-only); ``host``: numpy's and Python's (a seed of an axis keeps its own)."""
    (kind, keys, pos, has_gauss, cached), py_state = host
    np_state = {
        "kind": kind,
        "keys": torch.from_numpy(keys.astype(np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }
    return {
        "torch": torch.get_rng_state(),
        "numpy": np_state,
        "python": py_state,
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_from_checkpoint(rng: dict) -> None:
    """The generators set as ``for_checkpoint`` found them (CUDA's where this process has CUDA)."""
    n = rng["numpy"]
    torch.set_rng_state(rng["torch"].cpu())
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    random.setstate(rng["python"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


class SeedRNG:
    """One seed's global generators' states, swapped in for its turns; ``keep`` once its trainer is built."""

    def __init__(self):
        self.state: RNGState | None = None

    def keep(self, host: HostRNG | None = None) -> None:
        """The generators' states now; ``host``: numpy's and Python's, if not the globals'."""
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        self.state = RNGState(torch.get_rng_state(), cuda, *(host or host_rng_state()))

    @contextlib.contextmanager
    def active(self, host: bool = True):
        """This seed's torch generators swapped in, and with ``host`` numpy's and Python's: those cost ~60 us, more
        than a GPU acting step, which draws from torch's only (gathered acting checks: ``same_host_rng``)."""
        torch_state, cuda, np_state, py_state = self.state
        torch.set_rng_state(torch_state)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        if host:
            np.random.set_state(np_state)
            random.setstate(py_state)
        try:
            yield
        finally:
            self.keep(None if host else HostRNG(np_state, py_state))


def same_host_rng(a: HostRNG, b: HostRNG) -> bool:
    (np_a, py_a), (np_b, py_b) = a, b
    return (
        py_a == py_b and np_a[0] == np_b[0] and np.array_equal(np_a[1], np_b[1]) and tuple(np_a[2:]) == tuple(np_b[2:])
    )


class SharedRNGDrawn(RuntimeError):
    """Gathered acting steps drew from numpy's or Python's global generator, which is swapped per seed only outside
    them (``SeedRNG.active``); which seed drew cannot be told."""

    def __init__(self):
        super().__init__(
            "the seeds' gathered acting steps (or their envs, or what follows them) drew from numpy's or Python's "
            "global random generator, which gathering does not keep apart per seed: the seeds' runs would not be "
            "their own"
        )
