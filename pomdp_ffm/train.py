"""Hydra entry point: ``python -m pomdp_ffm.train env=HopperBLT-V-v0 algo=td3 seq_model=ffm seed=0``.

``--cfg job`` prints the composed config; ``experiment=<preset>`` runs a grid (conf/experiment/);
``hydra/launcher=<basic|local|slurm|slurm_local>`` chooses where its jobs run (launch/README.md).

Every setting is checked before anything is written (a bad one is a one-line error naming the key, the value
and what is allowed). A run directory (``pomdp_ffm.rundir``) is then locked for the life of the run: a second
process is refused, naming the holder. With ``resume=true`` (the presets set it) a run directory is a unit of
work that can be started any number of times: a finished run (DONE) is skipped; an interrupted one continues
from checkpoints/last.pt once the checkpoint and config.yaml agree with each other and with the config asked for
(progress.csv is checked against the checkpoint's rows, and rebuilt from them where it differs); anything else is
refused, naming the file and the fix. Every start is recorded in attempts.log; a failure leaves its traceback in
ERROR.txt.

Exit codes of a single run (pomdp_ffm/exits.py; a sweep's, and what each asks of the user: launch/README.md,
"Statuses and exit codes"):

    0   finished (DONE written), or skipped because it had finished
    1   failed: an error while training (traceback in ERROR.txt)
    2   refused: a bad setting, or a run directory that is in use, damaged, or holds another experiment
    3   diverged: a non-finite loss (checkpoints/diverged.pt saved, message in ERROR.txt)
    74  unwritable: a file of the run could not be written, or its lock file was removed under it
    75  stopped by SIGTERM/SIGUSR1 (or the scheduler's warning) with its checkpoint saved: rerun to resume
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import stat
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from . import signals
from .config import register_configs, yaml_problem
from .envs import check_worker_start_method
from .exits import EXIT_DIVERGED, EXIT_FAILED, EXIT_REFUSED, EXIT_STOPPED, EXIT_UNWRITABLE
from .grid import job_configs, job_overrides, sweep_jobs, sweep_outcome
from .rundir import LockLost, RunDir
from .seeds import run_seeds
from .signals import STOP_SIGNALS, StopSignals, SweepSignals
from .start import Refused, check_and_lock, validate
from .trainer import Trainer, TrainingDiverged
from .unwritable import Unwritable

register_configs()
log = logging.getLogger("pomdp_ffm")


def run(cfg: DictConfig, run_dir: str | Path, trainer_cls: type[Trainer] = Trainer) -> dict:
    """Validate, lock, verify and train one run directory (or, with ``seeds``, one per seed: pomdp_ffm/seeds.py).
    Raises Refused (nothing written), TrainingDiverged, or the error that stopped training (recorded in
    ERROR.txt where it can be written). Returns a summary dict. ``trainer_cls`` lets tests put an instrumented
    trainer on the real path."""
    if cfg.get("seeds"):
        return run_seeds(cfg, Path(run_dir), trainer_cls)
    stop = StopSignals()
    attempt = check_and_lock(cfg, run_dir, trainer_cls, stop=stop)
    try:
        if attempt.action == "skip":
            return attempt.skip()
        attempt.begin()
        with stop:
            try:
                result = attempt.end(attempt.trainer.train(resume=attempt.state))
            except BaseException as e:
                attempt.fail(e)
                raise
        return {**result, "stop": stop}
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


def _launcher(hydra_cfg) -> str:
    """The class name of a composed Hydra config's launcher ("BasicLauncher", "JoblibLauncher", ...)."""
    return str(hydra_cfg.launcher.get("_target_", "")).rsplit(".", 1)[-1]


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> dict:
    hc = HydraConfig.get()
    # A worker of joblib's launcher (signals.WorkerSignals, installed as it starts, else at its first job): a stop
    # signal between two of its jobs stops the sweep, not the worker; and the worker ends with its launcher.
    joblib = hc.mode == RunMode.MULTIRUN and _launcher(hc) == "JoblibLauncher"
    if joblib:
        guard = signals.job_worker(EXIT_STOPPED).job()
    else:
        guard = contextlib.nullcontext()
    with guard:
        return _job(cfg, hc)


