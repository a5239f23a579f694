"""The on-disk cache of the tidy table (:func:`analysis.load.load_runs`): its key and its JSON form.

Nothing is ever unpickled: the cache is JSON with explicit column types, so a cache folder that came with a tree
of runs cannot run code.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd

from pomdp_ffm.run.rundir import RunDir

from . import constants as C
from .columns import TABLE_COLUMNS
from .issues import LoadReport
from .rundirs import CONFIG_CANDIDATES, DONE_MARKER, PROGRESS

# Bump when the table layout or parsing rules change so old caches are ignored.
CACHE_VERSION = 5
CACHE_FORMAT = "pomdp-ffm analysis cache"


def fingerprint(pairs: list[tuple[Path, Path]]) -> str:
    """The cache key of these runs: a hash of each input file's path, mtime and size."""
    h = hashlib.sha256(f"v{CACHE_VERSION}".encode())
    for root, run in pairs:
        # The paths as given too: the report's paths are written as they were found (relative ones from the
        # working directory), so another working directory reads the runs again rather than another's report.
        h.update(f"|{root.resolve()}|{run.resolve()}|{root}|{run}".encode())
        for rel in (PROGRESS, DONE_MARKER, RunDir.ERROR, RunDir.DIVERGED, *CONFIG_CANDIDATES):
            p = run / rel
            if p.exists():
                st = p.stat()
                h.update(f"|{rel}:{st.st_mtime_ns}:{st.st_size}".encode())
        for p in sorted(run.glob("variant_*.yml")):
            st = p.stat()
            h.update(f"|{p.name}:{st.st_mtime_ns}:{st.st_size}".encode())
        if (run / RunDir.LOCK).exists():  # a run's status says whether a process holds its lock
            try:
                h.update(f"|held:{RunDir(run).holder() is not None}".encode())
            except OSError:
                h.update(b"|held:?")
    return h.hexdigest()[:20]


# Per-run constants and per-evaluation values: the cache stores the former once per run.
_ROW_COLUMNS = list(C.EVAL_COLUMNS.values())
_META_COLUMNS = [c for c in TABLE_COLUMNS if c not in _ROW_COLUMNS]


def cache_text(table: pd.DataFrame, report: LoadReport) -> str | None:
    """The table and report as JSON: one entry per run for the per-run columns, flat lists for the rest.

    None when the table is not made of one block of rows per run (it always is when built here)."""
    ids = table["run_id"].to_numpy(object)
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    lengths = np.diff(np.r_[starts, len(ids)])
    if len(set(ids[starts])) != len(starts):
        return None
    runs = {}
    for c in _META_COLUMNS:
        col = table[c].reset_index(drop=True)
        first = col.iloc[starts].reset_index(drop=True)
        if not col.equals(first.repeat(lengths).reset_index(drop=True)):
            return None
        runs[c] = [
            None if pd.isna(v) else (bool(v) if c == "finished" else int(v) if c == "seed" else str(v)) for v in first
        ]
    rows = {c: table[c].to_numpy(float).tolist() for c in _ROW_COLUMNS}
    return json.dumps(
        {
            "format": CACHE_FORMAT,
            "version": CACHE_VERSION,
            "run_lengths": lengths.tolist(),
            "runs": runs,
            "rows": rows,
            "report": {
                "found": report.n_runs_found,
                "loaded": report.n_runs_loaded,
                "issues": [asdict(i) for i in report.issues],
            },
        }
    )


def _check_list(value, n: int, types: tuple, what: str) -> list:
    if not isinstance(value, list) or len(value) != n or not all(v is None or isinstance(v, types) for v in value):
        raise ValueError(f"cache field {what} is not a list of {n} {types}")
    return value


def table_from_cache(text: str) -> tuple[pd.DataFrame, LoadReport]:
    """Inverse of :func:`cache_text`; raises ValueError (or KeyError/TypeError) on anything unexpected."""
    data = json.loads(text)
    if data.get("format") != CACHE_FORMAT or data.get("version") != CACHE_VERSION:
        raise ValueError("not a cache of this version")
    lengths = data["run_lengths"]
    if not isinstance(lengths, list) or not all(isinstance(n, int) and n > 0 for n in lengths):
        raise ValueError("bad run_lengths")
    n_rows = sum(lengths)
    cols: dict = {}
    for c in _META_COLUMNS:
        types = (bool,) if c == "finished" else (int,) if c == "seed" else (str,)
        values = _check_list(data["runs"][c], len(lengths), types, c)
        expanded = np.repeat(np.array(values, dtype=object), lengths)
        dtype = "boolean" if c == "finished" else "Int64" if c == "seed" else object
        cols[c] = pd.array(expanded, dtype=dtype) if dtype is not object else expanded
    for c in _ROW_COLUMNS:
        values = np.array(data["rows"][c], dtype=float)  # None -> NaN; anything but numbers raises
        if values.shape != (n_rows,):
            raise ValueError(f"cache field {c} has shape {values.shape}, expected ({n_rows},)")
        cols[c] = values
    table = pd.DataFrame({c: cols[c] for c in TABLE_COLUMNS})
    rep = data["report"]
    report = LoadReport(n_runs_found=int(rep["found"]), n_runs_loaded=int(rep["loaded"]))
    for i in rep["issues"]:
        report.add(str(i["path"]), str(i["kind"]), str(i["reason"]))
    return table, report
