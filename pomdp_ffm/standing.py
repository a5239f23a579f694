"""Where a run stands (its clocks, its last evaluation's, the burst in hand: what a checkpoint holds of the loop),
and how its training ended."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from .burst import Burst
from .evaluation import Clocks


@dataclass
class Standing:
    """Where the run stands: its clocks, the last evaluation's, the seconds trained, the burst in hand; saved whole in
    the checkpoint (under "counters", the name of the checkpoint format's key)."""

    env_steps: int = 0
    rollouts: int = 0
    rl_steps: int = 0
    last_eval_iters: int = 0  # the eval clock's value at the last evaluation
    last_eval_env_steps: int = 0
    last_return: float = math.nan
    elapsed: float = 0.0  # wall seconds trained, over all attempts
    pool_done: bool = False
    burst: Burst | None = None  # the burst in hand, from its unit's episodes to its row

    @property
    def burst_over(self) -> bool:
        return self.burst is None or self.burst.over

    def clocks(self) -> Clocks:
        return Clocks(self.env_steps, self.rollouts, self.rl_steps, time.time())

    def saved(self) -> dict:
        return {**vars(self), "burst": None if self.burst is None else self.burst.saved()}

    @classmethod
    def restored(cls, saved: dict, device: torch.device) -> Standing:
        return cls(**{**saved, "burst": Burst.restored(saved["burst"], device)})

    def begin_burst(self, n: int, device: torch.device) -> None:
        self.burst = Burst(n, device)

    def count_update(self, stats: dict) -> None:
        """An update run (alone or in a seed axis's joint round): counted, its statistics added to the burst."""
        self.rl_steps += 1
        self.burst.add(stats, self.rl_steps)


@dataclass
class Outcome:
    stopped: bool = False
    signal: int | None = None
    standing: Standing = field(default_factory=Standing)
