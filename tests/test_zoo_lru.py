"""The LRU (pomdp_ffm/seq_models/lru.py) against the paper's equations (Orvieto et al. 2023), written out below as a
float64 step-by-step loop on the model's own weights: POPGym has no LRU to hold it to. The model's window runs
recurrence.linear_scan (chunked or log-depth) and its projections in real arithmetic; the loop here is the recurrence
x_t = Lambda x_{t-1} + gamma (B u_t), y_t = Re(C x_t) + D u_t one step at a time in complex128, inside the block
(encoder, LayerNorm, GELU, GLU, skip) written out too.

Then against an established package: lru-pytorch 0.1.3 (pip LRU-pytorch, module LRU_pytorch/LRU.py, class LRU), a
per-step loop of the same recurrence (Lambda = |Lambda| (cos theta + i sin theta), |Lambda| = exp(-exp(nu_log)),
theta = exp(theta_log); x_t = Lambda x_{t-1} + diag(exp(gamma_log)) B u_t; y_t = Re(C x_t) + D u_t), with the model's
weights copied into it, inside the block from the model's own encoder, LayerNorm and GLU (copies): the package
implements the LRU only. What differs, and how the comparison bridges it: the package holds B and C as complex
parameters (ours: their real and imaginary parts), D as a full [out, in] matrix (ours: its diagonal, the paper's D,
copied in as diag(D)), writes its outputs into a buffer of the default dtype (run here with float64 the default),
starts only the first row of a [B, T, H] batch from a state given, the others from zero (a carried-in state runs
each row through its [T, H] path), returns no final state (read here from the values it assigns to its ``state``);
its initialisation (D ~ N(0, 1 / H) over a full matrix, max_phase 6.283) is not compared, only the weights copied
in."""

import contextlib
import copy
import math

import pytest
import torch
from LRU_pytorch import LRU as PackageLRU
from torch.nn import functional as F
from zoo_checks import assert_close_scaled, assert_steps_equal_window, outputs_and_grads, per_window

from pomdp_ffm.options import LRUConfig
from pomdp_ffm.seq_models.lru import LRU

T, B, IN, H, N = 64, 8, 12, 32, 24  # N != H: a transposed B or C would not fit
SEED = 0  # added to every generator seed here (conftest.ZOO_CASES sets it, and the sizes above)


pytestmark = pytest.mark.usefixtures("one_thread")


