"""Elman and IndRNN held to POPGym's (ray_models.ray_elman.Elman, ray_models.ray_indrnn.IndRNN, whose core is
models.indrnn.IndRNN): POPGym's weights copied in, the same window from the same carried state gives the same
outputs, final state and gradients (parameters, input, carried state), and the acting step (T = 1 at a time) the
window's outputs. IndRNN's tanh option, which POPGym never computes, is held to the equations in float64."""

import pytest
import torch
from popgym_reference import ray_model

from pomdp_ffm.seq_models.elman import Elman
from pomdp_ffm.seq_models.indrnn import IndRNN, IndRNNConfig

IN, H, T, B = 12, 32, 64, 8


def close(mine: torch.Tensor, theirs: torch.Tensor, tol: float) -> None:
    """Equal within ``tol`` relative, or ``tol`` of ``theirs``' largest magnitude absolute: float32 rounding of
    sums over 64 steps (and over the batch, for the parameters' gradients), whose small entries cancel. The largest
    differences measured (as a fraction of that magnitude) are noted at each use."""
    theirs = theirs.to(mine.dtype)
    torch.testing.assert_close(mine, theirs, rtol=tol, atol=tol * theirs.abs().max().item())


def copy_weights(ours: torch.nn.Module, ref: torch.nn.Module, mapping: dict[str, str], unused=()) -> None:
    """ours[name] <- ref[mapping[name]], every parameter of ours written once and every one of ref read once (but
    those in ``unused``)."""
    mine, theirs = dict(ours.named_parameters()), dict(ref.named_parameters())
    assert sorted(mapping) == sorted(mine)
    assert sorted(mapping.values()) == sorted(set(theirs) - set(unused))
    with torch.no_grad():
        for name, src in mapping.items():
            assert mine[name].shape == theirs[src].shape, name
            mine[name].copy_(theirs[src])


