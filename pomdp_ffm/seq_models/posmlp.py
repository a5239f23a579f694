"""PosMLP: a memoryless two-layer MLP whose input carries the time step, the "PosMLP" of POPGym's baseline table
(Morad, Kortvelesy, Bettini, Liwicki, Prorok, 2023, "POPGym: Benchmarking Partially Observable Reinforcement
Learning"; POPGym's ``ray_models/ray_mlp.py`` class ``MLP``, whose default cfg turns the "sine" time embedding on;
its ``BasicMLP``, the embedding off, is the table's "MLP").

    e_t = (1 - s) x_t + s PE(t)                          time embedding, s = clamp(strength, 0, 1), strength_0 = 0.5
    y_t = LeakyReLU(W2 LeakyReLU(W1 e_t + b1) + b2)      W1: [h, input_size], W2: [h, h]; h = hidden_size

with t the step's index in its episode and PE the sinusoidal position code of Vaswani et al. (2017) over the
input's d = input_size features, its frequency base being the horizon N (POPGym's ``max_seq_len``, 1024 in its
experiments) instead of the transformer's 10000:

    PE(t)[2i] = sin(t N^(-2i/d)),  PE(t)[2i+1] = cos(t N^(-2i/d)),  i = 0 .. ceil(d/2) - 1.

State: the step count, an int64 tensor [B] (the index of the next input), so that acting one step at a time
continues the time index, and a training window starting mid-episode starts at its first step's index
(``window_state``; POPGym's ``t_starts``; patches/023). hidden_size is POPGym's hidden_size,
the width of both layers.

The time embedding is the shared ``SineTimeEmbedding`` of time_embedding.py (Stack, TCN, FART and FWP use it
too), always on here: PosMLP has no ``embedding`` switch. Its deliberate differences from POPGym's (no table, so no
limit on the time index; an odd width; how the strength is clamped; its place after the preprocessor) are listed
there.
"""

from __future__ import annotations

import torch
from torch import nn

from ..options import PosMLPConfig
from ..rules import options_of
from .base import SeqModel, State
from .time_embedding import SineTimeEmbedding


def leaky_mlp(input_size: int, hidden_size: int) -> nn.Sequential:
    """POPGym's two-layer core: Linear, LeakyReLU, Linear, LeakyReLU (torch's default init, as POPGym leaves it)."""
    return nn.Sequential(
        nn.Linear(input_size, hidden_size), nn.LeakyReLU(), nn.Linear(hidden_size, hidden_size), nn.LeakyReLU()
    )


class PosMLP(SeqModel):
    """The time-embedded two-layer MLP (module docstring); state: the step count, int64 [B]."""

    def __init__(self, input_size: int, hidden_size: int, **options):
        """``options``: policy.posmlp's (options.PosMLPConfig: their defaults and rules)."""
        super().__init__()
        o = options_of(PosMLPConfig, options, "policy.posmlp")
        self.input_size, self.hidden_size = input_size, hidden_size
        self.embedding = SineTimeEmbedding(input_size, o.embedding_horizon, o.scale_embedding)
        self.core = leaky_mlp(input_size, hidden_size)

    def initial_state(self, batch_size: int, device=None) -> State:
        return torch.zeros(batch_size, dtype=torch.long, device=device)

    def window_state(self, first_step: torch.Tensor) -> State:
        return first_step

    def forward(self, x: torch.Tensor, state: State = None) -> tuple[torch.Tensor, State]:
        self._check_input(x)
        steps = self.initial_state(x.shape[1], x.device) if state is None else state
        return self.core(self.embedding(x, steps)), steps + x.shape[0]

    def bound_(self) -> None:
        self.embedding.bound_()

    def activation_floats(self) -> int:
        # the embedded input (and its code), both layers' outputs and their activations
        return 2 * self.input_size + 4 * self.hidden_size
