"""``python -m pomdp_ffm.bench {efficiency,memory,scan,update,act,loop,eval,overlap,ledger}``: benchmarks that compare
variants in one process (docs/benchmarks.md), each a subcommand with its own options (``python -m pomdp_ffm.bench
memory --help``).

``loop`` takes Hydra overrides after its options: ``python -m pomdp_ffm.bench loop env=HopperBLT-V-v0 algo=sac
seq_model=ffm --steps 3000``; so do ``eval`` (``python -m pomdp_ffm.bench eval env=Pendulum-V-v0``) and
``overlap`` (``python -m pomdp_ffm.bench overlap env=HalfCheetahBLT-V-v0 eval.workers=true --updates 200``)."""

from __future__ import annotations

import argparse
import os
import platform
import sys

import torch

from ..run.exits import EXIT_UNWRITABLE
from ..run.unwritable import Unwritable
from .common import check_csv, print_table, write_csv


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        """One line, exit 2 (argparse's own prints its usage block first)."""
        self.refuse(f"{message} (`{self.prog} --help` lists the options)")

    def refuse(self, message: str):
        self.exit(2, f"error: {message}\n")


def _number(cast, ok, must: str):
    def parse(text: str):
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {'whole ' if cast is int else ''}number") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{value} must be {must}")
        return value

    return parse


_count = _number(int, lambda v: v >= 1, ">= 1")
_ms = _number(float, lambda v: 0 < v < float("inf"), "a finite number of milliseconds > 0")


