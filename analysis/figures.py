"""Paper figures, drawn from the tidy DataFrames of :mod:`analysis.stats`.

Every function takes data frames and an output base path (no extension),
writes one file per requested format and returns the paths.  Sizes are in
inches for a 7-inch text width so that fonts stay legible when the figure is
placed at full width in a paper.
"""

from __future__ import annotations

import math
import re
from contextlib import contextmanager
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from . import constants as C  # noqa: E402
from .aggregate import AGGREGATE_METRICS  # noqa: E402
from .bench import METRIC_TITLES, better  # noqa: E402

PAPER_WIDTH = 7.0
DEFAULT_FORMATS = ("png", "pdf")
_RC = {
    "font.size": 8,
    "axes.titlesize": 9,
    "axes.labelsize": 8.5,
    "xtick.labelsize": 7.5,
    "ytick.labelsize": 7.5,
    "legend.fontsize": 8,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.5,
    "savefig.dpi": 300,
    "pdf.fonttype": 42,
}
# The baselines, the other memories, FFM (the one studied) last.
_MODEL_ORDER = ["oracle", "markovian", *(m for m in C.MEMORY_MODELS if m != "ffm"), "ffm"]
# The mark of a group with a single run, which has no interval (drawn as none, never as a zero-width one).
SINGLE_RUN = "n=1"


@contextmanager
def _paper_style():
    with plt.rc_context(_RC):
        yield


def _save(fig, base: str | Path, formats=DEFAULT_FORMATS) -> list[Path]:
    base = Path(base)
    base.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        if fmt not in ("png", "pdf", "svg"):
            raise ValueError(f"unsupported figure format {fmt!r}; use png, pdf or svg")
        p = base.with_suffix(f".{fmt}")
        fig.savefig(p, bbox_inches="tight")
        paths.append(p)
    plt.close(fig)
    return paths


def _natural_key(text: str):
    # "T64" before "T256": compare digit runs as numbers.
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def task_label(task: str) -> str:
    return task[: -len("-v0")] if task.endswith("-v0") else task


def order_tasks(tasks) -> list[str]:
    def key(t):
        parsed = C.parse_task(t)
        return (parsed[0], parsed[1]) if parsed else (t, "")

    return sorted(set(tasks), key=key)


_SOURCE_ORDER = ("ours", "reference", "published")
# How a group's source shows beside its memory's colour: bar hatch and line style.
_SOURCE_STYLE = {"ours": ("", "-"), "reference": ("//", "--"), "published": ("xx", ":")}


def source_style(model: str) -> tuple[str, str]:
    """(bar hatch, line style) of a model's source: plain for ours, dashed for the reference's runs, dotted for
    published curves."""
    return _SOURCE_STYLE[C.model_source(model)]


def order_models(models) -> list[str]:
    def key(m):
        memory = C.memory_of(m)
        rank = _MODEL_ORDER.index(memory) if memory in _MODEL_ORDER else len(_MODEL_ORDER)
        return (rank, _SOURCE_ORDER.index(C.model_source(m)), not C.is_model_group(m), m)

    return sorted(set(models), key=key)


def _model_handles(models) -> list[Patch]:
    return [
        Patch(
            facecolor=C.model_color(m),
            edgecolor="black",
            linewidth=0.5,
            hatch=source_style(m)[0],
            label=C.model_label(m),
        )
        for m in models
    ]


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
    with _paper_style():
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
        handles = _model_handles(models)
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
        return _save(fig, base, formats)


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
    with _paper_style():
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
        return _save(fig, base, formats)


# --------------------------------------------------------------------------- aggregates


def plot_aggregate(
    agg: pd.DataFrame, base, formats=DEFAULT_FORMATS, confidence: float = C.DEFAULT_CONFIDENCE
) -> list[Path]:
    """IQM, mean and optimality gap of the normalised score per algorithm x model, with stratified-bootstrap
    CIs."""
    if agg.empty:
        raise ValueError("no aggregate scores to plot (no task with normalisation constants?)")
    metrics = [m for m in AGGREGATE_METRICS if m in set(agg["metric"])]
    groups = agg[["algo", "model"]].drop_duplicates()
    model_order = order_models(agg["model"])
    groups = sorted(groups.itertuples(index=False), key=lambda g: (g.algo, model_order.index(g.model)))
    with _paper_style():
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
            ax.set_yticklabels([C.group_label(g.algo, g.model) for g in groups])
            ax.set_ylim(-0.6, len(groups) - 0.4)
            ax.invert_yaxis()
        n_tasks = int(agg["n_tasks"].max())
        fig.supxlabel("Normalised score (0 = Random, 1 = Oracle)", fontsize=8.5)
        fig.suptitle(f"Over {n_tasks} task(s); {confidence:.0%} stratified-bootstrap CIs", y=1.0, fontsize=8)
        fig.tight_layout()
        return _save(fig, base, formats)


