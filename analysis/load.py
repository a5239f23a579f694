"""Discover run directories and turn them into one tidy table of evaluations.

A run directory is any directory holding a ``progress.csv`` (the file names of
a run directory are :class:`pomdp_ffm.rundir.RunDir`'s).  Metadata (task,
algorithm, memory model, seed) comes from the resolved config when there is
one (``config.yaml``, then Hydra's ``.hydra/config.yaml``, then the reference
implementation's ``variant_<pid>.yml``) and from the path otherwise, so that
runs of this project and of the reference implementation can be analysed side
by side.

Damaged input never raises: every problem becomes an :class:`analysis.issues.Issue` in a
:class:`analysis.issues.LoadReport`, which says whether the whole run was skipped or only some
rows were, and why.  An evaluation whose return is not finite (NaN, inf, or an
eval row with an empty return cell) is left out of the table and reported as a
warning naming the run and its env steps.

Nothing is ever unpickled: the cache (:func:`load_runs`) is JSON with explicit
column types, so a cache folder that came with a tree of runs cannot run code.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import re
from dataclasses import asdict
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd
import yaml

from pomdp_ffm.config import learning_settings
from pomdp_ffm.rundir import RunDir

from . import constants as C
from .issues import LoadReport

PROGRESS = RunDir.PROGRESS
# Hydra's own copy of the composed config is a fallback for runs whose config.yaml is missing.
CONFIG_CANDIDATES = (RunDir.CONFIG, ".hydra/config.yaml")
DONE_MARKER = RunDir.DONE
# Folders of a run directory that never hold runs: not walked, which keeps big trees fast.
_NOT_RUNS = frozenset({Path(RunDir.CHECKPOINT).parts[0], RunDir.SNAPSHOTS, RunDir.TENSORBOARD, "policies",
                       "__pycache__"})
# Bump when the table layout or parsing rules change so old caches are ignored.
CACHE_VERSION = 5
CACHE_FORMAT = "pomdp-ffm analysis cache"

TABLE_COLUMNS = [
    "run_id", "source", "task", "family", "obs", "algo", "model", "model_label",
    "seed", "trial", "finished", "status", "env_steps", "eval_return", "rl_steps", "rollouts",
    "eval_episode_len", "success_rate", "time_cost_s", "fps", "run_dir",
]

# The reference's algorithm folder (its run name): an oracle_ prefix (the agent sees the full state), the number of
# recurrent layers where not 1, and _shared (one memory for actor and critic) make other agents than the plain
# <algo>_<model>, so they are filed as model variants (C.model_variant), never pooled with it.
_ALGO_MODEL_RE = re.compile(
    r"^(?P<oracle>oracle_)?(?P<algo>sacd|sac|td3)_(?P<layers>\d*)(?P<model>ffm|gru|lstm|mlp)(?:-mlp)?"
    r"(?P<shared>_shared)?$"
)
_MARKOVIAN_RE = re.compile(r"^(?P<kind>Markovian|oracle)_(?P<algo>sacd|sac|td3)$")
_SEED_RE = re.compile(r"^seed[-_=]?(?P<seed>\d+)$")


# --------------------------------------------------------------------------- discovery

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


# --------------------------------------------------------------------------- progress.csv
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
        kinds = [k for k, hit in (("NaN or empty", np.isnan(ret[bad]).any()), ("inf", np.isinf(ret[bad]).any()))
                 if hit]
        problems.append(("warning", f"{int(bad.sum())} eval return(s) not finite ({', '.join(kinds)}) at env "
                                    f"step(s) {_steps_text(steps_bad)}; left out of scores and curves"))
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
    out = pd.DataFrame({tidy: ev[col].to_numpy() if col in ev.columns else np.nan
                        for col, tidy in C.EVAL_COLUMNS.items()})
    return out, problems


# --------------------------------------------------------------------------- metadata

def _config_files(run_dir: Path) -> list[Path]:
    found = [run_dir / c for c in CONFIG_CANDIDATES if (run_dir / c).is_file()]
    variants = sorted(run_dir.glob("variant_*.yml"), key=lambda p: (p.stat().st_mtime_ns, p.name))
    return found + variants[::-1]


def _get(cfg: dict, dotted: str):
    cur = cfg
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def parse_run_path(parts: list[str]) -> dict:
    """Metadata that can be read off a run's path components (ours or the reference's layout)."""
    meta: dict = {}
    for i, comp in enumerate(parts):
        if "task" not in meta and C.parse_task(comp):
            meta["task"] = comp
        if comp in ("P", "V", "F") and i > 0 and "task" not in meta and re.fullmatch(r"[A-Za-z0-9]+", parts[i - 1]):
            if i + 1 < len(parts) and (_ALGO_MODEL_RE.match(parts[i + 1]) or _MARKOVIAN_RE.match(parts[i + 1])):
                meta["task"] = f"{parts[i - 1]}-{comp}-v0"
                meta["layout"] = "reference"
        m = _ALGO_MODEL_RE.match(comp)
        if m and "algo" not in meta:
            tags = (["oracle"] if m.group("oracle") else []) + \
                ([f"{m.group('layers')}layer"] if m.group("layers") not in ("", "1") else []) + \
                (["shared"] if m.group("shared") else [])
            meta["algo"], meta["model"] = m.group("algo"), C.model_variant(m.group("model"), tags)
        m = _MARKOVIAN_RE.match(comp)
        if m and "algo" not in meta:
            # The reference's observation-only agent, not our seq_model=mlp (patches/012): its own label; with
            # oracle_, the same agent on the full state (the reference's Oracle).
            meta["algo"], meta["model"] = m.group("algo"), "markovian" if m.group("kind") == "Markovian" else "oracle"
        m = _SEED_RE.match(comp)
        if m and "seed" not in meta:
            meta["seed"] = int(m.group("seed"))
    return meta


def read_run_metadata(root: Path, run_dir: Path) -> tuple[dict | None, list[tuple[str, str]]]:
    """task/algo/model/seed/source of one run, with problems found on the way."""
    problems: list[tuple[str, str]] = []
    cfg: dict | None = None
    cfg_file: Path | None = None
    for candidate in _config_files(run_dir):
        try:
            loaded = yaml.safe_load(candidate.read_text(errors="replace"))
        except yaml.YAMLError as exc:
            problems.append(("warning", f"config {candidate.name} is not valid YAML ({type(exc).__name__}); ignored"))
            continue
        if not isinstance(loaded, dict):
            problems.append(("warning", f"config {candidate.name} is not a mapping; ignored"))
            continue
        cfg, cfg_file = loaded, candidate
        break

    # Absolute but not resolved: a run reached through a symlink keeps the names of the path it was found by.
    run_abs, root_abs = Path(os.path.abspath(run_dir)), Path(os.path.abspath(root))
    rel = run_abs.relative_to(root_abs) if run_abs != root_abs else Path()
    parts = [root_abs.name, *rel.parts]
    from_path = parse_run_path(parts)
    is_reference = ((cfg_file is not None and cfg_file.name.startswith("variant_"))
                    or from_path.get("layout") == "reference")
    meta: dict = {}
    if cfg is not None:
        meta = {"task": _get(cfg, "env.env_name"), "algo": _get(cfg, "policy.algo_name"),
                "model": _get(cfg, "policy.seq_model"), "seed": _get(cfg, "seed")}
        missing = [k for k in ("task", "algo", "model") if meta[k] is None]
        if missing:
            problems.append(("warning", f"config {cfg_file.name} lacks {', '.join(missing)}; taken from the path"))
        if is_reference and from_path.get("model") is not None:
            # The reference's run name says which agent it is (Markovian, oracle, layers, shared memory); its
            # config's seq_model names only the memory (mlp for the Markovian agent).
            said, named = meta["model"], from_path["model"]
            if said is not None and str(said).lower().removesuffix("-mlp") not in (C.memory_of(named), "mlp"):
                problems.append(("warning", f"config {cfg_file.name} says seq_model {said!r} but the run's folder "
                                            f"says {named!r}; the folder's is used"))
            meta["model"] = named
        for k, v in from_path.items():
            if meta.get(k) is None:
                meta[k] = v
    else:
        problems.append(("warning", f"no config file ({', '.join(CONFIG_CANDIDATES)}, variant_*.yml); "
                                    "metadata parsed from the path"))
        meta = dict(from_path)
    meta["source"] = "reference" if is_reference else "ours"

    missing = [k for k in ("task", "algo", "model") if meta.get(k) in (None, "")]
    if missing:
        return None, problems + [("skipped", f"cannot determine {', '.join(missing)} from config or path")]
    meta["task"], meta["algo"], meta["model"] = str(meta["task"]), str(meta["algo"]).lower(), str(meta["model"]).lower()
    if meta["model"].endswith("-mlp"):
        meta["model"] = meta["model"][: -len("-mlp")]
    if meta["algo"] not in C.KNOWN_ALGOS:
        problems.append(("warning", f"unknown algorithm {meta['algo']!r}; kept as is"))
    if C.memory_of(meta["model"]) not in C.KNOWN_MODELS:
        problems.append(("warning", f"unknown memory model {meta['model']!r}; kept as is"))

    seed = meta.get("seed")
    if seed is not None:
        try:
            seed = int(seed)
        except (TypeError, ValueError):
            problems.append(("warning", f"seed {seed!r} is not an integer; ignored"))
            seed = None
    meta["seed"] = seed
    if seed is None:
        meta["trial"] = run_dir.name
        problems.append(("warning", f"no seed; trial id taken from folder name {run_dir.name!r}"))
    else:
        meta["trial"] = f"seed-{seed}"

    # Only our engine writes DONE; for the reference layout completion is unknown.
    meta["status"], problem = _status(run_dir) if meta["source"] == "ours" else ("unknown", None)
    meta["finished"] = meta["status"] == "done" if meta["source"] == "ours" else pd.NA
    if problem:
        problems.append(("warning", problem))
    meta["setup"] = _setup(cfg, parts, is_reference)
    meta["run_id"] = "/".join(parts)
    return meta, problems


def _status(run_dir: Path) -> tuple[str, str | None]:
    """One of our runs: done, running, diverged, failed or unfinished (RunDir.status, a reference run's is
    unknown), and a warning for the two that ended in an error, which are analysed as far as they got (a diverged
    run's evaluations are its own result)."""
    try:
        status = RunDir(run_dir).status()
    except OSError:  # a lock file that cannot be read: its files alone say the rest
        status = "done" if (run_dir / DONE_MARKER).exists() else None
    if status in ("done", "running"):
        return status, None
    error = run_dir / RunDir.ERROR
    last = ""
    if error.is_file():
        lines = [ln.strip() for ln in error.read_text(errors="replace").splitlines() if ln.strip()]
        last = f" ({lines[-1][:120]})" if lines else ""
    if (run_dir / RunDir.DIVERGED).exists():
        return "diverged", (f"diverged{last}: its evaluations before the divergence are analysed as its result "
                            f"(its last state is {RunDir.DIVERGED})")
    if error.is_file():
        return "failed", (f"failed{last}: analysed as far as it got; {RunDir.ERROR} has the traceback, and a "
                          "rerun with resume=true continues it")
    return "unfinished", None


def _setup(cfg: dict | None, parts: list[str], is_reference: bool) -> dict:
    """What makes a run the experiment it is, to tell runs pooled in one group apart: our config's settings that
    change what a run learns (pomdp_ffm.config.learning_settings) but its seed, or the reference's run name (its
    folders between the algorithm's and the timestamp encode the discount, sequence length, batch size, update
    ratio and inputs)."""
    if is_reference:
        at = next((i for i, p in enumerate(parts) if _ALGO_MODEL_RE.match(p) or _MARKOVIAN_RE.match(p)), None)
        return {"run name": "/".join(parts[at + 1:-1])} if at is not None and len(parts) > at + 2 else {}
    if cfg is None:
        return {}
    settings = learning_settings(cfg)
    settings.pop("seed", None)
    return settings


# --------------------------------------------------------------------------- table

def _load_one(root: Path, run_dir: Path, report: LoadReport) -> tuple[pd.DataFrame, dict] | None:
    """The run's evaluation rows, and its setup (``_setup``); None where the run is skipped."""
    progress = run_dir / PROGRESS

    def record(problems):
        for kind, reason in problems:
            report.add(progress, kind, reason)
        return any(kind == "skipped" for kind, _ in problems)

    try:
        raw, problems = read_progress(progress)
    except OSError as exc:
        report.add(progress, "skipped", f"cannot read file: {exc}")
        return None
    if record(problems) or raw is None:
        return None
    ev, problems = eval_rows(raw)
    if record(problems):
        return None
    meta, problems = read_run_metadata(root, run_dir)
    if record(problems) or meta is None:
        return None
    parsed = C.parse_task(meta["task"])
    if parsed is None:
        report.add(progress, "warning", f"task id {meta['task']!r} is not of the form <Family>-<F|P|V>-v<k>")
    for key in ("run_id", "source", "task", "algo", "model", "trial", "finished", "status"):
        ev[key] = meta[key]
    ev["family"], ev["obs"] = parsed if parsed else (meta["task"], "")
    ev["model_label"] = C.model_label(meta["model"])
    ev["seed"] = pd.array([meta["seed"]] * len(ev), dtype="Int64")
    # Absolute (not resolved, as run_id): the table and its cache mean the same folder from any working directory.
    ev["run_dir"] = Path(os.path.abspath(run_dir)).as_posix()
    return ev[TABLE_COLUMNS], meta["setup"]


def _warn_duplicates(table: pd.DataFrame, report: LoadReport) -> None:
    runs = table.drop_duplicates("run_id")
    dup = runs[runs["seed"].notna()].groupby(["source", "task", "algo", "model", "seed"])["run_id"].nunique()
    for (source, task, algo, model, seed), n in dup[dup > 1].items():
        report.add(f"{task}/{algo}_{model} ({source})", "warning",
                   f"seed {seed} appears in {n} runs; each is kept as a separate trial")


def _warn_mixed_setups(table: pd.DataFrame, setups: dict[str, dict], report: LoadReport) -> None:
    """A group (source, task, algo, model) whose runs differ in more than their seed and run-local settings pools
    several experiments (a sweep over a hyperparameter, another config of the same agent): say which settings
    differ and how many runs have each value, since the group's statistics mix them."""
    runs = table.drop_duplicates("run_id")
    for (source, task, algo, model), g in runs.groupby(["source", "task", "algo", "model"], sort=True):
        cfgs = [setups.get(r, {}) for r in g["run_id"]]
        keys = sorted({k for c in cfgs for k in c})
        differ = []
        for k in keys:
            values = [json.dumps(c.get(k, "<absent>"), default=str) for c in cfgs]
            if len(set(values)) > 1:
                counts = pd.Series(values).value_counts(sort=False)
                differ.append(f"{k}: " + ", ".join(f"{v} ({n} run{'s' if n > 1 else ''})" for v, n in counts.items()))
        if differ:
            more = f"; and {len(differ) - 3} more setting(s)" if len(differ) > 3 else ""
            report.add(f"{task}/{algo}_{model} ({source})", "warning",
                       f"its runs differ in more than the seed, yet are pooled as one group: {'; '.join(differ[:3])}"
                       f"{more}. Analyse the experiments' folders apart to compare them")


def build_table(roots: Iterable[str | Path]) -> tuple[pd.DataFrame, LoadReport]:
    """Read every run below ``roots`` into one tidy table (one row per evaluation)."""
    report = LoadReport()
    pairs = find_run_dirs(roots)
    report.n_runs_found = len(pairs)
    loaded = [x for root, run in pairs if (x := _load_one(root, run, report)) is not None]
    frames = [f for f, _ in loaded]
    setups = {f["run_id"].iloc[0]: setup for f, setup in loaded}
    report.n_runs_loaded = len(frames)
    if not pairs:
        report.add(", ".join(str(r) for r in roots), "warning", f"no {PROGRESS} found")
    table = pd.concat(frames, ignore_index=True) if frames else empty_table()
    table["finished"] = table["finished"].astype("boolean")
    table["seed"] = table["seed"].astype("Int64")
    _warn_duplicates(table, report)
    _warn_mixed_setups(table, setups, report)
    return table, report


def empty_table() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="float64") for c in TABLE_COLUMNS})