def lru_equations(params: dict, x: torch.Tensor, s0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The paper's LRU block, one step at a time in float64 / complex128. ``params``: the model's named parameters,
    each taken exactly once (the dict must be empty afterwards)."""
    p = {k: v.to(torch.float64) for k, v in params.items()}
    take = p.pop
    W_enc, b_enc = take("encoder.weight"), take("encoder.bias")
    ln_w, ln_b = take("norm.weight"), take("norm.bias")
    W_1, W_2 = take("glu.weight").chunk(2)  # value rows, then gate rows
    b_1, b_2 = take("glu.bias").chunk(2)
    Lambda = torch.exp(-torch.exp(take("nu_log")) + 1j * torch.exp(take("theta_log")))
    gamma = torch.exp(take("gamma_log"))
    B_ = take("B_re") + 1j * take("B_im")  # [N, H]
    C = take("C_re") + 1j * take("C_im")  # [H, N]
    D = take("D")
    assert not p, f"parameters the equations did not use: {sorted(p)}"
    x, s = x.to(torch.float64), s0.to(torch.complex128)
    out = []
    for t in range(x.shape[0]):
        h = x[t] @ W_enc.T + b_enc
        mean = h.mean(-1, keepdim=True)
        var = ((h - mean) ** 2).mean(-1, keepdim=True)
        u = (h - mean) / torch.sqrt(var + 1e-5) * ln_w + ln_b  # LayerNorm, torch's eps
        s = Lambda * s + gamma * (u.to(torch.complex128) @ B_.T)
        y = (s @ C.T).real + D * u
        v = 0.5 * y * (1 + torch.erf(y / math.sqrt(2)))  # GELU
        out.append(h + (v @ W_1.T + b_1) * torch.sigmoid(v @ W_2.T + b_2))
    return torch.stack(out), s


def _model(**opts) -> LRU:
    torch.manual_seed(SEED + 0)
    # The paper's long-range ring (radii near 1, small phases) and its full disk both: the default is the disk.
    return LRU(IN, H, state_size=N, **opts)


def _inputs(dtype):
    g = torch.Generator().manual_seed(SEED + 1)
    x0, x = (torch.randn(T, B, IN, generator=g, dtype=torch.float64) for _ in range(2))
    R_y = torch.randn(T, B, H, generator=g, dtype=torch.float64)
    R_s = torch.randn(B, N, 2, generator=g, dtype=torch.float64)
    return x0, x, R_y, R_s


def _compare(model: LRU, rtol: float) -> dict:
    """The model against the equations on the same weights (the model's dtype for the model, float64 for the
    equations), each result's largest difference relative to its largest magnitude at most ``rtol``."""
    x0, x, R_y, R_s = _inputs(torch.float64)
    params = dict(model.named_parameters())
    zero = torch.zeros(B, N, dtype=torch.complex128)
    with torch.no_grad():  # the carried-in state: the equations' state after a first window
        _, s0 = lru_equations(params, x0, zero)
    dt = model.nu_log.dtype
    mine, _ = outputs_and_grads(model, x.to(dt), s0.to(model.initial_state(1).dtype), [R_y, R_s], params)
    exact, _ = outputs_and_grads(lambda x, s: lru_equations(params, x, s), x, s0, [R_y, R_s], params)
    assert len(exact) == 2 + 14 + 2  # y and the state, the grads of every parameter, x and the state
    return assert_close_scaled(mine, exact, rtol)


@pytest.mark.parametrize("ring", [{}, {"r_min": 0.9, "r_max": 0.999, "max_phase": math.pi / 10}], ids=["disk", "ring"])
def test_float64_model_equals_the_papers_equations(ring):
    # Largest measured (each result's largest difference over its largest magnitude): y 2.9e-16 / 3.7e-16, state
    # 8.6e-16 / 4.6e-16, grads 1.5e-15 / 2.3e-15 (disk / ring).
    _compare(_model(**ring).double(), rtol=1e-14)


@pytest.mark.parametrize("ring", [{}, {"r_min": 0.9, "r_max": 0.999, "max_phase": math.pi / 10}], ids=["disk", "ring"])
def test_float32_model_within_rounding_of_the_equations(ring, zoo_case):
    # Largest measured: y 2.3e-7 / 4.1e-7, state 8.7e-7 / 1.8e-6, grads 3.0e-6 / 5.1e-6 (theta_log's; disk / ring:
    # radii up to 0.999 carry the float32 rounding of Lambda over more steps); the float32 epsilon is 1.2e-7.
    _compare(_model(**ring), rtol=per_window(1e-5, T))


def test_acting_steps_equal_the_window():
    model = _model(r_min=0.9, r_max=0.999, max_phase=math.pi / 10)
    _, x, _, _ = _inputs(torch.float32)
    x = x.float()
    s0 = torch.randn(B, N, dtype=torch.complex64)
    # Largest measured: 1.6e-7 (y), 3.8e-7 (state), relative to the largest magnitude.
    state = assert_steps_equal_window(model, x, s0, of_largest=1e-6)
    assert state.shape == (B, N) and state.dtype == torch.complex64


def test_initialisation_is_the_papers_ring():
    r_min, r_max, max_phase = 0.9, 0.999, math.pi / 10
    torch.manual_seed(SEED + 0)
    H = 512  # (D has H entries)
    model = LRU(IN, H, state_size=512, r_min=r_min, r_max=r_max, max_phase=max_phase).double()
    lam = model.decay().detach()
    radius, phase = lam.abs(), lam.angle()
    assert radius.min() >= r_min - 1e-7 and radius.max() <= r_max + 1e-7
    assert phase.min() >= 0 and phase.max() <= max_phase + 1e-7
    # |Lambda|^2 uniform in [r_min^2, r_max^2] (uniform on the ring's area), phase uniform in [0, max_phase]
    assert abs((radius**2).mean().item() - (r_min**2 + r_max**2) / 2) < 0.01
    assert abs(phase.mean().item() - max_phase / 2) < 0.02 * max_phase
    torch.testing.assert_close(torch.exp(model.gamma_log).detach(), torch.sqrt(1 - radius**2), rtol=1e-5, atol=0)
    # B ~ N(0, 1 / (2 H)), C ~ N(0, 1 / N), D ~ N(0, 1) (each entry, real and imaginary parts alike)
    for p, var in ((model.B_re, 1 / (2 * H)), (model.B_im, 1 / (2 * H)), (model.C_re, 1 / 512), (model.D, 1.0)):
        assert abs(p.detach().var().item() / var - 1) < 0.2
    # the default: the unit disk (r_min = 0, r_max = 1) and phases in [0, 2 pi], every parameter finite
    default = LRU(IN, H, state_size=4096)
    assert all(torch.isfinite(p).all() for p in default.parameters())
    lam = default.decay().detach()
    assert lam.abs().max() <= 1 and lam.abs().min() < 0.05 and lam.angle().abs().max() <= math.pi


def test_options():
    cfg, model = LRUConfig(), LRU(IN, H)
    assert (cfg.state_size, cfg.r_min, cfg.r_max, cfg.max_phase) == (None, 0.0, 1.0, 2 * math.pi)
    assert model.state_size == H and model.initial_state(3).shape == (3, H)
    with pytest.raises(ValueError, match=r"policy.lru.r_min=0.9 must be <= policy.lru.r_max=0.5"):
        LRUConfig(r_min=0.9, r_max=0.5).check_together("policy.lru")
    with pytest.raises(ValueError, match=r"policy.lru.r_max=1.5 must be in \[0, 1\]"):  # the config's rule
        LRU(IN, H, r_min=0.5, r_max=1.5)
    with pytest.raises(ValueError, match=r"policy.lru.r_min=0.9 must be <= policy.lru.r_max=0.5"):
        LRU(IN, H, r_min=0.9, r_max=0.5)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


class _Traced(PackageLRU):
    """The package's LRU, unchanged, keeping every value it assigns to ``self.state``: its forward returns only y,
    and after a sequence's steps it resets the state to zeros."""

    def __setattr__(self, name, value):
        if name == "state":
            self.__dict__.setdefault("trace", []).append(value)
        super().__setattr__(name, value)


# our name -> the package's parameter (and the part of it that is ours)
_TO_PACKAGE = {
    "nu_log": ("nu_log", lambda p: p),
    "theta_log": ("theta_log", lambda p: p),
    "gamma_log": ("gamma_log", lambda p: p),
    "B_re": ("B", torch.real),
    "B_im": ("B", torch.imag),
    "C_re": ("C", torch.real),
    "C_im": ("C", torch.imag),
    "D": ("D", torch.diagonal),
}
_BLOCK = ("encoder", "norm", "glu")  # ours in both runs (the package has no block around its LRU)


def lru_pytorch(model: LRU):
    """lru-pytorch's LRU in float64 on ``model``'s weights, inside float64 copies of the model's encoder, LayerNorm
    and GLU, and its run (x, state or () for a fresh one) -> (the block's output, x_T); and the run's parameters as
    a dict of the package's names (the block's under ours)."""
    ours = dict(model.named_parameters())
    with _default_dtype(torch.float64):  # its B and C complex128, its output buffers float64
        pkg = _Traced(H, H, N)
    block = {name: copy.deepcopy(getattr(model, name)).double() for name in _BLOCK}
    theirs = {f"{m}.{k}": p for m, mod in block.items() for k, p in mod.named_parameters()}
    assert set(theirs) | set(_TO_PACKAGE) == set(ours), sorted((set(theirs) | set(_TO_PACKAGE)) ^ set(ours))
    assert {name for name, _ in _TO_PACKAGE.values()} == {k for k, _ in pkg.named_parameters()}
    o = {k: p.detach().double() for k, p in ours.items()}
    with torch.no_grad():
        for k in ("nu_log", "theta_log", "gamma_log"):  # the same parameterisation: Lambda = exp(-e^nu + i e^theta)
            getattr(pkg, k).copy_(o[k])
        pkg.B.copy_(torch.complex(o["B_re"], o["B_im"]))
        pkg.C.copy_(torch.complex(o["C_re"], o["C_im"]))
        pkg.D.copy_(torch.diag(o["D"]))
    # The mapping is exact: ours read back from the package's, and the package's D has nothing off its diagonal.
    for k, (name, part) in _TO_PACKAGE.items():
        assert torch.equal(part(getattr(pkg, name).detach()), o[k]), k
    assert torch.equal(pkg.D.detach(), torch.diag(o["D"]))
    for k, p in theirs.items():
        assert torch.equal(p.detach(), o[k]), k
    theirs |= dict(pkg.named_parameters())

    def run(x: torch.Tensor, state):
        h = block["encoder"](x)
        u = block["norm"](h)
        pkg.trace = []
        fresh = isinstance(state, tuple)
        with _default_dtype(torch.float64):
            if fresh:  # its own batch loop over [B, T, H], every row from zero
                y = pkg(u.transpose(0, 1)).transpose(0, 1)
            else:  # one row at a time through its [T, H] path, which starts from the state given
                y = torch.stack([pkg(u[:, b], state[b]) for b in range(u.shape[1])], dim=1)
        # The states it assigned: fresh, its start, then per row T steps and a reset; carried, per row its start, T
        # steps and a reset. A row's x_T is the T-th assigned after its row's start.
        steps = x.shape[0]
        final = torch.stack(pkg.trace[steps :: steps + (1 if fresh else 2)])
        assert final.shape == (x.shape[1], N)
        return h + F.glu(block["glu"](F.gelu(y)), dim=-1), final

    return run, theirs


def _package_grads_as_ours(result: dict) -> dict:
    """``outputs_and_grads``' result on the package's parameters, with their gradients mapped to ours (a complex
    parameter's .grad is dL/dRe + i dL/dIm; our D's, the diagonal of the package's D's)."""
    out = {k: v for k, v in result.items() if not k.startswith("grad ") or k[5:] not in ("B", "C", "D")}
    for k, (name, part) in _TO_PACKAGE.items():
        if name in ("B", "C", "D"):
            out[f"grad {k}"] = part(result[f"grad {name}"])
    return out


def _compare_with_package(model: LRU, carried: bool, rtol: float) -> dict:
    """The model (its own dtype) against lru-pytorch in float64 on the same weights: y, x_T and the gradients of x,
    of the carried-in state and of every parameter, from a fresh state or one carried in."""
    x0, x, R_y, R_s = _inputs(torch.float64)
    run, theirs = lru_pytorch(model)
    state = ()
    if carried:
        with torch.no_grad():  # a first window's state (the package's run)
            state = run(x0, torch.zeros(B, N, dtype=torch.complex128))[1]
    dt, ct = model.nu_log.dtype, model.initial_state(1).dtype
    ours = model if carried else (lambda x, s: model(x, None))
    mine, _ = outputs_and_grads(ours, x.to(dt), state.to(ct) if carried else (), [R_y, R_s], model.named_parameters())
    exact, _ = outputs_and_grads(run, x, state, [R_y, R_s], theirs)
    exact = _package_grads_as_ours(exact)
    assert len(exact) == 2 + 14 + 1 + carried  # y and x_T, every parameter's gradient, x's and the state's
    return assert_close_scaled(mine, exact, rtol)


_RING = {"r_min": 0.9, "r_max": 0.999, "max_phase": math.pi / 10}


@pytest.mark.parametrize("carried", [False, True], ids=["fresh", "carried"])
@pytest.mark.parametrize("ring", [{}, _RING], ids=["disk", "ring"])
def test_float64_model_equals_lru_pytorch(ring, carried):
    # Largest measured (each result's largest difference over its largest magnitude): y 4.8e-16, x_T 3.0e-15, grads
    # 4.6e-15 (theta_log's); over conftest.ZOO_CASES' seeds and sizes up to 1.1e-14 (theta_log's, seed 1, disk,
    # fresh), hence the bound of 1e-13.
    _compare_with_package(_model(**ring).double(), carried, rtol=1e-13)


@pytest.mark.parametrize("carried", [False, True], ids=["fresh", "carried"])
@pytest.mark.parametrize("ring", [{}, _RING], ids=["disk", "ring"])
def test_float32_model_within_rounding_of_lru_pytorch(ring, carried, zoo_case):
    # Largest measured over conftest.ZOO_CASES: 7.0e-6 at 64 steps (theta_log's gradient, seed 1, disk, fresh),
    # 1.7e-5 at 160 (x_T, long, disk, carried): 0.35 of the bound either; the float32 epsilon is 1.2e-7.
    _compare_with_package(_model(**ring), carried, rtol=per_window(2e-5, T))
