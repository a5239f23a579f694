"""The Linear Recurrent Unit (Orvieto, Smith, Gu, Fernando, Gulcehre, Pascanu and De, 2023, "Resurrecting Recurrent
Neural Networks for Long Sequences"), in one block of the paper's deep model.

The LRU (the paper's exponential parameterisation and its gamma normalisation), on an H-wide input u_t, state x in
C^N:

    Lambda = exp(-exp(nu_log) + i exp(theta_log))          diagonal decay, |Lambda| < 1 for any finite nu_log
    x_t    = Lambda * x_{t-1} + exp(gamma_log) * (B u_t)    B = B_re + i B_im  [N, H]
    y_t    = Re(C x_t) + D * u_t                            C = C_re + i C_im  [H, N], D in R^H

Initialisation (the paper's appendix code): Lambda uniform on the ring r_min <= |Lambda| <= r_max with phase in
[0, max_phase]: nu_log = log(-log(u1 (r_max^2 - r_min^2) + r_min^2) / 2), theta_log = log(max_phase u2), u1, u2
~ U(0, 1); gamma_log = log(sqrt(1 - |Lambda|^2)), then trained as a parameter of its own; B_re, B_im ~ N(0, 1 / (2H)),
C_re, C_im ~ N(0, 1 / N), D ~ N(0, 1). The defaults are that code's, r_min = 0, r_max = 1 (the spectrum of a
Glorot-initialised dense linear RNN, Theorem 3.1) and max_phase = 2 pi (Lemma 3.2; the code writes 6.28). For its
long-range tasks the paper moves the ring towards |Lambda| = 1 and, for PathX, restricts the phase to [0, pi / 10]
(policy.lru.r_min, r_max, max_phase).

The block around it (the paper's deep model: a linear encoder, then per layer norm -> LRU -> GELU -> GLU with a skip
connection), here with one layer and no dropout:

    h_t = W_enc z_t + b_enc                                 [H], H = hidden_size
    u_t = LayerNorm(h_t)
    v_t = GELU(y_t)                                         y_t the LRU's output on u_t
    out_t = h_t + (W_1 v_t + b_1) * sigmoid(W_2 v_t + b_2)  [H]

The paper allows BatchNorm or LayerNorm: LayerNorm here, as batch statistics would differ between an update's
windows and an acting step. GELU is torch's exact (erf) form. The paper's classifier's pooling and decoder are left
out: the block's output is the memory's, as wide as a GRU's of hidden_size.

State: x_T, complex [B, N] (complex64; complex128 for a float64 model), N = state_size (None: hidden_size), 2 N
floats. POPGym has no LRU: tests/test_zoo_lru.py holds it to the equations above written out in float64, and its
recurrence (Lambda, gamma, B, C, D) to lru-pytorch's ``LRU`` on the copied weights inside this block. The window is
pomdp_ffm/seq_models/recurrence.py's ``linear_scan`` (a constant complex decay), the acting step its T = 1 case.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ..options import LRUConfig
from ..rules import options_of
from .base import SeqModel, State
from .recurrence import linear_scan


class LRU(SeqModel):
    """One block of the paper's deep LRU (module docstring) mapping [T, B, input_size] to [T, B, hidden_size]."""

    def __init__(self, input_size: int, hidden_size: int, **options):
        """``options``: policy.lru's (options.LRUConfig: their defaults and rules)."""
        super().__init__()
        o = options_of(LRUConfig, options, "policy.lru")
        self.input_size, self.hidden_size = input_size, hidden_size
        self.state_size = N = hidden_size if o.state_size is None else o.state_size
        H = hidden_size
        self.encoder = nn.Linear(input_size, H)
        self.norm = nn.LayerNorm(H)
        self.glu = nn.Linear(H, 2 * H)  # W_1 (value) over W_2 (gate), F.glu's halves
        # The ring initialisation in float64: in float32, exp(-exp(nu_log)) of a radius within 6e-8 of 1 rounds to 1
        # and its gamma to 0. The radius^2 is kept off 0 and 1, where nu_log or gamma_log would be infinite.
        f64 = torch.float64
        u1, u2 = torch.rand(N, dtype=f64), torch.rand(N, dtype=f64)
        tiny = torch.finfo(f64).tiny
        radius2 = (u1 * (o.r_max**2 - o.r_min**2) + o.r_min**2).clamp(tiny, 1 - 2**-53)
        nu = -0.5 * torch.log(radius2)
        self.nu_log = nn.Parameter(torch.log(nu).float())
        self.theta_log = nn.Parameter(torch.log((o.max_phase * u2).clamp_min(tiny)).float())
        self.gamma_log = nn.Parameter((0.5 * torch.log(-torch.expm1(-2 * nu))).float())  # log sqrt(1 - |Lambda|^2)
        self.B_re = nn.Parameter(torch.randn(N, H) / math.sqrt(2 * H))
        self.B_im = nn.Parameter(torch.randn(N, H) / math.sqrt(2 * H))
        self.C_re = nn.Parameter(torch.randn(H, N) / math.sqrt(N))
        self.C_im = nn.Parameter(torch.randn(H, N) / math.sqrt(N))
        self.D = nn.Parameter(torch.randn(H))

    def initial_state(self, batch_size: int, device=None) -> State:
        dtype = torch.complex128 if self.nu_log.dtype == torch.float64 else torch.complex64
        return torch.zeros(batch_size, self.state_size, dtype=dtype, device=device)

    def decay(self) -> torch.Tensor:
        """Lambda = exp(-exp(nu_log) + i exp(theta_log)): [N] complex."""
        return torch.exp(torch.complex(-torch.exp(self.nu_log), torch.exp(self.theta_log)))

    def forward(self, x: torch.Tensor, state: State = None) -> tuple[torch.Tensor, State]:
        self._check_input(x)
        h = self.encoder(x)
        u = self.norm(h)
        # gamma * (B u) as one real matmul for (Re, Im), scaled after it: the same products as B_norm = gamma B
        Bu = F.linear(u, torch.cat([self.B_re, self.B_im])) * torch.exp(self.gamma_log).repeat(2)
        Bu = torch.complex(*Bu.chunk(2, dim=-1))
        s = linear_scan(self.decay().view(1, 1, -1), Bu, state)
        # Re(C x) = C_re Re x - C_im Im x
        y = F.linear(torch.cat([s.real, s.imag], dim=-1), torch.cat([self.C_re, -self.C_im], dim=-1)) + self.D * u
        return h + F.glu(self.glu(F.gelu(y)), dim=-1), s[-1]

    def activation_floats(self) -> int:
        # h, u, y, GELU's v, the GLU's 2H; B u before and after gamma's scaling, the states and their (Re, Im) for
        # C (2N each); measured with saved_tensors_hooks: 2244 at H = N = 128
        N, H = self.state_size, self.hidden_size
        return 6 * H + 2 * N * 6

    def extra_repr(self) -> str:
        return f"input_size={self.input_size}, hidden_size={self.hidden_size}, state_size={self.state_size}"
