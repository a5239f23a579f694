"""The interface of every registered sequence model: ``forward(x[T, B, input_size], state)`` returns
``y[T, B, hidden_size]`` and the last step's state (None: a fresh zero state), which callers never look inside:
what they need of a model or its state (its option section, its memory cost, its caches, its state's tensors) they
ask the model's class here, so that a new model is its module and its conf file."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

State = Any


class SeqModel(nn.Module):
    # Its name, label, colour and option section (its constructor's keyword options besides the sizes; a model
    # stacking layers takes num_layers from policy.rnn_num_layers instead) are its pomdp_ffm.catalog record's.
    # Where train.compile=null compiles the update on CUDA: measured to pay for this memory (docs/benchmarks.md).
    compile_pays: ClassVar[bool] = False

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

    def activation_floats(self) -> int:
        """Floats an update saves per batch row and step for this memory's backward (its gates, state and output):
        the memory estimate's share (RecurrentAgent.update_memory)."""
        raise NotImplementedError

    def bound_(self) -> None:
        """Project the parameters into their allowed range after a write, in place, with no host read."""

    def bounded_by_owner(self, owner: bool = True) -> SeqModel:
        """Leave ``bound_`` to the owner after each of its writes, not a check per call; ``owner=False`` undoes."""
        return self

    def drop_caches(self) -> None:
        """Forget what acting caches between calls: a CUDA-graph capture must compute it inside the graph, and a
        weight copy that bypasses the parameters' versions would leave it stale."""

    def compile_failure(self) -> str | None:
        """Why torch.compile of the update is known to fail on CUDA with this memory (a CompileError's words), or
        None."""
        return None

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
