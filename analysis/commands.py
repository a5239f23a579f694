"""The work of each ``python -m analysis`` command (``table``, ``bars``, ``lines``, ``aggregate``, ``decay``,
``efficiency``): from the loaded :class:`~analysis.context.Context`, its tables and figures, each written path
added to ``ctx.written`` and each problem to ``ctx.report``."""

from __future__ import annotations

from . import aggregate, curves, figures, load, modelfigures, stats
from . import constants as C
from .context import Context
from .figstyle import task_label
from .options import UsageError, comma_items
from .tables import write_table


def cmd_table(ctx: Context) -> None:
    t = ctx.table
    ctx.emit([load.export_table(t, ctx.tables("runs.csv"))])
    try:
        ctx.emit([load.export_table(t, ctx.tables("runs.parquet"))])
    except ImportError as exc:
        ctx.notes.append(f"Parquet export skipped: {exc}")
    scores = ctx.scores()
    ctx.emit(
        write_table(
            scores.drop(columns=["source"]),
            ctx.tables(f"scores_{ctx.args.metric}"),
            title=f"Per-run score: {ctx.metric_description()}",
        )
    )
    summary = stats.summarize(scores, **ctx.boot())
    ctx.emit(
        write_table(
            summary,
            ctx.tables(f"summary_{ctx.args.metric}"),
            title=f"Mean over runs, {ctx.args.confidence:.0%} bootstrap CI ({ctx.metric_description()})",
        )
    )


def cmd_bars(ctx: Context) -> None:
    scores = ctx.scores()
    summary = stats.summarize(scores, **ctx.boot())
    name = f"bars_{ctx.args.metric}"
    ctx.emit(write_table(summary, ctx.tables(name), title=ctx.metric_description()))
    ctx.emit(
        figures.plot_task_bars(summary, scores, ctx.figs(name), ctx.metric_label(), ctx.formats, ctx.args.confidence)
    )


def cmd_lines(ctx: Context) -> None:
    a = ctx.args
    on_grid = curves.curves_on_grid(ctx.table, a.curves, a.grid_start, a.grid_interval, a.window, a.max_steps)
    band = curves.curve_band(on_grid, **ctx.boot())
    ctx.report.extend(curves.curve_cuts(on_grid))
    ctx.emit(write_table(band, ctx.tables(f"lines_{a.curves}"), title=f"Learning curves ({a.curves})"))
    y = "Best eval return so far" if a.curves == "runmax" else "Eval return (smoothed)"
    for algo in sorted(on_grid["algo"].unique()):
        ctx.emit(
            figures.plot_curves(on_grid, band, ctx.figs(f"lines_{a.curves}_{algo}"), algo, y, ctx.formats, a.confidence)
        )


def cmd_aggregate(ctx: Context) -> None:
    a = ctx.args
    scores = ctx.scores()
    norm, notes = stats.normalize(scores)
    ctx.notes.extend(notes)
    agg, agg_notes = aggregate.aggregate_scores(norm, **ctx.boot())
    ctx.notes.extend(agg_notes)
    # Tasks a group has but the aggregate leaves out, and single-run tasks: said on the console, not only in
    # report.md, as they change what the aggregate means.
    ctx.report.extend(aggregate.aggregate_problems(norm, agg, a.metric))
    poi = aggregate.compare_models(scores, comma_items(a.compare), **ctx.boot())
    if poi.empty:
        ctx.report.add(
            "probability of improvement",
            "warning",
            f"no task has an FFM group and a {'/'.join(comma_items(a.compare))} group of the same algorithm, "
            "so FFM is compared with nothing",
        )
    else:
        for r in poi[poi["single_run_tasks"] != ""].itertuples(index=False):
            ctx.report.add(
                f"{r.algo}: {r.model_x} vs {r.model_y}",
                "warning",
                f"probability of improvement ({a.metric}): task(s) {r.single_run_tasks} have a single run "
                "of one side; they add no bootstrap variance from it, so the CI understates the "
                "uncertainty",
            )
        ctx.emit(
            write_table(
                poi,
                ctx.tables("probability_of_improvement"),
                title=f"Probability that FFM beats the baseline on a task ({a.metric}, raw scores)",
            )
        )
    ctx.emit(
        write_table(
            norm.drop(columns=["source"]),
            ctx.tables(f"normalised_{a.metric}"),
            title="(score - Random) / (Oracle - Random)",
        )
    )
    if agg.empty:
        ctx.notes.append("aggregate: no normalisable task; aggregate figure and profile skipped")
        return
    ctx.emit(
        write_table(
            agg,
            ctx.tables(f"aggregate_{a.metric}"),
            title=f"Normalised {a.metric} over tasks, {a.confidence:.0%} stratified-bootstrap CI "
            f"(optimality gap: 1 - mean of scores capped at 1, lower is better)",
        )
    )
    ctx.emit(figures.plot_aggregate(agg, ctx.figs(f"aggregate_{a.metric}"), ctx.formats, a.confidence))
    profile = aggregate.profile_of_aggregate(norm, agg, **ctx.boot())
    ctx.emit(write_table(profile, ctx.tables(f"profile_{a.metric}"), title="Performance profile"))
    ctx.emit(figures.plot_profile(profile, ctx.figs(f"profile_{a.metric}"), ctx.formats, a.confidence))


