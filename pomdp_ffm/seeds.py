"""Several seeds of one configuration in one process: ``python -m pomdp_ffm.train ... seeds=[0,1,2,3,4]``.

Each seed has its own run directory with the usual layout (config.yaml with its own seed, progress.csv,
checkpoints, DONE), so analysis, resume, skip-finished and the paper grid treat it as any other run. The job's
directory is the first seed's; the others are its siblings, named by replacing the path component
``seed-<first>`` with ``seed-<k>`` (the presets' ``.../seed-${seed}`` layout).

The seeds take turns, one unit of work each (the random pool, or one iteration: an episode, its updates and
maybe an evaluation), each with its own env, buffer, agent and RNG streams: torch's, numpy's and Python's global
generators are swapped in and out at every turn. On a CPU a seed so draws exactly what it draws alone and its
progress.csv is the same (tests/test_seeds.py). On CUDA with ``train.cuda_graph`` the seeds' bursts of updates
run together (``JointBursts``: one graph for all the seeds' updates, patches/016-seed-axis-on-cuda.md). A stop
signal checkpoints every seed; a seed that diverges or fails is recorded in its own directory and the others go
on.
"""
from __future__ import annotations

import contextlib
import random
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from .rundir import CURRENT_RUN, RunDir, RunDirError
from .signals import StopSignals
from .train import Attempt, Refused, check_and_lock, check_untouched, validate
from .graph import UpdateRunner
from .trainer import Burst, Trainer, _StopRequested


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


def joint_runner(trainers: list[Trainer]) -> UpdateRunner | None:
    """The runner that updates these seeds together, or None to update them one after another: on CUDA with
    ``train.cuda_graph``, one graph with a branch per seed (pomdp_ffm/graph.py). On a CPU a joint update would
    be the same updates in turn, at the same cost, so the seeds keep their own turns and RNG streams there."""
    if len(trainers) < 2:
        return None
    first = trainers[0]
    if first.agent.device.type != "cuda" or not first.cfg.train.cuda_graph:
        return None
    return UpdateRunner([t.agent for t in trainers], cuda_graph=True)


class JointBursts:
    """The bursts of updates of several seeds, run together where they can be: in rounds of one update per seed
    through one joint runner, as long as every seed takes the same host path (the gradient-norm diagnostics at a
    burst's last update; a TD3 policy delay). What is left of each burst (bursts of different lengths, after
    episodes of different lengths) runs in the seed's own turn. The joint rounds draw their random numbers (SAC's
    and TD3's update noise on the GPU) from the lead seed's streams: a seed in a joint axis is no longer the run
    it is alone (patches/016-seed-axis-on-cuda.md), though each update is the seed's own."""

    def __init__(self, make_runner=None):
        self.make_runner = make_runner  # default: joint_runner
        self._runners: dict[tuple[int, ...], UpdateRunner | None] = {}

    def run(self, seeds: list[int], trainers: list[Trainer], bursts: list[Burst]) -> None:
        key = tuple(seeds)
        if key not in self._runners:  # one per set of seeds that has run together (their graphs are kept)
            self._runners[key] = (self.make_runner or joint_runner)(trainers)
        runner = self._runners[key]
        if runner is None:
            return
        remaining = [b.n - b.done for b in bursts]
        # the last update of a burst logs gradient norms: a joint round only where all seeds agree on that
        rounds = remaining[0] if len(set(remaining)) == 1 else min(remaining) - 1
        clock, S = time.perf_counter, len(trainers)
        for _ in range(rounds):
            if len({t.agent.actor_step_due() for t in trainers}) > 1:
                break  # a TD3 policy delay parts the seeds here (their update counts differ)
            trainers[0]._check_stop()
            t_s = clock()
            batches = [t.sample_batch() for t in trainers]
            t_u = clock()
            stats = runner.update_all(batches, grad_norms=bursts[0].done == bursts[0].n - 1)
            t_e = clock()
            for t, b, st in zip(trainers, bursts, stats):
                # each seed is charged its share of the joint round
                t.timers.update(sample=(t_u - t_s) / S, update=(t_e - t_u) / S)
                b.add(st)


