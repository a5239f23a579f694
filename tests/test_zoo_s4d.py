"""S4D (pomdp_ffm/seq_models/s4d.py) against POPGym's: popgym.baselines.ray_models.ray_s4d.S4D, whose memory is
a Linear (``map``) into popgym.baselines.models.s4d.S4 (diagonal kernel, S4D-Lin, zero-order hold).

POPGym's S4 takes a carried-in state in its convolution mode (S4.forward(u, state): the state's response added
to the FFT convolution, the next state by SSKernelDiag.forward_state), though ray_s4d's training path passes none.
So the window with a carried-in state is held to S4.forward(u, state) (outputs, and the gradients through them)
and SSKernelDiag.forward_state (the final state: called directly, as S4's wrapper of it runs under no_grad); the
zero-state window to ray_s4d's forward_memory on a window (its training path, the convolution); the acting step to
its forward_memory one step at a time (its recurrent ``step``) with the state carried."""

from __future__ import annotations

import math

import pytest
import torch
from popgym_reference import AROUND_THE_MEMORY, copy_weights, ray_model
from zoo_checks import assert_close_scaled, outputs_and_grads

from pomdp_ffm.options import S4DConfig
from pomdp_ffm.seq_models.s4d import S4D, popgym_d_state

s4d_ref = pytest.importorskip("popgym.baselines.models.s4d")

IN, H, T, B = 12, 32, 64, 8
SEED = 0  # added to every generator seed here (conftest.ZOO_CASES sets it, and the sizes above)
# Importing POPGym's Ray models draws from torch's generator (BaseModel's class-level default actor and critic
# Linears): import them once here so that a seeded build draws the same weights whichever test runs first.
ray_model("ray_s4d", "S4D", IN, H)


pytestmark = pytest.mark.usefixtures("one_thread")

# ours <- POPGym's memory core (ray_s4d's map + core)
MAPPING = {
    "map.weight": "map.weight",
    "map.bias": "map.bias",
    "log_dt": "core.kernel.kernel.log_dt",
    "inv_A_real": "core.kernel.kernel.inv_A_real",
    "A_imag": "core.kernel.kernel.A_imag",
    "B": "core.kernel.kernel.B",
    "C": "core.kernel.kernel.C",
    "D": "core.D",
    "out.weight": "core.output_linear.0.weight",
    "out.bias": "core.output_linear.0.bias",
}
# the conversion of a tensor where it is not the same (POPGym's C and D have a channel axis: one channel)
CONVERT = {"C": lambda p: p[0], "D": lambda p: p[0]}
# POPGym's SSKernelDiag registers its initial A as a parameter and never reads it (its forward reads inv_A_real
# and A_imag): asserted below to get no gradient.
DEAD = {"core.kernel.kernel.A"}


def make_pair(dtype=torch.float32, seed=0, **cfg):
    """POPGym's ray S4D and ours with its weights (every parameter of both used once)."""
    torch.manual_seed(SEED + seed)
    ref = ray_model("ray_s4d", "S4D", IN, H)
    if cfg:  # the same S4 layer with other kernel options (ray_s4d fixes them)
        ref.core = s4d_ref.S4(
            d_model=H, d_state=ref.h, mode="diag", measure="diag-lin", bidirectional=False, transposed=False, **cfg
        )
    # Only the memory core changes dtype: the actor and critic heads are BaseModel's class-level modules, shared
    # by every instance, and a float64 one would draw differently from the generator at the next build.
    ref.map.to(dtype), ref.core.to(dtype)
    ours = S4D(IN, H, **cfg).to(dtype)
    assert ours.d_state == ref.h
    # (POPGym's embedding strength: ray_s4d does not embed)
    copy_weights(ours, ref, MAPPING, AROUND_THE_MEMORY + ("embedding_strength", *DEAD), CONVERT)
    return ref, ours


