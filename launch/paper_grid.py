#!/usr/bin/env python
"""Launch the FFM paper's grid (8 PyBullet P/V tasks x {FFM, GRU} x seeds 0-4, per algorithm).

    python launch/paper_grid.py --dry-run                       # list the 160 jobs, start nothing
    python launch/paper_grid.py --algo sac --launcher local     # 80 SAC runs on this machine
    python launch/paper_grid.py --launcher slurm hydra.launcher.partition=gpu hydra.launcher.account=me
    python launch/paper_grid.py --seed-axis --dry-run           # 32 jobs, each training seeds 0-4 in one process

Anything after the options is passed to Hydra unchanged (overrides, e.g. seed=0,1 or
hydra.launcher.timeout_min=720). Each job's status comes from the checks its start makes
(pomdp_ffm.jobs.plan.status);
a damaged one is listed with its reason before the launch, and the sweep refuses it, writing nothing there, while
the others run. Rerunning the same command skips finished runs and resumes interrupted ones. The sweep names each
refused or failed job and ends with "N finished, M refused, K failed"; exit codes: launch/README.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from collections import Counter

from pomdp_ffm.jobs.grid import show_job, sweep_jobs
from pomdp_ffm.jobs.plan import Refused
from pomdp_ffm.jobs.precheck import precheck
from pomdp_ffm.run.exits import EXIT_OK, EXIT_REFUSED
from pomdp_ffm.run.rundir import STATUSES, Status
from pomdp_ffm.run.signals import END_WITH_ENV, STOP_SIGNALS

LAUNCHERS = ("basic", "local", "slurm", "slurm_local")
# The seed sweep becomes a seed axis: the job named by seed 0 trains seeds 0-4 and writes their sibling directories.
SEED_AXIS = ["seed=0", "seeds=[0,1,2,3,4]"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--algo",
        default="both",
        choices=["sac", "td3", "both"],
        help="algorithm(s) to run (default: both, 160 jobs; one algorithm: 80)",
    )
    ap.add_argument(
        "--launcher",
        default="local",
        choices=LAUNCHERS,
        help="hydra/launcher preset (default: local, joblib on this machine)",
    )
    ap.add_argument("--root", default="runs/paper", help="grid root: runs go to <root>/<task>/<algo>_<model>/seed-<k>")
    ap.add_argument("--dry-run", action="store_true", help="list the jobs and their status, start nothing")
    ap.add_argument(
        "--seed-axis",
        action="store_true",
        help="one job per (task, algo, model) training seeds 0-4 in one process (pomdp_ffm/jobs/seeds.py), "
        "each seed in its usual run directory",
    )
    ap.add_argument("overrides", nargs="*", help="further Hydra overrides")
    args = ap.parse_args(argv)

    preset = "experiment=paper" if args.algo == "both" else f"experiment=paper_{args.algo}"
    overrides = [
        preset,
        f"hydra/launcher={args.launcher}",
        f"hydra.sweep.dir={args.root}",
        *(SEED_AXIS if args.seed_axis else []),
        *args.overrides,
    ]
    try:
        # Every job's settings checked, as `python -m pomdp_ffm.train` checks them, before any is listed or started
        # (with the launcher's, so that its options, e.g. hydra.launcher.partition=gpu, are known keys).
        precheck(["--multirun", *overrides], check_dirs=False)  # the sweep checks its own
        jobs = sweep_jobs(overrides)
    except (Refused, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_REFUSED
    for job in jobs:  # all of them in a dry run; else the damaged ones, which the sweep will refuse
        if args.dry_run or job.status.kind == Status.DAMAGED:
            print("\n".join(show_job(job, f"{job.run_dir}  [{' '.join(job.overrides)}]")))
    counts = Counter(job.status.kind.value for job in jobs)
    runs = sum(len(job.run_dirs) for job in jobs)
    print(
        f"{len(jobs)} jobs"
        + (f" ({runs} runs)" if runs != len(jobs) else "")
        + ": "
        + ", ".join(f"{counts[s]} {s}" for s in STATUSES)
    )
    if args.dry_run:
        return EXIT_REFUSED if counts["damaged"] else EXIT_OK

    cmd = [sys.executable, "-m", "pomdp_ffm.train", "--multirun", *overrides]
    print("+", " ".join(cmd), flush=True)
    # The sweep ends with this script, even one killed by SIGKILL: it is then sent SIGTERM and stops as below (its
    # runs checkpointed, its workers ended), instead of training on with nobody waiting for it (launch/README.md).
    sweep = subprocess.Popen(cmd, env={**os.environ, END_WITH_ENV: str(os.getpid())})
    # A stop signal to this script is the sweep's: passed on, it stops the sweep as it would stop it directly
    # (launch/README.md), and this script reports where the runs stand once the sweep has exited.
    old = {sig: signal.signal(sig, lambda signum, frame: sweep.send_signal(signum)) for sig in STOP_SIGNALS}
    try:
        rc = sweep.wait()
    except KeyboardInterrupt:  # interrupted alone (kill -INT): the sweep is interrupted too, not left running
        sweep.send_signal(signal.SIGINT)
        sweep.wait()
        raise
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    # The sweep's own exit code, or where a signal ended it (before it could stop its runs) the shell's 128 + N.
    return 128 - rc if rc < 0 else rc


if __name__ == "__main__":
    sys.exit(main())
