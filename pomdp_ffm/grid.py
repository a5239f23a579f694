"""The jobs a multirun would start, and where each of their run directories stands, without starting any.

The job list is expanded by Hydra's own override parser and BasicSweeper from the composed config's
``hydra.sweeper.params`` plus the command-line overrides, exactly as ``python -m pomdp_ffm.train -m ...``
would expand them, so a dry run cannot disagree with the real launch about which jobs exist.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from .config import register_configs
from .rundir import STATUSES, RunDir
from .start import seed_dirs

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"

# Config-group choices and the config keys they set (each conf/<group>/<choice>.yaml sets its key to the
# choice's name; tests/test_config.py checks that).
_GROUP_KEYS = {"env": "env.env_name", "algo": "policy.algo_name", "seq_model": "policy.seq_model"}


@dataclass
class Job:
    overrides: list[str]
    run_dir: Path
    status: str  # one of rundir.STATUSES
    run_dirs: list[Path] = field(default_factory=list)  # with seeds=[...]: every seed's directory


def run_status(run_dir: Path) -> str:
    return RunDir(run_dir).status()


def combined_status(statuses: list[str]) -> str:
    """A seed-axis job's status: done when every seed is; else the first of running, failed, resumable that
    any seed has (a mix of done and new seeds is resumable: the job continues)."""
    if all(s == "done" for s in statuses):
        return "done"
    for s in ("running", "failed", "resumable"):
        if s in statuses:
            return s
    return "resumable" if "done" in statuses else "new"


__all__ = ["Job", "STATUSES", "job_overrides", "run_status", "sweep_jobs"]


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
        params = [f"{k}={v}" for k, v in (cfg.hydra.sweeper.params or {}).items()] + list(overrides)
    else:
        params = list(overrides)
    batches = BasicSweeper.split_arguments(parser.parse_overrides(params), None)
    return [list(job) for batch in batches for job in batch], cfg


def sweep_jobs(overrides: list[str]) -> list[Job]:
    parser = OverridesParser.create()
    jobs_overrides, cfg = job_overrides(overrides)
    sweep_dir = Path(str(cfg.hydra.sweep.dir))
    subdir = OmegaConf.to_container(cfg.hydra.sweep, resolve=False)["subdir"]
    base = {"env": {"env_name": cfg.env.env_name},
            "policy": {"algo_name": cfg.policy.algo_name, "seq_model": cfg.policy.seq_model},
            "seed": cfg.seed}
    jobs = []
    for job in jobs_overrides:
        values = OmegaConf.create(base)
        seeds = cfg.get("seeds")
        for o in parser.parse_overrides(job):
            if o.key_or_group == "seeds":
                seeds = o.value()
                continue
            key = _GROUP_KEYS.get(o.key_or_group, o.key_or_group)
            if OmegaConf.select(values, key, default=None) is not None:
                OmegaConf.update(values, key, o.value())
        values["_subdir"] = subdir
        run_dir = sweep_dir / str(values._subdir)
        if seeds:
            dirs = seed_dirs(run_dir, int(values.seed), [int(k) for k in seeds])
            jobs.append(Job(list(job), run_dir, combined_status([run_status(d) for d in dirs]), dirs))
        else:
            jobs.append(Job(list(job), run_dir, run_status(run_dir), [run_dir]))
    return jobs
