"""Small feed-forward pieces with the reference's initialisation (docs/reference.md#embedders,
docs/reference.md#heads-and-initialisation)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


class FeatureExtractor(nn.Module):
    """Linear + ReLU embedder; size 0 disables the input (it then contributes an empty feature)."""

    def __init__(self, input_size: int, output_size: int):
        super().__init__()
        self.fc = nn.Linear(input_size, output_size) if output_size > 0 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fc is None:
            return x.new_zeros(*x.shape[:-1], 0)
        return torch.relu(self.fc(x))


def uniform_init_(layer: nn.Linear, bound: float) -> None:
    nn.init.uniform_(layer.weight, -bound, bound)
    nn.init.uniform_(layer.bias, -bound, bound)


class Mlp(nn.Module):
    """ReLU hidden layers (fanin init, bias 0.1); an optional output layer with a tiny uniform init."""

    def __init__(
        self, input_size: int, hidden_sizes: Sequence[int], output_size: int | None = None, init_w: float = 3e-3
    ):
        super().__init__()
        layers, size = [], input_size
        for h in hidden_sizes:
            fc = nn.Linear(size, h)
            # rlkit's "fanin" init as the reference uses it: the bound uses weight.size(0), the *output* size.
            bound = 1.0 / math.sqrt(h)
            nn.init.uniform_(fc.weight, -bound, bound)
            nn.init.constant_(fc.bias, 0.1)
            layers += [fc, nn.ReLU()]
            size = h
        if output_size is not None:
            layers.append(nn.Linear(size, output_size))
            uniform_init_(layers[-1], init_w)
            size = output_size
        self.net = nn.Sequential(*layers)
        self.output_size = size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class TanhGaussianHead(nn.Module):
    """SAC's policy: mean and log-std layers on a shared trunk; actions tanh(mean + std * eps)."""

    def __init__(self, input_size: int, hidden_sizes: Sequence[int], action_dim: int):
        super().__init__()
        self.trunk = Mlp(input_size, hidden_sizes)
        self.mean = nn.Linear(self.trunk.output_size, action_dim)
        self.log_std = nn.Linear(self.trunk.output_size, action_dim)
        uniform_init_(self.mean, 1e-3)
        uniform_init_(self.log_std, 1e-3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(x)
        return self.mean(h), self.log_std(h).clamp(LOG_STD_MIN, LOG_STD_MAX)

    @staticmethod
    def sample(mean: torch.Tensor, log_std: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised action and its log-probability [..., 1] (the reference's formula)."""
        return TanhGaussianHead.squash(mean, log_std, torch.randn_like(mean))

    @staticmethod
    def squash(mean: torch.Tensor, log_std: torch.Tensor, eps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The action tanh(mean + std eps) of a standard normal draw ``eps`` and its log-probability [..., 1]."""
        u = mean + log_std.exp() * eps
        action = torch.tanh(u)
        # log N(u; mean, std) minus the tanh Jacobian (with the reference's 1e-6), per action dim
        log_prob = -0.5 * eps.square() - log_std - HALF_LOG_2PI - torch.log(1 - action.square() + 1e-6)
        return action, log_prob.sum(-1, keepdim=True)


class DeterministicHead(nn.Module):
    """TD3's policy: tanh of an MLP."""

    def __init__(self, input_size: int, hidden_sizes: Sequence[int], action_dim: int):
        super().__init__()
        self.mlp = Mlp(input_size, hidden_sizes, action_dim, init_w=1e-3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.mlp(x))
