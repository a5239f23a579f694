"""Per-run scores, bootstrapped confidence intervals, horizons and normalisation.

Per-group confidence intervals use ``scipy.stats.bootstrap`` (BCa by default).
The across-task statistics are in :mod:`analysis.aggregate`, the learning
curves in :mod:`analysis.curves`.

Everything random takes an explicit ``seed``; equal inputs and seed give
identical numbers, and every group's bootstrap is seeded from the seed and the
group's own name (:func:`group_seed`), so a group's numbers do not depend on
what else the tree holds.  Every statistic over runs reads them in
:func:`value_order`, so none depends on their folders' names.
"""

from __future__ import annotations

import math
import warnings
import zlib

import numpy as np
import pandas as pd
from scipy import stats as sps
from scipy.special import ndtr, ndtri

from . import constants as C

GROUP = ["task", "algo", "model"]


def group_seed(seed: int, *name) -> list[int]:
    """The bootstrap seed of one group: ``seed`` and a stable hash of the group's name (zlib.crc32, as Python's
    ``hash`` of a string changes between processes). Seeding by position in the list of groups would let a group
    added to the tree change every group's interval after it."""
    return [int(seed), zlib.crc32("/".join(map(str, name)).encode())]


# --------------------------------------------------------------------------- per-run scores


def reference_curve(
    steps: np.ndarray,
    returns: np.ndarray,
    grid_start: float,
    grid_interval: float,
    window: int,
    max_steps: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The reference's smoothed curve: interpolate onto a grid, then a trailing rolling mean.

    Grid points run from ``grid_start`` to the run's last eval step (or
    ``max_steps``); values outside the observed range are held at the end
    values, as ``np.interp`` does and the reference's merge script did.
    """
    if grid_interval <= 0:
        raise ValueError(f"grid_interval must be positive, got {grid_interval}")
    if window < 1:
        raise ValueError(f"smoothing window must be >= 1, got {window}")
    end = float(steps.max()) if max_steps is None else min(float(steps.max()), float(max_steps))
    if end < grid_start:
        grid = np.array([end])
    else:
        grid = np.arange(grid_start, end + 1e-9, grid_interval, dtype=float)
    y = np.interp(grid, steps, returns)
    smooth = pd.Series(y).rolling(window, min_periods=1).mean().to_numpy()
    return grid, smooth


def _last_fraction_score(steps, returns, grid_start, grid_interval, window, last_fraction, max_steps) -> float:
    _, smooth = reference_curve(steps, returns, grid_start, grid_interval, window, max_steps)
    n_last = max(1, math.ceil(last_fraction * len(smooth)))
    return float(np.mean(smooth[-n_last:]))


def curve_settings(run: pd.DataFrame, grid_start, grid_interval, window) -> tuple[float, float, int]:
    """Explicit settings win; otherwise the reference's for the run's task family (constants.curve_defaults)."""
    start, interval, win = C.curve_defaults(run["task"].iloc[0])
    return (
        start if grid_start is None else grid_start,
        interval if grid_interval is None else grid_interval,
        win if window is None else window,
    )


def each_run(table: pd.DataFrame, max_steps: float | None):
    """Each run's eval rows in env-step order (up to ``max_steps``), with steps and returns as arrays."""
    for _, run in table.groupby("run_id", sort=True):
        run = run.sort_values("env_steps", kind="stable")
        if max_steps is not None:
            run = run[run["env_steps"] <= max_steps]
        if not run.empty:
            yield run, run["env_steps"].to_numpy(float), run["eval_return"].to_numpy(float)


def run_scores(
    table: pd.DataFrame,
    metric: str = C.METRIC_RUNMAX,
    max_steps: float | None = None,
    grid_start: float | None = None,
    grid_interval: float | None = None,
    window: int | None = None,
    last_fraction: float = C.DEFAULT_LAST_FRACTION,
) -> pd.DataFrame:
    """One final score per run.

    ``metric="runmax"``: the final value of the running maximum of the eval
    return, i.e. the best eval up to ``max_steps`` (the FFM paper's metric).
    ``metric="last20"``: the reference's rundown summary, the mean of the last
    ``last_fraction`` of the smoothed grid curve.
    """
    if metric not in C.METRIC_DESCRIPTIONS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {sorted(C.METRIC_DESCRIPTIONS)}")
    if not 0 < last_fraction <= 1:
        raise ValueError(f"last_fraction must be in (0, 1], got {last_fraction}")
    keys = ["run_id", "source", *GROUP, "model_label", "seed", "trial", "finished", "status"]
    rows = []
    for run, steps, ret in each_run(table, max_steps):
        if metric == C.METRIC_RUNMAX:
            score = float(np.max(ret))  # == final value of the running max
        else:
            score = _last_fraction_score(
                steps, ret, *curve_settings(run, grid_start, grid_interval, window), last_fraction, max_steps
            )
        first = run.iloc[0]
        rows.append(
            {**{k: first[k] for k in keys}, "score": score, "final_env_steps": float(steps[-1]), "n_evals": len(run)}
        )
    out = pd.DataFrame(rows, columns=[*keys, "score", "final_env_steps", "n_evals"])
    out["seed"] = out["seed"].astype("Int64")
    return out


