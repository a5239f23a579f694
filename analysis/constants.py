"""Names, defaults and reference numbers shared by the analysis package.

The normalisation constants are the reference implementation's per-task
Oracle / Markovian / Random returns (POMDP-Baselines ``scripts/constants.py``,
docs/reference.md#reference-plots), which were measured on the PyBullet ("BLT")
versions of the locomotion tasks.  They are deliberately *not* applied to MuJoCo
tasks of the same name: the two simulators have different reward scales, so such
a score would be meaningless.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pomdp_ffm import catalog, metrics

# progress.csv column names: declared once, by the logger's metrics table (identical to the reference's).
COL_ENV_STEPS, COL_ROLLOUTS, COL_RL_STEPS = metrics.ENV_STEPS, metrics.ROLLOUTS, metrics.RL_STEPS
COL_RETURN, COL_EVAL_LEN, COL_SUCCESS = metrics.EVAL_RETURN, metrics.EVAL_LENGTH, metrics.EVAL_SUCCESS
COL_TIME, COL_FPS = metrics.TIME_COST, metrics.FPS

# progress.csv column -> tidy-table column.
EVAL_COLUMNS = {
    COL_ENV_STEPS: "env_steps",
    COL_RETURN: "eval_return",
    COL_RL_STEPS: "rl_steps",
    COL_ROLLOUTS: "rollouts",
    COL_EVAL_LEN: "eval_episode_len",
    COL_SUCCESS: "success_rate",
    COL_TIME: "time_cost_s",
    COL_FPS: "fps",
}

# The memories an agent of the comparison is built on, in the registry's order, with their labels and colours (the
# catalog's, read without importing torch); Markovian and Oracle are the reference's baselines, not memory models.
_MEMORIES = list(catalog.memories().values())
MEMORY_MODELS = tuple(m.name for m in _MEMORIES)
MODEL_LABELS = {**{m.name: m.label for m in _MEMORIES}, "markovian": "Markovian", "oracle": "Oracle"}
# The comparison drawn by default: FFM against the reference's RNNs (pomdp_ffm.catalog).
CHALLENGER, BASELINES = catalog.CHALLENGER, catalog.BASELINES
# Our algorithms, and the reference's discrete SAC.
ALGO_LABELS = {**{a.name: a.label for a in catalog.ALGORITHMS}, "sacd": "SACD"}
KNOWN_ALGOS = tuple(ALGO_LABELS)
KNOWN_MODELS = tuple(MODEL_LABELS)

# Fixed colours so that a model keeps its colour across every figure.
MODEL_COLORS = {**{m.name: m.color for m in _MEMORIES}, "markovian": "#bbbbbb", "oracle": "#000000"}

# Paper / reference conventions (docs/reference.md#evaluation-clock, #reference-plots, #ffm-paper-plots).
DEFAULT_SEED = 0
DEFAULT_RESAMPLES = 10_000
DEFAULT_CONFIDENCE = 0.95
DEFAULT_GRID_START = 12_000
DEFAULT_GRID_INTERVAL = 4_000
DEFAULT_SMOOTH_WINDOW = 20
# The reference's merge/plot settings per task family (docs/reference.md#reference-plots; the reference's
# scripts/eval.sh): grid start, interval and smoothing window. 1000-step locomotion tasks evaluate every 4
# iterations from 12k steps; Pendulum every 1000 steps from 2k.
PENDULUM_CURVE = (2_000, 1_000, 3)
LOCOMOTION_CURVE = (DEFAULT_GRID_START, DEFAULT_GRID_INTERVAL, DEFAULT_SMOOTH_WINDOW)

DEFAULT_LAST_FRACTION = 0.2
DEFAULT_BETA = 0.01
BLT_BUDGET = 1_500_000


def curve_defaults(task: str) -> tuple[float, float, int]:
    """(grid start, grid interval, smoothing window) the reference used for this task's family."""
    return PENDULUM_CURVE if str(task).startswith("Pendulum") else LOCOMOTION_CURVE


METRIC_RUNMAX = "runmax"
METRIC_LAST20 = "last20"
METRIC_DESCRIPTIONS = {
    METRIC_RUNMAX: "final running maximum of the deterministic eval return (FFM paper)",
    METRIC_LAST20: "mean of the last 20% of the smoothed, grid-interpolated eval return (reference rundown)",
}


def metric_description(metric: str, last_fraction: float = DEFAULT_LAST_FRACTION) -> str:
    """METRIC_DESCRIPTIONS[metric], with last20's fraction as given (``--last-frac``)."""
    text = METRIC_DESCRIPTIONS[metric]
    return text.replace("20%", f"{last_fraction:.0%}") if metric == METRIC_LAST20 else text


@dataclass(frozen=True)
class Reference:
    oracle: float
    markovian: float
    random: float


# Keyed by (robot, observability).  Robot names follow the reference's short names.
NORMALISATION = {
    ("Ant", "P"): Reference(3394.0, 1132.946, 372.6779),
    ("Ant", "V"): Reference(3394.0, 645.05, 372.6779),
    ("HalfCheetah", "P"): Reference(2994.0, 870.48, -1256.6604),
    ("HalfCheetah", "V"): Reference(2994.0, 517.946, -1256.6604),
    ("Hopper", "P"): Reference(2434.0, 477.911, 19.9634),
    ("Hopper", "V"): Reference(2434.0, 228.366, 19.9634),
    ("Walker", "P"): Reference(2225.0, 471.815, 16.5319),
    ("Walker", "V"): Reference(2225.0, 214.45, 16.5319),
}

