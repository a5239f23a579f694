"""The running sums of one burst of updates, for its progress.csv row (pomdp_ffm/metrics.py reduces them)."""
from __future__ import annotations

import torch

from .metrics import summed


class Burst:
    """The running sums of one burst of updates (counters.burst: {"n", "done", "sums", "counts"}) on the device:
    ``add`` after each update reads nothing on the host; ``close`` reads the sums once and stores them in the
    burst's state (for its row, or for the checkpoint of a stop inside it). Yielded by the trainer's unit of work
    for its updates to be run (``answer``): by its trainer (pomdp_ffm/trainer.py), or with other seeds' updates
    (pomdp_ffm/seeds.py)."""

    def __init__(self, trainer, state: dict):
        self.trainer, self.state = trainer, state
        self.n, self.start = state["n"], state["done"]
        dev = trainer.agent.device
        # Float64 sums of the float32 statistics, as the reference's float sums; with a TD3 policy delay the
        # actor's statistics come from fewer updates, hence a count per key.
        self.sums = {k: torch.as_tensor(v, dtype=torch.float64, device=dev) for k, v in state["sums"].items()}
        self.counts = state["counts"]
        self.first_bad = torch.full((), -1, dtype=torch.int64, device=dev)
        self.last: dict[str, torch.Tensor] = {}

    @property
    def done(self) -> int:
        return self.state["done"]

    @property
    def ran(self) -> int:
        return self.done - self.start

    def answer(self) -> None:
        self.trainer.run_updates(self)

    def add(self, stats: dict[str, torch.Tensor], update: int) -> None:
        """Update number ``update``'s statistics (scalars): summed, checked for non-finite values (on the device).
        As one vector, not one statistic at a time: on a GPU each operation here is a kernel launch outside the
        update's graph (53 for SAC's statistics one at a time, 13 as a vector)."""
        values = torch.stack(list(stats.values()))  # a copy: what the update returned may be overwritten
        finite = torch.isfinite(values).all()
        self.first_bad = torch.where((self.first_bad < 0) & ~finite, update, self.first_bad)
        as_double = values.double().unbind()
        old, added = [], []
        for k, v in zip(stats, as_double):
            if summed(k):
                if k in self.sums:
                    old.append(self.sums[k])
                    added.append(v)
                else:
                    self.sums[k] = v
                self.counts[k] = self.counts.get(k, 0) + 1
        if old:
            torch._foreach_add_(old, added)  # each sum its own tensor: in place, the same float64 additions
        self.last = dict(zip(stats, values.unbind()))
        self.state["done"] += 1

    def close(self) -> int:
        """Read the sums into the burst's state; the update count at the first non-finite statistic, or -1."""
        self.state["sums"] = {k: float(v) for k, v in self.sums.items()}
        return int(self.first_bad)
