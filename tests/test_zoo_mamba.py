"""Mamba (pomdp_ffm/seq_models/mamba.py) against mambapy 1.2.0's Mamba (mambapy/mamba.py) on the model's weights
copied in, with our input embedding and final RMSNorm (mambapy's RMSNorm class) applied around it: its window
(forward, its parallel scan pscan, from a zero state) against ours from a fresh state, and its ``step`` with its
caches carried (the last d_conv - 1 convolution inputs and h per layer) against ours acting one step at a time and
against our window from the same carried state. Then acting against the window, a window carried in from a state
against the same steps inside one window, the initialisation (a seed gives mambapy's parameters) and the options.

mambapy's ssm and ssm_step cast A_log and D to float32 (``.float()``, for mixed precision); the float64 reference
here lifts that cast on those two parameters (``_lift_float32_cast``), so that it runs in float64 throughout as the
model does (the module docstring's deliberate difference)."""

import math

import pytest
import torch
from mambapy.mamba import Mamba as MambaPy
from mambapy.mamba import MambaConfig as MambaPyConfig
from mambapy.mamba import RMSNorm as MambaPyRMSNorm
from torch import nn
from torch.nn import functional as F
from zoo_checks import assert_close_scaled, assert_steps_equal_window, option_defaults, outputs_and_grads

from pomdp_ffm.options import MambaConfig
from pomdp_ffm.seq_models.mamba import Mamba

T, B, IN, H = 64, 8, 12, 32
SEED = 0  # added to every generator seed here (conftest.ZOO_CASES sets it, and the sizes above)
LAYERS = 2

pytestmark = pytest.mark.usefixtures("one_thread")


def _model(**opts) -> Mamba:
    torch.manual_seed(SEED + 0)
    return Mamba(IN, H, layers=LAYERS, **opts)


def _inputs():
    g = torch.Generator().manual_seed(SEED + 1)
    x0, x = (torch.randn(T, B, IN, generator=g, dtype=torch.float64) for _ in range(2))
    R_y = torch.randn(T, B, H, generator=g, dtype=torch.float64)
    return x0, x, R_y


def _state_weights(model: Mamba) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(SEED + 2)
    return [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in model.initial_state(B)]


def _lift_float32_cast(reference: MambaPy) -> None:
    """mambapy's ``self.A_log.float()`` and ``self.D.float()`` return the float64 parameters themselves."""
    for block in reference.layers:
        for p in (block.mixer.A_log, block.mixer.D):
            p.float = lambda p=p: p


def reference(model: Mamba):
    """mambapy's Mamba in float64 on ``model``'s weights (its parameter names are ours), with our embedding and
    final norm around it: (its window from a zero state, its steps from a carried state, the parameters by name)."""
    mixer = model.layers[0].mixer
    config = MambaPyConfig(
        d_model=H,
        n_layers=LAYERS,
        dt_rank=model.dt_rank,
        d_state=model.d_state,
        expand_factor=mixer.inner // H,
        d_conv=model.d_conv,
        bias=mixer.in_proj.bias is not None,
        conv_bias=mixer.conv1d.bias is not None,
        pscan=True,
        use_cuda=False,
    )
    ref = MambaPy(config).double()
    _lift_float32_cast(ref)
    embed, norm_f = nn.Linear(IN, H, dtype=torch.float64), MambaPyRMSNorm(H).double()
    theirs = dict(ref.named_parameters()) | {"embed.weight": embed.weight, "embed.bias": embed.bias}
    theirs["norm_f.weight"] = norm_f.weight
    ours = dict(model.named_parameters())
    assert set(theirs) == set(ours), sorted(set(theirs) ^ set(ours))
    with torch.no_grad():
        for name, p in theirs.items():
            p.copy_(ours[name])

    def window(x: torch.Tensor, state):
        return norm_f(ref(embed(x).transpose(0, 1))).transpose(0, 1), ()

    def steps(x: torch.Tensor, state):
        # our state (conv [layers, K - 1, B, ED], h [layers, B, ED, N]) as its caches [(h [B, ED, N], inputs
        # [B, ED, K - 1]) per layer], and back
        conv, h = state
        caches, ys = [(h[n], conv[n].permute(1, 2, 0)) for n in range(LAYERS)], []
        for x_t in x:
            y_t, caches = ref.step(embed(x_t), caches)
            ys.append(norm_f(y_t))
        final = (torch.stack([c.permute(2, 0, 1) for _, c in caches]), torch.stack([h for h, _ in caches]))
        return torch.stack(ys), final

    return window, steps, theirs


