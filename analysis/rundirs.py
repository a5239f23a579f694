"""Find run directories: any directory holding a ``progress.csv``.

The file names of a run directory are :class:`pomdp_ffm.run.rundir.RunDir`'s; this module names the few the analysis
reads and walks a tree of runs for them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from pomdp_ffm.run.rundir import RunDir

PROGRESS = RunDir.PROGRESS
# Hydra's own copy of the composed config is a fallback for runs whose config.yaml is missing.
CONFIG_CANDIDATES = (RunDir.CONFIG, ".hydra/config.yaml")
DONE_MARKER = RunDir.DONE
# Folders of a run directory that never hold runs: not walked, which keeps big trees fast.
_NOT_RUNS = frozenset(
    {Path(RunDir.CHECKPOINT).parts[0], RunDir.SNAPSHOTS, RunDir.TENSORBOARD, "policies", "__pycache__"}
)


def find_run_dirs(roots: Iterable[str | Path]) -> list[tuple[Path, Path]]:
    """All ``(root, run_dir)`` pairs below the given roots, sorted, without duplicates."""
    seen: set[Path] = set()
    out: list[tuple[Path, Path]] = []
    for root in roots:
        root = Path(root)
        if not root.exists():
            raise FileNotFoundError(f"run folder {str(root)!r} does not exist")
        if root.is_file():
            if root.name != PROGRESS:
                raise ValueError(f"{str(root)!r} is a file but not a {PROGRESS}")
            root = root.parent
        walked: set[str] = set()
        # Links are followed (people gather runs from several disks with symlinks); a folder reached twice,
        # e.g. through a link cycle, is walked once.
        for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
            real = os.path.realpath(dirpath)
            if real in walked:
                dirnames[:] = []
                continue
            walked.add(real)
            # Checkpoint and source-copy folders never hold runs; skipping them keeps big trees fast.
            dirnames[:] = sorted(d for d in dirnames if d not in _NOT_RUNS)
            if PROGRESS in filenames:
                run = Path(dirpath)
                key = run.resolve()
                if key not in seen:
                    seen.add(key)
                    out.append((root, run))
    return out
