"""Per-run scores, bootstrapped confidence intervals and across-task aggregates.

Per-group confidence intervals use ``scipy.stats.bootstrap`` (BCa by default).
The across-task statistics (IQM, stratified bootstrap over runs within tasks,
probability of improvement, performance profiles) follow Agarwal et al.
(2021, "Deep RL at the Edge of the Statistical Precipice").  They are written
here on top of numpy rather than taken from ``rliable``, because ``rliable``
does not install/run on the numpy 2 / scipy 1.17 stack this project uses; each
is only a few lines, and the tests check them against direct computations.

Everything random takes an explicit ``seed``; equal inputs and seed give
identical numbers.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
from scipy import stats as sps

from . import constants as C

GROUP = ["task", "algo", "model"]


# --------------------------------------------------------------------------- per-run scores

def reference_curve(steps: np.ndarray, returns: np.ndarray, grid_start: float, grid_interval: float,
                    window: int, max_steps: float | None = None) -> tuple[np.ndarray, np.ndarray]:
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


def _curve_settings(run: pd.DataFrame, grid_start, grid_interval, window) -> tuple[float, float, int]:
    """Explicit settings win; otherwise the reference's for the run's task family (constants.curve_defaults)."""
    start, interval, win = C.curve_defaults(run["task"].iloc[0])
    return (start if grid_start is None else grid_start, interval if grid_interval is None else grid_interval,
            win if window is None else window)


def _each_run(table: pd.DataFrame, max_steps: float | None):
    """Each run's eval rows in env-step order (up to ``max_steps``), with steps and returns as arrays."""
    for _, run in table.groupby("run_id", sort=True):
        run = run.sort_values("env_steps", kind="stable")
        if max_steps is not None:
            run = run[run["env_steps"] <= max_steps]
        if not run.empty:
            yield run, run["env_steps"].to_numpy(float), run["eval_return"].to_numpy(float)


def run_scores(table: pd.DataFrame, metric: str = C.METRIC_RUNMAX, max_steps: float | None = None,
               grid_start: float | None = None, grid_interval: float | None = None,
               window: int | None = None, last_fraction: float = C.DEFAULT_LAST_FRACTION) -> pd.DataFrame:
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
    for run, steps, ret in _each_run(table, max_steps):
        if metric == C.METRIC_RUNMAX:
            score = float(np.max(ret))  # == final value of the running max
        else:
            score = _last_fraction_score(steps, ret, *_curve_settings(run, grid_start, grid_interval, window),
                                         last_fraction, max_steps)
        first = run.iloc[0]
        rows.append({**{k: first[k] for k in keys}, "score": score,
                     "final_env_steps": float(steps[-1]), "n_evals": len(run)})
    out = pd.DataFrame(rows, columns=[*keys, "score", "final_env_steps", "n_evals"])
    out["seed"] = out["seed"].astype("Int64")
    return out


# --------------------------------------------------------------------------- bootstrap CIs

def bootstrap_ci(values, confidence: float = C.DEFAULT_CONFIDENCE, n_resamples: int = C.DEFAULT_RESAMPLES,
                 seed: int = C.DEFAULT_SEED, method: str = "BCa") -> tuple[float, float, float, str]:
    """Mean and bootstrapped CI of the mean via ``scipy.stats.bootstrap``.

    Returns ``(mean, low, high, method_used)``.  With one value there is no
    interval (NaN).  With identical values the bootstrap distribution is a
    point, so the interval is that point (scipy would return NaN for BCa).  If
    BCa fails numerically the percentile interval is used and named as such.
    """
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be positive, got {n_resamples}")
    if len(x) == 0:
        return math.nan, math.nan, math.nan, "none"
    mean = float(np.mean(x))
    if len(x) == 1:
        return mean, math.nan, math.nan, "none (1 run)"
    if np.all(x == x[0]):
        return mean, mean, mean, "degenerate (identical runs)"
    for m in (method, "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = sps.bootstrap((x,), np.mean, confidence_level=confidence, n_resamples=n_resamples,
                                method=m, rng=np.random.default_rng(seed))
        low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if np.isfinite(low) and np.isfinite(high):
            return mean, low, high, m
    return mean, math.nan, math.nan, "failed"


