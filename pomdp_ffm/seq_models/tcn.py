"""Temporal convolution, POPGym's baseline "TCN" (Morad et al., 2023, "POPGym: Benchmarking Partially Observable
Reinforcement Learning"; POPGym's ``ray_models/ray_frameconv.py`` class ``Frameconv``), after Bai, Kolter and
Koltun (2018), "An Empirical Evaluation of Generic Convolutional and Recurrent Networks for Sequence Modeling":
one causal convolution whose kernel spans the last k = stack_size inputs, with no activation:

    e_t = (1 - s) x_t + s PE(t)                          POPGym's default sine time embedding (time_embedding.py)
    y_t = b + sum_{j=0}^{k-1} W_j e_{t-k+1+j}            W: [h, input_size, k] (a Conv1d's weight), b: [h]

with e_t = 0 before the episode's first step (the zero initial window) and h = hidden_size, POPGym's hidden_size,
the convolution's output channels.

State: (window, steps): the last k - 1 embedded inputs e_{t-k+2} .. e_t, batch-first [B, k - 1, input_size]
(POPGym's layout, oldest first), and the step count, int64 [B], the time index of the next input (counted whether
or not the embedding reads it). Acting is O(1) per step: one step convolves the window's k frames.

Differences from the paper's TCN, as POPGym has them: a single layer, no dilation, no residual blocks, no weight
norm, dropout nor activation. Differences from POPGym: POPGym asserts that k divides h (an assertion copied from its
frame stack; its convolution needs none), here any h works; with k = 1 POPGym's state slice (``-k + 1:``, that is
``0:``) keeps the whole padded input, growing at each call, where here the window is empty. The embedding is
time_embedding.py's, shared with the other models; its differences from POPGym's (no table, so no limit on the time
index) are listed there.
"""

from __future__ import annotations

import torch
from torch import nn

from ..options import TCNConfig
from ..rules import options_of
from .base import SeqModel, State
from .time_embedding import sine_embedding


class TCN(SeqModel):
    """POPGym's temporal convolution (module docstring); state ``(window [B, k - 1, input_size], steps int64 [B])``."""

    def __init__(self, input_size: int, hidden_size: int, **options):
        """``options``: policy.tcn's (options.TCNConfig: their defaults and rules)."""
        super().__init__()
        o = options_of(TCNConfig, options, "policy.tcn")
        self.input_size, self.hidden_size, self.stack_size = input_size, hidden_size, o.stack_size
        self.embedding = sine_embedding(o.embedding, input_size, o.embedding_horizon, o.scale_embedding)
        self.core = nn.Conv1d(input_size, hidden_size, o.stack_size)  # torch's default init, as POPGym leaves it

    def initial_state(self, batch_size: int, device=None) -> State:
        shape = (batch_size, self.stack_size - 1, self.input_size)
        window = torch.zeros(shape, dtype=self.core.weight.dtype, device=device)  # float64 for a float64 model
        return window, torch.zeros(batch_size, dtype=torch.long, device=device)

    def window_state(self, first_step: torch.Tensor) -> State:
        return (
            None if self.embedding is None else (self.initial_state(len(first_step), first_step.device)[0], first_step)
        )

    def forward(self, x: torch.Tensor, state: State = None) -> tuple[torch.Tensor, State]:
        self._check_input(x)
        T, B, _ = x.shape
        window, steps = self.initial_state(B, x.device) if state is None else state
        if self.embedding is not None:
            x = self.embedding(x, steps)
        frames = torch.cat([window.transpose(0, 1), x])  # [T + k - 1, B, input_size], oldest first
        y = self.core(frames.permute(1, 2, 0))  # [B, h, T]
        return y.permute(2, 0, 1), (frames[T:].transpose(0, 1).contiguous(), steps + T)

    def bound_(self) -> None:
        if self.embedding is not None:
            self.embedding.bound_()

    def activation_floats(self) -> int:
        # the (embedded) input the convolution keeps, its code, the output
        return 2 * self.input_size + self.hidden_size
