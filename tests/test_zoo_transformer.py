"""The causal Transformer (pomdp_ffm/seq_models/transformer.py) against torch's own pre-LayerNorm Transformer: an
nn.TransformerEncoder of nn.TransformerEncoderLayer with ``norm_first`` (GPT-2's block order), GELU's tanh form, no
dropout, and the final LayerNorm, on the model's weights copied in, over the window with a causal mask limited to the
last ``context`` steps; its input W_in x_t + b_in + PE(t) with PE written out here (Vaswani et al.'s sinusoid, base
10000). Then acting one step at a time against the window, a window carried in from a state against the same steps
inside one window, and the options."""

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from zoo_checks import assert_close_scaled, assert_steps_equal_window, option_defaults, outputs_and_grads

from pomdp_ffm.options import TransformerConfig
from pomdp_ffm.seq_models.transformer import Transformer

T, B, IN, H = 64, 8, 12, 32
SEED = 0  # added to every generator seed here (conftest.ZOO_CASES sets it, and the sizes above)
HEADS, LAYERS = 4, 2

pytestmark = pytest.mark.usefixtures("one_thread")


def _model(context: int) -> Transformer:
    torch.manual_seed(SEED + 0)
    return Transformer(IN, H, layers=LAYERS, heads=HEADS, context=context)


def _inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(SEED + 1)
    x0, x = (torch.randn(T, B, IN, generator=g, dtype=torch.float64).to(dtype) for _ in range(2))
    R_y = torch.randn(T, B, H, generator=g, dtype=torch.float64)
    start = torch.randint(0, 1000, (B,), generator=g)
    return x0, x, R_y, start


def sinusoid(t: torch.Tensor, width: int) -> torch.Tensor:
    """PE(t)[2i] = sin(t 10000^(-2i/d)), PE(t)[2i+1] = cos(t 10000^(-2i/d)), in float64."""
    i = torch.arange(0, width, 2, dtype=torch.float64)
    angle = t.to(torch.float64).unsqueeze(-1) * torch.exp(-i * math.log(10000) / width)
    return torch.stack((angle.sin(), angle.cos()), dim=-1).flatten(-2)[..., :width]


def reference(model: Transformer, dtype: torch.dtype):
    """torch's encoder on ``model``'s weights (their names mapped to ours, for the gradients) and its run."""
    gelu = lambda z: F.gelu(z, approximate="tanh")  # noqa: E731
    layer = nn.TransformerEncoderLayer(H, HEADS, 4 * H, 0.0, gelu, batch_first=True, norm_first=True, dtype=dtype)
    enc = nn.TransformerEncoder(layer, LAYERS, norm=nn.LayerNorm(H, dtype=dtype), enable_nested_tensor=False)
    embed = nn.Linear(IN, H, dtype=dtype)
    theirs = {"embed.weight": embed.weight, "embed.bias": embed.bias}
    theirs |= {f"ln_f.{k}": getattr(enc.norm, k) for k in ("weight", "bias")}
    for n, block in enumerate(enc.layers):
        for ours, mine in (
            ("ln_1", block.norm1),
            ("ln_2", block.norm2),
            ("proj", block.self_attn.out_proj),
            ("fc", block.linear1),
            ("fc_out", block.linear2),
        ):
            theirs |= {f"blocks.{n}.{ours}.{k}": getattr(mine, k) for k in ("weight", "bias")}
        theirs[f"blocks.{n}.qkv.weight"] = block.self_attn.in_proj_weight
        theirs[f"blocks.{n}.qkv.bias"] = block.self_attn.in_proj_bias
    ours = dict(model.named_parameters())
    assert set(theirs) == set(ours), sorted(set(theirs) ^ set(ours))
    with torch.no_grad():
        for name, p in theirs.items():
            p.copy_(ours[name])
    i, j = torch.arange(T).unsqueeze(1), torch.arange(T).unsqueeze(0)
    masked = ~((j <= i) & (j > i - model.context))  # (True: not attended, as nn.MultiheadAttention reads it)

    def run(x: torch.Tensor, start: torch.Tensor):
        e = embed(x) + sinusoid(start + torch.arange(x.shape[0]).unsqueeze(1), H).to(dtype)
        return enc(e.transpose(0, 1), mask=masked).transpose(0, 1), ()

    return run, theirs


