"""Hydra entry point: ``python -m pomdp_ffm.train env=HopperBLT-V-v0 algo=td3 seq_model=ffm seed=0``, or a grid
(``experiment=<preset>``; launch/README.md, with the exit codes); every setting is checked before any write."""
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
    """Train one run directory (with ``seeds``, one per seed: seeds.py) and return a summary dict; raises Refused
    (nothing written) or the error that stopped training. ``trainer_cls``: an instrumented trainer for tests."""
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
    return str(hydra_cfg.launcher.get("_target_", "")).rsplit(".", 1)[-1]


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> dict:
    hc = HydraConfig.get()
    # In joblib's worker: a stop signal between two jobs stops the sweep, not the worker; it ends with the launcher.
    joblib = hc.mode == RunMode.MULTIRUN and _launcher(hc) == "JoblibLauncher"
    with signals.job_worker(EXIT_STOPPED).job() if joblib else contextlib.nullcontext():
        return _job(cfg, hc)


def _job(cfg: DictConfig, hc) -> dict:
    run_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    if multirun and (stopped := signals.sweep_stopped()) is not None:  # (in a job of this process, or between two)
        _remove_empty_dirs(run_dir, stop_at=Path(hc.sweep.dir))
        log.info("not started: the sweep was stopped by signal %d", stopped)
        return {"stopped": True, "started": False, "signal": stopped}
    try:
        result = run(cfg, run_dir)
    # (A failure is in attempts.log and ERROR.txt where it fits; a lost lock, in neither: the run wrote its last.)
    except (Refused, TrainingDiverged, Unwritable, LockLost) as e:
        refused, unwritable = isinstance(e, Refused), isinstance(e, (Unwritable, LockLost))
        if refused:
            _remove_empty_dirs(run_dir, stop_at=Path.cwd() if not multirun else Path(hc.sweep.dir))
        if multirun:  # named at the sweep's end (grid.SweepOutcomes), as the sweep goes on
            return {"refused" if refused else "failed": str(e)}
        fix = f"; {e.fix}, then rerun (resume=true continues from the last checkpoint)" if unwritable else ""
        print(f"error: {e}{fix}", file=sys.stderr)
        sys.exit(EXIT_REFUSED if refused else EXIT_UNWRITABLE if unwritable else EXIT_DIVERGED)
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
        # A signal after the run's last look at it (final evaluation, checkpoint, DONE): done, but the sweep stops.
        signals.stop_sweep(result["stop"].requested)
    result.pop("stop", None)
    return result


def _one_line(e: Exception) -> str:
    """Hydra's composition errors in one line: what was refused, why, and what is allowed."""
    text, problem = str(e), yaml_problem(e)
    if problem is not None:  # a config file Hydra read
        return problem + ("; remove one of them" if "duplicate key" in problem else "")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if "Available options in" in text:  # an unknown config-group choice: name the choices
        head = lines[0].replace("In 'config': ", "")
        options = [ln.strip() for ln in text.split("Available options in", 1)[1].splitlines()[1:]
                   if ln.startswith("\t") and "provider=" not in ln]
        return f"{head}; the choices are {', '.join(options)}"
    why = (str(e.__cause__ or "").strip().splitlines() or [""])[0]
    if lines and lines[0].startswith("Could not override"):
        return f"{lines[0].rstrip('.')}: {why}; `--cfg job` prints every key" if why else lines[0]
    return "; ".join([*lines[:1], *([why] if why else [])])


def why_not_makeable(path: Path) -> str | None:
    """Why ``path`` cannot be made a directory or written in, found without writing anything; else None."""
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
    """Every job the command line starts, validated before Hydra starts anything (else Refused, nothing written),
    and with ``check_dirs`` its directory; None for Hydra flags but --multirun. Returns the fixed part's config."""
    if any(a.startswith("-") and a not in ("-m", "--multirun") for a in argv):
        return None
    flag = any(a in ("-m", "--multirun") for a in argv)
    try:
        every, composed = job_overrides([a for a in argv if not a.startswith("-")], multirun=flag)
        multirun = flag or composed.hydra.mode == RunMode.MULTIRUN
        # joblib runs the jobs in loky's workers (unless one at a time, or in threads); the others in Python's own
        launcher = composed.hydra.launcher
        loky = multirun and _launcher(composed.hydra) == "JoblibLauncher" and launcher.get("n_jobs") != 1 \
            and launcher.get("backend") in (None, "loky")
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
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    try:
        path = Path(str(OmegaConf.select(composed, key, throw_on_resolution_failure=True)))
    except Exception:  # named by Hydra's runtime values (${hydra:...}), it cannot be resolved yet: left to Hydra
        return composed
    if check_dirs and (why := why_not_makeable(path)) is not None:
        raise Refused(f"{key}={path} cannot be made a directory ({why})")
    # Hydra makes each job's directory before the job runs: a file there would end the sweep with a traceback.
    with contextlib.suppress(InterpolationResolutionError):  # a subdir named by Hydra's runtime values
        for job in sweep_jobs([a for a in argv if a not in ("-m", "--multirun")], statuses=False) \
                if check_dirs and multirun else []:
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
    """The overrides of a command that prints the config (``--cfg``, ``--resolve``, ``--package``) or its help
    (``--help``, which composes it too), else None."""
    if not any(a in ("--cfg", "-c", "--help", "-h") for a in argv):
        return None
    rest, args = [], iter(argv)
    for a in args:
        if a in ("--cfg", "-c", "--package", "-p"):
            next(args, None)  # (its value)
        elif a not in ("--resolve", "--help", "-h"):
            rest.append(a)
    return None if any(a.startswith("-") and a not in ("-m", "--multirun") for a in rest) else rest


def _config_dir_as_searchpath(argv: list[str]) -> list[str]:
    """``--config-dir DIR`` (``-cd``) as a search path, for the checks to read what Hydra will (given argv as is)."""
    out, rest = [], iter(argv)
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
    """``python -m pomdp_ffm.train``: the command line checked (``precheck``), then Hydra's main; a sweep that a
    stop signal stopped (``signals.SweepSignals``) exits with EXIT_STOPPED once its jobs in hand saved checkpoints."""
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
    # Jobs in this process or its workers: a stop signal to it stops the sweep (under submitit, each job).
    in_process = multirun and launcher in ("BasicLauncher", "JoblibLauncher")
    workers = launcher == "JoblibLauncher"
    if in_process:
        # Kept to the end of the process, not only of the sweep: a signal while joblib's workers shut down, after
        # the last job, is then taken (or left blocked) instead of ending the process by the signal.
        SweepSignals(workers=workers).__enter__()
        if workers:
            signals.workers_follow(EXIT_STOPPED)
    elif composed is not None and not multirun:
        # A stop before StopSignals is in (Hydra starting, the lock taken) is remembered, so the run stops with its
        # checkpoint. (Not around a submitit launcher, which must stay stoppable while it waits for its jobs.)
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
