"""A burst of updates, one object from its start to its row: its size and progress, as a checkpoint holds them
(``saved``, ``restored``), and its statistics summed on the device while it runs, read on the host once, where it
ends or stops (``close``; patches/014-update-without-host-sync.md); and the loop that runs bursts
(``update_bursts``)."""

from __future__ import annotations

import time

import torch

from .metrics import summed

SAVED = ("n", "done", "sums", "counts")  # what a checkpoint holds of a burst in hand: a stop inside it resumes it


class Burst:
    """The burst in hand: ``add`` reads nothing on the host; ``close`` reads the sums once into ``sums`` (for its
    row, or the checkpoint of a stop inside it). ``counts``: a count per statistic (a TD3 policy delay skips actor
    steps)."""

    def __init__(
        self, n: int, device: torch.device, done: int = 0, sums: dict | None = None, counts: dict | None = None
    ):
        self.n, self.done, self.start, self.t0 = n, done, done, time.time()
        self.sums: dict[str, float] = dict(sums or {})  # as of the last ``close``
        self.counts: dict[str, int] = dict(counts or {})
        # Float64 sums, as the reference's float sums.
        self.device_sums = {k: torch.as_tensor(v, dtype=torch.float64, device=device) for k, v in self.sums.items()}
        self.first_bad = torch.full((), -1, dtype=torch.int64, device=device)
        self.last: dict[str, torch.Tensor] = {}

    def saved(self) -> dict:
        return {k: getattr(self, k) for k in SAVED}

    @classmethod
    def restored(cls, state: dict | None, device: torch.device) -> Burst | None:
        # (Checkpoints of an earlier seed axis also hold an "alone" flag, which no longer means anything.)
        return None if state is None else cls(device=device, **{k: state[k] for k in SAVED})

    @property
    def over(self) -> bool:
        return self.done >= self.n

    def add(self, stats: dict[str, torch.Tensor], update: int) -> None:
        """Update number ``update``'s statistics summed and checked on the device, as one vector: each operation
        here is a kernel launch outside the update's graph (53 for SAC's statistics one at a time, 13 so)."""
        values = torch.stack(list(stats.values()))  # a copy: what the update returned may be overwritten
        finite = torch.isfinite(values).all()
        self.first_bad = torch.where((self.first_bad < 0) & ~finite, update, self.first_bad)
        old, added, sums, counts = [], [], self.device_sums, self.counts
        for k, v in zip(stats, values.double().unbind()):
            if summed(k):
                if k in sums:
                    old.append(sums[k])
                    added.append(v)
                else:
                    sums[k] = v
                counts[k] = counts.get(k, 0) + 1
        if old:
            torch._foreach_add_(old, added)  # in place, the same float64 additions
        self.last = dict(zip(stats, values.unbind()))
        self.done += 1

    def close(self) -> int:
        """Read the sums into ``sums``; the update count at the first non-finite statistic, or -1."""
        self.sums = {k: float(v) for k, v in self.device_sums.items()}
        return int(self.first_bad)


def update_bursts(trainers: list, runner, limit: int | None = None) -> None:
    """The burst loop: the trainers' (trainer.Trainer) bursts in hand, in rounds of one update each through
    ``runner`` (cuda_graph.UpdateRunner: a trainer's own, or a seed axis's joint one), until one burst is over, after
    ``limit`` rounds, or where a TD3 policy delay parts the trainers (a checkpoint from another schedule: the loop
    realigns them). Gradient norms at a burst's last update (computed for all in a round where one is at its last,
    kept by those at theirs). No host read between the updates: a non-finite statistic is found once the burst ends
    or stops (patches/014). Several trainers draw from the lead's generators: a seed is then not its run alone
    (patches/016)."""
    clock, S, bursts = time.perf_counter, len(trainers), [t.standing.burst for t in trainers]
    rounds = min(b.n - b.done for b in bursts)
    for _ in range(rounds if limit is None else min(rounds, limit)):
        if S > 1 and len({t.agent.actor_step_due() for t in trainers}) > 1:
            break
        trainers[0].stop.check()
        last = [b.done == b.n - 1 for b in bursts]
        t_s = clock()
        batches = [t.buffer.sample(t.cfg.train.batch_size) for t in trainers]
        t_u = clock()
        grad_norms = any(last)
        stats = runner.update_all(batches, grad_norms=grad_norms)
        t_e = clock()
        for t, st, at_last in zip(trainers, stats, last):
            t.timers.update(sample=(t_u - t_s) / S, update=(t_e - t_u) / S)
            if S > 1:
                t.timers["n_joint_updates"] += 1
            if grad_norms and not at_last:
                st = {k: v for k, v in st.items() if summed(k)}
            t.timers["n_updates"] += 1
            t.standing.count_update(st)
        for t in trainers:  # in a joint round a deferred evaluation's error is raised later, in its seed's own turn
            t.evaluator.between_updates(hold_errors=S > 1)
