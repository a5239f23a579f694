"""Read one run's ``progress.csv`` (our logger's or the reference's) and keep its evaluation rows.

Damaged input never raises: every problem is returned as a ``(kind, reason)`` pair, which
:mod:`analysis.load` files in an :class:`analysis.issues.LoadReport`.  An evaluation whose return is not finite
(NaN, inf, or an eval row with an empty return cell) is left out of the table and reported as a warning naming
its env steps.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pandas as pd

from . import constants as C

# A run of the paper's longest budget writes well under 1 MiB; a file past this is not a run's log.
MAX_PROGRESS_BYTES = 256 << 20


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _looks_like_header(fields: list[str]) -> bool:
    named = [f for f in fields if f.strip()]
    return bool(named) and not any(_is_number(f) for f in named) and any("/" in f for f in named)


def read_progress(path: str | Path) -> tuple[pd.DataFrame | None, list[tuple[str, str]]]:
    """Parse a progress.csv written by our logger or the reference's.

    Returns the rows as floats (None when nothing usable is left) and a list of
    ``(kind, reason)`` problems.  Handles headers rewritten mid-file, padded and
    short rows, blank lines, a truncated last line and non-numeric cells.
    """
    path = Path(path)
    problems: list[tuple[str, str]] = []
    if not path.is_file():
        return None, [("skipped", "not a regular file (a device, a FIFO or a folder)")]
    with open(path, "rb") as f:
        raw = f.read(MAX_PROGRESS_BYTES + 1)
    if len(raw) > MAX_PROGRESS_BYTES:
        return None, [("skipped", f"larger than {MAX_PROGRESS_BYTES >> 20} MiB, far more than a run writes")]
    if not raw:
        return None, [("skipped", "empty file (0 bytes)")]
    text = raw.decode("utf-8", errors="replace")
    if "\ufffd" in text:
        problems.append(("warning", "file is not valid UTF-8; undecodable bytes replaced"))
    lines = text.splitlines()
    numbered = [(i + 1, ln) for i, ln in enumerate(lines) if ln.strip()]
    if not numbered:
        return None, [("skipped", f"no rows: {len(lines)} blank line(s) only")]

    # A writer killed mid-line leaves the last line without its newline; its last
    # value may be cut short even when the field count looks right, so drop it.
    if not text.endswith(("\n", "\r")):
        lineno, last = numbered.pop()
        problems.append(("warning", f"last line {lineno} has no newline (truncated write); dropped: {last[:60]!r}"))

    header: list[str] | None = None
    rows: list[dict[str, float]] = []
    short_rows = long_rows = 0
    bad_cells: list[str] = []
    for lineno, line in numbered:
        fields = next(csv.reader([line]))
        if _looks_like_header(fields):
            if header is not None and fields != header:
                problems.append(("note", f"header rewritten at line {lineno} ({len(header)} -> {len(fields)} columns)"))
            header = fields
            continue
        if header is None:
            return None, [("skipped", f"line {lineno} holds data but no header line came before it")]
        if len(fields) > len(header):
            long_rows += 1
            continue
        if len(fields) < len(header):
            # The reference writer only ever appends new keys, so a short row's
            # fields line up with the first columns of the header.
            short_rows += 1
            fields = fields + [""] * (len(header) - len(fields))
        row: dict[str, float] = {}
        for name, value in zip(header, fields):
            value = value.strip()
            if not value:
                row[name] = math.nan
                continue
            try:
                row[name] = float(value)
            except ValueError:
                row[name] = math.nan
                bad_cells.append(f"{name}={value!r} (line {lineno})")
        rows.append(row)

    if long_rows:
        problems.append(("warning", f"{long_rows} row(s) with more fields than the header dropped (mixed columns)"))
    if short_rows:
        problems.append(("warning", f"{short_rows} row(s) with fewer fields than the header; missing cells left empty"))
    if bad_cells:
        problems.append(("warning", f"{len(bad_cells)} non-numeric cell(s) treated as empty, e.g. {bad_cells[0]}"))
    if header is None:
        return None, problems + [("skipped", "no header line")]
    if not rows:
        return None, problems + [("skipped", "header but no data rows")]
    return pd.DataFrame(rows), problems


def _steps_text(steps, limit: int = 8) -> str:
    """'16000, 20000' (at most ``limit`` values, then how many more)."""
    shown = [f"{s:.0f}" if float(s).is_integer() else f"{s:g}" for s in list(steps)[:limit]]
    more = len(steps) - limit
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def eval_rows(raw: pd.DataFrame) -> tuple[pd.DataFrame, list[tuple[str, str]]]:
    """Keep the evaluation rows in the tidy column names.

    An eval row is a row with an env-step count or an eval return (train rows have
    neither).  Eval rows whose return is not finite (NaN or inf as written by the
    logger, or an empty cell) cannot be scored: they are dropped and reported as
    one warning per run that names their env steps.
    """
    problems: list[tuple[str, str]] = []
    for col in (C.COL_ENV_STEPS, C.COL_RETURN):
        if col not in raw.columns:
            return raw.iloc[0:0], [("skipped", f"no eval rows: column {col!r} missing ({len(raw)} train row(s))")]
    ret = raw[C.COL_RETURN].to_numpy(float)
    has_x = raw[C.COL_ENV_STEPS].notna().to_numpy()
    has_ret = ~np.isnan(ret)
    no_x = has_ret & ~has_x
    if no_x.any():
        problems.append(("warning", f"{int(no_x.sum())} eval row(s) without {C.COL_ENV_STEPS} dropped"))
    bad = has_x & ~np.isfinite(ret)
    if bad.any():
        steps_bad = raw.loc[bad, C.COL_ENV_STEPS].to_numpy(float)
        kinds = [k for k, hit in (("NaN or empty", np.isnan(ret[bad]).any()), ("inf", np.isinf(ret[bad]).any())) if hit]
        problems.append(
            (
                "warning",
                (
                    f"{int(bad.sum())} eval return(s) not finite ({', '.join(kinds)}) at env "
                    f"step(s) {_steps_text(steps_bad)}; left out of scores and curves"
                ),
            )
        )
    keep = has_x & np.isfinite(ret)
    ev = raw.loc[keep].copy()
    if ev.empty:
        if bad.any():
            return ev, problems + [("skipped", f"no eval row with a finite return ({int(bad.sum())} not finite)")]
        return ev, problems + [("skipped", f"no eval rows ({len(raw)} train row(s) only)")]
    steps = ev[C.COL_ENV_STEPS].to_numpy()
    if np.any(np.diff(steps) < 0):
        problems.append(("warning", "env steps go backwards (restarted run appended?); rows sorted by env steps"))
        ev = ev.sort_values(C.COL_ENV_STEPS, kind="stable")
    out = pd.DataFrame(
        {tidy: ev[col].to_numpy() if col in ev.columns else np.nan for col, tidy in C.EVAL_COLUMNS.items()}
    )
    return out, problems
