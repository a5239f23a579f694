"""The interface of every registered sequence model: ``forward(x[T, B, input_size], state)`` returns
``y[T, B, hidden_size]`` and the last step's state (None: a fresh zero state), which callers never look inside."""
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
        """Project the parameters into their allowed range after a write, in place, with no host read."""

    def bounded_by_owner(self, owner: bool = True) -> "SeqModel":
        """Leave ``bound_`` to the owner after each of its writes, not a check per call; ``owner=False`` undoes."""
        return self

    def _check_input(self, x: torch.Tensor) -> None:
        if x.dim() != 3 or x.shape[-1] != self.input_size:
            raise ValueError(f"{type(self).__name__} expects input of shape [T, B, {self.input_size}], "
                             f"got {tuple(x.shape)}")
