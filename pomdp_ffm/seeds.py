"""Several seeds of one configuration in one process (``seeds=[0,1,2,3,4]``), each in its own run directory, taking
turns of one unit of work with their own env, buffer, agent and generators: on a CPU a seed's progress.csv is the one
it writes alone. On CUDA with ``train.cuda_graph`` their bursts run jointly and their acting steps are gathered
(joint.py, patches/016). A stop checkpoints every seed; one that fails is recorded in its directory, others go on."""
from __future__ import annotations

import contextlib
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
from omegaconf import DictConfig, OmegaConf

from .joint import JointActs, JointBursts, SeedRNG, same_host_rng
from .rollout import ActRequest, EnvsStepping, Work
from .rundir import RunDir, RunDirError
from .signals import StopSignals
from .start import (CURRENT_RUN, Attempt, Refused, check_and_lock, check_untouched, seed_config, seed_dirs,
                    validate)
from .trainer import Burst, StopRequested, Trainer, host_rng_state

log = logging.getLogger("pomdp_ffm")


def run_seeds(cfg: DictConfig, job_dir: Path, trainer_cls: type[Trainer] = Trainer) -> dict:
    run_cfg = validate(cfg)
    dirs = seed_dirs(job_dir, run_cfg.seed, list(run_cfg.seeds))
    cfgs = [seed_config(cfg, k) for k in run_cfg.seeds]
    # Every directory checked before any is touched: a refusal writes nothing, not even a lock file.
    for c, d in zip(cfgs, dirs):
        try:
            check_untouched(RunDir(d), validate(c), OmegaConf.to_container(c, resolve=True))
        except RunDirError as e:
            raise Refused(str(e)) from None
    held = _HeldStop(StopSignals())
    seeds: list[Seed] = []
    try:
        for k, c, d in zip(run_cfg.seeds, cfgs, dirs):
            rng = SeedRNG()
            attempt = check_and_lock(c, d, trainer_cls, stop=held, host_rng=rng.host_state)
            rng.keep()  # right after the seed's trainer seeded and built everything
            seeds.append(Seed(k, attempt, rng))
    except BaseException:
        # A seed refused under its lock (its directory taken since the checks): those locked before leave nothing.
        close_each([s.attempt.abandon for s in seeds], quiet_as="a seed's start")
        raise
    closers = [s.attempt.close for s in seeds]
    try:
        result = SeedAxis(seeds, held.stop, held).run()
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


@dataclass(eq=False)
class Seed:
    """One seed: its started run, generators, unit of work in hand, and submitted acting step while gathered."""

    k: int
    attempt: Attempt
    rng: SeedRNG
    work: Work | None = None
    wait: Callable | None = None

    @property
    def trainer(self) -> Trainer:
        return self.attempt.trainer


class SharedRNGDrawn(RuntimeError):
    """A seed's gathered acting steps drew from numpy's or Python's global generator, which is not swapped."""


class _HeldStop:
    """The trainers' view of the stop signals: none while held (seeds suspended inside episodes, which a
    checkpoint cannot hold); the axis acts on it once they are at their bursts or ends of their units."""

    def __init__(self, stop: StopSignals):
        self.stop, self.held = stop, False

    @property
    def requested(self) -> int | None:
        return None if self.held else self.stop.requested

    def request(self, signum: int) -> None:
        self.stop.request(signum)

    @contextlib.contextmanager
    def holding(self, held: bool):
        self.held = held
        try:
            yield
        finally:
            self.held = False


def _gathered(item) -> bool:
    """What gathered acting leaves suspended while it turns to the other seeds."""
    return (isinstance(item, ActRequest) and item.by_agent) or isinstance(item, EnvsStepping)


