"""sLSTM (Beck, Poeppel, Spanring, Auer, Prudnikova, Kopp, Klambauer, Brandstetter and Hochreiter, 2024, "xLSTM:
Extended Long Short-Term Memory"): an LSTM whose input gate is exponential, with a normaliser state and a
stabiliser, and block-diagonal (per head) recurrent weights, in the paper's sLSTM block, as the package xlstm 2.0.6
builds it (xlstm/xlstm_block_stack.py xLSTMBlockStack of xlstm/blocks/slstm/block.py sLSTMBlock; the layer
xlstm/blocks/slstm/layer.py sLSTMLayer; the cell xlstm/blocks/slstm/cell.py sLSTMCell with backend "vanilla" and its
pointwise step xlstm/blocks/slstm/src/vanilla/slstm.py).

An input embedding, then per block, on its stream e_t [H] (H = hidden_size, NH heads of DH = H / NH units):

    e_t  = W_in x_t + b_in                                            (before the first block)
    u_t  = LN(e_t)
    a_t  = SiLU(b_conv + sum_j w_j * u_{t-k+1+j})                      causal depthwise conv of kernel k over steps
    i~_t = W_i a_t + R_i h_{t-1} + b_i      f~_t = W_f a_t + R_f h_{t-1} + b_f
    z~_t = W_z u_t + R_z h_{t-1} + b_z      o~_t = W_o u_t + R_o h_{t-1} + b_o
    m_t  = max(log sigmoid(f~_t) + m_{t-1}, i~_t)                      the stabiliser (log i_t = i~_t)
    i'_t = exp(i~_t - m_t),   f'_t = exp(log sigmoid(f~_t) + m_{t-1} - m_t)
    c_t  = f'_t c_{t-1} + i'_t tanh(z~_t),   n_t = f'_t n_{t-1} + i'_t,   h_t = sigmoid(o~_t) c_t / n_t
    e_t <- e_t + GN(h_t)                                               per head normalised over its DH units
    e_t <- e_t + W_down (GELU(W_gate v_t) * (W_up v_t)),  v_t = LN(e_t)    the gated feed-forward
    y_t  = LN(e_t)                                                     after the last block

W and R are block-diagonal: each head's gates read only that head's DH features of a_t or u_t and of h_{t-1}. Every
LayerNorm has a weight and no bias, GN a weight and no bias (eps 1e-5 each); GELU is the exact (erf) form. c and n
are the paper's sums of exp(i~) tanh(z~) and of exp(i~) under the forget gate, each scaled by exp(-m_t): their ratio,
and so h_t, does not depend on m, which only keeps exp from overflowing (i' and f' are <= 1, one of them 1). So
n_t >= 1 after any step, and n = 0 marks a fresh state: there the first step takes m_t = i~_t (the package's rule),
written as m_{t-1} = -inf (then f'_t = 0).

Defaults are the package's: 1 block (xLSTMBlockStackConfig.num_blocks), 4 heads and a convolution of kernel 4
(sLSTMLayerConfig), the feed-forward of sLSTMBlockConfig with FeedForwardConfig's proj_factor 1.3 (the paper writes
4/3), its up-projection rounded up to a multiple of 64 (192 at H = 128), no dropout. Initialisation as the package's:
W_i, W_f, W_z, W_o and W_up normal of standard deviation sqrt(2 / (5 H)) (its small_init_init_), W_down of 2 / (layers
sqrt(H)) (wang_init_), R = 0 (sLSTMCellConfig.recurrent_weight_init "zeros"), b_i = b_z = b_o = 0 and b_f of
"powerlaw_blockdependent": for unit j of each head, b_f = 5 - 12 (j / (DH - 1))^(0.3 + 1.3 r), r = block / (layers - 1)
(0 for one block), from 5 (slow forgetting) down to -7; the convolution as torch's nn.Conv1d, norm weights 1; W_in, b_in
as torch's nn.Linear. Why the whole block rather than the bare cell: the residual path hands the agent's heads the
step's own input next to the memory's read-out, so the cell needs to carry only what the input does not show, and the
final LayerNorm keeps the memory's output at the scale the heads expect whatever the cell's; the feed-forward is per
step (outside the loop) and cheap, so the default keeps the package's block as it is (policy.slstm.feedforward=false
drops it).

State, per block: h, c, n, m [B, H] each (the package's slstm_state [4, B, H]) and the convolution's last k - 1 inputs
u ([B, k - 1, H], the package's conv_state of its forward), stacked over blocks: (cells [layers, 4, B, H], conv
[layers, B, k - 1, H]), (4 + k - 1) H floats per block, 896 at H = 128. The cell is nonlinear in h, so the window
is a loop over steps: every step's input terms W a_t + b are one product before it, each step one batched matmul
over the heads for R h_{t-1} and the pointwise update. A training window starts fresh (window_state None).

Deliberate differences from the package, none in y: (1) a state is fresh per unit (n = 0, as the package's CUDA kernel
decides, xlstm/blocks/slstm/src/cuda/slstm_pointwise.cu), not by the vanilla step's torch.all(n == 0) over the whole
batch, which reads a tensor on the host every step; the two differ only in m, c, n (not h) of a fresh row stepped beside
carried ones. (2) No min(., 1) on i' and f': with m_t the maximum they are <= 1 already, and the package's first step
clamps exp(log sigmoid(f~) - i~), which overflows in float32 for i~ < -88 and makes its gradient 0 * inf = NaN; here f'
is 0 there. The gradients are the same: the clamp's tie at 1 halves a gradient that the stabiliser's path adds back.
(They are the vanilla backend's, m differentiated through; the package's CUDA kernel holds m constant in its backward,
which gives the same gradients of y, not of a final m, c or n.) (3) The norms' weights are stored as the scale itself
(init 1), not as the package's offset from 1 (init 0): the same function and gradients. (4) At DH = 1 the power law's
0/0 is taken as 0 (b_f = 5; the package's is NaN). The package's acting step() keeps the last k inputs in its
conv_state, its forward the last k - 1, as here. tests/test_zoo_slstm.py holds the model to the package in float64 and
float32, acting to its step()."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ..options import SLSTMConfig, up_projection
from ..rules import options_of
from .base import SeqModel, State

NORM_EPS = 1e-5  # the package's LayerNorm and MultiHeadLayerNorm
GATES = 4  # i, f, z, o: their order in each head's pre-activations and bias


def forget_bias(head_dim: int, block: int, blocks: int, how: str) -> torch.Tensor | None:
    """The forget gate's bias per unit of a head ([DH]); None where every gate's bias is drawn alike (standard)."""
    if how == "powerlaw_blockdependent":
        depth = block / (blocks - 1) if blocks > 1 else 0.0
        # (in float32, as the package: its values to the bit)
        return 5.0 - 12.0 * (torch.arange(head_dim, dtype=torch.float32) / max(head_dim - 1, 1)) ** (0.3 + 1.3 * depth)
    if how == "small_init":
        return torch.linspace(3.0, 6.0, head_dim)
    return None


class Block(nn.Module):
    """One pre-LayerNorm residual sLSTM block (module docstring); ``forward`` takes and returns its state."""

    def __init__(self, width: int, o: SLSTMConfig, block: int):
        super().__init__()
        H, NH = width, o.heads
        DH = H // NH
        self.heads, self.kernel = NH, o.conv_kernel
        self.norm = nn.LayerNorm(H, eps=NORM_EPS, bias=False)
        self.conv = nn.Conv1d(H, H, o.conv_kernel, groups=H) if o.conv_kernel else None
        small = math.sqrt(2 / (5 * H))
        # the gates' input weights per head [NH, DH out, DH in]: i and f read the convolution's output, z and o read u
        self.igate, self.fgate, self.zgate, self.ogate = (
            nn.Parameter(torch.randn(NH, DH, DH) * small) for _ in range(GATES)
        )
        # R per head, [NH, 4 DH, DH]: row g DH + j is gate g's unit j (the vanilla cell's internal layout)
        self.recurrent = nn.Parameter(torch.zeros(NH, GATES * DH, DH))
        if o.recurrent_init == "standard":
            nn.init.uniform_(self.recurrent, -1 / math.sqrt(H), 1 / math.sqrt(H))
        self.bias = nn.Parameter(torch.zeros(NH, GATES, DH))
        b_f = forget_bias(DH, block, o.layers, o.bias_init)
        with torch.no_grad():
            if b_f is None:
                nn.init.uniform_(self.bias, -1 / math.sqrt(H), 1 / math.sqrt(H))
            else:
                self.bias[:, 1] = b_f
        self.group_norm = nn.Parameter(torch.ones(H))
        if o.feedforward:
            inner = up_projection(H, o.proj_factor)
            self.ffn_norm = nn.LayerNorm(H, eps=NORM_EPS, bias=False)
            self.proj_up = nn.Linear(H, 2 * inner, bias=False)  # the GELU gate's rows, then the value's
            self.proj_down = nn.Linear(inner, H, bias=False)
            nn.init.normal_(self.proj_up.weight, std=small)
            nn.init.normal_(self.proj_down.weight, std=2 / o.layers / math.sqrt(H))
        else:
            self.ffn_norm = self.proj_up = self.proj_down = None

    def forward(
        self, e: torch.Tensor, cell: torch.Tensor, conv: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``e[T, B, H]``, ``cell[4, B, H]`` (h, c, n, m), ``conv[B, k - 1, H]``: the block's output and state."""
        T, B, H = e.shape
        NH = self.heads
        DH = H // NH
        u = self.norm(e)
        if self.conv is not None:
            past = torch.cat((conv.transpose(0, 1), u))  # [k - 1 + T, B, H]
            w = self.conv.weight[:, 0]  # [H, k]
            a = self.conv.bias + past[:T] * w[:, 0]
            for j in range(1, self.kernel):
                a = torch.addcmul(a, past[j : j + T], w[:, j])
            a, conv = F.silu(a), past[T:].transpose(0, 1)
        else:
            a = u
        # every step's input terms W a_t + b at once, per head and batch row: [T, NH, B, 4 DH]
        w_if = torch.cat((self.igate, self.fgate), 1)
        w_zo = torch.cat((self.zgate, self.ogate), 1)
        pre = torch.cat(
            (
                torch.einsum("tbhd,hod->thbo", a.view(T, B, NH, DH), w_if),
                torch.einsum("tbhd,hod->thbo", u.view(T, B, NH, DH), w_zo),
            ),
            dim=-1,
        ) + self.bias.view(NH, 1, GATES * DH)
        h, c, n, m = cell.view(GATES, B, NH, DH).transpose(1, 2).unbind(0)  # [NH, B, DH] each
        m = torch.where(n == 0, -math.inf, m)  # a fresh unit's first step takes m = i~ (and f' = 0)
        r = self.recurrent.transpose(1, 2)  # [NH, DH, 4 DH]
        hs = []
        # (unbind: its backward stacks the steps' gradients once, where indexing pre[t] would add each step's into a
        # zeroed copy of the whole window's, T times)
        for pre_t in pre.unbind(0):
            i_raw, f_raw, z_raw, o_raw = torch.baddbmm(pre_t, h, r).view(NH, B, GATES, DH).unbind(2)
            log_f = F.logsigmoid(f_raw) + m
            m = torch.maximum(i_raw, log_f)
            i_gate, f_gate = torch.exp(i_raw - m), torch.exp(log_f - m)
            c = torch.addcmul(f_gate * c, i_gate, torch.tanh(z_raw))
            n = torch.addcmul(i_gate, f_gate, n)
            h = torch.sigmoid(o_raw) * c / n
            hs.append(h)
        y = torch.stack(hs).transpose(1, 2).reshape(T * B, H)  # [T, B, NH, DH] flattened
        e = e + F.group_norm(y, NH, self.group_norm, None, NORM_EPS).view(T, B, H)
        if self.proj_up is not None:
            gate, value = self.proj_up(self.ffn_norm(e)).chunk(2, dim=-1)
            e = e + self.proj_down(F.gelu(gate) * value)
        cell = torch.stack((h, c, n, m)).transpose(1, 2).reshape(GATES, B, H)
        return e, cell, conv