def cmd_decay(ctx: Context) -> None:
    from . import decay

    runs = ctx.table.drop_duplicates("run_id")[["run_id", "run_dir", "task", "algo", "model"]]
    values, problems = decay.load_decay(runs, ctx.args.beta)
    ctx.report.extend(problems)
    if values.empty:
        ctx.notes.append("decay: no FFM checkpoint with alpha/omega parameters found; figure skipped")
        return
    ctx.emit(write_table(values, ctx.tables("decay_values"), digits=4, title="FFM timescales per parameter entry"))
    for (task, algo), d in values.groupby(["task", "algo"], sort=True):
        n_runs = d["run_id"].nunique()
        title = f"{task_label(task)}, FFM + {C.algo_label(algo)} ({n_runs} run{'s' if n_runs > 1 else ''})"
        ctx.emit(
            modelfigures.plot_decay(d, ctx.figs(f"decay_{task_label(task)}_{algo}"), title, ctx.args.beta, ctx.formats)
        )


def cmd_efficiency(ctx: Context) -> None:
    from .bench import EFFICIENCY, read_bench, summarize_bench, summarize_efficiency
    from .figstyle import order_models

    if not ctx.args.bench:
        ctx.notes.append("efficiency: no --bench file given; figure skipped")
        return
    try:
        bench, problems = read_bench(ctx.args.bench)
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from exc
    ctx.report.extend(problems)
    if bench.empty:
        ctx.notes.append("efficiency: no usable benchmark rows; figure skipped")
        return
    paper = bench[bench["benchmark"] == EFFICIENCY]
    if not paper.empty:  # the FFM paper's figure, its fourth panel the runs' best returns where runs were given
        returns = None
        if ctx.table is not None and not ctx.table.empty:
            scores = ctx.scores()
            pairs = sorted({f"{t} {a}" for t, a in zip(scores["task"], scores["algo"])})
            if len(pairs) > 1:  # (one panel of returns: averaging tasks or algorithms would mean nothing)
                raise UsageError(
                    f"the efficiency figure's return panel shows one task and algorithm; the runs given hold "
                    f"{len(pairs)}: {', '.join(pairs)}; give the folder of one (or no runs, for no return panel)"
                )
            returns = stats.summarize(scores, **ctx.boot())[["model", "mean", "ci_low", "ci_high"]]
        summary = summarize_efficiency(paper, **ctx.boot(), order=order_models(paper["model"]))
        ctx.emit(write_table(summary, ctx.tables("efficiency_paper"), title="The FFM paper's efficiency protocol"))
        ctx.emit(modelfigures.plot_paper_efficiency(summary, returns, ctx.figs("efficiency_paper"), ctx.formats))
    bench = bench[bench["benchmark"] != EFFICIENCY]
    if bench.empty:
        return
    summary = summarize_bench(bench)
    ctx.emit(write_table(summary, ctx.tables("efficiency"), title="Benchmarks (mean of repeated rows)"))
    ctx.emit(modelfigures.plot_efficiency(summary, ctx.figs("efficiency"), ctx.formats))
