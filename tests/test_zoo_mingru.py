"""minGRU (pomdp_ffm/seq_models/mingru.py) against the paper's equations (Feng et al. 2024), written out below as a
float64 step-by-step loop on the model's own weights: POPGym has no minGRU to hold it to. The model's window runs
recurrence.linear_scan (chunked or log-depth) with 1 - z as sigmoid(-k); the loop here is the paper's sequential mode,
h_t = (1 - z_t) h_{t-1} + z_t h~_t, one step at a time.

Then against an established package: minGRU-pytorch 0.2.1 (module minGRU_pytorch/minGRU.py, class minGRU), whose
parallel mode is the paper's log-space scan (appendix B: log h_t from a cumulative sum of log(1 - z) and a
logcumsumexp, h_0 = its prev_hidden) and whose one-step mode is torch.lerp(prev_hidden, g(h~), z), with the model's
weights copied in. What differs, and how the comparison bridges it: the package's candidate is g(Linear_h(x)),
g(a) = a + 1/2 (a >= 0), sigmoid(a) (a < 0), so that h stays positive for its logs; ours is Linear_h(x) itself (the
module docstring says why). The two agree where the package's pre-activation is >= 0, and there only: the
comparison gives the model candidates >= 1/2 + 0.1 on every step of the windows used (a bias set from the data) and
the package their bias less 1/2, so that g is a shift by 1/2 and its gradient 1 on every step. Where a candidate is
below 1/2 the two compute different things; negative states (which ours reach and the package's cannot) are not
compared. The package's Linear has no bias (ours has): it gets one more input, a constant 1, whose weights are our
biases. It is batch first ([B, T, D]) and holds the candidate's rows over the gate's (ours: the gate's first); with
expansion_factor = H / (IN + 1) and no output projection, its width is ours."""

import pytest
import torch
from minGRU_pytorch import minGRU
from zoo_checks import assert_close_scaled, assert_steps_equal_window, outputs_and_grads, per_window

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


def _positive_candidates(model: MinGRU, *windows: torch.Tensor, margin: float = 0.1) -> MinGRU:
    """``model`` with its candidate's bias set so that every candidate on ``windows`` is at least 1/2 + margin: the
    domain where the package's g(a) = a + 1/2 (its pre-activation a = our candidate - 1/2 >= margin)."""
    with torch.no_grad():
        W_h = model.linear.weight[H:].double()
        low = torch.cat(windows).double().flatten(0, -2).matmul(W_h.T).amin(0)  # [H]
        model.linear.bias[H:] = (0.5 + margin - low).to(model.linear.bias.dtype)
    return model


def mingru_pytorch(model: MinGRU):
    """minGRU-pytorch's minGRU in float64 on ``model``'s weights and its run (x [T, B, IN], h_0 [B, H] or () for a
    fresh state) -> (y, h_T); and its one parameter under its own name."""
    pkg = minGRU(IN + 1, expansion_factor=H / (IN + 1), proj_out=False).double()
    theirs = dict(pkg.named_parameters())
    assert set(theirs) == {"to_hidden_and_gate.weight"}  # (its to_out is an Identity)
    assert {k for k, _ in model.named_parameters()} == {"linear.weight", "linear.bias"}
    W = theirs["to_hidden_and_gate.weight"]
    assert W.shape == (2 * H, IN + 1)
    W_z, W_h = model.linear.weight.detach().double().chunk(2)
    b_z, b_h = model.linear.bias.detach().double().chunk(2)
    with torch.no_grad():  # rows: the candidate's, then the gate's; the last column multiplies the constant 1
        W.copy_(torch.cat([torch.cat([W_h, b_h.unsqueeze(1) - 0.5], 1), torch.cat([W_z, b_z.unsqueeze(1)], 1)]))
    # The mapping is exact: ours read back from the package's (b_h - 1/2 + 1/2 is b_h: float32 values in float64).
    (cand, gate), Wd = W.detach().chunk(2), W.detach()
    assert torch.equal(Wd[:H, :IN], W_h) and torch.equal(Wd[H:, :IN], W_z) and torch.equal(gate[:, IN], b_z)
    assert torch.equal(cand[:, IN] + 0.5, b_h)

    def run(x: torch.Tensor, h0):
        x1 = torch.cat([x, torch.ones_like(x[..., :1])], dim=-1).transpose(0, 1)
        prev = None if isinstance(h0, tuple) else h0.unsqueeze(1)
        y, last = pkg(x1, prev_hidden=prev, return_next_prev_hidden=True)
        return y.transpose(0, 1), last.squeeze(1)

    return run, theirs


