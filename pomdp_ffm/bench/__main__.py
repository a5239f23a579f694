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


def main(argv=None) -> None:
    if argv is None:
        _reexec_with_stable_malloc()
    p = argparse.ArgumentParser(prog="python -m pomdp_ffm.bench", description=__doc__)
    p.add_argument("which", choices=["memory", "update", "act", "loop", "eval", "overlap"])
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--repeats", type=int, default=20, help="interleaved timing rounds")
    p.add_argument("--shapes", nargs="+", default=None, help="memory: rl paper (default both)")
    p.add_argument("--variants", nargs="+", default=None,
                   help="memory: time only these (e.g. ffm gru gru-loop); default all")
    p.add_argument("--csv", default=None, help="also write the rows to this CSV file")
    p.add_argument("--steps", type=int, default=3000, help="loop: env steps to train for (default 3000)")
    p.add_argument("--updates", type=int, default=200, help="overlap: updates in the burst (default 200)")
    p.add_argument("--seeds", type=int, nargs="+", default=None,
                   help="update, act: also the seed axis for these seed counts (e.g. 1 5 10 20)")
    p.add_argument("--project", default=None, metavar="TASK",
                   help="loop: also project the full budget of TASK (e.g. HopperBLT-V-v0) from this run's acting, "
                        "update and evaluation costs, with --env-step-ms as its env step cost")
    p.add_argument("--env-step-ms", type=float, default=None,
                   help="loop: TASK's env step cost in ms, measured where its env runs (with --project)")
    p.add_argument("--joint-eager", action="store_true",
                   help="loop, with seeds=[...]: run the seed axis's joint rounds on this device even without CUDA "
                        "graphs (eagerly), to count how many updates its schedule runs together; the times are "
                        "not those of the GPU path")
    args, overrides = p.parse_known_args(argv)
    bad = [o for o in overrides if "=" not in o]
    if bad or (overrides and args.which not in ("loop", "eval", "overlap")):
        p.error(f"unrecognized arguments: {' '.join(bad or overrides)} (only `loop`, `eval` and `overlap` take "
                "key=value overrides)")

    if args.joint_eager and args.which != "loop":
        p.error(f"--joint-eager is an option of `loop` (a seed axis's joint rounds), not of `{args.which}`")
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    print(f"device={device} ({name}), torch {torch.__version__}, threads={torch.get_num_threads()}")

    if args.which == "loop":
        from . import loop

        if (args.project is None) != (args.env_step_ms is None):
            p.error("--project and --env-step-ms go together")
        if args.joint_eager and not any(o.startswith("seeds=") for o in overrides):
            p.error("--joint-eager counts a seed axis's joint rounds: give seeds=[...]")
        result = loop.run(overrides, args.steps, args.device, args.threads, joint_eager=args.joint_eager)
        loop.report(result)
        if args.project:
            loop.report_projection(result, args.project, args.env_step_ms, args.device, args.threads)
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
