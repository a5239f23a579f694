"""report.md and issues.csv: the settings, what was loaded, the published results beside the runs and how they
differ, the runs and horizon of every group, every skipped file or row and every warning with why, and notes."""

from __future__ import annotations

from pathlib import Path

from . import constants as C
from . import curves, published, rundirs
from .tables import to_markdown


def _or_task(value) -> str:
    return "the task's default" if value is None else f"{value:g}"


def _published_section(ctx) -> list[str]:
    """Which published groups are shown and why, and, once, what differs from the runs beside them."""
    a, rep = ctx.args, ctx.report
    why = ctx.published.copy()
    why.insert(2, "group", [C.group_label(r.algo, r.model) for r in why.itertuples(index=False)])
    default = a.published_select == published.DEFAULT_SELECT
    chose = (
        (
            " (the default: each task's tuned rnn.yml config, the RNN the FFM paper compared with, for every "
            "algorithm published; docs/analysis.md says why)"
        )
        if default
        else ""
    )
    lines = [
        "",
        "## Published results beside the runs",
        "",
        f"POMDP-Baselines' published learning curves from {', '.join(f'`{r}`' for r in a.published)}: "
        f"{rep.n_published_read} of {rep.n_published_found} {published.FILE_NAME} file(s) read (any other is "
        f"named under *Skipped input and warnings*), groups chosen by `--published-select "
        f"{a.published_select}`{chose}. They enter every table and figure as the groups below, labelled "
        "\"(published)\"; the aggregates are over the tasks both sides have.",
        "",
    ]
    lines.append(
        to_markdown(why.drop(columns="model"), digits=0) if len(why) else "No published group matches the selection.\n"
    )
    bars = [p for p in ctx.written if p.suffix == ".png" and p.stem.startswith("bars_")]
    if bars:
        lines += [f"![Per-task bars, runs and published groups]({bars[0].relative_to(ctx.out).as_posix()})", ""]
    lines += ["What differs from the runs:", "", f"- {published.STACK}", f"- {published.GRID}"]
    effect = published.grid_effect(ctx.table, a.max_steps)
    if effect is not None:
        n, mean, top = effect
        lines[-1] += (
            f" On the {n} run(s) beside them, that grid lowers the best so far by {mean:.2f} on average "
            f"(at most {top:.2f})."
        )
    gaps = published.missing(ctx.table)
    lines += [
        f"- Missing from one side: {'; '.join(gaps)}."
        if gaps
        else "- Nothing is missing: every task and algorithm shown has both sides, with as many runs as trials.",
        "",
    ]
    return lines


def write_report(ctx) -> Path:
    """report.md and issues.csv in ``ctx.out``. Its counts are ``ctx.report.summary()``, the line the console
    prints."""
    a = ctx.args
    lines = [
        "# Analysis report",
        "",
        f"- score metric: `{a.metric}` = {ctx.metric_description()}",
        f"- bootstrap: seed {a.seed}, {a.resamples} resamples, {a.confidence:.0%} intervals, each group's "
        "seeded from its name",
        f"- max env steps: {a.max_steps if a.max_steps is not None else 'none'}",
        f"- curve grid: start {_or_task(a.grid_start)}, interval {_or_task(a.grid_interval)}, smoothing window "
        f"{_or_task(a.window)} grid points; line plots: {a.curves}",
        f"- learning curves: {curves.CURVE_RULE}",
        f"- summary: {ctx.report.summary()}",
    ]
    t = ctx.table
    if t is not None and len(t):
        runs = t.drop_duplicates("run_id")
        unfinished = int((runs["finished"] == False).sum())  # noqa: E712  (nullable boolean)
        unknown = int(runs["finished"].isna().sum())
        ended = runs["status"].value_counts()
        lines.append(
            f"- unfinished runs (no {rundirs.DONE_MARKER} file, still analysed): {unfinished}, of which "
            f"{int(ended.get('diverged', 0))} diverged and {int(ended.get('failed', 0))} failed (each named "
            f"under warnings); completion unknown (the reference's runs, published curves): {unknown}"
        )
        if ctx.published is not None:
            lines += _published_section(ctx)
        # Runs per group and the horizon each was scored on: the env steps of its shortest and longest run's
        # last evaluation (up to --max-steps), and which run is the shortest where they differ.
        h = ctx.horizons.copy()
        h["model_label"] = h["model"].map(C.model_label)
        h.loc[h["env_steps_min"] == h["env_steps_max"], "shortest_run"] = ""
        h = h.rename(columns={"n_runs": "runs"})[
            ["task", "algo", "model_label", "runs", "env_steps_min", "env_steps_max", "shortest_run"]
        ]
        cut = f", evaluations after --max-steps {a.max_steps:g} ignored" if a.max_steps is not None else ""
        lines += [
            "",
            "## Runs per group and their horizon",
            "",
            f"env_steps_min / env_steps_max: the last evaluation of the group's shortest / longest run{cut}; "
            "scores and curve ends depend on it.",
            "",
            to_markdown(h, digits=0),
        ]
    issues = ctx.report.to_frame()
    lines += ["", "## Skipped input and warnings", ""]
    lines.append(to_markdown(issues) if len(issues) else "None.\n")
    if ctx.notes:
        lines += ["## Notes", "", *[f"- {n}" for n in ctx.notes], ""]
    lines += ["## Files", "", *[f"- `{p.relative_to(ctx.out).as_posix()}`" for p in ctx.written], ""]
    path = ctx.out / "report.md"
    path.write_text("\n".join(lines))
    issues.to_csv(ctx.out / "issues.csv", index=False)
    return path