def _parser() -> _Parser:
    """A subcommand a benchmark, each with its own options (``python -m pomdp_ffm.bench BENCHMARK --help``);
    ``commands``: the subcommands' parsers by name."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    common.add_argument("--threads", type=_count, help="torch intra-op threads (default: torch's)")
    common.add_argument(
        "--csv", help="also add the rows to this CSV file (after those it holds; made where there is none)"
    )
    timed = argparse.ArgumentParser(add_help=False)
    timed.add_argument("--repeats", type=_count, default=20, help="interleaved timing rounds")
    seeds = argparse.ArgumentParser(add_help=False)
    seeds.add_argument(
        "--seeds", type=_count, nargs="+", help="also the seed axis for these seed counts (e.g. 1 5 10 20)"
    )
    p = _Parser(prog="python -m pomdp_ffm.bench", description=__doc__)
    sub = p.add_subparsers(dest="which", required=True, metavar="BENCHMARK", parser_class=_Parser)
    p.commands = {}

    def command(name: str, what: str, *parents: argparse.ArgumentParser) -> _Parser:
        p.commands[name] = sub.add_parser(name, help=what, description=what, parents=[common, *parents])
        return p.commands[name]

    c = command("efficiency", "the FFM paper's efficiency protocol for every registered memory")
    c.add_argument("--models", nargs="+", help="these registered memories (default: every one)")
    c.add_argument("--trials", type=_count, default=10, help="trials per model (default 10, the paper's)")
    c = command("memory", "forward and backward of each memory model variant at the RL and the paper's shapes", timed)
    c.add_argument("--shapes", nargs="+", choices=["rl", "paper"], help="these shapes (default both)")
    c.add_argument("--variants", nargs="+", help="time only these (e.g. ffm gru gru-loop; default all)")
    command("scan", "FFM's aggregator forms at every shape", timed)
    c = command("update", "one SAC/TD3 update at the BLT shape", timed, seeds)
    c.add_argument(
        "--compile",
        action="store_true",
        help="eager against torch.compile (train.compile), SAC/TD3 x FFM/GRU, compile times, kernels",
    )
    command("act", "one acting step: the agent's, and its CPU copy's", timed, seeds)
    c = command("loop", "a short training run, its time split by phase (takes key=value overrides)")
    c.add_argument("--steps", type=_count, default=3000, help="env steps to train for (default 3000)")
    c.add_argument(
        "--project",
        metavar="TASK",
        help="also project the full budget of TASK (e.g. HopperBLT-V-v0) from this run's acting, update and "
        "evaluation costs, with --env-step-ms as its env step cost",
    )
    c.add_argument(
        "--env-step-ms", type=_ms, help="with --project: TASK's env step cost in ms, measured where its env runs"
    )
    command("eval", "evaluation episodes together against one after another (takes key=value overrides)", timed)
    c = command("overlap", "a deferred evaluation beside a burst of updates (takes key=value overrides)", timed)
    c.add_argument("--updates", type=_count, default=200, help="updates in the burst (default 200)")
    command("ledger", "the ledger's figures (patches/) measured on this machine: printed, not timed")
    return p


def main(argv=None) -> None:
    if argv is None and sys.platform.startswith("linux") and "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        # glibc hands tensors above its (dynamic, <= 32 MB) mmap threshold back to the OS on free, so every
        # iteration page-faults them in again; on small VMs that made long-sequence timings 2-4x noisier.
        # The thresholds are read once at process start, hence the re-exec.
        big = str(4 << 30)
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=big, MALLOC_TRIM_THRESHOLD_=big)
        os.execve(sys.executable, [sys.executable, "-m", "pomdp_ffm.bench", *sys.argv[1:]], env)
    p = _parser()
    args, overrides = p.parse_known_args(argv)
    command = p.commands[args.which]
    flags = [o for o in overrides if o.startswith("-") or "=" not in o]
    if flags:
        command.error(f"unrecognized arguments: {' '.join(flags)}")
    if overrides and args.which not in ("loop", "eval", "overlap"):
        command.error(
            f"unrecognized arguments: {' '.join(overrides)} (only `loop`, `eval` and `overlap` take key=value "
            "overrides)"
        )
    if args.which == "loop" and (args.project is None) != (args.env_step_ms is None):
        command.error("--project and --env-step-ms go together")
    from ..config import resolve_device
    from ..envs import get_task  # (here: after the re-exec, as every import of the training stack)
    from ..jobs.plan import Refused
    from ..jobs.precheck import precheck
    from .memory import variants

    def checked(prefix: str, fn, *a, **kw):
        try:
            return fn(*a, **kw)
        except (Refused, ValueError) as e:
            p.refuse(f"{prefix}{e}")
        except Unwritable as e:  # the file system refuses the write: 74, as a run's (launch/README.md)
            p.exit(EXIT_UNWRITABLE, f"error: {e}; {e.fix}, then rerun\n")

    if args.which == "loop" and args.project is not None:
        checked(f"--project {args.project}: ", get_task, args.project)
    held = checked(f"--csv {args.csv}: ", check_csv, args.csv) if args.csv else 0  # before anything is measured
    device = checked(f"--device {args.device}: ", resolve_device, args.device)
    if args.which == "memory" and args.variants:
        checked("--variants: ", variants, 4, 32, device, args.variants)
    if args.which == "efficiency" and args.models:
        from ..seq_models import available

        unknown = [m for m in args.models if m not in available()]
        if unknown:
            p.refuse(f"--models {' '.join(unknown)}: not registered; the memories are {', '.join(available())}")
    if overrides:  # the settings a benchmark trains with, checked as `python -m pomdp_ffm.train` checks them
        checked("", precheck, overrides, check_dirs=False)  # a benchmark trains in a folder of its own
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    print(f"device={device} ({name}), torch {torch.__version__}, threads={torch.get_num_threads()}")
    if held:
        print(f"{args.csv} holds {held} rows: they stay, this run's rows come after them")
    try:
        rows = _run(args, overrides, device)
        if args.csv and rows and args.which != "efficiency":  # (efficiency adds its rows as each trial ends)
            write_csv(rows, args.csv)
            print(f"\nadded {len(rows)} rows to {args.csv}")
    except Refused as e:  # a setting only the benchmark's trainer could check (e.g. its evaluation clock)
        p.refuse(str(e))
    except Unwritable as e:  # what check_csv could not foresee: a disk filled, the file replaced by a folder
        p.exit(EXIT_UNWRITABLE, f"error: {e}; {e.fix}, then rerun (the file holds what it held before this write)\n")


def _run(args, overrides: list[str], device: torch.device) -> list:
    """The benchmark's rows, each table printed as it is done (``loop`` prints a report of its own)."""
    from . import acting, efficiency, evaluation, ledger, loop, memory, scan, update

    if args.which == "ledger":  # figures, not timings: printed as measured, no ratios
        return ledger.run()

    if args.which == "loop":
        from ..run.exits import EXIT_STOPPED

        try:
            result = loop.run(overrides, args.steps, device, args.threads)
        except loop.StoppedEarly as e:
            print(f"stopped: {e}", file=sys.stderr)
            sys.exit(EXIT_STOPPED)
        loop.report(result)
        if args.project:
            loop.report_projection(result, args.project, args.env_step_ms, device, args.threads)
        if result["stopped"]:
            sys.exit(EXIT_STOPPED)
        return []
    if args.which == "update" and args.compile:
        rows = update.run_compiled(args.repeats, device, args.seeds)
        print_table(rows, baseline="sac_gru")
        return rows
    if args.which == "efficiency":
        from ..seq_models import available

        epoch = efficiency.PAPER_EPOCH if device.type == "cuda" else efficiency.CPU_EPOCH
        print(f"one trial: {epoch.shape} (1/{round(1 / epoch.fraction)} of the paper's epoch), {args.trials} trials")
        rows = efficiency.run(args.models or available(), args.trials, device, epoch, args.csv)
        print_table(efficiency.summary(rows), baseline="ffm")
        return rows
    if args.which == "memory":
        rows = memory.run(args.shapes or list(memory.SHAPES), args.repeats, device, args.variants)
        baseline = "gru"
    elif args.which == "scan":
        rows = scan.run(args.repeats, device)
        baseline = "loop"
    elif args.which == "update":
        rows = update.run(args.repeats, device)
        baseline = "sac_gru"
    elif args.which == "act":
        rows = acting.run(args.repeats, device)
        baseline = "agent"
    elif args.which == "eval":
        rows = evaluation.run(overrides, args.repeats, device, args.threads)
        baseline = "one-after-another"
    else:  # overlap
        rows = evaluation.run_overlap(overrides, args.updates, args.repeats, device, args.threads)
        baseline = "after"
    print_table(rows, baseline=baseline)
    if args.which in ("act", "update") and args.seeds:  # each with its seed axis
        module = acting if args.which == "act" else update
        seeds = module.run_seeds(args.seeds, args.repeats, device)
        print_table(seeds, baseline="separate")
        rows += seeds
    return rows


if __name__ == "__main__":
    main()
