"""Hydra entry point: ``python -m pomdp_ffm.train env=HopperBLT-V-v0 algo=td3 seq_model=ffm seed=0``.

``--cfg job`` prints the composed config; ``experiment=<preset>`` runs a grid (conf/experiment/);
``hydra/launcher=<basic|local|slurm|slurm_local>`` chooses where its jobs run (launch/README.md).

Every setting is checked before anything is written (a bad one is a one-line error naming the key, the value
and what is allowed). A run directory (``pomdp_ffm.rundir``) is then locked for the life of the run: a second
process is refused, naming the holder. With ``resume=true`` (the presets set it) a run directory is a unit of
work that can be started any number of times: a finished run (DONE) is skipped; an interrupted one continues
from checkpoints/last.pt once the checkpoint, config.yaml and progress.csv agree with each other and with the
config asked for; anything else is refused, naming the file and the fix. Every start is recorded in
attempts.log; a failure leaves its traceback in ERROR.txt.

Exit codes of a single run (a multirun reports each job's failure through Hydra instead):

    0   finished (DONE written), or skipped because it had finished
    1   failed: an error while training (traceback in ERROR.txt)
    2   refused: a bad setting, or a run directory that is in use, damaged, or holds another experiment
    3   diverged: a non-finite loss (checkpoints/diverged.pt saved, message in ERROR.txt)
    75  stopped by SIGTERM/SIGUSR1 (or the scheduler's warning) with its checkpoint saved: rerun to resume
"""
from __future__ import annotations

import logging
import re
import signal
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from .config import (Refused, RunConfig, check_known_keys, check_renamed_overrides, flat_keys, learning_settings,
                     register_configs, with_current_key_names)
from . import rundir as rundir_module
from .rundir import (CHECKPOINT_FORMAT, CheckpointError, RunDir, RunDirError, load_checkpoint, set_aside,
                     why_not_makeable)
from . import signals
from .signals import STOP_SIGNALS, StopSignals, SweepSignals
from .envs import check_worker_start_method
from .trainer import Outcome, Trainer, TrainingDiverged, resolve_device

register_configs()
log = logging.getLogger("pomdp_ffm")

EXIT_OK, EXIT_FAILED, EXIT_REFUSED, EXIT_DIVERGED, EXIT_STOPPED = 0, 1, 2, 3, 75


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
    return with_current_key_names(stored)


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
    missing = sorted(set(flat_keys(with_current_key_names(state["config"]))) - set(flat_keys(stored)))
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
    # (Read through the module: a launcher pickles this module's functions, and a ContextVar does not pickle.)
    handler.addFilter(lambda record: rundir_module.CURRENT_RUN.get() in (None, run.path))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    return handler


def check_untouched(run: RunDir, run_cfg: RunConfig, composed: dict) -> None:
    """Everything a start checks that needs no lock: nobody holds it, and plan() finds nothing to refuse."""
    run.ensure_free()
    plan(run, run_cfg, composed)


def check_and_lock(cfg: DictConfig, run_dir: str | Path, trainer_cls: type[Trainer] = Trainer) -> "Attempt":
    """Validate, build the trainer, check the directory (without touching it), lock it and plan under the lock.
    Raises Refused (nothing written; the lock released)."""
    run_cfg = validate(cfg)
    composed = OmegaConf.to_container(cfg, resolve=True)
    run = RunDir(run_dir)
    try:
        trainer = trainer_cls(run_cfg, run)  # also checks what only the task can tell (e.g. the eval clock)
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
        self.trainer.config_copy = self.composed if self.state is None else self.state["config"]

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
        if self.handler is not None:
            log.removeHandler(self.handler)
            self.handler.close()
        try:
            self.trainer.close()
        finally:
            self.run.release()


