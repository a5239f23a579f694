"""A run directory's plan, read-only: a job's config built and checked once (``job``: the one place a composed config
becomes a RunConfig), the directory checked against it (``plan``: fresh, resume, skip, or refused naming the file
and the fix), a run's status (``status``), a seed axis's directories and configs. Nothing here writes;
jobs/start.py locks and writes."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from ..config import (
    RunConfig,
    as_read_now,
    check_known_keys,
    env_step_budget,
    flat_keys,
    learning_settings,
    resolve_device,
    yaml_problem,
)
from ..envs import get_task
from ..run.checkpoint import CheckpointError, load_checkpoint, other_format
from ..run.rundir import RunDir, RunDirError, RunStatus, Status


class Action(str, Enum):
    """What a start does with a run directory (``plan``): train afresh, continue from its checkpoint, or skip it."""

    FRESH = "fresh"
    RESUME = "resume"
    SKIP = "skip"

    __str__ = str.__str__  # the value in messages, on every Python (3.12 would print "Action.SKIP")


class Refused(Exception):
    """The run was not started, nothing written. Not in train.py, whose ``__main__`` copy would be another class."""


def seed_dirs(job_dir: Path, seed: int, seeds: list[int]) -> list[Path]:
    """Each seed's run directory of a seed axis: ``job_dir`` with its ``seed-<seed>`` component renamed."""
    name, parts = f"seed-{seed}", job_dir.parts
    where = [i for i, p in enumerate(parts) if p == name]
    if not where:
        raise Refused(
            f"seeds={seeds} needs a run directory with a path component {name} to name each seed's "
            f"sibling (as the presets' .../seed-${{seed}} does); got {job_dir}"
        )
    return [Path(*parts[: where[-1]], f"seed-{k}", *parts[where[-1] + 1 :]) for k in seeds]


def seed_config(cfg: DictConfig, k: int) -> DictConfig:
    c = cfg.copy()
    c.seed, c.seeds = k, None
    return c


def config_differences(stored: dict, current: dict) -> list[str]:
    """Training-relevant keys whose values differ, as 'key: stored -> current' lines."""
    a, b = learning_settings(stored), learning_settings(current, like=stored)
    return [
        f"{key}: {a.get(key, '<absent>')!r} -> {b.get(key, '<absent>')!r}"
        for key in sorted(set(a) | set(b))
        if a.get(key, "<absent>") != b.get(key, "<absent>")
    ]


def validate(cfg: DictConfig) -> RunConfig:
    """Every setting, checked without touching the disk; raises Refused with a one-line message."""
    try:
        check_known_keys(cfg)
        run_cfg: RunConfig = OmegaConf.to_object(cfg)  # (each schema's __post_init__ checks its values)
        resolve_device(run_cfg.device)
    except ValueError as e:
        raise Refused(str(e)) from None
    return run_cfg


@dataclass(frozen=True)
class Job:
    """One run directory and its config, built and checked once (``job``) for every look at it that follows."""

    cfg: RunConfig
    composed: dict  # the config as config.yaml and the checkpoint store it, resolved
    rundir: RunDir


def job(cfg: DictConfig, run_dir: str | Path | RunDir) -> Job:
    """The job's config checked (``validate``: Refused, one line) and its run directory; nothing read or written."""
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    return Job(validate(cfg), OmegaConf.to_container(cfg, resolve=True), run)


def _restore_hint(run: RunDir) -> str:
    if run.checkpoint.exists():
        return f"restore it from the checkpoint's copy with `python -m pomdp_ffm.run.rundir restore-config {run.path}`"
    return "there is no checkpoint to restore it from: put it back from a backup, or choose another run directory"


def _stored_config(run: RunDir) -> dict:
    try:
        stored = OmegaConf.to_container(OmegaConf.load(run.config))
    except Exception as e:  # a YAML or OmegaConf parse error
        why = yaml_problem(e) or f"{run.config} cannot be read ({str(e).splitlines()[0]})"
        raise RunDirError(f"{why}; {_restore_hint(run)}") from None
    if not isinstance(stored, dict):
        raise RunDirError(f"{run.config} does not hold a config mapping; {_restore_hint(run)}")
    return stored


