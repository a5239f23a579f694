"""minGRU (pomdp_ffm/seq_models/mingru.py) against the paper's equations (Feng et al. 2024), written out below as a
float64 step-by-step loop on the model's own weights: POPGym has no minGRU to hold it to. The model's window runs
recurrence.linear_scan (chunked or log-depth) with 1 - z as sigmoid(-k); the loop here is the paper's sequential mode,
h_t = (1 - z_t) h_{t-1} + z_t h~_t, one step at a time."""

import pytest
import torch
from zoo_checks import assert_close_scaled, assert_steps_equal_window, outputs_and_grads

from pomdp_ffm import catalog
from pomdp_ffm.seq_models.mingru import MinGRU

T, B, IN, H = 64, 8, 12, 32
SEED = 0  # added to every generator seed here (conftest.ZOO_CASES sets it, and the sizes above)


pytestmark = pytest.mark.usefixtures("one_thread")


def mingru_equations(params: dict, x: torch.Tensor, h0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The paper's minGRU, one step at a time in float64. ``params``: the model's named parameters, each taken
    exactly once (the dict must be empty afterwards); its one Linear holds Linear_z's rows over Linear_h's."""
    p = {k: v.to(torch.float64) for k, v in params.items()}
    W_z, W_h = p.pop("linear.weight").chunk(2)
    b_z, b_h = p.pop("linear.bias").chunk(2)
    assert not p, f"parameters the equations did not use: {sorted(p)}"
    x, h = x.to(torch.float64), h0.to(torch.float64)
    out = []
    for t in range(x.shape[0]):
        z = torch.sigmoid(x[t] @ W_z.T + b_z)
        h_tilde = x[t] @ W_h.T + b_h
        h = (1 - z) * h + z * h_tilde
        out.append(h)
    return torch.stack(out), h


def _model() -> MinGRU:
    torch.manual_seed(SEED + 0)
    return MinGRU(IN, H)


def _inputs():
    g = torch.Generator().manual_seed(SEED + 1)
    # x scaled so that some gates sit near 0 and 1 (|k| up to ~5): long memories and overwrites both
    x0, x = (3 * torch.randn(T, B, IN, generator=g, dtype=torch.float64) for _ in range(2))
    R_y = torch.randn(T, B, H, generator=g, dtype=torch.float64)
    R_h = torch.randn(B, H, generator=g, dtype=torch.float64)
    return x0, x, R_y, R_h


def _compare(model: MinGRU, rtol: float) -> dict:
    """The model against the equations on the same weights (the model's dtype for the model, float64 for the
    equations), each result's largest difference relative to its largest magnitude at most ``rtol``."""
    x0, x, R_y, R_h = _inputs()
    params = dict(model.named_parameters())
    with torch.no_grad():  # the carried-in state: the equations' state after a first window
        _, h0 = mingru_equations(params, x0, torch.zeros(B, H, dtype=torch.float64))
    dt = model.linear.weight.dtype
    mine, _ = outputs_and_grads(model, x.to(dt), h0.to(dt), [R_y, R_h], params)
    exact, _ = outputs_and_grads(lambda x, h: mingru_equations(params, x, h), x, h0, [R_y, R_h], params)
    assert len(exact) == 2 + 2 + 2  # y and the state, the grads of every parameter, x and the state
    return assert_close_scaled(mine, exact, rtol)


def test_float64_model_equals_the_papers_equations():
    # Largest measured (each result's largest difference over its largest magnitude): y 2.6e-16, state 2.2e-16,
    # grads 9.8e-16.
    _compare(_model().double(), rtol=1e-14)


def test_float32_model_within_rounding_of_the_equations(zoo_case):
    # Largest measured: y 1.6e-7, state 1.3e-7, grads 3.3e-7 (x's); the float32 epsilon is 1.2e-7.
    _compare(_model(), rtol=1e-6)


def test_acting_steps_equal_the_window():
    model = _model()
    _, x, _, _ = _inputs()
    x = x.float()
    h0 = torch.randn(B, H)
    # Largest measured: 1.1e-7 (y), 5.8e-8 (state), relative to the largest magnitude.
    state = assert_steps_equal_window(model, x, h0, of_largest=1e-6)
    assert state.shape == (B, H) and state.dtype == torch.float32


def test_state():
    model = _model()
    assert catalog.memories()["mingru"].options is None and model.initial_state(3).shape == (3, H)
    y, h = model(torch.randn(5, 3, IN))
    assert y.shape == (5, 3, H) and torch.equal(h, y[-1])
