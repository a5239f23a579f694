"""Several seeds of one configuration in one process (``seeds=[0,1,2,3,4]``), each in its own run directory with its
own env, buffer, agent and random generators, trained by the one training loop (trainer.train_together), each seed
in its turn: its run directory current, its generators swapped in. On a CPU a seed's progress.csv is the one it
writes alone. On CUDA with ``train.cuda_graph`` the bursts run in joint rounds and the seeds' acting steps are
gathered (patches/016). A stop checkpoints every seed; one that fails is recorded in its directory, others go on."""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
from omegaconf import DictConfig

from ..rng import SeedRNG, host_rng_state
from ..run.rundir import JobResult
from ..run.signals import StopSignals
from ..standing import Outcome
from ..trainer import Seat, Trainer, train_together
from .plan import Action, job, seed_config, seed_dirs, validate
from .start import CURRENT_RUN, Attempt, checked, start

log = logging.getLogger("pomdp_ffm")


def run_seeds(cfg: DictConfig, job_dir: Path, trainer_cls: type[Trainer], stop: StopSignals) -> JobResult:
    seeds_cfg = validate(cfg)
    dirs = seed_dirs(job_dir, seeds_cfg.seed, list(seeds_cfg.seeds))
    jobs = [job(seed_config(cfg, k), d) for k, d in zip(seeds_cfg.seeds, dirs)]
    actions = [checked(j) for j in jobs]  # every directory checked before any is touched
    seeds: list[SeedSeat] = []
    errors: list[BaseException] = []  # the seeds' failures, in the order they came
    try:
        for k, j, action in zip(seeds_cfg.seeds, jobs, actions):
            rng = SeedRNG()
            attempt = start(j, action, trainer_cls, stop=stop)
            rng.keep()  # right after the seed's trainer seeded and built everything
            seeds.append(SeedSeat(k, attempt, rng, errors))
    except BaseException:
        # A seed refused (its directory taken since the checks): those started before it leave nothing.
        close_each([s.attempt.abandon for s in seeds], quiet_as="a seed's start")
        raise
    closers = [s.attempt.close for s in seeds]
    try:
        result = train_seeds(seeds, stop, errors)
    except BaseException:
        close_each(closers, quiet_as="a seed's run")
        raise
    close_each(closers)
    return result


def close_each(closers: Iterable[Callable[[], object]], quiet_as: str | None = None) -> None:
    """Every closer called; then the first error raised, or with ``quiet_as`` (another on its way up) each logged."""
    errors = []
    for close in closers:
        try:
            close()
        except Exception as e:
            errors.append(e)
    if errors and quiet_as is None:
        raise errors[0]
    for e in errors:
        log.warning("closing %s failed: %s: %s", quiet_as, type(e).__name__, e)


def train_seeds(seeds: list[SeedSeat], stop: StopSignals, errors: list[BaseException]) -> JobResult:
    """The seeds' runs through the training loop; the first seed's failure raised once all are done."""
    skipped = {s.k: s.attempt.skip() for s in seeds if s.attempt.action == Action.SKIP}
    running = [s for s in seeds if s.attempt.action != Action.SKIP]
    with stop:
        for s in running:
            with s.turn():
                s.attempt.begin()
        train_together(running)
    if errors:
        raise errors[0]
    results = {**skipped, **{s.k: s.result for s in running}}
    stopped = any(r.stopped for r in results.values())
    return JobResult(
        seeds=results,
        stopped=stopped,
        signal=stop.requested if stopped else None,
        skipped=all(r.skipped for r in results.values()),
    )


class SeedSeat(Seat):
    """One seed in the loop: its started run, its generators; a failure recorded in its own directory."""

    def __init__(self, k: int, attempt: Attempt, rng: SeedRNG, errors: list[BaseException]):
        super().__init__(attempt.trainer, attempt.state)
        self.k, self.attempt, self.rng, self.errors = k, attempt, rng, errors
        self.result: JobResult | None = None

    @contextlib.contextmanager
    def turn(self, host: bool = True):
        """Its run directory current, its generators swapped in (``host``: numpy's and Python's too)."""
        token = CURRENT_RUN.set(self.attempt.rundir.path)
        try:
            with self.rng.active(host):
                yield
        finally:
            CURRENT_RUN.reset(token)

    def failed(self, e: BaseException) -> None:
        """Recorded in its own directory; the host generators left as they were (a gathered phase checks them)."""
        around = host_rng_state()
        with self.turn():
            self.attempt.fail(e)
            self.trainer.close()
        np.random.set_state(around[0])
        random.setstate(around[1])
        if isinstance(e, KeyboardInterrupt):
            raise e
        self.errors.append(e)

    def ended(self, outcome: Outcome) -> None:
        self.result = self.attempt.end(outcome)
        self.trainer.close()