def plot_profile(
    profile: pd.DataFrame, base, formats=DEFAULT_FORMATS, confidence: float = C.DEFAULT_CONFIDENCE
) -> list[Path]:
    """Performance profile: fraction of runs above each normalised-score threshold, one panel per algorithm."""
    if profile.empty:
        raise ValueError("no performance profile to plot (no task with normalisation constants?)")
    algos = sorted(profile["algo"].unique())
    models = order_models(profile["model"])
    with _paper_style():
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
        return _save(fig, base, formats)


# --------------------------------------------------------------------------- interpretability


def plot_decay(decay: pd.DataFrame, base, title: str, beta: float, formats=DEFAULT_FORMATS) -> list[Path]:
    """Histograms of trace durability and context period for actor and critic FFMs (log-spaced bins)."""
    if decay.empty:
        raise ValueError("no FFM alpha/omega values to plot")
    panels = [
        ("t_alpha", rf"Trace durability $t_\alpha$ (steps, $\beta$={beta:g})"),
        ("t_omega", r"Context period $t_\omega$ (steps)"),
    ]
    colors = {"actor": "#0072b2", "critic": "#d55e00"}
    with _paper_style():
        fig, axes = plt.subplots(1, 2, figsize=(PAPER_WIDTH, 2.4), squeeze=False)
        for ax, (quantity, xlabel) in zip(axes[0], panels):
            d = decay[decay.quantity == quantity]
            finite = d["steps"][np.isfinite(d["steps"])]
            n_inf = int((~np.isfinite(d["steps"])).sum())
            if finite.empty:
                ax.text(0.5, 0.5, "no finite values", transform=ax.transAxes, ha="center")
            else:
                lo, hi = finite.min(), finite.max()
                lo, hi = (lo / 2, hi * 2) if lo == hi else (lo, hi)
                bins = np.geomspace(lo, hi, 31)
                for module in ("actor", "critic"):
                    v = d.loc[(d.module == module) & np.isfinite(d["steps"]), "steps"]
                    if len(v):
                        ax.hist(
                            v,
                            bins=bins,
                            color=colors[module],
                            alpha=0.55,
                            label=f"{module} (n={len(v)})",
                            edgecolor="black",
                            linewidth=0.3,
                        )
                ax.set_xscale("log")
                ax.legend(frameon=False)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("Count")
            if n_inf:
                ax.text(
                    0.98,
                    0.02,
                    f"{n_inf} infinite, not shown",
                    transform=ax.transAxes,
                    ha="right",
                    va="bottom",
                    fontsize=7,
                )
        fig.suptitle(title, fontsize=9)
        fig.tight_layout()
        return _save(fig, base, formats)


# --------------------------------------------------------------------------- efficiency


def plot_efficiency(bench: pd.DataFrame, base, formats=DEFAULT_FORMATS) -> list[Path]:
    """One panel per (benchmark, metric): bars per shape, one per model."""
    if bench.empty:
        raise ValueError("no benchmark rows to plot")
    known = list(METRIC_TITLES)
    panels = sorted(
        bench[["benchmark", "metric", "unit"]].drop_duplicates().itertuples(index=False),
        key=lambda p: (known.index(p.metric) if p.metric in known else len(known), p.benchmark, p.unit),
    )
    models = order_models(bench["model"])
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    with _paper_style():
        fig, axes = plt.subplots(nrows, ncols, figsize=(PAPER_WIDTH, 2.3 * nrows + 0.4), squeeze=False)
        for k, p in enumerate(panels):
            ax = axes[k // ncols, k % ncols]
            d = bench[(bench.benchmark == p.benchmark) & (bench.metric == p.metric) & (bench.unit == p.unit)]
            shapes = sorted(d["shape"].unique(), key=_natural_key)
            width = 0.8 / len(models)
            for j, model in enumerate(models):
                v = d[d.model == model].set_index("shape")["value"]
                xs = [i + (j - (len(models) - 1) / 2) * width for i, s in enumerate(shapes) if s in v.index]
                ax.bar(
                    xs,
                    [v[s] for s in shapes if s in v.index],
                    width * 0.92,
                    color=C.model_color(model),
                    edgecolor="black",
                    linewidth=0.4,
                )
            ax.set_xticks(range(len(shapes)))
            ax.set_xticklabels([s.replace("_", "\n") for s in shapes])
            direction = better(p.metric, p.unit)
            ax.set_title(
                f"{METRIC_TITLES.get(p.metric, p.metric)} [{p.benchmark}]"
                + (f"\n{direction} is better" if direction else "")
            )
            ax.set_ylabel(f"{p.metric} ({p.unit})")
        for k in range(len(panels), nrows * ncols):
            axes[k // ncols, k % ncols].set_visible(False)
        # Which way is better differs per panel (ms, MB: lower; updates/s, GFLOP/s: higher): each title says it.
        fig.legend(
            handles=_model_handles(models),
            loc="lower center",
            bbox_to_anchor=(0.5, 1.0),
            ncol=len(models),
            frameon=False,
        )
        fig.tight_layout()
        return _save(fig, base, formats)
