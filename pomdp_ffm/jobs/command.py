"""The command's process around a job (``python -m pomdp_ffm.train``): which stop signals it takes when, and how a
job's end becomes its exit code (pomdp_ffm/run/exits.py; launch/README.md, "Statuses and exit codes"). The job
itself, ``train_job``, is the entry point's (pomdp_ffm/train.py)."""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from ..compiling import CompileError
from ..run import signals
from ..run.exits import EXIT_DIVERGED, EXIT_FAILED, EXIT_REFUSED, EXIT_STOPPED, EXIT_UNWRITABLE
from ..run.rundir import JobResult, LockLost, RunDir
from ..run.signals import STOP_SIGNALS, StopSignals, SweepSignals
from ..run.unwritable import Unwritable
from ..trainer import TrainingDiverged
from .grid import sweep_outcome
from .plan import Refused
from .precheck import checked_command, launcher_name

log = logging.getLogger("pomdp_ffm")


def in_hydra(cfg: DictConfig, train_job: Callable[..., JobResult]) -> JobResult:
    """Hydra's main: ``train_job(cfg, run_dir, stop=...)`` in Hydra's run directory, its end made an exit code (one
    run) or a JobResult for the sweep's summary (a sweep's job)."""
    hc = HydraConfig.get()
    # A worker of joblib's launcher (signals.WorkerSignals, installed as it starts, else at its first job): a stop
    # signal between two of its jobs stops the sweep, not the worker; and the worker ends with its launcher.
    joblib = hc.mode == RunMode.MULTIRUN and launcher_name(hc) == "JoblibLauncher"
    if joblib:
        guard = signals.job_worker(EXIT_STOPPED).job()
    else:
        guard = contextlib.nullcontext()
    with guard:
        return _job(cfg, hc, train_job)


def _job(cfg: DictConfig, hc, train_job: Callable[..., JobResult]) -> JobResult:
    run_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    stopped = signals.sweep_stopped()
    if multirun and stopped is not None:
        # A stop signal stopped the sweep (during a job of this process or between two): this job does not start.
        _remove_empty_dirs(run_dir, stop_at=Path(hc.sweep.dir))
        log.info("not started: the sweep was stopped by signal %d", stopped)
        return JobResult(stopped=True, started=False, signal=stopped)
    stop = StopSignals()
    try:
        result = train_job(cfg, run_dir, stop=stop)
    # (A failure is in attempts.log and ERROR.txt where it fits; a lost lock, in neither: the run wrote its last.)
    except (Refused, TrainingDiverged, Unwritable, LockLost) as e:
        refused = isinstance(e, Refused)
        unwritable = isinstance(e, (Unwritable, LockLost))
        if refused:
            _remove_empty_dirs(run_dir, stop_at=Path.cwd() if not multirun else Path(hc.sweep.dir))
        if multirun:  # named at the sweep's end (grid.SweepOutcomes), as the sweep goes on
            return JobResult(refused=str(e)) if refused else JobResult(failed=str(e))
        fix = f"; {e.fix}, then rerun (resume=true continues from the last checkpoint)" if unwritable else ""
        print(f"error: {e}{fix}", file=sys.stderr)
        if refused:
            sys.exit(EXIT_REFUSED)
        sys.exit(EXIT_UNWRITABLE if unwritable else EXIT_DIVERGED)
    except Exception as e:
        if not multirun and isinstance(e, CompileError):  # one line; its chain is in the run's log (start.Attempt.fail)
            print(f"error: {e} (all of it: {run_dir / RunDir.LOG})", file=sys.stderr)
            sys.exit(EXIT_FAILED)
        if not multirun:
            raise
        log.error("%s failed", run_dir, exc_info=not (run_dir / RunDir.ERROR).exists())  # (else ERROR.txt has it)
        return JobResult(failed=f"{type(e).__name__}: {e}")
    if result.stopped:
        stop.hand_over()  # inside submitit: requeue now that the checkpoint is on disk (exits)
        if not multirun:
            sys.exit(EXIT_STOPPED)
        signals.stop_sweep(result.signal)
    elif multirun and stop.requested is not None:
        # The signal came after the run's last look at it (its final evaluation, checkpoint, DONE): the run is
        # done, and the sweep stops all the same.
        signals.stop_sweep(stop.requested)
    return result


