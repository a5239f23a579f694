"""``python -m analysis [COMMAND] RUNS... [--published DIR] --out DIR``: tables and figures from a folder of runs,
and POMDP-Baselines' published results beside them.

Every problem met on the way (skipped input, warnings) goes into one list: the
console shows each kind of it once with its count, and report.md and issues.csv
hold the whole list and the same counts. Notes (what a step left out by design,
e.g. a task without normalisation constants) are listed in report.md.
"""

# The docstring above is --help's description; the layout goes here instead: the options are options.py's,
# what the commands work on context.py's, each command's work commands.py's; this module runs them in order and
# swaps the finished report into --out.

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from pomdp_ffm.run.exits import EXIT_UNWRITABLE

from .commands import cmd_aggregate, cmd_bars, cmd_decay, cmd_efficiency, cmd_lines, cmd_table
from .context import Context, check_max_steps, load_input, select_published
from .issues import console_lines
from .options import COMMANDS, UsageError, build_parser, validate
from .report import write_report


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
    args = build_parser(__doc__).parse_args(argv)
    validate(args, command)  # before --out is created: bad input leaves nothing behind
    pub = select_published(args) if args.published else None
    made = not Path(args.out).exists()
    out = _prepare_out(args.out)
    if out is None:
        return 2
    # Written beside the previous report, then swapped in: a failure leaves that report, not half a new one.
    ctx = Context(args=args, out=Path(tempfile.mkdtemp(prefix=".new-report-", dir=out)), cache=out / ".cache")
    try:
        if args.runs or pub is not None:
            load_input(ctx, pub)
        check_max_steps(ctx)
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
