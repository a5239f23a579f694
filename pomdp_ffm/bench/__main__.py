"""``python -m pomdp_ffm.bench {memory,update,act,loop,eval,overlap}``: benchmarks that compare variants in one
process.

``loop`` takes Hydra overrides after its options: ``python -m pomdp_ffm.bench loop env=HopperBLT-V-v0 algo=sac
seq_model=ffm --steps 3000``; so do ``eval`` (``python -m pomdp_ffm.bench eval env=Pendulum-V-v0``) and
``overlap`` (``python -m pomdp_ffm.bench overlap env=HalfCheetahBLT-V-v0 eval.workers=true --updates 200``)."""
from __future__ import annotations

import argparse
import os
import platform
import sys

import torch

from .common import print_table, write_csv


_BIG = str(4 << 30)


def _reexec_with_stable_malloc() -> None:
    # glibc hands tensors above its (dynamic, <= 32 MB) mmap threshold back to the OS on free, so every
    # iteration page-faults them in again; on small VMs that made long-sequence timings 2-4x noisier.
    # The thresholds are read once at process start, hence the re-exec.
    if sys.platform.startswith("linux") and "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=_BIG, MALLOC_TRIM_THRESHOLD_=_BIG)
        os.execve(sys.executable, [sys.executable, "-m", "pomdp_ffm.bench", *sys.argv[1:]], env)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        """One line, exit 2 (argparse's own prints its usage block first)."""
        self.refuse(f"{message} (`{self.prog} --help` lists the options)")

    def refuse(self, message: str):
        self.exit(2, f"error: {message}\n")


def _at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} must be >= {low}")
        return value
    return parse


def _positive_ms(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{value} must be a finite number of milliseconds > 0")
    return value


def _device(p: _Parser, text: str) -> torch.device:
    from ..trainer import resolve_device

    try:
        return resolve_device(text)
    except ValueError as e:
        p.refuse(f"--device {text}: {e}")


def main(argv=None) -> None:
    if argv is None:
        _reexec_with_stable_malloc()
    p = _Parser(prog="python -m pomdp_ffm.bench", description=__doc__)
    p.add_argument("which", choices=["memory", "update", "act", "loop", "eval", "overlap"])
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--threads", type=_at_least(1), default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--repeats", type=_at_least(1), default=20, help="interleaved timing rounds")
    p.add_argument("--shapes", nargs="+", default=None, choices=["rl", "paper"], help="memory: rl paper (default both)")
    p.add_argument("--variants", nargs="+", default=None,
                   help="memory: time only these (e.g. ffm gru gru-loop); default all")
    p.add_argument("--csv", default=None, help="also write the rows to this CSV file")
    p.add_argument("--steps", type=_at_least(1), default=3000, help="loop: env steps to train for (default 3000)")
    p.add_argument("--updates", type=_at_least(1), default=200, help="overlap: updates in the burst (default 200)")
    p.add_argument("--seeds", type=_at_least(1), nargs="+", default=None,
                   help="update, act: also the seed axis for these seed counts (e.g. 1 5 10 20)")
    p.add_argument("--project", default=None, metavar="TASK",
                   help="loop: also project the full budget of TASK (e.g. HopperBLT-V-v0) from this run's acting, "
                        "update and evaluation costs, with --env-step-ms as its env step cost")
    p.add_argument("--env-step-ms", type=_positive_ms, default=None,
                   help="loop: TASK's env step cost in ms, measured where its env runs (with --project)")
    p.add_argument("--jobs", type=_at_least(1), default=None,
                   help="loop: run this many copies at once, each in a process of its own (jobs sharing this "
                        "machine and its GPU), and report their env steps/s in all")
    args, overrides = p.parse_known_args(argv)
    bad = [o for o in overrides if "=" not in o]
    if bad or (overrides and args.which not in ("loop", "eval", "overlap")):
        p.error(f"unrecognized arguments: {' '.join(bad or overrides)} (only `loop`, `eval` and `overlap` take "
                "key=value overrides)")

    if args.jobs is not None and args.which != "loop":
        p.error(f"--jobs is an option of `loop`, not of `{args.which}`")
    args.jobs = args.jobs or 1
    if args.which == "loop":
        from .loop import MAX_JOBS

        if args.jobs > MAX_JOBS:
            p.error(f"argument --jobs: {args.jobs} must be <= {MAX_JOBS}")
        if args.jobs > 1 and args.project is not None:
            p.error("--jobs and --project do not go together (each job projects its own task's budget)")
        if (args.project is None) != (args.env_step_ms is None):
            p.error("--project and --env-step-ms go together")
        if args.project is not None:
            from ..envs import get_task

            try:
                get_task(args.project)
            except ValueError as e:
                p.refuse(f"--project {args.project}: {e}")
    from ..start import Refused  # (here: after the re-exec, as every import of the training stack)

    if args.csv and not os.path.isdir(os.path.dirname(os.path.abspath(args.csv))):
        p.refuse(f"--csv {args.csv}: its folder does not exist")
    device = _device(p, args.device)
    args.device = str(device)
    if overrides:  # the settings a benchmark trains with, checked as `python -m pomdp_ffm.train` checks them
        from ..train import precheck

        try:
            precheck(overrides, check_dirs=False)  # a benchmark trains in a folder of its own
        except (Refused, ValueError) as e:
            p.refuse(str(e))
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    print(f"device={device} ({name}), torch {torch.__version__}, threads={torch.get_num_threads()}")

    try:
        _run(p, args, overrides, device)
    except Refused as e:  # a setting only the benchmark's trainer could check (e.g. its evaluation clock)
        p.refuse(str(e))