def _refuse_other_experiment(run: RunDir, stored: dict, composed: dict, what: str) -> None:
    if diffs := config_differences(stored, composed):
        raise RunDirError(
            f"{run.path} {what} a different config ({RunDir.CONFIG}); continuing it with this one would "
            "mix two experiments. Choose another directory (hydra.run.dir=... / hydra.sweep.dir=...). "
            "Differences:  " + ";  ".join(diffs)
        )


def _load_resume_checkpoint(run: RunDir) -> dict:
    try:
        state = load_checkpoint(run.checkpoint, mmap=True)  # tensors are read when used, not all up front
    except CheckpointError as e:
        raise RunDirError(
            f"{e}: it cannot be resumed. Delete it to start this run again from scratch, or "
            "choose another run directory"
        ) from None
    if (why := other_format(run.checkpoint, state)) is not None:
        raise RunDirError(f"{why}; resume it with that version, or delete it to start again")
    return state


def _load_finished_checkpoint(run: RunDir) -> dict | None:
    """A finished run's checkpoint, for DONE to be checked against; None where it has none (deleted to save the space
    of its buffer) or one of another version's format (its results stand). One that cannot be read: RunDirError."""
    if not run.checkpoint.exists():
        return None
    try:
        state = load_checkpoint(run.checkpoint, mmap=True)
    except CheckpointError as e:
        raise RunDirError(
            f"{e}, so {run.done} cannot be checked against it; if the run finished as {RunDir.DONE} "
            f"says, delete the checkpoint (the run is then checked against {RunDir.CONFIG} alone), else "
            f"delete {RunDir.DONE} and the checkpoint to train it again"
        ) from None
    if other_format(run.checkpoint, state) is not None:
        return None
    return state


def _check_config_file(run: RunDir, state: dict) -> None:
    """A key config.yaml lacks (as a file cut short would) or a setting that differs from the checkpoint's copy."""
    if not run.config.exists():
        raise RunDirError(
            f"{run.config} is missing, so the checkpoint cannot be checked against it; {_restore_hint(run)}"
        )
    stored = _stored_config(run)
    missing = sorted(set(flat_keys(state["config"])) - set(flat_keys(stored)))
    diffs = config_differences(state["config"], stored)
    if missing or diffs:
        what = (
            [
                f"it lacks {len(missing)} key(s) that the copy has ({', '.join(missing[:4])}"
                f"{', ...' if len(missing) > 4 else ''})"
            ]
            if missing
            else []
        )
        raise RunDirError(
            f"{run.config} differs from the copy in {run.checkpoint} ({'; '.join(what + diffs)}): one "
            "of them was damaged, edited or replaced. If config.yaml was, restore it with "
            f"`python -m pomdp_ffm.run.rundir restore-config {run.path}`; if the checkpoint was (another "
            "run's), put this run's back, or delete it to start this run again"
        )


