"""POMDP-Baselines' published results as groups beside the runs (``--published results/data/pomdp``).

The reference released its learning curves (the ``data.zip`` its docs/plot_curves.md links), one
``final.csv`` per task at ``<root>/<Env>/<P|V>/final.csv`` (``HopperBLT/P``), as its scripts/merge_csv.py
writes them (docs/reference.md#reference-plots): one row per run and grid point with ``env_steps`` (a fixed
grid, from 12000 every 4000 steps on the BLT tasks), ``return`` (the evaluation return interpolated to that
grid and rounded to 2 decimals), ``trial`` (the run's time-stamp folder), ``method`` (``ours`` for the
reference's recurrent agent, else a compared method's name: ``ppo_gru``, ``a2c_gru``, ``VRM``), the variant
tags ``RL``, ``Encoder``, ``Len``, ``Inputs``, ``Arch``, and diagnostics this analysis does not read. A
variant of the reference's agent is named by its tags, ``td3-gru-64-oa-separate``; a compared method by its
name. The ``rundown*.csv`` / ``rank*.csv`` summaries beside them are not read: scores are computed from the
curves with this project's rules.

Reading never executes anything: a file is read as text (at most ``MAX_BYTES``) with the csv module, every
name in it must be a plain token, and anything else is named, skipped and counted like a damaged run.
"""

from __future__ import annotations

import csv
import io
import os
import re
import stat
from pathlib import Path

import numpy as np
import pandas as pd

from . import constants as C
from . import stats
from .columns import TABLE_COLUMNS

FILE_NAME = "final.csv"
# The biggest final.csv of the release is a few MB (about 25 variants x 5 trials x 377 grid points, and the
# compared methods); the bound only keeps a stray or crafted file from filling memory.
MAX_BYTES = 256 * 2**20
REQUIRED = ("env_steps", "return", "trial", "method")
VARIANT_TAGS = ("RL", "Encoder", "Len", "Inputs", "Arch")
OWN_METHOD = "ours"  # merge_csv.py's method for the reference's own agent
# Names read from a file go into labels, tables, report.md and the console: plain tokens only.
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:+-]{0,79}$")
_FAMILY_RE = re.compile(r"^[A-Za-z0-9]+$")

# The tuned config per task family, as the reference's configs/pomdp/<env>/<p|v>/rnn.yml name it: the RNN the
# FFM paper compared with (docs/reference.md#paper-runs; TD3 by --algo td3 on the same file). The 8 BLT files
# agree: a GRU, sampled_seq_len 64, action, observation and reward embeddings (inputs "oar"), separate actor and
# critic. Pendulum-V's is an LSTM on whole episodes (len -1, which merge_csv.py writes as the 200-step episode).
TUNED_RNN = {"BLT": "gru-64-oar-separate", "Pendulum": "lstm-200-oar-separate"}
SELECT_KEYWORDS = ("config", "best", "all")
DEFAULT_SELECT = "config"

STACK = (
    "The published runs used gym 0.21 with the pybullet_envs of pybullet 3.1.0; ours use Gymnasium with "
    "pybullet-envs-gymnasium on pybullet 3.2.7, whose engine parts from 3.1.0's at the first contact "
    "(patches/006-gymnasium-envs.md), so the two sides are compared as distributions of returns, never run "
    "by run."
)
GRID = (
    "The published curves are the reference's merge of its runs: each run's evaluations linearly interpolated "
    "to a grid (from 12000 env steps every 4000 on the BLT tasks) and rounded to 2 decimals; the first and last "
    "values are held beyond the run's evaluations. Their scores are computed on that grid with the same rules as "
    "ours, so a published run's best so far is the best grid value, which is below its best evaluation where "
    "that fell between grid points."
)


def tuned_config(task: str) -> str | None:
    """The tuned rnn.yml's variant (without the algorithm) for a task id, None where the reference has none."""
    parsed = C.parse_task(task)
    if parsed is None:
        return None
    family = parsed[0]
    return TUNED_RNN["BLT"] if family.endswith("BLT") else TUNED_RNN.get(family)


def find_files(roots) -> list[Path]:
    """Every final.csv below the roots (a root may be a final.csv), the roots in the order given (the first
    root's copy of a task is the one read), each sorted; FileNotFoundError for a missing root."""
    found = []
    for root in map(Path, roots):
        if not root.exists():
            raise FileNotFoundError(f"no such --published folder: {root}")
        if root.is_file():
            found.append(root)
            continue
        below = []
        for dirpath, _, filenames in os.walk(root):
            below += [Path(dirpath) / FILE_NAME] if FILE_NAME in filenames else []
        found += sorted(below)
    return list(dict.fromkeys(found))


