"""Several seeds of one configuration in one process (``seeds=[0,1,2,3,4]``), each in its own run directory with its
own env, buffer, agent and random generators, through the phases of ``Trainer.train`` in rounds: the seeds without a
burst in hand collect their next unit's episodes, the bursts run until one is over, and each seed whose burst is over
ends its unit (its rows, its evaluation when due, its checkpoint). On a CPU a seed's progress.csv is the one it
writes alone. On CUDA with ``train.cuda_graph`` the bursts run in joint rounds and the seeds' acting steps are
gathered (patches/016). A stop checkpoints every seed; one that fails is recorded in its directory, others go on."""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
from omegaconf import DictConfig

from ..acting_graph import ActingRunner
from ..compiling import compile_before_acting
from ..cuda_graph import UpdateRunner
from ..rng import HostRNG, SeedRNG, host_rng_state, same_host_rng
from ..rollout import NonFiniteAction, Rollout, play_all
from ..run.rundir import JobResult
from ..run.signals import StopSignals
from ..trainer import StopRequested, Trainer, update_bursts
from .plan import Action, job, seed_config, seed_dirs, validate
from .start import CURRENT_RUN, Attempt, checked, start

log = logging.getLogger("pomdp_ffm")


def run_seeds(cfg: DictConfig, job_dir: Path, trainer_cls: type[Trainer], stop: StopSignals) -> JobResult:
    seeds_cfg = validate(cfg)
    dirs = seed_dirs(job_dir, seeds_cfg.seed, list(seeds_cfg.seeds))
    jobs = [job(seed_config(cfg, k), d) for k, d in zip(seeds_cfg.seeds, dirs)]
    actions = [checked(j) for j in jobs]  # every directory checked before any is touched
    seeds: list[Seed] = []
    try:
        for k, j, action in zip(seeds_cfg.seeds, jobs, actions):
            rng = SeedRNG()
            attempt = start(j, action, trainer_cls, stop=stop)
            rng.keep()  # right after the seed's trainer seeded and built everything
            seeds.append(Seed(k, attempt, rng))
    except BaseException:
        # A seed refused (its directory taken since the checks): those started before it leave nothing.
        close_each([s.attempt.abandon for s in seeds], quiet_as="a seed's start")
        raise
    closers = [s.attempt.close for s in seeds]
    try:
        result = SeedAxis(seeds, stop).run()
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


def joint_runner(trainers: list[Trainer]) -> UpdateRunner | None:
    """One graph updating these seeds together (CUDA with ``train.cuda_graph``), or None: on a CPU a joint update
    would cost the same as turns, which keep each seed's own generators."""
    first = trainers[0]
    if len(trainers) < 2 or first.agent.device.type != "cuda" or not first.cfg.train.cuda_graph:
        return None
    return UpdateRunner([t.agent for t in trainers], cuda_graph=True, compile=first.updater.compiled)


def gathers(trainers: list[Trainer]) -> bool:
    """Whether the seeds' acting steps are gathered: each seed's submitted (from its own torch generators) before any
    is waited for, so that on CUDA with graphs the host launches one seed's step or steps its env while the GPU runs
    another's (on a CPU a submit computes it). numpy's and Python's generators are checked untouched
    (SharedRNGDrawn)."""
    return len(trainers) >= 2 and all(isinstance(t.acting, ActingRunner) for t in trainers)


class Playing(NamedTuple):
    """A seed's rollouts while gathered: where its next comes from, what to do when one ends, the one in play."""

    next: Callable[[], Rollout | None]
    ended: Callable[[Rollout], None]
    rollout: Rollout


@dataclass(eq=False)
class Seed:
    """One seed: its started run, generators, and while gathered its rollout in play and submitted acting step."""

    k: int
    attempt: Attempt
    rng: SeedRNG
    playing: Playing | None = None  # while its rollouts are gathered
    wait: Callable | None = None

    @property
    def trainer(self) -> Trainer:
        return self.attempt.trainer


class SharedRNGDrawn(RuntimeError):
    """A seed's gathered acting steps drew from numpy's or Python's global generator, which is not swapped."""


