"""Read the CSVs written by ``python -m pomdp_ffm.bench {efficiency,memory,update,...} --csv FILE``; the efficiency
benchmark's trials summed up as the FFM paper's figure shows them (mean and bootstrapped CI over trials)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from . import constants as C
from .stats import bootstrap_ci, group_seed, value_order

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


def read_bench(files) -> tuple[pd.DataFrame, list[tuple[str, str, str]]]:
    """Concatenate benchmark CSVs; rows with a non-numeric value are dropped and reported."""
    problems: list[tuple[str, str, str]] = []
    frames = []
    for f in files:
        f = Path(f)
        if not f.is_file():
            raise FileNotFoundError(f"benchmark file {str(f)!r} does not exist")
        try:
            df = pd.read_csv(f, dtype=str, keep_default_na=False)
        except (pd.errors.EmptyDataError, pd.errors.ParserError) as exc:
            problems.append((str(f), "skipped", f"not a readable CSV: {exc}"[:300]))
            continue
        missing = [c for c in BENCH_COLUMNS if c not in df.columns]
        if missing:
            problems.append((str(f), "skipped", f"missing column(s) {missing}; expected {BENCH_COLUMNS}"))
            continue
        df = df[BENCH_COLUMNS].copy()
        values = pd.to_numeric(df["value"], errors="coerce")
        bad = values.isna()
        if bad.any():
            problems.append(
                (
                    str(f),
                    "warning",
                    f"{int(bad.sum())} row(s) with non-numeric value dropped, e.g. {df.loc[bad, 'value'].iloc[0]!r}",
                )
            )
        df["value"] = values
        df["file"] = f.name
        frames.append(df[~bad])
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
    """Per shape, model and metric of the efficiency benchmark: the mean over its trials with a bootstrapped CI
    (:func:`analysis.stats.bootstrap_ci`; one trial, as memory has, no interval), and its ratio to FFM's mean;
    models in ``order``."""
    rows = []
    for (shape, model, metric, unit), g in bench.groupby(["shape", "model", "metric", "unit"], sort=False):
        mean, low, high, used = bootstrap_ci(
            g["value"], confidence, n_resamples, group_seed(seed, shape, model, metric)
        )
        rows.append(
            {
                "shape": shape,
                "model": model,
                "model_label": C.model_label(model),
                "metric": metric,
                "unit": unit,
                "n_trials": len(g),
                "mean": mean,
                "ci_low": low,
                "ci_high": high,
                "ci_method": used,
            }
        )
    out = pd.DataFrame(rows)
    ffm = out[out["model"] == "ffm"].set_index(["shape", "metric"])["mean"]
    out["to_ffm"] = out["mean"] / [ffm.get((s, m), np.nan) for s, m in zip(out["shape"], out["metric"])]
    metric_rank = {m: i for i, m in enumerate(EFFICIENCY_METRICS)}
    model_rank = {m: i for i, m in enumerate(order)}
    out["_metric"] = out["metric"].map(lambda m: metric_rank.get(m, len(metric_rank)))
    out["_model"] = out["model"].map(lambda m: model_rank.get(m, len(model_rank)))
    out = out.sort_values(["shape", "_metric", "_model"], kind="stable").drop(columns=["_metric", "_model"])
    return out.reset_index(drop=True)
