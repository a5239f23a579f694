"""Elman and IndRNN held to POPGym's (ray_models.ray_elman.Elman, ray_models.ray_indrnn.IndRNN, whose core is
models.indrnn.IndRNN): POPGym's weights copied in, the same window from the same carried state gives the same
outputs, final state and gradients (parameters, input, carried state), and the acting step (T = 1 at a time) the
window's outputs. IndRNN's tanh option, which POPGym never computes, is held to the equations in float64."""

import pytest
import torch
from popgym_reference import copy_weights, ray_model
from zoo_checks import assert_close_scaled, assert_steps_equal_window, outputs_and_grads

from pomdp_ffm.options import IndRNNConfig
from pomdp_ffm.seq_models.elman import Elman
from pomdp_ffm.seq_models.indrnn import IndRNN

IN, H, T, B = 12, 32, 64, 8
SEED = 0  # added to every generator seed here (conftest.ZOO_CASES sets it, and the sizes above)


# Tolerances (assert_close_scaled's): equal within ``tol`` relative, or ``tol`` of the reference's largest magnitude
# absolute: float32 rounding of sums over 64 steps (and over the batch, for the parameters' gradients), whose small
# entries cancel. The largest differences measured (as a fraction of that magnitude) are noted at each use.


def run_both(ours, ref, mapping, to_ref_state, ref_state_in):
    """The window through both from the carried-in state ``ref_state_in`` (POPGym's layout): ``outputs_and_grads``'
    dicts of each (every parameter's gradient by our name), in our layout, and x."""
    g = torch.Generator().manual_seed(SEED + 7)
    x = torch.randn(T, B, IN, generator=g)
    w_y = torch.randn(T, B, H, generator=g)
    state = to_ref_state(ref_state_in)  # (the layout change is its own inverse)
    w_s = torch.randn(state.shape, generator=g)

    def popgym(x, s):
        steps, lengths = torch.zeros(B, dtype=torch.long), torch.full((B,), T)
        y, [last] = ref.forward_memory(x.transpose(0, 1), [to_ref_state(s)], steps, lengths)
        return y.transpose(0, 1), to_ref_state(last)

    ref_params = dict(ref.core.named_parameters())
    theirs, _ = outputs_and_grads(popgym, x, state, [w_y, w_s], {n: ref_params[m] for n, m in mapping.items()})
    mine, _ = outputs_and_grads(ours, x, state, [w_y, w_s], ours.named_parameters())
    return mine, theirs, x


