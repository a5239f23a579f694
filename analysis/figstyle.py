"""What every figure shares: the paper's size and fonts, how a figure is saved, and the order, colours and
hatches by which each model and task is told apart.

Sizes are in inches for a 7-inch text width so that fonts stay legible when the figure is placed at full width in
a paper.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import matplotlib

# Files only, no display needed: set on import, before any figure is made (every figure module imports this one).
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from . import constants as C  # noqa: E402

# The mark of a group with a single run or trial, which has no interval (drawn as none, never as a zero-width one).
SINGLE_RUN = "n=1"

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
_MODEL_ORDER = ["oracle", "markovian", *(m for m in C.MEMORY_MODELS if m != C.CHALLENGER), C.CHALLENGER]


@contextmanager
def paper_style():
    with plt.rc_context(_RC):
        yield


def save(fig, base: str | Path, formats=DEFAULT_FORMATS) -> list[Path]:
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


def model_handles(models) -> list[Patch]:
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
