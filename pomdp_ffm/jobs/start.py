"""A start of a run directory (train.py, jobs/seeds.py): checked by jobs/plan.py reading only, its trainer built, then
locked and planned again (``start``), and its attempt's lifecycle written (``Attempt``: begin, end, fail, close)."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from ..agent import DoesNotFit
from ..compiling import CompileError, compile_switch_said, log_compile_failure
from ..run.rundir import JobResult, LockLost, RunDir, RunDirError, set_aside
from ..run.unwritable import Unwritable, writing
from ..standing import Outcome
from ..trainer import Trainer, TrainingDiverged
from .plan import Action, Job, Refused, job, plan

log = logging.getLogger("pomdp_ffm")
# The run directory whose trainer is working now, where several train in one process (pomdp_ffm/jobs/seeds.py).
CURRENT_RUN: contextvars.ContextVar[Path | None] = contextvars.ContextVar("current_run", default=None)


class RunLog(logging.FileHandler):
    """experiment.log: a record it cannot write is one warning, not a traceback each (the run's own writes stop it)."""

    def handleError(self, record: logging.LogRecord) -> None:
        e = sys.exc_info()[1]
        if not isinstance(e, OSError):
            super().handleError(record)  # (a bug in a log call)
        elif not getattr(self, "warned", False):
            self.warned = True
            print(
                f"warning: {self.baseFilename} cannot be written ({e.strerror or e}): records left out", file=sys.stderr
            )


def check_and_lock(cfg: DictConfig, run_dir, trainer_cls: type[Trainer] = Trainer, **needs) -> Attempt:
    """One run directory's start: its ``job`` (the config built and checked), ``checked``, then ``start``; refused
    (Refused) with nothing left behind."""
    j = job(cfg, run_dir)
    return start(j, checked(j), trainer_cls, **needs)


def checked(job: Job) -> Action:
    """What a start would do, looked at without the lock: one refused here (Refused) leaves every file as it found
    it, times included (a lock taken and given back would rewrite the lock file)."""
    try:
        job.rundir.ensure_free()
        return plan(job)[0]
    except RunDirError as e:
        raise Refused(str(e)) from None


def start(job: Job, action: Action, trainer_cls: type[Trainer] = Trainer, **needs) -> Attempt:
    """The trainer built (none where ``checked`` found the run finished: ``action``), then the lock taken and the
    plan made again under it, the plan the start trusts (no other start changes the directory meanwhile). Refused:
    nothing left behind; a refusal before the lock (any of the trainer's) leaves the directory untouched."""
    trainer = None if action == Action.SKIP else build(job, trainer_cls, **needs)
    try:
        try:
            stale = job.rundir.acquire()
        except RunDirError as e:  # (taken by another process since it was checked)
            raise Refused(str(e)) from None
        try:
            action, state = plan(job)
            if action == Action.SKIP and trainer is not None:  # (finished since it was checked)
                trainer.close()
                trainer = None
            elif action != Action.SKIP and trainer is None:  # (no longer finished since)
                trainer = build(job, trainer_cls, **needs)
        except BaseException as e:
            job.rundir.release(untouched=True)
            if isinstance(e, RunDirError):
                raise Refused(str(e)) from None
            raise
    except BaseException:
        if trainer is not None:
            trainer.close()
        raise
    return Attempt(job, action, state, stale, trainer)


def build(job: Job, trainer_cls: type[Trainer] = Trainer, **needs) -> Trainer:
    """The run's trainer, its update checked against the memory free; refused (Refused): a setting only the task can
    judge, a compile known to fail, weights or an update that do not fit the memory."""
    cfg = job.cfg
    try:
        trainer = trainer_cls(cfg, job.rundir, composed=job.composed, **needs)
    except (ValueError, CompileError) as e:  # (agent.DoesNotFit is a ValueError)
        raise Refused(str(e)) from None
    except MemoryError as e:  # the host's (a GPU's may be short for a while: another job's)
        t, p = cfg.train, cfg.policy
        raise Refused(
            f"the run does not fit in memory as configured (train.buffer_size={t.buffer_size}, "
            f"policy.rnn_hidden_size={p.rnn_hidden_size}, policy.dqn_layers={list(p.dqn_layers)}, "
            f"policy.policy_layers={list(p.policy_layers)}): {_first_line(e)}"
        ) from None
    try:
        trainer.agent.check_update_fits(cfg.train, trainer.seq_len)
    except BaseException as e:
        trainer.close()
        if isinstance(e, DoesNotFit):
            raise Refused(str(e)) from None
        raise
    return trainer


def _first_line(e: BaseException) -> str:
    return next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)[:200]


