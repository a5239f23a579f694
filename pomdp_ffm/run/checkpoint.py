"""Reading a run's checkpoint: tensors-only (a downloaded tree of runs cannot run code), in the format this version
resumes, and where a file cannot be read, what the file is, named in one line (``CheckpointError``)."""

from __future__ import annotations

import pickle
import re
import warnings
import zipfile
from pathlib import Path

CHECKPOINT_FORMAT = 4  # the layout of checkpoints/last.pt that this version writes and resumes (4: the buffer keeps
# each slot's step in its episode)


class CheckpointError(RuntimeError):
    """A file that cannot be read as a checkpoint of this project; the message names it and why."""


def other_format(path: Path, state: dict) -> str | None:
    """Why ``state`` (from ``path``) is not a checkpoint this version resumes, else None; its config copy (a start
    checks config.yaml against it, restore-config writes it) is then not used either."""
    if (fmt := state.get("format")) == CHECKPOINT_FORMAT and isinstance(state.get("config"), dict):
        return None
    return f"{path} was written by another version of pomdp-ffm (format {fmt!r}, this one reads {CHECKPOINT_FORMAT})"


def load_checkpoint(path: str | Path, map_location="cpu", mmap: bool = False) -> dict:
    """A checkpoint, loaded tensors-only (a downloaded tree of runs cannot run code); else CheckpointError."""
    import torch

    path = Path(path)
    try:
        with warnings.catch_warnings():  # torch warns about the pickle protocol of files it then refuses
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except FileNotFoundError:
        raise CheckpointError(f"{path} does not exist") from None
    except (
        pickle.UnpicklingError,
        RuntimeError,
        EOFError,
        zipfile.BadZipFile,
        ValueError,
        OSError,
        AttributeError,
        TypeError,
    ) as e:
        why = _why(e)
        # torch's reason for a file that is no torch.save archive at all is about torch's internals ("mmap can only
        # be used with files saved with _use_new_zipfile_serialization=True"): name what the file is instead. (A
        # pickle that names a Python object keeps its reason: it says more.)
        what = None if why.startswith("it holds the Python object") else _not_saved_by_torch(path)
        if what is not None:
            why = what
        raise CheckpointError(f"{path} cannot be read as a tensors-only checkpoint ({why})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not a checkpoint dict")
    return state


def _not_saved_by_torch(path: Path) -> str | None:
    """Why the file at ``path`` cannot be a checkpoint this project wrote, found from its size and zip index: each is
    torch.save's zip archive, a folder holding data.pkl. None where it may be one."""
    try:
        if path.stat().st_size == 0:
            return "an empty file, not a checkpoint pomdp-ffm wrote"
        if not zipfile.is_zipfile(path):
            return (
                "not a checkpoint pomdp-ffm wrote: not the zip archive torch.save writes, but another program's "
                "file or one cut short"
            )
        with zipfile.ZipFile(path) as z:
            if not any(n.count("/") == 1 and n.endswith("/data.pkl") for n in z.namelist()):
                return "not a checkpoint pomdp-ffm wrote: a zip archive, but one without torch.save's data.pkl"
    except (OSError, zipfile.BadZipFile):
        return None  # (torch's reason stands)
    return None


def _why(e: Exception) -> str:
    """The loader error's reason, without torch's opening advice to load the file unsafely."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    if m := re.search(r"unsupported global:? GLOBAL (\S+)", text, re.IGNORECASE):
        return f"it holds the Python object {m.group(1).rstrip('.,')}, which a tensors-only checkpoint never does"
    if "Weights only load failed" in text:
        tail = text.partition("WeightsUnpickler error:")[2]
        reason = next((ln.strip() for ln in tail.splitlines() if ln.strip()), "")
        if reason.startswith("Unsupported operand"):
            return "it is not a tensors-only checkpoint: the safe unpickler stopped at an instruction it refuses"
        return f"the safe unpickler refused it: {reason[:120]}" if reason else "the safe unpickler refused it"
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), type(e).__name__)[:160]
