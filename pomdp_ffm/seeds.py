"""Several seeds of one configuration in one process: ``python -m pomdp_ffm.train ... seeds=[0,1,2,3,4]``.

Each seed has its own run directory with the usual layout (config.yaml with its own seed, progress.csv,
checkpoints, DONE), so analysis, resume, skip-finished and the paper grid treat it as any other run. The job's
directory is the first seed's; the others are its siblings, named by replacing the path component
``seed-<first>`` with ``seed-<k>`` (the presets' ``.../seed-${seed}`` layout).

The seeds take turns, one unit of work each (the random pool, or one iteration: an episode, its updates and
maybe an evaluation), each with its own env, buffer, agent and RNG streams: torch's, numpy's and Python's global
generators are swapped in and out at every turn. On a CPU a seed so draws exactly what it draws alone and its
progress.csv is the same (tests/test_seeds.py). On CUDA with ``train.cuda_graph`` the seeds' bursts of updates
run together (``JointBursts``: one graph for all the seeds' updates, patches/016-seed-axis-on-cuda.md): in
rounds of one update per seed, until a seed's burst is over; that seed goes on with its unit of work up to its
next burst, while the others wait mid-burst, and the rounds go on. The seeds' acting steps are gathered too
(``JointActs``: every seed's step submitted, each from its own RNG streams, before any is waited for), among
the seeds whose bursts ended together. A stop signal checkpoints every seed (with gathered acting, once the
gathered seeds are at their bursts or at the end of their units of work; with joint rounds, the others mid-burst);
a seed that diverges or fails is recorded in its own directory and the others go on.
"""
from __future__ import annotations

import contextlib
import logging
import random
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from .rundir import CURRENT_RUN, RunDir, RunDirError
from .signals import StopSignals
from .config import Refused
from .train import Attempt, check_and_lock, check_untouched, validate
from .graph import ActingRunner, UpdateRunner
from .rollout import ActRequest, EnvsStepping
from .trainer import Burst, Trainer, _StopRequested, close_each


log = logging.getLogger("pomdp_ffm")


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
        return torch.get_rng_state(), cuda, *host_streams()

    @contextlib.contextmanager
    def active(self, host: bool = True):
        """This seed's generators swapped in for what runs inside: torch's (CPU and CUDA), and with ``host``
        numpy's and Python's global ones. Swapping those two costs ~60 us (their states are converted to Python
        objects), more than a step on a GPU, and an acting step draws from torch's only: gathered acting swaps
        them per unit of work and checks that its steps left them alone (``host_streams``)."""
        torch_state, cuda, np_state, py_state = self.state
        torch.set_rng_state(torch_state)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        if host:
            np.random.set_state(np_state)
            random.setstate(py_state)
        try:
            yield
        finally:
            self.state = (torch.get_rng_state(), torch.cuda.get_rng_state_all() if cuda is not None else None,
                          *(host_streams() if host else (np_state, py_state)))


def host_streams() -> tuple:
    """numpy's and Python's global generators' states, comparable with ``same_host_streams``."""
    return np.random.get_state(), random.getstate()


def same_host_streams(a: tuple, b: tuple) -> bool:
    (np_a, py_a), (np_b, py_b) = a, b
    return (py_a == py_b and np_a[0] == np_b[0] and np.array_equal(np_a[1], np_b[1])
            and tuple(np_a[2:]) == tuple(np_b[2:]))


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
    except BaseException:
        # A seed refused under its lock (another process took its directory since the checks above): the seeds
        # locked before it leave nothing either.
        close_each([types.SimpleNamespace(close=a.abandon) for a in attempts], quiet_as="a seed's start")
        raise
    try:
        result = _train_together(seeds, attempts, streams)
    except BaseException:
        close_each(attempts, quiet_as="a seed's run")
        raise
    close_each(attempts)
    return result