def _remove_empty_dirs(path: Path, stop_at: Path) -> None:
    """Hydra made the run directory and its parents before calling us: a refused start leaves none behind."""
    path, stop_at = path.resolve(), stop_at.resolve()
    if path.is_dir() and not any(path.iterdir()):
        path.rmdir()
    path = path.parent
    while stop_at in path.parents and path.is_dir() and not any(path.iterdir()):
        path.rmdir()
        path = path.parent


def cli(main: Callable[[], object], early: list[int], hold: Callable, defaults: dict) -> None:
    """``python -m pomdp_ffm.train``: the command line checked (``precheck``), then Hydra's ``main``. A sweep that
    a stop signal stopped (``signals.SweepSignals``) exits with EXIT_STOPPED once its jobs in hand have saved
    their checkpoints; one with a refused or failed job (``grid.SweepOutcomes``), with EXIT_FAILED."""
    argv = sys.argv[1:]
    # ``early``: the stop signals ``hold`` (the module's first handler) kept; ``defaults``: the handlers before it.
    # A stop while the modules were imported or the command is checked: nothing starts
    before = {**{sig: signal.signal(sig, hold) for sig in STOP_SIGNALS}, **defaults}
    if early:  # (while the modules were imported: the command is not even checked)
        _stopped_before_start(early[0])
    # Started by launch/paper_grid.py: stopped when it ends, by SIGTERM (taken from here on, by the handler above and
    # then by the sweep's), not left training with nobody waiting for it.
    signals.end_with_launcher()
    try:
        composed = checked_command(argv)
    except (Refused, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_REFUSED)
    except Unwritable as e:  # a run or sweep directory this process may not write in (as a run's file: _job)
        print(f"error: {e}; {e.fix}, then rerun", file=sys.stderr)
        sys.exit(EXIT_UNWRITABLE)
    multirun = composed is not None and (
        any(a in ("-m", "--multirun") for a in argv) or composed.hydra.mode == RunMode.MULTIRUN
    )
    launcher = launcher_name(composed.hydra) if composed is not None else ""
    # The launchers whose jobs run in the launching process or in its worker processes: a stop signal sent to the
    # launching process stops their sweep (signals.SweepSignals). Under submitit every job has its own signals.
    in_process = multirun and launcher in ("BasicLauncher", "JoblibLauncher")
    workers = launcher == "JoblibLauncher"
    if in_process:
        # Kept to the end of the process, not only of the sweep: a signal while joblib's workers shut down, after
        # the last job, is then taken (or left blocked) instead of ending the process by the signal.
        SweepSignals(workers=workers).__enter__()
        if workers:
            signals.workers_follow(EXIT_STOPPED)
    elif composed is not None and not multirun:
        # One run (or one seed axis) in this process: a stop signal before the trainer's own handler is in (Hydra
        # starting, the trainer being built, the lock being taken) is remembered, and that handler takes it
        # (StopSignals), so that the run stops with its checkpoint and EXIT_STOPPED instead of dying by the
        # signal; one after the run's end changes nothing. (Not around a submitit launcher, which must stay
        # stoppable while it waits for its jobs.)
        SweepSignals(forward=False).__enter__()
    else:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    # (Checked once the handlers above replaced the one that fills it, so that no signal falls between the two.)
    if early:
        _stopped_before_start(early[0])
    try:
        main()
    finally:
        # The outcome is decided: a stop signal as Python shuts down (a second SIGTERM) must not end it by the signal.
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
    if in_process and signals.sweep_stopped() is not None:
        print(
            f"stopped by signal {signals.sweep_stopped()}: the jobs in hand saved their checkpoints and the "
            "sweep's later jobs did not start; rerun the same command to resume",
            file=sys.stderr,
        )
        sys.exit(EXIT_STOPPED)
    ended = sweep_outcome() or {}  # (its jobs named, and summed up, by grid.SweepOutcomes)
    if ended.get("stopped") or ended.get("refused") or ended.get("failed"):
        sys.exit(EXIT_STOPPED if ended.get("stopped") else EXIT_FAILED)


def _stopped_before_start(signum: int) -> None:
    print(f"stopped by signal {signum} before anything started; rerun the same command", file=sys.stderr)
    sys.exit(EXIT_STOPPED)
