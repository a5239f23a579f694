"""The jobs a multirun would start, and where each of their run directories stand, without starting any.

The job list is expanded by Hydra's own override parser and BasicSweeper from the composed config's
``hydra.sweeper.params`` plus the command-line overrides, exactly as ``python -m pomdp_ffm.train -m ...``
would expand them, so a dry run cannot disagree with the real launch about which jobs exist. A run directory's
status is ``plan.status``, the checks a start makes (reading only), so a status cannot disagree with a start either.

Also here: how a sweep ended (``SweepOutcomes``), and ``python -m pomdp_ffm.jobs.grid status <dir>...``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from ..config import register_configs
from ..run.exits import EXIT_OK, EXIT_REFUSED
from ..run.rundir import JobResult, RunDir, RunStatus, Status, replace_text
from .plan import seed_config, seed_dirs, status

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"

# Config-group choices and the config keys they set (each conf/<group>/<choice>.yaml sets its key to the
# choice's name; tests/test_config.py checks that).
_GROUP_KEYS = {"env": "env.env_name", "algo": "policy.algo_name", "seq_model": "policy.seq_model"}


@dataclass
class Job:
    overrides: list[str]
    run_dir: Path
    run_dirs: list[Path]  # with seeds=[...]: every seed's directory
    statuses: list[RunStatus]  # plan.status of each

    @property
    def status(self) -> RunStatus:
        return combined_status(self.statuses)


def combined_status(statuses: list[RunStatus]) -> RunStatus:
    """A seed-axis job's status: done when every seed is; else the first of damaged, running, failed, resumable
    that any seed has (a job is as good as its worst seed); a mix of done and new seeds is resumable: the job
    continues."""
    kinds = [s.kind for s in statuses]
    for worst in (Status.DAMAGED, Status.RUNNING, Status.FAILED, Status.RESUMABLE):
        if worst in kinds:
            return statuses[kinds.index(worst)]
    if all(k == Status.DONE for k in kinds):
        return RunStatus(Status.DONE)
    return RunStatus(Status.RESUMABLE if Status.DONE in kinds else Status.NEW)


def show(status: RunStatus, where) -> str:
    """One line: the status's kind, the directory, and why (a reason, a lock's holder)."""
    return f"{status.kind:9s} {where}" + (f"  {status.detail}" if status.detail else "")


def show_job(job: Job, where, each: bool | None = None) -> list[str]:
    """A job's line, then (``each``; default: where its run directories' statuses differ) one line for each."""
    if each is None:
        each = len(set(job.statuses)) > 1
    if not each:
        return [show(job.status, where)]
    head = RunStatus(job.status.kind)
    return [show(head, where)] + ["    " + show(s, d.name) for s, d in zip(job.statuses, job.run_dirs)]


def job_overrides(overrides: list[str], multirun: bool = True) -> tuple[list[list[str]], DictConfig]:
    """The overrides of each job that ``overrides`` start, and the config composed from their fixed part (with
    Hydra's): with ``multirun`` (or a preset that sets ``hydra.mode: MULTIRUN``), the preset's
    ``hydra.sweeper.params`` and then the command line's, expanded by Hydra's BasicSweeper (a key on the command
    line replaces the preset's sweep of it); otherwise the one job of ``overrides``."""
    register_configs()
    parser = OverridesParser.create()
    parsed = parser.parse_overrides(list(overrides))
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=fixed, return_hydra_config=True)
        if multirun or cfg.hydra.mode == RunMode.MULTIRUN:
            preset = cfg.hydra.sweeper.params or {}
        else:
            preset = {}
        params = [f"{k}={v}" for k, v in preset.items()] + list(overrides)
        # (a glob sweep, seq_model=glob(*), lists a config group's options: the parser needs the config loader)
        with_groups = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
        batches = BasicSweeper.split_arguments(with_groups.parse_overrides(params), None)
    return [list(job) for batch in batches for job in batch], cfg


def job_configs(jobs: list[list[str]]) -> list[tuple[list[str], DictConfig]]:
    """Each job's composed config, composing once the jobs that differ only in an integer seed."""
    parser = OverridesParser.create()
    groups: dict[tuple[str, ...], list[tuple[list[str], object]]] = {}
    for job in jobs:
        seed = [o.value() for o in parser.parse_overrides(job) if o.input_line.startswith("seed=")]
        plain = len(seed) == 1 and isinstance(seed[0], int) and not isinstance(seed[0], bool)
        rest = tuple(x for x in job if not (plain and x.startswith("seed=")))
        groups.setdefault(rest, []).append((job, seed[0] if plain else None))
    out = []
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        for (first, _), *others in groups.values():
            cfg = compose("config", overrides=first)
            out.append((first, cfg))
            for job, seed in others:
                job_cfg = cfg.copy()
                OmegaConf.update(job_cfg, "seed", seed)
                out.append((job, job_cfg))
    return out


def sweep_jobs(overrides: list[str], statuses: bool = True) -> list[Job]:
    """Every job of the sweep and, by plan.status under the job's own config, where its run directories stand
    (``statuses=False``: the jobs and their directories only, nothing composed or checked)."""
    parser = OverridesParser.create()
    jobs_overrides, cfg = job_overrides(overrides)
    sweep_dir = Path(str(cfg.hydra.sweep.dir))
    subdir = OmegaConf.to_container(cfg.hydra.sweep, resolve=False)["subdir"]
    base = {
        "env": {"env_name": cfg.env.env_name},
        "policy": {"algo_name": cfg.policy.algo_name, "seq_model": cfg.policy.seq_model},
        "seed": cfg.seed,
    }
    jobs = []
    for job in jobs_overrides:
        values = OmegaConf.create(base)
        seeds = cfg.get("seeds")
        for o in parser.parse_overrides(job):
            key = _GROUP_KEYS.get(o.key_or_group, o.key_or_group)
            if key == "seeds":
                seeds = o.value()
            elif OmegaConf.select(values, key, default=None) is not None:
                OmegaConf.update(values, key, o.value())
        values["_subdir"] = subdir
        run_dir = sweep_dir / str(values._subdir)
        if seeds:
            dirs = seed_dirs(run_dir, int(values.seed), [int(k) for k in seeds])
        else:
            dirs = [run_dir]
        jobs.append(Job(list(job), run_dir, dirs, []))
    if not statuses:
        return jobs
    # A job with something where its runs belong is checked under its own config (composed: 0.1 s each).
    held = [j.overrides for j in jobs if any(d.exists() or d.is_symlink() for d in j.run_dirs)]
    configs = {tuple(o): c for o, c in job_configs(held)}
    for j in jobs:
        cfg = configs.get(tuple(j.overrides))
        seeds = cfg.get("seeds") if cfg is not None else None
        if seeds:
            j.statuses = [status(d, seed_config(cfg, k)) for d, k in zip(j.run_dirs, seeds)]
        else:
            j.statuses = [status(d, cfg) for d in j.run_dirs]
    return jobs


_ended: Counter | None = None  # the last sweep's outcomes in this process, by kind


def sweep_outcome() -> Counter | None:
    """How many of the last sweep's jobs (in this process) finished, were refused, failed or stopped."""
    return _ended


class SweepOutcomes(Callback):
    """Names each refused or failed job and sums the sweep up in the launching process (conf/config.yaml). Hydra
    calls on_job_end where the job ran (here, a joblib worker, a submitit job): each leaves its outcome in a file
    of its own beside the runs, which on_multirun_end reads and removes."""

    folder: str | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        here = f".outcomes-{socket.gethostname()}-{os.getpid()}"
        self.folder = str(Path(str(config.hydra.sweep.dir)).resolve() / here)

    def on_job_end(self, config: DictConfig, job_return, **kwargs) -> None:
        if self.folder is None:  # a single run
            return
        try:
            value = job_return.return_value
        except Exception as e:  # (the train entry point returns its refusals and failures)
            value = JobResult(failed=f"{type(e).__name__}: {e}")
        if not isinstance(value, JobResult):  # (a job that is not pomdp_ffm.train's)
            value = JobResult()
        why = " ".join((value.refused or value.failed).split())
        record = {"kind": value.kind, "dir": str(config.hydra.runtime.output_dir), "why": why}
        Path(self.folder).mkdir(parents=True, exist_ok=True)
        replace_text(Path(self.folder) / str(config.hydra.job.num), json.dumps(record))

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        global _ended
        folder = Path(self.folder)
        records = [json.loads(p.read_text()) for p in sorted(folder.glob("[0-9]*"), key=lambda p: int(p.name))]
        shutil.rmtree(folder, ignore_errors=True)
        n = Counter(r["kind"] for r in records)
        _ended = n
        for r in records:
            if r["kind"] in ("refused", "failed"):
                print(f"{r['kind']}: {r['dir']}: {r['why']}", file=sys.stderr)
        print(
            f"{n['finished']} finished, {n['refused']} refused, {n['failed']} failed"
            + (f", {n['stopped']} stopped" if n["stopped"] else ""),
            file=sys.stderr,
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m pomdp_ffm.jobs.grid",
        description="Where run directories stand, by the checks a start makes (launch/README.md, Statuses).",
    )
    sub = ap.add_subparsers(dest="command", required=True)
    st = sub.add_parser("status", help="print each run directory's status; exit 2 where one is missing or damaged")
    st.add_argument("dirs", nargs="+", help="run directories, or folders of seed-<k> run directories")
    args = ap.parse_args(argv)
    code = EXIT_OK
    for d in map(Path, args.dirs):
        run = RunDir(d)
        # A folder that is no run itself (no config, checkpoint or DONE) may hold a seed axis's seed-<k> directories.
        if not d.is_dir() or any(p.exists() for p in (run.config, run.checkpoint, run.done)):
            seeds = []
        else:
            seeds = sorted(
                (p for p in d.iterdir() if re.fullmatch(r"seed-\d+", p.name) and p.is_dir()),
                key=lambda p: int(p.name[5:]),
            )
        dirs = seeds or [d]
        job = Job([], d, dirs, [status(p) for p in dirs])
        missing = not seeds and job.status.kind == Status.NEW and not d.exists()
        if missing:
            print(f"{'missing':9s} {d}  (no such directory)")
            code = EXIT_REFUSED
        else:
            print("\n".join(show_job(job, d, each=bool(seeds))))
            if job.status.kind == Status.DAMAGED:
                code = EXIT_REFUSED
    return code


if __name__ == "__main__":
    sys.exit(main())