TASK_RE = re.compile(r"^(?P<family>[A-Za-z0-9]+)-(?P<obs>[FPV])-v(?P<version>\d+)$")


def parse_task(task: str) -> tuple[str, str] | None:
    """Split a task id such as ``HopperBLT-P-v0`` into ``("HopperBLT", "P")``."""
    m = TASK_RE.match(task)
    if m is None:
        return None
    return m.group("family"), m.group("obs")


def reference_for(task: str) -> Reference | None:
    """Normalisation constants for a task id, or None when the reference has none."""
    parsed = parse_task(task)
    if parsed is None:
        return None
    family, obs = parsed
    if not family.endswith("BLT"):
        return None
    robot = family[: -len("BLT")]
    return NORMALISATION.get((robot, obs))


# A group's model names its source: ours bare, the reference implementation's runs "@ref" (unless
# --pool-sources), POMDP-Baselines' published curves "@pub" (never pooled: other engine versions, see
# analysis.published).
REF_SUFFIX = "@ref"
PUB_SUFFIX = "@pub"
SOURCE_SUFFIXES = {"reference": REF_SUFFIX, "published": PUB_SUFFIX}
# A published variant of the reference's own method, by its tags but the algorithm (RL-Encoder-Len-Inputs[-Arch],
# the reference's scripts/constants.py): "gru-64-oa-separate".
PUBLISHED_VARIANT_RE = re.compile(r"^(?P<encoder>[a-z0-9]+)-(?P<len>-?\d+)-(?P<inputs>[a-z]+)(?:-(?P<arch>[a-z]+))?$")


def model_source(model: str) -> str:
    """ "reference", "published" or "ours", read off the model's suffix (pooled reference runs read as ours)."""
    return next((src for src, suffix in SOURCE_SUFFIXES.items() if model.endswith(suffix)), "ours")


def base_model(model: str) -> str:
    """The memory model without the source tag."""
    suffix = SOURCE_SUFFIXES.get(model_source(model), "")
    return model[: -len(suffix)] if suffix else model


# Another agent around the same memory (the reference's run names: oracle_, <L> layers, _shared): "gru+oracle".
VARIANT_SEP = "+"
# ("cells": the efficiency benchmark's GRU, LSTM and Elman written out in Python, the FFM paper's fair comparison)
_VARIANT_LABELS = {"oracle": "oracle", "shared": "shared memory", "cells": "Python cells"}


def model_variant(memory: str, tags: list[str]) -> str:
    return VARIANT_SEP.join([memory, *tags])


def memory_of(model: str) -> str:
    """The memory model alone: without the source tag and the variant's tags; a published method that is not a
    variant of the reference's own (ppo_gru, VRM) is its own name."""
    base = base_model(model)
    if model_source(model) == "published":
        m = PUBLISHED_VARIANT_RE.match(base)
        return m.group("encoder") if m else base
    return base.split(VARIANT_SEP)[0]


def is_model_group(model: str) -> bool:
    """A plain agent on one of MEMORY_MODELS: what the aggregate and the probability of improvement compare. Other
    agents (the reference's oracle / layered / shared-memory variants, Markovian, Oracle, published methods such as
    ppo_gru) are shown but never narrow a comparison."""
    base = base_model(model)
    if model_source(model) == "published":
        return PUBLISHED_VARIANT_RE.match(base) is not None and memory_of(model) in MEMORY_MODELS
    return VARIANT_SEP not in base and base in MEMORY_MODELS


def model_label(model: str) -> str:
    """ "GRU", "GRU (ref)", "GRU (ref, oracle)", "GRU (2 layers)", "GRU len-64 oa (published)"."""
    if model_source(model) == "published":
        m = PUBLISHED_VARIANT_RE.match(base_model(model))
        if m is None:
            return f"{base_model(model)} (published)"
        arch = f" {m.group('arch')}" if m.group("arch") not in (None, "separate") else ""
        encoder = MODEL_LABELS.get(m.group("encoder"), m.group("encoder").upper())
        return f"{encoder} len-{m.group('len')} {m.group('inputs')}{arch} (published)"
    memory, *tags = base_model(model).split(VARIANT_SEP)
    extras = (["ref"] if model.endswith(REF_SUFFIX) else []) + [
        _VARIANT_LABELS.get(t, re.sub(r"^(\d+)layer$", r"\1 layers", t)) for t in tags
    ]
    label = MODEL_LABELS.get(memory, memory.upper())
    return f"{label} ({', '.join(extras)})" if extras else label


def group_label(algo: str, model: str) -> str:
    """An algorithm x model group in one label: "FFM + SAC"; a published group by its variant string, algorithm
    first as the reference writes it ("TD3 GRU len-64 oa (published)"), a published method by its name."""
    if model_source(model) == "published":
        if PUBLISHED_VARIANT_RE.match(base_model(model)) is None:
            return model_label(model)
        return f"{algo_label(algo)} {model_label(model)}"
    return f"{model_label(model)} + {algo_label(algo)}"


def model_color(model: str) -> str:
    return MODEL_COLORS.get(memory_of(model), "#cc79a7")


def algo_label(algo: str) -> str:
    return ALGO_LABELS.get(algo, algo.upper())