class SeedAxis:
    """The seeds' units of work in rounds, bursts joint and acting gathered where they can; a failure raised once all
    are done."""

    def __init__(self, seeds: list[Seed], stop: StopSignals):
        self.stop = stop
        self.results: dict[int, JobResult] = {s.k: s.attempt.skip() for s in seeds if s.attempt.action == Action.SKIP}
        self.errors: list[BaseException] = []
        self.running = [s for s in seeds if s.attempt.action != Action.SKIP]
        self.runners: dict[tuple[int, ...], UpdateRunner | None] = {}  # joint runners by their seeds: graphs kept
        self.gather = gathers([s.trainer for s in self.running])

    def run(self) -> JobResult:
        with self.stop:
            for s in self.running:
                with self.turn(s):
                    s.attempt.begin()
                    s.trainer.open(s.attempt.state)
            try:
                self.compile_update()
                while self.running:
                    self.collect([s for s in self.running if s.trainer.standing.burst is None])
                    self.end_units(self.updates(list(self.running)))
            except (StopRequested, KeyboardInterrupt) as e:
                for s in list(self.running):
                    if isinstance(e, KeyboardInterrupt):
                        with self.turn(s):
                            s.attempt.fail(KeyboardInterrupt())
                            s.trainer.close()
                        continue
                    with self.own_turn(s):  # a burst found diverged as it closes fails its seed
                        self.results[s.k] = s.attempt.end(s.trainer.stopped())
                        s.trainer.close()
                if isinstance(e, KeyboardInterrupt):
                    raise
        if self.errors:
            raise self.errors[0]
        stopped = any(r.stopped for r in self.results.values())
        return JobResult(
            seeds=self.results,
            stopped=stopped,
            signal=self.stop.requested if stopped else None,
            skipped=all(r.skipped for r in self.results.values()),
        )

    def compile_update(self) -> None:
        """``train.compile``: the update compiled before any seed's first episode (compiling.compile_before_acting),
        once: the seeds share one architecture, hence one set of compiled graphs. A failure fails every seed; a stop
        that came while it compiled is taken right after."""
        if not self.running:
            return
        try:
            with self.turn(self.running[0]):
                if compile_before_acting(self.running[0].trainer) and self.stop.requested is not None:
                    raise StopRequested
        except StopRequested:
            raise
        except Exception as e:
            for s in list(self.running):
                self.failed(s, e)

    def collect(self, seeds: list[Seed]) -> None:
        """These seeds' next units' episodes, then their bursts (``Trainer.collect``); where acting is gathered
        (not the initial pool's uniform draws), ``Trainer.collect``'s calls with the episodes played together."""
        gathered = [s for s in seeds if self.gather and s.trainer.standing.pool_done]
        for s in seeds:
            if s not in gathered:
                with self.own_turn(s):
                    s.trainer.collect()
        for s in gathered:  # every seed's stop check before any seed's episode: a checkpoint holds no half episode
            with self.own_turn(s, light=True):
                s.trainer.start_unit()
        self.act_together(
            [s for s in gathered if s in self.running], lambda s: (s.trainer.next_episode, s.trainer.store)
        )
        for s in gathered:
            if s in self.running:
                with self.own_turn(s):
                    s.trainer.start_burst()

    def updates(self, seeds: list[Seed]) -> list[Seed]:
        """The bursts in joint rounds until one is over, or each whole in its seed's turn where there is no joint
        runner (on a CPU); the seeds whose bursts are over."""
        pending = [s for s in seeds if not s.trainer.standing.burst_over]
        if pending:
            trainers, key = [s.trainer for s in pending], tuple(s.k for s in pending)
            try:
                with self.turn(pending[0]):
                    if key not in self.runners:
                        self.runners[key] = joint_runner(trainers)
                    if (runner := self.runners[key]) is not None:
                        update_bursts(trainers, runner)
            except BaseException as e:
                if isinstance(e, (StopRequested, KeyboardInterrupt)):
                    raise
                for s in pending:  # every seed in the joint update has failed
                    if s in self.running:
                        self.failed(s, e)
                return []
            if runner is None:
                for s in pending:
                    with self.own_turn(s):
                        update_bursts([s.trainer], s.trainer.updater)
            elif not any(s.trainer.standing.burst_over for s in pending):
                self.realign(pending)
        return [s for s in seeds if s in self.running and s.trainer.standing.burst_over]

    def end_units(self, seeds: list[Seed]) -> None:
        """The rest of these seeds' units after their bursts: rows, evaluations (gathered), checkpoints, ends."""
        due = {}
        for s in seeds:
            with self.own_turn(s):
                if (evaluation := s.trainer.end_burst()) is not None:
                    due[s.k] = evaluation
        playing = [s for s in seeds if s.k in due and s in self.running]
        if self.gather:
            self.act_together(playing, lambda s: (due[s.k].next, due[s.k].ended))
        for s in seeds:
            if s in self.running:
                with self.own_turn(s):
                    if s.k in due:
                        if not self.gather:
                            play_all(due[s.k].next, due[s.k].ended)
                        s.trainer.evaluated(due[s.k])
                    self.finish_if_done(s)

    def realign(self, pending: list[Seed]) -> None:
        """Seeds parted by a policy delay d: each takes alone the fewest updates that bring all counts to one
        remainder mod d. A seed so moved stays that many updates ahead in its bursts (no longer gathered)."""
        d = pending[0].trainer.agent.algo.policy_delay
        phases = [s.trainer.agent.num_updates % d for s in pending]
        target = min(range(d), key=lambda p: (sum((p - q) % d for q in phases), (p - phases[0]) % d))
        for s, q in zip(pending, phases):
            if (target - q) % d != 0:
                with self.own_turn(s):
                    update_bursts([s.trainer], s.trainer.updater, limit=(target - q) % d)  # or to its burst's end

    @contextlib.contextmanager
    def turn(self, s: Seed, host: bool = True):
        """Seed s's turn: its run directory current, its generators swapped in."""
        token = CURRENT_RUN.set(s.attempt.rundir.path)
        try:
            with s.rng.active(host):
                yield
        finally:
            CURRENT_RUN.reset(token)

    @contextlib.contextmanager
    def own_turn(self, s: Seed, light: bool = False):
        """Seed s's turn, where an error is its own failure; a stop goes up. ``light``: only torch's generators."""
        try:
            with self.turn(s, host=not light):
                yield
        except StopRequested:
            raise
        except BaseException as e:
            self.failed(s, e)

    def failed(self, s: Seed, e: BaseException) -> None:
        """Recorded in its own directory; the host generators left as they were (a gathered phase checks them)."""
        around = host_rng_state()
        with self.turn(s):
            if isinstance(e, NonFiniteAction):  # the seed's divergence, its checkpoint saved as Trainer.train does
                try:
                    s.trainer.diverged(e)
                except Exception as diverged:  # (TrainingDiverged; or the checkpoint's write failed: Unwritable)
                    e = diverged
            s.attempt.fail(e)
            s.trainer.close()
        np.random.set_state(around[0])
        random.setstate(around[1])
        self.running.remove(s)
        if isinstance(e, KeyboardInterrupt):
            raise e
        self.errors.append(e)

    def finish_if_done(self, s: Seed) -> None:
        t = s.trainer
        if t.standing.burst is None and t.standing.env_steps >= t.budget:
            self.results[s.k] = s.attempt.end(t.finished())
            t.close()
            self.running.remove(s)

    def act_together(self, seeds: list[Seed], plan: Callable[[Seed], tuple[Callable, Callable]]) -> None:
        """Each seed's rollouts in lockstep, one after another (``plan(s)``: its ``next`` and ``ended``): every
        seed's acting step submitted before any is waited for, in turns that swap torch's generators only (a full
        turn costs more than a GPU acting step); numpy's and Python's are checked untouched after."""
        before = host_rng_state()
        for s in seeds:
            with self.own_turn(s, light=True):
                self._next_rollout(s, *plan(s))
        while live := [s for s in seeds if s in self.running and s.playing is not None]:
            for s in live:  # the acting steps in; envs in worker processes step from here
                with self.own_turn(s, light=True):
                    wait, s.wait = s.wait, None
                    s.playing.rollout.send(wait())
            for s in live:
                if s in self.running:
                    with self.own_turn(s, light=True):
                        next_rollout, ended, rollout = s.playing
                        rollout.receive()
                        if not rollout.done:
                            s.wait = rollout.submit()
                        else:
                            ended(rollout)
                            self._next_rollout(s, next_rollout, ended)
        for s in seeds:
            s.playing = s.wait = None
        self.untouched(before, seeds)

    @staticmethod
    def _next_rollout(s: Seed, next_rollout: Callable[[], Rollout | None], ended: Callable) -> None:
        s.playing = None
        if (rollout := next_rollout()) is not None:
            s.playing, s.wait = Playing(next_rollout, ended, rollout), rollout.submit()

    def untouched(self, before: HostRNG, seeds: list[Seed]) -> bool:
        """If the host generators moved in the gathered phase, all its seeds fail (which one drew cannot be told)."""
        if same_host_rng(before, host_rng_state()):
            return True
        e = SharedRNGDrawn(
            "the seeds' gathered acting steps (or their envs, or what follows them) drew from "
            "numpy's or Python's global random generator, which gathering does not keep apart "
            "per seed: the seeds' runs would not be their own"
        )
        for s in seeds:
            if s in self.running:
                self.failed(s, e)
        return False
