"""Read FFM decay (alpha) and context (omega) parameters from checkpoints.

Trace durability ``t_alpha = ln(1/beta) / alpha`` is the number of steps after
which a trace has decayed to a fraction ``beta`` of its value (|gamma| =
exp(-alpha) per step); context period ``t_omega = 2 pi / |omega|`` is the
number of steps after which the rotation repeats.  One value per distinct
parameter entry is reported (alpha has m entries, omega c), since the m x c
state only repeats them.

Checkpoints are read with :func:`pomdp_ffm.run.checkpoint.load_checkpoint` only
(``torch.load(weights_only=True)``): loading never executes code from a file.
A file it refuses is reported as a warning naming it and skipped.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from pomdp_ffm.run.checkpoint import CheckpointError, load_checkpoint
from pomdp_ffm.run.rundir import RunDir, RunDirError
from pomdp_ffm.seq_models.ffm import context_period, trace_durability

from . import constants as C

FFM_KEY_RE = re.compile(r"^(?P<module>actor|critic)\..*memory\.(?P<param>alpha|omega)$")
# The reference's FFM (the FFM fork's FFA module, an attribute named ffm at the paper's commit and ffa later) keeps
# the log-decay a = -alpha (clamped to [-limit, -1e-8]) and the frequencies b = omega: actor.rnn.ffa.a, ...
REFERENCE_FFM_KEY_RE = re.compile(r"^(?P<module>actor|critic)\..*\.ff[am]\.(?P<param>a|b)$")
_REFERENCE_PARAMS = {"a": ("alpha", -1.0), "b": ("omega", 1.0)}
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
NO_CHECKPOINT = (
    f"FFM run has no checkpoint (*.pt under {Path(RunDir.CHECKPOINT).parent.as_posix()}/ or {RunDir.SNAPSHOTS}/)"
)


def _ffm_key(key) -> tuple[str, str, float] | None:
    """(module, alpha|omega, sign) of an FFM parameter's key, ours or the reference's; None for other keys
    (target networks' included)."""
    if not isinstance(key, str):
        return None
    m = FFM_KEY_RE.match(key)
    if m is not None:
        return m.group("module"), m.group("param"), 1.0
    m = REFERENCE_FFM_KEY_RE.match(key)
    if m is not None:
        return (m.group("module"), *_REFERENCE_PARAMS[m.group("param")])
    return None


def checkpoint_candidates(run_dir: str | Path) -> list[Path]:
    """The run's checkpoints in the order they are tried: the resume checkpoint (``checkpoints/last.pt``)
    first, then the other ``*.pt`` files (the reference's ``save/agent_*.pt`` snapshots included), most
    recently written first, and the checkpoint written when training diverged last."""
    run = RunDir(run_dir)
    files = [p for p in run.checkpoint_files() if p.is_file()]
    first = [p for p in files if p == run.checkpoint]
    diverged = [p for p in files if p == run / RunDir.DIVERGED]
    rest = sorted(
        (p for p in files if p not in first and p not in diverged),
        key=lambda p: (p.stat().st_mtime_ns, p.name),
        reverse=True,
    )
    return first + rest + diverged


def _load(ckpt: Path) -> dict:
    """:func:`pomdp_ffm.run.checkpoint.load_checkpoint`: tensors and plain containers only, never a full unpickling
    (a file holding anything else raises CheckpointError naming it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's notes on pickle protocols; refusals raise
        return load_checkpoint(ckpt, map_location="cpu")


def _refusal(path: Path, exc: Exception) -> str:
    """Why a checkpoint was skipped, in one line (torch's advice on loading it unsafely left out)."""
    text = _ANSI_RE.sub("", str(exc)).replace(str(path), "the file", 1)
    if "Weights only load failed" in text:
        text = "it holds objects other than tensors and plain containers (code, numpy objects or classes)"
    return f"checkpoint skipped: the tensors-only loader refused it, and it is never unpickled in full; {text}"[:400]


def _state_dict(obj, depth: int = 3) -> dict | None:
    """The dict holding the FFM parameters: ``state["agent"]["modules"]`` in ``checkpoints/last.pt``,
    ``state["agent"]`` in ``save/agent_*.pt`` snapshots, the bare state dict in the reference's snapshots;
    whichever (nested) dict has FFM parameters (``actor.|critic. ... memory.alpha|omega``, or the reference's
    ``.ffa.a|b``)."""
    if not isinstance(obj, dict):
        return None
    if any(_ffm_key(k) is not None for k in obj):
        return obj
    if depth > 0:
        for key in ("agent", "modules", *[k for k in obj if k not in ("agent", "modules")]):
            found = _state_dict(obj.get(key), depth - 1) if key in obj else None
            if found is not None:
                return found
    return None


def ffm_parameters(state: dict) -> dict[tuple[str, str], list[tuple[str, np.ndarray]]]:
    """``{(module, param): [(key, values), ...]}`` for actor/critic FFM alpha/omega (targets excluded; the
    reference's a and b as alpha = -a and omega = b)."""
    out: dict[tuple[str, str], list[tuple[str, np.ndarray]]] = {}
    for key, value in state.items():
        found = _ffm_key(key)
        if found is None:
            continue
        module, param, sign = found
        arr = value.detach().cpu().double().numpy() if hasattr(value, "detach") else np.asarray(value, float)
        out.setdefault((module, param), []).append((key, sign * arr.reshape(-1)))
    return out


def timescales(param: str, values: np.ndarray, beta: float = C.DEFAULT_BETA) -> np.ndarray:
    """Steps for ``alpha`` (trace durability) or ``omega`` (context period); inf where there is no decay/rotation."""
    if not 0 < beta < 1:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    values = np.asarray(values, dtype=float)
    # The formulas are the model's own (FFM.trace_durability, FFM.context_periods); only the entries without
    # decay or rotation are filled in here, as inf rather than a division by zero (or a negative alpha's steps).
    if param == "alpha":
        return np.where(values > 0, trace_durability(np.where(values > 0, values, 1.0), beta), np.inf)
    if param == "omega":
        mag = np.abs(values)
        return np.where(mag > 0, context_period(np.where(mag > 0, mag, 1.0)), np.inf)
    raise ValueError(f"unknown FFM parameter {param!r}; expected 'alpha' or 'omega'")


def load_decay(runs: pd.DataFrame, beta: float = C.DEFAULT_BETA) -> tuple[pd.DataFrame, list[tuple[str, str, str]]]:
    """Timescales of every FFM run in ``runs`` (one row per run: run_id, run_dir, task, algo, model).

    Each run's checkpoints are tried in :func:`checkpoint_candidates` order and the first one holding FFM
    parameters is used.  A file that the tensors-only loader refuses (a pickle with code in it, an old
    format holding numpy objects, a truncated file) is never unpickled in full: it becomes a warning naming
    it, and the next checkpoint of the run is tried.  Returns the long table and ``(path, kind, reason)``
    problems (no checkpoint, refused files, no FFM parameters, non-decaying entries).
    """
    problems: list[tuple[str, str, str]] = []
    frames = []
    ffm = runs[runs["model"].map(C.base_model) == "ffm"].drop_duplicates("run_id")
    for run in ffm.itertuples(index=False):
        candidates = checkpoint_candidates(run.run_dir)
        if not candidates:
            problems.append((run.run_dir, "warning", NO_CHECKPOINT))
            continue
        ckpt = params = None
        for path in candidates:
            try:
                obj = _load(path)
            except (RunDirError, CheckpointError) as exc:
                problems.append((str(path), "warning", _refusal(path, exc)))
                continue
            state = _state_dict(obj)
            found = ffm_parameters(state) if state is not None else {}
            if found:
                ckpt, params = path, found
                break
            problems.append((str(path), "warning", "no actor/critic '...memory.alpha|omega' parameters in checkpoint"))
        if ckpt is None:
            continue
        for (module, param), entries in sorted(params.items()):
            for key, values in entries:
                steps = timescales(param, values, beta)
                n_inf = int(np.isinf(steps).sum())
                if n_inf:
                    what = "alpha <= 0 (no decay)" if param == "alpha" else "omega == 0 (no rotation)"
                    problems.append((str(ckpt), "note", f"{key}: {n_inf} entr(y/ies) with {what}; timescale infinite"))
                frames.append(
                    pd.DataFrame(
                        {
                            "run_id": run.run_id,
                            "task": run.task,
                            "algo": run.algo,
                            "module": module,
                            "param": param,
                            "key": key,
                            "index": np.arange(len(values)),
                            "value": values,
                            "quantity": "t_alpha" if param == "alpha" else "t_omega",
                            "steps": steps,
                            "checkpoint": ckpt.name,
                        }
                    )
                )
    cols = ["run_id", "task", "algo", "module", "param", "key", "index", "value", "quantity", "steps", "checkpoint"]
    return (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)), problems