def _tensors(dtype, d_state, seed=1):
    """x, the carried-in state's (re, im) values and the loss weights, drawn in float32 (the same at any dtype)."""
    g = torch.Generator().manual_seed(SEED + seed)
    x = torch.randn(T, B, IN, generator=g)
    first = torch.randn(2, B, H, d_state // 2, generator=g)
    w_y = torch.randn(T, B, H, generator=g)
    w_s = torch.randn(B, H, d_state // 2, 2, generator=g)
    return (t.to(dtype) for t in (x, first, w_y, w_s))


def _ref_window(ref, x_bt, s0):
    """POPGym's S4 on a window [B, T, IN] from state s0: (y [B, T, H], final state)."""
    u = ref.map(x_bt)
    y, _ = ref.core(u, state=s0)
    final = ref.core.kernel.kernel.forward_state(u.transpose(-1, -2), s0)  # (differentiable, unlike S4's wrapper)
    return y, final


def _real(tensors: dict) -> dict:
    """Complex tensors (the state, its gradient) as their real views [..., 2]: compared part by part."""
    return {k: torch.view_as_real(v) if v.is_complex() else v for k, v in tensors.items()}


# Largest differences measured (torch 2.13, CPU), relative to each tensor's largest magnitude, on the window with a
# carried-in state: float32 2.4e-6 (zoh: x's gradient; outputs 1.3e-6, final state 1.6e-6, state gradients 1.9e-6,
# parameter gradients 1.3e-6) and 2.0e-6 (bilinear); float64 4e-15. POPGym's FFT convolution and our scan are
# equally far from float64 (both ~1e-5 absolute on outputs of scale 3).
TOL = {torch.float32: 1e-5, torch.float64: 1e-13}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("disc", ["zoh", "bilinear"])
def test_window_with_carried_state_matches_popgym_convolution(dtype, disc, zoo_case):
    cfg = {} if disc == "zoh" else {"disc": disc}
    ref, ours = make_pair(dtype, **cfg)
    ref.eval()
    x, first, w_y, w_s = _tensors(dtype, ours.d_state)
    # the carried-in state: random, of unit scale (a state after a first window is as small as dt, ~0.001-0.1)
    s_in = torch.complex(first[0], first[1])
    tol = TOL[dtype]

    def popgym(x, s0):
        y, s = _ref_window(ref, x.transpose(0, 1), s0)
        return y.transpose(0, 1), s

    params = dict(ref.named_parameters())
    theirs, _ = outputs_and_grads(popgym, x, s_in, [w_y, w_s], {n: params[src] for n, src in MAPPING.items()})
    ours_out, _ = outputs_and_grads(ours, x, s_in, [w_y, w_s], ours.named_parameters())
    for name in DEAD:
        assert params[name].grad is None
    theirs |= {f"grad {n}": convert(theirs[f"grad {n}"]) for n, convert in CONVERT.items()}
    assert_close_scaled(_real(ours_out), _real(theirs), tol)
    with torch.no_grad():  # the carried-in state moves the outputs far beyond the tolerance
        assert (ours(x)[0] - ours_out["y"]).abs().max() > 1e-2


def test_zero_state_window_matches_popgym_training_path():
    """ray_s4d's forward_memory on a window: the FFT convolution from a zero state (it ignores the state given)."""
    ref, ours = make_pair()
    x = torch.randn(T, B, IN)
    state = [t.expand(B, *t.shape) for t in ref.initial_state()]
    with torch.no_grad():
        y_ref, _ = ref.forward_memory(x.transpose(0, 1), state, torch.zeros(B, dtype=torch.long), torch.full((B,), T))
        y, s = ours(x)
        _, s_ref = _ref_window(ref, x.transpose(0, 1), ours.initial_state(B))
    # measured: outputs 1.3e-6, state 1.2e-6 (relative to their scale)
    assert_close_scaled(_real({"y": y, "state": s}), _real({"y": y_ref.transpose(0, 1), "state": s_ref}), 1e-5)


def test_acting_steps_match_popgym_step_and_our_window():
    """Our T = 1 calls, state carried: POPGym's recurrent step (ray_s4d's acting path) step by step, and our
    own window's outputs and final state."""
    ref, ours = make_pair()
    ref.eval()
    x = torch.randn(T, B, IN)
    s0 = torch.randn(B, H, ours.d_state // 2, dtype=torch.cfloat)
    ys, diffs, s = [], [], s0
    ref_state = [s0.real.clone(), s0.imag.clone()]
    ones = torch.ones(B, dtype=torch.long)
    with torch.no_grad():
        for t in range(T):
            y_t, s = ours(x[t : t + 1], s)
            y_ref, ref_state = ref.forward_memory(x[t].unsqueeze(1), ref_state, ones * t, ones)
            ys.append(y_t)
            diffs.append((y_t[0] - y_ref[:, 0]).abs().max() / y_ref.abs().max())
            diffs.append((s - torch.complex(*ref_state)).abs().max() / s.abs().max())
        y_win, s_win = ours(x, s0)
    # measured: at most 6e-7 of the scale, outputs and states over the 64 steps; window vs steps 1.3e-6
    assert max(diffs) <= 1e-5, max(diffs)
    assert_close_scaled(_real({"y": torch.cat(ys), "state": s}), _real({"y": y_win, "state": s_win}), 1e-5)


def test_initialisation_follows_popgym():
    torch.manual_seed(SEED + 0)
    ours = S4D(IN, H)
    w, _, b, _ = s4d_ref.dplr(scaling="lin", N=ours.d_state, H=H)
    # (torch.allclose, not torch.testing.assert_close: that imports torch.distributed, seconds on a busy machine)
    assert torch.allclose(-torch.exp(ours.inv_A_real.detach()), w.real)
    assert torch.equal(ours.A_imag.detach(), w.imag)
    assert torch.equal(torch.view_as_complex(ours.B.detach()), b)
    inv = S4D(IN, H, init="inv", d_state=8)
    w_inv, *_ = s4d_ref.dplr(scaling="inv", N=8, H=H)
    assert torch.allclose(inv.A_imag.detach(), w_inv.imag)
    assert not torch.allclose(inv.A_imag.detach(), S4D(IN, H, d_state=8).A_imag.detach())
    dt = torch.exp(ours.log_dt.detach())
    assert 0.001 <= dt.min() and dt.max() <= 0.1 and dt.max() / dt.min() > 10
    assert 0.5 < torch.view_as_complex(ours.C.detach()).abs().pow(2).mean() < 2  # complex normal, variance 1


@pytest.mark.parametrize("h", [2, 32, 50, 128, 256])
def test_d_state_is_popgym_formula(h):
    assert popgym_d_state(h) == ray_model("ray_s4d", "S4D", IN, h).h
    model = S4D(IN, h)
    assert model.initial_state(3).shape == (3, h, popgym_d_state(h) // 2)
    assert S4D(IN, h, d_state=4).initial_state(1).shape == (1, h, 2)


def test_options_rules():
    cfg = S4DConfig()
    assert (cfg.d_state, cfg.dt_min, cfg.dt_max, cfg.init, cfg.disc) == (None, 0.001, 0.1, "lin", "zoh")
    S4DConfig(dt_min=0.01, dt_max=0.01).check_together("policy.s4d")
    with pytest.raises(ValueError, match="dt_max"):
        S4DConfig(dt_min=0.2).check_together("policy.s4d")
    for bad in ({"d_state": 3}, {"init": "legs"}, {"disc": "dss"}, {"dt_min": 1.0, "dt_max": 0.5}):
        with pytest.raises(ValueError):
            S4D(IN, H, **bad)
    assert math.isfinite(S4D(IN, H).activation_floats())