# --- Elman --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layers", [1, 2])
def test_elman_equals_popgym(layers, zoo_case):
    torch.manual_seed(SEED + 0)
    wrapper = ray_model("ray_elman", "Elman", IN, H, num_recurrent_layers=layers)
    ref = wrapper.core
    assert isinstance(ref, torch.nn.RNN) and ref.nonlinearity == "tanh" and ref.num_layers == layers
    ours = Elman(IN, H, num_layers=layers)
    names = [f"{kind}_l{k}" for k in range(layers) for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
    mapping = {f"rnn.{n}": n for n in names}
    copy_weights(ours, ref, mapping)

    # The carried state: a first random window's, through POPGym from zeros ([B, layers, H], POPGym's layout).
    with torch.no_grad():
        _, [s_in] = wrapper.forward_memory(torch.randn(B, 40, IN), [torch.zeros(B, layers, H)], None, None)
    assert s_in.abs().min() > 0
    layout = lambda s: s.transpose(0, 1)  # POPGym's [B, layers, H] <-> ours [layers, B, H]
    mine, theirs, x = run_both(ours, wrapper, mapping, layout, s_in)

    # Measured: identical (0) in outputs, state and every gradient, 1 and 2 layers (the same nn.RNN kernels on a
    # CPU, batch first or not); held to 1e-6 so that another backend's rounding passes.
    assert_close_scaled(mine, theirs, 1e-6, rtol=1e-6)
    # Acting, one step at a time with the state carried, gives the window's outputs and final state (measured:
    # identical, 0, in every use here).
    assert_steps_equal_window(ours, x, layout(s_in), of_largest=1e-6, rtol=1e-6)


def test_elman_keeps_the_projects_init_not_popgyms():
    torch.manual_seed(SEED + 0)
    ours = Elman(IN, H)
    w = ours.rnn.weight_hh_l0
    torch.testing.assert_close(w @ w.T, torch.eye(H), rtol=0, atol=1e-5)  # orthogonal (POPGym: uniform)
    assert not ours.rnn.bias_ih_l0.any() and not ours.rnn.bias_hh_l0.any()
    assert ours.activation_floats() == 2 * H and Elman(IN, H, num_layers=3).activation_floats() == 6 * H


# --- IndRNN -------------------------------------------------------------------------------------------------------

INDRNN_MAP = {
    "input0.weight": "input0.weight",
    "input0.bias": "input0.bias",
    "recurrent0": "weight0",
    "bias0": "bias0",
    "input1.weight": "input1.weight",
    "input1.bias": "input1.bias",
    "recurrent1": "weight1",
    "bias1": "bias1",
}


def test_indrnn_options_are_popgyms():
    wrapper = ray_model("ray_indrnn", "IndRNN", IN, H)
    ours = IndRNN(IN, H)
    assert wrapper.core.clamp and ours.recurrent_bound and ours.recurrent_limit == wrapper.core.clamp_val
    assert ours.recurrent_limit == 2 ** (1 / 1024)
    assert wrapper.cfg["activation"] == "tanh"  # POPGym's declared option, which its core ignores (ReLU)
    cfg = IndRNNConfig()
    assert (cfg.activation, cfg.recurrent_bound, cfg.bound_horizon) == ("relu", True, 1024)
    assert ours.activation_floats() == 2 * H
    with pytest.raises(ValueError, match="activation='gelu' is not one of"):
        IndRNN(IN, H, activation="gelu")
    with pytest.raises(ValueError, match="policy.indrnn.bound_horizon=0 must be >= 1"):
        IndRNN(IN, H, bound_horizon=0)


def test_indrnn_equals_popgym(zoo_case):
    torch.manual_seed(SEED + 0)
    wrapper = ray_model("ray_indrnn", "IndRNN", IN, H)
    ref = wrapper.core
    limit = ref.clamp_val
    with torch.no_grad():  # u outside the bound both sides must clamp (POPGym in its forward, ours standalone too)
        ref.weight0[:3] = torch.tensor([1.5, -1.2, 1.0 + 1e-3])
        ref.weight1[:2] = torch.tensor([-3.0, 1.1])
    ours = IndRNN(IN, H)
    copy_weights(ours, ref, INDRNN_MAP, ("output.weight", "output.bias"))

    # The carried state: a first random window's, through POPGym from zeros ([B, 2, H], POPGym's layout).
    with torch.no_grad():
        _, [s_in] = wrapper.forward_memory(torch.randn(B, 40, IN), [torch.zeros(B, 2, H)], None, None)
    assert (s_in > 0).float().mean() > 0.3
    layout = lambda s: s.transpose(0, 1)  # POPGym's [B, 2, H] <-> ours [2, B, H]
    mine, theirs, x = run_both(ours, wrapper, INDRNN_MAP, layout, s_in)

    for u in (ours.recurrent0, ours.recurrent1):
        assert u.abs().max() <= limit
    assert ours.recurrent0[0] == limit and ours.recurrent1[0] == -limit
    assert ref.output.weight.grad is None and ref.output.bias.grad is None  # POPGym's unused Linear
    assert (mine["y"] == 0).any() and (mine["y"] > 0).any()  # ReLU both cut and passed
    # Measured (of the largest magnitude): y 1.8e-6 (|y| up to 225: u at the bound ~1.0007 sums 100 steps), state
    # 1.8e-6, grad x 3.3e-7, grad state 3.8e-7, parameters' grads 1.8e-6 (up to 3.3e5 in magnitude).
    assert_close_scaled(mine, theirs, 5e-6, rtol=5e-6)
    ours_p, ref_p = dict(ours.named_parameters()), dict(ref.named_parameters())
    for name, src in INDRNN_MAP.items():
        torch.testing.assert_close(ours_p[name], ref_p[src], rtol=0, atol=0)  # both clamped alike
    assert_steps_equal_window(ours, x, layout(s_in), of_largest=1e-6, rtol=1e-6)  # (measured: 0)


def indrnn_equations(p: dict[str, torch.Tensor], x: torch.Tensor, s: torch.Tensor, f) -> tuple:
    """The module docstring's equations, one step at a time, in the given parameters' dtype."""
    h0, h1, ys = s[0], s[1], []
    for t in range(x.shape[0]):
        h0 = f(x[t] @ p["input0.weight"].T + p["input0.bias"] + p["recurrent0"] * h0 + p["bias0"])
        h1 = f(h0 @ p["input1.weight"].T + p["input1.bias"] + p["recurrent1"] * h1 + p["bias1"])
        ys.append(h1)
    return torch.stack(ys), torch.stack((h0, h1))


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_indrnn_equals_its_equations_in_float64(activation):
    torch.manual_seed(SEED + 3)
    ours = IndRNN(IN, H, activation=activation)
    g = torch.Generator().manual_seed(SEED + 11)
    x = torch.randn(T, B, IN, generator=g)
    s = torch.randn(2, B, H, generator=g).abs()
    w_y, w_s = torch.randn(T, B, H, generator=g), torch.randn(2, B, H, generator=g)

    mine, _ = outputs_and_grads(ours, x, s, [w_y, w_s], ours.named_parameters())
    p64 = {n: p.detach().double().requires_grad_() for n, p in ours.named_parameters()}
    f = torch.relu if activation == "relu" else torch.tanh
    exact, _ = outputs_and_grads(lambda x, s: indrnn_equations(p64, x, s, f), x.double(), s.double(), [w_y, w_s], p64)

    # Measured (relu / tanh, of the largest magnitude): y 2.2e-7 / 3.6e-7 (relu's |y| up to 74), state 1.9e-7 /
    # 1.7e-7, grad x 1.7e-7 / 1.4e-7, grad state 1.9e-7 / 5.8e-8, parameters' grads 3.5e-7 / 2.2e-7.
    assert_close_scaled(mine, exact, 1e-6, rtol=1e-6)
    assert_steps_equal_window(ours, x, s, of_largest=1e-6, rtol=1e-6)  # (measured: 0)


def test_indrnn_bound_owner_and_load():
    ours = IndRNN(IN, H, bound_horizon=8).bounded_by_owner()
    limit = 2 ** (1 / 8)
    with torch.no_grad():
        ours.recurrent0.fill_(2.0)
    ours(torch.randn(3, 2, IN))
    assert (ours.recurrent0 == 2.0).all()  # owner-managed: forward leaves u to the owner
    ours.bound_()
    assert (ours.recurrent0 == limit).all()
    state = {k: v.clone() for k, v in ours.state_dict().items()}
    state["recurrent1"].fill_(-5.0)
    ours.load_state_dict(state)
    assert (ours.recurrent1 == -limit).all()  # loading clamps in either mode
    free = IndRNN(IN, H, recurrent_bound=False)
    with torch.no_grad():
        free.recurrent0.fill_(2.0)
    free(torch.randn(3, 2, IN))
    free.bound_()
    assert (free.recurrent0 == 2.0).all()