def run_both(ours, ref, to_ref_state, from_ref_state, ref_state_in):
    """The window through both from the carried-in state ``ref_state_in`` (POPGym's layout): (y, state, grads of
    the parameters by mapping order, grad x, grad state) of each, in our layout."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(T, B, IN, generator=g)
    w_y = torch.randn(T, B, H, generator=g)
    w_s = torch.randn(from_ref_state(ref_state_in).shape, generator=g)

    x_o = x.clone().requires_grad_()
    s_o = from_ref_state(ref_state_in).clone().requires_grad_()
    y_o, last_o = ours(x_o, s_o)
    ((y_o * w_y).sum() + (last_o * w_s).sum()).backward()

    x_r = x.transpose(0, 1).clone().requires_grad_()
    s_r = ref_state_in.clone().requires_grad_()
    y_r, [last_r] = ref.forward_memory(x_r, [s_r], torch.zeros(B, dtype=torch.long), torch.full((B,), T))
    ((y_r.transpose(0, 1) * w_y).sum() + (from_ref_state(last_r) * w_s).sum()).backward()
    mine = (y_o, last_o, x_o.grad, s_o.grad)
    theirs = (y_r.transpose(0, 1), from_ref_state(last_r), x_r.grad.transpose(0, 1), from_ref_state(s_r.grad))
    return mine, theirs, x


def max_diff(a, b) -> float:
    return (a - b).abs().max().item()


def assert_step_by_step(ours, x, state_in, y, last):
    """Acting, one step at a time with the state carried, gives the window's outputs and final state (measured:
    identical, 0, in every use here)."""
    state, ys = state_in, []
    with torch.no_grad():
        for t in range(T):
            out, state = ours(x[t : t + 1], state)
            ys.append(out)
    close(torch.cat(ys), y.detach(), 1e-6)
    close(state, last.detach(), 1e-6)


# --- Elman --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layers", [1, 2])
def test_elman_equals_popgym(layers):
    torch.manual_seed(0)
    wrapper = ray_model("ray_elman", "Elman", IN, H, num_recurrent_layers=layers)
    ref = wrapper.core
    assert isinstance(ref, torch.nn.RNN) and ref.nonlinearity == "tanh" and ref.num_layers == layers
    ours = Elman(IN, H, num_layers=layers)
    names = [f"{kind}_l{k}" for k in range(layers) for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
    copy_weights(ours, ref, {f"rnn.{n}": n for n in names})

    # The carried state: a first random window's, through POPGym from zeros ([B, layers, H], POPGym's layout).
    with torch.no_grad():
        _, [s_in] = wrapper.forward_memory(torch.randn(B, 40, IN), [torch.zeros(B, layers, H)], None, None)
    assert s_in.abs().min() > 0
    layout = lambda s: s.transpose(0, 1)  # POPGym's [B, layers, H] <-> ours [layers, B, H]
    (y, last, gx, gs), (y_r, last_r, gx_r, gs_r), x = run_both(ours, wrapper, layout, layout, s_in)

    # Measured: identical (0) in outputs, state and every gradient, 1 and 2 layers (the same nn.RNN kernels on a
    # CPU, batch first or not); held to 1e-6 so that another backend's rounding passes.
    for mine, theirs in ((y, y_r), (last, last_r), (gx, gx_r), (gs, gs_r)):
        close(mine, theirs, 1e-6)
    for name in names:
        close(ours.rnn.get_parameter(name).grad, ref.get_parameter(name).grad, 1e-6)
    assert_step_by_step(ours, x, layout(s_in), y, last)


def test_elman_keeps_the_projects_init_not_popgyms():
    torch.manual_seed(0)
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
    with pytest.raises(ValueError, match="bound_horizon=0 must be an int >= 1"):
        IndRNN(IN, H, bound_horizon=0)


def test_indrnn_equals_popgym():
    torch.manual_seed(0)
    wrapper = ray_model("ray_indrnn", "IndRNN", IN, H)
    ref = wrapper.core
    limit = ref.clamp_val
    with torch.no_grad():  # u outside the bound both sides must clamp (POPGym in its forward, ours standalone too)
        ref.weight0[:3] = torch.tensor([1.5, -1.2, 1.0 + 1e-3])
        ref.weight1[:2] = torch.tensor([-3.0, 1.1])
    ours = IndRNN(IN, H)
    copy_weights(ours, ref, INDRNN_MAP, unused=("output.weight", "output.bias"))

    # The carried state: a first random window's, through POPGym from zeros ([B, 2, H], POPGym's layout).
    with torch.no_grad():
        _, [s_in] = wrapper.forward_memory(torch.randn(B, 40, IN), [torch.zeros(B, 2, H)], None, None)
    assert (s_in > 0).float().mean() > 0.3
    layout = lambda s: s.transpose(0, 1)  # POPGym's [B, 2, H] <-> ours [2, B, H]
    (y, last, gx, gs), (y_r, last_r, gx_r, gs_r), x = run_both(ours, wrapper, layout, layout, s_in)

    for u in (ours.recurrent0, ours.recurrent1):
        assert u.abs().max() <= limit
    assert ours.recurrent0[0] == limit and ours.recurrent1[0] == -limit
    assert ref.output.weight.grad is None and ref.output.bias.grad is None  # POPGym's unused Linear
    assert (y == 0).any() and (y > 0).any()  # ReLU both cut and passed
    # Measured (of the largest magnitude): y 1.8e-6 (|y| up to 225: u at the bound ~1.0007 sums 100 steps), state
    # 1.8e-6, grad x 3.3e-7, grad state 3.8e-7, parameters' grads 1.8e-6 (up to 3.3e5 in magnitude).
    for mine, theirs in ((y, y_r), (last, last_r), (gx, gx_r), (gs, gs_r)):
        close(mine, theirs, 5e-6)
    ours_p, ref_p = dict(ours.named_parameters()), dict(ref.named_parameters())
    for name, src in INDRNN_MAP.items():
        torch.testing.assert_close(ours_p[name], ref_p[src], rtol=0, atol=0)  # both clamped alike
        close(ours_p[name].grad, ref_p[src].grad, 5e-6)
    assert_step_by_step(ours, x, layout(s_in), y, last)


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
    torch.manual_seed(3)
    ours = IndRNN(IN, H, activation=activation)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(T, B, IN, generator=g)
    s = torch.randn(2, B, H, generator=g).abs()
    w_y, w_s = torch.randn(T, B, H, generator=g), torch.randn(2, B, H, generator=g)

    x_o, s_o = x.clone().requires_grad_(), s.clone().requires_grad_()
    y, last = ours(x_o, s_o)
    ((y * w_y).sum() + (last * w_s).sum()).backward()

    p64 = {n: p.detach().double().requires_grad_() for n, p in ours.named_parameters()}
    x64, s64 = x.double().requires_grad_(), s.double().requires_grad_()
    y64, last64 = indrnn_equations(p64, x64, s64, torch.relu if activation == "relu" else torch.tanh)
    ((y64 * w_y.double()).sum() + (last64 * w_s.double()).sum()).backward()

    # Measured (relu / tanh, of the largest magnitude): y 2.2e-7 / 3.6e-7 (relu's |y| up to 74), state 1.9e-7 /
    # 1.7e-7, grad x 1.7e-7 / 1.4e-7, grad state 1.9e-7 / 5.8e-8, parameters' grads 3.5e-7 / 2.2e-7.
    for mine, exact in ((y, y64), (last, last64), (x_o.grad, x64.grad), (s_o.grad, s64.grad)):
        close(mine.double(), exact, 1e-6)
    for name, p in ours.named_parameters():
        close(p.grad.double(), p64[name].grad, 1e-6)
    assert_step_by_step(ours, x, s, y, last)


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
