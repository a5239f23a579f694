"""GRU and LSTM: torch's fused modules with the reference initialisation; TorchRNN, the base of every memory that is
one of torch's fused RNN modules (GRU, LSTM, Elman)."""

from __future__ import annotations

import torch
from torch import nn

from .base import SeqModel, State


class TorchRNN(SeqModel):
    rnn_cls: type[nn.RNNBase]
    activations: int  # floats an update saves per unit of width and layer (activation_floats)

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1):
        super().__init__()
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.rnn = self.rnn_cls(input_size, hidden_size, num_layers=num_layers)
        # The reference orthogonalises each stacked matrix (e.g. GRU's 3H x in weight_ih) whole, not per gate.
        for name, param in self.rnn.named_parameters():
            if "bias" in name:
                nn.init.zeros_(param)
            elif "weight" in name:
                nn.init.orthogonal_(param)

    def initial_state(self, batch_size: int, device=None) -> State:
        zeros = lambda: torch.zeros(self.num_layers, batch_size, self.hidden_size, device=device)
        return (zeros(), zeros()) if self.rnn_cls is nn.LSTM else zeros()

    def forward(self, x: torch.Tensor, state: State = None) -> tuple[torch.Tensor, State]:
        self._check_input(x)
        return self.rnn(x, state)

    def activation_floats(self) -> int:
        return self.activations * self.hidden_size * self.num_layers


class GRU(TorchRNN):
    rnn_cls, activations = nn.GRU, 8


class LSTM(TorchRNN):
    rnn_cls, activations = nn.LSTM, 10


class MLP(SeqModel):
    """A memoryless Linear + ReLU per step, inside the recurrent agent and sequence buffer: not the reference's
    Markovian baseline (patches/012-mlp-is-not-the-markovian-baseline.md)."""

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        self.net = nn.Sequential(nn.Linear(input_size, hidden_size), nn.ReLU())

    def initial_state(self, batch_size: int, device=None) -> State:
        return None

    def forward(self, x: torch.Tensor, state: State = None) -> tuple[torch.Tensor, State]:
        self._check_input(x)
        return self.net(x), None

    def activation_floats(self) -> int:
        return 2 * self.hidden_size
