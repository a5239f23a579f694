"""Hydra entry point: ``python -m pomdp_ffm.train env=HopperBLT-V-v0 algo=td3 seq_model=ffm seed=0``.

``--cfg job`` prints the composed config; ``experiment=<preset>`` runs a grid (conf/experiment/);
``hydra/launcher=<basic|local|slurm|slurm_local>`` chooses where its jobs run (launch/README.md).

Every setting is checked before anything is written (a bad one is a one-line error naming the key, the value
and what is allowed). A run directory (``pomdp_ffm.run.rundir``) is then locked for the life of the run: a second
process is refused, naming the holder. With ``resume=true`` (the presets set it) a run directory is a unit of
work that can be started any number of times: a finished run (DONE) is skipped; an interrupted one continues
from checkpoints/last.pt once the checkpoint and config.yaml agree with each other and with the config asked for
(progress.csv is checked against the checkpoint's rows, and rebuilt from them where it differs); anything else is
refused, naming the file and the fix. Every start is recorded in attempts.log; a failure leaves its traceback in
ERROR.txt.

Exit codes of a single run (pomdp_ffm/run/exits.py; a sweep's, and what each asks of the user: launch/README.md,
"Statuses and exit codes"):

    0   finished (DONE written), or skipped because it had finished
    1   failed: an error while training (traceback in ERROR.txt)
    2   refused: a bad setting, or a run directory that is in use, damaged, or holds another experiment
    3   diverged: a non-finite loss, or action (checkpoints/diverged.pt saved, message in ERROR.txt)
    74  unwritable: a file of the run could not be written (also its directory, found before anything starts), or
        its lock file was removed under it
    75  stopped by SIGTERM/SIGUSR1 (or the scheduler's warning) with its checkpoint saved (nothing written where
        the signal came before the run started, from this module's first lines on): rerun to resume
"""

# The stop signals' handler goes in before the package's imports, which take seconds (EARLY_STOPS):
# ruff: noqa: E402
from __future__ import annotations

import signal
import sys

from .run.signals import STOP_SIGNALS

EARLY_STOPS: list[int] = []  # the stop signals that came before cli() chose who takes them: nothing has started


def _hold(signum, frame) -> None:
    EARLY_STOPS.append(signum)


# Run as ``python -m pomdp_ffm.train``: a stop signal while the modules below are imported (torch's, seconds) is held
# for cli(), which exits with EXIT_STOPPED, instead of ending the process by the signal. Imported (by a test, a
# worker), the module leaves the process's handlers as they are. _DEFAULTS: the handlers from before.
_DEFAULTS = {sig: signal.signal(sig, _hold) for sig in STOP_SIGNALS} if __name__ == "__main__" else {}

import contextlib
import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from .compiling import CompileError
from .config import register_configs
from .jobs.grid import sweep_outcome
from .jobs.plan import Action, Refused, job
from .jobs.precheck import checked_command, launcher_name
from .jobs.seeds import run_seeds
from .jobs.start import check_and_lock
from .run import signals
from .run.exits import EXIT_DIVERGED, EXIT_FAILED, EXIT_REFUSED, EXIT_STOPPED, EXIT_UNWRITABLE
from .run.rundir import JobResult, LockLost, RunDir
from .run.signals import StopSignals, SweepSignals
from .run.unwritable import Unwritable
from .trainer import Trainer, TrainingDiverged

register_configs()
log = logging.getLogger("pomdp_ffm")


def train_job(
    cfg: DictConfig, run_dir: str | Path, trainer_cls: type[Trainer] = Trainer, stop: StopSignals | None = None
) -> JobResult:
    """Validate, lock, verify and train one run directory (or, with ``seeds``, one per seed: pomdp_ffm/jobs/seeds.py),
    answering the stop signals ``stop`` (None: its own). Raises Refused (nothing written), TrainingDiverged, or the
    error that stopped training (recorded in ERROR.txt where it can be written). ``trainer_cls`` lets tests put an
    instrumented trainer on the real path."""
    stop = StopSignals() if stop is None else stop
    if cfg.get("seeds"):
        return run_seeds(cfg, Path(run_dir), trainer_cls, stop)
    attempt = check_and_lock(job(cfg, run_dir), trainer_cls, stop=stop)
    try:
        if attempt.action == Action.SKIP:
            return attempt.skip()
        attempt.begin()
        with stop:
            try:
                return attempt.end(attempt.trainer.train(resume=attempt.state))
            except BaseException as e:
                attempt.fail(e)
                raise
    finally:
        attempt.close()


def _remove_empty_dirs(path: Path, stop_at: Path) -> None:
    """Hydra made the run directory and its parents before calling us: a refused start leaves none behind."""
    path, stop_at = path.resolve(), stop_at.resolve()
    if path.is_dir() and not any(path.iterdir()):
        path.rmdir()
    path = path.parent
    while stop_at in path.parents and path.is_dir() and not any(path.iterdir()):
        path.rmdir()
        path = path.parent


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> dict:
    hc = HydraConfig.get()
    # A worker of joblib's launcher (signals.WorkerSignals, installed as it starts, else at its first job): a stop
    # signal between two of its jobs stops the sweep, not the worker; and the worker ends with its launcher.
    joblib = hc.mode == RunMode.MULTIRUN and launcher_name(hc) == "JoblibLauncher"
    if joblib:
        guard = signals.job_worker(EXIT_STOPPED).job()
    else:
        guard = contextlib.nullcontext()
    with guard:
        return _job(cfg, hc)


def _job(cfg: DictConfig, hc) -> JobResult:
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


def cli() -> None:
    """``python -m pomdp_ffm.train``: the command line checked (``precheck``), then Hydra's main. A sweep that
    a stop signal stopped (``signals.SweepSignals``) exits with EXIT_STOPPED once its jobs in hand have saved
    their checkpoints; one with a refused or failed job (``grid.SweepOutcomes``), with EXIT_FAILED."""
    argv = sys.argv[1:]
    early = EARLY_STOPS  # a stop while the modules were imported or the command is checked: nothing starts
    before = {**{sig: signal.signal(sig, _hold) for sig in STOP_SIGNALS}, **_DEFAULTS}
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


if __name__ == "__main__":
    cli()
