"""S5, the simplified state space layer (Smith, Warrington and Linderman, ICLR 2023, "Simplified State Space Layers for
Sequence Modeling"): one multi-input multi-output linear SSM with a diagonal complex state matrix, run as a
recurrence, inside the block of the PyTorch package s5-pytorch 0.2.1 (s5/s5_model.py, ``S5Block``).

The SSM, on an H-wide input u_t, with P = state_size and the paper's conjugate symmetry (the authors' ``conj_sym``,
on by default): P / 2 complex states x, the other P / 2 their conjugates, folded into the factor 2 of the read-out:

    Lambda     = Lambda_re + i Lambda_im                       [P/2]   continuous-time eigenvalues
    Delta      = exp(log_step)                                 [P/2]   a learned step per state
    Lambda_bar = exp(Lambda Delta)                                     zero-order hold (ZOH)
    B_bar      = (Lambda_bar - 1) / Lambda * B~                [P/2, H], B~ = B_re + i B_im
    x_t        = Lambda_bar * x_{t-1} + B_bar u_t              [P/2]   complex
    y_t        = 2 Re(C~ x_t) + D * u_t                        [H],    C~ = C_re + i C_im [H, P/2], D in R^H

The block around it (the package's ``S5Block`` with ff_mult = 1, glu = True, no dropout), after a Linear input
embedding to hidden_size H (the memory's input is input_size wide):

    h_t   = W_in z_t + b_in                                    [H]
    u_t   = LayerNorm_1(h_t)                                   (the package's ``attn_norm``)
    v_t   = GELU(y_t) + u_t                                    y_t the SSM's output on u_t
    w_t   = LayerNorm_2(v_t)                                   (``ff_norm``)
    a, g  = W_enc w_t                                          W_enc: H -> 2H, no bias (``ff_enc``)
    out_t = W_dec (a * GELU(g)) + w_t                          W_dec: H -> H, no bias (``ff_dec``; a GEGLU)

The residuals add the normalised values (u_t, w_t), not the block's inputs, as the package's block does; GELU is
torch's exact (erf) form. The package's block carries a state (``return_state``), so it is the block here rather than
the paper's (its norm, SSM, GELU or GLU, dropout, skip of the unnormalised input).

Initialisation (the paper's, as the authors' code lindermanlab/S5 does it: s5/train.py, s5/ssm_init.py, s5/ssm.py,
which the package ports): Lambda and its eigenvectors V are those of HiPPO-N, the normal part of the
HiPPO-LegS matrix, S = -I/2 + K with K skew-symmetric, K[n, k] = -sign(n - k) sqrt((2n + 1)(2k + 1)) / 2, of size
P / J (J = ``blocks``), diagonalised as a Hermitian matrix (-i K = V diag(mu) V*, Lambda = -1/2 + i mu) in float64 and
repeated J times on a block diagonal (the paper's block-diagonal initialisation); of each block's P / J eigenvalues
the half with mu < 0 is kept (their conjugates are the other half). B~ = V^-1 B with B real [P, H] drawn from a
truncated normal of variance 1 / P, C~ = C V with C's real and imaginary parts [H, P] each drawn from a truncated
normal of variance 1 / P (the authors' lecun_normal and ``trunc_standard_normal``: truncated at two standard
deviations and rescaled, as jax's lecun_normal); D ~ N(0, 1) (the authors' code; the package draws U(0, 1));
log_step ~ U(log dt_min, log dt_max). The Linear input embedding, the LayerNorms (1, 0) and W_enc, W_dec are torch's
default, as the package's block leaves them.

Defaults: state_size null (P = hidden_size) is the package's (``S5(width, state_width=None)``: P / 2 complex
numbers = P floats, a GRU's state of the same width); blocks J = 8 is the authors' code's (run_train.py; the paper's
tasks all use J > 1, blocks of 2 to 128 eigenvalues: bin/run_experiments/), where the package's is 1: one HiPPO-N
block of P = 128 has eigenvalues up to 5215i, which at steps up to dt_max turn by hundreds of radians per step, blocks
of 16 up to 81i; dt_min = 0.001, dt_max = 0.1 are the paper's and the package's. clip_eigs (on: Lambda_re used as
min(Lambda_re, -1e-4), with no gradient where it clips) is the authors' code's option, off by default there and
recommended by its docstring for unbounded sequence lengths, which an agent's episodes are: no state grows without
bound while acting.

Deliberate differences from s5-pytorch 0.2.1:
- Lambda_re is used clipped to <= -1e-4 (clip_eigs, above); the package leaves it free (a TODO in its S5SSM). At
  the initial -1/2 the clip is the identity, values and gradients.
- blocks J = 8 by default (the package's block_count is 1), as above.
- conjugate symmetry (the paper's and the authors' code's default): P / 2 complex states and 2 Re(C~ x); the package
  keeps all P eigenvalues and reads Re(C~ x). The same model on conjugate-paired weights (Lambda, B~, C~ and their
  conjugates): tests/test_zoo_s5.py runs the package on exactly those.
- (Lambda_bar - 1) is formed as expm1(a) cos(b) - 2 sin^2(b / 2) + i exp(a) sin(b), a + i b = Lambda Delta, rather
  than exp(Lambda Delta) - 1, whose cancellation loses ~eps / |Lambda Delta| of B_bar (~2e-4 in float32 at the
  smallest step).
- the initialisation is the authors' (D ~ N(0, 1), C's variance 1 / P); the package draws D ~ U(0, 1) and C with a
  variance 1 / (P H).
- the package's B_tilde is always complex64 (its ``as_complex``); here it is the model's dtype's.
- no input embedding in the package's block: here a Linear from input_size to H precedes it.

State: x_T, complex [B, P / 2] (complex64; complex128 for a float64 model), P floats. The window is
pomdp_ffm/seq_models/recurrence.py's ``linear_scan`` (a constant complex decay), the acting step its T = 1 case.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ..options import S5Config
from ..rules import options_of
from .base import SeqModel, State
from .recurrence import linear_scan

# jax's truncated normal at +-2 standard deviations has the standard deviation 0.8796...: lecun_normal divides by it
TRUNCATED_STD = 0.87962566103423978
CLIPPED_REAL = -1e-4  # the authors' clip_eigs bound on Lambda_re


def hippo_n(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """HiPPO-N of an even ``size``, on the CPU in complex128: the eigenvalues with negative imaginary part [size / 2]
    and their eigenvectors [size, size / 2] (module docstring), in the order of ascending imaginary part."""
    n = torch.arange(size, dtype=torch.float64, device="cpu")
    root = torch.sqrt(2 * n + 1)
    skew = -torch.sign(n.unsqueeze(1) - n.unsqueeze(0)) * torch.outer(root, root) / 2
    mu, V = torch.linalg.eigh(-1j * skew.to(torch.complex128))
    half = size // 2
    return torch.complex(torch.full_like(mu[:half], -0.5), mu[:half]), V[:, :half]


def truncated_normal(*shape: int, variance: float) -> torch.Tensor:
    """jax's variance_scaling truncated normal, float64: N(0, 1) cut at +-2, scaled to ``variance``."""
    t = nn.init.trunc_normal_(torch.empty(shape, dtype=torch.float64), 0.0, 1.0, -2.0, 2.0)
    return t * (math.sqrt(variance) / TRUNCATED_STD)