def task_of(path: Path) -> str | None:
    """``HopperBLT/P/final.csv`` -> ``HopperBLT-P-v0``; None for a file elsewhere."""
    obs, family = path.parent.name, path.parent.parent.name
    return f"{family}-{obs}-v0" if obs in ("F", "P", "V") and _FAMILY_RE.match(family) else None


def read_text(path: Path, max_bytes: int) -> tuple[str | None, list[tuple[str, str]]]:
    """A results file as text, never more than ``max_bytes`` read, bytes that are not UTF-8 replaced (U+FFFD) with a
    warning; None and why where it cannot be one (also the benchmark CSVs' reader, analysis.bench)."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            return None, [("skipped", "not a regular file")]
        if info.st_size > max_bytes:
            return None, [("skipped", f"{info.st_size} bytes, over the limit of {max_bytes} for a published file")]
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as exc:
        return None, [("skipped", f"cannot read file: {exc.strerror or exc}")]
    if len(raw) > max_bytes:
        return None, [("skipped", f"grew past the limit of {max_bytes} bytes while read")]
    if not raw.strip():
        return None, [("skipped", "empty file")]
    text = raw.decode("utf-8", errors="replace")
    return text, [("warning", "not valid UTF-8; undecodable bytes replaced")] if "\ufffd" in text else []


def _rows(text: str) -> tuple[pd.DataFrame | None, list[tuple[str, str]]]:
    """The file's rows as strings under its header; rows with another number of fields are dropped."""
    try:
        reader = csv.reader(io.StringIO(text, newline=""))
        header = next(reader, None)
        rows = [r for r in reader if r]
    except csv.Error as exc:
        return None, [("skipped", f"not a readable CSV: {exc}")]
    if not header or len(set(header)) != len(header):
        return None, [("skipped", f"no header line, or repeated column names: {str(header)[:200]}")]
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        return None, [
            (
                "skipped",
                f"missing column(s) {missing}: not a final.csv as the reference's merge_csv.py "
                f"writes it (columns {', '.join(REQUIRED)}, and {', '.join(VARIANT_TAGS)})",
            )
        ]
    good = [r for r in rows if len(r) == len(header)]
    problems = []
    if len(good) < len(rows):
        problems.append(
            (
                "warning",
                f"{len(rows) - len(good)} row(s) with another number of fields than the header ({len(header)}) dropped",
            )
        )
    return pd.DataFrame(good, columns=header), problems


def _valid_names(df: pd.DataFrame, columns) -> np.ndarray:
    ok = np.ones(len(df), dtype=bool)
    for c in columns:  # a file repeats a few names over many rows: each is checked once
        bad = [v for v in df[c].unique() if not _NAME_RE.match(v)]
        ok &= ~df[c].isin(bad).to_numpy()
    return ok