def run(cfg: DictConfig, run_dir: str | Path, trainer_cls: type[Trainer] = Trainer) -> dict:
    """Validate, lock, verify and train one run directory (or, with ``seeds``, one per seed: pomdp_ffm/seeds.py).
    Raises Refused (nothing written), TrainingDiverged, or the error that stopped training (recorded in
    ERROR.txt). Returns a summary dict. ``trainer_cls`` lets tests put an instrumented trainer on the real path."""
    if cfg.get("seeds"):
        from .seeds import run_seeds

        return run_seeds(cfg, Path(run_dir), trainer_cls)
    attempt = check_and_lock(cfg, run_dir, trainer_cls)
    try:
        if attempt.action == "skip":
            return attempt.skip()
        attempt.begin()
        with StopSignals() as stop:
            attempt.trainer.stop = stop
            try:
                result = attempt.end(attempt.trainer.train(resume=attempt.state))
            except BaseException as e:
                attempt.fail(e)
                raise
        return {**result, "stop": stop}
    finally:
        attempt.close()


def _remove_empty_dirs(path: Path, stop_at: Path) -> None:
    """Hydra made the run directory (and its parents) before calling us; a refused start leaves none behind."""
    path, stop_at = path.resolve(), stop_at.resolve()
    if path.is_dir() and not any(path.iterdir()):
        path.rmdir()
    path = path.parent
    while stop_at in path.parents and path.is_dir() and not any(path.iterdir()):
        path.rmdir()
        path = path.parent


_between_jobs: SweepSignals | None = None  # in a joblib worker, from its first job on

# The launchers whose jobs run in the launching process or in its worker processes: a stop signal sent to the
# launching process stops their sweep (signals.SweepSignals). Under submitit every job has its own signals.
_IN_PROCESS_LAUNCHERS = ("BasicLauncher", "JoblibLauncher")


def _launcher(hydra_cfg) -> str:
    """The class name of a composed Hydra config's launcher ("BasicLauncher", "JoblibLauncher", ...)."""
    return str(hydra_cfg.launcher.get("_target_", "")).rsplit(".", 1)[-1]


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> dict:
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    global _between_jobs
    if multirun and _between_jobs is None and _launcher(hc) == "JoblibLauncher":
        # A worker of joblib's launcher: a stop signal between two of its jobs stops the sweep, not the worker; one
        # that came before this first job waited, blocked (SweepSignals), and is taken now.
        _between_jobs = SweepSignals(forward=False).__enter__()
        signals.unblock_in_worker()
    if multirun and signals.sweep_stopped() is not None:
        # A stop signal stopped the sweep (during a job of this process or between two): this job does not start.
        _remove_empty_dirs(run_dir, stop_at=Path(hc.sweep.dir))
        log.info("not started: the sweep was stopped by signal %d", signals.sweep_stopped())
        return {"stopped": True, "started": False, "signal": signals.sweep_stopped()}
    try:
        result = run(cfg, run_dir)
    except Refused as e:
        _remove_empty_dirs(run_dir, stop_at=Path.cwd() if not multirun else Path(hc.sweep.dir))
        if multirun:
            raise
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_REFUSED)
    except TrainingDiverged as e:
        if multirun:
            raise
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_DIVERGED)
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


def _check_dir(composed: DictConfig, key: str) -> None:
    """Refuse a run or sweep directory (``key``) that cannot be made (a file in its way, no permission, a
    read-only file system, a name too long) in one line, instead of Hydra's traceback once it tries; found
    without writing anything (``rundir.why_not_makeable``). A directory named through Hydra's runtime values
    (``${hydra:...}``) cannot be resolved yet, and is left to Hydra."""
    try:
        path = Path(str(OmegaConf.select(composed, key, throw_on_resolution_failure=True)))
    except Exception:
        return
    why = why_not_makeable(path)
    if why is not None:
        raise Refused(f"{key}={path} cannot be made a directory ({why})")


def _job_start_method(hydra_cfg) -> str | None:
    """The multiprocessing start method a sweep's jobs run under: joblib's launcher runs them in loky's workers
    (unless it runs one job at a time, in this process, or in threads); the others run them in processes of
    Python's own."""
    if _launcher(hydra_cfg) != "JoblibLauncher":
        return None
    launcher = hydra_cfg.launcher
    if launcher.get("n_jobs") == 1 or launcher.get("backend") not in (None, "loky"):
        return None
    return "loky"


