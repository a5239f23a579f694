"""What a checkpoint holds besides the trainer's own state: every random generator's state and the replay buffer's
arrays, as tensors and plain containers only, so that ``rundir.load_checkpoint`` reads it tensors-only."""
from __future__ import annotations

import random
from typing import Callable

import numpy as np
import torch


def host_rng_state() -> tuple:
    """numpy's and Python's global generators' states."""
    return np.random.get_state(), random.getstate()


def rng_state(env, host_rng: Callable[[], tuple] = host_rng_state) -> dict:
    """torch's (CPU and CUDA), numpy's and Python's generators and the env's. ``host_rng``: numpy's and Python's
    states of the run (a seed of an axis keeps its own apart while another's are the globals)."""
    np_state, py_state = host_rng()
    return {"torch": torch.get_rng_state(), "numpy": _numpy_rng_to_plain(np_state), "python": py_state,
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None, "env": env.rng_state()}


def restore_rng(rng: dict, env) -> None:
    torch.set_rng_state(rng["torch"].cpu())
    np.random.set_state(_numpy_rng_from_plain(rng["numpy"]))
    random.setstate(rng["python"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    # The env resumes at an episode boundary with its RNG where it was: the next reset matches.
    env.set_rng_state(rng["env"])


def arrays_to_tensors(d: dict) -> dict:
    return {k: torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v for k, v in d.items()}


def _numpy_rng_to_plain(state: tuple) -> dict:
    kind, keys, pos, has_gauss, cached = state
    return {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def _numpy_rng_from_plain(d: dict) -> tuple:
    return (d["kind"], d["keys"].numpy().astype(np.uint32), d["pos"], d["has_gauss"], d["cached_gaussian"])
