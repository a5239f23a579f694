"""What the seeds of one axis (seeds.py) run together: bursts in joint rounds (``JointBursts``), and whether acting
steps are gathered (``JointActs``). Each seed's generators, swapped in for its turns, are rng.SeedRNG."""

from __future__ import annotations

import time

from .acting_graph import ActingRunner
from .graph import UpdateRunner
from .metrics import summed
from .trainer import Trainer


def joint_runner(trainers: list[Trainer]) -> UpdateRunner | None:
    """One graph updating these seeds together (CUDA with ``train.cuda_graph``), or None: on a CPU a joint update
    would cost the same as turns, which keep each seed's own generators."""
    first = trainers[0]
    if len(trainers) < 2 or first.agent.device.type != "cuda" or not first.cfg.train.cuda_graph:
        return None
    return UpdateRunner([t.agent for t in trainers], cuda_graph=True, compile=first.cfg.train.compile)


class JointBursts:
    """Several seeds' bursts in rounds of one update per seed through one joint runner until one is over; the others
    wait mid-burst. Rounds stop where the seeds' update counts disagree on a TD3 delayed actor step (a checkpoint
    from another schedule). They draw from the lead seed's generators: a seed is not its run alone (patches/016)."""

    def __init__(self, make_runner=None):
        self.make_runner = make_runner  # default: joint_runner, looked up when needed
        self._runners: dict[tuple[int, ...], UpdateRunner | None] = {}

    def run(self, seeds: list[int], trainers: list[Trainer]) -> bool:
        """Rounds of the trainers' bursts in hand until one is over or a policy delay parts the seeds; False without
        a joint runner."""
        if (key := tuple(seeds)) not in self._runners:  # their graphs are kept
            self._runners[key] = (self.make_runner or joint_runner)(trainers)
        if (runner := self._runners[key]) is None:
            return False
        clock, S, bursts = time.perf_counter, len(trainers), [t.burst for t in trainers]
        for _ in range(min(b.n - b.done for b in bursts)):
            if len({t.agent.actor_step_due() for t in trainers}) > 1:
                break  # a TD3 policy delay parts the seeds here: the caller realigns them
            trainers[0].check_stop()
            last = [b.done == b.n - 1 for b in bursts]
            t_s = clock()
            batches = [t.sample_batch() for t in trainers]
            t_u = clock()
            # Gradient norms for all where one seed is at its last update, kept by those at theirs only.
            grad_norms = any(last)
            stats = runner.update_all(batches, grad_norms=grad_norms)
            t_e = clock()
            for t, st, at_last in zip(trainers, stats, last):
                t.timers.update(sample=(t_u - t_s) / S, update=(t_e - t_u) / S, n_joint_updates=1)
                if grad_norms and not at_last:
                    st = {k: v for k, v in st.items() if summed(k)}
                t.record_update(st)
            for t in trainers:  # a deferred evaluation's error is raised in its seed's own turn
                t.evaluator.between_updates(hold_errors=True)
        return True


class JointActs:
    """Whether acting steps are gathered: each seed's submitted (from its own torch generators) before any is waited
    for, so that on CUDA with graphs the host launches one seed's step or steps its env while the GPU runs another's
    (on a CPU a submit computes it). numpy's and Python's generators are checked untouched (seeds.SharedRNGDrawn)."""

    def applies(self, trainers: list[Trainer]) -> bool:
        return len(trainers) >= 2 and all(isinstance(t.acting, ActingRunner) for t in trainers)