def read_final_csv(path: Path, max_bytes: int = MAX_BYTES) -> tuple[pd.DataFrame | None, list[tuple[str, str]]]:
    """One final.csv as rows (instance, algo, model, trial, env_steps, eval_return), and ``(kind, reason)``
    problems: a file that cannot be one is skipped, damaged rows are dropped and counted."""
    text, problems = read_text(path, max_bytes)
    if text is None:
        return None, problems
    df, more = _rows(text)
    problems += more
    if df is None:
        return None, problems
    own = (df["method"] == OWN_METHOD).to_numpy()
    lacking = [t for t in VARIANT_TAGS[:4] if t not in df.columns]  # Arch may be absent: older merges
    keep = np.ones(len(df), dtype=bool)
    if own.any() and lacking:
        problems.append(
            (
                "warning",
                f"{int(own.sum())} row(s) of method {OWN_METHOD!r} dropped: no {lacking} "
                "column(s) to name their variant",
            )
        )
        keep &= ~own
    tags = [t for t in VARIANT_TAGS if t in df.columns] if not lacking else []
    ok = _valid_names(df, ["trial", "method"])
    if tags:
        ok &= ~own | _valid_names(df, tags)
    if "RL" in df.columns:
        ok &= own | (df["RL"] == "").to_numpy() | _valid_names(df, ["RL"])
    if (keep & ~ok).any():
        shown = ["trial", "method", *tags]
        example = df.loc[keep & ~ok, shown].iloc[0].tolist()
        problems.append(
            (
                "warning",
                f"{int((keep & ~ok).sum())} row(s) whose {'/'.join(shown)} are not plain names "
                f"dropped, e.g. {str(example)[:100]}",
            )
        )
        keep &= ok
    steps = pd.to_numeric(df["env_steps"], errors="coerce").to_numpy(float)
    ret = pd.to_numeric(df["return"], errors="coerce").to_numpy(float)
    finite = np.isfinite(steps) & np.isfinite(ret)
    if (keep & ~finite).any():
        example = df.loc[keep & ~finite, ["env_steps", "return"]].iloc[0].tolist()
        problems.append(
            (
                "warning",
                f"{int((keep & ~finite).sum())} row(s) whose env_steps or return is not a "
                f"finite number dropped, e.g. {str(example)[:60]}",
            )
        )
        keep &= finite
    df, steps, ret, own = df[keep], steps[keep], ret[keep], own[keep]
    rl = df["RL"].str.lower() if "RL" in df.columns else pd.Series("", index=df.index)
    # The reference's variant string less its algorithm (the group's algo): Encoder-Len-Inputs[-Arch].
    variant = (
        df[tags[1]].str.lower().str.cat([df[t].str.lower() for t in tags[2:]], sep="-")
        if tags
        else pd.Series("", index=df.index)
    )
    out = pd.DataFrame(
        {
            "instance": np.where(own, rl + "-" + variant, df["method"]),
            "algo": np.where(rl != "", rl, df["method"].str.lower()),
            "model": np.where(own, variant, df["method"]) + C.PUB_SUFFIX,
            "trial": df["trial"].to_numpy(),
            "env_steps": steps,
            "eval_return": ret,
        }
    )
    dup = out.duplicated(["instance", "trial", "env_steps"])
    if dup.any():
        problems.append(
            (
                "warning",
                f"{int(dup.sum())} repeated (variant, trial, env_steps) row(s) dropped (two runs "
                "under one trial name?); the first of each kept",
            )
        )
        out = out[~dup]
    if out.empty:
        problems.append(("skipped", "no usable row"))
        return None, problems
    return out.sort_values(["instance", "trial", "env_steps"], kind="stable").reset_index(drop=True), problems


def read_published(roots, max_bytes: int = MAX_BYTES) -> tuple[pd.DataFrame, list[tuple[str, str, str]], int, int]:
    """Every published final.csv below ``roots`` as rows of the tidy table (TABLE_COLUMNS, and ``instance``: the
    reference's name of the group), ``(path, kind, reason)`` problems, and the files found and read."""
    files = find_files(roots)
    problems: list[tuple[str, str, str]] = []
    frames, seen = [], {}
    for path in files:
        task = task_of(path)
        if task is None:
            problems.append((str(path), "skipped", f"not at <Env>/<P|V>/{FILE_NAME}, so its task is unknown"))
            continue
        if task in seen:
            problems.append((str(path), "skipped", f"{task} was read already, from {seen[task]}"))
            continue
        rows, found = read_final_csv(path, max_bytes)
        problems += [(str(path), kind, reason) for kind, reason in found]
        if rows is None:
            continue
        seen[task] = path
        family, obs = C.parse_task(task)
        rows = rows.assign(
            task=task,
            family=family,
            obs=obs,
            source="published",
            finished=pd.NA,
            status="published",
            seed=pd.NA,
            run_dir=Path(os.path.abspath(path)).as_posix(),
        )
        rows["run_id"] = "published/" + task + "/" + rows["instance"] + "/" + rows["trial"]
        rows["model_label"] = rows["model"].map({m: C.model_label(m) for m in rows["model"].unique()})
        frames.append(rows)
    cols = [*TABLE_COLUMNS, "instance"]
    table = pd.concat(frames, ignore_index=True).reindex(columns=cols) if frames else pd.DataFrame(columns=cols)
    table["seed"] = table["seed"].astype("Int64")
    table["finished"] = table["finished"].astype("boolean")
    return table, problems, len(files), len(frames)


def parse_selection(spec: str) -> list[str]:
    """The items of ``--published-select``; ValueError naming an empty one."""
    items = [s.strip() for s in spec.split(",")]
    if not spec.strip() or any(not s for s in items):
        raise ValueError(
            f"--published-select {spec!r} has an empty item; give {', '.join(SELECT_KEYWORDS)} or "
            "variant strings / method names, comma separated"
        )
    return items


