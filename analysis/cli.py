"""``python -m analysis [COMMAND] RUNS... [--published DIR] --out DIR``: tables and figures from a folder of runs,
and POMDP-Baselines' published results beside them.

Every problem met on the way (skipped input, warnings) goes into one list: the
console shows each kind of it once with its count, and report.md and issues.csv
hold the whole list and the same counts. Notes (what a step left out by design,
e.g. a task without normalisation constants) are listed in report.md.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from pomdp_ffm.launch.exits import EXIT_UNWRITABLE

from . import aggregate, columns, curves, figures, load, published, rundirs, stats
from . import constants as C
from .issues import LoadReport, console_lines
from .report import write_report
from .tables import write_table

COMMANDS = ("all", "table", "bars", "lines", "aggregate", "decay", "efficiency")
_HELP = {
    "all": "everything below (default)",
    "table": "tidy table (CSV + Parquet), per-run scores, per-task summary, skip report",
    "bars": "per-task bars with bootstrapped CIs (paper's continuous-control figure)",
    "lines": "learning curves per task: one line per run, mean and CI band",
    "aggregate": "IQM / mean / optimality gap of the normalised score, probability of improvement, profile",
    "decay": "histograms of FFM t_alpha / t_omega from checkpoints (paper's decay figure)",
    "efficiency": "bars from benchmark CSVs (--bench)",
}
# What --compare may name: the memories FFM is compared with.
BASELINES = tuple(m for m in C.MEMORY_MODELS if m != "ffm")


def build_parser() -> argparse.ArgumentParser:
    epilog = "commands (optional first argument):\n" + "\n".join(f"  {c:<11} {h}" for c, h in _HELP.items())
    p = argparse.ArgumentParser(
        prog="python -m analysis",
        description=__doc__,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("runs", nargs="*", help="folders holding run directories (ours or the reference's logs/)")
    p.add_argument(
        "--published",
        action="append",
        default=[],
        metavar="DIR",
        help="POMDP-Baselines' published results (its data.zip's results/data/pomdp): every "
        "<Env>/<P|V>/final.csv below DIR joins the runs as groups of its own (repeatable)",
    )
    p.add_argument(
        "--published-select",
        default=published.DEFAULT_SELECT,
        metavar="WHICH",
        help="published groups to show, comma separated: config (default: the task's tuned rnn.yml "
        "config, gru-64-oar-separate on BLT, for each algorithm), best (per task and algorithm, "
        "the variant with the best rundown score), all, or variant strings and method names as "
        "the files spell them (td3-gru-64-oa-separate, ppo_gru)",
    )
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument(
        "--bench",
        action="append",
        default=[],
        metavar="FILE",
        help="benchmark CSV from `python -m pomdp_ffm.bench ... --csv FILE` (repeatable)",
    )
    p.add_argument("--seed", type=int, default=C.DEFAULT_SEED, help="seed of every bootstrap (default %(default)s)")
    p.add_argument(
        "--resamples", type=int, default=C.DEFAULT_RESAMPLES, help="bootstrap resamples (default %(default)s)"
    )
    p.add_argument("--confidence", type=float, default=C.DEFAULT_CONFIDENCE, help="CI level (default %(default)s)")
    p.add_argument(
        "--metric",
        choices=sorted(C.METRIC_DESCRIPTIONS),
        default=C.METRIC_RUNMAX,
        help="per-run score: runmax = final running max of eval return (FFM paper); "
        "last20 = mean of last 20%% of the smoothed curve (reference rundown)",
    )
    p.add_argument(
        "--max-steps",
        type=float,
        default=None,
        help=f"ignore evaluations after this many env steps (BLT budget: {C.BLT_BUDGET})",
    )
    p.add_argument(
        "--grid-start",
        type=float,
        default=None,
        help="first grid point in env steps (default: the reference's per task, 12000 or 2000 on Pendulum)",
    )
    p.add_argument(
        "--grid-interval",
        type=float,
        default=None,
        help="grid spacing in env steps (default: the reference's per task, 4000 or 1000 on Pendulum)",
    )
    p.add_argument(
        "--window",
        type=int,
        default=None,
        help="rolling-mean window in grid points (default: the reference's per task, 20 or 3 on Pendulum)",
    )
    p.add_argument(
        "--last-frac",
        type=float,
        default=C.DEFAULT_LAST_FRACTION,
        help="fraction of the grid averaged by --metric last20",
    )
    p.add_argument(
        "--curves",
        choices=["runmax", "smoothed"],
        default="runmax",
        help="line plots: running max (paper) or the reference's smoothed curve",
    )
    p.add_argument("--beta", type=float, default=C.DEFAULT_BETA, help="forgetting threshold for t_alpha")
    p.add_argument(
        "--compare",
        default="gru,lstm",
        metavar="MODELS",
        help="baseline memories for P(FFM > baseline), comma separated (default gru,lstm): FFM is "
        "compared with each within its source and across sources",
    )
    p.add_argument("--formats", default="png,pdf", help="figure formats, comma separated (default png,pdf)")
    p.add_argument(
        "--pool-sources",
        action="store_true",
        help="pool reference-implementation runs with ours (default: separate groups, '(ref)')",
    )
    p.add_argument("--no-cache", action="store_true", help="re-read every run instead of using OUT/.cache")
    return p


@dataclass
class Context:
    args: argparse.Namespace
    out: Path  # where this command writes; swapped into --out once complete
    cache: Path | None = None  # --out's cache of loaded runs
    written: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # report.md's "Notes"
    # The one list of skipped input and warnings: loading's, then every step's (see summary()).
    report: LoadReport = field(default_factory=LoadReport)
    table: pd.DataFrame | None = None
    horizons: pd.DataFrame | None = None
    # The published groups shown and why (published.select), None without --published.
    published: pd.DataFrame | None = None
    _scores: pd.DataFrame | None = None

    @property
    def formats(self) -> tuple[str, ...]:
        return tuple(f.strip() for f in self.args.formats.split(",") if f.strip())

    def emit(self, paths) -> None:
        for p in paths:
            self.written.append(Path(p))
            print(f"wrote {Path(self.args.out) / Path(p).relative_to(self.out)}")  # where it will be once complete

    def tables(self, name: str) -> Path:
        return self.out / "tables" / name

    def figs(self, name: str) -> Path:
        return self.out / "figures" / name

    def scores(self) -> pd.DataFrame:
        if self._scores is None:
            a = self.args
            self._scores = stats.run_scores(self.table, a.metric, **_score_settings(a))
        return self._scores

    def boot(self) -> dict:
        return {"confidence": self.args.confidence, "n_resamples": self.args.resamples, "seed": self.args.seed}

    def metric_label(self) -> str:
        return (
            "Best eval return"
            if self.args.metric == C.METRIC_RUNMAX
            else f"Eval return (last {self.args.last_frac:.0%})"
        )

    def metric_description(self) -> str:
        return C.metric_description(self.args.metric, self.args.last_frac)


class UsageError(Exception):
    """Bad input (an option's value, a missing folder or file): ``error: <message>`` and exit code 2."""


def _score_settings(args: argparse.Namespace) -> dict:
    """stats.run_scores' settings from the options."""
    return {
        "max_steps": args.max_steps,
        "grid_start": args.grid_start,
        "grid_interval": args.grid_interval,
        "window": args.window,
        "last_fraction": args.last_frac,
    }


def _items(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _validate(args: argparse.Namespace, command: str) -> None:
    if args.seed < 0:
        raise UsageError(f"--seed must be >= 0, got {args.seed}")
    if args.resamples < 1:
        raise UsageError(f"--resamples must be positive, got {args.resamples}")
    if not 0 < args.confidence < 1:
        raise UsageError(f"--confidence must be in (0, 1), got {args.confidence}")
    if not 0 < args.last_frac <= 1:
        raise UsageError(f"--last-frac must be in (0, 1], got {args.last_frac}")
    if not 0 < args.beta < 1:
        raise UsageError(f"--beta must be in (0, 1), got {args.beta}")
    if (args.window is not None and args.window < 1) or (args.grid_interval is not None and args.grid_interval <= 0):
        raise UsageError(f"--window must be >= 1 and --grid-interval > 0, got {args.window}, {args.grid_interval}")
    bad = [f for f in args.formats.split(",") if f.strip() not in ("png", "pdf", "svg")]
    if bad:
        raise UsageError(f"--formats: unsupported format(s) {bad}; use png, pdf, svg")
    bad = [m for m in _items(args.compare) if m not in BASELINES]
    if bad or not _items(args.compare):
        raise UsageError(
            f"--compare: unknown baseline {bad[0] if bad else args.compare!r}; choose from "
            f"{', '.join(BASELINES)}, comma separated"
        )
    try:
        published.parse_selection(args.published_select)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if command == "efficiency" and not args.bench:
        raise UsageError("the efficiency command needs at least one --bench FILE")
    if command not in ("efficiency",) and not args.runs and not args.published:
        raise UsageError(f"the {command} command needs at least one RUNS folder or --published DIR")
    missing = [r for r in args.runs if not Path(r).exists()]
    if missing:
        raise UsageError(f"no such RUNS folder: {', '.join(missing)}")
    missing = [r for r in args.published if not Path(r).exists()]
    if missing:
        raise UsageError(f"no such --published folder: {', '.join(missing)}")


def _read_published(args: argparse.Namespace):
    """The published groups chosen by --published-select, why each, problems and file counts; read before --out
    is made, so that an unknown name in --published-select leaves nothing behind."""
    table, problems, n_found, n_read = published.read_published(args.published)
    if not n_found:
        raise UsageError(
            f"no {published.FILE_NAME} below --published {', '.join(args.published)} (expected "
            f"<Env>/<P|V>/{published.FILE_NAME}, as in POMDP-Baselines' results/data/pomdp)"
        )
    try:
        chosen, why = published.select(table, args.published_select, **_score_settings(args))
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    return chosen, why, problems, n_found, n_read


def _load(ctx: Context, pub=None) -> None:
    """The runs (and ``pub``, :func:`_read_published`'s answer) into one table and one list of issues."""
    a = ctx.args
    table, report = columns.empty_table(), LoadReport()
    if a.runs:
        cache = None if a.no_cache else ctx.cache
        try:
            table, report = load.load_runs(a.runs, cache_dir=cache)
        except (FileNotFoundError, ValueError) as exc:
            raise UsageError(str(exc)) from exc
        if table.empty:
            skipped = "".join(f"\n  skipped {i.path}: {i.reason}" for i in report.skipped)
            raise UsageError(
                f"no usable runs (folders with a {rundirs.PROGRESS} holding evaluations) under "
                f"{', '.join(map(str, a.runs))}{skipped}"
            )
        if not a.pool_sources:
            table = load.separate_sources(table)
        print(f"loaded {report.n_runs_loaded} of {report.n_runs_found} run dir(s)")
    if pub is not None:
        chosen, ctx.published, problems, report.n_published_found, report.n_published_read = pub
        report.extend(problems)
        # Published curves are never pooled (another engine, see published.STACK): their model keeps "@pub".
        table = pd.concat([table, chosen], ignore_index=True) if len(table) else chosen.reset_index(drop=True)
        print(
            f"read {report.n_published_read} of {report.n_published_found} published file(s); showing "
            f"{len(ctx.published)} published group(s) ({a.published_select})"
        )
    ctx.table, ctx.report = table, report
    # Scores and curves depend on how far each run got: say which horizon each group is scored on.
    ctx.horizons, problems = stats.horizons(table, a.max_steps)
    report.extend(problems)


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
    poi = aggregate.compare_models(scores, _items(a.compare), **ctx.boot())
    if poi.empty:
        ctx.report.add(
            "probability of improvement",
            "warning",
            f"no task has an FFM group and a {'/'.join(_items(a.compare))} group of the same algorithm, "
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
        title = f"{figures.task_label(task)}, FFM + {C.algo_label(algo)} ({n_runs} run{'s' if n_runs > 1 else ''})"
        ctx.emit(
            figures.plot_decay(
                d, ctx.figs(f"decay_{figures.task_label(task)}_{algo}"), title, ctx.args.beta, ctx.formats
            )
        )


def cmd_efficiency(ctx: Context) -> None:
    from .bench import read_bench, summarize_bench

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
    summary = summarize_bench(bench)
    ctx.emit(write_table(summary, ctx.tables("efficiency"), title="Benchmarks (mean of repeated rows)"))
    ctx.emit(figures.plot_efficiency(summary, ctx.figs("efficiency"), ctx.formats))


def _check_max_steps(ctx: Context) -> None:
    first = None if ctx.table is None or ctx.table.empty else ctx.table["env_steps"].min()
    if ctx.args.max_steps is not None and first is not None and ctx.args.max_steps < first:
        raise UsageError(
            f"--max-steps {ctx.args.max_steps:g} is below every run's first evaluation (the earliest is "
            f"at {int(first)} env steps): nothing would be left to analyse"
        )


def _swap_in(new: Path, out: Path) -> None:
    """Each entry of the finished report ``new`` in place of its namesake in ``out`` (kept aside until then)."""
    old = Path(tempfile.mkdtemp(prefix=".old-report-", dir=out))
    for entry in new.iterdir():
        target = out / entry.name
        if target.exists():
            target.rename(old / entry.name)
        entry.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    new.rmdir()


def _prepare_out(out: str) -> Path | None:
    """The output folder, created if needed; None (after a one-line error) when it cannot be one."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        print(f"error: --out {out} is a file; give a directory", file=sys.stderr)
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"error: --out {out} cannot be created: {exc.strerror or exc}", file=sys.stderr)
        return None
    return path


_RUNNERS = {
    "table": cmd_table,
    "bars": cmd_bars,
    "lines": cmd_lines,
    "aggregate": cmd_aggregate,
    "decay": cmd_decay,
    "efficiency": cmd_efficiency,
}


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # met writing the report (reads are reported per run): a read-only --out, a full disk
        where = f" ({e.filename})" if e.filename else ""
        print(
            f"error: the report cannot be written{where}: {e.strerror or e}; the previous report in --out is "
            "unchanged: free some space or make --out writable, then rerun",
            file=sys.stderr,
        )
        return EXIT_UNWRITABLE


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv.pop(0) if argv and argv[0] in COMMANDS else "all"
    args = build_parser().parse_args(argv)
    _validate(args, command)  # before --out is created: bad input leaves nothing behind
    pub = _read_published(args) if args.published else None
    made = not Path(args.out).exists()
    out = _prepare_out(args.out)
    if out is None:
        return 2
    # Written beside the previous report, then swapped in: a failure leaves that report, not half a new one.
    ctx = Context(args=args, out=Path(tempfile.mkdtemp(prefix=".new-report-", dir=out)), cache=out / ".cache")
    try:
        if args.runs or pub is not None:
            _load(ctx, pub)
        _check_max_steps(ctx)
        steps = list(_RUNNERS) if command == "all" else [command]
        if ctx.table is not None and ctx.table.empty:
            ctx.notes.append("no run could be loaded; only the report (and benchmarks) were produced")
            steps = [s for s in steps if s == "efficiency"]
        if command == "all" and ctx.table is None:
            steps = ["efficiency"]
        for step in steps:
            _RUNNERS[step](ctx)
        write_report(ctx)
        _swap_in(ctx.out, out)
    except BaseException:
        shutil.rmtree(ctx.out, ignore_errors=True)
        if made and not any(p.name != ".cache" for p in out.iterdir()):
            shutil.rmtree(out, ignore_errors=True)  # a folder this command made holds nothing of a report
        raise
    print(f"wrote {out / 'report.md'}")
    print(f"wrote {out / 'issues.csv'}")
    for line in console_lines(ctx.report):
        print(line, file=sys.stderr)
    print(ctx.report.summary())
    return 0
