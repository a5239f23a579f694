"""Across-task statistics: IQM, mean and optimality gap of normalised scores, probability of improvement and
performance profiles, with stratified-bootstrap intervals.

They follow Agarwal et al. (2021, "Deep RL at the Edge of the Statistical Precipice") and its library rliable,
written here on top of numpy because rliable does not install on the numpy 2 / scipy 1.17 stack this project
uses; each is a few lines, and the tests check them against direct computations. Every group's bootstrap is
seeded from its own name (:func:`analysis.stats.group_seed`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats as sps

from . import constants as C
from .stats import group_seed, value_order

AGGREGATE_METRICS = ("IQM", "Mean", "Optimality gap")
# The optimality gap's target: the Oracle's return, 1 on the normalised scale (rliable's gamma).
GAP_TARGET = 1.0
AGGREGATE_COLUMNS = [
    "algo",
    "model",
    "model_label",
    "metric",
    "value",
    "ci_low",
    "ci_high",
    "n_tasks",
    "n_runs",
    "tasks",
    "single_run_tasks",
]
POI_COLUMNS = [
    "algo",
    "model_x",
    "model_y",
    "comparison",
    "value",
    "ci_low",
    "ci_high",
    "n_tasks",
    "tasks",
    "single_run_tasks",
]


def iqm(x, axis=-1):
    """Interquartile mean: the mean of the middle 50% (25% trimmed from each end)."""
    return sps.trim_mean(x, 0.25, axis=axis)


def _per_task_arrays(df: pd.DataFrame, value: str) -> list[np.ndarray]:
    return [value_order(g[value]) for _, g in df.groupby("task", sort=True)]


def _aggregate(samples: list[np.ndarray]) -> dict[str, np.ndarray]:
    """IQM over all runs pooled, mean of per-task means, and the optimality gap (the target less the mean of
    per-task means of scores capped at it), on arrays shaped (..., n_runs_task)."""
    pooled = np.concatenate(samples, axis=-1)
    means = np.stack([s.mean(axis=-1) for s in samples], axis=-1).mean(axis=-1)
    capped = np.stack([np.minimum(s, GAP_TARGET).mean(axis=-1) for s in samples], axis=-1).mean(axis=-1)
    return {"IQM": iqm(pooled, axis=-1), "Mean": means, "Optimality gap": GAP_TARGET - capped}


def stratified_resample(per_task: list[np.ndarray], n_resamples: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Resample runs with replacement *within* each task; arrays shaped (n_resamples, n_runs_task). Each task's
    runs are drawn from in :func:`analysis.stats.value_order`, so their folders' names do not move an
    interval."""
    return [x[rng.integers(0, len(x), size=(n_resamples, len(x)))] for x in map(value_order, per_task)]


def _group_sources(df: pd.DataFrame) -> pd.Series:
    """The sources of each (algo, model) group's runs (a pooled group can hold ours and the reference's)."""
    if "source" in df.columns:
        return df.groupby(["algo", "model"])["source"].apply(set)
    return df.groupby(["algo", "model"])["model"].apply(lambda m: {C.model_source(m.iloc[0])})


def compared_groups(df: pd.DataFrame) -> list[tuple[str, str]]:
    """The (algo, model) groups whose tasks the aggregate is over: the model groups (C.is_model_group) of ours when
    the tree holds any, else of the reference's runs, and the published groups chosen to be shown beside them.

    Another agent (an oracle or two-layer variant, Markovian, a published method such as ppo_gru) never narrows
    the comparison, whichever source the tree holds; only when there is no model group at all do all groups
    count."""
    sources = _group_sources(df)
    models = [k for k in sources.index if C.is_model_group(k[1])]
    primary = next((s for s in ("ours", "reference") if any(s in sources[k] for k in models)), None)
    compared = [k for k in models if primary in sources[k] or "published" in sources[k]]
    return compared or list(sources.index)


