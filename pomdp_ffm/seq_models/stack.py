"""Frame stacking (Mnih et al., 2015, "Human-level control through deep reinforcement learning"), as POPGym's
baseline "Fr.Stack" (Morad et al., 2023, "POPGym: Benchmarking Partially Observable Reinforcement Learning";
POPGym's ``ray_models/ray_framestack.py`` class ``Framestack``): the last k = stack_size inputs, each compressed to
h / k features by one shared Linear, concatenated oldest first and passed through a two-layer MLP:

    e_t = (1 - s) x_t + s PE(t)                                  POPGym's sine time embedding (time_embedding.py)
    c_t = C e_t + b_C                                            C: [h / k, input_size]
    y_t = LeakyReLU(W2 LeakyReLU(W1 [c_{t-k+1} || ... || c_t] + b1) + b2)      W1, W2: [h, h]

with e_t = 0 before the episode's first step (the zero initial window) and h = hidden_size, POPGym's hidden_size,
which k must divide (POPGym's assertion: the k compressed frames fill the MLP's input exactly, so that the stack
holds no more features than the other models' memories).

State: (window, steps): the last k - 1 embedded inputs e_{t-k+2} .. e_t, batch-first [B, k - 1, input_size]
(POPGym's layout, oldest first), and the step count, int64 [B], the time index of the next input (counted whether
or not the embedding reads it). Acting is O(1) per step: one step compresses the window's k frames.

Here the compression runs once per frame of the window (T + k - 1 of them) where POPGym's runs once per frame of
each stack (T k): the same products. The embedding is time_embedding.py's, shared with the other models; its
differences from POPGym's (no table, so no limit on the time index) are listed there.
"""

from __future__ import annotations

import torch
from torch import nn

from ..options import StackConfig
from ..rules import options_of
from .base import SeqModel, State
from .posmlp import leaky_mlp
from .time_embedding import sine_embedding


class Stack(SeqModel):
    """POPGym's frame stack (module docstring); state ``(window [B, k - 1, input_size], steps int64 [B])``."""

    def __init__(self, input_size: int, hidden_size: int, **options):
        """``options``: policy.stack's (options.StackConfig: their defaults and rules)."""
        super().__init__()
        o = options_of(StackConfig, options, "policy.stack")
        stack_size = o.stack_size
        if hidden_size % stack_size:
            raise ValueError(f"Stack's hidden_size={hidden_size} must be a multiple of stack_size={stack_size}")
        self.input_size, self.hidden_size, self.stack_size = input_size, hidden_size, stack_size
        self.embedding = sine_embedding(o.embedding, input_size, o.embedding_horizon, o.scale_embedding)
        self.compress = nn.Linear(input_size, hidden_size // stack_size)
        self.core = leaky_mlp(hidden_size, hidden_size)

    def initial_state(self, batch_size: int, device=None) -> State:
        shape = (batch_size, self.stack_size - 1, self.input_size)
        window = torch.zeros(shape, dtype=self.compress.weight.dtype, device=device)  # float64 for a float64 model
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
        c = self.compress(frames)
        stacked = torch.cat([c[i : i + T] for i in range(self.stack_size)], dim=-1)  # [T, B, h]
        return self.core(stacked), (frames[T:].transpose(0, 1).contiguous(), steps + T)

    def bound_(self) -> None:
        if self.embedding is not None:
            self.embedding.bound_()

    def activation_floats(self) -> int:
        # the (embedded) input, its compression, the stack, two layers' outputs and activations
        return 2 * self.input_size + self.hidden_size // self.stack_size + 5 * self.hidden_size
