"""LMU against POPGym's ray_lmu core (popgym.baselines.models.lmu.LMU, the sequential cell), weights copied: a
[T=64, B=8] window with a carried-in state, outputs, final state and every gradient; the acting step against the
window; the delay matrices and the zero-state memory against POPGym's parallel LMUFFT."""

from __future__ import annotations

import pytest
import torch
from popgym_reference import copy_weights, ray_model
from zoo_checks import assert_close_scaled, assert_steps_equal_window, option_defaults, outputs_and_grads, per_window

from pomdp_ffm.options import LMUConfig
from pomdp_ffm.seq_models.lmu import LMU

I, H, T, B = 12, 32, 64, 8
SEED = 0  # added to every generator seed here (conftest.ZOO_CASES sets it, and the sizes above)
# POPGym's cell name -> ours (A, B only where learned: buffers otherwise, copied separately)
NAMES = {"e_x": "e_x", "e_h": "e_h", "e_m": "e_m", "W_x": "W_x", "W_h": "W_h", "W_m": "W_m", "A": "A", "B": "B"}


def _pair(learn: bool, seed: int = 0):
    torch.manual_seed(SEED + seed)
    ref = ray_model("ray_lmu", "LMU", I, H, learn_a=learn, learn_b=learn)
    cell = ref.core.cell
    ours = LMU(I, H, learn_a=learn, learn_b=learn)
    with torch.no_grad():
        for n, p in cell.named_parameters():  # off the init (e_m starts at zero) so that every term counts
            # (A, B, e_m little: the memory's own loop A + B e_m, spectral radius 0.87, stays under 1 (0.96 here))
            p.add_({"A": 0.001, "B": 0.01, "e_m": 0.01}.get(n, 0.1) * torch.randn_like(p))
    copy_weights(ours, cell, {NAMES[n]: n for n, _ in cell.named_parameters()})  # every parameter of both once
    with torch.no_grad():
        for n, buf in cell.named_buffers():
            ours.get_buffer(NAMES[n]).copy_(buf)
    return ref, ours


def _popgym(ref, x, h, m):
    """POPGym's forward_memory on our layout: x [T, B, I], (h [B, H], m [B, N])."""
    y, (h1, m1) = ref.forward_memory(x.transpose(0, 1), [h.unsqueeze(1), m.unsqueeze(1)], None, None)
    return y.transpose(0, 1), (h1.squeeze(1), m1.squeeze(1))


def test_lmu_config_defaults_match_the_signature_and_popgym():
    popgym_defaults = type(ray_model("ray_lmu", "LMU", I, H)).MODEL_CONFIG
    defaults = option_defaults(LMU)
    assert set(defaults) == {"memory_size", "theta", "learn_a", "learn_b"}
    cfg = LMUConfig()
    for name in ("theta", "learn_a", "learn_b"):
        assert getattr(cfg, name) == defaults[name] == popgym_defaults[name]
    assert LMU(I, H).memory_size == H  # ray_lmu's memory_size = hidden_size


@pytest.mark.parametrize("n, theta", [(32, 64), (128, 64), (7, 3.5)])
def test_delay_matrices_match_popgym(n, theta):
    from popgym.baselines.models.lmu import LMUFFT, LMUCell

    torch.manual_seed(SEED + 0)
    ours = LMU(I, n, theta=theta)
    for ref in (LMUCell(I, n, n, theta), LMUFFT(I, n, n, T, theta)):  # (ray_lmu's cell: memory_size = hidden_size)
        # measured: bitwise equal but one entry of A 1.8e-12 off at n = 256, theta = 100 (expm's rounding)
        torch.testing.assert_close(ours.A, ref.A, rtol=0, atol=1e-9)
        torch.testing.assert_close(ours.B, ref.B, rtol=0, atol=1e-9)


# Tolerance on max |ours - POPGym's| relative to max(1, max |POPGym's|), per tensor. The fused step is the same
# function (float64: measured 9.1e-15 at most, float64 rounding); in float32 both sides carry
# the recurrence's float32 error, which is already 3.7e-6 in y between POPGym's float32 and float64 runs. Measured
# float32 maxima (fixed / learned A, B): y 5.5e-6 / 3.9e-6, m 9.4e-7 / 9.0e-7, grad x 2.3e-6 / 1.4e-6,
# grad m0 2.1e-6 / 2.0e-6, parameter grads 3.3e-6 (e_h) / 1.9e-6 (B).
SCALED_TOL = {torch.float32: 1e-5, torch.float64: 1e-13}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("learn", [False, True], ids=["fixed_AB", "learned_AB"])
def test_window_with_carried_state_matches_popgym(learn, dtype, zoo_case):
    ref, ours = _pair(learn)
    ref.to(dtype), ours.to(dtype)
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():  # the carried-in state: POPGym's after a first random window from zeros
        zeros = torch.zeros(B, H, dtype=dtype)
        _, (h0, m0) = _popgym(ref, torch.randn(T, B, I, generator=g).to(dtype), zeros, zeros)
    x = torch.randn(T, B, I, generator=g).to(dtype)
    weights = [torch.randn(shape, generator=g).to(dtype) for shape in ((T, B, H), (B, H), (B, H))]
    # loss = sum(y wy) + sum(h_T wh) + sum(m_T wm): outputs, final state (h, m: "final 0", "final 1"), the grads of
    # every parameter (by our names), of x and of the carried-in state
    cell = {NAMES[n]: p for n, p in ref.core.cell.named_parameters()}
    theirs, _ = outputs_and_grads(lambda x, s: _popgym(ref, x, *s), x, (h0, m0), weights, cell)
    mine, _ = outputs_and_grads(ours, x, (h0, m0), weights, ours.named_parameters())
    # a live memory and a tanh mostly off its rails, so that every term counts
    assert theirs["final 1"].abs().max() > 1 and (theirs["final 0"].abs() < 0.99).float().mean() > 0.5
    for name, b in theirs.items():
        assert mine[name].dtype == dtype and b.abs().max() > 0, name
    # (names mapped: every parameter's gradient on both sides)
    assert_close_scaled(mine, theirs, per_window(SCALED_TOL[dtype], T), floor=1.0)