def common_task_sets(df: pd.DataFrame) -> dict[str, set[str]]:
    """Per algorithm, the tasks every one of its :func:`compared_groups` has: the one task set of everything
    that algorithm's report says (aggregate, probability of improvement, profile).

    Per algorithm, as a task TD3 lacks says nothing about SAC's groups: a set across algorithms dropped it from
    SAC's aggregate while SAC's probability of improvement kept it, and one report mixed task sets. ``df`` holds
    a row per run with its task (every run, normalisable or not: the aggregate leaves out the tasks without
    normalisation constants afterwards, for every group alike)."""
    out = {}
    for algo, g in df.groupby("algo", sort=True):
        sets = g.groupby("model")["task"].apply(set)
        out[algo] = set.intersection(*(sets[model] for _, model in compared_groups(g)))
    return out


def aggregate_scores(
    norm: pd.DataFrame,
    confidence: float = C.DEFAULT_CONFIDENCE,
    n_resamples: int = C.DEFAULT_RESAMPLES,
    seed: int = C.DEFAULT_SEED,
    common_tasks: bool = True,
) -> tuple[pd.DataFrame, list[str]]:
    """IQM, mean and optimality gap of the normalised score per (algo, model), stratified-bootstrap percentile CIs.

    IQM pools every (task, run) score, as rliable does; the mean and the optimality gap weight tasks equally (a
    mean of per-task means), which differs from pooling only when tasks have different numbers of runs. With
    ``common_tasks`` only the tasks of the algorithm's :func:`common_task_sets` are used (those every compared group
    of that algorithm has, counted on every run of ``norm``), so those groups are comparable; the algorithm's
    other groups are restricted to that set too but may cover fewer.

    A task with a single run of a group adds no variance to the stratified bootstrap (every resample repeats
    that run), so the interval understates the uncertainty: such tasks are listed in the ``single_run_tasks``
    column and in a note per group.
    """
    notes: list[str] = []
    df = norm[np.isfinite(norm["norm_score"].to_numpy(float))]
    if df.empty:
        return pd.DataFrame(columns=AGGREGATE_COLUMNS), ["no task has normalisation constants"]
    if common_tasks:
        common = common_task_sets(norm)
        normalisable = set(df["task"])
        for algo, g in df.groupby("algo", sort=True):
            shared = common[algo] & normalisable
            compared = compared_groups(norm[norm["algo"] == algo])
            for (_, model), s in g.groupby(["algo", "model"])["task"].apply(set).items():
                if s - shared:
                    notes.append(
                        f"{algo}/{model}: tasks {sorted(s - shared)} not shared by all compared {algo} groups; left out"
                    )
                if (algo, model) not in compared and not shared <= s:
                    notes.append(f"{algo}/{model}: covers only {len(s & shared)} of the {len(shared)} common tasks")
        df = df[np.array([t in common[a] for a, t in zip(df["algo"], df["task"])], dtype=bool)]
    alpha = (1 - confidence) / 2
    rows = []
    for (algo, model), g in df.groupby(["algo", "model"], sort=True):
        per_task = _per_task_arrays(g, "norm_score")
        point = _aggregate(per_task)
        boot = _aggregate(
            stratified_resample(per_task, n_resamples, np.random.default_rng(group_seed(seed, algo, model)))
        )
        counts = g.groupby("task").size()
        single = sorted(counts[counts == 1].index)
        if single:
            notes.append(
                f"{algo}/{model}: task(s) {', '.join(single)} have a single run: they enter the aggregate "
                "without bootstrap variance, so its CI understates the uncertainty"
            )
        for name in AGGREGATE_METRICS:
            lo, hi = np.quantile(boot[name], [alpha, 1 - alpha])
            rows.append(
                {
                    "algo": algo,
                    "model": model,
                    "model_label": C.model_label(model),
                    "metric": name,
                    "value": float(point[name]),
                    "ci_low": float(lo),
                    "ci_high": float(hi),
                    "n_tasks": len(per_task),
                    "n_runs": int(sum(len(x) for x in per_task)),
                    "tasks": " ".join(sorted(g["task"].unique())),
                    "single_run_tasks": " ".join(single),
                }
            )
    return pd.DataFrame(rows, columns=AGGREGATE_COLUMNS), notes


