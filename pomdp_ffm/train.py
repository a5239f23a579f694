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

from .run.signals import STOP_SIGNALS

EARLY_STOPS: list[int] = []  # the stop signals that came before cli() chose who takes them: nothing has started


def _hold(signum, frame) -> None:
    EARLY_STOPS.append(signum)


# Run as ``python -m pomdp_ffm.train``: a stop signal while the modules below are imported (torch's, seconds) is held
# for cli(), which exits with EXIT_STOPPED, instead of ending the process by the signal. Imported (by a test, a
# worker), the module leaves the process's handlers as they are. _DEFAULTS: the handlers from before.
_DEFAULTS = {sig: signal.signal(sig, _hold) for sig in STOP_SIGNALS} if __name__ == "__main__" else {}

from pathlib import Path

import hydra
from omegaconf import DictConfig

from .config import register_configs
from .jobs import command
from .jobs.plan import Action, Refused
from .jobs.seeds import run_seeds
from .jobs.start import check_and_lock
from .run.rundir import JobResult
from .run.signals import StopSignals
from .trainer import Trainer

register_configs()
__all__ = ["Refused", "cli", "main", "train_job"]


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
    attempt = check_and_lock(cfg, run_dir, trainer_cls, stop=stop)
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


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> JobResult:
    return command.in_hydra(cfg, train_job)


def cli() -> None:
    command.cli(main, EARLY_STOPS, _hold, _DEFAULTS)


if __name__ == "__main__":
    cli()