class SeedAxis:
    """Units of work in turns, bursts joint and acting gathered where they can; a failure raised once all are done."""

    def __init__(self, seeds: list[Seed], stop: StopSignals, held: _HeldStop):
        self.stop, self.held = stop, held
        self.results: dict[int, dict] = {s.k: s.attempt.skip() for s in seeds if s.attempt.action == "skip"}
        self.errors: list[BaseException] = []
        self.running = [s for s in seeds if s.attempt.action != "skip"]
        self.joint = JointBursts()
        self.gather = JointActs().applies([s.trainer for s in self.running])
        self.at_burst: dict[int, Seed] = {}  # the seeds suspended at their bursts, between two joint phases
        # Gathered units are suspended inside episodes and evaluations: a stop is acted on between rounds.
        self.up_to_burst = lambda it: isinstance(it, Burst) or (self.gather and _gathered(it))
        self.after_burst = _gathered if self.gather else None

    def run(self) -> dict:
        with self.stop:
            for s in self.running:
                with self.turn(s):
                    s.attempt.begin()
                    s.trainer.open(s.attempt.state)
            try:
                self.finish_alone()
                while self.running:
                    self.round()
            except (StopRequested, KeyboardInterrupt) as e:
                self.release(type(e)(), list(self.at_burst.values()))
                for s in self.running:
                    with self.turn(s):
                        if isinstance(e, StopRequested):
                            self.results[s.k] = s.attempt.end(s.trainer.stopped())
                        else:
                            s.attempt.fail(KeyboardInterrupt())
                        s.trainer.close()
                if isinstance(e, KeyboardInterrupt):
                    raise
        if self.errors:
            raise self.errors[0]
        stopped = any(r.get("stopped") for r in self.results.values())
        return {"seeds": self.results, "stopped": stopped, "signal": self.stop.requested if stopped else None,
                "stop": self.stop, "skipped": all(r.get("skipped") for r in self.results.values())}

    def finish_alone(self) -> None:
        """Seeds a stop left mid-burst after a joint phase finish that unit alone first, as without the stop."""
        for s in list(self.running):
            if (s.trainer.counters.burst or {}).get("alone"):
                with self.own_turn(s):
                    s.trainer.step()
                    self.finish_if_done(s)

    def round(self) -> None:
        """Every seed to its burst, then the bursts together until one is over (without a joint runner: turns)."""
        self.to_bursts([s for s in self.running if s.k not in self.at_burst])
        pending = [self.at_burst[s.k] for s in self.running if s.k in self.at_burst]
        if not pending:
            return
        try:
            with self.turn(pending[0]):
                together = self.joint.run([s.k for s in pending], [s.trainer for s in pending],
                                          [s.work.item for s in pending])
        except BaseException as e:
            self.updates_failed(e, pending)  # every seed in the joint update has failed
            return
        if not together:
            for s in pending:
                s.work.item.state["alone"] = True  # after a stop, resumed alone before any seed goes on
            self.past_bursts(pending)
            return
        if not any(s.work.item.done >= s.work.item.n for s in pending):
            self.realign(pending)
        self.past_bursts([s for s in pending if s.k in self.at_burst and s.work.item.done >= s.work.item.n])

    @contextlib.contextmanager
    def turn(self, s: Seed, host: bool = True):
        """Seed s's turn: its run directory current, its generators swapped in."""
        token = CURRENT_RUN.set(s.attempt.run.path)
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
        if t.counters.env_steps >= t.budget:
            self.results[s.k] = s.attempt.end(t.finished())
            t.close()
            self.running.remove(s)

    def live(self, seeds: list[Seed]) -> list[Seed]:
        return [s for s in seeds if s in self.running and s.work.item is not None]

    def to_bursts(self, seeds: list[Seed]) -> None:
        """These seeds' next units of work, each up to its burst (a unit without one is followed by the next)."""
        while seeds:
            if self.gather and self.stop.requested is not None:
                raise StopRequested
            fresh: list[Seed] = []
            with self.held.holding(self.gather):
                try:
                    for s in seeds:
                        with self.own_turn(s):
                            s.work = Work(s.trainer.step_parts())
                            if s.work.run(self.up_to_burst) is None:
                                self.finish_if_done(s)
                            else:
                                fresh.append(s)
                except StopRequested:  # not gathered: the seeds before this one are at their bursts
                    self.release(StopRequested(), self.live(fresh))
                    raise
                if self.gather:
                    self.act_together(fresh, self.up_to_burst)
            self.at_burst.update({s.k: s for s in self.live(fresh)})
            seeds = [s for s in self.running if s.k not in self.at_burst]

    def past_bursts(self, ended: list[Seed]) -> None:
        """The rest of these units of work, after their bursts."""
        for s in ended:
            self.at_burst.pop(s.k, None)
        with self.held.holding(self.gather):
            for i, s in enumerate(ended):
                try:
                    with self.own_turn(s):
                        if s.work.run(self.after_burst) is None:
                            self.finish_if_done(s)
                except StopRequested:
                    self.release(StopRequested(), self.live(ended[i + 1:]))
                    raise
            if self.gather:
                self.act_together(ended, self.after_burst)
        self.at_burst.update({s.k: s for s in self.live(ended)})

    def realign(self, pending: list[Seed]) -> None:
        """Seeds parted by a policy delay d: each takes alone the fewest updates that bring all counts to one
        remainder mod d. A seed so moved stays that many updates ahead in its bursts (no longer gathered)."""
        d = pending[0].trainer.agent.algo.policy_delay
        phases = [s.trainer.agent.num_updates % d for s in pending]
        target = min(range(d), key=lambda p: (sum((p - q) % d for q in phases), (p - phases[0]) % d))
        for s, q in zip(pending, phases):
            if (target - q) % d == 0:
                continue
            try:
                with self.turn(s):
                    s.trainer.run_updates(s.work.item, limit=(target - q) % d)  # or to its burst's end
            except BaseException as e:
                self.updates_failed(e, [s])

    def release(self, e: BaseException, of: list[Seed]) -> None:
        """Thrown into these suspended units, each burst recording how far it got (a divergence then fails its seed)."""
        for s in of:
            self.at_burst.pop(s.k, None)
            if s not in self.running:
                continue
            try:
                with self.turn(s):
                    s.work.throw(e)
            except BaseException as raised:
                if raised is not e and not isinstance(raised, type(e)):
                    self.failed(s, raised)

    def updates_failed(self, e: BaseException, of: list[Seed]) -> None:
        """Thrown into each unit; a stop or an interrupt goes up, any other error fails each seed."""
        self.release(e, of)
        if isinstance(e, (StopRequested, KeyboardInterrupt)):
            raise e
        for s in of:
            if s in self.running:
                self.failed(s, e)

    def act_together(self, seeds: list[Seed], until) -> None:
        """Gathered items answered (all steps submitted before any is waited for) until each is at another or ended."""
        before = host_rng_state()
        for s in self.live(seeds):
            if _gathered(s.work.item):
                with self.own_turn(s, light=True):
                    s.wait = s.work.item.submit()
        while waiting := [s for s in self.live(seeds) if s.wait is not None]:
            for s in waiting:
                if s not in self.running:
                    continue
                with self.own_turn(s, light=True):
                    answer, s.wait = s.wait, None
                    s.work.send(answer)
                    if s.work.run(until) is None:
                        if self.untouched(before, seeds):  # checked before a seed finishes (its DONE would stand)
                            self.finish_if_done(s)
                    elif _gathered(s.work.item):
                        s.wait = s.work.item.submit()
        self.untouched(before, seeds)

    def untouched(self, before: tuple, seeds: list[Seed]) -> bool:
        """If the host generators moved in the gathered phase, all its seeds fail (which one drew cannot be told)."""
        if same_host_rng(before, host_rng_state()):
            return True
        e = SharedRNGDrawn("the seeds' gathered acting steps (or their envs, or what follows them) drew from "
                               "numpy's or Python's global random generator, which gathering does not keep apart "
                               "per seed: the seeds' runs would not be their own")
        for s in seeds:
            if s in self.running:
                self.failed(s, e)
        return False
