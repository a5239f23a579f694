"""Several seeds of one configuration in one process: ``python -m pomdp_ffm.train ... seeds=[0,1,2,3,4]``.

Each seed is the run it would be alone, in its own run directory with the usual layout (config.yaml with its own
seed, progress.csv, checkpoints, DONE), so analysis, resume, skip-finished and the paper grid treat it as any
other run. The job's directory is the first seed's; the others are its siblings, named by replacing the path
component ``seed-<first>`` with ``seed-<k>`` (the presets' ``.../seed-${seed}`` layout).

The seeds take turns, one unit of work each (the random pool, or one iteration: an episode, its updates and
maybe an evaluation), each with its own env, buffer, agent and RNG streams: torch's, numpy's and Python's global
generators are swapped in and out at every turn, so a seed draws exactly what it draws alone and its progress.csv
is the same (tests/test_seeds.py). A stop signal checkpoints every seed; a seed that diverges or fails is
recorded in its own directory and the others go on. This shares one process (and one GPU context) among the
seeds; batching their updates into one call is the next step (see docs/benchmarks.md).
"""
from __future__ import annotations

import contextlib
import random
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from .rundir import CURRENT_RUN, RunDir, RunDirError
from .signals import StopSignals
from .train import Attempt, Refused, check_and_lock, check_untouched, validate
from .trainer import Trainer, _StopRequested


def seed_dirs(job_dir: Path, seed: int, seeds: list[int]) -> list[Path]:
    """Each seed's run directory: ``job_dir`` with its ``seed-<seed>`` component renamed ``seed-<k>``."""
    name = f"seed-{seed}"
    parts = job_dir.parts
    where = [i for i, p in enumerate(parts) if p == name]
    if not where:
        raise Refused(f"seeds={seeds} needs a run directory with a path component {name} to name each seed's "
                      f"sibling (as the presets' .../seed-${{seed}} does); got {job_dir}")
    i = where[-1]
    return [Path(*parts[:i], f"seed-{k}", *parts[i + 1:]) for k in seeds]


class RNGStreams:
    """The global generators' states of one seed, swapped in for its turns."""

    def __init__(self):
        self.state = self.capture()

    @staticmethod
    def capture() -> tuple:
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        return torch.get_rng_state(), cuda, np.random.get_state(), random.getstate()

    @contextlib.contextmanager
    def active(self):
        torch_state, cuda, np_state, py_state = self.state
        torch.set_rng_state(torch_state)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        np.random.set_state(np_state)
        random.setstate(py_state)
        try:
            yield
        finally:
            self.state = self.capture()


def run_seeds(cfg: DictConfig, job_dir: Path, trainer_cls: type[Trainer] = Trainer) -> dict:
    run_cfg = validate(cfg)
    seeds = list(run_cfg.seeds)
    dirs = seed_dirs(job_dir, run_cfg.seed, seeds)
    cfgs = []
    for k in seeds:
        # Each seed's own config is the one it would have alone: its seed, no axis.
        c = cfg.copy()
        OmegaConf.update(c, "seed", k)
        OmegaConf.update(c, "seeds", None)
        cfgs.append(c)
    # Every seed's directory is checked before any is touched: a refusal writes nothing, not even a lock file.
    for c, d in zip(cfgs, dirs):
        try:
            check_untouched(RunDir(d), validate(c), OmegaConf.to_container(c, resolve=True))
        except RunDirError as e:
            raise Refused(str(e)) from None
    attempts: list[Attempt] = []
    streams: dict[int, RNGStreams] = {}
    try:
        for k, c, d in zip(seeds, cfgs, dirs):
            attempts.append(check_and_lock(c, d, trainer_cls))
            streams[k] = RNGStreams()  # right after the seed's trainer seeded and built everything
        return _train_together(seeds, attempts, streams)
    finally:
        for a in attempts:
            a.close()


def _train_together(seeds: list[int], attempts: list[Attempt], streams: dict[int, RNGStreams]) -> dict:
    results: dict[int, dict] = {}
    errors: list[BaseException] = []
    running = []
    for k, a in zip(seeds, attempts):
        if a.action == "skip":
            results[k] = a.skip()
        else:
            running.append((k, a))

    @contextlib.contextmanager
    def turn(k: int, a: Attempt):
        token = CURRENT_RUN.set(a.run.path)
        try:
            with streams[k].active():
                yield
        finally:
            CURRENT_RUN.reset(token)

    with StopSignals() as stop:
        for k, a in running:
            with turn(k, a):
                a.begin()
                a.trainer.stop = stop
                a.trainer.open(a.state)
        try:
            while running:
                for k, a in list(running):
                    try:
                        with turn(k, a):
                            if not a.trainer.step():
                                results[k] = a.end(a.trainer.finished())
                                a.trainer.shut()
                                running.remove((k, a))
                    except _StopRequested:
                        raise
                    except BaseException as e:  # this seed's failure, recorded in its own directory
                        with turn(k, a):
                            a.fail(e)
                            a.trainer.shut()
                        running.remove((k, a))
                        if isinstance(e, KeyboardInterrupt):
                            raise
                        errors.append(e)
        except _StopRequested:
            for k, a in running:
                with turn(k, a):
                    results[k] = a.end(a.trainer.stopped())
                    a.trainer.shut()
        except KeyboardInterrupt:
            for k, a in running:
                with turn(k, a):
                    a.fail(KeyboardInterrupt())
                    a.trainer.shut()
            raise
    if errors:
        raise errors[0]
    stopped = any(r.get("stopped") for r in results.values())
    return {"seeds": results, "stopped": stopped, "signal": stop.requested if stopped else None, "stop": stop,
            "skipped": all(r.get("skipped") for r in results.values())}