def joint_runner(trainers: list[Trainer]) -> UpdateRunner | None:
    """The runner that updates these seeds together, or None to update them one after another: on CUDA with
    ``train.cuda_graph``, one graph with a branch per seed (pomdp_ffm/graph.py), or one update over the seeds'
    stacked weights with ``train.seed_axis_update=stacked`` (pomdp_ffm/stacked.py). On a CPU a joint update would
    be the same updates in turn, at the same cost, so the seeds keep their own turns and RNG streams there
    (except inside ``eager_joint_rounds``)."""
    if len(trainers) < 2:
        return None
    first = trainers[0]
    stacked = first.cfg.train.seed_axis_update == "stacked"
    if _eager_joint_rounds:
        return UpdateRunner([t.agent for t in trainers], cuda_graph=False, stacked=stacked)
    if first.agent.device.type != "cuda" or not first.cfg.train.cuda_graph:
        return None
    return UpdateRunner([t.agent for t in trainers], cuda_graph=True, stacked=stacked)


_eager_joint_rounds = False


@contextlib.contextmanager
def eager_joint_rounds():
    """Seed axes trained inside run their joint rounds on any device, eagerly (without CUDA graphs): their logs
    are those of the CUDA path's schedule and random draws, at a CPU's cost. For counting, without a GPU, how many
    updates that schedule runs together (``python -m pomdp_ffm.bench loop --joint-eager``)."""
    global _eager_joint_rounds
    before, _eager_joint_rounds = _eager_joint_rounds, True
    try:
        yield
    finally:
        _eager_joint_rounds = before


class JointBursts:
    """The bursts of updates of several seeds, run together: in rounds of one update per seed through one joint
    runner, until the first of the bursts is over. That seed then goes on with its unit of work (an evaluation,
    its next episode) up to its next burst while the others wait mid-burst, and the rounds go on with its next
    burst beside what is left of theirs (``_train_together``). So every seed takes one update in every round, and
    bursts of different lengths (after episodes of different lengths) still run together. A TD3 policy delay
    (``policy.td3.policy_delay`` > 1; the reference's is 1) needs the seeds' update counts to agree on the actor
    step: they stay equal from the first round on, and where they do not (a checkpoint from another schedule),
    the rounds stop and the caller realigns their counts mod the delay. The joint
    rounds draw their random numbers (SAC's and TD3's update noise on the GPU) from the lead seed's streams: a
    seed in a joint axis is no longer the run it is alone (patches/016-seed-axis-on-cuda.md), though each update
    is the seed's own."""

    def __init__(self, make_runner=None):
        self.make_runner = make_runner  # default: joint_runner
        self._runners: dict[tuple[int, ...], UpdateRunner | None] = {}

    def run(self, seeds: list[int], trainers: list[Trainer], bursts: list[Burst]) -> bool:
        """Rounds until a burst is over, or until a policy delay parts the seeds; False where these seeds have
        no joint runner (then each burst runs alone, in its seed's turn)."""
        key = tuple(seeds)
        if key not in self._runners:  # one per set of seeds that has run together (their graphs are kept)
            runner = (self.make_runner or joint_runner)(trainers)
            if getattr(runner, "stacked", None) is not None:
                # It moved these seeds' weights into its own stacked storage: a runner of an overlapping set
                # would have to re-stack and re-capture at its next round anyway, so its storage and graphs go,
                # once no replay of theirs is queued (their graphs' memory is freed with them).
                for k in [k for k in self._runners if set(k) & set(key)]:
                    dropped = self._runners.pop(k)
                    if dropped is not None and dropped.graphed:
                        dropped.backend.synchronize()
            self._runners[key] = runner
        runner = self._runners[key]
        if runner is None:
            return False
        clock, S = time.perf_counter, len(trainers)
        for _ in range(min(b.n - b.done for b in bursts)):
            if len({t.agent.actor_step_due() for t in trainers}) > 1:
                break  # a TD3 policy delay parts the seeds here: the caller realigns them
            trainers[0]._check_stop()
            last = [b.done == b.n - 1 for b in bursts]
            t_s = clock()
            batches = [t.sample_batch() for t in trainers]
            t_u = clock()
            # A burst's last update logs gradient norms: computed for every seed of a round where one is at its
            # last, kept by those only (the others' statistics are those of their updates alone).
            grad_norms = any(last)
            stats = runner.update_all(batches, grad_norms=grad_norms)
            t_e = clock()
            for t, b, st, at_last in zip(trainers, bursts, stats, last):
                # each seed is charged its share of the joint round
                t.timers.update(sample=(t_u - t_s) / S, update=(t_e - t_u) / S)
                t._count("joint_updates")
                if grad_norms and not at_last:
                    st = {k: v for k, v in st.items() if not k.endswith("grad_norm")}
                b.add(st)
            for t in trainers:  # an error of one seed's deferred evaluation is that seed's, in its own turn
                t.between_updates(hold_errors=True)
        return True


