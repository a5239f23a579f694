"""Learning curves on the reference's env-step grid, their mean over runs and its bootstrap band."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
from scipy import stats as sps

from . import constants as C
from .stats import GROUP, curve_settings, each_run, fmt_steps, group_path, group_seed, reference_curve, value_order


def curves_on_grid(
    table: pd.DataFrame,
    style: str = "runmax",
    grid_start: float | None = None,
    grid_interval: float | None = None,
    window: int | None = None,
    max_steps: float | None = None,
) -> pd.DataFrame:
    """Per-run curves on a common env-step grid, for line plots with a CI band.

    ``style="runmax"`` is the running maximum of the eval return; ``"smoothed"``
    is the reference's interpolated rolling mean.  Grid points beyond a run's
    last evaluation are left out rather than extrapolated.
    """
    if style not in ("runmax", "smoothed"):
        raise ValueError(f"unknown curve style {style!r}; choose 'runmax' or 'smoothed'")
    frames = []
    for run, steps, ret in each_run(table, max_steps):
        run_id = run["run_id"].iloc[0]
        start, interval, win = curve_settings(run, grid_start, grid_interval, window)
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
        frames.append(
            pd.DataFrame(
                {
                    "run_id": run_id,
                    "task": first["task"],
                    "algo": first["algo"],
                    "model": first["model"],
                    "trial": first["trial"],
                    "env_steps": grid,
                    "value": y,
                }
            )
        )
    cols = ["run_id", "task", "algo", "model", "trial", "env_steps", "value"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)


CURVE_RULE = (
    "the mean and its band are computed only at grid points that every run of the group reaches, i.e. "
    "up to the shortest run's last evaluation, so every point of the mean averages the same runs; "
    "longer runs are still drawn as thin lines beyond it"
)


def _common_points(wide: pd.DataFrame) -> pd.Index:
    """Grid points (columns) where every run (row) has a value."""
    return wide.columns[wide.notna().all(axis=0).to_numpy()]


def _wide(g: pd.DataFrame) -> pd.DataFrame:
    # One row per run (not per trial: two runs of one seed are two rows), one column per grid point.
    return g.pivot_table(index="run_id", columns="env_steps", values="value", aggfunc="first", dropna=False)


def curve_band(
    curves: pd.DataFrame,
    confidence: float = C.DEFAULT_CONFIDENCE,
    n_resamples: int = C.DEFAULT_RESAMPLES,
    seed: int = C.DEFAULT_SEED,
) -> pd.DataFrame:
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
    BCa is undefined.  Whole runs are resampled, in :func:`analysis.stats.value_order`
    (by their curves' values, not their folders).  ``n_runs`` is the number of runs averaged (every run of
    the group).
    """
    rows = []
    for (task, algo, model), g in curves.groupby(GROUP, sort=True):
        wide = _wide(g)
        wide = wide[_common_points(wide)]
        if wide.shape[1] == 0:
            continue
        data = value_order(wide.to_numpy(float))
        mean = data.mean(axis=0)
        low = np.full(data.shape[1], np.nan)
        high = np.full(data.shape[1], np.nan)
        if len(data) >= 2:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = sps.bootstrap(
                    (data,),
                    np.mean,
                    axis=0,
                    confidence_level=confidence,
                    n_resamples=n_resamples,
                    method="percentile",
                    rng=np.random.default_rng(group_seed(seed, task, algo, model)),
                )
            low, high = np.asarray(res.confidence_interval.low, float), np.asarray(res.confidence_interval.high, float)
            const = np.all(data == data[0], axis=0)
            low[const] = high[const] = data[0, const]
        rows.append(
            pd.DataFrame(
                {
                    "task": task,
                    "algo": algo,
                    "model": model,
                    "env_steps": wide.columns.to_numpy(float),
                    "mean": mean,
                    "ci_low": low,
                    "ci_high": high,
                    "n_runs": len(data),
                }
            )
        )
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
            problems.append(
                (
                    group_path(task, algo, model),
                    "warning",
                    f"learning curves: the {len(wide)} runs share no grid point, so no mean line or band "
                    "is drawn; only the runs are",
                )
            )
            continue
        lo, hi = float(common.min()), float(common.max())
        shortest = min(ends, key=ends.get)
        cut = [f"{rid} (ends at {fmt_steps(e)})" for rid, e in sorted(ends.items()) if e > hi]
        first = float(wide.columns.min())
        late = [f"{rid} (starts at {fmt_steps(s)})" for rid, s in sorted(starts.items()) if s > first]
        what = f"mean line and band drawn over all {len(wide)} runs from {fmt_steps(lo)} to {fmt_steps(hi)} env steps"
        if cut:
            what += (
                f", where the shortest run ({shortest}) ends; {len(cut)} longer run(s) are left out of the "
                f"mean beyond it (drawn as thin lines): {', '.join(cut)}"
            )
        if late:
            what += f"; run(s) starting later: {', '.join(late)}"
        problems.append((group_path(task, algo, model), "warning", f"learning curves: {what}"))
    return problems
