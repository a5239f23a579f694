"""Fast weight programmer (Schlag, Irie and Schmidhuber, ICML 2021, "Linear Transformers Are Secretly Fast Weight
Programmers"), as POPGym's ray_fwp runs it (``FastWeightProgrammer``: one ``FWPBlock``, then a Linear to the output
width). POPGym's is the paper's "simplified" programmer: the purely additive fast-weight update (no delta rule, no
learned write strength beta), ReLU in place of DPFP as the feature map, and the paper's sum normalisation of
keys and queries.

One window, x_t [I] the input, t the episode's step count:

    x_t <- (1 - s) x_t + s pe(t)                   POPGym's sine time embedding (time_embedding.py)
    x_t <- LayerNorm(x_t)                              (affine)
    k_t = relu(W_k x_t), q_t = relu(W_q x_t), v_t = W_v x_t        no biases, each [h]
    k_t <- k_t / (1e-5 + sum_j k_t[j]),  q_t <- q_t / (1e-5 + sum_j q_t[j])   (sum_normalization)
    W_t = W_{t-1} + v_t k_t^T                          [h, h]  the fast weights, programmed by the slow net
    a_t = W_t q_t                                      [h]     the fast net's output
    y_t = U(relu(F_2 relu(F_1 a_t + c_1) + c_2) + R x_t + r)   [hidden_size]

The update is a sum, a linear recurrence with a = 1, so W is evaluated by the shared engine
``recurrence.linear_scan``; with ``aggregator="max"`` (POPGym's alternative) W_t = max(W_{t-1}, v_t k_t^T)
elementwise. (The paper's delta rule, W_t = W_{t-1} + beta_t (v_t - W_{t-1} k_t) k_t^T, is not diagonal and not
what POPGym runs.)

State: (W [B, h, h], t [B] int64), batch first, h^2 floats and the step count a row; W[b, i, j] = sum_t v_t[i]
k_t[j], POPGym's layout less its singleton time dim. The step count (POPGym's t_starts) feeds the embedding; a zero
state starts an episode at t = 0; without the embedding it is carried, unused.

Sizes: hidden_size is POPGym's hidden_size H, the output width; the key/value width is h = round(sqrt(H)), as
ray_fwp sets it (state floats h^2 ~ H). Parameters: norm, key, query, value, ff.0, ff.2, shortcut (POPGym's
``core.*``), unmap, and with the scaled embedding embedding.strength (POPGym's ``embedding_strength``), initialised
as POPGym's. The embedding's options (``embedding``, ``embedding_horizon``, ``scale_embedding``) are
the shared ones of time_embedding.py.

Deliberate differences from POPGym (as fart.py's): no +-1e20 clamp on the window's sum; the shared time
embedding's (time_embedding.py: pe(t) computed from t, so it continues past embedding_horizon where POPGym's table
ends; an odd input width drops the last cosine; the strength used clamped, and clamped in place by ``bound_``
after each optimiser write).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ..options import FWPConfig
from ..rules import options_of
from .base import SeqModel, State
from .summed_memory import EPS, accumulate, feed_forward
from .time_embedding import sine_embedding


def fwp_width(hidden_size: int) -> int:
    """ray_fwp's key/value width h = round(sqrt(H))."""
    return round(math.sqrt(hidden_size))


class FWP(SeqModel):
    """POPGym's fast weight programmer as a drop-in for a GRU; the state is (W [B, h, h], t [B])."""

    def __init__(self, input_size: int, hidden_size: int, **options):
        """``options``: policy.fwp's (options.FWPConfig: their defaults, POPGym's, and rules)."""
        super().__init__()
        o = options_of(FWPConfig, options, "policy.fwp")
        h = fwp_width(hidden_size)
        if h < 1:
            raise ValueError(f"FWP needs hidden_size >= 1, got {hidden_size}")
        self.input_size, self.hidden_size, self.width = input_size, hidden_size, h
        self.aggregator, self.sum_normalization = o.aggregator, o.sum_normalization
        self.embedding = sine_embedding(o.embedding, input_size, o.embedding_horizon, o.scale_embedding)
        self.norm = nn.LayerNorm(input_size)
        self.key = nn.Linear(input_size, h, bias=False)
        self.query = nn.Linear(input_size, h, bias=False)
        self.value = nn.Linear(input_size, h, bias=False)
        self.ff = feed_forward(h)
        self.shortcut = nn.Linear(input_size, h)
        self.unmap = nn.Linear(h, hidden_size)

    def initial_state(self, batch_size: int, device=None) -> State:
        h = self.width
        return (
            torch.zeros(batch_size, h, h, dtype=self.unmap.weight.dtype, device=device),
            torch.zeros(batch_size, dtype=torch.long, device=device),
        )

    def window_state(self, first_step: torch.Tensor) -> State:
        return (
            None if self.embedding is None else (self.initial_state(len(first_step), first_step.device)[0], first_step)
        )

    def forward(self, x: torch.Tensor, state: State = None) -> tuple[torch.Tensor, State]:
        self._check_input(x)
        T, B, _ = x.shape
        W0, t0 = self.initial_state(B, x.device) if state is None else state
        if self.embedding is not None:
            x = self.embedding(x, t0)
        x = self.norm(x)
        k = F.relu(self.key(x))
        q = F.relu(self.query(x))
        v = self.value(x)
        if self.sum_normalization:
            k = k / (EPS + k.sum(-1, keepdim=True))
            q = q / (EPS + q.sum(-1, keepdim=True))
        W = accumulate(self.aggregator, v.unsqueeze(-1) * k.unsqueeze(-2), W0)  # [T, B, h, h]
        fast = torch.einsum("tbij,tbj->tbi", W, q)
        y = self.unmap(self.ff(fast) + self.shortcut(x))
        return y, (W[-1], t0 + T)

    def bound_(self) -> None:
        if self.embedding is not None:
            self.embedding.bound_()

    def activation_floats(self) -> int:
        # embedding and LayerNorm inputs, the normed input (for the four Linears), k, q, v, their
        # preactivations and normalised forms, W (saved by the read-out), the read-out, the perceptron's four,
        # the shortcut, the output; a running max also keeps its argmax indices (int64: two floats each).
        h = self.width
        floats = 3 * self.input_size + h * h + 15 * h + self.hidden_size
        return floats + 2 * h * h * (self.aggregator == "max")

    def extra_repr(self) -> str:
        return f"input_size={self.input_size}, hidden_size={self.hidden_size}, width={self.width}"
