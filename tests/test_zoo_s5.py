"""S5 (pomdp_ffm/seq_models/s5.py) against s5-pytorch 0.2.1's ``S5Block`` (s5/s5_model.py) on the model's weights:
the package keeps all P eigenvalues where the model keeps P / 2 (conjugate symmetry), so it runs on the conjugate-
paired weights, Lambda, B~, C~ and log_step each followed by their conjugates (copies), and on a carried-in state
followed by its conjugate; its output Re(C~ x) over the pairs is the model's 2 Re(C~ x). The package's block has no
input embedding: the model's Linear is applied here before it. The package's ``as_complex`` casts B~ to complex64
whatever its input; it is replaced here, for the package's run only, by the cast to the input's own complex dtype.
Then acting one step at a time against the window, the initialisation (HiPPO-N as the package computes it), the
authors' clip_eigs option and the options."""

from types import SimpleNamespace
from unittest import mock

import pytest
import s5
import s5.s5_model
import torch
from torch.nn import functional as F
from zoo_checks import assert_close_scaled, assert_steps_equal_window, option_defaults, outputs_and_grads

from pomdp_ffm.options import S5Config
from pomdp_ffm.seq_models.s5 import S5

T, B, IN, H = 64, 8, 12, 32
SEED = 0  # added to every generator seed here (conftest.ZOO_CASES sets it, and the sizes above)
# The defaults (P = hidden_size, 8 blocks) and the package's one block with P != H (a transposed B~ or C~ would not
# fit), whose eigenvalues reach 180i: the options and the float32 bound of each (largest measured over
# conftest.ZOO_CASES, each result's largest difference over its largest magnitude: 4.6e-6, the long case's gradient of
# Lambda_re; 1.3e-5, seed 2's of log_step, a fast mode's phase Lambda_im Delta rounded in float32 over the window, as
# the package's own float32 run rounds it; the float32 epsilon is 1.2e-7).
SETTINGS = {"default": ({}, 1.5e-5), "one-block": ({"state_size": 24, "blocks": 1}, 4e-5)}

pytestmark = pytest.mark.usefixtures("one_thread")

# The model's parameters the package's block holds under the same names.
SHARED = ("attn_norm.weight", "attn_norm.bias", "ff_norm.weight", "ff_norm.bias", "ff_enc.weight", "ff_dec.weight")


def _model(**opts) -> S5:
    torch.manual_seed(SEED + 0)
    return S5(IN, H, **opts)