# --------------------------------------------------------------------------- bootstrap CIs

# Resampled means within this fraction of the scores' magnitude of the sample mean are ties (BCa's bias term).
# A mean's rounding error is about n * 1e-16 of that magnitude; the means of two different resamples differ by
# at least the smallest gap between scores over n, far above 1e-9 of it unless scores agree to 9 digits.
TIE_REL_TOL = 1e-9


def value_order(values) -> np.ndarray:
    """A group's runs in the one order every statistic over them reads them in (means, standard deviations,
    bootstrap resamples, aggregates, curve means): sorted by value (a 2-D array, one row per run, by its rows in
    lexicographic order).

    In the order of their folders' paths, renaming folders of identical data changed the numbers: a resample is
    a list of indices, so the order decides which values it holds (intervals moved), and a float sum depends on
    the order of its terms (0.1 + 1e16 - 1e16 is 0, 1e16 - 1e16 + 0.1 is 0.1), so a std's last bit moved.
    Sorted by value, a statistic is a function of the scores alone, whatever their folders, load order or seeds
    (the FFM fork's copied runs have no seed, so an order by seed would still fall back on paths); runs of equal
    value are interchangeable."""
    x = np.asarray(values, dtype=float)
    if x.ndim == 1:
        return np.sort(x)
    return x[np.lexsort(x.T[::-1])] if len(x) else x


def bca_interval(x: np.ndarray, boot: np.ndarray, confidence: float) -> tuple[float, float]:
    """The BCa interval of the mean of ``x`` from its bootstrap distribution ``boot`` (Efron & Tibshirani 1993,
    14.3 and 15.4, as ``scipy.stats.bootstrap`` computes it), with ties counted within a tolerance.

    BCa's bias correction is ``ndtri`` of the fraction of resampled means below the sample mean, ties counted
    as half. scipy counts a tie only on exact equality, but many resamples tie mathematically (with 5 runs the
    3.8% that are permutations of the sample) and their float means land an ulp either side of the sample mean
    depending on the last bits of the scores: changing one score by 1e-12 of its value moved an interval by 1%.
    Here a resampled mean within ``TIE_REL_TOL`` of the scores' magnitude counts as tied, so rounding cannot
    move the proportion; where no resample is that close the interval is scipy's to the last bit. (Rounding the
    scores first would only move the problem to the rounding boundaries.) The jackknife acceleration is smooth
    in the data and is computed as scipy does."""
    theta = float(np.mean(x))
    tol = TIE_REL_TOL * float(np.max(np.abs(x)))
    below = np.count_nonzero(boot < theta - tol)
    tied = np.count_nonzero(np.abs(boot - theta) <= tol)
    z0 = ndtri((below + 0.5 * tied) / len(boot))
    n = float(len(x))
    jack = np.array([np.mean(np.delete(x, i)) for i in range(len(x))])
    u = (n - 1) * (np.mean(jack) - jack)
    accel = 1 / 6 * (np.sum(u**3) / n**3) / (np.sum(u**2) / n**2) ** (3 / 2)
    z = float(ndtri((1 - confidence) / 2))
    levels = [ndtr(z0 + (z0 + zq) / (1 - accel * (z0 + zq))) for zq in (z, -z)]
    low, high = sps.quantile(boot, np.asarray(levels, float))
    return float(low), float(high)


