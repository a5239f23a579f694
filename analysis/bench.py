"""Read the CSVs written by ``python -m pomdp_ffm.bench {efficiency,memory,update,...} --csv FILE``; the efficiency
benchmark's trials summed up as the FFM paper's figure shows them, by their medians (``summarize_efficiency``)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import pandas as pd

from . import constants as C
from . import published
from .stats import group_seed, median_ci, value_order

BENCH_COLUMNS = ["benchmark", "shape", "model", "metric", "value", "unit"]
# Display names for the metrics the benchmark writes; unknown metrics keep their own name.
METRIC_TITLES = {
    "update_ms": "Time per update",
    "fwd_bwd_ms": "Forward + backward",
    "fwd_ms": "Forward",
    "act_us": "Acting latency (1 step)",
    "peak_mem_mb": "Peak memory (fwd + bwd)",
    "gflop": "Compute per update",
    "updates_per_s": "Updates per second",
    "achieved_gflop_s": "Achieved throughput",
    "matmul_gflop_s": "Matmul throughput (device)",
    "train_s": "Train time",
    "latency_ms": "Inference latency",
}
# The benchmark whose rows are trials of the FFM paper's efficiency protocol, and its figure's panels in order.
EFFICIENCY = "efficiency"
EFFICIENCY_METRICS = ("train_s", "latency_ms", "peak_mem_mb")
# Which way is better for each metric the benchmark writes; other metrics are judged by their unit.
HIGHER_IS_BETTER = frozenset({"updates_per_s", "achieved_gflop_s", "matmul_gflop_s"})
LOWER_IS_BETTER = frozenset(
    {"update_ms", "fwd_bwd_ms", "fwd_ms", "act_us", "peak_mem_mb", "gflop", "train_s", "latency_ms"}
)
_LOWER_UNITS = frozenset({"s", "ms", "us", "ns", "b", "kb", "mb", "gb", "kib", "mib", "gib", "flop", "gflop", "tflop"})


def better(metric: str, unit: str = "") -> str | None:
    """'higher' or 'lower' (is better) for a benchmark metric, None when it cannot be told.

    Rates (units per second: updates/s, GFLOP/s) are higher-is-better; times, memory and operation counts
    are lower-is-better."""
    if metric in HIGHER_IS_BETTER:
        return "higher"
    if metric in LOWER_IS_BETTER:
        return "lower"
    u = str(unit).strip().lower()
    if u.endswith("/s") or metric.endswith("_per_s"):
        return "higher"
    if u in _LOWER_UNITS:
        return "lower"
    return None


# What a measurement can be, by unit. No benchmark here times anything for a year or holds an exbibyte: past these
# a value is a broken clock or a damaged file, not a slow model, and one such trial would move its model's mean and
# interval as far as it likes.
_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
_BYTES = {"b": 1, "kb": 2**10, "kib": 2**10, "mb": 2**20, "mib": 2**20, "gb": 2**30, "gib": 2**30}
MAX_SECONDS = 365 * 86400
MAX_BYTES = 2**60
LISTED = 5  # rows named in a file's warning; the rest counted


def impossible(metric: str, unit: str, value: float) -> str | None:
    """Why ``value`` cannot be a measurement of ``metric`` in ``unit``; None where it can. Times, sizes, counts and
    rates (the metrics :func:`better` can judge) are finite and >= 0, times under a year, sizes under 1 EiB; of a
    metric it cannot judge (the ledger's figures) only NaN is refused."""
    if np.isnan(value):
        return "not a number"
    if better(metric, unit) is None:
        return None
    u = str(unit).strip().lower()
    if np.isinf(value):
        return "infinite"
    if value < 0:
        return "negative"
    if value * _SECONDS.get(u, 0.0) > MAX_SECONDS:
        return "longer than a year"
    if value * _BYTES.get(u, 0) > MAX_BYTES:
        return "more than 1 EiB"
    return None


def _read_one(path: Path) -> tuple[pd.DataFrame | None, list[tuple[str, str]]]:
    """One benchmark CSV's rows (``value`` a float) and ``(kind, reason)`` problems: a file that cannot be one is
    skipped; a row that cannot be a measurement (cut short, bytes that are not UTF-8, a value that is not a number
    or is :func:`impossible`) is left out, and one warning names each such row by its line, with its value."""
    text, problems = published.read_text(path, published.MAX_BYTES)
    if text is None:
        return None, problems
    try:
        reader = csv.reader(io.StringIO(text, newline=""))
        header = next(reader, [])
        body = [(reader.line_num, r) for r in reader if r]  # (line_num: the line the row ends on)
    except csv.Error as exc:
        return None, [("skipped", f"not a readable CSV: {exc}"[:300])]
    missing = [c for c in BENCH_COLUMNS if c not in header]
    if missing:  # (with read_text's UTF-8 warning, where that is why a column's name is not found)
        return None, [*problems, ("skipped", f"missing column(s) {missing}; expected {BENCH_COLUMNS}")]
    problems = []  # (read_text's UTF-8 warning is said row by row below: only the rows it touches are left out)
    at = [header.index(c) for c in BENCH_COLUMNS]
    kept, left_out = [], []
    for line, r in body:
        if len(r) != len(header):
            left_out.append(f"line {line} ({len(r)} fields, the header {len(header)})")
            continue
        fields = [r[i] for i in at]
        if any("\ufffd" in f for f in fields):
            left_out.append(f"line {line} (bytes that are not UTF-8)")
            continue
        try:
            value = float(fields[4])
        except ValueError:
            left_out.append(f"line {line} value {fields[4]!r} (not a number)")
            continue
        why = impossible(fields[3], fields[5], value)
        if why:
            left_out.append(f"line {line} value {fields[4]!r} ({fields[3]} in {fields[5] or 'no unit'}: {why})")
            continue
        kept.append([*fields[:4], value, fields[5]])
    if left_out:
        more = f", and {len(left_out) - LISTED} more" if len(left_out) > LISTED else ""
        problems.append(("warning", f"{len(left_out)} row(s) left out: {'; '.join(left_out[:LISTED])}{more}"))
    return pd.DataFrame(kept, columns=BENCH_COLUMNS).astype({"value": float}), problems


def read_bench(files) -> tuple[pd.DataFrame, list[tuple[str, str, str]]]:
    """Concatenate benchmark CSVs; files that cannot be one are skipped, rows that cannot be a measurement are left
    out (:func:`_read_one`), each named in ``(path, kind, reason)`` problems. A file that is not there is bad input:
    FileNotFoundError."""
    problems: list[tuple[str, str, str]] = []
    frames = []
    for f in files:
        f = Path(f)
        if not f.is_file():
            raise FileNotFoundError(f"benchmark file {str(f)!r} does not exist")
        df, found = _read_one(f)
        problems += [(str(f), kind, reason) for kind, reason in found]
        if df is not None:
            frames.append(df.assign(file=f.name))
    if not frames:
        return pd.DataFrame(columns=[*BENCH_COLUMNS, "file"]), problems
    out = pd.concat(frames, ignore_index=True)
    units = out.groupby("metric")["unit"].nunique()
    for metric in units[units > 1].index:
        problems.append(
            (
                "bench",
                "warning",
                f"metric {metric!r} appears with several units "
                f"{sorted(out.loc[out.metric == metric, 'unit'].unique())}",
            )
        )
    return out, problems


def summarize_bench(bench: pd.DataFrame) -> pd.DataFrame:
    """Mean (and count) per benchmark, shape, model, metric; repeated measurements are averaged, in
    :func:`analysis.stats.value_order` so that the order of the ``--bench`` files cannot change a mean."""
    g = bench.groupby(["benchmark", "shape", "metric", "unit", "model"], sort=True)["value"]
    return g.agg(value=lambda v: float(np.mean(value_order(v))), n="size").reset_index()


def summarize_efficiency(
    bench: pd.DataFrame, confidence: float, n_resamples: int, seed: int, order: list[str]
) -> pd.DataFrame:
    """Per shape, model and metric of the efficiency benchmark: the median of its trials with a bootstrapped CI, and
    its ratio to FFM's median with a CI of the ratio, FFM's trials and the model's resampled independently
    (:func:`analysis.stats.median_ci`; one trial, as peak memory has, no interval); models in ``order``. Medians:
    one stray trial in ten (S4D's 3.93 s among nine of 0.50-0.65 s) moved the mean's ratio to FFM from 3.2x to
    5.0x."""
    rows = []
    groups = bench.groupby(["shape", "model", "metric", "unit"], sort=False)
    for (shape, model, metric, unit), g in groups:
        median, low, high, used = median_ci(
            (g["value"],), confidence, n_resamples, group_seed(seed, shape, model, metric)
        )
        ffm = bench[(bench["shape"] == shape) & (bench["model"] == "ffm") & (bench["metric"] == metric)]["value"]
        ratio, r_low, r_high, _ = median_ci(
            (g["value"], ffm), confidence, n_resamples, group_seed(seed, shape, model, metric, "to_ffm")
        )
        rows.append(
            {
                "shape": shape,
                "model": model,
                "model_label": C.model_label(model),
                "metric": metric,
                "unit": unit,
                "n_trials": len(g),
                "median": median,
                "ci_low": low,
                "ci_high": high,
                "ci_method": used,
                "to_ffm": ratio,
                "to_ffm_low": r_low,
                "to_ffm_high": r_high,
            }
        )
    out = pd.DataFrame(rows)
    metric_rank = {m: i for i, m in enumerate(EFFICIENCY_METRICS)}
    model_rank = {m: i for i, m in enumerate(order)}
    out["_metric"] = out["metric"].map(lambda m: metric_rank.get(m, len(metric_rank)))
    out["_model"] = out["model"].map(lambda m: model_rank.get(m, len(model_rank)))
    out = out.sort_values(["shape", "_metric", "_model"], kind="stable").drop(columns=["_metric", "_model"])
    return out.reset_index(drop=True)
