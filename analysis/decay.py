"""Read FFM decay (alpha) and context (omega) parameters from checkpoints.

Trace durability ``t_alpha = ln(1/beta) / alpha`` is the number of steps after
which a trace has decayed to a fraction ``beta`` of its value (|gamma| =
exp(-alpha) per step); context period ``t_omega = 2 pi / |omega|`` is the
number of steps after which the rotation repeats.  One value per distinct
parameter entry is reported (alpha has m entries, omega c), since the m x c
state only repeats them.
"""

from __future__ import annotations

import math
import pickle
import re
from pathlib import Path

import numpy as np
import pandas as pd

from . import constants as C

FFM_KEY_RE = re.compile(r"^(?P<module>actor|critic)\..*memory\.(?P<param>alpha|omega)$")
CHECKPOINT_DIRS = ("checkpoints", "save")


def _load(ckpt: Path):
    """Tensors-only loading first. Resume checkpoints (checkpoints/last.pt) also hold the replay buffer and
    numpy RNG states, which the tensors-only unpickler refuses; those files are the user's own run outputs
    found under the run directories they named, so they are then loaded in full."""
    import torch  # heavy; only this figure needs it

    try:
        return torch.load(ckpt, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        return torch.load(ckpt, map_location="cpu", weights_only=False)


def newest_checkpoint(run_dir: str | Path) -> Path | None:
    """``checkpoints/last.pt`` if present, else the most recently written ``*.pt`` of the run."""
    run_dir = Path(run_dir)
    last = run_dir / "checkpoints" / "last.pt"
    if last.is_file():
        return last
    found = [p for d in CHECKPOINT_DIRS for p in (run_dir / d).rglob("*.pt") if p.is_file()]
    return max(found, key=lambda p: (p.stat().st_mtime_ns, p.name)) if found else None


def _state_dict(obj) -> dict | None:
    if isinstance(obj, dict) and isinstance(obj.get("agent"), dict):
        return obj["agent"]
    # The reference saves the bare agent state_dict.
    if isinstance(obj, dict) and obj and all(isinstance(k, str) for k in obj):
        return obj
    return None


def ffm_parameters(state: dict) -> dict[tuple[str, str], list[tuple[str, np.ndarray]]]:
    """``{(module, param): [(key, values), ...]}`` for actor/critic FFM alpha/omega (targets excluded)."""
    out: dict[tuple[str, str], list[tuple[str, np.ndarray]]] = {}
    for key, value in state.items():
        m = FFM_KEY_RE.match(key)
        if m is None:
            continue
        arr = value.detach().cpu().double().numpy() if hasattr(value, "detach") else np.asarray(value, float)
        out.setdefault((m.group("module"), m.group("param")), []).append((key, arr.reshape(-1)))
    return out


def timescales(param: str, values: np.ndarray, beta: float = C.DEFAULT_BETA) -> np.ndarray:
    """Steps for ``alpha`` (trace durability) or ``omega`` (context period); inf where there is no decay/rotation."""
    if not 0 < beta < 1:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    values = np.asarray(values, dtype=float)
    with np.errstate(divide="ignore"):
        if param == "alpha":
            return np.where(values > 0, math.log(1 / beta) / np.where(values > 0, values, 1.0), np.inf)
        if param == "omega":
            mag = np.abs(values)
            return np.where(mag > 0, 2 * math.pi / np.where(mag > 0, mag, 1.0), np.inf)
    raise ValueError(f"unknown FFM parameter {param!r}; expected 'alpha' or 'omega'")


def load_decay(runs: pd.DataFrame, beta: float = C.DEFAULT_BETA) -> tuple[pd.DataFrame, list[tuple[str, str, str]]]:
    """Timescales of every FFM run in ``runs`` (one row per run: run_id, run_dir, task, algo, model).

    Returns the long table and ``(path, kind, reason)`` problems (no checkpoint,
    unreadable file, no FFM parameters, non-decaying entries).
    """
    problems: list[tuple[str, str, str]] = []
    frames = []
    ffm = runs[runs["model"].map(C.base_model) == "ffm"].drop_duplicates("run_id")
    for run in ffm.itertuples(index=False):
        ckpt = newest_checkpoint(run.run_dir)
        if ckpt is None:
            problems.append((run.run_dir, "warning", "FFM run has no checkpoint (*.pt under checkpoints/ or save/)"))
            continue
        try:
            obj = _load(ckpt)
        except Exception as exc:  # any unreadable checkpoint is reported, not fatal
            problems.append((str(ckpt), "warning", f"cannot load checkpoint: {type(exc).__name__}: {exc}"[:300]))
            continue
        state = _state_dict(obj)
        params = ffm_parameters(state) if state is not None else {}
        if not params:
            problems.append((str(ckpt), "warning", "no actor/critic '...memory.alpha|omega' parameters in checkpoint"))
            continue
        for (module, param), entries in sorted(params.items()):
            for key, values in entries:
                steps = timescales(param, values, beta)
                n_inf = int(np.isinf(steps).sum())
                if n_inf:
                    what = "alpha <= 0 (no decay)" if param == "alpha" else "omega == 0 (no rotation)"
                    problems.append((str(ckpt), "note", f"{key}: {n_inf} entr(y/ies) with {what}; timescale infinite"))
                frames.append(pd.DataFrame({
                    "run_id": run.run_id, "task": run.task, "algo": run.algo, "module": module, "param": param,
                    "key": key, "index": np.arange(len(values)), "value": values,
                    "quantity": "t_alpha" if param == "alpha" else "t_omega", "steps": steps,
                    "checkpoint": ckpt.name,
                }))
    cols = ["run_id", "task", "algo", "module", "param", "key", "index", "value", "quantity", "steps", "checkpoint"]
    return (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)), problems