def summarize(scores: pd.DataFrame, confidence: float = C.DEFAULT_CONFIDENCE,
              n_resamples: int = C.DEFAULT_RESAMPLES, seed: int = C.DEFAULT_SEED,
              value: str = "score") -> pd.DataFrame:
    """Mean over runs with a bootstrapped CI per (task, algo, model).

    When ``scores`` has ``final_env_steps`` (as :func:`run_scores` makes it), the
    horizon the group was scored on is given too: the shortest and longest run's
    last evaluation (``env_steps_min``, ``env_steps_max``)."""
    rows = []
    horizon = "final_env_steps" in scores.columns
    for (task, algo, model), g in scores.groupby(GROUP, sort=True):
        v = g[value].to_numpy(float)
        mean, low, high, used = bootstrap_ci(v, confidence, n_resamples, seed)
        row = {"task": task, "algo": algo, "model": model, "model_label": C.model_label(model),
               "n_runs": len(v), "mean": mean, "ci_low": low, "ci_high": high,
               "std": float(np.std(v, ddof=1)) if len(v) > 1 else math.nan,
               "median": float(np.median(v)), "ci_method": used}
        if horizon:
            row.update(env_steps_min=float(g["final_env_steps"].min()), env_steps_max=float(g["final_env_steps"].max()))
        rows.append(row)
    cols = ["task", "algo", "model", "model_label", "n_runs", "mean", "ci_low", "ci_high", "std", "median",
            "ci_method", *(["env_steps_min", "env_steps_max"] if horizon else [])]
    return pd.DataFrame(rows, columns=cols)


# --------------------------------------------------------------------------- horizons

def _steps(x: float) -> str:
    return f"{x:.0f}" if float(x).is_integer() else f"{x:g}"


def _group_path(task: str, algo: str, model: str) -> str:
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
            problems.append((run_id, "warning", f"no evaluation up to --max-steps {_steps(max_steps)} (its first is "
                                                f"at {_steps(at)}): left out of scores and curves"))
    for run, steps, _ in _each_run(table, max_steps):
        first = run.iloc[0]
        per_run.append({"task": first["task"], "algo": first["algo"], "model": first["model"],
                        "run_id": first["run_id"], "end": float(steps[-1]),
                        "spacing": float(np.median(np.diff(steps))) if len(steps) > 1 else 0.0})
    runs = pd.DataFrame(per_run, columns=["task", "algo", "model", "run_id", "end", "spacing"])
    cols = ["task", "algo", "model", "n_runs", "env_steps_min", "env_steps_max", "shortest_run"]
    rows = []
    for (task, algo, model), g in runs.groupby(GROUP, sort=True):
        rows.append({"task": task, "algo": algo, "model": model, "n_runs": len(g),
                     "env_steps_min": g["end"].min(), "env_steps_max": g["end"].max(),
                     "shortest_run": g.loc[g["end"].idxmin(), "run_id"]})
    groups = pd.DataFrame(rows, columns=cols)
    for task, g in runs.groupby("task", sort=True):
        lo, hi = g["end"].min(), g["end"].max()
        if hi - lo <= g["spacing"].max():
            continue
        parts = []
        for r in groups[groups.task == task].itertuples(index=False):
            span = _steps(r.env_steps_min) if r.env_steps_min == r.env_steps_max else \
                f"{_steps(r.env_steps_min)}-{_steps(r.env_steps_max)}"
            parts.append(f"{r.algo}/{r.model} {span} ({r.n_runs} run{'s' if r.n_runs > 1 else ''})")
        shortest = g.loc[g["end"].idxmin(), "run_id"]
        problems.append((task, "warning",
                         f"runs end at different env steps ({_steps(lo)} to {_steps(hi)}), so their scores cover "
                         f"different horizons: {'; '.join(parts)}. Shortest: {shortest}. "
                         f"Compare on a common horizon with --max-steps {_steps(lo)} (it cuts every task)"))
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
    notes = [f"task {t!r} has no Oracle/Random constants; excluded from normalised aggregates"
             for t, r in sorted(refs.items()) if r is None]
    return out, notes


