"""minGRU (Feng, Tung, Ahmed, Bengio and Hajimirsadeghi, 2024, "Were RNNs All We Needed?"): a GRU whose gate and
candidate read only the input, so that the recurrence is linear in h and runs as a parallel scan.

    z_t  = sigmoid(Linear_z(x_t))                           update gate   [H]
    h~_t = Linear_h(x_t)                                    candidate     [H]
    h_t  = (1 - z_t) * h_{t-1} + z_t * h~_t                               [H], H = hidden_size

This is the paper's minGRU of its main text (its sequential mode and its parallel mode, a scan of a_t = 1 - z_t and
b_t = z_t * h~_t from h_0). The paper's appendix adds a log-space form of the parallel mode, which needs h~ > 0
and so passes the candidate through g(x) = x + 1/2 (x >= 0), sigmoid(x) (x < 0): not used here. Its reason, the
division by a cumulative product of gates in a cumulative-sum scan, does not arise in ``linear_scan`` (a log-depth
scan that only multiplies: a product of gates underflowing to 0 is the right limit), so the plain candidate stays.
1 - z_t is computed as sigmoid(-k_t) (the same value, without the cancellation of 1 - sigmoid(k_t) near z = 1).

Linear_z and Linear_h are one nn.Linear(input_size, 2 H) (torch's default initialisation, which depends only on
fan-in, so it is that of two nn.Linear(input_size, H) as in the paper's code). No options: the paper's expansion
factor belongs to its language-model blocks, and here the state is as wide as a GRU's of hidden_size.

State: h_T [B, hidden_size] (H floats). POPGym has no minGRU: tests/test_zoo_mingru.py holds it to the equations
above written out in float64, and to minGRU-pytorch's ``minGRU`` (its log-space scan and its one-step path) on the
copied weights where both compute the same thing, candidates >= 1/2 (g the identity plus 1/2 there). The window
is pomdp_ffm/seq_models/recurrence.py's ``linear_scan`` with the gate a per step, the acting step its T = 1 case.
"""

from __future__ import annotations

import torch
from torch import nn

from .base import SeqModel, State
from .recurrence import linear_scan


class MinGRU(SeqModel):
    """minGRU (module docstring) mapping [T, B, input_size] to [T, B, hidden_size]."""

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        self.linear = nn.Linear(input_size, 2 * hidden_size)  # Linear_z (gate) over Linear_h (candidate)

    def initial_state(self, batch_size: int, device=None) -> State:
        return torch.zeros(batch_size, self.hidden_size, dtype=self.linear.weight.dtype, device=device)

    def forward(self, x: torch.Tensor, state: State = None) -> tuple[torch.Tensor, State]:
        self._check_input(x)
        k, candidate = self.linear(x).chunk(2, dim=-1)
        h = linear_scan(torch.sigmoid(-k), torch.sigmoid(k) * candidate, state)
        return h, h[-1]

    def activation_floats(self) -> int:
        # the gate's and the candidate's inputs and outputs, the complement, z * h~, the states (measured with
        # saved_tensors_hooks: 832 at H = 128)
        return 7 * self.hidden_size

    def extra_repr(self) -> str:
        return f"input_size={self.input_size}, hidden_size={self.hidden_size}"