def _job(cfg: DictConfig, hc) -> dict:
    run_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    stopped = signals.sweep_stopped()
    if multirun and stopped is not None:
        # A stop signal stopped the sweep (during a job of this process or between two): this job does not start.
        _remove_empty_dirs(run_dir, stop_at=Path(hc.sweep.dir))
        log.info("not started: the sweep was stopped by signal %d", stopped)
        return {"stopped": True, "started": False, "signal": stopped}
    try:
        result = run(cfg, run_dir)
    # (A failure is in attempts.log and ERROR.txt where it fits; a lost lock, in neither: the run wrote its last.)
    except (Refused, TrainingDiverged, Unwritable, LockLost) as e:
        refused = isinstance(e, Refused)
        unwritable = isinstance(e, (Unwritable, LockLost))
        if refused:
            _remove_empty_dirs(run_dir, stop_at=Path.cwd() if not multirun else Path(hc.sweep.dir))
        if multirun:  # named at the sweep's end (grid.SweepOutcomes), as the sweep goes on
            return {"refused" if refused else "failed": str(e)}
        fix = f"; {e.fix}, then rerun (resume=true continues from the last checkpoint)" if unwritable else ""
        print(f"error: {e}{fix}", file=sys.stderr)
        if refused:
            sys.exit(EXIT_REFUSED)
        sys.exit(EXIT_UNWRITABLE if unwritable else EXIT_DIVERGED)
    except Exception as e:
        if not multirun:
            raise
        log.error("%s failed", run_dir, exc_info=not (run_dir / RunDir.ERROR).exists())  # (else ERROR.txt has it)
        return {"failed": f"{type(e).__name__}: {e}"}
    if result.get("stopped"):
        result["stop"].hand_over()  # inside submitit: requeue now that the checkpoint is on disk (exits)
        if not multirun:
            sys.exit(EXIT_STOPPED)
        signals.stop_sweep(result["signal"])
    elif multirun and result.get("stop") is not None and result["stop"].requested is not None:
        # The signal came after the run's last look at it (its final evaluation, checkpoint, DONE): the run is
        # done, and the sweep stops all the same.
        signals.stop_sweep(result["stop"].requested)
    result.pop("stop", None)
    return result


def _one_line(e: Exception) -> str:
    """Hydra's composition errors in one line: what was refused, why, and what is allowed."""
    text = str(e)
    problem = yaml_problem(e)
    if problem is not None:  # a config file Hydra read
        return problem + ("; remove one of them" if "duplicate key" in problem else "")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if "Available options in" in text:  # an unknown config-group choice: name the choices
        head = lines[0].replace("In 'config': ", "")
        options = [ln.strip() for ln in text.split("Available options in", 1)[1].splitlines()[1:]
                   if ln.startswith("\t") and "provider=" not in ln]
        return f"{head}; the choices are {', '.join(options)}"
    cause = e.__cause__
    why = str(cause).strip().splitlines()[0] if cause is not None and str(cause).strip() else ""
    if lines and lines[0].startswith("Could not override"):
        return f"{lines[0].rstrip('.')}: {why}; `--cfg job` prints every key" if why else lines[0]
    return "; ".join([*lines[:1], *([why] if why else [])])


