"""Fast and Forgetful Memory (Morad et al., NeurIPS 2023).

Cell (paper eqs. input gate, aggregator, read-out, gated residual):

    x~_t = l1(x_t) * sigmoid(l2(x_t))                       input gate        [m]
    S_t  = gamma * S_{t-1} + x~_t 1_c^T                      aggregator        [m, c] complex
    z_t  = l3(Re S_t || Im S_t)                              read-out          [out]
    y_t  = LN(z_t) * sigmoid(l4 x_t) + l5(x_t) * (1 - sigmoid(l4 x_t))

with gamma = exp(-alpha) exp(i omega)^T, alpha in R+^m the decay and omega in R^c the context (paper notation: not
SAC's temperature nor the RL discount). l1, l2, l4, l5 are fused into one Linear (``pre``) like the reference.
The aggregator's evaluation (loop, scan, assoc, closed) is pomdp_ffm/seq_models/recurrence.py's.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ..options import F64_MAX_LOG, FFMConfig, size_rule
from ..rules import options_of
from .base import SeqModel, State
from .recurrence import AGGREGATE, aggregate_closed, aggregate_pairs

# The paper's ablation table as ``build("ffm", **ABLATIONS[name])`` options: a removed gate is fixed open, "none"
# fixes omega (NC) or alpha (ND) at zero, "fixed" leaves the initial values untrained.
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

DECAY_MIN = 1e-8


def reference_decay_limit(decay_horizon: int = 1024) -> float:
    """The largest alpha with exp(alpha * decay_horizon) in a float64 (the reference's bound, ~0.683 for 1024)."""
    return F64_MAX_LOG / decay_horizon - 0.01


# The timescales, written once: FFM's methods and analysis/decay.py's tables (numpy arrays) both call these.
def trace_durability(alpha, beta: float = 0.01):
    """t_alpha = ln(1/beta) / alpha: steps until a trace (|gamma| = exp(-alpha) a step) decays to ``beta`` of its
    value; ``alpha`` a tensor or a numpy array."""
    return math.log(1 / beta) / alpha


def context_period(omega):
    """t_omega = 2 pi / |omega|: the period in steps of a context column's rotation."""
    return 2 * math.pi / abs(omega)


def _bound_after_load(module: FFM, _keys) -> None:
    module.bound_()  # load_state_dict wrote alpha: bound it in either mode, as the reference's next call would


def ffm_sizes(hidden_size: int, context_size: int | None = None, memory_size: int | None = None) -> tuple[int, int]:
    """The reference experiments' sizing: c = h // 32, m = h // c, so that m * c = h (``size_rule``)."""
    for name, size in (("context_size", context_size), ("memory_size", memory_size)):
        if size is not None and size < 1:
            raise ValueError(f"FFM option {name}={size} must be >= 1")
    rule = size_rule(hidden_size, context_size, memory_size)
    if rule is not None:
        fix = "pass a context_size that divides it" if context_size is None else "pass memory_size too"
        raise ValueError(f"FFM cannot split hidden_size={hidden_size}: it must be {' '.join(rule)}; or {fix}")
    c = hidden_size // 32 if context_size is None else context_size
    return (hidden_size // c if memory_size is None else memory_size), c


class FFM(SeqModel):
    """Fast and Forgetful Memory as a drop-in for a GRU; the state is complex64 ``[B, memory_size, context_size]``.
    ``decay_horizon`` (the reference's ``max_len``) sets the bound ``decay_bound`` clamps alpha into. Every call must
    see alpha bounded: standalone, ``forward`` clamps an out-of-range value (a host read); owner-managed
    (``bounded_by_owner()``), the owner calls ``bound_()`` after each write; ``load_state_dict`` clamps in both
    (patches/014)."""

    # On CUDA, compiled updates of FFM were measured faster than eager ones (docs/benchmarks.md)
    compile_pays = True

    def __init__(self, input_size: int, hidden_size: int, **options):
        """``options``: policy.ffm's (options.FFMConfig: their defaults and rules, as the config checks them)."""
        super().__init__()
        o = options_of(FFMConfig, options, "policy.ffm")
        self.input_size, self.hidden_size = input_size, hidden_size
        self.memory_size, self.context_size = m, c = ffm_sizes(hidden_size, o.context_size, o.memory_size)
        self.input_gate, self.output_gate, self.aggregator = o.input_gate, o.output_gate, o.aggregator
        self.decay_bound = o.decay_bound and o.decay == "learned"
        self.decay_horizon, self.decay_limit = o.decay_horizon, reference_decay_limit(o.decay_horizon)
        self.split_sizes = (m, hidden_size, m if o.input_gate else 0, hidden_size if o.output_gate else 0)
        self.pre = nn.Linear(input_size, sum(self.split_sizes))
        self.mix = nn.Linear(2 * m * c, hidden_size)
        if o.init_trace_range is None:  # the reference: from under the bound to the rate keeping beta at max_period
            hi = self.decay_limit - 0.01
            alpha = torch.linspace(hi, min(max(1e-6, -math.log(o.beta) / o.max_period), hi), m)
        else:  # the informed initialisation: durabilities t_alpha evenly spaced in the range (steps)
            alpha = -math.log(o.beta) / torch.linspace(float(o.init_trace_range[0]), float(o.init_trace_range[1]), m)
        lo_p, hi_p = (o.min_period, o.max_period) if o.init_period_range is None else o.init_period_range
        omega = 2 * math.pi / torch.linspace(float(lo_p), float(hi_p), c)
        if o.decay_context_product == "hadamard":
            alpha, omega = alpha.unsqueeze(1).repeat(1, c), omega.unsqueeze(0).repeat(m, 1)
        for name, value, mode in (("alpha", alpha, o.decay), ("omega", omega, o.context)):
            if mode == "learned":
                self.register_parameter(name, nn.Parameter(value))
            else:
                self.register_buffer(name, torch.zeros_like(value) if mode == "none" else value)
        self._gamma_cache: tuple | None = None
        self._owner_bounds = False  # who bounds the decay (class docstring)
        self.register_load_state_dict_post_hook(_bound_after_load)

    def initial_state(self, batch_size: int, device=None) -> State:  # complex128 for a float64 FFM
        dtype = torch.complex128 if self.pre.weight.dtype == torch.float64 else torch.complex64
        return torch.zeros(batch_size, self.memory_size, self.context_size, dtype=dtype, device=device)

    def _magnitude_and_angle(self) -> tuple[torch.Tensor, torch.Tensor]:
        alpha, omega = self.alpha, self.omega
        if alpha.dim() == 1:  # outer product form: rows decay, columns rotate
            m, c = alpha.shape[0], omega.shape[0]
            alpha, omega = alpha.unsqueeze(1).expand(m, c), omega.unsqueeze(0).expand(m, c)
        return torch.exp(-alpha), omega

    def gamma(self) -> torch.Tensor:
        """The recurrence's decay exp(-alpha) exp(i omega): [m, c] complex64, |gamma| <= 1."""
        return torch.polar(*self._magnitude_and_angle())

    def gamma_pairs(self) -> torch.Tensor:
        """``gamma`` as (re, im) pairs in real arithmetic, as torch.polar computes them: [m, c, 2]."""
        magnitude, angle = self._magnitude_and_angle()
        return torch.stack((magnitude * torch.cos(angle), magnitude * torch.sin(angle)), dim=-1)

    def _gamma_for_call(self) -> torch.Tensor:
        if torch.is_grad_enabled() or torch.compiler.is_compiling():  # (a compiled graph keys nothing on versions)
            return self.gamma()
        # Acting recomputes nothing while the parameters' versions (bumped by every in-place write) hold.
        key = (self.alpha._version, self.omega._version, self.alpha.data_ptr(), self.omega.data_ptr())
        if self._gamma_cache is None or self._gamma_cache[0] != key:
            self._gamma_cache = (key, self.gamma())
        return self._gamma_cache[1]

    def drop_caches(self) -> None:
        self._gamma_cache = None

    def activation_floats(self) -> int:
        return 4 * self.hidden_size + 6 * self.memory_size * self.context_size  # gates, state, output

    def compile_failure(self) -> str | None:
        if self.context_size == 1:
            return (
                "an FFM of one context column (policy.rnn_hidden_size below 64) fails in inductor on CUDA "
                "(torch 2.11); use policy.rnn_hidden_size >= 64 or train.compile=false"
            )
        return None

    def bounded_by_owner(self, owner: bool = True) -> FFM:
        self._owner_bounds = owner
        return self

    def bound_(self, only_if_out: bool = False) -> None:
        """Clamp alpha in place. Unconditionally (no host read), it moves alpha's version counter, invalidating the
        gamma cache and any pending graph that saved alpha: call it right after a write, not before a forward.
        ``only_if_out``, the standalone per-call bound, reads the device to leave the counter alone when it can."""
        if self.decay_bound:
            with torch.no_grad():
                a = self.alpha
                if not only_if_out or bool(((a < DECAY_MIN) | (a > self.decay_limit)).any()):
                    a.clamp_(DECAY_MIN, self.decay_limit)

    def resolved_aggregator(self, device: torch.device) -> str:
        # Measured (docs/benchmarks.md): the loop wins on a CPU; on a GPU the scan's ~2 log2 T kernels beat the
        # loop's ~2 sqrt(T) from T = 1024 on (a tie at T = 64), and compiled, the associative scan is one kernel.
        if self.aggregator != "auto":
            return self.aggregator
        if device.type != "cuda":
            return "loop"
        return "assoc" if torch.compiler.is_compiling() else "scan"

    def forward(self, x: torch.Tensor, state: State = None) -> tuple[torch.Tensor, State]:
        self._check_input(x)
        T, B, _ = x.shape
        if not self._owner_bounds:
            self.bound_(only_if_out=True)
        y_in, thru, in_gate, out_gate = torch.split(self.pre(x), self.split_sizes, dim=-1)
        u = y_in * torch.sigmoid(in_gate) if self.input_gate else y_in
        S, last = self._aggregate(u, state)
        z = self.mix(S.reshape(T, B, -1))
        z = F.layer_norm(z, z.shape[-1:])
        y = torch.lerp(thru, z, torch.sigmoid(out_gate)) if self.output_gate else z
        return y, last

    def _aggregate(self, u: torch.Tensor, state: State) -> tuple[torch.Tensor, torch.Tensor]:
        """The states S_0..S_{T-1} as (re, im) pairs [T, B, m, c, 2], and the last one, complex."""
        T, B = u.shape[:2]
        method = "step" if T == 1 else self.resolved_aggregator(u.device)
        if method == "assoc":  # real arithmetic throughout: nothing complex for inductor to leave to eager kernels
            if state is None:
                s0 = torch.zeros(B, self.memory_size, self.context_size, 2, dtype=u.dtype, device=u.device)
            else:
                s0 = torch.view_as_real(state)
            S = aggregate_pairs(u, self.gamma_pairs(), s0)
            return S, torch.view_as_complex(S[-1])
        gamma = self._gamma_for_call()
        s0 = self.initial_state(B, u.device) if state is None else state
        if method == "step":  # the acting step
            S = torch.addcmul(torch.complex(u, torch.zeros_like(u)).unsqueeze(-1), s0, gamma)
        elif method == "closed":  # chunks no longer than the horizon the decay bound was set for
            S = aggregate_closed(u, gamma, s0, chunk=self.decay_horizon)
        else:
            S = AGGREGATE[method](u, gamma, s0)
        return torch.view_as_real(S), S[-1]

    def trace_durability(self, beta: float = 0.01) -> torch.Tensor:
        """t_alpha: steps until a trace decays to `beta` of its value, per memory row (inf without decay)."""
        return trace_durability(self.alpha.detach(), beta).cpu()

    def context_periods(self) -> torch.Tensor:
        """t_omega: the period in steps of each context column (inf without context)."""
        return context_period(self.omega.detach()).cpu()

    def extra_repr(self) -> str:
        return (
            f"input_size={self.input_size}, hidden_size={self.hidden_size}, memory_size={self.memory_size}, "
            f"context_size={self.context_size}, aggregator={self.aggregator}"
        )
