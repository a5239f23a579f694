"""The independently recurrent neural network (S. Li, W. Li, C. Cook, C. Zhu and Y. Gao, 2018, "Independently
Recurrent Neural Network (IndRNN): Building a Longer and Deeper RNN", CVPR), two layers as POPGym's
``popgym.baselines.models.indrnn.IndRNN`` (behind ``ray_models.ray_indrnn.IndRNN``) stacks them:

    h0_t = f(W0 x_t  + c0 + u0 * h0_{t-1} + b0)
    h1_t = f(W1 h0_t + c1 + u1 * h1_{t-1} + b1)               y_t = h1_t

with ``*`` elementwise: each unit feeds back only its own previous value, through its own weight u (a vector, not a
matrix). f is ReLU. W, c are a Linear's weight and bias; b is a second bias, POPGym's, kept so that the parameters
train as POPGym's do. The recurrent weights are bounded, |u| <= 2^(1 / bound_horizon) (POPGym's clamp, its
``max_len`` being RLlib's ``max_seq_len``, 1024 in POPGym's experiments): a unit's feedback can grow a value, or
its gradient, at most twofold over ``bound_horizon`` steps (the paper bounds |u| by such a root of the largest gain
allowed over the sequence). The activation inside makes the recurrence nonlinear, so it runs step by step (not
recurrence.linear_scan), each layer as one autograd function that saves only its outputs (``_IndependentRecurrence``).

State: h0_{t-1} and h1_{t-1}, ``[2, B, hidden_size]`` (layer first, batch second, like nn.RNN's; POPGym keeps it
batch first, ``[B, 2, hidden_size]``): 2 * hidden_size floats per batch row. hidden_size is POPGym's ``hidden_size``,
the width of both layers and of the output. Initialisation as POPGym's: u and b uniform in [0, 1), the Linears
torch's default.

Deliberate differences from POPGym:
- POPGym's IndRNN also builds a Linear ``output`` (hidden_size -> hidden_size) that its forward never applies; it is
  left out (tests/test_zoo_elman_indrnn.py checks that it gets no gradient in POPGym's).
- POPGym's ray model's MODEL_CONFIG sets ``"activation": "tanh"``, but passes it nowhere: its core applies ReLU
  whatever the option says. The option ``activation`` here defaults to what POPGym computes, ReLU; ``tanh`` is
  offered as the config suggests (held in the test to the equations above in float64).
- POPGym clamps u in place at every forward. Here the bound holds as FFM's does: standalone, ``forward`` clamps an
  out-of-range u (a host read); owner-managed (``bounded_by_owner()``), the owner calls ``bound_()`` after each
  write; ``load_state_dict`` clamps in both. Either way every forward sees u bounded, as in POPGym.
"""

from __future__ import annotations

import torch
from torch import nn

from ..options import IndRNNConfig
from ..rules import options_of
from .base import SeqModel, State


class _IndependentRecurrence(torch.autograd.Function):
    """h_t = f(u_t + w * h_{t-1}), h_{-1} = h0, f ReLU (``relu``) or tanh: u [T, B, H], w [H], h0 [B, H] -> h
    [T, B, H]. Saves h alone: f'(p_t) is a function of h_t (h_t > 0 for ReLU, 1 - h_t^2 for tanh). Backward: the
    adjoint g_t = f'(p_t) (dL/dh_t + w g_{t+1}) runs backwards in time; grad u = g, grad w = sum_{t,b} g_t h_{t-1},
    grad h0 = w g_0."""

    @staticmethod
    def forward(u: torch.Tensor, w: torch.Tensor, h0: torch.Tensor, relu: bool) -> torch.Tensor:
        h = torch.empty_like(u)
        prev = h0
        for t in range(u.shape[0]):
            prev = torch.addcmul(u[t], prev, w, out=h[t])
            if relu:
                prev.relu_()
            else:
                prev.tanh_()
        return h

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, w, h0, relu = inputs
        ctx.save_for_backward(w, h0, output)
        ctx.relu = relu

    @staticmethod
    def backward(ctx, grad_h: torch.Tensor):
        w, h0, h = ctx.saved_tensors
        slope = (h > 0).to(h.dtype) if ctx.relu else torch.addcmul(torch.ones_like(h), h, h, value=-1)
        g = torch.empty_like(h)
        T = h.shape[0]
        torch.mul(grad_h[T - 1], slope[T - 1], out=g[T - 1])
        for t in range(T - 2, -1, -1):
            torch.addcmul(grad_h[t], g[t + 1], w, out=g[t]).mul_(slope[t])
        grad_w = grad_h0 = None
        if ctx.needs_input_grad[1]:
            grad_w = (g[0] * h0).sum(0)
            if T > 1:
                grad_w = grad_w + (g[1:] * h[:-1]).sum((0, 1))
        if ctx.needs_input_grad[2]:
            grad_h0 = g[0] * w
        return g if ctx.needs_input_grad[0] else None, grad_w, grad_h0, None


