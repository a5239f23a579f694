"""Hydra entry point: ``python -m pomdp_ffm.train env=HopperBLT-V-v0 algo=td3 seq_model=ffm seed=0``.

``--cfg job`` prints the composed config; ``experiment=<preset>`` runs a grid (conf/experiment/);
``hydra/launcher=<basic|local|slurm|slurm_local>`` chooses where its jobs run (launch/README.md).

With ``resume=true`` (the presets set it) a run directory is a unit of work that can be started any number
of times: a finished run (``DONE``) is skipped, an interrupted one continues from ``checkpoints/last.pt``,
and a config that differs from the one the directory was started with is refused. Every start is recorded
in ``attempts.log``; a failure leaves its traceback in ``ERROR.txt`` and is re-raised, so Hydra marks the job
failed while the other jobs of a multirun go on.
"""
from __future__ import annotations

import datetime
import logging
import os
import signal
import socket
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from .config import RunConfig, check_known_keys, register_configs
from .trainer import CHECKPOINT, DONE, Trainer

register_configs()
log = logging.getLogger("pomdp_ffm")

ERROR_FILE = "ERROR.txt"
ATTEMPTS_FILE = "attempts.log"
# Keys that may change between the starts of one run directory: where and how it runs, not what it learns.
MAY_DIFFER = ("resume", "progress", "device", "num_threads", "checkpoint")


def _flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def config_differences(stored: dict, current: dict) -> list[str]:
    """Training-relevant keys whose values differ, as 'key: stored -> current' lines."""
    a, b = _flat(stored), _flat(current)
    # Options of the algorithm and memory a run does not use cannot change it (a GRU run ignores policy.ffm).
    policy = stored.get("policy", {})
    unused = {f"policy.{k}." for k in ("sac", "td3") if k != policy.get("algo_name")}
    if policy.get("seq_model") != "ffm":
        unused.add("policy.ffm.")
    diffs = []
    for key in sorted(set(a) | set(b)):
        if key.split(".")[0] in MAY_DIFFER or any(key.startswith(u) for u in unused):
            continue
        if a.get(key, "<absent>") != b.get(key, "<absent>"):
            diffs.append(f"{key}: {a.get(key, '<absent>')!r} -> {b.get(key, '<absent>')!r}")
    return diffs


def _attempt(run_dir: Path, event: str) -> None:
    # The scheduler's id of this attempt: SLURM array task, SLURM job, or submitit's local job.
    job = os.environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if job else \
        os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID") or "-"
    stamp = datetime.datetime.now().isoformat(timespec="seconds")
    with open(run_dir / ATTEMPTS_FILE, "a") as f:
        f.write(f"{stamp} host={socket.gethostname()} pid={os.getpid()} job={job} {event}\n")


class SchedulerWarning:
    """Inside a submitit job, the scheduler's warning signal (USR2 unless SUBMITIT_PREEMPT_SIGNAL says
    otherwise) makes submitit requeue the job and exit at once, losing everything since the last periodic
    checkpoint. While training, this defers submitit's handler: the signal is turned into the trainer's own
    stop signal (SIGUSR1: finish the update in hand, save checkpoints/last.pt) and submitit's handler, which
    requeues the job with its timeout accounting, runs only after the checkpoint is on disk.
    Outside submitit (no Python handler on that signal) it does nothing.
    """

    def __init__(self):
        name = "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")
        self.signum = getattr(signal, name, None)
        self.requeue = signal.getsignal(self.signum) if self.signum is not None else None
        self.caught: tuple | None = None

    @property
    def active(self) -> bool:
        return callable(self.requeue) and self.signum != signal.SIGUSR1

    def __enter__(self):
        if self.active:
            signal.signal(self.signum, self._on_warning)
        return self

    def _on_warning(self, signum, frame):
        if not callable(signal.getsignal(signal.SIGUSR1)):
            # The trainer is not listening (still loading, or already done): nothing new to save, and
            # SIGUSR1's default action would kill the process before submitit could requeue it.
            self.requeue(signum, frame)
            return
        self.caught = (signum, frame)
        os.kill(os.getpid(), signal.SIGUSR1)

    def __exit__(self, *exc):
        if self.active:
            signal.signal(self.signum, self.requeue)
        return False

    def hand_over(self) -> None:
        """Let submitit requeue (it exits the process)."""
        if self.caught is not None:
            self.requeue(*self.caught)


def run(cfg: DictConfig, run_dir: Path) -> dict:
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        result, warning = _run(cfg, run_dir)
    except Exception:
        (run_dir / ERROR_FILE).write_text(traceback.format_exc())
        _attempt(run_dir, f"failed (see {ERROR_FILE})")
        raise
    if result.get("stopped"):
        _attempt(run_dir, f"stopped at {result['env_steps']} env steps (checkpoint saved)")
        warning.hand_over()
    elif not result.get("skipped"):
        _attempt(run_dir, f"finished at {result['env_steps']} env steps")
    return result


def _run(cfg: DictConfig, run_dir: Path) -> tuple[dict, SchedulerWarning | None]:
    check_known_keys(cfg)
    run_cfg: RunConfig = OmegaConf.to_object(cfg)  # validates choices (dataclass __post_init__)
    cfg_path = run_dir / "config.yaml"
    # Only a checkpoint or a finished run holds results that another config would mix with; an attempt that
    # failed before its first checkpoint left nothing to protect and is simply started again.
    started = (run_dir / DONE).exists() or (run_dir / CHECKPOINT).exists()
    if run_cfg.resume and started and cfg_path.exists():
        diffs = config_differences(OmegaConf.to_container(OmegaConf.load(cfg_path)),
                                   OmegaConf.to_container(cfg, resolve=True))
        if diffs:
            raise ValueError(f"{run_dir} was started with a different config ({cfg_path}); resuming it with "
                             "this one would mix two experiments. Differences:\n  " + "\n  ".join(diffs)
                             + "\nChoose another directory (hydra.sweep.dir=... / hydra.run.dir=...).")
        if (run_dir / DONE).exists():
            # A successful start or skip supersedes the error of an earlier attempt.
            (run_dir / ERROR_FILE).unlink(missing_ok=True)
            log.info("%s is finished (%s exists): skipping", run_dir, DONE)
            _attempt(run_dir, "skipped (finished)")
            return {"skipped": True}, None
    elif not run_cfg.resume and (run_dir / "progress.csv").exists():
        raise FileExistsError(f"{run_dir} already holds a run; pass resume=true to continue it "
                              "or choose another run directory")
    (run_dir / ERROR_FILE).unlink(missing_ok=True)
    if not (run_cfg.resume and started and cfg_path.exists()):
        cfg_path.write_text(OmegaConf.to_yaml(cfg, resolve=True))
    _attempt(run_dir, "start")
    trainer = Trainer(run_cfg, run_dir)
    try:
        with SchedulerWarning() as warning:
            return trainer.run(), warning
    finally:
        trainer.close()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> dict:
    return run(cfg, Path(HydraConfig.get().runtime.output_dir))


if __name__ == "__main__":
    main()