def precheck(argv: list[str], check_dirs: bool = True) -> DictConfig | None:
    """Compose and validate what the command line asks for before Hydra starts anything, so that a misspelt
    key, an unknown task or model, or a bad value is one line and exit code 2, with nothing written or
    launched. Every job of a sweep (the command line's, and a preset's ``hydra.sweeper.params`` in a multirun)
    is checked, with its own overrides as the sweep will start it; jobs that differ only in their seed are composed
    once. Commands with Hydra flags other than --multirun (--cfg, --help, -cn, ...) are left to Hydra. Returns the
    config composed from the fixed overrides, with Hydra's (None where the command is left to Hydra). With
    ``check_dirs``, the run (or sweep) directory must be one that can be made (``_check_dir``)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from .grid import CONF_DIR, job_overrides

    if any(a.startswith("-") and a not in ("-m", "--multirun") for a in argv):
        return None
    check_renamed_overrides(argv)  # Hydra's own error would name only the old key
    args = [a for a in argv if not a.startswith("-")]
    try:
        every, composed = job_overrides(args, multirun=any(a in ("-m", "--multirun") for a in argv))
        parser = OverridesParser.create()
        multirun = any(a in ("-m", "--multirun") for a in argv) or composed.hydra.mode == RunMode.MULTIRUN
        worker_method = _job_start_method(composed.hydra) if multirun else None
        by_rest: dict[tuple[str, ...], list[tuple[list[str], object]]] = {}
        for job in every:
            seed = [o.value() for o in parser.parse_overrides(job) if o.input_line.startswith("seed=")]
            plain = len(seed) == 1 and isinstance(seed[0], int) and not isinstance(seed[0], bool)
            rest = tuple(x for x in job if not (plain and x.startswith("seed=")))
            by_rest.setdefault(rest, []).append((job, seed[0] if plain else None))
        with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
            for (first, _), *others in by_rest.values():
                cfg = compose("config", overrides=first)
                for job, seed in [(first, None), *others]:
                    job_cfg = cfg
                    if seed is not None:  # the same job with another (integer) seed
                        job_cfg = cfg.copy()
                        OmegaConf.update(job_cfg, "seed", seed)
                    try:
                        if validate(job_cfg).env_workers():
                            check_worker_start_method(worker_method, "this sweep's jobs use")
                    except (Refused, ValueError) as e:
                        raise Refused(f"{e}" + (f" (in the job {' '.join(job)})" if len(every) > 1 else "")) from None
    except Refused:
        raise
    except Exception as e:  # Hydra's and OmegaConf's composition errors
        raise Refused(_one_line(e)) from None
    if check_dirs:
        _check_dir(composed, "hydra.sweep.dir" if multirun else "hydra.run.dir")
    return composed


def cli() -> None:
    """``python -m pomdp_ffm.train``: the command line checked (``precheck``), then Hydra's main. A sweep that
    a stop signal stopped (``signals.SweepSignals``) exits with EXIT_STOPPED once its jobs in hand have saved
    their checkpoints."""
    argv = sys.argv[1:]
    early: list[int] = []  # a stop while the command is checked: nothing has started, nothing starts
    before = {sig: signal.signal(sig, lambda signum, frame: early.append(signum)) for sig in STOP_SIGNALS}
    try:
        composed = precheck(argv)
    except (Refused, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_REFUSED)
    multirun = composed is not None and (any(a in ("-m", "--multirun") for a in argv)
                                         or composed.hydra.mode == RunMode.MULTIRUN)
    launcher = _launcher(composed.hydra) if composed is not None else ""
    in_process = multirun and launcher in _IN_PROCESS_LAUNCHERS
    workers = launcher == "JoblibLauncher"
    if in_process:
        # Kept to the end of the process, not only of the sweep: a signal while joblib's workers shut down, after
        # the last job, is then taken (or left blocked) instead of ending the process by the signal.
        SweepSignals(workers=workers).__enter__()
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
    main()
    if in_process and signals.sweep_stopped() is not None:
        print(f"stopped by signal {signals.sweep_stopped()}: the jobs in hand saved their checkpoints and the "
              "sweep's later jobs did not start; rerun the same command to resume", file=sys.stderr)
        sys.exit(EXIT_STOPPED)


if __name__ == "__main__":
    cli()