class JointActs:
    """Whether the seeds' acting steps (collection and evaluation) are gathered: each seed's rollout is suspended
    at its step, every seed's step is submitted in that seed's turn, then each is waited for and its seed goes
    on, submitting its next step at once. On CUDA with ``train.cuda_graph`` a submit queues the seed's acting
    graph (on the acting stream, graph.CudaGraphs.acting_stream): while the GPU runs one seed's step the host
    launches the next seed's, or steps a seed's env, instead of waiting for each step before the next. Each
    step still draws from its own seed's streams, so the seeds' acting is what it is alone. On a CPU a submit
    computes the step, as a turn would: the seeds keep their whole-unit turns there unless ``gather`` says
    otherwise (the tests gather on a CPU to check that a seed's logs do not change). Gathered are the seeds
    whose units of work are under way together: all of them at the start, then those whose bursts ended in the
    same joint round (all of them where episodes have one length).

    Per step only torch's generators are swapped (``RNGStreams.active(host=False)``); numpy's and Python's global
    generators, which no acting step, env step or buffer draws from (the envs and the buffer have their own),
    are checked to be untouched by the gathered steps, and the seeds fail with ``SharedStreamsDrawn`` if they
    were not."""

    def __init__(self, gather: bool | None = None):
        self.gather = gather

    def applies(self, trainers: list[Trainer]) -> bool:
        if len(trainers) < 2:
            return False
        if self.gather is not None:
            return self.gather
        return all(isinstance(t.acting, ActingRunner) for t in trainers)


class SharedStreamsDrawn(RuntimeError):
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


@dataclass
class _Unit:
    """A seed's unit of work in hand: its generator (Trainer.step_parts), suspended at ``item``."""

    k: int
    a: Attempt
    parts: object
    item: object = None
    wait: Callable | None = None  # its submitted acting step

    @property
    def trainer(self) -> Trainer:
        return self.a.trainer


def _is_burst(item) -> bool:
    return isinstance(item, Burst)


def _is_agent_step(item) -> bool:
    return isinstance(item, ActRequest) and item.by_agent


def _gathered(item) -> bool:
    """What gathered acting leaves suspended while it turns to the other seeds: an acting step of the agent,
    or envs stepping in their worker processes."""
    return _is_agent_step(item) or isinstance(item, EnvsStepping)


