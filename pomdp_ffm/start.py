"""What a start of a run directory does before and around its training, for the entry point (pomdp_ffm/train.py)
and the seed axis (pomdp_ffm/seeds.py) alike: every setting validated without touching the disk, the trainer
built, the directory checked (``plan``: skip a finished run, resume an interrupted one, start a new one, or refuse
what cannot be continued faithfully, naming the file and the fix), locked, and then written in a fixed order
(``Attempt``): config.yaml, attempts.log, ERROR.txt, DONE.
"""
from __future__ import annotations

import contextvars
import logging
import re
import traceback
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from .config import RunConfig, check_known_keys, flat_keys, learning_settings
from .rundir import CHECKPOINT_FORMAT, CheckpointError, RunDir, RunDirError, load_checkpoint, set_aside
from .trainer import Outcome, Trainer, TrainingDiverged, resolve_device

log = logging.getLogger("pomdp_ffm")
# The run directory whose trainer is working now, where several train in one process (pomdp_ffm/seeds.py).
CURRENT_RUN: contextvars.ContextVar[Path | None] = contextvars.ContextVar("current_run", default=None)


class Refused(Exception):
    """The run was not started: a bad setting or an unusable run directory. Nothing was written. Defined here,
    not in train.py, so that ``python -m pomdp_ffm.train`` (train.py run as ``__main__``) and the modules it
    imports raise and catch one class."""


def seed_dirs(job_dir: Path, seed: int, seeds: list[int]) -> list[Path]:
    """Each seed's run directory of a seed axis: ``job_dir`` with its ``seed-<seed>`` component renamed
    ``seed-<k>``."""
    name = f"seed-{seed}"
    parts = job_dir.parts
    where = [i for i, p in enumerate(parts) if p == name]
    if not where:
        raise Refused(f"seeds={seeds} needs a run directory with a path component {name} to name each seed's "
                      f"sibling (as the presets' .../seed-${{seed}} does); got {job_dir}")
    i = where[-1]
    return [Path(*parts[:i], f"seed-{k}", *parts[i + 1:]) for k in seeds]


def config_differences(stored: dict, current: dict) -> list[str]:
    """Training-relevant keys whose values differ, as 'key: stored -> current' lines."""
    a, b = learning_settings(stored), learning_settings(current, like=stored)
    return [f"{key}: {a.get(key, '<absent>')!r} -> {b.get(key, '<absent>')!r}"
            for key in sorted(set(a) | set(b)) if a.get(key, "<absent>") != b.get(key, "<absent>")]


def validate(cfg: DictConfig) -> RunConfig:
    """Every setting, checked without touching the disk; raises Refused with a one-line message."""
    try:
        check_known_keys(cfg)
        run_cfg: RunConfig = OmegaConf.to_object(cfg)  # each schema's __post_init__ checks its values
        resolve_device(run_cfg.device)
    except ValueError as e:
        raise Refused(str(e)) from None
    return run_cfg


# --- what a start of a run directory does -------------------------------------------------------------------
def _restore_hint(run: RunDir) -> str:
    if run.checkpoint.exists():
        return f"restore it from the checkpoint's copy with `python -m pomdp_ffm.rundir restore-config {run.path}`"
    return "there is no checkpoint to restore it from: put it back from a backup, or choose another run directory"


def _stored_config(run: RunDir) -> dict:
    try:
        stored = OmegaConf.to_container(OmegaConf.load(run.config))
    except Exception as e:  # a YAML or OmegaConf parse error
        raise RunDirError(f"{run.config} cannot be read ({str(e).splitlines()[0]}); {_restore_hint(run)}")
    if not isinstance(stored, dict):
        raise RunDirError(f"{run.config} does not hold a config mapping; {_restore_hint(run)}")
    return stored


def _refuse_other_experiment(run: RunDir, stored: dict, composed: dict, what: str) -> None:
    diffs = config_differences(stored, composed)
    if diffs:
        raise RunDirError(f"{run.path} {what} a different config ({RunDir.CONFIG}); continuing it with this one "
                          "would mix two experiments. Choose another directory (hydra.run.dir=... / "
                          "hydra.sweep.dir=...). Differences:  " + ";  ".join(diffs))


