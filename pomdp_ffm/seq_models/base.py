"""The interface of every registered sequence model, what a memory's author implements: ``forward(x[T, B,
input_size], state)`` returns ``y[T, B, hidden_size]`` and the last step's state (None: a fresh zero state), which
callers never look inside: what they need of a state (its tensors, a copy, where a training window starts) they ask
the model's class here, so that a new model is its module and its catalog record. What CUDA graphs, compiling and the
memory estimate need of a memory is ``Runtime`` (runtime.py), every hook with a default."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .runtime import Runtime

State = Any


class SeqModel(Runtime, nn.Module):
    # Its name, label, colour and option section (its constructor's keyword options besides the sizes; a model
    # stacking layers takes num_layers from policy.rnn_num_layers instead) are its pomdp_ffm.catalog record's.
    input_size: int
    hidden_size: int

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> State:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, state: State = None) -> tuple[torch.Tensor, State]:
        raise NotImplementedError

    def window_state(self, first_step: torch.Tensor) -> State:
        """The state a training window starts from, given the index in its episode of each window's first step
        (int64 [B]): the memory part zero, as the reference starts every window; a memory whose output reads the
        step's index (the time-embedded ones) counts on from ``first_step``, as acting through the episode would.
        None (a fresh state) for a memory without a step count."""
        return None

    def bound_(self) -> None:
        """Project the parameters into their allowed range after a write, in place, with no host read."""

    def state_tensors(self, state: State) -> list[torch.Tensor]:
        """The tensors a state holds, in a fixed order (a captured acting step's static state is copied in and out
        tensor by tensor): a tensor, nested tuples of them, or None."""
        if state is None or torch.is_tensor(state):
            return [] if state is None else [state]
        return [t for s in state for t in self.state_tensors(s)]

    def clone_state(self, state: State) -> State:
        if state is None or torch.is_tensor(state):
            return None if state is None else state.clone()
        return type(state)(map(self.clone_state, state))

    def _check_input(self, x: torch.Tensor) -> None:
        if x.dim() != 3 or x.shape[-1] != self.input_size:
            raise ValueError(
                f"{type(self).__name__} expects input of shape [T, B, {self.input_size}], got {tuple(x.shape)}"
            )
