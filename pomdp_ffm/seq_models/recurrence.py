"""FFM's aggregator S_t = gamma * S_{t-1} + u_t (pomdp_ffm/seq_models/ffm.py), evaluated over a whole sequence.

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
  |gamma|^(-t) fits a float64: the decay bound keeps alpha <= ffm.reference_decay_limit(decay_horizon) (the
  reference's ``max_len``, 1024 steps), and the sequence is cut into chunks of ``decay_horizon`` steps.
"""
from __future__ import annotations

import math

import torch


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

    Shapes: u [T, *batch, m], s0 [*batch, m, c], gamma [m, c]."""

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
            # sum over time and batch of A_t * conj(S_{t-1}) = conj(C_t * S_{t-1}), with S_{-1} = s0: one dot
            # product over (time, batch)
            grad_gamma = torch.linalg.vecdot(s0.flatten(0, -3).conj(), C[0].flatten(0, -3), dim=0)
            if S.shape[0] > 1:
                grad_gamma = grad_gamma + torch.linalg.vecdot(S[:-1].flatten(0, -3).conj(),
                                                              C[1:].flatten(0, -3), dim=0)
            grad_gamma = grad_gamma.conj().resolve_conj()
        if ctx.needs_input_grad[2]:
            grad_s0 = (C[0] * gamma).conj().resolve_conj()
        return grad_u, grad_gamma, grad_s0, None


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


AGGREGATE = {"loop": aggregate_loop, "scan": aggregate_scan, "closed": aggregate_closed}