def aggregate_problems(norm: pd.DataFrame, agg: pd.DataFrame, metric: str) -> list[tuple[str, str, str]]:
    """Warnings for the console: a group's tasks the aggregate leaves out (its IQM and mean are then over fewer
    tasks than it ran, which changes what they mean), and tasks where a group has a single run."""
    problems = []
    covered = {(r.algo, r.model): set(r.tasks.split()) for r in agg.itertuples(index=False)}
    finite = norm[np.isfinite(norm["norm_score"].to_numpy(float))]
    for (algo, model), g in finite.groupby(["algo", "model"]):
        left = sorted(set(g["task"]) - covered.get((algo, model), set()))
        if left:
            problems.append(
                (
                    f"{algo}_{model}",
                    "warning",
                    f"aggregate ({metric}): task(s) {', '.join(left)} left out, as not every compared "
                    f"{algo} group has them; the aggregate is over {len(covered.get((algo, model), ()))} "
                    "task(s)",
                )
            )
    for r in agg.drop_duplicates(["algo", "model"]).itertuples(index=False):
        for task in r.single_run_tasks.split():
            problems.append(
                (
                    f"{task}/{r.algo}_{r.model}",
                    "warning",
                    f"aggregate ({metric}): the task has a single {r.algo}/{r.model} run; it adds no "
                    "bootstrap variance, so the aggregate's CI understates the uncertainty",
                )
            )
    return problems


