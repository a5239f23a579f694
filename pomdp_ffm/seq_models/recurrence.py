"""The one linear recurrence S_t = a_t * S_{t-1} + x_t of the memories whose state update is diagonal or summed:
FFM's aggregator (gamma constant in time), LRU, S4D's recurrent form, minGRU (a gate per step), linear attention and
fast weights (a = 1). ``linear_scan`` runs it in one of two forms, each in place with the adjoint recurrence as its
backward: ``loop`` (sqrt(T) chunks; the default on a CPU) and ``scan`` (log-depth, fewer kernels; the default on a
GPU); a constant decay's powers come from complex128 logs (``_powers``), never from repeated products, and the
forms never multiply by |a| > 1: no overflow and no chunks at any length (docs/benchmarks.md). ``linear_scan_loop``
is the definition the tests hold them to. FFM adds two forms of its own: the reference's closed form (``closed``:
complex128, defined only while gamma^(-t) fits a float64) and ``assoc`` (one associative scan on (re, im) pairs, in
real arithmetic throughout, which inductor compiles to one kernel; FFM's ``auto`` under torch.compile on a GPU).

Not exact: in complex64 the error grows about linearly with T for decays slower than the window (gamma's complex64
rounding, ~1e-7, raised to the power t; ~T eps / 8 with eps = 2^-23), in every form (``closed`` here takes the
complex64 gamma too); ``assoc`` adds its own, as it forms gamma's powers by repeated complex64 products (~T eps /
14). Measured on FFM against the reference's complex128 function of the same float32 alpha, omega (state-norm
relative, alpha in [1e-8, 0.05], m = 32, c = 4, B = 4; `python -m pomdp_ffm.bench ledger`, one thread, an Intel
Xeon with AVX-512, torch 2.13; the same to two digits with SSE4.1 kernels and, where recorded, on an AMD EPYC), at
T = 64 / 200 / 1100 / 4096:
    loop    8.2e-7 / 2.7e-6 / 1.7e-5 / 6.9e-5
    scan    8.4e-7 / 2.7e-6 / 1.7e-5 / 7.0e-5
    closed  8.3e-7 / 2.7e-6 / 1.7e-5 / 7.0e-5
    assoc   9.1e-7 / 2.9e-6 / 2.1e-5 / 8.7e-5  (1.06-1.26x the loop's)
and for the default init's decays, which forget, an error that does not grow with T (6.3e-7 to 6.8e-7 at 4096,
every form). tests/test_ledger_measurements.py holds these to bounds from the arithmetic, not to the figures: T eps
for a form's own arithmetic, T (delta + eps) against the exact gamma (delta: gamma's complex64 rounding), and
(delta + eps) / alpha_min for the default decays. patches/001, 020."""

from __future__ import annotations

import math

import torch


def _scan_(X: torch.Tensor, gamma: torch.Tensor, s_in: torch.Tensor | None, reverse: bool = False) -> None:
    """In place: X[t] += gamma * X[t-1] (X[-1] = s_in), or X[t] += gamma * X[t+1] (X[T] = s_in) if `reverse`.

    One step per kernel is launch-bound, so the first n*K steps are cut into n chunks of K ~ sqrt(T): a local
    recurrence in every chunk at once (K kernels), the carries between chunks (n), then one broadcast correction
    X[j, k] += gamma^(k+1) carry_j; the < K leftover steps run one by one. (In-place addcmul_ is ~3x faster here
    than an out= variant.)"""
    T = X.shape[0]
    K = T if T <= 16 else math.isqrt(T)
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
    for k in range(K - 2, -1, -1) if reverse else range(1, K):
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
        targets.addcmul_(powers.view(1, K, *([1] * (X.dim() - 1 - gamma.dim())), *gamma.shape), carry.unsqueeze(1))
    if not reverse:
        for t in tail:
            X[t].addcmul_(X[t - 1], gamma)


