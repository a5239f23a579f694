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

The reference evaluates the aggregator with a float64 closed form that multiplies by gamma^(-t); it
overflows unless decay is bounded and sequences are chunked. Here the default aggregators never multiply
by |gamma| > 1, so any length is exact in complex64:

* ``loop`` (what ``auto`` picks on a CPU): the recurrence itself, inside a custom autograd Function whose backward is
  the adjoint recurrence (the gradient of S_t = g S_{t-1} + u_t is the reversed recurrence with conj(g)),
  stepped in sqrt(T) chunks to cut kernel launches.
* ``scan`` (what ``auto`` picks on a GPU): the same Function with a log-depth (Hillis-Steele) scan over
  powers gamma^(2^k) in place of the chunked loop: ~2 log2 T kernels but O(T log T) work, which pays where
  kernel launches, not arithmetic, bound the time (docs/benchmarks.md has the measurements).
* ``closed``: the reference's closed form in complex128, kept for comparison. It is exact only while
  |gamma|^(-t) fits a float64: the decay bound keeps alpha <= reference_decay_limit(decay_horizon) (the
  reference's ``max_len``, 1024 steps), and the sequence is cut into chunks of ``decay_horizon`` steps.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from .base import SeqModel, State

AGGREGATORS = ("auto", "loop", "scan", "closed")
PARAM_MODES = ("learned", "fixed", "none")
# How gamma's [m, c] entries are parametrised: "outer" is the paper's outer product of m decay rates (rows) and c
# context frequencies (columns); "hadamard" (the HP ablation) learns a decay and a frequency per entry.
DECAY_CONTEXT_PRODUCTS = ("outer", "hadamard")
# Option names of earlier versions -> current ones (patches/104-ffm-option-names.md): passing an old name
# fails with a message naming the new one.
RENAMED_OPTIONS = {"gamma": "decay_context_product", "max_len": "decay_horizon"}

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


def _scan_(X: torch.Tensor, gamma: torch.Tensor, s_in: torch.Tensor | None, reverse: bool = False) -> None:
    """In place: X[t] <- X[t] + gamma * X[t-1] (X[-1] = s_in), or X[t] <- X[t] + gamma * X[t+1] (X[T] = s_in)
    if `reverse`.

    Stepping one time index per kernel is launch-bound for small batches, so the first n*K steps are cut into
    n chunks of K ~ sqrt(T): a local recurrence inside every chunk at once (K kernels), the carries between
    chunks (n kernels), then one broadcast correction X[j, k] += gamma^(k+1) * carry_j; the < K leftover
    steps run one by one. Every factor has |gamma^k| <= 1, so nothing overflows at any length.
    (In-place complex addcmul_ is ~3x faster here than an out= variant that also reads the inputs.)
    """
    T = X.shape[0]
    K = _chunk(T)
    n = T // K
    tail = range(n * K, T)
    if reverse:  # the leftover steps sit at the end: they come first backwards in time
        for t in reversed(tail):
            nxt = X[t + 1] if t + 1 < T else s_in
            if nxt is not None:
                X[t].addcmul_(nxt, gamma)
        if tail:
            s_in = X[n * K]
    Xc = X[: n * K].unflatten(0, (n, K))
    first, edge = (K - 1, n - 1) if reverse else (0, 0)
    if s_in is not None:
        Xc[edge, first].addcmul_(s_in, gamma)
    for k in (range(K - 2, -1, -1) if reverse else range(1, K)):
        Xc[:, k].addcmul_(Xc[:, k + 1] if reverse else Xc[:, k - 1], gamma)
    if n > 1:
        steps = torch.arange(1, K + 1, device=X.device)
        powers = _powers(gamma, steps.flip(0) if reverse else steps)  # gamma^(distance from the chunk's edge)
        gK = powers[0] if reverse else powers[-1]
        # carry[j]: the true state entering chunk j, for every chunk but the edge one (already exact)
        carry = torch.empty((n - 1, *X.shape[1:]), dtype=X.dtype, device=X.device)
        if reverse:
            carry[n - 2].copy_(Xc[n - 1, 0])
            for j in range(n - 3, -1, -1):
                torch.addcmul(Xc[j + 1, 0], carry[j + 1], gK, out=carry[j])
            targets = Xc[: n - 1]
        else:
            carry[0].copy_(Xc[0, K - 1])
            for j in range(1, n - 1):
                torch.addcmul(Xc[j, K - 1], carry[j - 1], gK, out=carry[j])
            targets = Xc[1:]
        targets.addcmul_(powers.view(1, K, *([1] * (X.dim() - 1 - gamma.dim())), *gamma.shape),
                         carry.unsqueeze(1))
    if not reverse:
        for t in tail:
            X[t].addcmul_(X[t - 1], gamma)


def _doubling_scan_(X: torch.Tensor, gamma: torch.Tensor, s_in: torch.Tensor | None,
                    reverse: bool = False) -> None:
    """The same recurrence as `_scan_`, in ceil(log2 T) data-parallel steps (Hillis-Steele): after step i,
    X[t] holds the sum over the last 2^(i+1) inputs, and step i adds gamma^(2^i) times the partial sum
    2^i steps back. O(T log T) work but only ~2 log2 T kernels: on a GPU the per-step loop is
    launch-bound, this is not. Every factor gamma^(2^i) has modulus <= 1 and is computed exactly."""
    T = X.shape[0]
    if s_in is not None:
        X[T - 1 if reverse else 0].addcmul_(s_in, gamma)
    if T == 1:
        return
    levels = (T - 1).bit_length()
    powers = _powers(gamma, 2 ** torch.arange(levels, device=gamma.device))
    src, dst = X, torch.empty_like(X)
    for i in range(levels):
        k = 1 << i
        # Rows already complete (the first k forwards, the last k backwards) carry over unchanged; the
        # destination holds the output of step i - 2, in which the first k // 2 of them were complete.
        lo = 0 if i == 0 else k // 2
        done = slice(T - k, T - lo) if reverse else slice(lo, k)
        if reverse:
            torch.addcmul(src[:-k], src[k:], powers[i], out=dst[:-k])
        else:
            torch.addcmul(src[k:], src[:-k], powers[i], out=dst[k:])
        dst[done].copy_(src[done])
        src, dst = dst, src
    if src is not X:
        X.copy_(src)


def _chunk(T: int) -> int:
    return T if T <= 16 else math.isqrt(T)


class _LinearRecurrence(torch.autograd.Function):
    """S_t = gamma * S_{t-1} + u_t (u real, broadcast over the c context columns), S_{-1} = s0.

    Shapes: u [T, *batch, m], s0 [*batch, m, c], gamma [m, c], or [*g, m, c] with g broadcasting against
    batch (one gamma per leading group, e.g. per seed: [S, 1, m, c] against batch = (S, B)).

    Under ``torch.func.vmap`` (several seeds' memories evaluated together, pomdp_ffm/stacked.py) the mapped
    dimension becomes the first batch dimension of one call, with gamma given a matching leading dimension:
    the same recurrence, one set of kernels for all seeds."""

    @staticmethod
    def forward(u: torch.Tensor, gamma: torch.Tensor, s0: torch.Tensor, method: str = "loop") -> torch.Tensor:
        # real inputs, broadcast over the context columns (the cheapest way to build it, measured)
        S = torch.complex(u, torch.zeros_like(u)).unsqueeze(-1).expand(*u.shape, gamma.shape[-1]).contiguous()
        _RUN[method](S, gamma, s0)
        return S

    @staticmethod
    def setup_context(ctx, inputs, output):
        u, gamma, s0, method = inputs
        ctx.save_for_backward(gamma, s0, output)
        ctx.run_ = _RUN[method]

    @staticmethod
    def backward(ctx, grad_S: torch.Tensor):
        gamma, s0, S = ctx.saved_tensors
        c = grad_S.shape[-1]
        # The adjoint A_t = dL/dS_t + conj(gamma) A_{t+1} is the same recurrence run backwards in time. It is
        # run on its conjugate, C_t = conj(A_t) = conj(dL/dS_t) + gamma C_{t+1}: the copy that conjugates the
        # incoming gradient replaces the clone the in-place scan needs anyway, and then grad_gamma below is a
        # plain dot product of S and C (vecdot of a lazily conjugated S), not one that materialises conj(S).
        C = torch.conj_physical(grad_S)  # always a fresh tensor: the scan below works in place
        ctx.run_(C, gamma, None, reverse=True)
        grad_u = grad_gamma = grad_s0 = None
        if ctx.needs_input_grad[0]:
            # sum over the context columns of Re(A) = Re(C), as a matrix-vector product over the interleaved
            # (re, im) pairs: faster than a strided reduction
            pick_re = torch.zeros(2 * c, dtype=S.real.dtype, device=S.device)
            pick_re[::2] = 1
            grad_u = (torch.view_as_real(C).reshape(-1, 2 * c) @ pick_re).view(grad_S.shape[:-1])
        if ctx.needs_input_grad[1]:
            # sum over time and batch of A_t * conj(S_{t-1}) = conj(C_t * S_{t-1}), with S_{-1} = s0
            if gamma.dim() == 2:  # one gamma for the whole batch: one dot product over (time, batch)
                grad_gamma = torch.linalg.vecdot(s0.flatten(0, -3).conj(), C[0].flatten(0, -3), dim=0)
                if S.shape[0] > 1:
                    grad_gamma = grad_gamma + torch.linalg.vecdot(S[:-1].flatten(0, -3).conj(),
                                                                  C[1:].flatten(0, -3), dim=0)
            else:  # one gamma per group: sum over time, then over the batch dimensions gamma broadcasts along
                grad_gamma = s0 * C[0]  # = conj(conj(s0) * A_0), conjugated back below
                if S.shape[0] > 1:
                    grad_gamma = grad_gamma + torch.linalg.vecdot(S[:-1].conj(), C[1:], dim=0)
                grad_gamma = grad_gamma.sum_to_size(gamma.shape)
            grad_gamma = grad_gamma.conj().resolve_conj()
        if ctx.needs_input_grad[2]:
            grad_s0 = (C[0] * gamma).conj().resolve_conj()
        return grad_u, grad_gamma, grad_s0, None

    @staticmethod
    def vmap(info, in_dims, u, gamma, s0, method):
        """The mapped dimension (size info.batch_size) as the first batch dimension of one call."""
        n = info.batch_size
        u_dim, g_dim, s_dim, _ = in_dims
        u = u.unsqueeze(1).expand(u.shape[0], n, *u.shape[1:]) if u_dim is None else u.movedim(u_dim, 1)
        batch = u.shape[1:-1]  # (n, *the call's own batch)
        s0 = s0.expand(n, *s0.shape) if s_dim is None else s0.movedim(s_dim, 0)
        if g_dim is not None:
            gamma = gamma.movedim(g_dim, 0)  # [n, *g, m, c]: line g up with the call's own batch dimensions
            gamma = gamma.reshape(n, *([1] * (len(batch) + 2 - gamma.dim())), *gamma.shape[1:])
        return _LinearRecurrence.apply(u, gamma, s0.contiguous(), method), 1


_RUN = {"loop": _scan_, "scan": _doubling_scan_}


def _recurrence(u: torch.Tensor, gamma: torch.Tensor, s0: torch.Tensor, method: str) -> torch.Tensor:
    return _LinearRecurrence.apply(u, gamma, s0.expand(u.shape[1], *gamma.shape).contiguous(), method)


def aggregate_loop(u: torch.Tensor, gamma: torch.Tensor, s0: torch.Tensor) -> torch.Tensor:
    return _recurrence(u, gamma, s0, "loop")


def _powers(gamma: torch.Tensor, exponents: torch.Tensor) -> torch.Tensor:
    """gamma^k for each k, as exp(k log gamma) in complex128: exact to the last bit of complex64 even for
    large k, where repeated float32 multiplication would accumulate phase error."""
    k = exponents.to(device=gamma.device, dtype=torch.float64).view(-1, *([1] * gamma.dim()))
    return torch.exp(k * torch.log(gamma.to(torch.complex128))).to(gamma.dtype)


def aggregate_scan(u: torch.Tensor, gamma: torch.Tensor, s0: torch.Tensor) -> torch.Tensor:
    return _recurrence(u, gamma, s0, "scan")


def aggregate_closed(u: torch.Tensor, gamma: torch.Tensor, s0: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """The reference's closed form: S_p = g^(p+1) S_-1 + g^(p-t) sum_{j<=p} g^(t-j) x_j, in complex128."""
    out, state = [], s0
    log_g = torch.log(gamma.to(torch.complex128))
    for start in range(0, u.shape[0], chunk):
        x = u[start:start + chunk].to(torch.float64).unsqueeze(-1)
        n = x.shape[0]
        t = n - 1
        p = torch.arange(n, device=u.device, dtype=torch.float64).view(n, 1, 1, 1)
        inner = torch.cumsum(torch.exp((t - p) * log_g) * x, dim=0)
        S = torch.exp((p - t) * log_g) * inner + torch.exp((p + 1) * log_g) * state.to(torch.complex128)
        S = S.to(gamma.dtype)
        out.append(S)
        state = S[-1]
    return torch.cat(out, dim=0)


_AGGREGATE = {"loop": aggregate_loop, "scan": aggregate_scan, "closed": aggregate_closed}


def _bound_after_load(module: "FFM", incompatible_keys) -> None:
    # load_state_dict writes alpha: bound it now, in either mode (the reference's next call would).
    module.bound_decay_()


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

    * standalone (the default, ``external_decay_bound = False``): ``forward`` clamps when a value is out of range.
      The check reads a device value, i.e. one host synchronisation per call.
    * owner-managed (``external_decay_bound = True``, set by ``RecurrentAgent`` on its memories): ``forward``
      does not look; the owner calls ``bound_decay_()`` (an unconditional in-place clamp, no synchronisation)
      after every write it makes, before the next call. ``load_state_dict`` clamps in both modes (a post-hook).
      A hand-made write to a managed FFM's alpha is bounded only at the owner's next ``bound_decay_()``
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
        # False where the module is only a template whose tensors are passed in at each call (torch.func's
        # functional_call, pomdp_ffm/stacked.py): a cache keyed on its own tensors would not apply to them.
        self.cache_gamma = True
        # Who bounds the decay (class docstring): False = forward() does, True = the owner calls bound_decay_().
        self.external_decay_bound = False
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
        if torch.is_grad_enabled() or not self.cache_gamma:
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

    def bound_decay_(self) -> None:
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
        if not self.external_decay_bound:
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
        return _AGGREGATE[method](u, gamma, s0)

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