def _bound_after_load(module: IndRNN, _keys) -> None:
    module.bound_()  # load_state_dict wrote u: bound it in either mode, as POPGym's next forward would


class IndRNN(SeqModel):
    """A two-layer IndRNN; the state is ``[2, B, hidden_size]``, each layer's last output."""

    def __init__(self, input_size: int, hidden_size: int, **options):
        """``options``: policy.indrnn's (options.IndRNNConfig: their defaults and rules)."""
        super().__init__()
        o = options_of(IndRNNConfig, options, "policy.indrnn")
        self.input_size, self.hidden_size = input_size, hidden_size
        self.activation, self.recurrent_bound = o.activation, o.recurrent_bound
        self.recurrent_limit = 2 ** (1 / o.bound_horizon)
        self.input0 = nn.Linear(input_size, hidden_size)
        self.recurrent0 = nn.Parameter(torch.rand(hidden_size))
        self.bias0 = nn.Parameter(torch.rand(hidden_size))
        self.input1 = nn.Linear(hidden_size, hidden_size)
        self.recurrent1 = nn.Parameter(torch.rand(hidden_size))
        self.bias1 = nn.Parameter(torch.rand(hidden_size))
        self._owner_bounds = False  # who bounds u (module docstring)
        self.register_load_state_dict_post_hook(_bound_after_load)

    def initial_state(self, batch_size: int, device=None) -> State:
        return torch.zeros(2, batch_size, self.hidden_size, dtype=self.bias0.dtype, device=device)

    def bounded_by_owner(self, owner: bool = True) -> IndRNN:
        self._owner_bounds = owner
        return self

    def bound_(self, only_if_out: bool = False) -> None:
        """Clamp u into [-limit, limit] in place. Unconditionally (no host read) it moves the parameters' version
        counters, failing any pending backward that saved them: call it right after a write, not before a forward.
        ``only_if_out``, the standalone per-call bound, reads the device to leave them alone when it can."""
        if not self.recurrent_bound:
            return
        limit = self.recurrent_limit
        with torch.no_grad():
            for u in (self.recurrent0, self.recurrent1):
                if not only_if_out or bool((u.abs() > limit).any()):
                    u.clamp_(-limit, limit)

    def forward(self, x: torch.Tensor, state: State = None) -> tuple[torch.Tensor, State]:
        self._check_input(x)
        if state is None:
            state = self.initial_state(x.shape[1], x.device)
        if not self._owner_bounds:
            self.bound_(only_if_out=True)
        relu = self.activation == "relu"
        h0 = _IndependentRecurrence.apply(self.input0(x) + self.bias0, self.recurrent0, state[0], relu)
        h1 = _IndependentRecurrence.apply(self.input1(h0) + self.bias1, self.recurrent1, state[1], relu)
        return h1, torch.stack((h0[-1], h1[-1]))

    def activation_floats(self) -> int:
        # Each layer's outputs, saved by its recurrence (layer 0's also by input1, the same tensor); y is h1.
        return 2 * self.hidden_size