def _prob_greater(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y) + 0.5 P(X = Y) over all pairs; x (..., n), y (..., m)."""
    gt = (x[..., :, None] > y[..., None, :]).mean(axis=(-2, -1))
    eq = (x[..., :, None] == y[..., None, :]).mean(axis=(-2, -1))
    return gt + 0.5 * eq


def probability_of_improvement(
    scores: pd.DataFrame,
    model_x: str = "ffm",
    model_y: str = "gru",
    confidence: float = C.DEFAULT_CONFIDENCE,
    n_resamples: int = C.DEFAULT_RESAMPLES,
    seed: int = C.DEFAULT_SEED,
    value: str = "score",
    common_tasks: bool = True,
) -> pd.DataFrame:
    """P(model_x > model_y) per algorithm, averaged over the tasks both models ran; with ``common_tasks`` only
    over the algorithm's :func:`common_task_sets`: the tasks its aggregate is over, plus any without
    normalisation constants (the aggregate cannot score them; raw scores compare).

    Per task it is the Mann-Whitney statistic U/(n m) on the raw scores, so no
    normalisation constants are needed.  The CI resamples each model's runs
    independently within each task (stratified bootstrap, percentile interval).
    ``single_run_tasks`` lists the tasks where either model has one run (no
    bootstrap variance from that side).
    """
    rows = []
    alpha = (1 - confidence) / 2
    common = common_task_sets(scores) if common_tasks else {}
    for algo, g in scores.groupby("algo", sort=True):
        tasks = set(g.loc[g["model"] == model_x, "task"]) & set(g.loc[g["model"] == model_y, "task"])
        tasks = sorted(tasks & common[algo] if common_tasks else tasks)
        if not tasks:
            continue
        xs = [value_order(g.loc[(g["task"] == t) & (g["model"] == model_x), value]) for t in tasks]
        ys = [value_order(g.loc[(g["task"] == t) & (g["model"] == model_y), value]) for t in tasks]
        point = np.mean([_prob_greater(x, y) for x, y in zip(xs, ys)])
        rng = np.random.default_rng(group_seed(seed, algo, model_x, model_y))
        bx = stratified_resample(xs, n_resamples, rng)
        by = stratified_resample(ys, n_resamples, rng)
        boot = np.mean([_prob_greater(x, y) for x, y in zip(bx, by)], axis=0)
        lo, hi = np.quantile(boot, [alpha, 1 - alpha])
        single = [t for t, x, y in zip(tasks, xs, ys) if min(len(x), len(y)) == 1]
        rows.append(
            {
                "algo": algo,
                "model_x": model_x,
                "model_y": model_y,
                "comparison": f"P({C.group_label(algo, model_x)} > {C.group_label(algo, model_y)})",
                "value": float(point),
                "ci_low": float(lo),
                "ci_high": float(hi),
                "n_tasks": len(tasks),
                "tasks": " ".join(tasks),
                "single_run_tasks": " ".join(single),
            }
        )
    return pd.DataFrame(rows, columns=POI_COLUMNS)


def improvement_pairs(models, baselines=C.BASELINES, challenger: str = C.CHALLENGER) -> list[tuple[str, str]]:
    """(challenger group, baseline group) pairs: every model group of ``challenger``'s memory against every model
    group of a baseline memory, within its source and across sources (ffm / gru, ffm@ref / gru@ref, ffm /
    gru@ref, ffm / a published GRU variant); other agents (C.is_model_group) are never compared."""
    models = sorted({m for m in models if C.is_model_group(m)})
    return [(x, y) for x in models if C.memory_of(x) == challenger for y in models if C.memory_of(y) in baselines]


def compare_models(scores: pd.DataFrame, baselines=C.BASELINES, challenger: str = C.CHALLENGER, **boot) -> pd.DataFrame:
    """:func:`probability_of_improvement` for every pair of :func:`improvement_pairs`."""
    frames = [
        probability_of_improvement(scores, x, y, **boot)
        for x, y in improvement_pairs(scores["model"].unique(), baselines, challenger)
    ]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=POI_COLUMNS)


def performance_profile(
    norm: pd.DataFrame,
    taus: np.ndarray,
    confidence: float = C.DEFAULT_CONFIDENCE,
    n_resamples: int = C.DEFAULT_RESAMPLES,
    seed: int = C.DEFAULT_SEED,
) -> pd.DataFrame:
    """Fraction of runs with normalised score > tau (tasks weighted equally), with stratified-bootstrap CI."""
    df = norm[np.isfinite(norm["norm_score"].to_numpy(float))]
    taus = np.asarray(taus, dtype=float)
    alpha = (1 - confidence) / 2
    frames = []
    for (algo, model), g in df.groupby(["algo", "model"], sort=True):
        per_task = _per_task_arrays(g, "norm_score")

        def frac(samples):
            return np.mean([(s[..., None] > taus).mean(axis=-2) for s in samples], axis=0)

        point = frac(per_task)
        boot = frac(stratified_resample(per_task, n_resamples, np.random.default_rng(group_seed(seed, algo, model))))
        lo, hi = np.quantile(boot, [alpha, 1 - alpha], axis=0)
        frames.append(
            pd.DataFrame(
                {
                    "algo": algo,
                    "model": model,
                    "model_label": C.model_label(model),
                    "tau": taus,
                    "fraction": point,
                    "ci_low": lo,
                    "ci_high": hi,
                }
            )
        )
    cols = ["algo", "model", "model_label", "tau", "fraction", "ci_low", "ci_high"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)


def profile_of_aggregate(norm: pd.DataFrame, agg: pd.DataFrame, n_taus: int = 101, **boot) -> pd.DataFrame:
    """:func:`performance_profile` of the groups and tasks the aggregate holds, on thresholds from 0 to the
    largest of 1 and their best score: a group left out of the aggregate does not stretch the axis."""
    covered = {
        (r.algo, r.model, t)
        for r in agg.drop_duplicates(["algo", "model"]).itertuples(index=False)
        for t in r.tasks.split()
    }
    keys = list(zip(norm["algo"], norm["model"], norm["task"]))
    used = norm[np.array([k in covered for k in keys], dtype=bool)]
    finite = used["norm_score"].to_numpy(float)
    finite = finite[np.isfinite(finite)]
    top = max(1.0, float(finite.max())) if len(finite) else 1.0
    return performance_profile(used, np.linspace(0.0, top, n_taus), **boot)
