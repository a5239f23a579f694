"""Fast and Forgetful Memory (Morad et al., NeurIPS 2023).

Cell (paper eqs. input gate, aggregator, read-out, gated residual):

    x~_t = l1(x_t) * sigmoid(l2(x_t))                       input gate        [m]
    S_t  = gamma * S_{t-1} + x~_t 1_c^T                      aggregator        [m, c] complex
    z_t  = l3(Re S_t || Im S_t)                              read-out          [out]
    y_t  = LN(z_t) * sigmoid(l4 x_t) + l5(x_t) * (1 - sigmoid(l4 x_t))

with gamma = exp(-alpha) exp(i omega)^T, alpha in R+^m the decay and omega in R^c the context (the paper's
notation: this alpha is FFM's decay rate, unrelated to SAC's temperature, and gamma is the recurrence's complex
decay, unrelated to the RL discount policy.gamma). l1, l2, l4, l5 are fused into one Linear (``pre``) like the
reference code.

The aggregator's evaluation (``aggregator``: loop, scan, closed) is pomdp_ffm/seq_models/recurrence.py's.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from .base import SeqModel, State
from .recurrence import AGGREGATE, aggregate_closed

AGGREGATORS = ("auto", "loop", "scan", "closed")
PARAM_MODES = ("learned", "fixed", "none")
# How gamma's [m, c] entries are parametrised: "outer" is the paper's outer product of m decay rates (rows) and c
# context frequencies (columns); "hadamard" (the HP ablation) learns a decay and a frequency per entry.
DECAY_CONTEXT_PRODUCTS = ("outer", "hadamard")

# The paper's ablation table, as option sets for ``build("ffm", ..., **ABLATIONS[name])``. A removed gate is
# a gate fixed open (NI: x~ = l1(x); NO: y = LN(z)); "none" fixes omega (NC) or alpha (ND) at zero; "fixed"
# keeps the initial values untrained (FC, FD); HP learns alpha and omega per (row, column) of S, initialised
# to the outer-product values.
ABLATIONS: dict[str, dict] = {
    "FFM": {},
    "FFM-NI": {"input_gate": False},
    "FFM-NO": {"output_gate": False},
    "FFM-NC": {"context": "none"},
    "FFM-FC": {"context": "fixed"},
    "FFM-ND": {"decay": "none"},
    "FFM-FD": {"decay": "fixed"},
    "FFM-HP": {"decay_context_product": "hadamard"},
}

_F64_MAX_LOG = math.log(torch.finfo(torch.float64).max)
DECAY_MIN = 1e-8
# The longest decay horizon whose bound still leaves room for the default initialisation's top decay rate
# (reference_decay_limit(h) - 0.01 > 0); longer horizons would make every decay rate zero or negative.
MAX_DECAY_HORIZON = int(_F64_MAX_LOG / 0.02)
# The closed form takes log(gamma), and gamma = exp(-alpha + i omega) is complex64: a decay rate past float32's
# smallest normal (exp(-87.3)) underflows it towards 0, whose log is -inf. Below this horizon the bound (and the
# default initialisation's top rate) lets alpha get there.
MIN_CLOSED_DECAY_HORIZON = math.ceil(_F64_MAX_LOG / (-math.log(torch.finfo(torch.float32).tiny) + 0.01))


def reference_decay_limit(decay_horizon: int = 1024) -> float:
    """Largest decay rate alpha whose |gamma|^(-decay_horizon) = exp(alpha * decay_horizon) still fits a float64
    (the reference's bound, ~0.683 for its max_len of 1024)."""
    return _F64_MAX_LOG / decay_horizon - 0.01


def _bound_after_load(module: "FFM", incompatible_keys) -> None:
    # load_state_dict writes alpha: bound it now, in either mode (the reference's next call would).
    module.bound_()


def ffm_sizes(hidden_size: int, context_size: int | None = None, memory_size: int | None = None) -> tuple[int, int]:
    """The reference experiments' sizing: c = h // 32, m = h // c, so that m * c = h."""
    c = hidden_size // 32 if context_size is None else context_size
    if c < 1:
        raise ValueError(
            f"FFM cannot split hidden_size={hidden_size}: context_size = hidden_size // 32 = {c}; "
            f"use a hidden size that is a multiple of 32 (32, 64, 96, 128, 256, ...) or pass context_size"
        )
    m = hidden_size // c if memory_size is None else memory_size
    if m < 1 or (memory_size is None and m * c != hidden_size):
        raise ValueError(
            f"FFM cannot split hidden_size={hidden_size} into memory_size x context_size: "
            f"c={c}, m={m}, m*c={m * c}; use a multiple of 32 (32, 64, 96, 128, 256, ...) "
            f"or pass both context_size and memory_size"
        )
    return m, c


class FFM(SeqModel):
    """Fast and Forgetful Memory as a drop-in for a GRU: ``y, state = ffm(x[T, B, in], state)``.

    The state is a complex64 tensor ``[B, memory_size, context_size]``. Options (config ``policy.ffm.*``):

    * ``context_size`` c, ``memory_size`` m: None derives them from hidden_size (``ffm_sizes``).
    * ``max_period`` (the paper's t_e), ``min_period``, ``beta``: the reference initialisation; ``beta`` is the
      fraction a trace has decayed to after its durability.
    * ``decay_horizon``: the decay bound is ``reference_decay_limit(decay_horizon)``, so that |gamma|^(-t)
      stays representable over that many steps (the reference's ``max_len``; not an episode length).
    * ``decay_bound``: clamp the learned decay alpha into [DECAY_MIN, that limit], in place, as the reference does
      before every call (see "Decay bound" below).
    * ``input_gate``, ``output_gate``, ``context``, ``decay``: the ablations (``ABLATIONS``).
    * ``decay_context_product``: "outer" (gamma = exp(-alpha) exp(i omega)^T, the paper) or "hadamard" (one
      alpha and one omega per entry of gamma).
    * ``aggregator``: how the sequence recurrence is evaluated (module docstring).
    * ``init_trace_range``, ``init_period_range``: the paper's informed initialisation, in steps.

    ``alpha`` and ``gamma`` follow the paper: FFM's decay rates and complex decay, not SAC's temperature or the
    RL discount.

    Decay bound. Every call must see alpha clamped into its bound, as after the reference's in-place clamp at each
    call. The parameter changes only when something writes it (an optimiser step, a Polyak average,
    ``load_state_dict``, a hand-made edit), so there are two ways to guarantee it:

    * standalone (the default): ``forward`` clamps when a value is out of range. The check reads a device value,
      i.e. one host synchronisation per call.
    * owner-managed (``bounded_by_owner()``, as the agent's memories are): ``forward`` does not look; the owner
      calls ``bound_()`` (an unconditional in-place clamp, no synchronisation) after every write it makes, before
      the next call (pomdp_ffm/update.py). ``load_state_dict`` clamps in both modes (a post-hook). A hand-made
      write to a managed FFM's alpha is bounded only at the owner's next ``bound_()``
      (patches/014-update-without-host-sync.md).
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        context_size: int | None = None,
        memory_size: int | None = None,
        max_period: float = 128,
        min_period: float = 1,
        beta: float = 0.01,
        decay_horizon: int = 1024,
        decay_bound: bool = True,
        input_gate: bool = True,
        output_gate: bool = True,
        context: str = "learned",
        decay: str = "learned",
        decay_context_product: str = "outer",
        aggregator: str = "auto",
        init_trace_range: tuple[float, float] | None = None,
        init_period_range: tuple[float, float] | None = None,
    ):
        super().__init__()
        for name, value, allowed in (
            ("context", context, PARAM_MODES),
            ("decay", decay, PARAM_MODES),
            ("decay_context_product", decay_context_product, DECAY_CONTEXT_PRODUCTS),
            ("aggregator", aggregator, AGGREGATORS),
        ):
            if value not in allowed:
                raise ValueError(f"FFM option {name}={value!r} is not one of {list(allowed)}")
        if isinstance(decay_horizon, bool) or not isinstance(decay_horizon, int) \
                or not 1 <= decay_horizon <= MAX_DECAY_HORIZON:
            raise ValueError(f"FFM option decay_horizon={decay_horizon!r} must be an int in [1, {MAX_DECAY_HORIZON}]")
        if aggregator == "closed" and decay_horizon < MIN_CLOSED_DECAY_HORIZON:
            raise ValueError(f"FFM option decay_horizon={decay_horizon} must be >= {MIN_CLOSED_DECAY_HORIZON} with "
                             "aggregator='closed' (a shorter one lets the decay underflow gamma, whose log the "
                             "closed form takes); the other aggregators take any")
        self.input_size, self.hidden_size = input_size, hidden_size
        self.memory_size, self.context_size = m, c = ffm_sizes(hidden_size, context_size, memory_size)
        self.input_gate, self.output_gate, self.aggregator = input_gate, output_gate, aggregator
        self.decay_bound = decay_bound and decay == "learned"
        self.decay_horizon = decay_horizon
        self.decay_limit = reference_decay_limit(decay_horizon)
        out = hidden_size
        self._split = (m, out, m if input_gate else 0, out if output_gate else 0)
        self.pre = nn.Linear(input_size, sum(self._split))
        self.mix = nn.Linear(2 * m * c, out)

        alpha, omega = self._initial_decay_context(m, c, max_period, min_period, beta, init_trace_range,
                                                   init_period_range)
        if decay_context_product == "hadamard":
            alpha, omega = alpha.unsqueeze(1).repeat(1, c), omega.unsqueeze(0).repeat(m, 1)
        # alpha: FFM's decay rates (the paper's alpha, not SAC's temperature); omega: its context frequencies.
        self._register("alpha", alpha, decay)
        self._register("omega", omega, context)
        self._gamma_cache: tuple | None = None
        self._owner_bounds = False  # who bounds the decay (class docstring): forward() or the owner
        self.register_load_state_dict_post_hook(_bound_after_load)

    def _initial_decay_context(self, m, c, max_period, min_period, beta, trace_range, period_range):
        if trace_range is None:
            # Reference code: decay rates evenly spaced from just under the overflow bound down to the rate
            # that forgets to `beta` after `max_period` steps.
            hi = self.decay_limit - 0.01
            lo = min(max(1e-6, -math.log(beta) / max_period), hi)
            alpha = torch.linspace(hi, lo, m)
        else:
            # Informed initialisation: trace durabilities t_alpha evenly spaced in the given range (steps).
            alpha = -math.log(beta) / torch.linspace(float(trace_range[0]), float(trace_range[1]), m)
        lo_p, hi_p = (min_period, max_period) if period_range is None else period_range
        omega = 2 * math.pi / torch.linspace(float(lo_p), float(hi_p), c)
        return alpha, omega

    def _register(self, name: str, value: torch.Tensor, mode: str) -> None:
        if mode == "learned":
            self.register_parameter(name, nn.Parameter(value))
        else:
            self.register_buffer(name, torch.zeros_like(value) if mode == "none" else value)

    # ----------------------------------------------------------------------------------------------
    def initial_state(self, batch_size: int, device=None) -> State:
        # The state's precision follows the parameters' (a float64 FFM carries complex128).
        dtype = torch.complex128 if self.pre.weight.dtype == torch.float64 else torch.complex64
        return torch.zeros(batch_size, self.memory_size, self.context_size, dtype=dtype, device=device)

    def gamma(self) -> torch.Tensor:
        """The recurrence's decay gamma = exp(-alpha) exp(i omega) (paper notation; not the RL discount):
        [m, c] complex64, |gamma| <= 1."""
        alpha, omega = self.alpha, self.omega
        if alpha.dim() == 1:  # outer product form: rows decay, columns rotate
            m, c = alpha.shape[0], omega.shape[0]
            alpha, omega = alpha.unsqueeze(1).expand(m, c), omega.unsqueeze(0).expand(m, c)
        return torch.polar(torch.exp(-alpha), omega)

    def _gamma_for_call(self) -> torch.Tensor:
        if torch.is_grad_enabled():
            return self.gamma()
        # Acting steps recompute nothing while the parameters are unchanged (in-place optimiser steps and
        # load_state_dict bump the version counters).
        key = (self.alpha._version, self.omega._version, self.alpha.data_ptr(), self.omega.data_ptr())
        if self._gamma_cache is None or self._gamma_cache[0] != key:
            self._gamma_cache = (key, self.gamma())
        return self._gamma_cache[1]

    def drop_gamma_cache(self) -> None:
        """Forget the acting cache of gamma: the next call without gradients computes it again."""
        self._gamma_cache = None

    def bounded_by_owner(self, owner: bool = True) -> "FFM":
        self._owner_bounds = owner
        return self

    def bound_(self) -> None:
        """Clamp the learned decay into [DECAY_MIN, decay_limit] in place, unconditionally: no host
        synchronisation, but the parameter's version counter moves (which invalidates the acting gamma cache
        and any pending autograd graph that saved alpha), so call it right after a write to alpha, not before
        every forward."""
        if self.decay_bound:
            with torch.no_grad():
                self.alpha.clamp_(DECAY_MIN, self.decay_limit)

    def _bound_decay(self) -> None:
        # The standalone per-call bound (class docstring). The reference clamps the decay parameter's data in
        # place (its bound shapes what FFM learns). Clamping only when a value is out of range leaves the
        # version counter, and so any pending autograd graph and the acting gamma cache, untouched otherwise.
        if self.decay_bound:
            with torch.no_grad():
                a = self.alpha
                if bool(((a < DECAY_MIN) | (a > self.decay_limit)).any()):
                    a.clamp_(DECAY_MIN, self.decay_limit)

    def resolved_aggregator(self, device: torch.device) -> str:
        # Measured (docs/benchmarks.md): the chunked loop wins on a CPU; on a GPU both are launch-bound and
        # the scan's ~2 log2 T kernels beat the loop's ~2 sqrt(T) from T = 1024 on, with a tie at T = 64.
        if self.aggregator != "auto":
            return self.aggregator
        return "scan" if device.type == "cuda" else "loop"

    def forward(self, x: torch.Tensor, state: State = None) -> tuple[torch.Tensor, State]:
        self._check_input(x)
        T, B, _ = x.shape
        if not self._owner_bounds:
            self._bound_decay()
        y_in, thru, in_gate, out_gate = torch.split(self.pre(x), self._split, dim=-1)
        u = y_in * torch.sigmoid(in_gate) if self.input_gate else y_in
        gamma = self._gamma_for_call()
        s0 = self.initial_state(B, x.device) if state is None else state
        S = self._aggregate(u, gamma, s0)
        z = self.mix(torch.view_as_real(S).reshape(T, B, -1))
        z = F.layer_norm(z, z.shape[-1:])
        # LN(z) * g + thru * (1 - g), as one kernel
        y = torch.lerp(thru, z, torch.sigmoid(out_gate)) if self.output_gate else z
        return y, S[-1]

    def _aggregate(self, u: torch.Tensor, gamma: torch.Tensor, s0: torch.Tensor) -> torch.Tensor:
        if u.shape[0] == 1:  # the acting step
            return torch.addcmul(torch.complex(u, torch.zeros_like(u)).unsqueeze(-1), s0, gamma)
        method = self.resolved_aggregator(u.device)
        if method == "closed":  # chunks no longer than the horizon the decay bound was set for
            return aggregate_closed(u, gamma, s0, chunk=self.decay_horizon)
        return AGGREGATE[method](u, gamma, s0)

    # ----------------------------------------------------------------------------------------------
    def trace_durability(self, beta: float = 0.01) -> torch.Tensor:
        """t_alpha: steps until a trace decays to `beta` of its value, per memory row (inf without decay)."""
        return (-math.log(beta) / self.alpha.detach()).cpu()

    def context_periods(self) -> torch.Tensor:
        """t_omega: the period in steps of each context column (inf without context)."""
        return (2 * math.pi / self.omega.detach().abs()).cpu()

    def extra_repr(self) -> str:
        return (f"input_size={self.input_size}, hidden_size={self.hidden_size}, memory_size={self.memory_size}, "
                f"context_size={self.context_size}, aggregator={self.aggregator}")
