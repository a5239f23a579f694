"""The score figures, drawn from the tidy DataFrames of :mod:`analysis.stats`, :mod:`analysis.curves` and
:mod:`analysis.aggregate`: per-task bars, learning curves, aggregates and performance profiles.

Every function takes data frames and an output base path (no extension),
writes one file per requested format and returns the paths.  Their shared look
(size, fonts, model order and colours) is :mod:`analysis.figstyle`'s.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from . import constants as C
from . import figstyle  # figstyle.save through the module: a test swaps the one save of every figure
from .aggregate import AGGREGATE_METRICS
from .figstyle import (
    DEFAULT_FORMATS,
    PAPER_WIDTH,
    SINGLE_RUN,
    model_handles,
    order_models,
    order_tasks,
    paper_style,
    source_style,
    task_label,
)


def _steps_formatter(max_steps: float):
    if max_steps >= 1e5:
        return FuncFormatter(lambda v, _: f"{v / 1e6:g}"), "Env steps (millions)"
    return FuncFormatter(lambda v, _: f"{v / 1e3:g}"), "Env steps (thousands)"


# --------------------------------------------------------------------------- per-task bars


def plot_task_bars(
    summary: pd.DataFrame,
    scores: pd.DataFrame,
    base,
    metric_label: str,
    formats=DEFAULT_FORMATS,
    confidence: float = C.DEFAULT_CONFIDENCE,
) -> list[Path]:
    """One row per algorithm, tasks on x, one bar per model with its CI and the individual runs as dots.

    A group with one run has no interval; a missing error bar would read as a zero-width one, so its bar is
    labelled ``n=1`` and the legend says what that means."""
    if summary.empty:
        raise ValueError("no per-task summary to plot (no runs loaded?)")
    algos = sorted(summary["algo"].unique())
    tasks = order_tasks(summary["task"])
    models = order_models(summary["model"])
    with paper_style():
        fig, axes = plt.subplots(
            len(algos), 1, figsize=(PAPER_WIDTH, 2.3 * len(algos) + 0.5), sharex=True, squeeze=False
        )
        for ax, algo in zip(axes[:, 0], algos):
            # A slot per model of this algorithm only (a published variant is one algorithm's).
            row_models = order_models(summary.loc[summary.algo == algo, "model"])
            width = 0.8 / len(row_models)
            for j, model in enumerate(row_models):
                offset = (j - (len(row_models) - 1) / 2) * width
                s = summary[(summary.algo == algo) & (summary.model == model)].set_index("task")
                xs, means, with_ci, single = [], [], [], []
                for i, task in enumerate(tasks):
                    if task in s.index:
                        r = s.loc[task]
                        xs.append(i + offset)
                        means.append(r["mean"])
                        if np.isfinite(r["ci_low"]) and np.isfinite(r["ci_high"]):
                            with_ci.append((i + offset, r["mean"], r["mean"] - r["ci_low"], r["ci_high"] - r["mean"]))
                        elif r["n_runs"] == 1:
                            single.append((i + offset, r["mean"]))
                ax.bar(
                    xs,
                    means,
                    width * 0.92,
                    color=C.model_color(model),
                    edgecolor="black",
                    linewidth=0.4,
                    hatch=source_style(model)[0],
                    alpha=0.85,
                    zorder=2,
                )
                if with_ci:
                    x, m, lo, hi = zip(*with_ci)
                    ax.errorbar(x, m, yerr=[lo, hi], fmt="none", ecolor="black", elinewidth=0.9, capsize=2, zorder=3)
                for x, m in single:
                    ax.annotate(
                        SINGLE_RUN,
                        (x, m),
                        xytext=(0, 2 if m >= 0 else -2),
                        textcoords="offset points",
                        ha="center",
                        va="bottom" if m >= 0 else "top",
                        fontsize=5.5,
                        zorder=6,
                    )
                runs = scores[(scores.algo == algo) & (scores.model == model)]
                for i, task in enumerate(tasks):
                    v = runs.loc[runs.task == task, "score"].to_numpy(float)
                    if len(v):
                        jitter = np.linspace(-0.25, 0.25, len(v)) * width if len(v) > 1 else np.zeros(1)
                        ax.scatter(i + offset + jitter, v, s=6, color="black", alpha=0.6, zorder=4, linewidths=0)
            # The reference's Oracle and Markovian returns show how much of the gap memory closes.
            for i, task in enumerate(tasks):
                ref = C.reference_for(task)
                if ref is not None:
                    ax.hlines(ref.oracle, i - 0.45, i + 0.45, colors="black", linestyles=":", linewidth=1.0, zorder=5)
                    ax.hlines(
                        ref.markovian, i - 0.45, i + 0.45, colors="#555555", linestyles="--", linewidth=1.0, zorder=5
                    )
            ax.set_ylabel(f"{C.algo_label(algo)}\n{metric_label}")
            ax.axhline(0, color="black", linewidth=0.5)
        ax = axes[-1, 0]
        ax.set_xticks(range(len(tasks)))
        ax.set_xticklabels(
            [task_label(t) for t in tasks],
            rotation=30 if len(tasks) > 6 else 0,
            ha="right" if len(tasks) > 6 else "center",
        )
        ax.set_xlim(-0.6, len(tasks) - 0.4)
        handles = model_handles(models)
        if (summary["n_runs"] == 1).any():
            handles.append(Patch(facecolor="none", edgecolor="none", label=f"{SINGLE_RUN}: one run, no CI"))
        if any(C.reference_for(t) for t in tasks):
            handles += [
                plt.Line2D([], [], color="black", linestyle=":", label="Oracle (reference)"),
                plt.Line2D([], [], color="#555555", linestyle="--", label="Markovian (reference)"),
            ]
        fig.legend(
            handles=handles,
            loc="lower center",
            bbox_to_anchor=(0.5, 1.0),
            ncol=len(handles),
            frameon=False,
            title=f"Bars: mean over runs; error bars: {confidence:.0%} bootstrap CI; dots: runs",
        )
        fig.tight_layout()
        return figstyle.save(fig, base, formats)


# --------------------------------------------------------------------------- learning curves


def _model_legend(fig, models, title: str) -> None:
    """One legend above the panels: a line per model (dashed for the reference implementation's runs, dotted for
    published curves)."""
    handles = [
        plt.Line2D([], [], color=C.model_color(m), linewidth=1.6, linestyle=source_style(m)[1], label=C.model_label(m))
        for m in models
    ]
    fig.legend(
        handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(models), frameon=False, title=title
    )


def plot_curves(
    curves: pd.DataFrame,
    band: pd.DataFrame,
    base,
    algo: str,
    y_label: str,
    formats=DEFAULT_FORMATS,
    confidence: float = C.DEFAULT_CONFIDENCE,
) -> list[Path]:
    """One panel per task: thin line per run, mean over runs and its CI band, per model.

    ``band`` comes from :func:`analysis.curves.curve_band`, so the mean and band follow
    ``curves.CURVE_RULE``: they are drawn up to the shortest run of each model; the thin
    lines of longer runs go on."""
    curves = curves[curves.algo == algo]
    band = band[band.algo == algo]
    if curves.empty:
        raise ValueError(f"no curves for algorithm {algo!r}")
    tasks = order_tasks(curves["task"])
    models = order_models(curves["model"])
    ncols = min(4, len(tasks))
    nrows = math.ceil(len(tasks) / ncols)
    fmt, xlabel = _steps_formatter(curves["env_steps"].max())
    with paper_style():
        fig, axes = plt.subplots(nrows, ncols, figsize=(PAPER_WIDTH, 1.9 * nrows + 0.5), squeeze=False)
        for k, task in enumerate(tasks):
            ax = axes[k // ncols, k % ncols]
            for model in models:
                color = C.model_color(model)
                c = curves[(curves.task == task) & (curves.model == model)]
                for _, run in c.groupby("run_id"):
                    ax.plot(run["env_steps"], run["value"], color=color, linewidth=0.5, alpha=0.35)
                # The band holds only grid points every run reaches (curves.CURVE_RULE): the mean line ends at
                # the shortest run, so it never mixes populations.
                b = band[(band.task == task) & (band.model == model)]
                if b.empty:
                    continue
                # Markers when there are few evaluations, so a short run is still visible.
                ax.plot(
                    b["env_steps"],
                    b["mean"],
                    color=color,
                    linewidth=1.6,
                    linestyle=source_style(model)[1],
                    marker="o" if len(b) <= 12 else None,
                    markersize=3,
                )
                ax.fill_between(b["env_steps"], b["ci_low"], b["ci_high"], color=color, alpha=0.2, linewidth=0)
            ax.set_title(task_label(task))
            ax.xaxis.set_major_formatter(fmt)
            if k // ncols == nrows - 1 or k + ncols >= len(tasks):
                ax.set_xlabel(xlabel)
            if k % ncols == 0:
                ax.set_ylabel(y_label)
        for k in range(len(tasks), nrows * ncols):
            axes[k // ncols, k % ncols].set_visible(False)
        _model_legend(
            fig,
            models,
            f"{C.algo_label(algo)}: thin = runs, thick = mean over all runs (up to the "
            f"shortest run), band = {confidence:.0%} bootstrap CI",
        )
        fig.tight_layout()
        return figstyle.save(fig, base, formats)


# --------------------------------------------------------------------------- aggregates


def plot_aggregate(
    agg: pd.DataFrame, base, formats=DEFAULT_FORMATS, confidence: float = C.DEFAULT_CONFIDENCE
) -> list[Path]:
    """IQM, mean and optimality gap of the normalised score per algorithm x model, with stratified-bootstrap
    CIs, each group labelled with its number of tasks."""
    if agg.empty:
        raise ValueError("no aggregate scores to plot (no task with normalisation constants?)")
    metrics = [m for m in AGGREGATE_METRICS if m in set(agg["metric"])]
    groups = agg[["algo", "model"]].drop_duplicates()
    model_order = order_models(agg["model"])
    groups = sorted(groups.itertuples(index=False), key=lambda g: (g.algo, model_order.index(g.model)))
    # Each algorithm's aggregate is over its own task set (aggregate.common_task_sets): one count for the figure
    # told an algorithm over 2 tasks it was over 3.
    n_tasks = agg.groupby(["algo", "model"])["n_tasks"].first()
    labels = []
    for g in groups:
        n = int(n_tasks[(g.algo, g.model)])
        labels.append(f"{C.group_label(g.algo, g.model)} ({n} task{'s' if n != 1 else ''})")
    with paper_style():
        fig, axes = plt.subplots(
            1, len(metrics), figsize=(PAPER_WIDTH, 0.32 * len(groups) + 0.9), sharey=True, squeeze=False
        )
        for ax, metric in zip(axes[0], metrics):
            for y, g in enumerate(groups):
                r = agg[(agg.algo == g.algo) & (agg.model == g.model) & (agg.metric == metric)].iloc[0]
                # One run on every task: every resample repeats the runs, so the "interval" is the point.
                if r["n_runs"] == r["n_tasks"]:
                    ax.plot(r["value"], y, "o", color=C.model_color(g.model), markersize=4)
                    ax.annotate(
                        f"{SINGLE_RUN} per task",
                        (r["value"], y),
                        xytext=(0, 4),
                        textcoords="offset points",
                        ha="center",
                        va="bottom",
                        fontsize=5.5,
                    )
                    continue
                ax.errorbar(
                    r["value"],
                    y,
                    xerr=[[r["value"] - r["ci_low"]], [r["ci_high"] - r["value"]]],
                    fmt="o",
                    color=C.model_color(g.model),
                    markersize=4,
                    capsize=3,
                    elinewidth=1.4,
                )
            ax.set_title(f"{metric} (lower is better)" if metric == "Optimality gap" else metric)
            ax.set_yticks(range(len(groups)))
            ax.set_yticklabels(labels)
            ax.set_ylim(-0.6, len(groups) - 0.4)
            ax.invert_yaxis()
        fig.supxlabel("Normalised score (0 = Random, 1 = Oracle)", fontsize=8.5)
        fig.suptitle(f"{confidence:.0%} stratified-bootstrap CIs", y=1.0, fontsize=8)
        fig.tight_layout()
        return figstyle.save(fig, base, formats)


def plot_profile(
    profile: pd.DataFrame, base, formats=DEFAULT_FORMATS, confidence: float = C.DEFAULT_CONFIDENCE
) -> list[Path]:
    """Performance profile: fraction of runs above each normalised-score threshold, one panel per algorithm."""
    if profile.empty:
        raise ValueError("no performance profile to plot (no task with normalisation constants?)")
    algos = sorted(profile["algo"].unique())
    models = order_models(profile["model"])
    with paper_style():
        fig, axes = plt.subplots(1, len(algos), figsize=(PAPER_WIDTH, 2.4), sharey=True, squeeze=False)
        for ax, algo in zip(axes[0], algos):
            for model in models:
                p = profile[(profile.algo == algo) & (profile.model == model)]
                if p.empty:
                    continue
                color = C.model_color(model)
                ax.plot(
                    p["tau"],
                    p["fraction"],
                    color=color,
                    linewidth=1.5,
                    label=C.model_label(model),
                    linestyle=source_style(model)[1],
                )
                ax.fill_between(p["tau"], p["ci_low"], p["ci_high"], color=color, alpha=0.2, linewidth=0)
            ax.set_title(C.algo_label(algo))
            ax.set_xlabel(r"Normalised score threshold $\tau$")
            ax.set_ylim(-0.02, 1.02)
        axes[0, 0].set_ylabel(r"Fraction of runs with score $> \tau$")
        _model_legend(fig, models, f"Band: {confidence:.0%} stratified-bootstrap CI")
        fig.tight_layout()
        return figstyle.save(fig, base, formats)
