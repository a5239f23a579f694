"""The mLSTM of xLSTM (Beck, Pöppel, Spanring, Auer, Prudnikova, Kopp, Klambauer, Brandstetter and Hochreiter, 2024,
"xLSTM: Extended Long Short-Term Memory"): a matrix memory with exponential gating, in the package xlstm's
pre-up-projection block, stacked as the package's xLSTMBlockStack stacks mLSTM blocks.

The cell, per head (heads of DH = D / heads features; q, k, v in R^DH, gate pre-activations i~, f~ scalars):

    log f_t = logsigmoid(f~_t),  log i_t = i~_t                    sigmoid forget gate, exponential input gate
    C_t = f_t C_{t-1} + i_t k_t v_t^T / sqrt(DH)                   [DH, DH] (k's index, v's index)
    n_t = f_t n_{t-1} + i_t k_t / sqrt(DH)                         [DH]
    h_t = C_t^T q_t / (max(|n_t^T q_t|, 1) + eps e^{m_t})          eps = 1e-6 (m_t below)

(the forget gate a sigmoid, as the package's PyTorch backends have it; the paper allows an exponential one too),
run in the paper's stabilised variables: m_t = max(log f_t + m_{t-1}, log i_t), C~_t = exp(-m_t) C_t, n~_t =
exp(-m_t) n_t, so that

    C~_t = exp(log f_t + m_{t-1} - m_t) C~_{t-1} + exp(log i_t - m_t) k_t v_t^T / sqrt(DH)    (n~ alike)
    h_t  = C~_t^T q_t / (max(|n~_t^T q_t|, exp(-m_t)) + eps)

where both exponents are <= 0: a decay and an input weight in (0, 1], whatever the gates and the carried m (input
gates of e^100, past float32's e^88.7, stay finite; so do input gates of e^-100: ``_floor``). Unrolled, m_t =
max(F_t + m_0, max_{s<=t} (F_t - F_s + log i_s)) with F_t = sum_{r<=t} log f_r: the max-plus recurrence in closed
form. A fresh state is C~ = 0, n~ = 0, m = -inf (the max over no steps), so that m_t is then the row maximum of the
package's parallel form, and acting from a fresh state equals that form (the package's recurrent step starts from m
= 0 instead: see the differences below).

The window (T > 1) is the package's parallel stabilised form (backends.py, parallel_stabilized_simple) with the
carried state as one more term (as its chunkwise_simple's inter-chunk term, for one chunk): with log D_ts = F_t - F_s
+ log i_s for s <= t, log W_t = F_t + m_0 and m_t the maximum over s of log D_ts and log W_t (the unrolled m_t above),
d_ts = exp(log D_ts - m_t) and w_t = exp(log W_t - m_t), both in [0, 1],

    h_t = (sum_s d_ts (q_t.k_s) v_s / sqrt(DH) + w_t C~_0^T q_t)
          / (max(|sum_s d_ts (q_t.k_s) / sqrt(DH) + w_t n~_0^T q_t|, exp(-m_t)) + eps)

and the final state C~_T = sum_s d_Ts k_s v_s^T / sqrt(DH) + w_T C~_0 (n~_T alike), m_T. Acting (T = 1) is the
recurrent step above (backends.py, recurrent_step_stabilized_simple). Not recurrence.linear_scan over C~ (whose
decays and inputs are those <= 1 weights too): its states are [T, B, heads, DH, DH], which the parallel form's
[B, heads, T, T] beats at RL windows. Measured for one cell at the default sizes (heads 4, DH 64), float32, forward
and backward of a [T = 64, B = 32] window, one thread of an Intel Xeon (torch 2.13): the parallel form 48 ms and
2.9k floats saved per row and step, the scan 1.1 s and 18.5k; at T = 200 (Pendulum's whole episodes) 0.33 s and
4.9k against 3.3 s and 18.3k. The parallel form's memory grows with T (about 4 heads x T floats per row and step
besides the block's); the scan's does not, and would save less beyond windows of about 1000 steps.

The block (package xlstm 2.0.6, blocks/mlstm/layer.py mLSTMLayer, blocks/xlstm_block.py, xlstm_block_stack.py), on
e_t [H], H = hidden_size, D = the up-projection's width:

    e_0 = W_in x_t + b_in                                   the observation embedded (not the package's: it embeds
                                                            tokens)
    per block: u = LN(e);  [x_m, z] = W_up u                [D] each, no biases (the package's bias = False)
               x_c = SiLU(causal depthwise conv1d(x_m))     kernel conv1d_kernel_size, with a bias
               q = W_q x_c,  k = W_k x_c,  v = W_v x_m      block-diagonal, blocks of qkv_proj_blocksize
               i~, f~ = W_i [q; k; v] + b_i, W_f [q; k; v] + b_f     one per head
               h~ = GroupNorm_heads(h) + skip * x_c         h the cell's output, heads concatenated
               e = e + W_down (h~ * SiLU(z))                 residual
    y = LN(e)                                               the stack's post-blocks norm

LN and the per-head norm have no bias and a weight 1 + w (the package's residual weight, w = 0 at init), eps 1e-5.
D = proj_factor H rounded up to a multiple of 64 (the package's UpProjConfigMixin). Initialisation, the package's:
W_up, W_q, W_k, W_v ~ N(0, 2 / (5 H)) (small init, H the embedding width), W_down ~ N(0, (2 / (layers sqrt(H)))^2)
(Wang init), skip = 1, the conv torch's default, W_i = W_f = 0, b_i ~ N(0, 0.1^2), b_f = linspace(3, 6, heads) (a
forget gate near 1), the norms' w = 0; W_in torch's Linear default. Defaults, the package's mLSTMLayerConfig: heads
4, proj_factor 2, conv1d_kernel_size 4, qkv_proj_blocksize 4; layers 1 (one block: a single recurrent layer as the
agent's other memories have; its residual carries the embedded input past the memory, whose down-projection starts
small, and the post-blocks norm sets the output's scale for the heads that read it). At H = 128: D = 256, DH = 64,
a state of 4 x 64 x 64 + 256 + 4 + 3 x 256 = 17412 floats per row and block (the Transformer's default keeps 32768).

State, per block stacked on a leading dim: C~ [layers, B, heads, DH, DH], n~ [layers, B, heads, DH], m [layers, B,
heads] and the conv's last K - 1 inputs x_m [layers, B, K - 1, D] (the package's step keeps K, its oldest unused).

Deliberate differences from the package: a fresh state's m is -inf, not its step's 0 (the m of its parallel form,
which its step from m = 0 does not equal: eps's weight e^{m_t} differs, by 4e-9 of the largest output at the default
init, 7e-8 with input gates of e^+-4), so that acting equals the window; a window from a carried state (the package's
parallel form takes none); an input embedding; no dropout (the package's default, 0). tests/test_zoo_mlstm.py holds
it to the package's xLSTMBlockStack on copied weights.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ..options import MLSTMConfig, up_projection
from ..rules import options_of
from .base import SeqModel, State

EPS = 1e-6  # the cell's denominator's (the package's backends' eps)
NORM_EPS = 1e-5  # its LayerNorm's and per-head norm's


def _norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """LayerNorm over the last dim with weight 1 + w and no bias (the package's residual weight)."""
    return F.layer_norm(x, x.shape[-1:], 1 + w, None, NORM_EPS)


def _blockwise(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [..., D] through the block-diagonal map of w [D / b, b, b] (block j maps features j b .. (j + 1) b)."""
    return torch.einsum("...ji,joi->...jo", x.unflatten(-1, w.shape[::2]), w).flatten(-2)


def _floor(m: torch.Tensor) -> torch.Tensor:
    """exp(-m), the denominator's floor in the stabilised variables, its exponent capped one below the largest finite
    one of m's dtype. Where exp(-m) would overflow (m below about -88 in float32: every input gate that low) the output
    is 0 either way, below 1e-38 times the numerator; the cap keeps the backward finite, where the package's exp(-m)
    makes it 0 * inf = NaN (an RL run diverged on it: patches/024)."""
    return torch.exp(torch.clamp(-m, max=math.log(torch.finfo(m.dtype).max) - 1))


def _step(q, k, v, i, log_f, C, n, m):
    """The recurrent step: q, k, v [B, NH, DH], i, log_f [B, NH]; the state C~, n~, m."""
    m_new = torch.maximum(log_f + m, i)
    decay, weight = torch.exp(log_f + m - m_new), torch.exp(i - m_new)
    k = k * (weight / math.sqrt(k.shape[-1])).unsqueeze(-1)
    C = decay[..., None, None] * C + k.unsqueeze(-1) * v.unsqueeze(-2)
    n = decay.unsqueeze(-1) * n + k
    qn = (q * n).sum(-1)
    h = (q.unsqueeze(-2) @ C).squeeze(-2) / (torch.maximum(qn.abs(), _floor(m_new)) + EPS).unsqueeze(-1)
    return h, C, n, m_new


def _window(q, k, v, i, log_f, C, n, m):
    """The parallel form from a carried state: q, k, v [B, NH, T, DH], i, log_f [B, NH, T]."""
    T = q.shape[-2]
    F_ = torch.cumsum(log_f, dim=-1)
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    log_D = (F_.unsqueeze(-1) - F_.unsqueeze(-2) + i.unsqueeze(-2)).masked_fill(~causal, -math.inf)
    log_w = F_ + m.unsqueeze(-1)  # the carried state's weight at each step
    m_t = torch.maximum(log_D.amax(-1), log_w)
    D, w = torch.exp(log_D - m_t.unsqueeze(-1)), torch.exp(log_w - m_t)
    k = k / math.sqrt(k.shape[-1])
    S = (q @ k.mT) * D
    num = S @ v + w.unsqueeze(-1) * (q @ C)
    qn = S.sum(-1) + w * (q @ n.unsqueeze(-1)).squeeze(-1)
    h = num / (torch.maximum(qn.abs(), _floor(m_t)) + EPS).unsqueeze(-1)
    k_last = k * D[..., -1, :].unsqueeze(-1)  # the inputs' weights in the final state
    w_last = w[..., -1]
    return h, k_last.mT @ v + w_last[..., None, None] * C, k_last.sum(-2) + w_last.unsqueeze(-1) * n, m_t[..., -1]


class Block(nn.Module):
    """One mLSTM block (module docstring): pre-LayerNorm, the up-projected mLSTM layer, the residual."""

    def __init__(self, hidden: int, inner: int, heads: int, kernel: int, blocksize: int, layers: int):
        super().__init__()
        self.heads = heads
        small = math.sqrt(2 / (5 * hidden))  # the package's small init, of the embedding width for q, k, v too
        self.norm = nn.Parameter(torch.zeros(hidden))
        self.up = nn.Linear(hidden, 2 * inner, bias=False)  # x_m's rows over z's
        nn.init.normal_(self.up.weight, std=small)
        self.q, self.k, self.v = (
            nn.Parameter(torch.randn(inner // blocksize, blocksize, blocksize) * small) for _ in range(3)
        )
        self.conv = nn.Conv1d(inner, inner, kernel, groups=inner)  # depthwise; torch's init, as the package's
        self.igate, self.fgate = nn.Linear(3 * inner, heads), nn.Linear(3 * inner, heads)
        with torch.no_grad():
            self.igate.weight.zero_()
            self.igate.bias.normal_(0.0, 0.1)
            self.fgate.weight.zero_()
            self.fgate.bias.copy_(torch.linspace(3.0, 6.0, heads))
        self.outnorm = nn.Parameter(torch.zeros(inner))
        self.skip = nn.Parameter(torch.ones(inner))
        self.down = nn.Linear(inner, hidden, bias=False)
        nn.init.normal_(self.down.weight, std=2 / layers / math.sqrt(hidden))

    def forward(self, e: torch.Tensor, C, n, m, buffer) -> tuple[torch.Tensor, tuple]:
        """e [B, T, H]; this block's state. Returns e after the block and its state."""
        T = e.shape[1]
        x_m, z = self.up(_norm(e, self.norm)).chunk(2, dim=-1)
        padded = torch.cat((buffer.to(e.dtype), x_m), dim=1)  # [B, K - 1 + T, D]
        x_c = F.silu(F.conv1d(padded.mT, self.conv.weight, self.conv.bias, groups=x_m.shape[-1]).mT)
        q, k, v = _blockwise(x_c, self.q), _blockwise(x_c, self.k), _blockwise(x_m, self.v)
        qkv = torch.cat((q, k, v), dim=-1)
        i, f = self.igate(qkv).mT, self.fgate(qkv).mT  # [B, NH, T]
        heads = lambda t: t.unflatten(-1, (self.heads, -1)).transpose(1, 2)  # noqa: E731  [B, NH, T, DH]
        state = (C.to(e.dtype), n.to(e.dtype), m.to(e.dtype))
        if T == 1:
            h, *state = _step(*(heads(t).squeeze(2) for t in (q, k, v)), i[..., 0], F.logsigmoid(f[..., 0]), *state)
            h = h.unsqueeze(2)
        else:
            h, *state = _window(heads(q), heads(k), heads(v), i, F.logsigmoid(f), *state)
        # each head normalised over its DH features (the package's group norm), then its share of 1 + w
        h = F.layer_norm(h, h.shape[-1:], eps=NORM_EPS) * (1 + self.outnorm).view(self.heads, 1, -1)
        h = h.transpose(1, 2).flatten(-2)  # [B, T, D]
        out = self.down((h + self.skip * x_c) * F.silu(z))
        return e + out, (*state, padded[:, T:])


class MLSTM(SeqModel):
    """The mLSTM blocks (module docstring) mapping [T, B, input_size] to [T, B, hidden_size]."""

    def __init__(self, input_size: int, hidden_size: int, **options):
        """``options``: policy.mlstm's (options.MLSTMConfig: their defaults and rules)."""
        super().__init__()
        o = options_of(MLSTMConfig, options, "policy.mlstm")
        inner = up_projection(hidden_size, o.proj_factor)
        if why := o.unfit(hidden_size):
            raise ValueError(f"MLSTM's hidden_size={hidden_size}: {why}")
        self.input_size, self.hidden_size, self.inner, self.layers = input_size, hidden_size, inner, o.layers
        self.heads, self.kernel = o.heads, o.conv1d_kernel_size
        self.embed = nn.Linear(input_size, hidden_size)
        self.blocks = nn.ModuleList(
            Block(hidden_size, inner, o.heads, o.conv1d_kernel_size, o.qkv_proj_blocksize, o.layers)
            for _ in range(o.layers)
        )
        self.norm = nn.Parameter(torch.zeros(hidden_size))  # the stack's post-blocks norm

    def initial_state(self, batch_size: int, device=None) -> State:
        L, B, NH, DH = self.layers, batch_size, self.heads, self.inner // self.heads
        f = dict(dtype=self.norm.dtype, device=device)
        C, n = torch.zeros(L, B, NH, DH, DH, **f), torch.zeros(L, B, NH, DH, **f)
        return C, n, torch.full((L, B, NH), -math.inf, **f), torch.zeros(L, B, self.kernel - 1, self.inner, **f)

    def forward(self, x: torch.Tensor, state: State = None) -> tuple[torch.Tensor, State]:
        self._check_input(x)
        state = self.initial_state(x.shape[1], x.device) if state is None else state
        e = self.embed(x).transpose(0, 1)  # [B, T, H]
        finals = []
        for layer, block in enumerate(self.blocks):
            e, final = block(e, *(s[layer] for s in state))
            finals.append(final)
        return _norm(e, self.norm).transpose(0, 1), tuple(torch.stack(parts) for parts in zip(*finals))

    def activation_floats(self) -> int:
        # Per block about 26 D vectors (the norms, the up-projection, the conv and its SiLU, q, k, v and the gates'
        # input, the per-head norm, the skip, the z gate, the down-projection's input) and four [heads, T] rows of
        # the parallel form (log D, D, q.k, S), stated at T = 64 (the BLT tasks' windows): they grow with the window.
        # Measured with saved_tensors_hooks at H = 128 (D = 256): 7.7k from a fresh state and 8.2k from a carried one
        # (its C~ over the window's steps) at T = 64, 10.6k at T = 256; this states 7.7k.
        return self.layers * (26 * self.inner + 4 * self.heads * 64)

    def extra_repr(self) -> str:
        return (
            f"input_size={self.input_size}, hidden_size={self.hidden_size}, inner={self.inner}, heads={self.heads}, "
            f"layers={self.layers}"
        )