def _train_together(seeds: list[int], attempts: list[Attempt], streams: dict[int, RNGStreams],
                    joint: JointBursts | None = None) -> dict:
    results: dict[int, dict] = {}
    errors: list[BaseException] = []
    running = []
    joint = joint if joint is not None else JointBursts()
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

    def failed(k: int, a: Attempt, e: BaseException) -> None:
        """This seed's failure, recorded in its own directory; the others go on."""
        with turn(k, a):
            a.fail(e)
            a.trainer.shut()
        running.remove((k, a))
        if isinstance(e, KeyboardInterrupt):
            raise e
        errors.append(e)

    @contextlib.contextmanager
    def own_turn(k: int, a: Attempt):
        """Seed k's turn, where an error is that seed's failure (the others go on); a stop goes up."""
        try:
            with turn(k, a):
                yield
        except _StopRequested:
            raise
        except BaseException as e:
            failed(k, a, e)

    def stepped(k: int, a: Attempt) -> None:
        if a.trainer.counters.env_steps >= a.trainer.budget:
            results[k] = a.end(a.trainer.finished())
            a.trainer.shut()
            running.remove((k, a))

    with StopSignals() as stop:
        for k, a in running:
            with turn(k, a):
                a.begin()
                a.trainer.stop = stop
                a.trainer.open(a.state)
        try:
            # A stop in the seeds' own turns after a joint phase left some seeds mid-burst and the others done
            # with that unit of work: the former finish it alone first, as they would have without the stop.
            for k, a in list(running):
                burst = a.trainer.counters.burst
                if burst is not None and burst.get("alone"):
                    with own_turn(k, a):
                        a.trainer.step()
                        stepped(k, a)
            while running:
                # Each seed's unit of work up to its burst of updates (if any), in its turn.
                pending = []
                try:
                    for k, a in list(running):
                        with own_turn(k, a):
                            parts = a.trainer.step_parts()
                            burst = next(parts, None)
                            if burst is None:
                                stepped(k, a)
                            else:
                                pending.append((k, a, parts, burst))
                except _StopRequested:
                    for k, a, parts, _ in pending:  # their bursts record that nothing ran
                        _throw_into(k, a, parts, _StopRequested(), turn, failed)
                    raise
                # The bursts together, as far as they can go; then the rest of each seed's unit, in its turn.
                if pending:
                    k0, a0 = pending[0][:2]
                    try:
                        with turn(k0, a0):
                            joint.run([p[0] for p in pending], [p[1].trainer for p in pending],
                                      [p[3] for p in pending])
                        for p in pending:
                            # Its joint part is over: after a stop, it resumes alone, before any seed goes on.
                            p[3].state["alone"] = True
                    except BaseException as e:
                        for k, a, parts, _ in pending:
                            _throw_into(k, a, parts, e, turn, failed)
                        if isinstance(e, (_StopRequested, KeyboardInterrupt)):
                            raise
                        for k, a, _, _ in pending:  # the joint update failed: every seed in it has
                            if (k, a) in running:
                                failed(k, a, e)
                        continue
                    for i, (k, a, parts, burst) in enumerate(pending):
                        try:
                            with own_turn(k, a):
                                a.trainer.drive(parts, burst)
                                stepped(k, a)
                        except _StopRequested:
                            for k2, a2, parts2, _ in pending[i + 1:]:
                                _throw_into(k2, a2, parts2, _StopRequested(), turn, failed)
                            raise
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


def _throw_into(k, a, parts, e: BaseException, turn, failed) -> None:
    """Stop a seed's suspended unit of work with ``e`` (its burst records how far it got); an error of its own
    raised on the way (a divergence found as its burst closes) is that seed's failure."""
    try:
        with turn(k, a):
            parts.throw(e)
    except StopIteration:
        pass
    except BaseException as raised:
        if raised is not e and not isinstance(raised, type(e)):
            failed(k, a, raised)
