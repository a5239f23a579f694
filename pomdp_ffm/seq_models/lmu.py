"""Legendre Memory Unit (Voelker, Kajić and Eliasmith, NeurIPS 2019, "Legendre Memory Units: Continuous-Time
Representation in Recurrent Neural Networks"), the cell POPGym's ray_lmu runs (its sequential ``LMU``).

One step, with x_t the input [I], h the hidden state [H], m the memory [N] (paper eqs. 4, 6, 7):

    u_t = e_x . x_t + e_h . h_{t-1} + e_m . m_{t-1}                       a scalar
    m_t = A m_{t-1} + B u_t                                                LTI memory, A [N, N] dense, B [N, 1]
    h_t = tanh(W_x x_t + W_h h_{t-1} + W_m m_t)                            the output y_t = h_t

A and B are the zero-order-hold discretisation (dt = 1 step) of the continuous Legendre delay system over a window
of theta steps: with R_i = (2 i + 1) / theta, A_c[i, j] = R_i (-1 if i < j else (-1)^(i - j + 1)),
B_c[i] = R_i (-1)^i, and [[A, B], [0, 0]] = expm([[A_c, B_c], [0, 0]]). Fixed buffers unless learn_a / learn_b.
Initialisation as the reference: e_x, e_h LeCun uniform, e_m zero, the W's Xavier normal.

The training window is a loop, one step per kernel group: the memory is linear in u, but u_t reads h_{t-1}, which
went through tanh, so the whole cell is a nonlinear recurrence and no convolution (POPGym's ``LMUFFT``) or scan can
evaluate it exactly. POPGym's parallel ``LMUFFT`` is a different model (u from x alone through a ReLU, no W_h, and a
ReLU read-out), which ray_lmu does not use. To make the loop cheap, each step is one fused matmul: the input
projections of all T steps are computed at once, and the step's dependence on [h, m] is folded into a single
[H + N, H + N] matrix (m_t's and h_t's preactivations both linear in [h_{t-1}, m_{t-1}] given x_t):

    [a_t, m_t] = [x_t W_x^T + x_t e_x^T B^T W_m^T, x_t e_x^T B^T] + [h_{t-1}, m_{t-1}] P,    h_t = tanh(a_t)

which is the same function as the reference's order of operations (its rounding differs at float32 level). The
acting step is the same step, O(1).

State: (h [B, H], m [B, N]), batch first, H + N floats a row. hidden_size is POPGym's hidden_size H; the memory
size N is POPGym's memory_size, which ray_lmu sets to hidden_size (here memory_size=None). POPGym's default embedding
is None, so there is no time embedding and no step count in the state.
"""

from __future__ import annotations

import torch
from torch import nn

from ..options import LMUConfig
from ..rules import options_of
from .base import SeqModel, State


def legendre_delay_matrices(memory_size: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The zero-order-hold discrete (A [N, N], B [N, 1]) of the Legendre delay system, in float64."""
    q = torch.arange(memory_size, dtype=torch.float64)
    r = ((2 * q + 1) / theta).unsqueeze(1)
    i, j = q.unsqueeze(1), q.unsqueeze(0)
    a_c = r * torch.where(i < j, -1.0, (-1.0) ** (i - j + 1))
    b_c = r * (-1.0) ** q.unsqueeze(1)
    block = torch.zeros(memory_size + 1, memory_size + 1, dtype=torch.float64)
    block[:memory_size, :memory_size], block[:memory_size, memory_size:] = a_c, b_c
    discrete = torch.linalg.matrix_exp(block)
    return discrete[:memory_size, :memory_size], discrete[:memory_size, memory_size:]


class LMU(SeqModel):
    """The LMU cell of POPGym's ray_lmu as a drop-in for a GRU; the state is (h [B, H], m [B, N])."""

    def __init__(self, input_size: int, hidden_size: int, **options):
        """``options``: policy.lmu's (options.LMUConfig: their defaults and rules)."""
        super().__init__()
        o = options_of(LMUConfig, options, "policy.lmu")
        self.input_size, self.hidden_size = input_size, hidden_size
        self.memory_size = n = hidden_size if o.memory_size is None else o.memory_size
        self.theta = o.theta
        a, b = (t.float() for t in legendre_delay_matrices(n, o.theta))
        for name, value, learned in (("A", a, o.learn_a), ("B", b, o.learn_b)):
            if learned:
                self.register_parameter(name, nn.Parameter(value))
            else:
                self.register_buffer(name, value)
        self.e_x = nn.Parameter(torch.empty(1, input_size))
        self.e_h = nn.Parameter(torch.empty(1, hidden_size))
        self.e_m = nn.Parameter(torch.zeros(1, n))
        self.W_x = nn.Parameter(torch.empty(hidden_size, input_size))
        self.W_h = nn.Parameter(torch.empty(hidden_size, hidden_size))
        self.W_m = nn.Parameter(torch.empty(hidden_size, n))
        for e in (self.e_x, self.e_h):  # LeCun uniform: U(-sqrt(3 / fan_in), sqrt(3 / fan_in))
            limit = (3.0 / e.shape[1]) ** 0.5
            nn.init.uniform_(e, -limit, limit)
        for w in (self.W_x, self.W_h, self.W_m):
            nn.init.xavier_normal_(w)

    def initial_state(self, batch_size: int, device=None) -> State:
        dtype = self.W_h.dtype
        return (
            torch.zeros(batch_size, self.hidden_size, dtype=dtype, device=device),
            torch.zeros(batch_size, self.memory_size, dtype=dtype, device=device),
        )

    def fused_matrices(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(Q [I, H + N], P [H + N, H + N]): a step's preactivations [a_t, m_t] = x_t Q + [h_{t-1}, m_{t-1}] P."""
        b_row = self.B.t()  # [1, N]
        m_of_h = self.e_h.t() @ b_row  # [H, N]: u's h term, written into the memory
        m_of_m = self.A.t() + self.e_m.t() @ b_row  # [N, N]
        m_of_x = self.e_x.t() @ b_row  # [I, N]
        w_m = self.W_m.t()
        p = torch.cat((torch.cat((self.W_h.t() + m_of_h @ w_m, m_of_h), 1), torch.cat((m_of_m @ w_m, m_of_m), 1)), 0)
        q = torch.cat((self.W_x.t() + m_of_x @ w_m, m_of_x), 1)
        return q, p

    def forward(self, x: torch.Tensor, state: State = None) -> tuple[torch.Tensor, State]:
        self._check_input(x)
        T, B, _ = x.shape
        H = self.hidden_size
        h, m = self.initial_state(B, x.device) if state is None else state
        q, p = self.fused_matrices()
        pre_x = x @ q  # [T, B, H + N]: every step's input terms at once
        s = torch.cat((h, m), 1)
        ys = []
        for t in range(T):
            z = torch.addmm(pre_x[t], s, p)
            h = torch.tanh(z[:, :H])
            s = torch.cat((h, z[:, H:]), 1)
            ys.append(h)
        return torch.stack(ys), (h, s[:, H:])

    def activation_floats(self) -> int:
        # per step: the [h, m] row the matmul saves, tanh's output, the stacked outputs (measured with
        # saved_tensors_hooks: 656 at H = N = 128)
        return 4 * self.hidden_size + self.memory_size

    def extra_repr(self) -> str:
        return (
            f"input_size={self.input_size}, hidden_size={self.hidden_size}, memory_size={self.memory_size}, "
            f"theta={self.theta}"
        )