def _compare(model: Transformer, dtype: torch.dtype, rtol: float) -> dict:
    """The model (in ``dtype``) against torch's encoder in float64 on the same weights: y and the gradients of x
    and every parameter of a loss on y, from a window starting at each row's own step."""
    _, x, R_y, start = _inputs()
    model = model.to(dtype)
    run, theirs = reference(model, torch.float64)
    ours = lambda x, s: (model(x, model.window_state(s))[0], ())  # noqa: E731
    mine, _ = outputs_and_grads(ours, x.to(dtype), start, [R_y], model.named_parameters())
    exact, _ = outputs_and_grads(run, x.double(), start, [R_y], theirs)
    assert len(exact) == 2 + len(theirs)  # y, x's gradient, every parameter's
    return assert_close_scaled(mine, exact, rtol)


@pytest.mark.parametrize("context", [T, 16], ids=["whole-window", "last-16"])
def test_float64_model_equals_torchs_encoder(context):
    # Largest measured (each result's largest difference over its largest magnitude): 1.5e-15.
    _compare(_model(context), torch.float64, rtol=1e-13)


@pytest.mark.parametrize("context", [T, 16], ids=["whole-window", "last-16"])
def test_float32_model_within_rounding_of_torchs_encoder(zoo_case, context):
    # Largest measured over conftest.ZOO_CASES: 1.1e-6 (seed 2, last 16); the float32 epsilon is 1.2e-7.
    _compare(_model(min(context, T)), torch.float32, rtol=5e-6)


@pytest.mark.parametrize("context", [T, 16, 1], ids=["whole-window", "last-16", "itself"])
def test_acting_steps_equal_the_window(context):
    # From a fresh state and from one carried in (a first window's keys), past ``context`` steps: acting with its
    # keys and values cached attends to what the window does. Largest measured: 1.9e-7 of the largest entry.
    model = _model(context)
    x0, x, _, _ = _inputs()
    for state in (model.initial_state(B), model(x0, model.initial_state(B))[1]):
        s = assert_steps_equal_window(model, x, state, of_largest=5e-6)
        keys, values, valid, step = s
        assert keys.shape == values.shape == (LAYERS, B, context, H)
        assert torch.equal(valid, torch.ones(B, context)) and step.dtype == torch.long


def test_a_window_from_a_state_is_the_same_steps_inside_one_window():
    # The second half of one long window, and the same steps as a window carried in from the first half's state.
    model = _model(16)
    x0, x, _, _ = _inputs()
    with torch.no_grad():
        whole, _ = model(torch.cat((x0, x)), None)
        _, state = model(x0, None)
        second, _ = model(x, state)
    assert_close_scaled({"y": second}, {"y": whole[T:]}, of_largest=5e-6)


def test_a_training_window_starts_empty_at_its_step():
    # window_state: a fresh state's empty keys, the count at each window's first step; the steps counted on.
    model = _model(16)
    _, x, _, start = _inputs()
    keys, values, valid, step = model.window_state(start)
    fresh = model.initial_state(B)
    assert all(torch.equal(a, b) for a, b in zip((keys, values, valid), fresh[:3])) and torch.equal(step, start)
    with torch.no_grad():
        assert torch.equal(model(x, (keys, values, valid, step))[1][3], start + T)


def test_options():
    cfg = TransformerConfig()
    assert option_defaults(Transformer) == {"layers": 2, "heads": 4, "context": 64}
    assert (cfg.layers, cfg.heads, cfg.context) == (2, 4, 64)
    with pytest.raises(ValueError, match="policy.transformer.context=0 must be >= 1"):
        Transformer(IN, H, context=0)
    with pytest.raises(ValueError, match="hidden_size=30 must be a multiple of heads=4"):
        Transformer(IN, 30)