def _fingerprint(pairs: list[tuple[Path, Path]]) -> str:
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


def _cache_text(table: pd.DataFrame, report: LoadReport) -> str | None:
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
        runs[c] = [None if pd.isna(v) else (bool(v) if c == "finished" else int(v) if c == "seed" else str(v))
                   for v in first]
    rows = {c: table[c].to_numpy(float).tolist() for c in _ROW_COLUMNS}
    return json.dumps({"format": CACHE_FORMAT, "version": CACHE_VERSION, "run_lengths": lengths.tolist(),
                       "runs": runs, "rows": rows,
                       "report": {"found": report.n_runs_found, "loaded": report.n_runs_loaded,
                                  "issues": [asdict(i) for i in report.issues]}})


def _check_list(value, n: int, types: tuple, what: str) -> list:
    if not isinstance(value, list) or len(value) != n or not all(v is None or isinstance(v, types) for v in value):
        raise ValueError(f"cache field {what} is not a list of {n} {types}")
    return value


def _table_from_cache(text: str) -> tuple[pd.DataFrame, LoadReport]:
    """Inverse of :func:`_cache_text`; raises ValueError (or KeyError/TypeError) on anything unexpected."""
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
        cols[c] = pd.array(expanded, dtype=dtype) if dtype != object else expanded
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


