"""Figures of the memories themselves rather than of their returns: FFM's learned timescales (the paper's decay
figure, from :mod:`analysis.decay`) and what each memory costs to run (the efficiency figure, from
:mod:`analysis.bench`).

Every function takes a data frame and an output base path (no extension), writes one file per requested format
and returns the paths.  Their shared look is :mod:`analysis.figstyle`'s.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from . import constants as C
from . import figstyle  # figstyle.save through the module: a test swaps the one save of every figure
from .bench import EFFICIENCY_METRICS, METRIC_TITLES, better
from .figstyle import DEFAULT_FORMATS, PAPER_WIDTH, SINGLE_RUN, model_handles, order_models, paper_style


def _natural_key(text: str):
    # "T64" before "T256": compare digit runs as numbers.
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


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
    with paper_style():
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
        return figstyle.save(fig, base, formats)


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
    with paper_style():
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
            handles=model_handles(models),
            loc="lower center",
            bbox_to_anchor=(0.5, 1.0),
            ncol=len(models),
            frameon=False,
        )
        fig.tight_layout()
        return figstyle.save(fig, base, formats)


def _ratio_label(row) -> str:
    """A bar's ratio to FFM with its CI (n=1 where a single trial gives none)."""
    if row.name == "ffm":
        return "FFM"
    if np.isfinite(row["to_ffm_low"]) and np.isfinite(row["to_ffm_high"]):
        return f"{row['to_ffm']:.2f}x [{row['to_ffm_low']:.2f}, {row['to_ffm_high']:.2f}]"
    return f"{row['to_ffm']:.2f}x, {SINGLE_RUN}" if row["n_trials"] == 1 else f"{row['to_ffm']:.2f}x"


def _ratio_labels(ax, got: pd.DataFrame, ys: list[int]) -> None:
    """Each bar's ratio to FFM written past the end of its error bar (the axis widened to hold it)."""
    ends = np.fmax(got["median"].to_numpy(), np.nan_to_num(got["ci_high"].to_numpy()))
    for y, end, (_, row) in zip(ys, ends, got.iterrows()):
        ax.annotate(_ratio_label(row), (end, y), xytext=(2, 0), textcoords="offset points", va="center", fontsize=4)
    ax.margins(x=0.45)


def plot_paper_efficiency(
    summary: pd.DataFrame, returns: pd.DataFrame | None, base, formats=DEFAULT_FORMATS
) -> list[Path]:
    """The FFM paper's efficiency figure: per shape (a row of panels), train time on a log axis, inference latency
    and memory, a horizontal bar per model (registry order, top down; a Python-cell variant hatched): the median of
    its trials with its bootstrapped CI, and beside it its ratio to FFM's median with that ratio's CI (``summary``:
    :func:`analysis.bench.summarize_efficiency`); a single trial (peak memory is measured once) has no error bar
    and says n=1. Where ``returns`` is given (model, mean, ci_low, ci_high: one task and algorithm), each model's
    best return."""
    if summary.empty:
        raise ValueError("no efficiency rows to plot")
    shapes = list(dict.fromkeys(summary["shape"]))
    models = list(dict.fromkeys(summary["model"]))
    panels = [m for m in EFFICIENCY_METRICS if m in set(summary["metric"])]
    panels += ["return"] if returns is not None else []
    height = 0.8 + 0.17 * len(models)
    with paper_style():
        fig, axes = plt.subplots(
            len(shapes), len(panels), figsize=(PAPER_WIDTH, height * len(shapes)), squeeze=False, sharey=True
        )
        for i, shape in enumerate(shapes):
            for j, metric in enumerate(panels):
                ax = axes[i, j]
                if metric == "return":
                    d, title, unit = returns.set_index("model"), "Best return (learning check)", ""
                    center = "mean"
                else:
                    d = summary[(summary["shape"] == shape) & (summary["metric"] == metric)].set_index("model")
                    title, unit = METRIC_TITLES[metric], d["unit"].iloc[0] if len(d) else ""
                    center = "median"
                ys = [k for k, m in enumerate(models) if m in d.index]
                got = d.loc[[models[k] for k in ys]]
                err = np.array([got[center] - got["ci_low"], got["ci_high"] - got[center]])
                bars = ax.barh(
                    ys, got[center], color=[C.model_color(m) for m in got.index], edgecolor="black", linewidth=0.4
                )
                has_ci = np.isfinite(err).all(axis=0)  # (no interval, no bar: a zero-width one would claim one)
                if has_ci.any():
                    ax.errorbar(
                        got[center][has_ci],
                        np.asarray(ys)[has_ci],
                        xerr=err[:, has_ci],
                        fmt="none",
                        ecolor="black",
                        elinewidth=0.6,
                        capsize=1.5,
                    )
                for bar, m in zip(bars, got.index):
                    if m.split(C.VARIANT_SEP)[1:] == ["cells"]:  # the paper's Python-cell GRU, LSTM, Elman
                        bar.set_hatch("////")
                if metric != "return":
                    _ratio_labels(ax, got, ys)
                if metric == "train_s":  # (the paper's log axis, its ticks plainly written)
                    ax.set_xscale("log")
                    wide = got[center].max() > 100 * got[center].min()  # (then one tick a decade: no crowding)
                    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1,) if wide else (1, 2, 5)))
                    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                    ax.xaxis.set_minor_formatter(NullFormatter())
                ax.set_title(f"{shape}\n{title}" if j == 0 else title, fontsize=7)
                better_way = "higher" if metric == "return" else "lower"
                ax.set_xlabel(f"{'return' if metric == 'return' else unit}, {better_way} is better")
                ax.grid(axis="x", alpha=0.3)
        axes[0, 0].set_yticks(range(len(models)))  # (every panel shares the y axis)
        axes[0, 0].set_yticklabels([C.model_label(m) for m in models])
        axes[0, 0].invert_yaxis()
        fig.tight_layout()
        return figstyle.save(fig, base, formats)
