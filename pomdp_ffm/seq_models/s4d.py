"""S4D, the diagonal structured state space layer (Gu, Gupta, Goel and Re, 2022, "On the Parameterization and
Initialization of Diagonal State Space Models"), as POPGym's S4D memory wraps it (ray_models/ray_s4d.py: a Linear
into POPGym's S4 layer with mode="diag", measure="diag-lin", disc="zoh", real_type="exp", one channel).

Per step t, for each of the H = hidden_size features h and each of its n = d_state / 2 complex modes (the other
half of the paper's d_state are their conjugates, folded into the factor 2 of the read-out):

    u_t  = W_in x_t + b_in                                           POPGym's ``map``        [H]
    A    = -exp(a_re) + i a_im,   dt = exp(log_dt)                   continuous diagonal     [H, n]
    dA   = exp(dt A),             dB = B (exp(dt A) - 1) / A         zero-order hold ("zoh")
      or  dA = (1 + dt A / 2) / (1 - dt A / 2),  dB = B dt / (1 - dt A / 2)   ("bilinear")
    S_t  = dA * S_{t-1} + dB * u_t                                   complex state           [H, n]
    v_t  = 2 Re(sum_n C * S_t) + D * u_t                             read-out and skip       [H]
    y_t  = GLU(W_out GELU(v_t) + b_out)                              W_out: H -> 2H          [H]

The window runs the recurrence through the shared engine ``recurrence.linear_scan`` (its chunked or log-depth form), not
the paper's FFT convolution with the kernel K_l = 2 Re(C dA^l dB), so a carried-in state enters exactly and the
acting step (T = 1) is one multiply-add, O(H n).

State: complex64 (complex128 for a float64 model) ``[B, H, d_state // 2]``, S_t above: POPGym's (real, imag)
pair as one complex tensor. hidden_size is POPGym's hidden_size, the S4 layer's d_model H; d_state defaults to
POPGym's round(sqrt(H) / 2) * 2 (6 for H = 32, 12 for H = 128), so the state holds H * d_state / 2 complex numbers.

Parameters and initialisation are POPGym's (S4D-Lin): a_re = log(0.5), a_im = pi * n, B = 1, C ~ complex normal
(variance 1 per entry), D ~ N(0, 1), log_dt ~ U(log dt_min, log dt_max), the Linears torch's default.

Deliberate differences from POPGym's code:
- POPGym's training path (ray_s4d.forward_memory on a window) calls the convolution without the state: every
  window starts from a zero state and the state it returns is the one it was given. Here a window starts from the
  carried-in state and returns its last state, what POPGym's acting path (``step``) would have reached.
- POPGym computes the step's dA, dB once, at the first acting call, and keeps them after the weights change; here
  they are recomputed from the weights at every call.
- POPGym's S4 forwards the state through a window under no_grad; here the final state is differentiable.
- POPGym's diagonal kernel registers a parameter ``A`` (its initial A as real pairs) that nothing reads; it has no
  counterpart here.
- dropout is POPGym's default 0 (none); d_state is at least 2 (POPGym's formula gives 0 for H = 1).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ..options import S4DConfig
from ..rules import options_of
from .base import SeqModel, State
from .recurrence import linear_scan


def popgym_d_state(hidden_size: int) -> int:
    """POPGym's d_state for a hidden size H: round(sqrt(H) / 2) * 2 (Python's round), at least 2."""
    return max(2, round(hidden_size**0.5 / 2) * 2)


def s4d_init_imag(init: str, d_state: int) -> torch.Tensor:
    """The imaginary parts of A's n = d_state / 2 modes: pi n (S4D-Lin) or d_state / pi (d_state / (1 + 2 n) - 1)
    (S4D-Inv); the real parts are -1/2 in both."""
    n = torch.arange(d_state // 2, dtype=torch.float32)
    if init == "lin":
        return math.pi * n
    return d_state / math.pi * (d_state / (1 + 2 * n) - 1)


class S4D(SeqModel):
    """S4D as a drop-in for a GRU (module docstring); the state is complex ``[B, hidden_size, d_state // 2]``."""

    def __init__(self, input_size: int, hidden_size: int, **options):
        """``options``: policy.s4d's (options.S4DConfig: their defaults and rules)."""
        super().__init__()
        o = options_of(S4DConfig, options, "policy.s4d")
        self.input_size, self.hidden_size = input_size, hidden_size
        self.d_state = popgym_d_state(hidden_size) if o.d_state is None else o.d_state
        self.disc, self.init = o.disc, o.init
        H, n = hidden_size, self.d_state // 2
        self.map = nn.Linear(input_size, H)
        self.log_dt = nn.Parameter(torch.rand(H) * (math.log(o.dt_max) - math.log(o.dt_min)) + math.log(o.dt_min))
        self.inv_A_real = nn.Parameter(torch.full((H, n), math.log(0.5)))  # A's real part is -exp(inv_A_real)
        self.A_imag = nn.Parameter(s4d_init_imag(o.init, self.d_state).repeat(H, 1))
        self.B = nn.Parameter(torch.view_as_real(torch.ones(H, n, dtype=torch.cfloat)).clone())  # (re, im) pairs
        self.C = nn.Parameter(torch.view_as_real(torch.randn(H, n, dtype=torch.cfloat)).clone())
        self.D = nn.Parameter(torch.randn(H))
        self.out = nn.Linear(H, 2 * H)  # into the GLU

    def initial_state(self, batch_size: int, device=None) -> State:
        dtype = torch.complex128 if self.C.dtype == torch.float64 else torch.complex64
        return torch.zeros(batch_size, self.hidden_size, self.d_state // 2, dtype=dtype, device=device)

    def discretised(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(dA, dB), each complex [H, d_state // 2]: the recurrence's decay and input weight."""
        dt = torch.exp(self.log_dt).unsqueeze(-1)
        A = torch.complex(-torch.exp(self.inv_A_real), self.A_imag)
        B = torch.view_as_complex(self.B)
        dtA = A * dt
        if self.disc == "zoh":
            dA = torch.exp(dtA)
            return dA, B * (dA - 1.0) / A
        return (1.0 + dtA / 2) / (1.0 - dtA / 2), B * dt / (1.0 - dtA / 2)

    def forward(self, x: torch.Tensor, state: State = None) -> tuple[torch.Tensor, State]:
        self._check_input(x)
        T, B, _ = x.shape
        s0 = self.initial_state(B, x.device) if state is None else state
        u = self.map(x)  # [T, B, H]
        dA, dB = self.discretised()
        # S_t = dA S_{t-1} + dB u_t: the decay constant in time (a leading dim of 1), T = 1 a single multiply-add
        S = linear_scan(dA.unsqueeze(0).unsqueeze(0), dB * u.unsqueeze(-1), s0)  # [T, B, H, n]
        v = 2 * (S * torch.view_as_complex(self.C)).real.sum(-1) + self.D * u
        y = F.glu(self.out(F.gelu(v)), dim=-1)
        return y, S[-1]

    def activation_floats(self) -> int:
        # u, GELU's input and output, the GLU's input (5 H); the scan's input and its states S (complex: 2 floats
        # each; the scan's backward needs no more); measured with saved_tensors_hooks: 3794 at H = 128, N = 12.
        return 5 * self.hidden_size + 2 * 2 * self.hidden_size * (self.d_state // 2)

    def extra_repr(self) -> str:
        return (
            f"input_size={self.input_size}, hidden_size={self.hidden_size}, d_state={self.d_state}, "
            f"init={self.init}, disc={self.disc}"
        )
