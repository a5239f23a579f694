"""What the seeds of one axis (pomdp_ffm/seeds.py) share or run together: each seed's random generators, swapped in
for its turns (``SeedRNG``), its bursts of updates run in joint rounds (``JointBursts``), and whether its acting
steps are gathered with the other seeds' (``JointActs``)."""
from __future__ import annotations

import contextlib
import random
import time

import numpy as np
import torch

from .acting_graph import ActingRunner
from .burst import Burst
from .checkpoint import host_rng_state
from .graph import UpdateRunner
from .metrics import summed
from .trainer import Trainer


class SeedRNG:
    """The global generators' states of one seed, swapped in for its turns; taken (``keep``) right after its
    trainer seeded and built everything."""

    def __init__(self):
        self.state: tuple | None = None
        self.light = False  # inside a turn that left numpy's and Python's generators alone

    def keep(self) -> None:
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        self.state = (torch.get_rng_state(), cuda, *host_rng_state())

    def host_state(self) -> tuple:
        """numpy's and Python's generator states of this seed now (for its checkpoints): the global ones in its
        full turns, its own kept ones in a light turn."""
        return self.state[2:] if self.light else host_rng_state()

    @contextlib.contextmanager
    def active(self, host: bool = True):
        """This seed's generators swapped in for what runs inside: torch's (CPU and CUDA), and with ``host``
        numpy's and Python's global ones. Swapping those two costs ~60 us (their states are converted to Python
        objects), more than a step on a GPU, and an acting step draws from torch's only: gathered acting swaps
        them per unit of work and checks that its steps left them alone (``same_host_rng``)."""
        torch_state, cuda, np_state, py_state = self.state
        torch.set_rng_state(torch_state)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        if host:
            np.random.set_state(np_state)
            random.setstate(py_state)
        light, self.light = self.light, not host
        try:
            yield
        finally:
            self.light = light
            self.state = (torch.get_rng_state(), torch.cuda.get_rng_state_all() if cuda is not None else None,
                          *(host_rng_state() if host else (np_state, py_state)))


def same_host_rng(a: tuple, b: tuple) -> bool:
    """Whether two of ``host_rng_state()``'s states are the same."""
    (np_a, py_a), (np_b, py_b) = a, b
    return (py_a == py_b and np_a[0] == np_b[0] and np.array_equal(np_a[1], np_b[1])
            and tuple(np_a[2:]) == tuple(np_b[2:]))


def joint_runner(trainers: list[Trainer]) -> UpdateRunner | None:
    """The runner that updates these seeds together, or None to update them one after another: on CUDA with
    ``train.cuda_graph``, one graph with a branch per seed (pomdp_ffm/graph.py). On a CPU a joint update would
    be the same updates in turn, at the same cost, so the seeds keep their own turns and random generators there."""
    first = trainers[0]
    if len(trainers) < 2 or first.agent.device.type != "cuda" or not first.cfg.train.cuda_graph:
        return None
    return UpdateRunner([t.agent for t in trainers], cuda_graph=True)


class JointBursts:
    """The bursts of updates of several seeds, run together: in rounds of one update per seed through one joint
    runner, until the first of the bursts is over. That seed then goes on with its unit of work (an evaluation,
    its next episode) up to its next burst while the others wait mid-burst, and the rounds go on with its next
    burst beside what is left of theirs (``SeedAxis``). So every seed takes one update in every round, and
    bursts of different lengths (after episodes of different lengths) still run together. A TD3 policy delay
    (``policy.td3.policy_delay`` > 1; the reference's is 1) needs the seeds' update counts to agree on the actor
    step: they stay equal from the first round on, and where they do not (a checkpoint from another schedule),
    the rounds stop and the caller realigns their counts mod the delay. The joint rounds draw their random
    numbers (SAC's and TD3's update noise on the GPU) from the lead seed's generators: a seed in a joint axis is no
    longer the run it is alone (patches/016-seed-axis-on-cuda.md), though each update is the seed's own."""

    def __init__(self, make_runner=None):
        self.make_runner = make_runner  # default: joint_runner
        self._runners: dict[tuple[int, ...], UpdateRunner | None] = {}

    def run(self, seeds: list[int], trainers: list[Trainer], bursts: list[Burst]) -> bool:
        """Rounds until a burst is over, or until a policy delay parts the seeds; False where these seeds have
        no joint runner (then each burst runs alone, in its seed's turn)."""
        key = tuple(seeds)
        if key not in self._runners:  # one per set of seeds that has run together (their graphs are kept)
            self._runners[key] = (self.make_runner or joint_runner)(trainers)
        runner = self._runners[key]
        if runner is None:
            return False
        clock, S = time.perf_counter, len(trainers)
        for _ in range(min(b.n - b.done for b in bursts)):
            if len({t.agent.actor_step_due() for t in trainers}) > 1:
                break  # a TD3 policy delay parts the seeds here: the caller realigns them
            trainers[0].check_stop()
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
                t.timers.update(sample=(t_u - t_s) / S, update=(t_e - t_u) / S, n_joint_updates=1)
                if grad_norms and not at_last:
                    st = {k: v for k, v in st.items() if summed(k)}
                t.record_update(b, st)
            for t in trainers:  # an error of one seed's deferred evaluation is that seed's, in its own turn
                t.evaluator.between_updates(hold_errors=True)
        return True


class JointActs:
    """Whether the seeds' acting steps (collection and evaluation) are gathered: each seed's rollout is suspended
    at its step, every seed's step is submitted in that seed's turn, then each is waited for and its seed goes
    on, submitting its next step at once. On CUDA with ``train.cuda_graph`` a submit queues the seed's acting
    graph (on the acting stream, graph.CudaGraphs.acting_stream): while the GPU runs one seed's step the host
    launches the next seed's, or steps a seed's env, instead of waiting for each step before the next. Each
    step still draws from its own seed's generators, so the seeds' acting is what it is alone. On a CPU a submit
    computes the step, as a turn would: the seeds keep their whole-unit turns there unless ``gather`` says
    otherwise (the tests gather on a CPU to check that a seed's logs do not change). Gathered are the seeds
    whose units of work are under way together: all of them at the start, then those whose bursts ended in the
    same joint round (all of them where episodes have one length).

    Per step only torch's generators are swapped (``SeedRNG.active(host=False)``); numpy's and Python's global
    generators, which no acting step, env step or buffer draws from (the envs and the buffer have their own),
    are checked to be untouched by the gathered steps, and the seeds fail with ``SharedRNGDrawn`` if they
    were not."""

    def __init__(self, gather: bool | None = None):
        self.gather = gather

    def applies(self, trainers: list[Trainer]) -> bool:
        if len(trainers) < 2:
            return False
        if self.gather is not None:
            return self.gather
        return all(isinstance(t.acting, ActingRunner) for t in trainers)