def why_not_makeable(path: Path) -> str | None:
    """Why ``path`` cannot be made a directory (or written in), found without writing anything: a file in its way,
    no permission (a read-only file system included), a name too long. None where nothing tells so."""
    path = Path(path) if Path(path).is_absolute() else Path.cwd() / path  # ".." left to the kernel, as mkdir does
    found, missing = path, []
    while True:
        try:
            st = found.stat()  # through symlinks, as mkdir goes
            break
        except FileNotFoundError:
            missing.append(found.name)
            found = found.parent
        except OSError as e:  # ENOTDIR (a file on the way), ENAMETOOLONG, ELOOP, EACCES
            return f"{e.strerror}: {e.filename}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{found} is not a directory"
    if not os.access(found, os.W_OK | os.X_OK):
        return f"no permission to write in {found}"
    limit = os.pathconf(found, "PC_NAME_MAX")
    long = [n for n in missing if len(os.fsencode(n)) > limit]
    return f"a name is longer than {limit} bytes: {long[0][:40]}..." if long else None


def precheck(argv: list[str], check_dirs: bool = True) -> DictConfig | None:
    """Compose and validate what the command line asks for before Hydra starts anything, so that a misspelt
    key, an unknown task or model, or a bad value is one line and exit code 2, with nothing written or
    launched. Every job of a sweep (the command line's, and a preset's ``hydra.sweeper.params`` in a multirun)
    is checked, with its own overrides as the sweep will start it; jobs that differ only in their seed are composed
    once (``grid.job_configs``). Commands with Hydra flags other than --multirun (--cfg, --help, -cn, ...) are left
    to Hydra. Returns the config composed from the fixed overrides, with Hydra's (None where the command is left
    to Hydra). With ``check_dirs``, the run (or sweep) directory must be one that can be made, and no file may sit
    where one of a sweep's run directories, or a folder above one, belongs."""
    if any(a.startswith("-") and a not in ("-m", "--multirun") for a in argv):
        return None
    flag = any(a in ("-m", "--multirun") for a in argv)
    try:
        every, composed = job_overrides([a for a in argv if not a.startswith("-")], multirun=flag)
        multirun = flag or composed.hydra.mode == RunMode.MULTIRUN
        # The multiprocessing start method a sweep's jobs run under: joblib's launcher runs them in loky's workers
        # (unless it runs one job at a time, in this process, or in threads); the others run them in processes of
        # Python's own.
        launcher = composed.hydra.launcher
        loky = (multirun and _launcher(composed.hydra) == "JoblibLauncher" and launcher.get("n_jobs") != 1
                and launcher.get("backend") in (None, "loky"))
        for job, job_cfg in job_configs(every):
            try:
                if validate(job_cfg).eval_in_workers():
                    check_worker_start_method("loky" if loky else None, "this sweep's jobs use")
            except (Refused, ValueError) as e:
                raise Refused(f"{e}" + (f" (in the job {' '.join(job)})" if len(every) > 1 else "")) from None
    except Refused:
        raise
    except Exception as e:  # Hydra's and OmegaConf's composition errors
        raise Refused(_one_line(e) + _quoting_hint(argv)) from None
    # A run or sweep directory that cannot be made (a file in its way, no permission, a read-only file system, a
    # name too long) is refused in one line, instead of Hydra's traceback once it tries.
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    try:
        path = Path(str(OmegaConf.select(composed, key, throw_on_resolution_failure=True)))
    except Exception:  # named by Hydra's runtime values (${hydra:...}), it cannot be resolved yet: left to Hydra
        return composed
    if check_dirs:
        why = why_not_makeable(path)
        if why is not None:
            raise Refused(f"{key}={path} cannot be made a directory ({why})")
    if not (check_dirs and multirun):
        return composed
    # Hydra makes each job's directory before the job runs: a file there would end the sweep with a traceback.
    with contextlib.suppress(InterpolationResolutionError):  # a subdir named by Hydra's runtime values
        for job in sweep_jobs([a for a in argv if a not in ("-m", "--multirun")], statuses=False):
            for d in (job.run_dir, *job.run_dirs):
                file = next((p for p in (d, *d.parents) if p.exists()), d)  # the deepest existing path
                if not file.is_dir():
                    where = "a job's run directory" if file == d else f"a folder of the job's run directory {d}"
                    raise Refused(f"{file} is a file where {where} belongs; move it away")
    return composed