def _load_resume_checkpoint(run: RunDir) -> dict:
    try:
        state = load_checkpoint(run.checkpoint, mmap=True)  # tensors are read when used, not all up front
    except CheckpointError as e:
        raise RunDirError(f"{e}: it cannot be resumed. Delete it to start this run again from scratch, or "
                          "choose another run directory") from None
    if state.get("format") != CHECKPOINT_FORMAT or not isinstance(state.get("config"), dict):
        raise RunDirError(f"{run.checkpoint} was written by another version of pomdp-ffm (format "
                          f"{state.get('format')!r}, this one reads {CHECKPOINT_FORMAT}); resume it with that "
                          "version, or delete it to start again")
    return state


def _check_config_file(run: RunDir, state: dict) -> None:
    """config.yaml against the checkpoint's own copy, which was written from the same config: a setting that
    differs, or a key the file lacks (a file cut short at a line would otherwise read as an older version's,
    its missing keys at their defaults), means the file was damaged or edited."""
    if not run.config.exists():
        raise RunDirError(f"{run.config} is missing, so the checkpoint cannot be checked against it; "
                          f"{_restore_hint(run)}")
    stored = _stored_config(run)
    missing = sorted(set(flat_keys(state["config"])) - set(flat_keys(stored)))
    diffs = config_differences(state["config"], stored)
    if missing or diffs:
        what = [f"it lacks {len(missing)} key(s) that the copy has ({', '.join(missing[:4])}"
                f"{', ...' if len(missing) > 4 else ''})"] if missing else []
        raise RunDirError(f"{run.config} differs from the copy in {run.checkpoint} ({'; '.join(what + diffs)}): one "
                          "of them was damaged, edited or replaced. If config.yaml was, restore it with "
                          f"`python -m pomdp_ffm.rundir restore-config {run.path}`; if the checkpoint was (another "
                          "run's), put this run's back, or delete it to start this run again")


def _check_finished(run: RunDir, state: dict | None, budget: int | None) -> None:
    """DONE says where the run finished (``env_steps=N``, written after the final checkpoint ``state``): it must
    say so, agree with that checkpoint, and reach the run's budget (where the caller knows it), or it is not this
    run's."""
    text = run.done.read_text(errors="replace").strip()
    m = re.fullmatch(r"env_steps=(\d+)", text)
    fix = f"delete {RunDir.DONE} to resume the run from its checkpoint, or start it again in another directory"
    if m is None:
        raise RunDirError(f"{run.done} does not say where the run finished ({text[:40]!r}, where a finished run's "
                          f"says env_steps=<N>), so it may not be this run's; {fix}")
    steps = int(m.group(1))
    if state is not None:
        counters = state.get("counters") or {}
        if counters.get("env_steps") != steps:
            raise RunDirError(f"{run.done} says the run finished at {steps} env steps, but {run.checkpoint} is at "
                              f"{counters.get('env_steps')}; {fix}")
    if budget is not None and steps < budget:
        raise RunDirError(f"{run.done} says the run finished at {steps} env steps, short of its budget of {budget}; "
                          f"{fix}")


def _check_counters(run: RunDir, state: dict, budget: int | None) -> None:
    """The checkpoint's clocks are counts this run could have reached: whole numbers from 0, env steps within
    its budget (where the caller knows it)."""
    counters = state.get("counters")
    names = ("env_steps", "rollouts", "rl_steps")
    bad = [f"{k}={counters.get(k)!r}" for k in names if not isinstance(counters, dict)
           or not isinstance(counters.get(k), int) or isinstance(counters.get(k), bool) or counters[k] < 0]
    if not bad and budget is not None and counters["env_steps"] > budget:
        bad = [f"env_steps={counters['env_steps']} past the run's budget of {budget}"]
    if bad:
        raise RunDirError(f"{run.checkpoint} holds counters no run reaches ({', '.join(bad)}), so it was damaged or "
                          "crafted; delete it to start this run again, or choose another run directory")


