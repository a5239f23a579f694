"""Several seeds of one configuration in one process: ``python -m pomdp_ffm.train ... seeds=[0,1,2,3,4]``.

Each seed has its own run directory with the usual layout (config.yaml with its own seed, progress.csv,
checkpoints, DONE), so analysis, resume, skip-finished and the paper grid treat it as any other run. The job's
directory is the first seed's; the others are its siblings (``start.seed_dirs``).

The seeds take turns, one unit of work each (the random pool, or one iteration: an episode, its updates and
maybe an evaluation), each with its own env, buffer, agent and random generators: torch's, numpy's and Python's global
generators are swapped in and out at every turn. On a CPU a seed so draws exactly what it draws alone and its
progress.csv is the same (tests/test_seeds.py). On CUDA with ``train.cuda_graph`` the seeds' bursts of updates
run together (``joint.JointBursts``: one graph for all the seeds' updates, patches/016-seed-axis-on-cuda.md): in
rounds of one update per seed, until a seed's burst is over; that seed goes on with its unit of work up to its
next burst, while the others wait mid-burst, and the rounds go on. The seeds' acting steps are gathered too
(``joint.JointActs``: every seed's step submitted, each from its own random generators, before any is waited for),
among the seeds whose bursts ended together. A stop signal checkpoints every seed (with gathered acting, once the
gathered seeds are at their bursts or at the end of their units of work; with joint rounds, the others
mid-burst); a seed that diverges or fails is recorded in its own directory and the others go on.
"""
from __future__ import annotations

import contextlib
import logging
import random
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
from omegaconf import DictConfig, OmegaConf

from .burst import Burst
from .checkpoint import host_rng_state
from .joint import JointActs, JointBursts, SeedRNG, same_host_rng
from .rollout import ActRequest, EnvsStepping, Work
from .rundir import RunDir, RunDirError
from .signals import StopSignals
from .start import CURRENT_RUN, Attempt, Refused, check_and_lock, check_untouched, seed_dirs, validate
from .trainer import StopRequested, Trainer

log = logging.getLogger("pomdp_ffm")


def run_seeds(cfg: DictConfig, job_dir: Path, trainer_cls: type[Trainer] = Trainer) -> dict:
    run_cfg = validate(cfg)
    dirs = seed_dirs(job_dir, run_cfg.seed, list(run_cfg.seeds))
    cfgs = []
    for k in run_cfg.seeds:
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
    stop = StopSignals()
    held = _HeldStop(stop)
    seeds: list[Seed] = []
    try:
        for k, c, d in zip(run_cfg.seeds, cfgs, dirs):
            rng = SeedRNG()
            attempt = check_and_lock(c, d, trainer_cls, stop=held, host_rng=rng.host_state)
            rng.keep()  # right after the seed's trainer seeded and built everything
            seeds.append(Seed(k, attempt, rng))
    except BaseException:
        # A seed refused under its lock (another process took its directory since the checks above): the seeds
        # locked before it leave nothing either.
        close_each([types.SimpleNamespace(close=s.attempt.abandon) for s in seeds], quiet_as="a seed's start")
        raise
    attempts = [s.attempt for s in seeds]
    try:
        result = SeedAxis(seeds, stop, held).run()
    except BaseException:
        close_each(attempts, quiet_as="a seed's run")
        raise
    close_each(attempts)
    return result


def close_each(things: Iterable, quiet_as: str | None = None) -> None:
    """Close every one of ``things``, each whatever the others do. The first error is raised after, or, where
    another error is already on its way up, each is logged as closing ``quiet_as`` failing."""
    errors = []
    for thing in things:
        try:
            thing.close()
        except Exception as e:
            errors.append(e)
    if errors and quiet_as is None:
        raise errors[0]
    for e in errors:
        log.warning("closing %s failed: %s: %s", quiet_as, type(e).__name__, e)


@dataclass(eq=False)
class Seed:
    """One seed of the axis: its started run, its generators, and its unit of work in hand (``Trainer.step_parts``
    driven by ``rollout.Work``), with its submitted acting step (``wait``) while gathered."""

    k: int
    attempt: Attempt
    rng: SeedRNG
    work: Work | None = None
    wait: Callable | None = None

    @property
    def trainer(self) -> Trainer:
        return self.attempt.trainer


