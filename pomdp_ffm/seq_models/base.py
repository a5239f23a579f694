"""The interface every sequence model in the registry follows.

A model maps a time-major input ``x[T, B, input_size]`` and a recurrent state to an output
``y[T, B, hidden_size]`` and the state after the last step. ``state=None`` means a fresh zero state.
Callers never look inside a state: a GRU tensor, an LSTM tuple and FFM's complex matrix all fit.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

State = Any


class SeqModel(nn.Module):
    input_size: int
    hidden_size: int

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> State:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, state: State = None) -> tuple[torch.Tensor, State]:
        raise NotImplementedError

    def bound_(self) -> None:
        """Project the parameters back into their allowed range after a write to them (an optimiser step, a
        Polyak average), in place and without a host synchronisation. Nothing to do for most models."""

    def bounded_by_owner(self, owner: bool = True) -> "SeqModel":
        """Leave ``bound_`` to the owner, who calls it after every write it makes, instead of checking the bound
        at each call (a host read per call where there is one); ``owner=False`` goes back. Returns the model."""
        return self

    def _check_input(self, x: torch.Tensor) -> None:
        if x.dim() != 3 or x.shape[-1] != self.input_size:
            raise ValueError(
                f"{type(self).__name__} expects input of shape [T, B, {self.input_size}], "
                f"got {tuple(x.shape)}"
            )