def _inputs(P: int):
    g = torch.Generator().manual_seed(SEED + 1)
    x0, x = (torch.randn(T, B, IN, generator=g, dtype=torch.float64) for _ in range(2))
    R_y = torch.randn(T, B, H, generator=g, dtype=torch.float64)
    R_s = torch.randn(B, P // 2, 2, generator=g, dtype=torch.float64)
    return x0, x, R_y, R_s


def _own_complex_dtype(t: torch.Tensor, dtype=None) -> torch.Tensor:
    return torch.complex(t[..., 0], t[..., 1])


def reference(model: S5):
    """The package's S5Block (P = the model's state_size, its blocks) and a run of it, in float64, on leaves holding
    the model's parameters under the model's names, each mapped to the package's parameter it fills."""
    P = model.state_size
    block = s5.S5Block(H, P, bidir=False, block_count=model.blocks)
    ours = {name: p.detach().to(torch.float64).requires_grad_() for name, p in model.named_parameters()}

    def weights() -> tuple[dict, torch.Tensor, torch.Tensor]:
        p = dict(ours)
        take = p.pop
        pair = lambda z, dim: torch.cat([z, z.conj()], dim=dim)  # noqa: E731
        theirs = {name: take(name) for name in SHARED}
        theirs["s5.seq.Lambda"] = pair(torch.complex(take("Lambda_re"), take("Lambda_im")), 0)
        theirs["s5.seq.B"] = torch.view_as_real(pair(torch.complex(take("B_re"), take("B_im")), 0))
        theirs["s5.seq.C"] = pair(torch.complex(take("C_re"), take("C_im")), 1)
        theirs["s5.seq.D"] = take("D")
        theirs["s5.seq.log_step"] = take("log_step").repeat(2)
        W_in, b_in = take("encoder.weight"), take("encoder.bias")
        assert not p, f"parameters the package's block did not take: {sorted(p)}"
        assert set(theirs) == {name for name, _ in block.named_parameters()}
        return theirs, W_in, b_in

    def run(x: torch.Tensor, state: torch.Tensor):
        theirs, W_in, b_in = weights()
        h = F.linear(x, W_in, b_in).transpose(0, 1)  # the package's block is batch-first
        with mock.patch.object(s5.s5_model, "as_complex", _own_complex_dtype):
            y, final = torch.func.functional_call(
                block, theirs, (h,), {"state": torch.cat([state, state.conj()], dim=-1), "return_state": True}
            )
        # the package's second half of the state stays the conjugate of its first
        torch.testing.assert_close(final[:, P // 2 :], final[:, : P // 2].conj(), rtol=0, atol=1e-12)
        return y.transpose(0, 1), final[:, : P // 2]

    return run, ours


def _compare(model: S5, dtype: torch.dtype, rtol: float) -> dict:
    """The model in ``dtype`` against the package in float64 on the same weights: y, the final state and the
    gradients of x, the carried-in state and every parameter of a loss on y and the final state."""
    x0, x, R_y, R_s = _inputs(model.state_size)
    model = model.to(dtype)
    run, ours = reference(model)
    with torch.no_grad():  # the carried-in state: the package's after a first window
        _, s0 = run(x0, torch.zeros(B, model.state_size // 2, dtype=torch.complex128))
    mine, _ = outputs_and_grads(
        model, x.to(dtype), s0.to(model.initial_state(1).dtype), [R_y, R_s], model.named_parameters()
    )
    exact, _ = outputs_and_grads(run, x, s0, [R_y, R_s], ours)
    assert len(exact) == 2 + 16 + 2  # y and the state, the grads of every parameter, x and the state
    return assert_close_scaled(mine, exact, rtol)


@pytest.mark.parametrize("setting", SETTINGS, ids=SETTINGS)
def test_float64_model_equals_the_package(setting):
    # Largest measured (each result's largest difference over its largest magnitude): 5.6e-15 (default, B_im's
    # gradient), 1.9e-15 (one block).
    _compare(_model(**SETTINGS[setting][0]), torch.float64, rtol=1e-13)


@pytest.mark.parametrize("setting", SETTINGS, ids=SETTINGS)
def test_float32_model_within_rounding_of_the_package(setting, zoo_case):
    options, bound = SETTINGS[setting]  # (the bounds' measurements: SETTINGS)
    _compare(_model(**options), torch.float32, rtol=bound)


@pytest.mark.parametrize("setting", SETTINGS, ids=SETTINGS)
@pytest.mark.parametrize("dtype, bound", [(torch.float64, 1e-14), (torch.float32, 1e-6)], ids=["float64", "float32"])
def test_acting_steps_equal_the_window(setting, dtype, bound):
    # From a fresh state and from one carried in (a first window's). Largest measured, of the largest entry: 6.6e-16
    # (float64), 3.3e-7 (float32).
    model = _model(**SETTINGS[setting][0]).to(dtype)
    x0, x, _, _ = _inputs(model.state_size)
    x0, x = x0.to(dtype), x.to(dtype)
    for state in (model.initial_state(B), model(x0, None)[1]):
        s = assert_steps_equal_window(model, x, state, of_largest=bound)
        assert s.shape == (B, model.state_size // 2) and s.dtype == model.initial_state(1).dtype


def test_initialisation_is_hippo_n_in_blocks():
    from s5.init import make_DPLR_HiPPO

    torch.manual_seed(SEED + 0)
    P, J = 256, 4
    model = S5(IN, 64, state_size=P, blocks=J)
    # Lambda: each block's HiPPO-N eigenvalues with negative imaginary part, as the package computes them (float64,
    # numpy), to the float32 parameters' rounding
    Lambda_pkg = make_DPLR_HiPPO(P // J)[0]
    want = torch.as_tensor(Lambda_pkg[: P // J // 2]).repeat(J)
    torch.testing.assert_close(model.Lambda_re.detach(), want.real.float(), rtol=0, atol=0)
    torch.testing.assert_close(model.Lambda_im.detach(), want.imag.float(), rtol=2**-24, atol=0)
    assert (model.Lambda_im < 0).all()
    # log steps uniform in [log dt_min, log dt_max]
    step = model.log_step.detach().exp()
    assert step.min() >= 0.001 and step.max() <= 0.1
    # D ~ N(0, 1) (the authors'); B~ = V* B, C~ = C V with V's columns of unit norm: E|B~|^2 = var(B) = 1 / P, and
    # E|C~|^2 = 2 / P (C's real and imaginary parts each of variance 1 / P)
    assert abs(model.D.var().item() - 1) < 0.5
    for re, im, mean_square in ((model.B_re, model.B_im, 1 / P), (model.C_re, model.C_im, 2 / P)):
        assert abs((re.detach() ** 2 + im.detach() ** 2).mean().item() / mean_square - 1) < 0.1


@pytest.mark.parametrize("setting", SETTINGS, ids=SETTINGS)
def test_float32_discretisation_is_within_rounding_of_each_entry(setting):
    # Lambda_bar - 1 formed without cancellation: Lambda_bar and every entry of B_bar in float32 within 1e-6 of
    # its own modulus of the float64 ones from the same weights, at the smallest step (exp(z) - 1 in complex64, as
    # the package forms it, is off by ~eps / |z|: 7e-5 here). Largest measured: 5.8e-8 (Lambda_bar), 2.0e-7 (B_bar).
    model = _model(**SETTINGS[setting][0], dt_min=0.001, dt_max=0.001)
    half = model.state_size // 2
    with torch.no_grad():
        Lambda_bar, B_bar = model.discretised()
        exact_Lambda_bar, exact_B_bar = model.double().discretised()
    pairs = (
        (Lambda_bar, exact_Lambda_bar),
        (torch.complex(*B_bar.split(half)), torch.complex(*exact_B_bar.split(half))),
    )
    for got, want in pairs:
        assert ((got.to(want.dtype) - want).abs() <= 1e-6 * want.abs()).all()


def test_clip_eigs_clips_the_real_parts():
    # The authors' clip_eigs (on by default): Lambda_re used as min(Lambda_re, -1e-4), no gradient through a clipped
    # entry.
    clipped, free = _model().double(), _model(clip_eigs=False).double()
    with torch.no_grad():
        clipped.Lambda_re[:3] = torch.tensor([0.5, 0.0, -1e-5], dtype=torch.float64)
        free.Lambda_re.copy_(clipped.Lambda_re.clamp(max=-1e-4))
    x = torch.randn(T, B, IN, dtype=torch.float64)
    y, _ = clipped(x)
    torch.testing.assert_close(y, free(x)[0], rtol=0, atol=0)
    y.sum().backward()
    assert torch.equal(clipped.Lambda_re.grad[:3], torch.zeros(3, dtype=torch.float64))
    assert (clipped.Lambda_re.grad[3:] != 0).all()


def test_options():
    cfg = S5Config()
    defaults = {"state_size": None, "blocks": 8, "dt_min": 0.001, "dt_max": 0.1, "clip_eigs": True}
    assert option_defaults(S5) == defaults
    assert (cfg.state_size, cfg.blocks, cfg.dt_min, cfg.dt_max, cfg.clip_eigs) == tuple(defaults.values())
    model = S5(IN, H)
    assert model.state_size == H and model.initial_state(3).shape == (3, H // 2)
    with pytest.raises(ValueError, match=r"^policy.s5.dt_min=0 must be > 0$"):
        S5(IN, H, dt_min=0)
    with pytest.raises(ValueError, match=r"^policy.s5.dt_max=0.01 must be >= policy.s5.dt_min=0.1$"):
        S5(IN, H, dt_min=0.1, dt_max=0.01)
    with pytest.raises(ValueError, match=r"^policy.s5.state_size=30 must be a multiple of 2 \* policy.s5.blocks=2 "):
        S5(IN, H, state_size=30, blocks=2)
    with pytest.raises(ValueError, match=r"^S5's state size 40 \(policy.s5.state_size, null: hidden_size=40\) must"):
        S5(IN, 40)
    with pytest.raises(ValueError, match=r"^policy.rnn_hidden_size=40 must be a multiple of 2 \* policy.s5.blocks=8 "):
        S5Config().check_chosen("policy.s5", SimpleNamespace(rnn_hidden_size=40))
    S5Config(state_size=16).check_chosen("policy.s5", SimpleNamespace(rnn_hidden_size=40))
