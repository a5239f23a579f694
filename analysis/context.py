"""What one ``python -m analysis`` command works on: its options, where it writes, the runs and published groups
it loaded, the horizon of each group, and the one list of problems met on the way.

Every command step (:mod:`analysis.commands`) reads this context and adds to it what it wrote and met; the
report (:mod:`analysis.report`) is written from it at the end.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from . import columns, load, published, rundirs, stats
from . import constants as C
from .issues import LoadReport
from .options import UsageError, score_settings


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
            self._scores = stats.run_scores(self.table, a.metric, **score_settings(a))
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


def select_published(args: argparse.Namespace):
    """The published groups chosen by --published-select, why each, problems and file counts; read before --out
    is made, so that an unknown name in --published-select leaves nothing behind."""
    table, problems, n_found, n_read = published.read_published(args.published)
    if not n_found:
        raise UsageError(
            f"no {published.FILE_NAME} below --published {', '.join(args.published)} (expected "
            f"<Env>/<P|V>/{published.FILE_NAME}, as in POMDP-Baselines' results/data/pomdp)"
        )
    try:
        chosen, why = published.select(table, args.published_select, **score_settings(args))
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    return chosen, why, problems, n_found, n_read


def load_input(ctx: Context, pub=None) -> None:
    """The runs (and ``pub``, :func:`select_published`'s answer) into one table and one list of issues."""
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


def check_max_steps(ctx: Context) -> None:
    """Bad input when --max-steps is below every run's first evaluation, which would leave nothing to analyse."""
    first = None if ctx.table is None or ctx.table.empty else ctx.table["env_steps"].min()
    if ctx.args.max_steps is not None and first is not None and ctx.args.max_steps < first:
        raise UsageError(
            f"--max-steps {ctx.args.max_steps:g} is below every run's first evaluation (the earliest is "
            f"at {int(first)} env steps): nothing would be left to analyse"
        )