def test_memory_size_and_theta_options_match_popgym_cell():
    """memory_size != hidden_size (ray_lmu ties them; POPGym's plain LMU does not) and another theta, in float64."""
    from popgym.baselines.models.lmu import LMU as PopgymLMU

    n, theta = 20, 10.0
    torch.manual_seed(SEED + 4)
    ref = PopgymLMU(I, H, n, theta, learn_a=True, learn_b=True).double()
    ours = LMU(I, H, memory_size=n, theta=theta, learn_a=True, learn_b=True).double()
    with torch.no_grad():
        for name, p in ref.cell.named_parameters():
            p.add_({"A": 0.001, "B": 0.01, "e_m": 0.01}.get(name, 0.1) * torch.randn_like(p))
    pairs = copy_weights(ours, ref.cell, {NAMES[n]: n for n, _ in ref.cell.named_parameters()})
    assert len(pairs) == 8
    g = torch.Generator().manual_seed(SEED + 5)
    x, h0, m0 = (torch.randn(shape, generator=g, dtype=torch.float64) for shape in ((T, B, I), (B, H), (B, n)))
    weights = [torch.randn(shape, generator=g, dtype=torch.float64) for shape in ((T, B, H), (B, H), (B, n))]

    def popgym(x, state):  # (POPGym's LMU is batch first)
        y, state = ref(x.transpose(0, 1), state)
        return y.transpose(0, 1), state

    theirs, _ = outputs_and_grads(popgym, x, (h0, m0), weights, {n: q for n, _, q in pairs})
    mine, _ = outputs_and_grads(ours, x, (h0, m0), weights, ours.named_parameters())
    assert theirs["final 1"].abs().max() > 1
    assert_close_scaled(mine, theirs, 1e-13, floor=1.0)  # measured: under 1e-14 of the scale


def test_acting_steps_equal_the_window():
    _, ours = _pair(False)
    g = torch.Generator().manual_seed(SEED + 2)
    x = torch.randn(T, B, I, generator=g)
    state = (torch.randn(B, H, generator=g).tanh(), torch.randn(B, H, generator=g))
    # The same step either way, but a window's matmuls may block their sums otherwise than a step's on another
    # kernel path: each of the T steps rounds by about an ulp of the state's scale, at most T of them add up
    # (measured: bitwise equal natively and under SSE4.1; 2.6e-6 of the largest entry under AVX2).
    s = assert_steps_equal_window(ours, x, state, of_largest=T * 2.0**-23)
    assert s[0].shape == (B, H) and s[1].shape == (B, H)


def test_zero_state_memory_matches_popgym_parallel_form():
    """POPGym's LMUFFT is another model (u = ReLU(W_u x), no h feedback, a ReLU read-out), so only the LTI memory
    both share is compared: with e_h = e_m = 0 ours writes u = e_x . x, LMUFFT writes ReLU(W_u x) = the same u where
    x is chosen to make it positive; ours' memory after each acting step against LMUFFT's convolution."""
    from popgym.baselines.models.lmu import LMUFFT

    torch.manual_seed(SEED + 3)
    ours = LMU(I, H)
    fft = LMUFFT(I, H, H, T, 64)
    with torch.no_grad():
        ours.e_h.zero_(), ours.e_m.zero_()
        fft.W_u.weight.copy_(ours.e_x), fft.W_u.bias.zero_()
        x = torch.randn(T, B, I).abs() * ours.e_x.sign()  # u = e_x . x > 0
        s, ms = None, []
        for t in range(T):
            _, s = ours(x[t : t + 1], s)
            ms.append(s[1])
        m_fft = torch.fft.irfft(
            torch.fft.rfft(fft.W_u(x.transpose(0, 1)).transpose(1, 2), n=2 * T) * fft.fft_H, n=2 * T
        )[..., :T]  # LMUFFT.forward's memory, which it does not return: [B, N, T]
    m_ours = torch.stack(ms, -1)
    assert m_ours.abs().max() > 0.5
    # measured max abs difference 4.6e-6 (FFT and float32 impulse rounding; |m| up to 2.8)
    torch.testing.assert_close(m_ours, m_fft, rtol=1e-5, atol=1e-5)