def _run(p: _Parser, args, overrides: list[str], device: torch.device) -> None:
    from ..start import Refused

    if args.which == "loop":
        from . import loop

        from ..train import EXIT_STOPPED

        if args.jobs == 1:
            try:
                result = loop.run_single(overrides, args.steps, args.device, args.threads)
            except loop.StoppedEarly as e:
                print(f"stopped: {e}", file=sys.stderr)
                sys.exit(EXIT_STOPPED)
            loop.report(result)
            if args.project:
                loop.report_projection(result, args.project, args.env_step_ms, args.device, args.threads)
            if result["stopped"]:
                sys.exit(EXIT_STOPPED)
            return
        answers = loop.run_jobs(args.jobs, overrides, args.steps, args.device, args.threads)
        if all("refused" in a for a in answers):  # the same settings, refused by each job's trainer alike
            raise Refused(answers[0]["refused"])
        loop.report_jobs(answers)
        if any(key in a for a in answers for key in ("refused", "error", "lost")):
            sys.exit(1)
        if any(a.get("stopped") or "stopped_early" in a for a in answers):
            sys.exit(EXIT_STOPPED)
        return
    if args.which == "eval":
        from . import evaluation

        rows = evaluation.run(overrides, args.repeats, args.device, args.threads)
        print_table(rows, baseline="one-after-another")
    elif args.which == "overlap":
        from . import overlap

        rows = overlap.run(overrides, args.updates, args.repeats, args.device, args.threads)
        print_table(rows, baseline="after")
    elif args.which == "memory":
        from . import memory

        if args.variants:
            known = memory.variants(4, 32, device)
            unknown = sorted(set(args.variants) - set(known))
            if unknown:
                p.refuse(f"--variants: unknown {unknown}; on {device.type} they are {sorted(known)}")
        rows = memory.run(args.shapes or list(memory.SHAPES), args.repeats, device, args.variants)
        print_table(rows, baseline="gru")
    else:  # act, update: each with its seed-axis variant
        from . import acting, update

        module, baseline = {"act": (acting, "agent"), "update": (update, "sac_gru")}[args.which]
        rows = module.run(args.repeats, device)
        print_table(rows, baseline=baseline)
        if args.seeds:
            seed_rows = module.run_seeds(args.seeds, args.repeats, device)
            print_table(seed_rows, baseline="separate")
            rows += seed_rows
    if args.csv:
        write_csv(rows, args.csv)
        print(f"\nwrote {args.csv}")


if __name__ == "__main__":
    main()