def bootstrap_ci(
    values,
    confidence: float = C.DEFAULT_CONFIDENCE,
    n_resamples: int = C.DEFAULT_RESAMPLES,
    seed: int | list[int] = C.DEFAULT_SEED,
    method: str = "BCa",
) -> tuple[float, float, float, str]:
    """Mean and bootstrapped CI of the mean: ``scipy.stats.bootstrap``'s resamples of the runs (in
    :func:`value_order`), and its percentile interval or :func:`bca_interval` on them.

    Returns ``(mean, low, high, method_used)``.  With one value there is no
    interval (NaN).  With identical values the bootstrap distribution is a
    point, so the interval is that point (BCa is undefined there).  If
    BCa fails numerically the percentile interval is used and named as such.
    """
    x = np.asarray(values, dtype=float)
    x = value_order(x[np.isfinite(x)])
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be positive, got {n_resamples}")
    if method not in ("BCa", "percentile"):
        raise ValueError(f"unknown interval method {method!r}; choose 'BCa' or 'percentile'")
    if len(x) == 0:
        return math.nan, math.nan, math.nan, "none"
    mean = float(np.mean(x))
    if len(x) == 1:
        return mean, math.nan, math.nan, "none (1 run)"
    if np.all(x == x[0]):
        return mean, mean, mean, "degenerate (identical runs)"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = sps.bootstrap(
            (x,),
            np.mean,
            confidence_level=confidence,
            n_resamples=n_resamples,
            method="percentile",
            rng=np.random.default_rng(seed),
        )
        if method == "BCa":
            low, high = bca_interval(x, res.bootstrap_distribution, confidence)
            if np.isfinite(low) and np.isfinite(high):
                return mean, low, high, "BCa"
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if np.isfinite(low) and np.isfinite(high):
        return mean, low, high, "percentile"
    return mean, math.nan, math.nan, "failed"


def median_ci(
    samples: tuple, confidence: float, n_resamples: int, seed: int | list[int]
) -> tuple[float, float, float, str]:
    """The median of one sample, or the ratio of two samples' medians, with its percentile bootstrap CI: each
    sample resampled on its own (``scipy.stats.bootstrap``, ``paired=False``), so that two models' trials, which
    are not paired, vary independently. Returns ``(value, low, high, method_used)``; a sample of one value gives
    no interval (NaN), all samples constant a point.

    Medians, not means: one stray trial (a clock stalled by another process) moves a mean of ten by a tenth of its
    excess, but a median only to the next trial. The percentile interval, not BCa: BCa's jackknife of a median
    is unstable (deleting one value moves it only at the middle)."""
    xs = [value_order(np.asarray(s, dtype=float)[np.isfinite(np.asarray(s, dtype=float))]) for s in samples]
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if any(len(x) == 0 for x in xs):
        return math.nan, math.nan, math.nan, "none"

    def statistic(*s, axis=-1):
        m = [np.median(x, axis=axis) for x in s]
        return m[0] if len(m) == 1 else m[0] / m[1]

    value = float(statistic(*xs))
    if any(len(x) == 1 for x in xs):
        return value, math.nan, math.nan, "none (1 trial)"
    if all(np.all(x == x[0]) for x in xs):
        return value, value, value, "degenerate (identical trials)"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = sps.bootstrap(
            tuple(xs),
            statistic,
            paired=False,
            vectorized=True,
            confidence_level=confidence,
            n_resamples=n_resamples,
            method="percentile",
            rng=np.random.default_rng(seed),
        )
    return value, float(res.confidence_interval.low), float(res.confidence_interval.high), "percentile"


def summarize(
    scores: pd.DataFrame,
    confidence: float = C.DEFAULT_CONFIDENCE,
    n_resamples: int = C.DEFAULT_RESAMPLES,
    seed: int = C.DEFAULT_SEED,
    value: str = "score",
) -> pd.DataFrame:
    """Mean over runs with a bootstrapped CI per (task, algo, model), each seeded from its name.

    When ``scores`` has ``final_env_steps`` (as :func:`run_scores` makes it), the
    horizon the group was scored on is given too: the shortest and longest run's
    last evaluation (``env_steps_min``, ``env_steps_max``)."""
    rows = []
    horizon = "final_env_steps" in scores.columns
    for (task, algo, model), g in scores.groupby(GROUP, sort=True):
        v = value_order(g[value])
        mean, low, high, used = bootstrap_ci(v, confidence, n_resamples, group_seed(seed, task, algo, model))
        row = {
            "task": task,
            "algo": algo,
            "model": model,
            "model_label": C.model_label(model),
            "n_runs": len(v),
            "mean": mean,
            "ci_low": low,
            "ci_high": high,
            "std": float(np.std(v, ddof=1)) if len(v) > 1 else math.nan,
            "median": float(np.median(v)),
            "ci_method": used,
        }
        if horizon:
            row.update(env_steps_min=float(g["final_env_steps"].min()), env_steps_max=float(g["final_env_steps"].max()))
        rows.append(row)
    cols = [
        "task",
        "algo",
        "model",
        "model_label",
        "n_runs",
        "mean",
        "ci_low",
        "ci_high",
        "std",
        "median",
        "ci_method",
        *(["env_steps_min", "env_steps_max"] if horizon else []),
    ]
    return pd.DataFrame(rows, columns=cols)


# --------------------------------------------------------------------------- horizons


def fmt_steps(x: float) -> str:
    return f"{x:.0f}" if float(x).is_integer() else f"{x:g}"