class SLSTM(SeqModel):
    """sLSTM blocks (module docstring) mapping [T, B, input_size] to [T, B, hidden_size]; state: (cells, conv)."""

    def __init__(self, input_size: int, hidden_size: int, **options):
        """``options``: policy.slstm's (options.SLSTMConfig: their defaults and rules)."""
        super().__init__()
        o = options_of(SLSTMConfig, options, "policy.slstm")
        if hidden_size % o.heads:
            raise ValueError(f"sLSTM's hidden_size={hidden_size} must be a multiple of heads={o.heads}")
        self.input_size, self.hidden_size, self.layers = input_size, hidden_size, o.layers
        self.heads, self.conv_kernel, self.feedforward = o.heads, o.conv_kernel, o.feedforward
        self.embed = nn.Linear(input_size, hidden_size)
        self.blocks = nn.ModuleList(Block(hidden_size, o, block) for block in range(o.layers))
        self.post_norm = nn.LayerNorm(hidden_size, eps=NORM_EPS, bias=False)

    def initial_state(self, batch_size: int, device=None) -> State:
        dtype = self.embed.weight.dtype
        L, H = self.layers, self.hidden_size
        cells = torch.zeros(L, GATES, batch_size, H, dtype=dtype, device=device)
        conv = torch.zeros(L, batch_size, max(self.conv_kernel - 1, 0), H, dtype=dtype, device=device)
        return cells, conv

    def forward(self, x: torch.Tensor, state: State = None) -> tuple[torch.Tensor, State]:
        self._check_input(x)
        cells, convs = self.initial_state(x.shape[1], x.device) if state is None else state
        e = self.embed(x)
        new_cells, new_convs = [], []
        for block, cell, conv in zip(self.blocks, cells, convs):
            e, cell, conv = block(e, cell, conv)
            new_cells.append(cell)
            new_convs.append(conv)
        return self.post_norm(e), (torch.stack(new_cells), torch.stack(new_convs))

    def activation_floats(self) -> int:
        # per block and step: the cell's about 19 H (its 4 H pre-activations, log sigmoid's, the stabiliser's, both
        # gates, tanh, sigmoid, c, n, h and their products, the stacked h, the norms' inputs), the convolution's 3 H,
        # the feed-forward's 2 H + 4 P (its norm, its up-projection of 2 P, the GELU and the product); measured with
        # saved_tensors_hooks: 3835 at H = 128, P = 192 (30.0 H; 18.9 H with neither convolution nor feed-forward)
        H = self.hidden_size
        per_block = (19 + 3 * (self.conv_kernel > 0)) * H
        if self.feedforward:
            per_block += 2 * H + 4 * self.blocks[0].proj_down.in_features
        return self.layers * per_block

    def extra_repr(self) -> str:
        return (
            f"input_size={self.input_size}, hidden_size={self.hidden_size}, layers={self.layers}, "
            f"heads={self.heads}, conv_kernel={self.conv_kernel}, feedforward={self.feedforward}"
        )
