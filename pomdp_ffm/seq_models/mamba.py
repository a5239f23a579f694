"""Mamba (Gu and Dao, 2023, "Mamba: Linear-Time Sequence Modeling with Selective State Spaces"): residual blocks of
a selective state space model (S6), whose step Delta and projections B, C read the input, behind a causal depthwise
convolution and gated by a second branch.

The memory, on inputs x_t [input_size], with H = hidden_size, ED = expand * H inner channels, N = d_state and
K = d_conv:

    e_t = W_emb x_t + b_emb                                        [H]
    per layer:  u_t = RMSNorm(e_t),  e_t <- e_t + Block(u)_t
    y_t = RMSNorm_f(e_t)                                           [H]

    Block: [v_t; z_t] = W_in u_t                                   [ED] each (no bias by default)
           s_t = SiLU(b_c + sum_{k=0}^{K-1} w_k * v_{t-K+1+k})     depthwise causal convolution, [ED]
           [d_t; B_t; C_t] = W_x s_t                               [dt_rank], [N], [N]
           Delta_t = softplus(W_dt d_t + b_dt)                     [ED]
           A = -exp(A_log)                                         [ED, N]
           h_t = exp(Delta_t A) * h_{t-1} + (Delta_t * s_t) B_t^T  [ED, N], the zero-order hold of (A, B)
           out_t = W_out ((h_t C_t + D * s_t) * SiLU(z_t))         [H]

RMSNorm(e) = e / sqrt(mean(e^2) + eps) * g. The blocks are mambapy 1.2.0's (mambapy/mamba.py: ResidualBlock, which
is RMSNorm -> MambaBlock plus the skip, and MambaBlock.forward, ssm, selective_scan and step, which follow the paper's
mamba_simple.py): their parameters carry its names, ``layers.<i>.norm`` and ``layers.<i>.mixer.<in_proj, conv1d,
x_proj, dt_proj, A_log, D, out_proj>``. Around them, ours: the input embedding W_emb (the blocks map H to H) and a
final RMSNorm, as AMAGO's MambaTrajEncoder (amago/nets/traj_encoders.py: a Linear, the blocks, an output norm) and as
mambapy's language model (mambapy/lm.py, LM.norm_f) and the paper's MixerModel (norm_f) close their stacks: the
pre-norm blocks leave the residual stream unnormalised, and it feeds the actor's and critics' heads as it is. RMSNorm,
not AMAGO's LayerNorm, as in the blocks.

Initialisation, mambapy's MambaBlock (its Mamba module's, not its LM wrapper's, which resets every Linear to N(0,
0.02) with zero biases, the Delta bias included): W_in, W_x, W_out, the convolution and W_emb torch's defaults;
W_dt uniform in +-dt_scale / sqrt(dt_rank) (dt_init "random"; "constant": that bound); b_dt = softplus^-1(dt) with
dt log-uniform in [dt_min, dt_max], floored at dt_init_floor, so that Delta starts in that range; A_log = log(1..N)
in every channel (S4D-Real, A = -(1..N)); D = 1; the norms' gains 1. Drawn in the package's order, layer by layer
after W_emb, so that a seed gives mambapy's parameters (tests/test_zoo_mamba.py). Defaults (options.MambaConfig):
mambapy's MambaConfig, d_state 16, expand 2, d_conv 4, dt_rank ceil(H / 16), dt in [0.001, 0.1], floor 1e-4,
dt_scale 1, eps 1e-5, no in/out biases, a conv bias; 1 layer, as the other recurrent memories here (mambapy's
n_layers has no default; AMAGO's MambaTrajEncoder stacks 3, each saving about 12k floats per row and step at
h = 128 for the backward). Not taken: mambapy's muP, inner layernorms (Jamba's) and CUDA kernel.

The selective scan is pomdp_ffm/seq_models/recurrence.py's ``linear_scan`` with a decay per step, exp(Delta_t A)
[T, B, ED, N], where mambapy runs its own parallel scan (pscan) from a zero state. State per layer: the last K - 1
inputs v of the convolution and h [B, ED, N]; a window carried in from a state convolves over the carried inputs
and scans from the carried h, as acting does (mambapy's ``step`` with its caches), so that acting one step at a time
equals the window. Deliberate differences from mambapy: A = -exp(A_log) and D in the model's dtype (mambapy's ssm
casts both to float32, for mixed precision; float64 would keep float32's rounding); the window takes a carried state
(mambapy's forward starts from zero; only its step carries one). (Delta_t * s_t) B_t forms the scan's input in one
[ED, N] product where mambapy forms (Delta_t B_t) * s_t: float rounding only.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ..options import MambaConfig
from ..rules import options_of
from .base import SeqModel, State
from .recurrence import linear_scan


class Mixer(nn.Module):
    """One Mamba block (module docstring's Block), time first; ``forward`` takes the layer's carried state."""

    def __init__(self, width: int, o: MambaConfig, dt_rank: int):
        super().__init__()
        inner, N = o.expand * width, o.d_state
        self.inner, self.d_state, self.dt_rank = inner, N, dt_rank
        # (constructed, and so drawn, in mambapy's MambaBlock's order: a seed gives its parameters)
        self.in_proj = nn.Linear(width, 2 * inner, bias=o.bias)  # the v rows, then the z rows
        self.conv1d = nn.Conv1d(inner, inner, o.d_conv, groups=inner, bias=o.conv_bias)  # (padded by the state)
        self.x_proj = nn.Linear(inner, dt_rank + 2 * N, bias=False)  # d, B, C
        self.dt_proj = nn.Linear(dt_rank, inner)
        bound = o.dt_scale / math.sqrt(dt_rank)
        if o.dt_init == "random":
            nn.init.uniform_(self.dt_proj.weight, -bound, bound)
        else:
            nn.init.constant_(self.dt_proj.weight, bound)
        low, high = math.log(o.dt_min), math.log(o.dt_max)
        dt = torch.exp(low + torch.rand(inner) * (high - low)).clamp(min=o.dt_init_floor)
        with torch.no_grad():  # softplus^-1(dt), without the cancellation of log(exp(dt) - 1) at small dt
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        self.A_log = nn.Parameter(torch.log(torch.arange(1, N + 1, dtype=torch.float32)).repeat(inner, 1))
        self.D = nn.Parameter(torch.ones(inner))
        self.out_proj = nn.Linear(inner, width, bias=o.bias)

    def forward(
        self, u: torch.Tensor, conv: torch.Tensor, h: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``u[T, B, width]``, the carried inputs ``conv[K - 1, B, ED]`` and state ``h[B, ED, N]``: the block's
        output [T, B, width], the last K - 1 inputs and the last state."""
        T = u.shape[0]
        v, z = self.in_proj(u).chunk(2, dim=-1)
        inputs = torch.cat((conv, v))  # the carried inputs pad the convolution: it reaches across the window's start
        s = F.conv1d(inputs.permute(1, 2, 0), self.conv1d.weight, self.conv1d.bias, groups=self.inner)
        s = F.silu(s.permute(2, 0, 1))
        d, B, C = self.x_proj(s).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        delta = F.softplus(self.dt_proj(d))
        A = -torch.exp(self.A_log)
        hs = linear_scan(torch.exp(delta.unsqueeze(-1) * A), (delta * s).unsqueeze(-1) * B.unsqueeze(-2), h)
        y = (hs @ C.unsqueeze(-1)).squeeze(-1) + self.D * s
        return self.out_proj(y * F.silu(z)), inputs[T:], hs[-1]


class Residual(nn.Module):
    """RMSNorm -> Mixer, plus the skip (mambapy's ResidualBlock)."""

    def __init__(self, width: int, o: MambaConfig, dt_rank: int):
        super().__init__()
        self.mixer = Mixer(width, o, dt_rank)  # (drawn before the norm, which draws nothing, as mambapy's)
        self.norm = nn.RMSNorm(width, eps=o.rms_norm_eps)

    def forward(self, e, conv, h):
        out, conv, h = self.mixer(self.norm(e), conv, h)
        return e + out, conv, h


class Mamba(SeqModel):
    """Mamba (module docstring) mapping [T, B, input_size] to [T, B, hidden_size]; state: (the convolutions' last
    inputs [layers, d_conv - 1, B, ED], the SSM states [layers, B, ED, d_state])."""

    def __init__(self, input_size: int, hidden_size: int, **options):
        """``options``: policy.mamba's (options.MambaConfig: their defaults and rules)."""
        super().__init__()
        o = options_of(MambaConfig, options, "policy.mamba")
        self.input_size, self.hidden_size = input_size, hidden_size
        self.dt_rank = math.ceil(hidden_size / 16) if o.dt_rank is None else o.dt_rank
        self.inner, self.d_state, self.d_conv = o.expand * hidden_size, o.d_state, o.d_conv
        self.embed = nn.Linear(input_size, hidden_size)
        self.layers = nn.ModuleList(Residual(hidden_size, o, self.dt_rank) for _ in range(o.layers))
        self.norm_f = nn.RMSNorm(hidden_size, eps=o.rms_norm_eps)

    def initial_state(self, batch_size: int, device=None) -> State:
        L, dtype = len(self.layers), self.embed.weight.dtype
        conv = torch.zeros(L, self.d_conv - 1, batch_size, self.inner, dtype=dtype, device=device)
        return conv, torch.zeros(L, batch_size, self.inner, self.d_state, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor, state: State = None) -> tuple[torch.Tensor, State]:
        self._check_input(x)
        conv, h = self.initial_state(x.shape[1], x.device) if state is None else state
        e, convs, hs = self.embed(x), [], []
        for layer, block in enumerate(self.layers):
            e, c, s = block(e, conv[layer], h[layer])
            convs.append(c)
            hs.append(s)
        return self.norm_f(e), (torch.stack(convs), torch.stack(hs))

    def activation_floats(self) -> int:
        # per layer and step: the decays exp(Delta A) and the states h (ED N each; the scan's input is not kept), the
        # in-projection, the convolution's inputs and outputs, s, d B C, Delta before and after softplus, Delta * s,
        # y, SiLU(z) and the gated product (about 14 ED), the norm and the skip (2 H); the final norm (2 H)
        ED, N, H = self.inner, self.d_state, self.hidden_size
        return len(self.layers) * (2 * ED * N + 14 * ED + 2 * H) + 2 * H

    def extra_repr(self) -> str:
        return (
            f"input_size={self.input_size}, hidden_size={self.hidden_size}, layers={len(self.layers)}, "
            f"d_state={self.d_state}, inner={self.inner}, d_conv={self.d_conv}, dt_rank={self.dt_rank}"
        )