def _quoting_hint(argv: list[str]) -> str:
    """A word that is no override right after a key=value one is most likely the rest of a value with spaces,
    which the shell split: say how to quote it."""
    for prev, word in zip(argv, argv[1:]):
        if "=" not in word and not word.startswith("-") and "=" in prev and not prev.startswith("-"):
            key, value = prev.split("=", 1)
            return f"; if '{value} {word}' is one value, quote it for the shell and Hydra: '{key}=\"{value} {word}\"'"
    return ""


def _printed_config_overrides(argv: list[str]) -> list[str] | None:
    """The overrides of a command that prints the composed config (``--cfg job|hydra|all``, with ``--resolve`` or
    ``--package``) or its help (``--help``, which composes it too), or None for any other command."""
    if not any(a in ("--cfg", "-c", "--help", "-h") for a in argv):
        return None
    rest = []
    args = iter(argv)
    for a in args:
        if a in ("--cfg", "-c", "--package", "-p"):
            next(args, None)  # (its value)
        elif a not in ("--resolve", "--help", "-h"):
            rest.append(a)
    return None if any(a.startswith("-") and a not in ("-m", "--multirun") for a in rest) else rest


def _config_dir_as_searchpath(argv: list[str]) -> list[str]:
    """``--config-dir DIR`` (``-cd``) as a search path, for the checks to read what Hydra will (given argv as is)."""
    out = []
    rest = iter(argv)
    for a in rest:
        if a in ("--config-dir", "-cd") or a.startswith("--config-dir="):
            d = a.split("=", 1)[1] if "=" in a else next(rest, "")
            if not d or "'" in d or any(x.startswith("hydra.searchpath=") for x in argv):
                return argv  # (left to Hydra)
            if not Path(d).is_dir():
                raise ValueError(f"--config-dir {d} is not a directory")
            a = f"hydra.searchpath=['file://{Path(d).resolve()}']"
        out.append(a)
    return out


def cli() -> None:
    """``python -m pomdp_ffm.train``: the command line checked (``precheck``), then Hydra's main. A sweep that
    a stop signal stopped (``signals.SweepSignals``) exits with EXIT_STOPPED once its jobs in hand have saved
    their checkpoints; one with a refused or failed job (``grid.SweepOutcomes``), with EXIT_FAILED."""
    argv = sys.argv[1:]
    early: list[int] = []  # a stop while the command is checked: nothing has started, nothing starts
    before = {sig: signal.signal(sig, lambda signum, frame: early.append(signum)) for sig in STOP_SIGNALS}
    try:
        checked = _config_dir_as_searchpath(argv)
        printed = _printed_config_overrides(checked)
        if printed is not None:
            precheck(printed, check_dirs=False)  # an invalid config is refused, not printed as if it were fine
        composed = precheck(checked)
    except (Refused, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_REFUSED)
    multirun = composed is not None and (any(a in ("-m", "--multirun") for a in argv)
                                         or composed.hydra.mode == RunMode.MULTIRUN)
    launcher = _launcher(composed.hydra) if composed is not None else ""
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
        print(f"stopped by signal {early[0]} before anything started; rerun the same command", file=sys.stderr)
        sys.exit(EXIT_STOPPED)
    try:
        main()
    finally:
        # The outcome is decided: a stop signal as Python shuts down (a second SIGTERM) must not end it by the signal.
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
    if in_process and signals.sweep_stopped() is not None:
        print(f"stopped by signal {signals.sweep_stopped()}: the jobs in hand saved their checkpoints and the "
              "sweep's later jobs did not start; rerun the same command to resume", file=sys.stderr)
        sys.exit(EXIT_STOPPED)
    ended = sweep_outcome() or {}  # (its jobs named, and summed up, by grid.SweepOutcomes)
    if ended.get("stopped") or ended.get("refused") or ended.get("failed"):
        sys.exit(EXIT_STOPPED if ended.get("stopped") else EXIT_FAILED)


if __name__ == "__main__":
    cli()