def load_runs(roots: Iterable[str | Path], cache_dir: str | Path | None = None) -> tuple[pd.DataFrame, LoadReport]:
    """:func:`build_table` with an on-disk cache.

    The cache file name is a hash of every input file's path, mtime and size,
    so any change to the inputs selects a different (missing) cache entry;
    stale data cannot be served.  The cache is JSON read with ``json.loads``
    and checked field by field (never a pickle, so a cache folder that came
    with a tree of runs cannot execute code); an unreadable or unexpected
    cache file is ignored and rewritten.  Reading it takes a tenth or less of
    the time of parsing the progress.csv files it stands for (320 runs, 600k
    progress.csv lines: 0.2-0.5 s against 4-10 s).
    """
    roots = list(roots)
    if cache_dir is None:
        return build_table(roots)
    cache_dir = Path(cache_dir)
    key = _fingerprint(find_run_dirs(roots))
    path = cache_dir / f"runs-{key}.json"
    if path.is_file():
        try:
            return _table_from_cache(path.read_text())
        except (ValueError, KeyError, TypeError, AttributeError, OSError, RecursionError):
            pass  # a corrupt or foreign cache is only a missed shortcut
    table, report = build_table(roots)
    text = _cache_text(table, report) if len(table) else None
    cache_dir.mkdir(parents=True, exist_ok=True)
    for old in cache_dir.glob("runs-*"):
        if old.is_file():
            old.unlink()
    if text is not None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return table, report


def export_table(table: pd.DataFrame, path: str | Path) -> Path:
    """Write the tidy table as CSV or Parquet, chosen by the file extension."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".csv":
        table.to_csv(path, index=False)
    elif path.suffix in (".parquet", ".pq"):
        table.to_parquet(path, index=False)
    else:
        raise ValueError(f"unsupported table format {path.suffix!r} for {str(path)!r}; use .csv or .parquet")
    return path


def separate_sources(table: pd.DataFrame) -> pd.DataFrame:
    """Tag reference-implementation runs so they form their own groups (e.g. "GRU (ref)").

    Runs of two code bases are different experiments even with the same task,
    algorithm and model, so they are only pooled when the user asks for it.
    """
    out = table.copy()
    ref = out["source"] == "reference"
    out.loc[ref, "model"] = out.loc[ref, "model"] + C.REF_SUFFIX
    out["model_label"] = out["model"].map(C.model_label)
    return out
