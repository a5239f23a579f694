"""``python -m analysis [COMMAND] RUNS... --out DIR``: tables and figures from a folder of runs.

Every problem met on the way (skipped input, warnings) goes into one list: it is
printed at the end with its counts, and report.md and issues.csv hold the same
list and the same counts. Notes (what a step left out by design, e.g. a task
without normalisation constants) are listed in report.md.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from . import constants as C
from . import figures, load, stats
from .tables import to_markdown, write_table

COMMANDS = ("all", "table", "bars", "lines", "aggregate", "decay", "efficiency")
_HELP = {
    "all": "everything below (default)",
    "table": "tidy table (CSV + Parquet), per-run scores, per-task summary, skip report",
    "bars": "per-task bars with bootstrapped CIs (paper's continuous-control figure)",
    "lines": "learning curves per task: one line per run, mean and CI band",
    "aggregate": "IQM / mean normalised score, probability of improvement, performance profile",
    "decay": "histograms of FFM t_alpha / t_omega from checkpoints (paper's decay figure)",
    "efficiency": "bars from benchmark CSVs (--bench)",
}


def build_parser() -> argparse.ArgumentParser:
    epilog = "commands (optional first argument):\n" + "\n".join(f"  {c:<11} {h}" for c, h in _HELP.items())
    p = argparse.ArgumentParser(prog="python -m analysis", description=__doc__, epilog=epilog,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="*", help="folders holding run directories (ours or the reference's logs/)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--bench", action="append", default=[], metavar="FILE",
                   help="benchmark CSV from `python -m pomdp_ffm.bench ... --csv FILE` (repeatable)")
    p.add_argument("--seed", type=int, default=C.DEFAULT_SEED, help="seed of every bootstrap (default %(default)s)")
    p.add_argument("--resamples", type=int, default=C.DEFAULT_RESAMPLES,
                   help="bootstrap resamples (default %(default)s)")
    p.add_argument("--confidence", type=float, default=C.DEFAULT_CONFIDENCE, help="CI level (default %(default)s)")
    p.add_argument("--metric", choices=sorted(C.METRIC_DESCRIPTIONS), default=C.METRIC_RUNMAX,
                   help="per-run score: runmax = final running max of eval return (FFM paper); "
                        "last20 = mean of last 20%% of the smoothed curve (reference rundown)")
    p.add_argument("--max-steps", type=float, default=None,
                   help=f"ignore evaluations after this many env steps (BLT budget: {C.BLT_BUDGET})")
    p.add_argument("--grid-start", type=float, default=None,
                   help="first grid point in env steps (default: the reference's per task, 12000 or 2000 on Pendulum)")
    p.add_argument("--grid-interval", type=float, default=None,
                   help="grid spacing in env steps (default: the reference's per task, 4000 or 1000 on Pendulum)")
    p.add_argument("--window", type=int, default=None,
                   help="rolling-mean window in grid points (default: the reference's per task, 20 or 3 on Pendulum)")
    p.add_argument("--last-frac", type=float, default=C.DEFAULT_LAST_FRACTION,
                   help="fraction of the grid averaged by --metric last20")
    p.add_argument("--curves", choices=["runmax", "smoothed"], default="runmax",
                   help="line plots: running max (paper) or the reference's smoothed curve")
    p.add_argument("--beta", type=float, default=C.DEFAULT_BETA, help="forgetting threshold for t_alpha")
    p.add_argument("--compare", default="gru", help="baseline model for P(FFM > baseline) (default gru)")
    p.add_argument("--formats", default="png,pdf", help="figure formats, comma separated (default png,pdf)")
    p.add_argument("--pool-sources", action="store_true",
                   help="pool reference-implementation runs with ours (default: separate groups, '(ref)')")
    p.add_argument("--no-cache", action="store_true", help="re-read every run instead of using OUT/.cache")
    return p


@dataclass
class Context:
    args: argparse.Namespace
    out: Path
    written: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # report.md's "Notes"
    # The one list of skipped input and warnings: loading's, then every step's (see summary()).
    report: load.LoadReport = field(default_factory=load.LoadReport)
    table: pd.DataFrame | None = None
    horizons: pd.DataFrame | None = None
    _scores: pd.DataFrame | None = None

    @property
    def formats(self) -> tuple[str, ...]:
        return tuple(f.strip() for f in self.args.formats.split(",") if f.strip())

    def emit(self, paths) -> None:
        for p in paths:
            self.written.append(Path(p))
            print(f"wrote {p}")

    def tables(self, name: str) -> Path:
        return self.out / "tables" / name

    def figs(self, name: str) -> Path:
        return self.out / "figures" / name

    def scores(self) -> pd.DataFrame:
        if self._scores is None:
            a = self.args
            self._scores = stats.run_scores(self.table, a.metric, a.max_steps, a.grid_start, a.grid_interval,
                                            a.window, a.last_frac)
        return self._scores

    def boot(self) -> dict:
        return {"confidence": self.args.confidence, "n_resamples": self.args.resamples, "seed": self.args.seed}

    def metric_label(self) -> str:
        return "Best eval return" if self.args.metric == C.METRIC_RUNMAX else \
            f"Eval return (last {self.args.last_frac:.0%})"

    def metric_description(self) -> str:
        return C.metric_description(self.args.metric, self.args.last_frac)


class UsageError(Exception):
    """Bad input (an option's value, a missing folder or file): ``error: <message>`` and exit code 2."""


def _or_task(value) -> str:
    return "the task's default" if value is None else f"{value:g}"


def _validate(args: argparse.Namespace, command: str) -> None:
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
    if command == "efficiency" and not args.bench:
        raise UsageError("the efficiency command needs at least one --bench FILE")
    if command not in ("efficiency",) and not args.runs:
        raise UsageError(f"the {command} command needs at least one RUNS folder")
    missing = [r for r in args.runs if not Path(r).exists()]
    if missing:
        raise UsageError(f"no such RUNS folder: {', '.join(missing)}")


def _load(ctx: Context) -> None:
    a = ctx.args
    cache = None if a.no_cache else ctx.out / ".cache"
    try:
        table, report = load.load_runs(a.runs, cache_dir=cache)
    except (FileNotFoundError, ValueError) as exc:
        raise UsageError(str(exc)) from exc
    if table.empty:
        skipped = "".join(f"\n  skipped {i.path}: {i.reason}" for i in report.skipped)
        raise UsageError(f"no usable runs (folders with a {load.PROGRESS} holding evaluations) under "
                         f"{', '.join(map(str, a.runs))}{skipped}")
    if not a.pool_sources:
        table = load.separate_sources(table)
    ctx.table, ctx.report = table, report
    print(f"loaded {report.n_runs_loaded} of {report.n_runs_found} run dir(s)")
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
    ctx.emit(write_table(scores.drop(columns=["source"]), ctx.tables(f"scores_{ctx.args.metric}"),
                         title=f"Per-run score: {ctx.metric_description()}"))
    summary = stats.summarize(scores, **ctx.boot())
    ctx.emit(write_table(summary, ctx.tables(f"summary_{ctx.args.metric}"),
                         title=f"Mean over runs, {ctx.args.confidence:.0%} bootstrap CI "
                               f"({ctx.metric_description()})"))


def cmd_bars(ctx: Context) -> None:
    scores = ctx.scores()
    summary = stats.summarize(scores, **ctx.boot())
    name = f"bars_{ctx.args.metric}"
    ctx.emit(write_table(summary, ctx.tables(name), title=ctx.metric_description()))
    ctx.emit(figures.plot_task_bars(summary, scores, ctx.figs(name), ctx.metric_label(), ctx.formats,
                                    ctx.args.confidence))


def cmd_lines(ctx: Context) -> None:
    a = ctx.args
    curves = stats.curves_on_grid(ctx.table, a.curves, a.grid_start, a.grid_interval, a.window, a.max_steps)
    band = stats.curve_band(curves, **ctx.boot())
    ctx.report.extend(stats.curve_cuts(curves))
    ctx.emit(write_table(band, ctx.tables(f"lines_{a.curves}"), title=f"Learning curves ({a.curves})"))
    y = "Best eval return so far" if a.curves == "runmax" else "Eval return (smoothed)"
    for algo in sorted(curves["algo"].unique()):
        ctx.emit(figures.plot_curves(curves, band, ctx.figs(f"lines_{a.curves}_{algo}"), algo, y, ctx.formats,
                                     a.confidence))


def cmd_aggregate(ctx: Context) -> None:
    a = ctx.args
    scores = ctx.scores()
    norm, notes = stats.normalize(scores)
    ctx.notes.extend(notes)
    agg, agg_notes = stats.aggregate_scores(norm, **ctx.boot())
    ctx.notes.extend(agg_notes)
    # Tasks a group has but the aggregate leaves out (not shared by every group): its IQM and mean are over fewer
    # tasks than the group ran, which changes what they mean; said on the console, not only in report.md.
    covered = {(r.algo, r.model): set(r.tasks.split()) for r in agg.itertuples(index=False)}
    for (algo, model), g in norm[np.isfinite(norm["norm_score"].to_numpy(float))].groupby(["algo", "model"]):
        left = sorted(set(g["task"]) - covered.get((algo, model), set()))
        if left:
            ctx.report.add(f"{algo}_{model}", "warning",
                           f"aggregate ({a.metric}): task(s) {', '.join(left)} left out, as not every group has "
                           f"them; the aggregate is over {len(covered.get((algo, model), ()))} task(s)")
    for r in agg.drop_duplicates(["algo", "model"]).itertuples(index=False):
        for task in r.single_run_tasks.split():
            ctx.report.add(f"{task}/{r.algo}_{r.model}", "warning",
                           f"aggregate ({a.metric}): the task has a single {r.algo}/{r.model} run; it adds no "
                           "bootstrap variance, so the aggregate's CI understates the uncertainty")
    poi = pd.concat([stats.probability_of_improvement(scores, "ffm", a.compare, **ctx.boot()),
                     stats.probability_of_improvement(scores, "ffm", a.compare + C.REF_SUFFIX, **ctx.boot())],
                    ignore_index=True)
    if poi.empty:
        ctx.notes.append(f"probability of improvement: no task has both FFM and {a.compare!r} runs")
    else:
        ctx.emit(write_table(poi, ctx.tables("probability_of_improvement"),
                             title=f"Probability that FFM beats the baseline on a task ({a.metric}, raw scores)"))
    ctx.emit(write_table(norm.drop(columns=["source"]), ctx.tables(f"normalised_{a.metric}"),
                         title="(score - Random) / (Oracle - Random)"))
    if agg.empty:
        ctx.notes.append("aggregate: no normalisable task; aggregate figure and profile skipped")
        return
    ctx.emit(write_table(agg, ctx.tables(f"aggregate_{a.metric}"),
                         title=f"Normalised {a.metric} over tasks, {a.confidence:.0%} stratified-bootstrap CI"))
    ctx.emit(figures.plot_aggregate(agg, ctx.figs(f"aggregate_{a.metric}"), ctx.formats, a.confidence))
    top = max(1.0, float(np.nanmax(norm["norm_score"]))) if np.isfinite(norm["norm_score"]).any() else 1.0
    taus = np.linspace(0.0, top, 101)
    used = norm[norm["task"].isin(set(" ".join(agg["tasks"]).split()))]
    profile = stats.performance_profile(used, taus, **ctx.boot())
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
        ctx.emit(figures.plot_decay(d, ctx.figs(f"decay_{figures.task_label(task)}_{algo}"), title,
                                    ctx.args.beta, ctx.formats))


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


def write_report(ctx: Context) -> Path:
    """report.md: settings, what was loaded, the runs and horizon of every group, every skipped file or row and
    every warning with why, and notes.  Its counts are ``ctx.report.summary()``, the line the console prints."""
    a = ctx.args
    lines = ["# Analysis report", "",
             f"- score metric: `{a.metric}` = {ctx.metric_description()}",
             f"- bootstrap: seed {a.seed}, {a.resamples} resamples, {a.confidence:.0%} intervals",
             f"- max env steps: {a.max_steps if a.max_steps is not None else 'none'}",
             f"- curve grid: start {_or_task(a.grid_start)}, interval {_or_task(a.grid_interval)}, smoothing window "
             f"{_or_task(a.window)} grid points; line plots: {a.curves}",
             f"- learning curves: {stats.CURVE_RULE}",
             f"- summary: {ctx.report.summary()}"]
    t = ctx.table
    if t is not None and len(t):
        runs = t.drop_duplicates("run_id")
        unfinished = int((runs["finished"] == False).sum())  # noqa: E712  (nullable boolean)
        unknown = int(runs["finished"].isna().sum())
        ended = runs["status"].value_counts()
        lines.append(f"- unfinished runs (no {load.DONE_MARKER} file, still analysed): {unfinished}, of which "
                     f"{int(ended.get('diverged', 0))} diverged and {int(ended.get('failed', 0))} failed (each named "
                     f"under warnings); completion unknown (reference layout): {unknown}")
        # Runs per group and the horizon each was scored on: the env steps of its shortest and longest run's
        # last evaluation (up to --max-steps), and which run is the shortest where they differ.
        h = ctx.horizons.copy()
        h["model_label"] = h["model"].map(C.model_label)
        h.loc[h["env_steps_min"] == h["env_steps_max"], "shortest_run"] = ""
        h = h.rename(columns={"n_runs": "runs"})[["task", "algo", "model_label", "runs", "env_steps_min",
                                                   "env_steps_max", "shortest_run"]]
        cut = f", evaluations after --max-steps {a.max_steps:g} ignored" if a.max_steps is not None else ""
        lines += ["", "## Runs per group and their horizon", "",
                  f"env_steps_min / env_steps_max: the last evaluation of the group's shortest / longest run{cut}; "
                  "scores and curve ends depend on it.", "", to_markdown(h, digits=0)]
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


def _print_issues(report: load.LoadReport, limit: int = 50) -> None:
    """The skipped input and warnings on stderr (the first ``limit``; all of them, and the notes, are in
    report.md), then the one summary line."""
    shown = [i for i in report.issues if i.kind != "note"]
    for issue in shown[:limit]:
        print(f"{issue.kind}: {issue.path}: {issue.reason}", file=sys.stderr)
    if len(shown) > limit:
        print(f"... and {len(shown) - limit} more: see report.md", file=sys.stderr)
    print(report.summary())


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


_RUNNERS = {"table": cmd_table, "bars": cmd_bars, "lines": cmd_lines, "aggregate": cmd_aggregate,
            "decay": cmd_decay, "efficiency": cmd_efficiency}


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv.pop(0) if argv and argv[0] in COMMANDS else "all"
    args = build_parser().parse_args(argv)
    _validate(args, command)  # before --out is created: bad input leaves nothing behind
    out = _prepare_out(args.out)
    if out is None:
        return 2
    ctx = Context(args=args, out=out)
    if args.runs:
        _load(ctx)
    steps = list(_RUNNERS) if command == "all" else [command]
    if ctx.table is not None and ctx.table.empty:
        ctx.notes.append("no run could be loaded; only the report (and benchmarks) were produced")
        steps = [s for s in steps if s == "efficiency"]
    if command == "all" and not args.runs:
        steps = ["efficiency"]
    for step in steps:
        _RUNNERS[step](ctx)
    report = write_report(ctx)
    print(f"wrote {report}")
    print(f"wrote {ctx.out / 'issues.csv'}")
    _print_issues(ctx.report)
    return 0