class SharedRNGDrawn(RuntimeError):
    """A seed's gathered acting steps drew from numpy's or Python's global generator, which they do not swap."""


class _HeldStop:
    """The trainers' view of the job's stop signals. While held (seeds suspended inside their episodes or
    evaluations, which a checkpoint cannot hold), a trainer sees no signal; the axis acts on it once they are
    at their bursts (or at the end of their units of work)."""

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


def _is_burst(item) -> bool:
    return isinstance(item, Burst)


def _gathered(item) -> bool:
    """What gathered acting leaves suspended while it turns to the other seeds: an acting step of the agent,
    or envs stepping in their worker processes."""
    return (isinstance(item, ActRequest) and item.by_agent) or isinstance(item, EnvsStepping)


class SeedAxis:
    """The seeds' units of work, taken in turns up to their bursts of updates, the bursts run together where a
    joint runner can (``JointBursts``), and the acting steps gathered where ``JointActs`` applies. A seed's
    results go to ``results``, its failure to ``errors`` (raised once the others are done)."""

    def __init__(self, seeds: list[Seed], stop: StopSignals, held: _HeldStop):
        self.stop, self.held = stop, held
        self.results: dict[int, dict] = {}
        self.errors: list[BaseException] = []
        self.running: list[Seed] = []
        for s in seeds:
            if s.attempt.action == "skip":
                self.results[s.k] = s.attempt.skip()
            else:
                self.running.append(s)
        self.joint = JointBursts()
        self.gather = JointActs().applies([s.trainer for s in self.running])
        # Each running seed whose unit of work is suspended at its burst of updates, between two joint phases.
        self.at_burst: dict[int, Seed] = {}
        # With gathered acting, the seeds' units are suspended inside episodes and evaluations: a stop signal is
        # held until every unit is over, and acted on between rounds.
        self.up_to_burst = (lambda it: _is_burst(it) or _gathered(it)) if self.gather else _is_burst
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
            except StopRequested:
                self.release(StopRequested(), list(self.at_burst.values()))
                for s in self.running:
                    with self.turn(s):
                        self.results[s.k] = s.attempt.end(s.trainer.stopped())
                        s.trainer.close()
            except KeyboardInterrupt:
                self.release(KeyboardInterrupt(), list(self.at_burst.values()))
                for s in self.running:
                    with self.turn(s):
                        s.attempt.fail(KeyboardInterrupt())
                        s.trainer.close()
                raise
        if self.errors:
            raise self.errors[0]
        stopped = any(r.get("stopped") for r in self.results.values())
        return {"seeds": self.results, "stopped": stopped, "signal": self.stop.requested if stopped else None,
                "stop": self.stop, "skipped": all(r.get("skipped") for r in self.results.values())}

    def finish_alone(self) -> None:
        """A stop in the seeds' own turns after a joint phase left some seeds mid-burst and the others done with
        that unit of work: the former finish it alone first, as they would have without the stop."""
        for s in list(self.running):
            burst = s.trainer.counters.burst
            if burst is not None and burst.get("alone"):
                with self.own_turn(s):
                    s.trainer.step()
                    self.finish_if_done(s)

    def round(self) -> None:
        """Every seed to its burst (those whose last burst is over go on with their next unit of work), then the
        bursts together until one is over, whose seed then goes on; without a joint runner, each burst alone in
        its seed's turn."""
        self.to_bursts([s for s in self.running if s.k not in self.at_burst])
        pending = [self.at_burst[s.k] for s in self.running if s.k in self.at_burst]
        if not pending:
            return
        try:
            with self.turn(pending[0]):
                together = self.joint.run([s.k for s in pending], [s.trainer for s in pending],
                                          [s.work.item for s in pending])
        except BaseException as e:
            self.updates_failed(e, pending)  # the joint update failed: every seed in it has
            return
        if not together:
            for s in pending:
                # After a stop, what is left of it resumes alone, before any seed goes on.
                s.work.item.state["alone"] = True
            self.past_bursts(pending)
            return
        if not any(s.work.item.done >= s.work.item.n for s in pending):
            self.realign(pending)
        self.past_bursts([s for s in pending if s.k in self.at_burst and s.work.item.done >= s.work.item.n])

    # --- turns ------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def turn(self, s: Seed, host: bool = True):
        """Seed s's turn: its run directory current, its generators swapped in (``host``: numpy's and Python's
        too, SeedRNG.active)."""
        token = CURRENT_RUN.set(s.attempt.run.path)
        try:
            with s.rng.active(host):
                yield
        finally:
            CURRENT_RUN.reset(token)

    @contextlib.contextmanager
    def own_turn(self, s: Seed, light: bool = False):
        """Seed s's turn, where an error is that seed's failure (the others go on); a stop goes up. ``light``:
        only torch's generators swapped (a gathered acting step)."""
        try:
            with self.turn(s, host=not light):
                yield
        except StopRequested:
            raise
        except BaseException as e:
            self.failed(s, e)

    def failed(self, s: Seed, e: BaseException) -> None:
        """This seed's failure, recorded in its own directory; the others go on. numpy's and Python's global
        generators are left as they were (a gathered phase checks them)."""
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

    # --- units of work ----------------------------------------------------------------------------------------
    def to_bursts(self, seeds: list[Seed]) -> None:
        """These seeds' next units of work, each up to its burst (kept in ``at_burst``): in their turns, or with
        their acting steps gathered. A unit that ends without one is followed by the seed's next."""
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
        """The rest of these units of work, after their bursts (what is left of a burst, alone; an evaluation)."""
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
        self.at_burst.update({s.k: s for s in self.live(ended)})  # a unit with a burst after its burst (none has)

    def realign(self, pending: list[Seed]) -> None:
        """Seeds whose update counts part them at a policy delay d (a checkpoint from another schedule): each
        takes, alone, the updates that bring its count to the same remainder mod d as the others' (the remainder
        that the fewest such updates reach), so they agree on the actor step from then on. A seed so moved stays
        that many updates ahead in its bursts: where episodes have one length it ends each burst, and collects,
        that many rounds before the others, no longer gathered with them."""
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
        """A stop or an error going up through these suspended units: each burst records how far it got (an error
        of its seed's own raised on the way, a divergence found as its burst closes, is that seed's failure)."""
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
        """An error raised by these suspended units' updates, thrown into each (its burst records how far it
        got): a stop or an interrupt goes up, any other error is each seed's failure."""
        self.release(e, of)
        if isinstance(e, (StopRequested, KeyboardInterrupt)):
            raise e
        for s in of:
            if s in self.running:
                self.failed(s, e)

    # --- gathered acting --------------------------------------------------------------------------------------
    def act_together(self, seeds: list[Seed], until) -> None:
        """The seeds' gathered items, seed by seed: an acting step submitted, then waited for; envs stepping in
        workers left to step while the other seeds go on. Until every unit is at an item that is neither (or
        has ended)."""
        before = host_rng_state()
        for s in self.live(seeds):
            if _gathered(s.work.item):
                with self.own_turn(s, light=True):
                    self.submit(s)
        while True:
            waiting = [s for s in self.live(seeds) if s.wait is not None]
            if not waiting:
                break
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
                        self.submit(s)
        self.untouched(before, seeds)

    def submit(self, s: Seed) -> None:
        """Seed s's acting step started (the envs stepping in workers need nothing started); ``s.wait`` waits for
        it. Both charged to the step's acting time."""
        item, clock = s.work.item, time.perf_counter
        if isinstance(item, EnvsStepping):
            s.wait = item.answer
            return
        t0 = clock()
        wait = item.submit()
        item.charge(clock() - t0)

        def answer():
            t1 = clock()
            try:
                return wait()
            finally:
                item.charge(clock() - t1)
        s.wait = answer

    def untouched(self, before: tuple, seeds: list[Seed]) -> bool:
        """numpy's and Python's global generators as the gathered phase found them (``before``); if not, every seed
        of the phase still running fails (which of them drew cannot be told)."""
        if same_host_rng(before, host_rng_state()):
            return True
        e = SharedRNGDrawn("the seeds' gathered acting steps (or their envs, or what follows them) drew from "
                               "numpy's or Python's global random generator, which gathering does not keep apart "
                               "per seed: the seeds' runs would not be their own")
        for s in seeds:
            if s in self.running:
                self.failed(s, e)
        return False
