"""The command line of ``python -m analysis``: its commands, its options and their checks, made before anything
is read or written, so that bad input leaves nothing behind."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import constants as C
from . import published

COMMANDS = ("all", "table", "bars", "lines", "aggregate", "decay", "efficiency")
_HELP = {
    "all": "everything below (default)",
    "table": "tidy table (CSV + Parquet), per-run scores, per-task summary, skip report",
    "bars": "per-task bars with bootstrapped CIs (paper's continuous-control figure)",
    "lines": "learning curves per task: one line per run, mean and CI band",
    "aggregate": "IQM / mean / optimality gap of the normalised score, probability of improvement, profile",
    "decay": "histograms of FFM t_alpha / t_omega from checkpoints (paper's decay figure)",
    "efficiency": "the FFM paper's efficiency figure from benchmark CSVs (and best returns from RUNS), other bars",
}
# What --compare may name: the memories FFM is compared with.
BASELINES = tuple(m for m in C.MEMORY_MODELS if m != "ffm")


def build_parser(description: str) -> argparse.ArgumentParser:
    """The options; ``description`` heads ``--help`` (the entry point's docstring, :mod:`analysis.cli`)."""
    epilog = "commands (optional first argument):\n" + "\n".join(f"  {c:<11} {h}" for c, h in _HELP.items())
    p = argparse.ArgumentParser(
        prog="python -m analysis",
        description=description,
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
        default=",".join(C.BASELINES),
        metavar="MODELS",
        help="baseline memories for P(FFM > baseline), comma separated (default %(default)s): FFM is "
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


class UsageError(Exception):
    """Bad input (an option's value, a missing folder or file): ``error: <message>`` and exit code 2."""


def score_settings(args: argparse.Namespace) -> dict:
    """stats.run_scores' settings from the options."""
    return {
        "max_steps": args.max_steps,
        "grid_start": args.grid_start,
        "grid_interval": args.grid_interval,
        "window": args.window,
        "last_fraction": args.last_frac,
    }


def comma_items(text: str) -> list[str]:
    """The entries of a comma-separated option, blanks dropped."""
    return [t.strip() for t in text.split(",") if t.strip()]


def validate(args: argparse.Namespace, command: str) -> None:
    """Raise :class:`UsageError` for the first bad option or missing input of ``command``."""
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
    bad = [m for m in comma_items(args.compare) if m not in BASELINES]
    if bad or not comma_items(args.compare):
        raise UsageError(
            f"--compare: unknown baseline {bad[0] if bad else args.compare!r}; choose from "
            f"{', '.join(BASELINES)}, comma separated"
        )
    try:
        published.parse_selection(args.published_select)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if command == "efficiency":  # `python -m analysis efficiency BENCH.csv [RUNS...]`: CSV files are benchmarks
        # (one that is not there too: named below as a missing benchmark file, not as a missing RUNS folder)
        args.bench += [r for r in args.runs if r.endswith(".csv") and not Path(r).is_dir()]
        args.runs = [r for r in args.runs if r not in args.bench]
        if not args.bench:
            raise UsageError("the efficiency command needs at least one benchmark CSV (a CSV argument or --bench FILE)")
    missing = [b for b in args.bench if not Path(b).is_file()]
    if missing:
        raise UsageError(f"no benchmark CSV file at {', '.join(missing)}")
    if command not in ("efficiency",) and not args.runs and not args.published:
        raise UsageError(f"the {command} command needs at least one RUNS folder or --published DIR")
    missing = [r for r in args.runs if not Path(r).exists()]
    if missing:
        raise UsageError(f"no such RUNS folder: {', '.join(missing)}")
    missing = [r for r in args.published if not Path(r).exists()]
    if missing:
        raise UsageError(f"no such --published folder: {', '.join(missing)}")
