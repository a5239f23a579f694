"""A burst of updates: its state as a checkpoint holds it (``BurstState``), and its statistics summed on the device
while it runs (``Burst``), read on the host once, where it ends or stops (patches/014-update-without-host-sync.md)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields

import torch

from .metrics import summed


@dataclass
class BurstState:
    """The burst of updates in hand, as a checkpoint holds it: a stop inside it resumes it."""

    n: int  # its size
    done: int = 0  # updates run
    sums: dict[str, float] = field(default_factory=dict)  # its summed statistics, as of the last ``Burst.close``
    counts: dict[str, int] = field(default_factory=dict)  # a count per key: a TD3 policy delay skips actor steps

    @classmethod
    def restored(cls, state: dict | None) -> BurstState | None:
        # (Checkpoints of an earlier seed axis also hold an "alone" flag, which no longer means anything.)
        return None if state is None else cls(**{f.name: state[f.name] for f in fields(cls)})


class Burst:
    """The burst in hand, its statistics summed on the device: ``add`` reads nothing on the host, ``close`` reads
    the sums once into its state (for its row, or the checkpoint of a stop inside it)."""

    def __init__(self, state: BurstState, device: torch.device):
        self.state, self.start, self.t0 = state, state.done, time.time()
        # Float64 sums, as the reference's float sums.
        self.sums = {k: torch.as_tensor(v, dtype=torch.float64, device=device) for k, v in state.sums.items()}
        self.first_bad = torch.full((), -1, dtype=torch.int64, device=device)
        self.last: dict[str, torch.Tensor] = {}

    @property
    def n(self) -> int:
        return self.state.n

    @property
    def done(self) -> int:
        return self.state.done

    @property
    def over(self) -> bool:
        return self.state.done >= self.state.n

    def add(self, stats: dict[str, torch.Tensor], update: int) -> None:
        """Update number ``update``'s statistics summed and checked on the device, as one vector: each operation
        here is a kernel launch outside the update's graph (53 for SAC's statistics one at a time, 13 so)."""
        values = torch.stack(list(stats.values()))  # a copy: what the update returned may be overwritten
        finite = torch.isfinite(values).all()
        self.first_bad = torch.where((self.first_bad < 0) & ~finite, update, self.first_bad)
        old, added, counts = [], [], self.state.counts
        for k, v in zip(stats, values.double().unbind()):
            if summed(k):
                if k in self.sums:
                    old.append(self.sums[k])
                    added.append(v)
                else:
                    self.sums[k] = v
                counts[k] = counts.get(k, 0) + 1
        if old:
            torch._foreach_add_(old, added)  # in place, the same float64 additions
        self.last = dict(zip(stats, values.unbind()))
        self.state.done += 1

    def close(self) -> int:
        """Read the sums into the burst's state; the update count at the first non-finite statistic, or -1."""
        self.state.sums = {k: float(v) for k, v in self.sums.items()}
        return int(self.first_bad)
