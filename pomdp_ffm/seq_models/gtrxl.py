"""GTrXL, the gated Transformer-XL (Parisotto et al., ICML 2020, "Stabilizing Transformers for Reinforcement
Learning"): Transformer-XL blocks (Dai et al., 2019) with the layer norms moved to the sublayers' inputs (the paper's
identity map reordering, a ReLU on each sublayer's output) and a GRU-type gate in place of each residual connection.

    E^0_t = W_in x_t + b_in
    per layer l = 1 .. L, over S_t = (E^{l-1}_{t-M}, ..., E^{l-1}_{t-1}, E^{l-1}_t), the layer's inputs of the last
    M steps and of this one:
        Ybar_t = RelAttn(LN_1(S_t))                      queries from LN_1(E^{l-1}_t) only
        Y_t    = g_attn(E^{l-1}_t, ReLU(Ybar_t))
        Ebar_t = W_2 ReLU(W_1 LN_2(Y_t) + b_1) + b_2     the position-wise MLP, 4 h wide
        E^l_t  = g_mlp(Y_t, ReLU(Ebar_t))
    y_t = E^L_t                                           (no final LayerNorm: the input reaches the output by gates)

RelAttn is Transformer-XL's relative multi-head attention, per head with q_t = W_q n_t, k_j = W_k n_j, v_j = W_v n_j
(n = LN_1 of the step) and d_head = h / heads:

    A_{t,j} = ((q_t + u)^T k_j + (q_t + v)^T W_R R_{t-j}) / sqrt(d_head),   softmax over j in S_t,  sum_j a_{t,j} v_j

the heads concatenated and mapped by W_o. R_d is the sinusoid of the distance d = t - j in 0 .. M, Transformer-XL's
PositionalEmbedding: R_d = [sin(d w_0), .., sin(d w_{h/2-1}), cos(d w_0), .., cos(d w_{h/2-1})], w_i = 10000^(-2i/h)
(its angles in float64, cast to the model's dtype); u and v are learned per head. W_q, W_k, W_v, W_R and W_o have no
bias, as Transformer-XL's. The gate (the paper's equation for its GRU-type gating):

    r = sigmoid(W_r y + U_r x),   z = sigmoid(W_z y + U_z x - b_g),   h^ = tanh(W_g y + U_g (r * x))
    g(x, y) = (1 - z) * x + z * h^

with b_g learned, starting at policy.gtrxl.gate_bias (the paper's 2: each gate starts near the identity).

Initialisation: Transformer-XL's (kimiyoung/transformer-xl, pytorch/train.py ``weights_init``, init_std 0.02) for the
attention and the MLP: weights and u, v N(0, 0.02), biases 0; the gates' six matrices Glorot-uniform, as RLlib's
GTrXL gate (ray, rllib/models/torch/modules/gru_gate.py), which the paper leaves unstated; the input Linear torch's
default (Transformer-XL looks up token embeddings, the input here is continuous); LayerNorms 1 and 0. No dropout (the
agent's other nets have none). Defaults (options.GTrXLConfig): 2 layers, 4 heads, memory M = 64 and an MLP 4 h wide,
the project Transformer's sizes (its GPT-2 blocks'), so that the two attention memories compare at one size: the
paper's DMLab agents are deeper and attend further, sized for billions of frames, where here a training window is 64
steps; b_g = 2, the paper's.

The memory is a sliding window, as the project's Transformer (transformer.py) attends: every step attends to the M
steps before it and itself, in a window as when acting, so acting one step at a time equals the window. Deliberately
unlike the paper's segment-level recurrence, where the steps of a segment share one memory (the M steps before the
segment: a segment's later steps see more than M steps back, and training and acting see different spans) and the
memory is StopGrad'ed: here a window's steps are one sequence, each reaching exactly M back, and the gradient flows
through all of it, into a carried-in state too (a training window starts from no memory, so that path is taken only
by a caller's carried state). Acting with one-step segments is Transformer-XL's own computation exactly.

The state: per layer the layer inputs E^{l-1} of the last M steps ([layers, B, M, h]) and which of those slots hold a
step (1.0) or none yet (0.0; [B, M]): acting recomputes their keys and values each step (O(M h^2)), which keeps the
state at half the size of cached keys and values. No step count: positions are relative, so a training window starts
from an empty memory (``window_state`` None) exactly as a fresh acting state does: its queries attend over the M
carried slots and its own steps, the empty slots masked (the same computation, to the bit, as from a fresh state).

The reference package gtrxl-torch 0.1.7 (gtrxl_torch/gtrxl_torch.py) implements none of the memory: its ``GTrXL`` adds
absolute sinusoidal positions to the input and stacks ``TEL`` blocks, each torch's multi-head attention on LN(x) over
the given sequence, with no ReLU on the attention's output, and an nn.GRU for each gate, run over the batch axis (a
gate per step only for a batch of one), whose candidate resets after U_g, r * (U_g x + b), where the paper's resets
before, U_g (r * x). tests/test_zoo_gtrxl.py therefore holds this model to the equations above written out in float64
(each step's attention over its own keys), and the gate alone to the package's nn.GRU where the two forms coincide
(U_g diagonal).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ..options import GTrXLConfig
from ..rules import options_of
from .base import SeqModel, State
from .transformer import angles

INIT_STD = 0.02  # Transformer-XL's init_std


def relative_sinusoid(farthest: int, width: int, dtype: torch.dtype, device) -> torch.Tensor:
    """R_d (module docstring) for d = farthest, farthest - 1, .., 0, in that order: [farthest + 1, width]; the
    Transformer's angles (Transformer-XL's frequencies), sines before cosines."""
    angle = angles(torch.arange(farthest, -1, -1, device=device), width)
    return torch.cat((angle.sin(), angle.cos()), dim=1)[:, :width].to(dtype)


def packed(t: torch.Tensor) -> torch.Tensor:
    """``t`` copied to row-major strides, as every Linear's 3-d input here: torch folds a 3-d input of other strides
    (a slice, a transpose; size-1 dims included) into one product or not depending on whether the weight requires
    grad, and the two differ in the last bits, where a frozen copy of the actor must act as the agent does
    (tests/test_bench.py)."""
    return t.clone(memory_format=torch.contiguous_format)


class Gate(nn.Module):
    """g(x, y), the paper's GRU-type gate (module docstring): x the residual stream, y the sublayer's output."""

    def __init__(self, width: int, bias: float):
        super().__init__()
        self.w = nn.Linear(width, 3 * width, bias=False)  # W_r, W_z, W_g, in that order, on y
        self.u = nn.Linear(width, 2 * width, bias=False)  # U_r, U_z on x
        self.u_g = nn.Linear(width, width, bias=False)  # U_g, on r * x: a matrix of its own, after the reset
        self.b_g = nn.Parameter(torch.full((width,), float(bias)))
        with torch.no_grad():  # Glorot per matrix, each [width, width], not over the stacked rows
            for m in (*self.w.weight.chunk(3), *self.u.weight.chunk(2), self.u_g.weight):
                nn.init.xavier_uniform_(m)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        wr, wz, wg = self.w(y).chunk(3, dim=-1)
        ur, uz = self.u(x).chunk(2, dim=-1)
        r = torch.sigmoid(wr + ur)
        z = torch.sigmoid(wz + uz - self.b_g)
        return torch.lerp(x, torch.tanh(wg + self.u_g(r * x)), z)


class Block(nn.Module):
    """One GTrXL layer; ``forward`` takes the layer's inputs over the carried slots and the window."""

    def __init__(self, width: int, heads: int, gate_bias: float):
        super().__init__()
        self.heads, self.scale = heads, (width // heads) ** -0.5
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.query = nn.Linear(width, width, bias=False)
        self.key_value = nn.Linear(width, 2 * width, bias=False)  # W_k over W_v
        self.pos = nn.Linear(width, width, bias=False)  # W_R
        self.u = nn.Parameter(torch.empty(heads, width // heads))
        self.v = nn.Parameter(torch.empty(heads, width // heads))
        self.out = nn.Linear(width, width, bias=False)
        self.fc, self.fc_out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.gate_attn, self.gate_mlp = Gate(width, gate_bias), Gate(width, gate_bias)
        for p in (self.query.weight, self.key_value.weight, self.pos.weight, self.out.weight, self.u, self.v):
            nn.init.normal_(p, std=INIT_STD)  # Transformer-XL's init of the attention and the MLP
        for m in (self.fc, self.fc_out):
            nn.init.normal_(m.weight, std=INIT_STD)
            nn.init.zeros_(m.bias)

    def forward(self, e: torch.Tensor, seq: torch.Tensor, r: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``e[B, T, h]`` the window's layer inputs, ``seq[B, M + T, h]`` the M carried slots' and e; ``r[M + 1, h]``
        the sinusoids of the distances M .. 0; ``mask[B, 1, T, M + T]`` True where a query may attend."""
        B, T, h = e.shape
        N, D, heads = seq.shape[1], r.shape[0], self.heads
        split = lambda z: z.view(B, z.shape[1], heads, h // heads).transpose(1, 2)  # noqa: E731
        n = self.ln_1(seq)
        q = split(self.query(packed(n[:, N - T :])))  # [B, heads, T, d_head]
        k, v = (split(z) for z in self.key_value(n).chunk(2, dim=-1))  # [B, heads, N, d_head]
        rk = self.pos(r).view(D, heads, h // heads).transpose(0, 1)  # [heads, D, d_head]
        content = (q + self.u.unsqueeze(1)) @ k.transpose(-1, -2)  # [B, heads, T, N]
        by_distance = (q + self.v.unsqueeze(1)) @ rk.transpose(-1, -2)  # [B, heads, T, M + 1], distances M .. 0
        # Query i (sequence index M + i) reads key j at distance M + i - j, column j - i: row i shifted right by i.
        # Rows padded to N + 1 columns, flattened and read back N wide: each row lands one further right than the
        # last; what lands outside a query's M + 1 keys is masked.
        position = F.pad(by_distance, (0, N + 1 - D)).flatten(-2)[..., : T * N].view(B, heads, T, N)
        score = ((content + position) * self.scale).masked_fill(~mask, float("-inf"))
        a = torch.softmax(score, dim=-1) @ v
        y = self.gate_attn(e, F.relu(self.out(packed(a.transpose(1, 2)).view(B, T, h))))
        return self.gate_mlp(y, F.relu(self.fc_out(F.relu(self.fc(self.ln_2(y))))))


class GTrXL(SeqModel):
    """GTrXL (module docstring); state: (memory [layers, B, M, h], valid [B, M])."""

    def __init__(self, input_size: int, hidden_size: int, **options):
        """``options``: policy.gtrxl's (options.GTrXLConfig: their defaults and rules)."""
        super().__init__()
        o = options_of(GTrXLConfig, options, "policy.gtrxl")
        if hidden_size % o.heads:
            raise ValueError(f"GTrXL's hidden_size={hidden_size} must be a multiple of heads={o.heads}")
        self.input_size, self.hidden_size, self.layers, self.memory = input_size, hidden_size, o.layers, o.memory
        self.embed = nn.Linear(input_size, hidden_size)
        self.blocks = nn.ModuleList(Block(hidden_size, o.heads, o.gate_bias) for _ in range(o.layers))

    def initial_state(self, batch_size: int, device=None) -> State:
        memory = torch.zeros(self.layers, batch_size, self.memory, self.hidden_size, device=device)
        return memory, torch.zeros(batch_size, self.memory, device=device)

    def forward(self, x: torch.Tensor, state: State = None) -> tuple[torch.Tensor, State]:
        self._check_input(x)
        T, B, h = x.shape[0], x.shape[1], self.hidden_size
        e = packed(self.embed(x).transpose(0, 1))  # [B, T, h]
        memory, valid = self.initial_state(B, x.device) if state is None else state
        memory, valid = memory.to(e.dtype), valid.to(e.dtype)
        M = self.memory
        valid = torch.cat((valid, valid.new_ones(B, T)), dim=1)  # [B, M + T]
        distance = torch.arange(T, device=x.device).unsqueeze(1) + M - torch.arange(M + T, device=x.device)
        window = (distance >= 0) & (distance <= M)  # [T, M + T]
        mask = (window & (valid > 0).unsqueeze(1)).unsqueeze(1)  # [B, 1, T, M + T]
        r = relative_sinusoid(M, h, e.dtype, x.device)
        kept = []
        for layer, block in enumerate(self.blocks):
            seq = torch.cat((memory[layer], e), dim=1)
            kept.append(seq[:, T:])
            e = block(e, seq, r, mask)
        return e.transpose(0, 1), (torch.stack(kept), valid[:, T:])

    def activation_floats(self) -> int:
        # per step and layer: the LayerNorms', projections' and MLP's inputs and outputs, each gate's preactivations,
        # r, z and h^ (about 28 h, measured at h = 128); each head's attention weights over up to memory + 1 keys
        return self.layers * (28 * self.hidden_size + self.blocks[0].heads * (self.memory + 1))