# --------------------------------------------------------------------------- aggregates

def iqm(x, axis=-1):
    """Interquartile mean: the mean of the middle 50% (25% trimmed from each end)."""
    return sps.trim_mean(x, 0.25, axis=axis)


def _per_task_arrays(df: pd.DataFrame, value: str) -> list[np.ndarray]:
    return [g[value].to_numpy(float) for _, g in df.groupby("task", sort=True)]


def _aggregate(samples: list[np.ndarray]) -> dict[str, np.ndarray]:
    """IQM over all runs pooled and mean of per-task means, on arrays shaped (..., n_runs_task)."""
    pooled = np.concatenate(samples, axis=-1)
    return {"IQM": iqm(pooled, axis=-1),
            "Mean": np.mean(np.stack([s.mean(axis=-1) for s in samples], axis=-1), axis=-1)}


def stratified_resample(per_task: list[np.ndarray], n_resamples: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Resample runs with replacement *within* each task; arrays shaped (n_resamples, n_runs_task)."""
    return [x[rng.integers(0, len(x), size=(n_resamples, len(x)))] for x in per_task]


def aggregate_scores(norm: pd.DataFrame, confidence: float = C.DEFAULT_CONFIDENCE,
                     n_resamples: int = C.DEFAULT_RESAMPLES, seed: int = C.DEFAULT_SEED,
                     common_tasks: bool = True) -> tuple[pd.DataFrame, list[str]]:
    """IQM and mean normalised score per (algo, model) with stratified-bootstrap percentile CIs.

    IQM pools every (task, run) score, as rliable does; the mean weights tasks
    equally (mean of per-task means), which differs from pooling only when
    tasks have different numbers of runs.  With ``common_tasks`` only tasks that
    every (algo, model) group with runs of this project has are used, so the
    groups are comparable; groups of reference-implementation runs only are
    then restricted to that set too but may cover fewer tasks.

    A task with a single run of a group adds no variance to the stratified
    bootstrap (every resample repeats that run), so the interval understates the
    uncertainty: such tasks are listed in the ``single_run_tasks`` column and in
    a note per group.
    """
    notes: list[str] = []
    df = norm[np.isfinite(norm["norm_score"].to_numpy(float))]
    if df.empty:
        return pd.DataFrame(columns=["algo", "model", "model_label", "metric", "value", "ci_low", "ci_high",
                                     "n_tasks", "n_runs", "tasks", "single_run_tasks"]), \
            ["no task has normalisation constants"]
    if common_tasks:
        sets = df.groupby(["algo", "model"])["task"].apply(set)
        # A group of ours has runs of ours (with --pool-sources a group may hold both; the reference's other
        # agents, e.g. gru+oracle, have none and do not narrow the common tasks).
        if "source" in df.columns:
            has_ours = df.groupby(["algo", "model"])["source"].apply(lambda s: bool((s == "ours").any()))
        else:
            has_ours = pd.Series({k: not k[1].endswith(C.REF_SUFFIX) for k in sets.index})
        ours = [s for key, s in sets.items() if has_ours[key]]
        common = set.intersection(*(ours or sets.tolist()))
        for (algo, model), s in sets.items():
            if s - common:
                notes.append(f"{algo}/{model}: tasks {sorted(s - common)} not shared by all groups; left out")
        df = df[df["task"].isin(common)]
        for (algo, model), s in sets.items():
            if not has_ours[(algo, model)] and not common <= s:
                notes.append(f"{algo}/{model}: covers only {len(s & common)} of the {len(common)} common tasks")
    alpha = (1 - confidence) / 2
    rows = []
    for i, ((algo, model), g) in enumerate(df.groupby(["algo", "model"], sort=True)):
        per_task = _per_task_arrays(g, "norm_score")
        if not per_task:
            continue
        point = _aggregate(per_task)
        rng = np.random.default_rng([seed, i])
        boot = _aggregate(stratified_resample(per_task, n_resamples, rng))
        counts = g.groupby("task").size()
        single = sorted(counts[counts == 1].index)
        if single:
            notes.append(f"{algo}/{model}: task(s) {', '.join(single)} have a single run: they enter the aggregate "
                         "without bootstrap variance, so its CI understates the uncertainty")
        for name in ("IQM", "Mean"):
            lo, hi = np.quantile(boot[name], [alpha, 1 - alpha])
            rows.append({"algo": algo, "model": model, "model_label": C.model_label(model), "metric": name,
                         "value": float(point[name]), "ci_low": float(lo), "ci_high": float(hi),
                         "n_tasks": len(per_task), "n_runs": int(sum(len(x) for x in per_task)),
                         "tasks": " ".join(sorted(g["task"].unique())), "single_run_tasks": " ".join(single)})
    return pd.DataFrame(rows), notes


def _prob_greater(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y) + 0.5 P(X = Y) over all pairs; x (..., n), y (..., m)."""
    gt = (x[..., :, None] > y[..., None, :]).mean(axis=(-2, -1))
    eq = (x[..., :, None] == y[..., None, :]).mean(axis=(-2, -1))
    return gt + 0.5 * eq


def probability_of_improvement(scores: pd.DataFrame, model_x: str = "ffm", model_y: str = "gru",
                               confidence: float = C.DEFAULT_CONFIDENCE, n_resamples: int = C.DEFAULT_RESAMPLES,
                               seed: int = C.DEFAULT_SEED, value: str = "score") -> pd.DataFrame:
    """P(model_x > model_y) per algorithm, averaged over tasks both models ran.

    Per task it is the Mann-Whitney statistic U/(n m) on the raw scores, so no
    normalisation constants are needed.  The CI resamples each model's runs
    independently within each task (stratified bootstrap, percentile interval).
    """
    rows = []
    alpha = (1 - confidence) / 2
    for i, (algo, g) in enumerate(scores.groupby("algo", sort=True)):
        tasks = sorted(set(g.loc[g["model"] == model_x, "task"]) & set(g.loc[g["model"] == model_y, "task"]))
        if not tasks:
            continue
        xs = [g.loc[(g["task"] == t) & (g["model"] == model_x), value].to_numpy(float) for t in tasks]
        ys = [g.loc[(g["task"] == t) & (g["model"] == model_y), value].to_numpy(float) for t in tasks]
        point = np.mean([_prob_greater(x, y) for x, y in zip(xs, ys)])
        rng = np.random.default_rng([seed, i])
        bx = stratified_resample(xs, n_resamples, rng)
        by = stratified_resample(ys, n_resamples, rng)
        boot = np.mean([_prob_greater(x, y) for x, y in zip(bx, by)], axis=0)
        lo, hi = np.quantile(boot, [alpha, 1 - alpha])
        rows.append({"algo": algo, "comparison": f"P({C.model_label(model_x)} > {C.model_label(model_y)})",
                     "value": float(point), "ci_low": float(lo), "ci_high": float(hi),
                     "n_tasks": len(tasks), "tasks": " ".join(tasks)})
    return pd.DataFrame(rows, columns=["algo", "comparison", "value", "ci_low", "ci_high", "n_tasks", "tasks"])


def performance_profile(norm: pd.DataFrame, taus: np.ndarray, confidence: float = C.DEFAULT_CONFIDENCE,
                        n_resamples: int = C.DEFAULT_RESAMPLES, seed: int = C.DEFAULT_SEED) -> pd.DataFrame:
    """Fraction of runs with normalised score > tau (tasks weighted equally), with stratified-bootstrap CI."""
    df = norm[np.isfinite(norm["norm_score"].to_numpy(float))]
    taus = np.asarray(taus, dtype=float)
    alpha = (1 - confidence) / 2
    frames = []
    for i, ((algo, model), g) in enumerate(df.groupby(["algo", "model"], sort=True)):
        per_task = _per_task_arrays(g, "norm_score")

        def frac(samples):
            return np.mean([(s[..., None] > taus).mean(axis=-2) for s in samples], axis=0)

        point = frac(per_task)
        boot = frac(stratified_resample(per_task, n_resamples, np.random.default_rng([seed, i])))
        lo, hi = np.quantile(boot, [alpha, 1 - alpha], axis=0)
        frames.append(pd.DataFrame({"algo": algo, "model": model, "model_label": C.model_label(model),
                                    "tau": taus, "fraction": point, "ci_low": lo, "ci_high": hi}))
    cols = ["algo", "model", "model_label", "tau", "fraction", "ci_low", "ci_high"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)


# --------------------------------------------------------------------------- curves

def curves_on_grid(table: pd.DataFrame, style: str = "runmax", grid_start: float | None = None,
                   grid_interval: float | None = None, window: int | None = None,
                   max_steps: float | None = None) -> pd.DataFrame:
    """Per-run curves on a common env-step grid, for line plots with a CI band.

    ``style="runmax"`` is the running maximum of the eval return; ``"smoothed"``
    is the reference's interpolated rolling mean.  Grid points beyond a run's
    last evaluation are left out rather than extrapolated.
    """
    if style not in ("runmax", "smoothed"):
        raise ValueError(f"unknown curve style {style!r}; choose 'runmax' or 'smoothed'")
    frames = []
    for run, steps, ret in _each_run(table, max_steps):
        run_id = run["run_id"].iloc[0]
        start, interval, win = _curve_settings(run, grid_start, grid_interval, window)
        if style == "runmax":
            y_obs = np.maximum.accumulate(ret)
            end = steps.max()
            grid = np.arange(start, end + 1e-9, interval, dtype=float) if end >= start else steps[-1:]
            # Between evaluations the best-so-far is the last evaluation's value (a step function).
            idx = np.searchsorted(steps, grid, side="right") - 1
            keep = idx >= 0
            grid, y = grid[keep], y_obs[idx[keep]]
        else:
            grid, y = reference_curve(steps, ret, start, interval, win, max_steps)
        first = run.iloc[0]
        frames.append(pd.DataFrame({"run_id": run_id, "task": first["task"], "algo": first["algo"],
                                    "model": first["model"], "trial": first["trial"],
                                    "env_steps": grid, "value": y}))
    cols = ["run_id", "task", "algo", "model", "trial", "env_steps", "value"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)


CURVE_RULE = ("the mean and its band are computed only at grid points that every run of the group reaches, i.e. "
              "up to the shortest run's last evaluation, so every point of the mean averages the same runs; "
              "longer runs are still drawn as thin lines beyond it")


def _common_points(wide: pd.DataFrame) -> pd.Index:
    """Grid points (columns) where every run (row) has a value."""
    return wide.columns[wide.notna().all(axis=0).to_numpy()]


def _wide(g: pd.DataFrame) -> pd.DataFrame:
    # One row per run (not per trial: two runs of one seed are two rows), one column per grid point.
    return g.pivot_table(index="run_id", columns="env_steps", values="value", aggfunc="first", dropna=False)


def curve_band(curves: pd.DataFrame, confidence: float = C.DEFAULT_CONFIDENCE,
               n_resamples: int = C.DEFAULT_RESAMPLES, seed: int = C.DEFAULT_SEED) -> pd.DataFrame:
    """Mean over runs and percentile-bootstrap CI along the grid of each (task, algo, model).

    The rule (``CURVE_RULE``): a grid point gets a mean (and a band) only if every
    run of the group reaches it, i.e. the mean line ends at the shortest run's last
    evaluation.  A mean over the runs still going would change population where a
    run ends (a "best so far" mean could fall), so it is not drawn;
    :func:`curve_cuts` names the runs whose later points are left out.  The band
    needs at least two runs (a single run's mean is the run itself, with no band);
    where all runs have the same value the band is that value.

    Uses ``scipy.stats.bootstrap`` vectorised over grid points; percentile rather
    than BCa because early grid points are often identical across seeds, where
    BCa is undefined.  ``n_runs`` is the number of runs averaged (every run of
    the group).
    """
    rows = []
    for (task, algo, model), g in curves.groupby(GROUP, sort=True):
        wide = _wide(g)
        wide = wide[_common_points(wide)]
        if wide.shape[1] == 0:
            continue
        data = wide.to_numpy(float)
        mean = data.mean(axis=0)
        low = np.full(data.shape[1], np.nan)
        high = np.full(data.shape[1], np.nan)
        if len(data) >= 2:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = sps.bootstrap((data,), np.mean, axis=0, confidence_level=confidence,
                                    n_resamples=n_resamples, method="percentile",
                                    rng=np.random.default_rng(seed))
            low, high = np.asarray(res.confidence_interval.low, float), np.asarray(res.confidence_interval.high, float)
            const = np.all(data == data[0], axis=0)
            low[const] = high[const] = data[0, const]
        rows.append(pd.DataFrame({"task": task, "algo": algo, "model": model,
                                  "env_steps": wide.columns.to_numpy(float), "mean": mean, "ci_low": low,
                                  "ci_high": high, "n_runs": len(data)}))
    cols = ["task", "algo", "model", "env_steps", "mean", "ci_low", "ci_high", "n_runs"]
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=cols)


