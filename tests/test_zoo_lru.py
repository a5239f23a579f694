"""The LRU (pomdp_ffm/seq_models/lru.py) against the paper's equations (Orvieto et al. 2023), written out below as a
float64 step-by-step loop on the model's own weights: POPGym has no LRU to hold it to. The model's window runs
recurrence.linear_scan (chunked or log-depth) and its projections in real arithmetic; the loop here is the recurrence
x_t = Lambda x_{t-1} + gamma (B u_t), y_t = Re(C x_t) + D u_t one step at a time in complex128, inside the block
(encoder, LayerNorm, GELU, GLU, skip) written out too."""

import math

import pytest
import torch
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