def _package_grads_as_ours(result: dict) -> dict:
    """The package's weight gradient as ours: linear.weight's (gate rows over candidate rows) and linear.bias's (the
    constant input's column)."""
    out = {k: v for k, v in result.items() if k != "grad to_hidden_and_gate.weight"}
    cand, gate = result["grad to_hidden_and_gate.weight"].chunk(2)
    out["grad linear.weight"] = torch.cat([gate[:, :IN], cand[:, :IN]])
    out["grad linear.bias"] = torch.cat([gate[:, IN], cand[:, IN]])
    return out


def _compare_with_package(dtype: torch.dtype, carried: bool, rtol: float, steps: int | None = None) -> dict:
    """The model (in ``dtype``) against minGRU-pytorch in float64 on the same weights, on the first ``steps`` steps
    of the window (None: all; 1: the package's sequential step): y, h_T and the gradients of x, of the carried-in
    state and of every parameter, from a fresh state or one carried in."""
    x0, x, R_y, R_h = _inputs()
    x, R_y = x[:steps], R_y[:steps]
    model = _positive_candidates(_model(), x0, x).to(dtype)
    run, theirs = mingru_pytorch(model)
    state = ()
    if carried:
        with torch.no_grad():  # a first window's state (the package's run): positive, as its logs need
            state = run(x0, ())[1]
    ours = model if carried else (lambda x, h: model(x, None))
    mine, _ = outputs_and_grads(
        ours, x.to(dtype), state.to(dtype) if carried else (), [R_y, R_h], model.named_parameters()
    )
    exact, _ = outputs_and_grads(run, x, state, [R_y, R_h], theirs)
    exact = _package_grads_as_ours(exact)
    assert len(exact) == 2 + 2 + 1 + carried  # y and h_T, both parameters' gradients, x's and the state's
    return assert_close_scaled(mine, exact, rtol)


@pytest.mark.parametrize("carried", [False, True], ids=["fresh", "carried"])
def test_float64_model_equals_mingru_pytorch(carried):
    # Largest measured (each result's largest difference over its largest magnitude): y 9.6e-15, h_T 1.2e-14, grads
    # 6.2e-13 (the biases'); over conftest.ZOO_CASES up to 1.2e-12 at 64 steps (seed 2) and 4.2e-12 at 160 (long).
    # The package's rounding, not ours: its log-space scan forms log h_t as a sum of log(1 - z) (here down to -100
    # within 64 steps) plus a logcumsumexp, so its relative error grows as eps times that sum, with the window; the
    # package against the float64 equations differs by as much (5.5e-13), the model from them by 9.4e-16.
    _compare_with_package(torch.float64, carried, rtol=per_window(5e-12, T))


@pytest.mark.parametrize("carried", [False, True], ids=["fresh", "carried"])
def test_float32_model_within_rounding_of_mingru_pytorch(carried, zoo_case):
    # Largest measured over conftest.ZOO_CASES: 5.2e-7 at 64 steps (linear.weight's gradient, seed 2, carried), 7.8e-7
    # at 160 (long, carried); the float32 epsilon is 1.2e-7.
    _compare_with_package(torch.float32, carried, rtol=3e-6)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("carried", [False, True], ids=["fresh", "carried"])
def test_acting_step_equals_mingru_pytorchs_step(carried, dtype):
    # One step (T = 1): the package's sequential mode, lerp(prev_hidden, g(h~), z) or g(h~) z from None, with
    # return_next_prev_hidden, against our acting step. Largest measured over conftest.ZOO_CASES' seeds and sizes:
    # 8.0e-16 in float64, 4.3e-7 in float32 (x's gradient).
    _compare_with_package(dtype, carried, rtol=1e-14 if dtype == torch.float64 else 2e-6, steps=1)