def _compare_window(model: Mamba, dtype: torch.dtype, rtol: float) -> dict:
    """The model (in ``dtype``) against mambapy in float64 on the same weights, from a fresh state: y and the
    gradients of x and every parameter of a loss on y."""
    _, x, R_y = _inputs()
    model = model.to(dtype)
    window, _, theirs = reference(model)
    ours = lambda x, s: (model(x, None)[0], ())  # noqa: E731
    mine, _ = outputs_and_grads(ours, x.to(dtype), (), [R_y], model.named_parameters())
    exact, _ = outputs_and_grads(window, x, (), [R_y], theirs)
    assert len(exact) == 2 + len(theirs)  # y, x's gradient, every parameter's
    return assert_close_scaled(mine, exact, rtol)


def test_float64_window_equals_mambapy():
    # Largest measured (each result's largest difference over its largest magnitude): 1.3e-15 (x_proj's gradient).
    _compare_window(_model(), torch.float64, rtol=1e-13)


def test_float32_window_within_rounding_of_mambapy(zoo_case):
    # Largest measured over conftest.ZOO_CASES: 1.6e-6 (long, T = 160: the first layer's x_proj gradient; y 2.0e-7);
    # 6.4e-7 to 1.1e-6 in the others (x_proj's or dt_proj's gradients). The float32 epsilon is 1.2e-7.
    _compare_window(_model(), torch.float32, rtol=5e-6)


def _acting(model: Mamba):
    def run(x: torch.Tensor, state):
        ys = []
        for x_t in x:
            y_t, state = model(x_t.unsqueeze(0), state)
            ys.append(y_t)
        return torch.cat(ys), state

    return run


@pytest.mark.parametrize("ours", ["window", "acting"])
def test_float64_from_a_carried_state_equals_mambapys_step(ours):
    # mambapy's step with its caches carried (a first window's state), one step at a time: our window from that
    # state, and our acting steps, give its outputs, final caches and the gradients of x, the carried-in caches and
    # every parameter. Largest measured: 1.3e-15 (window), 1.1e-15 (acting).
    model = _model().double()
    x0, x, R_y = _inputs()
    with torch.no_grad():
        _, carried = model(x0, None)
    _, steps, theirs = reference(model)
    run = model if ours == "window" else _acting(model)
    weights = [R_y, *_state_weights(model)]
    mine, final = outputs_and_grads(run, x, carried, weights, model.named_parameters())
    exact, _ = outputs_and_grads(steps, x, carried, weights, theirs)
    assert len(exact) == 1 + 2 + 1 + 2 + len(theirs)  # y, the final state, x's, the state's, every parameter's
    assert final[0].shape == (LAYERS, model.d_conv - 1, B, 2 * H) and final[1].shape == (LAYERS, B, 2 * H, 16)
    assert_close_scaled(mine, exact, 1e-13)


@pytest.mark.parametrize("d_conv", [4, 1], ids=["d_conv-4", "d_conv-1"])
def test_acting_steps_equal_the_window(d_conv):
    # From a fresh state and from one carried in (a first window's), in float32. Largest measured (relative to the
    # largest entry): 2.3e-7 (d_conv 4), 2.7e-7 (d_conv 1, its convolution carrying no inputs).
    model = _model(d_conv=d_conv)
    x0, x, _ = (t.float() for t in _inputs())
    for state in (model.initial_state(B), model(x0, None)[1]):
        conv, h = assert_steps_equal_window(model, x, state, of_largest=1e-6)
        assert conv.shape == (LAYERS, d_conv - 1, B, 2 * H) and h.shape == (LAYERS, B, 2 * H, 16)


