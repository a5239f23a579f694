"""POPGym's sine time embedding (Morad et al., 2023, "POPGym: Benchmarking Partially Observable Reinforcement
Learning"; its ray_models/base_model.py ``apply_embedding`` with embedding "sine", mode "add", embedding_size None:
every feature), the one implementation the models whose POPGym defaults turn it on share: PosMLP (posmlp.py), Stack
(stack.py), TCN (tcn.py), FART (fart.py) and FWP (fwp.py).

    e_t = (1 - s) x_t + s PE(t)     scale_embedding on: s = clamp(strength, 0, 1), a learned scalar, strength_0 = 0.5
    e_t = x_t + PE(t)               scale_embedding off

with t the step's index in its episode (acting counts it in the state; a training window starts at its first step's
index, ``SeqModel.window_state``, as POPGym's ``t_starts``: patches/023) and PE the sinusoidal position code of
Vaswani et al. (2017) over the input's d features, its frequency base being the horizon N (POPGym's
``max_seq_len``, 1024 in its experiments) instead of the transformer's 10000:

    PE(t)[2i] = sin(t N^(-2i/d)),  PE(t)[2i+1] = cos(t N^(-2i/d)),  i = 0 .. ceil(d/2) - 1.

The models' options, one set of names and meanings for all of them (a model without the ``embedding`` switch, as
PosMLP, always embeds):
- ``embedding``: "sine" (POPGym's default for these models) or "none" (POPGym's None: no embedding);
- ``embedding_horizon``: N, an int >= 1, default 1024; not a limit on episode length (below);
- ``scale_embedding``: POPGym's BASE_CONFIG scale_embedding, default True: mix by the learned strength; False: add.

Deliberate differences from POPGym:
- POPGym looks PE up in a table of max_seq_len rows, so an index past it fails (an out-of-range embedding lookup);
  here PE is computed from the index, as the table's entries are (a float32 product ``t * N^(-2i/d)``, then sin and
  cos: equal to the table's entries below N), so any episode length works. Past N the code simply continues; the
  float32 index is exact up to 2^24 steps, beyond which it rounds (still finite).
- POPGym's table needs an even d (its cosine half has no room for the last sine of an odd d); here an odd d drops
  that last cosine.
- POPGym clamps the strength's data in place at each call; here the call uses the clamped value (with an identity
  gradient, as POPGym's clamped leaf has) and writes nothing, and ``bound_`` clamps the parameter in place: the
  agent's update calls it after each optimiser write (update.bound_memories_), which keeps the parameter where
  POPGym's next call would put it, without a write during the forward that a pending backward could see
  (``load_state_dict`` bounds too).
- POPGym adds the embedding before its preprocessor (identity by default; a Linear + LeakyReLU in its PPO runs);
  here it is added to the memory's input, the agent's embedders' output: POPGym's order with an identity
  preprocessor.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..options import DEFAULT_HORIZON


def _bound_after_load(module: SineTimeEmbedding, _keys) -> None:
    module.bound_()


class SineTimeEmbedding(nn.Module):
    """x_t -> (1 - s) x_t + s PE(t) (``scaled``) or x_t + PE(t), PE over x's ``width`` features with frequency base
    ``horizon`` (the module docstring); ``forward(x[T, B, width], start[B])``, t = start + 0 .. T - 1."""

    def __init__(self, width: int, horizon: int = DEFAULT_HORIZON, scaled: bool = True):
        super().__init__()
        self.width, self.horizon, self.scaled = width, horizon, scaled
        # The frequencies N^(-2i/d), in float32 as POPGym's table forms them (non-persistent: derived, not learned).
        freq = torch.exp(torch.arange(0, width, 2).float() * (-math.log(horizon) / width))
        self.register_buffer("freq", freq, persistent=False)
        if scaled:
            self.strength = nn.Parameter(torch.tensor([0.5]))
            self.register_load_state_dict_post_hook(_bound_after_load)

    def code(self, t: torch.Tensor) -> torch.Tensor:
        """PE(t): int64 indices [...] -> [..., width], sin and cos interleaved."""
        angle = t.to(self.freq.dtype).unsqueeze(-1) * self.freq
        return torch.stack((torch.sin(angle), torch.cos(angle)), dim=-1).flatten(-2)[..., : self.width]

    def forward(self, x: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        t = start.unsqueeze(0) + torch.arange(x.shape[0], device=x.device).unsqueeze(1)  # [T, B]
        pe = self.code(t).to(x.dtype)
        if not self.scaled:
            return x + pe
        s = self.strength
        s = s + (s.clamp(0.0, 1.0) - s).detach()  # the clamped value, the gradient passed through as to POPGym's leaf
        return x * (1.0 - s) + pe * s

    def bound_(self) -> None:
        if self.scaled:
            with torch.no_grad():
                self.strength.clamp_(0.0, 1.0)

    def extra_repr(self) -> str:
        return f"width={self.width}, horizon={self.horizon}, scaled={self.scaled}"


def sine_embedding(embedding: str, width: int, horizon: int, scaled: bool) -> SineTimeEmbedding | None:
    """The embedding the options choose: a SineTimeEmbedding for "sine", None for "none"."""
    return SineTimeEmbedding(width, horizon, scaled) if embedding == "sine" else None