def plan(job: Job) -> tuple[Action, dict | None]:
    """('skip', None), ('resume', checkpoint) or ('fresh', None), reading only, else RunDirError; every start makes
    it before its lock (jobs/start.checked) and under it (jobs/start.start)."""
    run, run_cfg, composed = job.rundir, job.cfg, job.composed
    budget = env_step_budget(run_cfg.train, get_task(run_cfg.env.env_name).max_episode_steps)[1]
    if not run_cfg.resume:
        if any(p.exists() for p in (run.done, run.checkpoint, run.progress, run.config)):
            raise RunDirError(
                f"{run.path} already holds a run; pass resume=true to continue it or choose another run directory"
            )
        return Action.FRESH, None
    if run.done.exists():
        if not run.config.exists():
            raise RunDirError(
                f"{run.path} is finished but {RunDir.CONFIG} is missing, so it cannot be checked "
                f"against this config; {_restore_hint(run)}"
            )
        state = _load_finished_checkpoint(run)
        if state is not None:
            _check_config_file(run, state)
        _refuse_other_experiment(run, _stored_config(run), composed, "was finished with")
        # DONE must say env_steps=N, agree with the final checkpoint and reach the budget, or it is not this run's.
        text = run.done.read_text(errors="replace").strip()
        fix = f"delete {RunDir.DONE} to resume the run from its checkpoint, or start it again in another directory"
        if (m := re.fullmatch(r"env_steps=(\d+)", text)) is None:
            raise RunDirError(
                f"{run.done} does not say where the run finished ({text[:40]!r}, where a finished run's "
                f"says env_steps=<N>), so it may not be this run's; {fix}"
            )
        steps = int(m.group(1))
        at = steps if state is None else (state.get("counters") or {}).get("env_steps")
        if at != steps or steps < budget:
            wrong = f"but {run.checkpoint} is at {at}" if at != steps else f"short of its budget of {budget}"
            raise RunDirError(f"{run.done} says the run finished at {steps} env steps, {wrong}; {fix}")
        return Action.SKIP, None
    if run.checkpoint.exists():
        state = _load_resume_checkpoint(run)
        if state.get("buffer") is None:
            raise RunDirError(
                f"{run.checkpoint} was saved without its replay buffer (checkpoint.save_buffer=false), "
                "so the run cannot be resumed faithfully; delete it to start this run again, or "
                "choose another run directory"
            )
        _check_config_file(run, state)
        _refuse_other_experiment(run, state["config"], composed, "was started with")
        if not run_cfg.checkpoint.save_buffer:
            raise RunDirError(
                f"checkpoint.save_buffer=false would replace {run.checkpoint}, which holds the replay "
                "buffer this run resumes from, with checkpoints that cannot be resumed; resume it "
                "with checkpoint.save_buffer=true"
            )
        # The checkpoint's clocks must be counts this run could reach: whole numbers from 0, env steps within budget.
        counters = state.get("counters") if isinstance(state.get("counters"), dict) else {}
        bad = [
            f"{k}={counters.get(k)!r}"
            for k in ("env_steps", "rollouts", "rl_steps")
            if type(counters.get(k)) is not int or counters[k] < 0
        ]
        if not bad and counters["env_steps"] > budget:
            bad = [f"env_steps={counters['env_steps']} past the run's budget of {budget}"]
        if bad:
            raise RunDirError(
                f"{run.checkpoint} holds counters no run reaches ({', '.join(bad)}), so it was damaged "
                "or crafted; delete it to start this run again, or choose another run directory"
            )
        return Action.RESUME, state
    if run.config.exists():
        _refuse_other_experiment(run, _stored_config(run), composed, "was started with")
    return Action.FRESH, None


def status(path: str | Path, cfg: DictConfig | None = None) -> RunStatus:
    """The run directory's status, by plan() reading only; ``cfg``: its slot's config (a sweep's job) or its own."""
    run = RunDir(path)
    try:
        if (holder := run.holder()) is not None:  # (a file where the directory belongs: RunDirError, as a start)
            return RunStatus(Status.RUNNING, f"locked by {holder}")
        marker = RunStatus(run.status())
        if not any(p.exists() for p in (run.done, run.checkpoint, run.config)):
            return marker  # (progress.csv alone: a start sets it aside and starts again)
        if cfg is None:  # the run's own: config.yaml, else the checkpoint's copy
            if not run.config.exists() and not run.checkpoint.exists():
                raise RunDirError(f"{run.config} is missing; {_restore_hint(run)}")
            cfg = as_read_now(_stored_config(run) if run.config.exists() else _load_resume_checkpoint(run)["config"])
        cfg = cfg.copy()
        cfg.resume, cfg.device = True, "cpu"  # (keys a start may change: how it runs, not what it learns)
        action, _ = plan(job(cfg, run))
    except RunDirError as e:
        return RunStatus(Status.DAMAGED, str(e))
    except (Refused, ValueError) as e:  # the run's own config (a slot's was checked before)
        return RunStatus(Status.DAMAGED, f"{run.config} is not a config this version runs ({' '.join(str(e).split())})")
    return RunStatus(Status.DONE) if action == Action.SKIP else marker