def plan(run: RunDir, run_cfg: RunConfig, composed: dict, budget: int | None = None) -> tuple[str, dict | None]:
    """Decide, reading only, what this start does: ('skip', None), ('resume', checkpoint) or ('fresh', None).
    Raises RunDirError, naming the file and the fix, for anything it cannot continue faithfully. ``budget``: the
    run's env-step budget, checked against a DONE file where given."""
    holds_run = any(p.exists() for p in (run.done, run.checkpoint, run.progress, run.config))
    if not run_cfg.resume:
        if holds_run:
            raise RunDirError(f"{run.path} already holds a run; pass resume=true to continue it or choose "
                              "another run directory")
        return "fresh", None
    if run.done.exists():
        if not run.config.exists():
            raise RunDirError(f"{run.path} is finished but {RunDir.CONFIG} is missing, so it cannot be checked "
                              f"against this config; {_restore_hint(run)}")
        try:  # the final checkpoint, where this version can read it (a finished run does not need it)
            state = _load_resume_checkpoint(run) if run.checkpoint.exists() else None
        except RunDirError:
            state = None
        if state is not None:
            _check_config_file(run, state)
        _refuse_other_experiment(run, _stored_config(run), composed, "was finished with")
        _check_finished(run, state, budget)
        return "skip", None
    if run.checkpoint.exists():
        state = _load_resume_checkpoint(run)
        if state.get("buffer") is None:
            raise RunDirError(f"{run.checkpoint} was saved without its replay buffer (checkpoint.save_buffer=false), "
                              "so the run cannot be resumed faithfully; delete it to start this run again, or "
                              "choose another run directory")
        _check_config_file(run, state)
        _refuse_other_experiment(run, state["config"], composed, "was started with")
        if not run_cfg.checkpoint.save_buffer:
            raise RunDirError(f"checkpoint.save_buffer=false would replace {run.checkpoint}, which holds the replay "
                              "buffer this run resumes from, with checkpoints that cannot be resumed; resume it "
                              "with checkpoint.save_buffer=true")
        _check_counters(run, state, budget)
        return "resume", state
    if run.config.exists():
        _refuse_other_experiment(run, _stored_config(run), composed, "was started with")
    return "fresh", None


def _set_aside_orphans(run: RunDir) -> None:
    """A run killed before its first checkpoint left rows that cannot be continued: keep them, say so."""
    if run.progress.exists():
        with open(run.progress) as f:
            n = max(sum(1 for _ in f) - 1, 0)
        aside = set_aside(run.progress, "no-checkpoint")
        log.warning("%s held %d row(s) of an attempt that stopped before its first checkpoint; they cannot be "
                    "continued, so the run starts again (the rows are kept in %s)", run.progress, n, aside.name)


def _file_log(run: RunDir) -> logging.Handler:
    handler = logging.FileHandler(run / RunDir.LOG)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    # Several trainers in one process (pomdp_ffm/seeds.py): each experiment.log takes its own run's records only.
    handler.addFilter(lambda record: CURRENT_RUN.get() in (None, run.path))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    return handler


def check_untouched(run: RunDir, run_cfg: RunConfig, composed: dict) -> None:
    """Everything a start checks that needs no lock: nobody holds it, and plan() finds nothing to refuse."""
    run.ensure_free()
    plan(run, run_cfg, composed)


def check_and_lock(cfg: DictConfig, run_dir: str | Path, trainer_cls: type[Trainer] = Trainer, **needs) -> "Attempt":
    """Validate, build the trainer (given ``needs``: its stop signals, ...), check the directory (without touching
    it), lock it and plan under the lock. Raises Refused (nothing written; the lock released)."""
    run_cfg = validate(cfg)
    composed = OmegaConf.to_container(cfg, resolve=True)
    run = RunDir(run_dir)
    try:
        # (also checks what only the task can tell, e.g. the eval clock)
        trainer = trainer_cls(run_cfg, run, composed=composed, **needs)
    except ValueError as e:
        raise Refused(str(e)) from None
    except (MemoryError, RuntimeError) as e:
        if not _out_of_memory(e):
            raise
        t, p = run_cfg.train, run_cfg.policy
        raise Refused(f"the run does not fit in memory as configured (train.buffer_size={t.buffer_size}, "
                      f"policy.rnn_hidden_size={p.rnn_hidden_size}, policy.dqn_layers={list(p.dqn_layers)}, "
                      f"policy.policy_layers={list(p.policy_layers)}): {_first_line(e)}") from None
    try:
        # Refuse before touching the directory (a refused start writes nothing, not even the lock file); then
        # plan again under the lock, which no other process can change any more.
        check_untouched(run, run_cfg, composed)
        stale = run.acquire()
        action, state = plan(run, run_cfg, composed, budget=trainer.budget)
    except RunDirError as e:
        trainer.close()
        run.release(untouched=True)
        raise Refused(str(e)) from None
    except BaseException:
        trainer.close()
        run.release(untouched=True)
        raise
    return Attempt(trainer, run, action, state, composed, stale)