def select(published: pd.DataFrame, spec: str = DEFAULT_SELECT, **score) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The published groups to show, and why each was chosen (task, algo, model, instance, trials, chosen_by).

    ``config``: each task's tuned rnn.yml variant (:func:`tuned_config`) for every algorithm published;
    ``best``: per task and algorithm, the variant of the reference's own agent with the highest mean rundown score
    (stats.run_scores' last20 with ``score``'s settings: the reference's ranking rule); ``all``; or variant strings
    and method names as the files spell them. ValueError names an unknown one and the names there are."""
    items = parse_selection(spec)
    known = sorted(published["instance"].unique()) if len(published) else []
    unknown = [s for s in items if s not in SELECT_KEYWORDS and s not in known]
    if unknown:
        raise ValueError(
            f"--published-select: no published variant or method {unknown[0]!r}; choose from "
            f"{', '.join(SELECT_KEYWORDS)} or one of {', '.join(known) or '(none read)'}"
        )
    runs = published.drop_duplicates("run_id")[["task", "algo", "model", "instance", "run_id"]]
    chosen = []
    for item in items:
        if item == "all":
            hit = runs
        elif item == "config":
            hit = runs[runs["model"].str.removesuffix(C.PUB_SUFFIX) == runs["task"].map(tuned_config)]
        elif item == "best":
            own = published[published["model"].map(C.is_model_group).astype(bool)]
            scores = stats.run_scores(own, C.METRIC_LAST20, **score)
            # In value order (stats.value_order), so the trials' names cannot tip a near tie between variants.
            means = (
                scores.groupby(["task", "algo", "model"])["score"]
                .agg(lambda v: float(np.mean(stats.value_order(v))))
                .reset_index()
            )
            best = means.sort_values(["score", "model"], ascending=[False, True]).drop_duplicates(["task", "algo"])
            hit = runs.merge(best[["task", "algo", "model"]], on=["task", "algo", "model"])
        else:
            hit = runs[runs["instance"] == item]
        chosen.append(hit.assign(chosen_by=item))
    picked = pd.concat(chosen, ignore_index=True)
    why = (
        picked.groupby(["task", "algo", "model", "instance"], sort=True)
        .agg(trials=("run_id", "nunique"), chosen_by=("chosen_by", lambda s: ", ".join(dict.fromkeys(s))))
        .reset_index()
    )
    return published[published["run_id"].isin(set(picked["run_id"]))].drop(columns="instance"), why


def missing(table: pd.DataFrame) -> list[str]:
    """What one side lacks, per task and algorithm, between the runs' model groups (ours or the reference's) and
    the published model groups shown: tasks only one side has, and groups with fewer runs / trials than the others
    (each named with its trials)."""
    runs = table.drop_duplicates("run_id")
    runs = runs[runs["model"].map(C.is_model_group).astype(bool)]
    pub = (runs["source"] == "published").to_numpy()
    on_pub, on_runs = set(zip(runs["task"][pub], runs["algo"][pub])), set(zip(runs["task"][~pub], runs["algo"][~pub]))

    def named(keys):
        return ", ".join(f"{task} ({C.algo_label(algo)})" for task, algo in sorted(keys))

    lines = []
    if on_runs - on_pub:
        lines.append(f"no published group for the runs on {named(on_runs - on_pub)}")
    if on_pub - on_runs:
        lines.append(f"published only, no runs on {named(on_pub - on_runs)}")
    for task, algo in sorted(on_runs & on_pub):
        g = runs[(runs["task"] == task) & (runs["algo"] == algo)]
        trials = g.groupby("model", sort=True)["trial"].apply(lambda t: sorted(map(str, t)))
        if trials.map(len).nunique() > 1:
            lines.append(
                f"{task} ({C.algo_label(algo)}) has unequal numbers of runs: "
                + "; ".join(f"{C.group_label(algo, m)} {len(t)} ({', '.join(t)})" for m, t in trials.items())
            )
    return lines


def grid_effect(table: pd.DataFrame, max_steps: float | None = None) -> tuple[int, float, float] | None:
    """How much the published grid lowers a best-so-far score, measured on the runs beside it (tasks with published
    groups): each run's best evaluation less the best of its returns interpolated to the grid and rounded to 2
    decimals as merge_csv.py does. (runs, mean, largest), None without such runs."""
    tasks = set(table.loc[table["source"] == "published", "task"])
    beside = table[(table["source"] != "published") & table["task"].isin(tasks)]
    drops = []
    for run, steps, ret in stats.each_run(beside, max_steps):
        start, interval, _ = stats.curve_settings(run, None, None, 1)
        _, on_grid = stats.reference_curve(steps, ret, start, interval, 1, max_steps)
        drops.append(float(ret.max() - np.round(on_grid, 2).max()))
    return (len(drops), float(np.mean(stats.value_order(drops))), float(np.max(drops))) if drops else None