def group_path(task: str, algo: str, model: str) -> str:
    return f"{task}/{algo}_{model}"


def horizons(table: pd.DataFrame, max_steps: float | None = None) -> tuple[pd.DataFrame, list[tuple[str, str, str]]]:
    """The horizon every (task, algo, model) group is scored on, and a warning per task whose runs end apart.

    A run's horizon is its last evaluation's env steps (up to ``max_steps``): a run's
    score (best eval so far, or the mean of the last 20% of its curve) depends on it,
    so runs compared on one task should share it.  Runs "end apart" when the
    shortest and longest run of a task differ by more than one evaluation interval
    (the largest median spacing of the task's evaluations), which absorbs the
    jitter of episode-based env-step counters.  The warning names each group's
    horizons and the shortest run, and suggests ``--max-steps``.

    A run with no evaluation up to ``max_steps`` has no score and no curve: a
    warning names it.

    Returns one row per group (task, algo, model, n_runs, env_steps_min,
    env_steps_max, shortest_run) and ``(path, kind, reason)`` warnings.
    """
    per_run = []
    problems = []
    if max_steps is not None:
        first = table.groupby("run_id", sort=True)["env_steps"].min()
        for run_id, at in first[first > max_steps].items():
            problems.append(
                (
                    run_id,
                    "warning",
                    f"no evaluation up to --max-steps {fmt_steps(max_steps)} (its first is "
                    f"at {fmt_steps(at)}): left out of scores and curves",
                )
            )
    for run, steps, _ in each_run(table, max_steps):
        first = run.iloc[0]
        per_run.append(
            {
                "task": first["task"],
                "algo": first["algo"],
                "model": first["model"],
                "run_id": first["run_id"],
                "end": float(steps[-1]),
                "spacing": float(np.median(np.diff(steps))) if len(steps) > 1 else 0.0,
            }
        )
    runs = pd.DataFrame(per_run, columns=["task", "algo", "model", "run_id", "end", "spacing"])
    cols = ["task", "algo", "model", "n_runs", "env_steps_min", "env_steps_max", "shortest_run"]
    rows = []
    for (task, algo, model), g in runs.groupby(GROUP, sort=True):
        rows.append(
            {
                "task": task,
                "algo": algo,
                "model": model,
                "n_runs": len(g),
                "env_steps_min": g["end"].min(),
                "env_steps_max": g["end"].max(),
                "shortest_run": g.loc[g["end"].idxmin(), "run_id"],
            }
        )
    groups = pd.DataFrame(rows, columns=cols)
    for task, g in runs.groupby("task", sort=True):
        lo, hi = g["end"].min(), g["end"].max()
        if hi - lo <= g["spacing"].max():
            continue
        parts = []
        for r in groups[groups.task == task].itertuples(index=False):
            span = (
                fmt_steps(r.env_steps_min)
                if r.env_steps_min == r.env_steps_max
                else f"{fmt_steps(r.env_steps_min)}-{fmt_steps(r.env_steps_max)}"
            )
            parts.append(f"{r.algo}/{r.model} {span} ({r.n_runs} run{'s' if r.n_runs > 1 else ''})")
        shortest = g.loc[g["end"].idxmin(), "run_id"]
        problems.append(
            (
                task,
                "warning",
                f"runs end at different env steps ({fmt_steps(lo)} to {fmt_steps(hi)}), so their scores cover "
                f"different horizons: {'; '.join(parts)}. Shortest: {shortest}. "
                f"Compare on a common horizon with --max-steps {fmt_steps(lo)} (it cuts every task)",
            )
        )
    return groups, problems


# --------------------------------------------------------------------------- normalisation


def normalize(scores: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Add ``norm_score`` = (score - Random) / (Oracle - Random); NaN where no constants exist.

    Also adds ``markovian_norm`` (the Markovian baseline on the same scale) for
    reference lines.  Returns the frame and notes naming excluded tasks.
    """
    out = scores.copy()
    refs = {t: C.reference_for(t) for t in out["task"].unique()}
    rnd = out["task"].map(lambda t: refs[t].random if refs[t] else math.nan)
    orc = out["task"].map(lambda t: refs[t].oracle if refs[t] else math.nan)
    mark = out["task"].map(lambda t: refs[t].markovian if refs[t] else math.nan)
    out["norm_score"] = (out["score"] - rnd) / (orc - rnd)
    out["markovian_norm"] = (mark - rnd) / (orc - rnd)
    notes = [
        f"task {t!r} has no Oracle/Random constants; excluded from normalised aggregates"
        for t, r in sorted(refs.items())
        if r is None
    ]
    return out, notes