@pytest.mark.parametrize("first", [1, 2, 40])
def test_a_window_from_a_state_is_the_same_steps_inside_one_window(first):
    # The steps after the first ``first`` of one window, and the same steps as a window carried in from the first
    # ones' state: 1 and 2 are fewer steps than the convolution's 3 carried inputs. In float64: 3.1e-16 measured.
    model = _model().double()
    x0, x, _ = _inputs()
    xs = torch.cat((x0, x))[: first + T]
    with torch.no_grad():
        whole, whole_state = model(xs, None)
        _, state = model(xs[:first], None)
        second, second_state = model(xs[first:], state)
    got = {"y": second, "conv": second_state[0], "h": second_state[1]}
    assert_close_scaled(got, {"y": whole[first:], "conv": whole_state[0], "h": whole_state[1]}, of_largest=1e-13)


@pytest.mark.parametrize(
    "opts",
    [
        {},
        {
            "d_state": 8,
            "expand": 3,
            "d_conv": 2,
            "dt_rank": 5,
            "dt_min": 0.01,
            "dt_max": 0.02,
            "dt_init": "constant",
            "dt_scale": 0.5,
            "bias": True,
            "conv_bias": False,
        },
    ],
    ids=["defaults", "options"],
)
def test_initialisation_is_mambapys(opts):
    # The same seed gives mambapy's MambaBlock parameters (its Mamba module's initialisation), drawn after our
    # embedding's: Delta's bias softplus^-1 of steps in [dt_min, dt_max], A = -(1..N), D = 1.
    torch.manual_seed(SEED)
    model = Mamba(IN, H, layers=LAYERS, **opts)
    torch.manual_seed(SEED)
    nn.Linear(IN, H)  # (our embedding's draw)
    names = {"expand": "expand_factor"}
    ref = MambaPy(MambaPyConfig(d_model=H, n_layers=LAYERS, **{names.get(k, k): v for k, v in opts.items()}))
    ours = dict(model.named_parameters())
    for name, p in ref.named_parameters():
        assert torch.equal(ours[name], p), name
    cfg = MambaConfig(**opts)
    mixer = model.layers[0].mixer
    dt = F.softplus(mixer.dt_proj.bias.detach())
    assert cfg.dt_min * (1 - 1e-6) <= dt.min() and dt.max() <= cfg.dt_max * (1 + 1e-6)
    N = cfg.d_state
    assert torch.equal(mixer.A_log.detach(), torch.log(torch.arange(1.0, N + 1)).expand(cfg.expand * H, N))
    assert torch.equal(mixer.D.detach(), torch.ones(cfg.expand * H))


def test_options():
    assert option_defaults(Mamba) == {
        "layers": 1,
        "d_state": 16,
        "expand": 2,
        "d_conv": 4,
        "dt_rank": None,
        "dt_min": 0.001,
        "dt_max": 0.1,
        "dt_init_floor": 1e-4,
        "dt_init": "random",
        "dt_scale": 1.0,
        "rms_norm_eps": 1e-5,
        "bias": False,
        "conv_bias": True,
    }
    model = Mamba(IN, 40)
    assert (len(model.layers), model.dt_rank, model.inner, model.d_state) == (1, math.ceil(40 / 16), 80, 16)
    conv, h = model.initial_state(5)
    assert conv.shape == (1, 3, 5, 80) and h.shape == (1, 5, 80, 16)
    with pytest.raises(ValueError, match=r"^policy.mamba.d_conv=0 must be >= 1$"):
        Mamba(IN, H, d_conv=0)
    with pytest.raises(ValueError, match=r"^policy.mamba.dt_init='normal' is not one of \['random', 'constant'\]$"):
        Mamba(IN, H, dt_init="normal")
    with pytest.raises(ValueError, match=r"^policy.mamba.dt_min=0.5 must be <= policy.mamba.dt_max=0.1$"):
        Mamba(IN, H, dt_min=0.5)