class S5(SeqModel):
    """S5 in the package's block (module docstring) mapping [T, B, input_size] to [T, B, hidden_size]."""

    def __init__(self, input_size: int, hidden_size: int, **options):
        """``options``: policy.s5's (options.S5Config: their defaults and rules)."""
        super().__init__()
        o = options_of(S5Config, options, "policy.s5")
        P = hidden_size if o.state_size is None else o.state_size
        if P % (2 * o.blocks):
            raise ValueError(
                f"S5's state size {P} (policy.s5.state_size, null: hidden_size={hidden_size}) must be a multiple of "
                f"2 * blocks = {2 * o.blocks} (each block's eigenvalues come in conjugate pairs)"
            )
        self.input_size, self.hidden_size, self.state_size, self.blocks = input_size, hidden_size, P, o.blocks
        self.clip_eigs = o.clip_eigs
        H = hidden_size
        self.encoder = nn.Linear(input_size, H)
        self.attn_norm = nn.LayerNorm(H)
        self.ff_norm = nn.LayerNorm(H)
        self.ff_enc = nn.Linear(H, 2 * H, bias=False)  # the GEGLU's value rows over its gate rows
        self.ff_dec = nn.Linear(H, H, bias=False)

        device = torch.get_default_device()  # (meta when the agent's shape is built: the eigenvectors are moved there)
        Lambda, V = hippo_n(P // o.blocks)
        Lambda = Lambda.repeat(o.blocks).to(device)
        V = torch.block_diag(*[V] * o.blocks).to(device)  # [P, P/2]
        B_tilde = V.conj().T @ truncated_normal(P, H, variance=1 / P).to(torch.complex128)  # V^-1 = V*: V is unitary
        C = torch.complex(truncated_normal(H, P, variance=1 / P), truncated_normal(H, P, variance=1 / P))
        C_tilde = C @ V
        self.Lambda_re = nn.Parameter(Lambda.real.float())
        self.Lambda_im = nn.Parameter(Lambda.imag.float())
        self.B_re, self.B_im = nn.Parameter(B_tilde.real.float()), nn.Parameter(B_tilde.imag.float())
        self.C_re, self.C_im = nn.Parameter(C_tilde.real.float()), nn.Parameter(C_tilde.imag.float())
        self.D = nn.Parameter(torch.randn(H))
        log_min, log_max = math.log(o.dt_min), math.log(o.dt_max)
        self.log_step = nn.Parameter((torch.rand(P // 2, dtype=torch.float64) * (log_max - log_min) + log_min).float())

    def initial_state(self, batch_size: int, device=None) -> State:
        dtype = torch.complex128 if self.Lambda_re.dtype == torch.float64 else torch.complex64
        return torch.zeros(batch_size, self.state_size // 2, dtype=dtype, device=device)

    def discretised(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(Lambda_bar [P/2] complex, B_bar as real [P, H]: its real parts' rows over its imaginary parts')."""
        re = torch.clamp(self.Lambda_re, max=CLIPPED_REAL) if self.clip_eigs else self.Lambda_re
        step = torch.exp(self.log_step)
        a, b = re * step, self.Lambda_im * step
        grow = torch.exp(a)
        cos, sin = torch.cos(b), torch.sin(b)
        Lambda_bar = torch.complex(grow * cos, grow * sin)
        # Lambda_bar - 1 without the cancellation of exp(z) - 1 at small |z|
        minus_one = torch.complex(torch.expm1(a) * cos - 2 * torch.sin(b / 2) ** 2, grow * sin)
        scale = (minus_one / torch.complex(re, self.Lambda_im)).unsqueeze(-1)  # [P/2, 1]
        B_bar_re = scale.real * self.B_re - scale.imag * self.B_im
        B_bar_im = scale.real * self.B_im + scale.imag * self.B_re
        return Lambda_bar, torch.cat([B_bar_re, B_bar_im])

    def forward(self, x: torch.Tensor, state: State = None) -> tuple[torch.Tensor, State]:
        self._check_input(x)
        u = self.attn_norm(self.encoder(x))
        Lambda_bar, B_bar = self.discretised()
        Bu = torch.complex(*F.linear(u, B_bar).chunk(2, dim=-1))  # B_bar u as one real matmul
        s = linear_scan(Lambda_bar.view(1, 1, -1), Bu, state)  # [T, B, P/2]
        # 2 Re(C~ x) = 2 (C_re Re x - C_im Im x), on the states' (re, im) pairs as they lie in memory: no copy of them
        C = torch.stack([self.C_re, -self.C_im], dim=-1).flatten(-2)  # [H, P], columns interleaved (re, im)
        y = 2 * F.linear(torch.view_as_real(s).flatten(-2), C) + self.D * u
        w = self.ff_norm(F.gelu(y) + u)
        value, gate = self.ff_enc(w).chunk(2, dim=-1)
        return self.ff_dec(value * F.gelu(gate)) + w, s[-1]

    def activation_floats(self) -> int:
        # the embedding's input; h, u, y, GELU's input and output, the second LayerNorm's, the GEGLU's 2H and its
        # product (about 9 H); B_bar u (P), the states (P / 2 complex, P floats), their (re, im) view for C and the
        # carried-in state's window (measured with saved_tensors_hooks: 1671 at input 64, H = P = 128)
        return self.input_size + 9 * self.hidden_size + 4 * self.state_size

    def extra_repr(self) -> str:
        return (
            f"input_size={self.input_size}, hidden_size={self.hidden_size}, state_size={self.state_size}, "
            f"blocks={self.blocks}, clip_eigs={self.clip_eigs}"
        )