def _doubling_scan_(X: torch.Tensor, gamma: torch.Tensor, s_in: torch.Tensor | None, reverse: bool = False) -> None:
    """`_scan_`'s recurrence in ceil(log2 T) data-parallel steps: step i adds gamma^(2^i) times the partial sum
    2^i steps back, after which X[t] holds the sum over the last 2^(i+1) inputs."""
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
        # Complete rows (the first k, or last k backwards) carry over; dst holds step i - 2's, with k // 2 complete.
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


def _times(ar, ai, br, bi) -> tuple[torch.Tensor, torch.Tensor]:
    """(ar + i ai)(br + i bi) as (re, im)."""
    return ar * br - ai * bi, ar * bi + ai * br


def _combine(earlier, later):
    """Two adjacent spans of the recurrence, each (its gamma product, its partial sum) as real and imaginary parts,
    as one span: (g_l g_e, g_l s_e + s_l). Pointwise only, as inductor's scan lowering requires."""
    ger, gei, ser, sei = earlier
    glr, gli, slr, sli = later
    sr, si = _times(glr, gli, ser, sei)
    return (*_times(glr, gli, ger, gei), sr + slr, si + sli)


def _scan_pairs(gr, gi, xr, xi, reverse: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """X_t += gamma X_{t-1} (or X_{t+1} if ``reverse``) over dim 0, gamma = gr + i gi broadcast to X = xr + i xi: one
    associative scan over (gamma, X) pairs, which inductor lowers to one Triton kernel on CUDA. On a CPU it runs
    torch's generic form (the tests' reference point; compiled there too, though slowly)."""
    from torch._higher_order_ops.associative_scan import associative_scan

    mode = "pointwise" if xr.is_cuda else "generic"
    g = (gr.expand_as(xr), gi.expand_as(xr))
    _, _, re, im = associative_scan(_combine, (*g, xr, xi), dim=0, reverse=reverse, combine_mode=mode)
    return re, im


class _PairRecurrence(torch.autograd.Function):
    """``_LinearRecurrence`` on (re, im) pairs in a last dim of 2, every step in real arithmetic (inductor leaves
    complex operators to eager kernels): u [T, *batch, m], gamma [m, c, 2], s0 [*batch, m, c, 2] -> S [T, *batch,
    m, c, 2], the layout of ``view_as_real`` of the complex S. The backward is the complex one's, written out:
    C = conj(dL/dS) runs the reverse scan; grad u = sum_c Re C, grad gamma = sum conj(S_{t-1} C_t), grad s0 =
    conj(C_0 gamma)."""

    @staticmethod
    def forward(u: torch.Tensor, gamma: torch.Tensor, s0: torch.Tensor) -> torch.Tensor:
        gr, gi = gamma.unbind(-1)
        xr = u.unsqueeze(-1).expand(*u.shape, gr.shape[-1])
        first_r, first_i = _times(gr, gi, *s0.unbind(-1))
        xr = torch.cat([(xr[0] + first_r).unsqueeze(0), xr[1:]])
        xi = torch.cat([first_i.unsqueeze(0), torch.zeros_like(xr[1:])])
        return torch.stack(_scan_pairs(gr, gi, xr, xi), dim=-1)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, gamma, s0 = inputs
        ctx.save_for_backward(gamma, s0, output)

    @staticmethod
    def backward(ctx, grad_S: torch.Tensor):
        gamma, s0, S = ctx.saved_tensors
        gr, gi = gamma.unbind(-1)
        cr, ci = _scan_pairs(gr, gi, grad_S[..., 0], -grad_S[..., 1], reverse=True)
        grad_u = grad_gamma = grad_s0 = None
        if ctx.needs_input_grad[0]:
            grad_u = cr.sum(-1)
        if ctx.needs_input_grad[1]:
            pr, pi = torch.cat([s0.unsqueeze(0), S[:-1]]).unbind(-1)  # S_{t-1}, with S_{-1} = s0
            over = tuple(range(cr.dim() - 2))  # time and batch
            re, im = _times(pr, pi, cr, ci)
            grad_gamma = torch.stack((re.sum(over), -im.sum(over)), dim=-1)
        if ctx.needs_input_grad[2]:
            re, im = _times(cr[0], ci[0], gr, gi)
            grad_s0 = torch.stack((re, -im), dim=-1)
        return grad_u, grad_gamma, grad_s0


def aggregate_pairs(u: torch.Tensor, gamma: torch.Tensor, s0: torch.Tensor) -> torch.Tensor:
    """The recurrence in real arithmetic (``_PairRecurrence``): u [T, B, m], gamma [m, c, 2], s0 [B, m, c, 2]."""
    return _PairRecurrence.apply(u, gamma, s0.expand(u.shape[1], *gamma.shape).contiguous())


def aggregate_assoc(u: torch.Tensor, gamma: torch.Tensor, s0: torch.Tensor) -> torch.Tensor:
    """``aggregate_pairs`` behind the complex interface of the other aggregators."""
    return torch.view_as_complex(aggregate_pairs(u, torch.view_as_real(gamma), torch.view_as_real(s0)))


def _powers(gamma: torch.Tensor, exponents: torch.Tensor) -> torch.Tensor:
    """gamma^k for each k, as exp(k log gamma) in complex128, then rounded to gamma's dtype: no error beyond that of
    gamma's own rounding raised to the power k (repeated float32 products would add their own phase error)."""
    k = exponents.to(device=gamma.device, dtype=torch.float64).view(-1, *([1] * gamma.dim()))
    powers = torch.exp(k * torch.log(gamma.to(torch.complex128)))
    return powers.to(gamma.dtype) if gamma.is_complex() else powers.real.to(gamma.dtype)


def _scan_gated_(X: torch.Tensor, a: torch.Tensor, s_in: torch.Tensor | None) -> None:
    """``_scan_`` forward with a decay per step, a [T, ...] broadcast against X [T, ...]: X[t] += a[t] X[t-1]. The
    correction of chunk j multiplies the state entering it by the running products of its own decays."""
    T = X.shape[0]
    K = T if T <= 16 else math.isqrt(T)
    n = T // K
    if s_in is not None:
        X[0].addcmul_(s_in, a[0])
    Xc, ac = X[: n * K].unflatten(0, (n, K)), a[: n * K].unflatten(0, (n, K))
    for k in range(1, K):
        Xc[:, k].addcmul_(Xc[:, k - 1], ac[:, k])
    if n > 1:
        products = torch.cumprod(ac[1:], dim=1)  # the decays of chunk j from its start to each of its steps
        carry = torch.empty((n - 1, *X.shape[1:]), dtype=X.dtype, device=X.device)
        carry[0].copy_(Xc[0, K - 1])
        for j in range(1, n - 1):
            torch.addcmul(Xc[j, K - 1], carry[j - 1], products[j - 1, K - 1], out=carry[j])
        Xc[1:].addcmul_(products, carry.unsqueeze(1))
    for t in range(n * K, T):
        X[t].addcmul_(X[t - 1], a[t])


def _doubling_gated_(X: torch.Tensor, a: torch.Tensor, s_in: torch.Tensor | None) -> None:
    """``_doubling_scan_`` forward with a decay per step: level i multiplies by the product of the 2^i decays
    between (formed level by level, in a's dtype)."""
    T = X.shape[0]
    if s_in is not None:
        X[0].addcmul_(s_in, a[0])
    src, dst = X, torch.empty_like(X)
    k = 1
    while k < T:
        lo = 0 if k == 1 else k // 2
        torch.addcmul(src[k:], src[:-k], a[k:], out=dst[k:])
        dst[lo:k].copy_(src[lo:k])
        src, dst = dst, src
        if 2 * k < T:
            a = torch.cat([a[:k], a[k:] * a[:-k]])
        k *= 2
    if src is not X:
        X.copy_(src)


# The fast forms, by name (FFM's ``aggregator``): constant decay, then a decay per step.
_FORMS = {"loop": (_scan_, _scan_gated_), "scan": (_doubling_scan_, _doubling_gated_)}


def _sum_to(grad: torch.Tensor, shape: torch.Size, is_complex: bool) -> torch.Tensor:
    """A gradient reduced to a broadcast input's shape (and to its real part for a real input)."""
    if grad.is_complex() and not is_complex:
        grad = grad.real
    return grad.sum_to_size(shape)


def _summed_dims(a: torch.Tensor, S: torch.Tensor) -> int:
    """How many leading dims of S a constant decay's gradient sums by one dot product: time, and the dims after it
    along which a is broadcast (FFM's batch), so that the rest are a's own."""
    n = 1
    while n < a.dim() and a.shape[n] == 1 and S.shape[n] != 1:
        n += 1
    return n


class _LinearScan(torch.autograd.Function):
    """S_t = a_t * S_{t-1} + x_t, S_{-1} = s0 (s0 at S_0's shape), in place on a fresh tensor by the form ``method``,
    with the adjoint recurrence as its backward, so that a window keeps only its states S (not the forms'
    intermediates). The adjoint A_t = dL/dS_t + conj(a_{t+1}) A_{t+1} (torch's conjugate convention for complex
    gradients) runs on its conjugate C_t = conj(dL/dS_t) + a_{t+1} C_{t+1}, the same scan backwards; then
    dL/dx_t = conj(C_t), dL/da_t = conj(C_t S_{t-1}), dL/ds0 = conj(C_0 a_0), each summed over what was broadcast."""

    @staticmethod
    def forward(a: torch.Tensor, x: torch.Tensor, s0: torch.Tensor, method: str) -> torch.Tensor:
        S = torch.empty((x.shape[0], *s0.shape), dtype=s0.dtype, device=x.device)
        S.copy_(x.expand(S.shape))
        constant, gated = _FORMS[method]
        if a.shape[0] == 1:
            constant(S, a[0], s0)
        else:
            gated(S, a, s0)
        return S

    @staticmethod
    def setup_context(ctx, inputs, output):
        a, x, s0, method = inputs
        ctx.save_for_backward(a, s0, output)
        ctx.x_kind, ctx.forms = (x.shape, x.is_complex()), _FORMS[method]

    @staticmethod
    def backward(ctx, grad_S: torch.Tensor):
        a, s0, S = ctx.saved_tensors
        # (the conjugating copy is the fresh tensor the in-place scan needs, and grad_a becomes a plain vecdot)
        C = torch.conj_physical(grad_S) if grad_S.is_complex() else grad_S.clone(memory_format=torch.contiguous_format)
        constant, gated = ctx.forms
        if a.shape[0] == 1:
            constant(C, a[0], None, reverse=True)
        else:  # C_t takes a_{t+1}: in reversed time, step s's decay is a_{T-s} (step 0's, unused, a_0)
            C = C.flip(0)
            gated(C, torch.cat([a[:1], a[1:].flip(0)]), None)
            C = C.flip(0)
        grad_a = grad_x = grad_s0 = None
        x_shape, x_complex = ctx.x_kind
        if ctx.needs_input_grad[1]:
            if S.is_complex() and not x_complex and x_shape == (*S.shape[:-1], 1):  # (FFM's input, over its columns)
                # sum over the last dim of Re(C), as a matvec over the (re, im) pairs: faster than a strided sum
                c = S.shape[-1]
                pick_re = torch.zeros(2 * c, dtype=S.real.dtype, device=S.device)
                pick_re[::2] = 1
                grad_x = (torch.view_as_real(C).reshape(-1, 2 * c) @ pick_re).view(x_shape)
            else:
                grad_x = _sum_to(C.conj(), x_shape, x_complex).resolve_conj()
        if ctx.needs_input_grad[0]:
            if a.shape[0] == 1:  # sum over time and the broadcast dims of conj(C_t S_{t-1}), with S_{-1} = s0
                n = _summed_dims(a, S)
                grad = torch.linalg.vecdot(s0.unsqueeze(0).flatten(0, n - 1).conj(), C[:1].flatten(0, n - 1), dim=0)
                if S.shape[0] > 1:
                    grad = grad + torch.linalg.vecdot(S[:-1].flatten(0, n - 1).conj(), C[1:].flatten(0, n - 1), dim=0)
                grad_a = _sum_to(grad.conj().resolve_conj(), a.shape[n:], a.is_complex()).reshape(a.shape)
            else:
                prev = torch.cat([s0.unsqueeze(0), S[:-1]])
                grad_a = _sum_to((C * prev).conj().resolve_conj(), a.shape, a.is_complex())
        if ctx.needs_input_grad[2]:
            grad_s0 = (C[0] * a[0]).conj().resolve_conj()
        return grad_a, grad_x, grad_s0, None


def linear_scan(
    a: torch.Tensor, x: torch.Tensor, s0: torch.Tensor | None = None, method: str | None = None
) -> torch.Tensor:
    """S_t = a_t * S_{t-1} + x_t over dim 0 (S_{-1} = s0, None: zeros), real or complex: the recurrence of the
    memories whose state update is diagonal (FFM, LRU, minGRU, S4D's recurrent form) or summed (linear attention
    and fast weights: a = 1). ``a`` has x's number of dims, with time T (a gate per step) or 1 (a constant decay),
    and broadcasts against x; the states S have the broadcast shape, s0 broadcasts to one state. ``method``: "loop"
    (sqrt(T) chunks) or "scan" (log-depth); None: the loop on a CPU, the scan on a GPU (docs/benchmarks.md).
    Either runs in place with the adjoint as its backward (``_LinearScan``)."""
    if a.dim() != x.dim():
        raise ValueError(f"linear_scan: a has {a.dim()} dims and x {x.dim()}; a needs x's (time first, T or 1)")
    dtype = torch.promote_types(a.dtype, x.dtype)
    dtype = dtype if s0 is None else torch.promote_types(dtype, s0.dtype)
    shape = torch.broadcast_shapes(a.shape[1:], x.shape[1:])
    s0 = torch.zeros((), dtype=dtype, device=x.device) if s0 is None else s0.to(dtype)
    method = method or ("scan" if x.is_cuda else "loop")
    return _LinearScan.apply(a, x, s0.expand(shape).contiguous(), method)


def linear_scan_loop(a: torch.Tensor, x: torch.Tensor, s0: torch.Tensor | None = None) -> torch.Tensor:
    """``linear_scan`` one step at a time: the definition the tests hold the scan to, and the acting step's form."""
    s = torch.zeros_like(x[0] * a[0]) if s0 is None else s0
    out = []
    for t in range(x.shape[0]):
        s = a[t if a.shape[0] != 1 else 0] * s + x[t]
        out.append(s)
    return torch.stack(out)


def _ffm_form(method: str):
    def aggregate(u: torch.Tensor, gamma: torch.Tensor, s0: torch.Tensor) -> torch.Tensor:
        """FFM's S_t = gamma S_{t-1} + u_t 1_c^T: u [T, B, m], gamma [m, c], s0 [B, m, c] -> S [T, B, m, c]."""
        return linear_scan(gamma.view(1, 1, *gamma.shape), u.unsqueeze(-1), s0, method)

    return aggregate


def aggregate_closed(u: torch.Tensor, gamma: torch.Tensor, s0: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """The reference's closed form: S_p = g^(p+1) S_-1 + g^(p-t) sum_{j<=p} g^(t-j) x_j, in complex128."""
    out, state = [], s0
    log_g = torch.log(gamma.to(torch.complex128))
    for start in range(0, u.shape[0], chunk):
        x = u[start : start + chunk].to(torch.float64).unsqueeze(-1)
        t = x.shape[0] - 1
        p = torch.arange(t + 1, device=u.device, dtype=torch.float64).view(-1, 1, 1, 1)
        inner = torch.cumsum(torch.exp((t - p) * log_g) * x, dim=0)
        out.append(
            (torch.exp((p - t) * log_g) * inner + torch.exp((p + 1) * log_g) * state.to(torch.complex128)).to(
                gamma.dtype
            )
        )
        state = out[-1][-1]
    return torch.cat(out, dim=0)


aggregate_loop, aggregate_scan = _ffm_form("loop"), _ffm_form("scan")
AGGREGATE = {"loop": aggregate_loop, "scan": aggregate_scan, "assoc": aggregate_assoc, "closed": aggregate_closed}
