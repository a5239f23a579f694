"""GRU and LSTM: torch's fused modules with the reference initialisation."""
from __future__ import annotations

import torch
from torch import nn

from .base import SeqModel, State


def reference_rnn_init_(rnn: nn.RNNBase) -> None:
    # The reference orthogonalises each *stacked* matrix as a whole (e.g. the 3H x in GRU weight_ih),
    # not gate by gate; reproducing that keeps the initial spectrum the same.
    for name, param in rnn.named_parameters():
        if "bias" in name:
            nn.init.zeros_(param)
        elif "weight" in name:
            nn.init.orthogonal_(param)


class _TorchRNN(SeqModel):
    rnn_cls: type[nn.RNNBase]

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1):
        super().__init__()
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.rnn = self.rnn_cls(input_size, hidden_size, num_layers=num_layers)
        reference_rnn_init_(self.rnn)

    def _zeros(self, batch_size: int, device) -> torch.Tensor:
        return torch.zeros(self.num_layers, batch_size, self.hidden_size, device=device)

    def forward(self, x: torch.Tensor, state: State = None) -> tuple[torch.Tensor, State]:
        self._check_input(x)
        return self.rnn(x, state)


class GRU(_TorchRNN):
    rnn_cls = nn.GRU

    def initial_state(self, batch_size: int, device=None) -> State:
        return self._zeros(batch_size, device)


class LSTM(_TorchRNN):
    rnn_cls = nn.LSTM

    def initial_state(self, batch_size: int, device=None) -> State:
        return (self._zeros(batch_size, device), self._zeros(batch_size, device))


class MLP(SeqModel):
    """A memoryless encoder: one Linear + ReLU applied to every step; its state is empty. It sits inside the same
    recurrent agent and sequence buffer as the memories, so it is not the reference's Markovian baseline (an
    observation-only agent with a transition buffer; patches/012-mlp-is-not-the-markovian-baseline.md)."""

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        self.net = nn.Sequential(nn.Linear(input_size, hidden_size), nn.ReLU())

    def initial_state(self, batch_size: int, device=None) -> State:
        return None

    def forward(self, x: torch.Tensor, state: State = None) -> tuple[torch.Tensor, State]:
        self._check_input(x)
        return self.net(x), None