def _out_of_memory(e: BaseException) -> bool:
    """numpy's and Python's MemoryError, and torch's CPU allocator's RuntimeError."""
    # Host memory only: a GPU's can be short for a while (another job on it), which is no reason to refuse.
    return isinstance(e, MemoryError) or \
        re.search(r"(can't|cannot) allocate memory|not enough memory", str(e)) is not None


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return (lines[0] if lines else type(e).__name__)[:200]


@dataclass
class Attempt:
    """One start of a run directory that passed its checks and holds its lock: what it writes, in order."""

    trainer: Trainer
    run: RunDir
    action: str  # skip | resume | fresh
    state: dict | None
    composed: dict
    stale: str | None
    handler: logging.Handler | None = None

    def skip(self) -> dict:
        log.info("%s is finished (%s exists): skipping", self.run.path, RunDir.DONE)
        self.run.error.unlink(missing_ok=True)  # a finished run supersedes an earlier attempt's error
        self.run.record_attempt("skipped (finished)")
        return {"skipped": True}

    def begin(self) -> None:
        run = self.run
        self.handler = _file_log(run)
        if self.stale:  # said here, once the run's own log is open (and only by a start that goes ahead)
            log.warning("%s: %s", run.path, self.stale)
        temps = run.remove_stale_temps()
        if temps:
            log.warning("%s: removed %d half-written file(s) of an attempt that was killed while saving: %s",
                        run.path, len(temps), ", ".join(f"{name} ({size} bytes)" for name, size in temps))
        if not self.trainer.cfg.checkpoint.save_buffer:
            log.warning("%s: checkpoint.save_buffer=false: %s will hold no replay buffer, so this run cannot be "
                        "resumed after a stop or a crash", run.path, RunDir.CHECKPOINT)
        run.error.unlink(missing_ok=True)
        if self.action == "fresh":
            _set_aside_orphans(run)
            run.write_text(run.config, OmegaConf.to_yaml(OmegaConf.create(self.composed)))
        run.record_attempt("start")

    def end(self, outcome: Outcome) -> dict:
        c = outcome.counters
        if outcome.stopped:
            saved = "checkpoint saved" if self.trainer.cfg.checkpoint.save_buffer else \
                "checkpoint saved without its replay buffer: it cannot be resumed"
            self.run.record_attempt(f"stopped by signal {outcome.signal} at {c.env_steps} env steps ({saved})")
        else:
            if self.trainer.metrics.num_eval_rows == 0:
                raise RuntimeError("the budget was reached without a single evaluation logged")
            self.run.write_text(self.run.done, f"env_steps={c.env_steps}\n")
            self.run.record_attempt(f"finished at {c.env_steps} env steps")
        return {"skipped": False, "stopped": outcome.stopped, "signal": outcome.signal, **vars(c)}

    def abandon(self) -> None:
        """Undo a start that will not begin (another seed's start was refused): what it holds is released, and the
        lock file and folders it created are removed, so that it leaves nothing."""
        try:
            self.trainer.close()
        finally:
            self.run.release(untouched=True)

    def fail(self, e: BaseException) -> None:
        if isinstance(e, KeyboardInterrupt):
            self.run.record_attempt("interrupted (KeyboardInterrupt)")
            return
        self.run.record_error("".join(traceback.format_exception(e)))
        kind = "diverged" if isinstance(e, TrainingDiverged) else "failed"
        self.run.record_attempt(f"{kind} (see {RunDir.ERROR})")

    def close(self) -> None:
        try:
            self.trainer.close()  # (what it says on closing still goes to the run's own log)
        finally:
            if self.handler is not None:
                log.removeHandler(self.handler)
                self.handler.close()
            self.run.release()