@dataclass
class Attempt:
    """One start of a run directory that passed its checks and holds its lock: what it writes, in order."""

    job: Job
    action: Action
    state: dict | None  # the checkpoint it resumes from
    stale: str | None  # what the lock said of a dead holder's
    trainer: Trainer | None  # (None for a run it skips)
    handler: logging.Handler | None = None

    @property
    def rundir(self) -> RunDir:
        return self.job.rundir

    def skip(self) -> JobResult:
        log.info("%s is finished (%s exists): skipping", self.rundir.path, RunDir.DONE)
        self.rundir.error.unlink(missing_ok=True)  # a finished run supersedes an earlier attempt's error
        self.rundir.record_attempt("skipped (finished)")
        return JobResult(skipped=True)

    def begin(self) -> None:
        run = self.rundir
        with writing(run / RunDir.LOG):
            self.handler = RunLog(run / RunDir.LOG)
        self.handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        # Several trainers in one process (jobs/seeds.py): each experiment.log takes its own run's records only.
        self.handler.addFilter(lambda record: CURRENT_RUN.get() in (None, run.path))
        log.addHandler(self.handler)
        log.setLevel(logging.INFO)
        if self.stale:  # said here, once the run's own log is open (and only by a start that goes ahead)
            log.warning("%s: %s", run.path, self.stale)
        if temps := run.remove_stale_temps():
            log.warning(
                "%s: removed %d half-written file(s) of an attempt that was killed while saving: %s",
                run.path,
                len(temps),
                ", ".join(f"{name} ({size} bytes)" for name, size in temps),
            )
        if not self.trainer.cfg.checkpoint.save_buffer:
            log.warning(
                "%s: checkpoint.save_buffer=false: %s will hold no replay buffer, so this run cannot be "
                "resumed after a stop or a crash",
                run.path,
                RunDir.CHECKPOINT,
            )
        with writing(run.error):
            run.error.unlink(missing_ok=True)
        if self.action == Action.FRESH:
            if run.progress.exists():  # rows of a run killed before its first checkpoint: kept, not continued
                with open(run.progress) as f:
                    n = max(sum(1 for _ in f) - 1, 0)
                log.warning(
                    "%s held %d row(s) of an attempt that stopped before its first checkpoint; they cannot "
                    "be continued, so the run starts again (the rows are kept in %s)",
                    run.progress,
                    n,
                    set_aside(run.progress, "no-checkpoint").name,
                )
            run.write_text(run.config, OmegaConf.to_yaml(OmegaConf.create(self.job.composed)))
        run.record_attempt("start" + compile_switch_said(self.state, self.trainer, run.path))

    def end(self, outcome: Outcome) -> JobResult:
        c = outcome.standing
        if outcome.stopped:
            lost = "" if self.trainer.cfg.checkpoint.save_buffer else " without its replay buffer: it cannot be resumed"
            saved = f"checkpoint saved{lost}"
            log.info(
                "stopped by signal %d at %d env steps, %d updates; %s", outcome.signal, c.env_steps, c.rl_steps, saved
            )
            self.rundir.record_attempt(f"stopped by signal {outcome.signal} at {c.env_steps} env steps ({saved})")
        else:
            if self.trainer.progress.num_eval_rows == 0:
                raise RuntimeError("the budget was reached without a single evaluation logged")
            self.rundir.write_text(self.rundir.done, f"env_steps={c.env_steps}\n")
            self.rundir.record_attempt(f"finished at {c.env_steps} env steps")
        return JobResult(stopped=outcome.stopped, signal=outcome.signal, standing=c)

    def abandon(self) -> None:
        """Undo a start that will not begin (another seed's was refused): it leaves nothing, not even its lock file."""
        try:
            if self.trainer is not None:
                self.trainer.close()
        finally:
            self.rundir.release(untouched=True)

    def fail(self, e: BaseException) -> None:
        """Record the failure as far as the disk lets (a full one may take neither file); ``e`` goes on up. Where the
        lock was lost (LockLost), nothing: the directory may be another process's now."""
        if isinstance(e, LockLost):
            return
        event, kind = "interrupted (KeyboardInterrupt)", "diverged" if isinstance(e, TrainingDiverged) else "failed"
        log_compile_failure(self.handler, e)
        try:
            if not isinstance(e, KeyboardInterrupt):
                try:
                    self.rundir.write_text(self.rundir.error, "".join(traceback.format_exception(e)))
                    event = f"{kind} (see {RunDir.ERROR})"
                except Unwritable as why:
                    event = f"{kind}: {_first_line(e)} ({RunDir.ERROR} not written: {why.strerror})"
            with contextlib.suppress(Unwritable):
                self.rundir.record_attempt(event)
        except LockLost:  # (removed since ``e``): ``e`` goes on up, unrecorded
            pass

    def close(self) -> None:
        try:
            if self.trainer is not None:
                self.trainer.close()  # (what it says on closing still goes to the run's own log)
        finally:
            if self.handler is not None:
                log.removeHandler(self.handler)
                self.handler.close()
            self.rundir.release()
