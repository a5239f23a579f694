"""A causal Transformer of pre-LayerNorm GPT-2 blocks (Radford et al., 2019) over the agent's inputs, attending to
the last ``context`` steps (its own included): what AMAGO and memorax register as a trajectory encoder beside
recurrent memories.

    e_t = W_in x_t + b_in + PE(t)
    a = e + Attn(LN_1(e)),  e' = a + MLP(LN_2(a))     per block; y = LN_f(e') after the last

with PE the sinusoidal code of Vaswani et al. (2017), frequency base 10000, of the step's index t in its episode,
PE(t)[2i] = sin(t 10000^(-2i/h)), PE(t)[2i+1] = cos(t 10000^(-2i/h)): positions need no table, so any episode length
works. Its angles are formed in float64 and the code cast to the model's dtype (float32 angles of t ~ 1000 would be
off by up to 6e-5, more than the rest of the model's rounding). Attn is
multi-head scaled dot-product attention with a causal window: step t attends to steps t - context + 1 .. t. MLP is
GPT-2's: a Linear to 4 h, GELU (its tanh approximation, GPT-2's ``gelu_new``), a Linear back to h. No dropout (the
agent's other nets have none). Initialisation as GPT-2's: every weight N(0, 0.02), the residual projections'
N(0, 0.02 / sqrt(2 layers)), biases 0, LayerNorms 1 and 0.

The state is what acting needs to go on: per layer the keys and values of the last ``context`` steps
([layers, B, context, h] each), which of those slots hold a step (1.0) or none yet (0.0; [B, context]), and the next
step's index ([B], int64). One acting step
costs O(context): its query against the carried keys. A window carried in from a state attends across its start
exactly as acting does, so acting one step at a time equals the window; a window longer than ``context`` attends
to the last ``context`` steps only, as acting does. A training window starts from no keys and its step index
(``window_state``: the memory part empty, the count at the window's first step, as the other time-embedded memories
start: patches/023); its queries then attend over its own steps, the empty slots masked out.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ..options import TransformerConfig
from ..rules import options_of
from .base import SeqModel, State

POSITION_BASE = 10000  # Vaswani et al.'s frequency base


def angles(t: torch.Tensor, width: int) -> torch.Tensor:
    """The sinusoids' angles t 10000^(-2i/width) of positions ``t[...]``, in float64: [..., ceil(width / 2)]."""
    i = torch.arange(0, width, 2, dtype=torch.float64, device=t.device)
    return t.to(torch.float64).unsqueeze(-1) * torch.exp(i * (-math.log(POSITION_BASE) / width))


def sinusoid(t: torch.Tensor, width: int, dtype: torch.dtype) -> torch.Tensor:
    """PE(t) (module docstring) for int64 indices ``t[...]``: [..., width], sin and cos interleaved."""
    angle = angles(t, width)
    return torch.stack((angle.sin(), angle.cos()), dim=-1).flatten(-2)[..., :width].to(dtype)


class Block(nn.Module):
    """One pre-LayerNorm GPT-2 block; ``forward`` takes the carried keys and values of its layer."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)  # the queries', keys' and values' rows, in that order
        self.proj = nn.Linear(width, width)
        self.fc, self.fc_out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(
        self, e: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``e[B, T, h]``; ``keys``/``values`` ``[B, K, h]`` carried in; ``mask[B, 1, T, K + T]`` True where a
        query may attend. Returns the block's output and its keys and values over K + T steps."""
        q, k, v = self.qkv(self.ln_1(e)).chunk(3, dim=-1)
        k, v = torch.cat((keys, k), dim=1), torch.cat((values, v), dim=1)
        B, T, h = q.shape
        split = lambda z: z.view(B, z.shape[1], self.heads, h // self.heads).transpose(1, 2)  # noqa: E731
        a = F.scaled_dot_product_attention(split(q), split(k), split(v), attn_mask=mask)
        a = e + self.proj(a.transpose(1, 2).reshape(B, T, h))
        return a + self.fc_out(F.gelu(self.fc(self.ln_2(a)), approximate="tanh")), k, v


class Transformer(SeqModel):
    """The causal Transformer (module docstring); state: (keys, values, valid, step)."""

    def __init__(self, input_size: int, hidden_size: int, **options):
        """``options``: policy.transformer's (options.TransformerConfig: their defaults and rules)."""
        super().__init__()
        o = options_of(TransformerConfig, options, "policy.transformer")
        if hidden_size % o.heads:
            raise ValueError(f"Transformer's hidden_size={hidden_size} must be a multiple of heads={o.heads}")
        self.input_size, self.hidden_size, self.layers, self.context = input_size, hidden_size, o.layers, o.context
        self.embed = nn.Linear(input_size, hidden_size)
        self.blocks = nn.ModuleList(Block(hidden_size, o.heads) for _ in range(o.layers))
        self.ln_f = nn.LayerNorm(hidden_size)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln" not in name:
                residual = name.endswith(("proj.weight", "fc_out.weight"))
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * o.layers) if residual else 0.02)

    def initial_state(self, batch_size: int, device=None) -> State:
        cache = torch.zeros(self.layers, batch_size, self.context, self.hidden_size, device=device)
        valid = torch.zeros(batch_size, self.context, device=device)
        return cache, cache.clone(), valid, torch.zeros(batch_size, dtype=torch.long, device=device)

    def window_state(self, first_step: torch.Tensor) -> State:
        return (*self.initial_state(first_step.shape[0], first_step.device)[:3], first_step)

    def forward(self, x: torch.Tensor, state: State = None) -> tuple[torch.Tensor, State]:
        self._check_input(x)
        T, B, K = x.shape[0], x.shape[1], self.context
        keys, values, valid, step = self.initial_state(B, x.device) if state is None else state
        t = step.unsqueeze(0) + torch.arange(T, device=x.device).unsqueeze(1)  # [T, B]
        e = (self.embed(x) + sinusoid(t, self.hidden_size, x.dtype)).transpose(0, 1)  # [B, T, h]
        valid = torch.cat((valid.to(e.dtype), valid.new_ones(B, T, dtype=e.dtype)), dim=1)  # [B, K + T]
        i = torch.arange(T, device=x.device).unsqueeze(1) + K
        j = torch.arange(K + T, device=x.device).unsqueeze(0)
        window = (j <= i) & (j > i - K)  # query i (key K + i) attends to keys K + i - context + 1 .. K + i
        mask = (window.unsqueeze(0) & (valid > 0).unsqueeze(1)).unsqueeze(1)  # [B, 1, T, K + T]
        new_keys, new_values = [], []
        for layer, block in enumerate(self.blocks):
            e, k, v = block(e, keys[layer].to(e.dtype), values[layer].to(e.dtype), mask)
            new_keys.append(k[:, -K:])
            new_values.append(v[:, -K:])
        state = (torch.stack(new_keys), torch.stack(new_values), valid[:, -K:], step + T)
        return self.ln_f(e).transpose(0, 1), state

    def activation_floats(self) -> int:
        # per step and layer: the LayerNorms' inputs and outputs, q, k, v, the attention's output and projection, the
        # MLP's 4 h before and after GELU (about 18 h); each head's scores and weights over up to ``context`` keys
        return self.layers * (18 * self.hidden_size + 2 * self.blocks[0].heads * self.context)