def curve_cuts(curves: pd.DataFrame) -> list[tuple[str, str, str]]:
    """A warning per (task, algo, model) whose runs do not all cover the same grid points: the mean line
    (:func:`curve_band`) is cut to the points every run reaches; the warning names the runs whose other points
    are left out of it and where each ends."""
    problems = []
    for (task, algo, model), g in curves.groupby(GROUP, sort=True):
        wide = _wide(g)
        common = _common_points(wide)
        if len(common) == wide.shape[1]:
            continue
        present = wide.notna()
        ends = {rid: float(wide.columns[row.to_numpy()].max()) for rid, row in present.iterrows()}
        starts = {rid: float(wide.columns[row.to_numpy()].min()) for rid, row in present.iterrows()}
        if not len(common):
            problems.append((_group_path(task, algo, model), "warning",
                             f"learning curves: the {len(wide)} runs share no grid point, so no mean line or band "
                             "is drawn; only the runs are"))
            continue
        lo, hi = float(common.min()), float(common.max())
        shortest = min(ends, key=ends.get)
        cut = [f"{rid} (ends at {_steps(e)})" for rid, e in sorted(ends.items()) if e > hi]
        late = [f"{rid} (starts at {_steps(s)})" for rid, s in sorted(starts.items()) if s > float(wide.columns.min())]
        what = f"mean line and band drawn over all {len(wide)} runs from {_steps(lo)} to {_steps(hi)} env steps"
        if cut:
            what += (f", where the shortest run ({shortest}) ends; {len(cut)} longer run(s) are left out of the "
                     f"mean beyond it (drawn as thin lines): {', '.join(cut)}")
        if late:
            what += f"; run(s) starting later: {', '.join(late)}"
        problems.append((_group_path(task, algo, model), "warning", f"learning curves: {what}"))
    return problems
