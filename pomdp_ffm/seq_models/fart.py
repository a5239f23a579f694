"""Linear attention, the Fast Autoregressive Transformer (Katharopoulos, Vyas, Pappas and Fleuret, ICML 2020,
"Transformers are RNNs: Fast Autoregressive Transformers with Linear Attention"), as POPGym's ray_linear_attention
runs it (``LinearAttention``: one ``LinearAttentionBlock``, one head, then a Linear to the output width).

One window, x_t [I] the input, t the episode's step count (the attention part is the paper's causal
linear attention with its feature map phi):

    x_t <- (1 - s) x_t + s pe(t)                       POPGym's sine time embedding (time_embedding.py)
    x_t <- LayerNorm(x_t)                                  (affine)
    k_t = phi(W_k x_t), q_t = phi(W_q x_t), v_t = W_v x_t   phi(a) = elu(a) + 1, no biases, each [h]
    S_t = S_{t-1} + k_t v_t^T                              [h, h]  the summed key-value memory
    z_t = z_{t-1} + k_t                                    [h]     the normaliser
    a_t = S_t^T q_t / (q_t . z_t + 1e-5)                   [h]     causal linear attention
    y_t = U(relu(F_2 relu(F_1 a_t + c_1) + c_2) + R x_t + r)   [hidden_size]

with pe(t)_{2i} = sin(t w_i), pe(t)_{2i+1} = cos(t w_i), w_i = N^(-2i / I), N = ``embedding_horizon`` (POPGym's
positional_encoding over RLlib's max_seq_len, 1024 in its experiments) and s in [0, 1] a learned strength (0.5 at
first; with ``scale_embedding`` off, x_t + pe(t)). S and z are the summed recurrence X_t = X_{t-1} + x_t, evaluated
by the shared engine ``recurrence.linear_scan`` with a = 1 (a cumulative sum); with the option
``*_aggregator="max"`` (POPGym's alternative) the sum becomes a running elementwise maximum, X_t = max(X_{t-1}, x_t).

State: (S [B, h, h], z [B, h], t [B] int64), batch first, h^2 + h floats and the step count a row; S[b, i, j] =
sum_t k_t[i] v_t[j], POPGym's layout less its singleton time dim. The step count is carried (POPGym's t_starts,
which RLlib keeps in the state) so that the acting step embeds the right time; a zero state starts an episode at
t = 0. Without the embedding the step count is still carried, unused.

Sizes: hidden_size is POPGym's hidden_size H, the output width; the key/value width is h = round(sqrt(H) - 1), as
ray_linear_attention sets it (state floats h^2 + h ~ H), so H >= 3. Parameters: norm, key, query, value, ff.0,
ff.2, shortcut (POPGym's ``core.*``), unmap, and with the scaled embedding embedding.strength (POPGym's
``embedding_strength``), initialised as POPGym's (torch's defaults, strength 0.5).

Deliberate differences from POPGym:
- POPGym's sum aggregation clamps each window's cumulative sum to +-1e20 before adding the carried state; the scan
  has no clamp (a float32 sum near 1e20 has diverged anyway; below it the two agree).
- The time embedding is the shared one (time_embedding.py), with the differences from POPGym's listed there: pe(t)
  computed from t (no table, so no limit on the time index), an odd input width dropping the last cosine, and the
  strength used clamped to [0, 1] in the call (POPGym clamps it in place at each call), the parameter clamped in
  place by ``bound_``, which the agent's update calls after each optimiser write.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ..options import FARTConfig, fart_width
from ..rules import options_of
from .base import SeqModel, State
from .summed_memory import EPS, accumulate, feed_forward
from .time_embedding import sine_embedding


class FART(SeqModel):
    """POPGym's linear attention (FART) as a drop-in for a GRU; the state is (S [B, h, h], z [B, h], t [B])."""

    def __init__(self, input_size: int, hidden_size: int, **options):
        """``options``: policy.fart's (options.FARTConfig: their defaults, POPGym's, and rules)."""
        super().__init__()
        o = options_of(FARTConfig, options, "policy.fart")
        h = fart_width(hidden_size)
        if h < 1:
            raise ValueError(f"FART needs hidden_size >= 3 (width round(sqrt(H) - 1) >= 1), got {hidden_size}")
        self.input_size, self.hidden_size, self.width = input_size, hidden_size, h
        self.s_aggregator, self.z_aggregator = o.s_aggregator, o.z_aggregator
        self.embedding = sine_embedding(o.embedding, input_size, o.embedding_horizon, o.scale_embedding)
        self.norm = nn.LayerNorm(input_size)
        self.key = nn.Linear(input_size, h, bias=False)
        self.query = nn.Linear(input_size, h, bias=False)
        self.value = nn.Linear(input_size, h, bias=False)
        self.ff = feed_forward(h)
        self.shortcut = nn.Linear(input_size, h)
        self.unmap = nn.Linear(h, hidden_size)

    def initial_state(self, batch_size: int, device=None) -> State:
        h, dtype = self.width, self.unmap.weight.dtype
        return (
            torch.zeros(batch_size, h, h, dtype=dtype, device=device),
            torch.zeros(batch_size, h, dtype=dtype, device=device),
            torch.zeros(batch_size, dtype=torch.long, device=device),
        )

    def window_state(self, first_step: torch.Tensor) -> State:
        return (
            None
            if self.embedding is None
            else (*self.initial_state(len(first_step), first_step.device)[:2], first_step)
        )

    def forward(self, x: torch.Tensor, state: State = None) -> tuple[torch.Tensor, State]:
        self._check_input(x)
        T, B, _ = x.shape
        S0, z0, t0 = self.initial_state(B, x.device) if state is None else state
        if self.embedding is not None:
            x = self.embedding(x, t0)
        x = self.norm(x)
        k = F.elu(self.key(x)) + 1
        q = F.elu(self.query(x)) + 1
        v = self.value(x)
        S = accumulate(self.s_aggregator, k.unsqueeze(-1) * v.unsqueeze(-2), S0)  # [T, B, h, h]
        z = accumulate(self.z_aggregator, k, z0)  # [T, B, h]
        attended = torch.einsum("tbi,tbij->tbj", q, S) / ((q * z).sum(-1, keepdim=True) + EPS)
        y = self.unmap(self.ff(attended) + self.shortcut(x))
        return y, (S[-1], z[-1], t0 + T)

    def bound_(self) -> None:
        if self.embedding is not None:
            self.embedding.bound_()

    def activation_floats(self) -> int:
        # embedding and LayerNorm inputs, the normed input (for the four Linears), k, q, v and their
        # preactivations, S and z (saved by the read-out), the read-out's numerator and result, the perceptron's
        # four, the shortcut, the output; a running max also keeps its argmax indices (int64: two floats each).
        h = self.width
        floats = 3 * self.input_size + h * h + 14 * h + self.hidden_size
        floats += 2 * h * h * (self.s_aggregator == "max") + 2 * h * (self.z_aggregator == "max")
        return floats

    def extra_repr(self) -> str:
        return f"input_size={self.input_size}, hidden_size={self.hidden_size}, width={self.width}"
