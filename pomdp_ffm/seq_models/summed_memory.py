"""What FART (fart.py) and FWP (fwp.py) share as POPGym builds them: a memory summed over the window (or its running
maximum) on the shared engine, the normalisation's epsilon, and the block's perceptron."""

from __future__ import annotations

import torch
from torch import nn

from .recurrence import linear_scan

EPS = 1e-5  # POPGym's: in linear attention's denominator and FWP's sum normalisation


def accumulate(kind: str, x: torch.Tensor, s0: torch.Tensor) -> torch.Tensor:
    """X_t over dim 0 from X_{-1} = s0 (x's shape less time): X_{t-1} + x_t ("sum", the shared scan with a = 1) or
    max(X_{t-1}, x_t) ("max")."""
    if kind == "sum":
        return linear_scan(x.new_ones((1,) * x.dim()), x, s0)
    return torch.maximum(torch.cummax(x, dim=0).values, s0)


def feed_forward(width: int) -> nn.Sequential:
    """POPGym's block perceptron: two Linear + ReLU of the attention width."""
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