def _train_together(seeds: list[int], attempts: list[Attempt], streams: dict[int, RNGStreams],
                    joint: JointBursts | None = None, acts: JointActs | None = None) -> dict:
    results: dict[int, dict] = {}
    errors: list[BaseException] = []
    running = []
    joint = joint if joint is not None else JointBursts()
    for k, a in zip(seeds, attempts):
        if a.action == "skip":
            results[k] = a.skip()
        else:
            running.append((k, a))
    gather = (acts or JointActs()).applies([a.trainer for _, a in running])

    @contextlib.contextmanager
    def turn(k: int, a: Attempt, host: bool = True):
        """Seed k's turn: its run directory current, its generators swapped in (``host``: numpy's and Python's
        too, RNGStreams.active)."""
        token = CURRENT_RUN.set(a.run.path)
        if not host:  # a checkpoint written in this turn saves the seed's own numpy and Python states
            a.trainer.host_rng = lambda: streams[k].state[2:]
        try:
            with streams[k].active(host):
                yield
        finally:
            CURRENT_RUN.reset(token)
            if not host:
                a.trainer.host_rng = None

    def failed(k: int, a: Attempt, e: BaseException) -> None:
        """This seed's failure, recorded in its own directory; the others go on. numpy's and Python's global
        generators are left as they were (a gathered phase checks them)."""
        around = host_streams()
        with turn(k, a):
            a.fail(e)
            a.trainer.shut()
        np.random.set_state(around[0])
        random.setstate(around[1])
        running.remove((k, a))
        if isinstance(e, KeyboardInterrupt):
            raise e
        errors.append(e)

    @contextlib.contextmanager
    def own_turn(k: int, a: Attempt, light: bool = False):
        """Seed k's turn, where an error is that seed's failure (the others go on); a stop goes up. ``light``:
        only torch's generators swapped (a gathered acting step)."""
        try:
            with turn(k, a, host=not light):
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

    def live(units: list[_Unit]) -> list[_Unit]:
        return [u for u in units if (u.k, u.a) in running and u.item is not None]

    def act_together(units: list[_Unit], until) -> None:
        """The units' gathered items, seed by seed: an acting step submitted, then waited for; envs stepping in
        workers left to step while the other seeds go on. Until every unit is at an item that is neither (or
        has ended)."""
        clock = time.perf_counter

        def timed(u: _Unit, wait):
            def answer():
                t0 = clock()
                try:
                    return wait()
                finally:
                    u.item.charge(clock() - t0)
            return answer

        def submit(u: _Unit) -> None:
            if isinstance(u.item, EnvsStepping):  # nothing to start: the envs are stepping
                u.wait = u.item.answer
                return
            t0 = clock()
            u.wait = timed(u, u.item.submit())
            u.item.charge(clock() - t0)

        before = host_streams()

        def untouched() -> bool:
            """numpy's and Python's global generators as the phase found them; if not, every seed of the phase
            still running fails (which of them drew cannot be told)."""
            if same_host_streams(before, host_streams()):
                return True
            e = SharedStreamsDrawn("the seeds' gathered acting steps (or their envs, or what follows them) drew "
                                   "from numpy's or Python's global random generator, which gathering does not "
                                   "keep apart per seed: the seeds' runs would not be their own")
            for v in units:
                if (v.k, v.a) in running:
                    failed(v.k, v.a, e)
            return False

        for u in live(units):
            if _gathered(u.item):
                with own_turn(u.k, u.a, light=True):
                    submit(u)
        while True:
            waiting = [u for u in live(units) if u.wait is not None]
            if not waiting:
                break
            for u in waiting:
                if (u.k, u.a) not in running:
                    continue
                with own_turn(u.k, u.a, light=True):
                    answer, u.wait = u.wait, None
                    u.item = u.trainer.resume(u.parts, answer, until)
                    if u.item is None:
                        if untouched():  # checked before a seed finishes (its DONE would stand)
                            stepped(u.k, u.a)
                    elif _gathered(u.item):
                        submit(u)
        untouched()

    # With gathered acting, the seeds' units are suspended inside episodes and evaluations: a stop signal is
    # held until every unit is over, and acted on between rounds.
    stop = StopSignals()
    held = _HeldStop(stop)
    # Each running seed's unit of work in hand, suspended at its burst of updates, between two joint phases.
    units: dict[int, _Unit] = {}

    def release(e: BaseException, of: list[_Unit]) -> None:
        """A stop or an error going up through these suspended units: each burst records how far it got."""
        for u in of:
            units.pop(u.k, None)
            if (u.k, u.a) in running:
                _throw_into(u.k, u.a, u.parts, e, turn, failed)

    def updates_failed(e: BaseException, of: list[_Unit]) -> None:
        """An error raised by these suspended units' updates, thrown into each (its burst records how far it
        got): a stop or an interrupt goes up, any other error is each seed's failure."""
        release(e, of)
        if isinstance(e, (_StopRequested, KeyboardInterrupt)):
            raise e
        for u in of:
            if (u.k, u.a) in running:
                failed(u.k, u.a, e)

    def to_bursts(seeds: list[tuple[int, Attempt]]) -> None:
        """These seeds' next units of work, each up to its burst (kept in ``units``): in their turns, or with
        their acting steps gathered. A unit that ends without one is followed by the seed's next."""
        while seeds:
            if gather and stop.requested is not None:
                raise _StopRequested
            fresh: list[_Unit] = []
            with held.holding(gather):
                try:
                    for k, a in seeds:
                        with own_turn(k, a):
                            u = _Unit(k, a, a.trainer.step_parts())
                            u.item = a.trainer.drive(u.parts, until=up_to_burst)
                            if u.item is None:
                                stepped(k, a)
                            else:
                                fresh.append(u)
                except _StopRequested:  # not gathered: the seeds before this one are at their bursts
                    release(_StopRequested(), live(fresh))
                    raise
                if gather:
                    act_together(fresh, up_to_burst)
            units.update({u.k: u for u in live(fresh)})
            seeds = [(k, a) for k, a in running if k not in units]

    def past_bursts(ended: list[_Unit]) -> None:
        """The rest of these units of work, after their bursts (what is left of a burst, alone; an evaluation)."""
        for u in ended:
            units.pop(u.k, None)
        with held.holding(gather):
            for i, u in enumerate(ended):
                try:
                    with own_turn(u.k, u.a):
                        u.item = u.trainer.drive(u.parts, u.item, until=after_burst)
                        if u.item is None:
                            stepped(u.k, u.a)
                except _StopRequested:
                    release(_StopRequested(), live(ended[i + 1:]))
                    raise
            if gather:
                act_together(ended, after_burst)
        units.update({u.k: u for u in live(ended)})  # a unit with a burst after its burst (none has today)

    def realign(pending: list[_Unit]) -> None:
        """Seeds whose update counts part them at a policy delay d (a checkpoint from another schedule): each
        takes, alone, the updates that bring its count to the same remainder mod d as the others' (the remainder
        that the fewest such updates reach), so they agree on the actor step from then on. A seed so moved stays
        that many updates ahead in its bursts: where episodes have one length it ends each burst, and collects,
        that many rounds before the others, no longer gathered with them."""
        d = pending[0].trainer.agent.algo.policy_delay
        phases = [u.trainer.agent.num_updates % d for u in pending]
        target = min(range(d), key=lambda p: (sum((p - q) % d for q in phases), (p - phases[0]) % d))
        for u, q in zip(pending, phases):
            if (target - q) % d == 0:
                continue
            try:
                with turn(u.k, u.a):
                    u.trainer.run_updates(u.item, limit=(target - q) % d)  # or to its burst's end
            except BaseException as e:
                updates_failed(e, [u])

    with stop:
        for k, a in running:
            with turn(k, a):
                a.begin()
                a.trainer.stop = held
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
            up_to_burst = (lambda it: _is_burst(it) or _gathered(it)) if gather else _is_burst
            after_burst = _gathered if gather else None
            while running:
                # Every seed at a burst: those whose last burst is over go on with their next unit of work.
                to_bursts([(k, a) for k, a in running if k not in units])
                pending = [units[k] for k, a in running if k in units]
                if not pending:
                    continue
                # The bursts together until one is over (whose seed then goes on); without a joint runner, each
                # burst alone in its seed's turn.
                k0, a0 = pending[0].k, pending[0].a
                try:
                    with turn(k0, a0):
                        together = joint.run([u.k for u in pending], [u.trainer for u in pending],
                                             [u.item for u in pending])
                except BaseException as e:
                    updates_failed(e, pending)  # the joint update failed: every seed in it has
                    continue
                if not together:
                    for u in pending:
                        # After a stop, what is left of it resumes alone, before any seed goes on.
                        u.item.state["alone"] = True
                    past_bursts(pending)
                    continue
                if not any(u.item.done >= u.item.n for u in pending):
                    realign(pending)
                past_bursts([u for u in pending if u.k in units and u.item.done >= u.item.n])
        except _StopRequested:
            release(_StopRequested(), list(units.values()))
            for k, a in running:
                with turn(k, a):
                    results[k] = a.end(a.trainer.stopped())
                    a.trainer.shut()
        except KeyboardInterrupt:
            release(KeyboardInterrupt(), list(units.values()))
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
