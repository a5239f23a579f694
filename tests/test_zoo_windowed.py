"""Stack, TCN and PosMLP against POPGym's Framestack, Frameconv and MLP (the table's Fr.Stack, TCN and PosMLP), with
POPGym's default sine time embedding: its ``apply_embedding(z, t_starts)`` then ``forward_memory``, the order of its
BaseModel.forward (its preprocessor the identity). Also the shared time embedding itself (time_embedding.py), for
these three and FART and FWP: its code against POPGym's table, and its options, one set for the five models."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch
from popgym_reference import AROUND_THE_MEMORY, copy_weights, popgym_forward, ray_model
from zoo_checks import acting_steps, assert_close_scaled, leaves, option_defaults, outputs_and_grads, section_of

from pomdp_ffm.options import EMBEDDING_RULE, HORIZON_RULE, StackConfig
from pomdp_ffm.seq_models.fart import FART
from pomdp_ffm.seq_models.fwp import FWP
from pomdp_ffm.seq_models.posmlp import PosMLP
from pomdp_ffm.seq_models.stack import Stack
from pomdp_ffm.seq_models.tcn import TCN
from pomdp_ffm.seq_models.time_embedding import SineTimeEmbedding

IN, H, T, B = 12, 32, 64, 8
SEED = 0  # added to every generator seed here (conftest.ZOO_CASES sets it, and the sizes above)
HORIZON = 1024  # POPGym's max_seq_len in its experiments (ppo.py's bptt_cutoff), its sine table's length
# Measured largest differences over test_window_equals_popgym's cases: outputs and final windows 0 (bit for bit),
# the gradients of x and of the carried-in window 2.4e-7; the parameters' gradients (entries up to ~40, sums over
# the T B rows taken in another order, time-major here) up to 6.7e-7 of their largest entry: GRAD_TOL's atol
# (of_largest) is relative to it.
TOL = dict(rtol=1e-5, atol=1e-6)
GRAD_TOL = dict(rtol=1e-5, of_largest=2e-6)


# Our parameter -> POPGym's, per model (the embedding's strength lives in POPGym's BaseModel).
_MLP = {f"core.{i}.{p}": f"core.{i}.{p}" for i in (0, 2) for p in ("weight", "bias")}
MODELS = {
    "stack": (
        Stack,
        "ray_framestack",
        "Framestack",
        {**_MLP, "compress.weight": "compress.weight", "compress.bias": "compress.bias"},
    ),
    "tcn": (TCN, "ray_frameconv", "Frameconv", {"core.weight": "core.weight", "core.bias": "core.bias"}),
    "posmlp": (PosMLP, "ray_mlp", "MLP", dict(_MLP)),
}
# POPGym's parameters outside the memory: its feature map, actor and critic heads, and the frozen sine table
# (compared in test_sine_code_equals_popgyms_table).
_OUTSIDE = AROUND_THE_MEMORY + ("embedding.weight",)


def _pair(name: str, ours_opts: dict | None = None, ref_cfg: dict | None = None, strength: float | None = 0.3):
    """Ours and POPGym's, ours holding POPGym's weights (each parameter of either side used exactly once)."""
    cls, module, ref_cls, mapping = MODELS[name]
    torch.manual_seed(SEED + 0)
    horizon = (ours_opts or {}).get("embedding_horizon", HORIZON)  # POPGym's max_seq_len
    ref = ray_model(module, ref_cls, IN, H, max_seq_len=horizon, **(ref_cfg or {}))
    ours = cls(IN, H, **(ours_opts or {}))
    mapping = dict(mapping)
    if ref.cfg["embedding"] is not None and ref.cfg["scale_embedding"]:
        mapping["embedding.strength"] = "embedding_strength"
        if strength is not None:
            with torch.no_grad():
                ref.embedding_strength.fill_(strength)  # off the shared init 0.5, so that a missed copy shows
    # (POPGym makes the strength even with no embedding, which then reads it nowhere)
    outside = _OUTSIDE + (("embedding_strength",) if ref.cfg["embedding"] is None else ())
    copy_weights(ours, ref, mapping, outside)
    return ours, ref, mapping


def _window(name: str, k: int):
    """A carried-in window [B, k - 1, IN] (none for PosMLP) and mid-episode step counts whose window fits
    POPGym's table (its index past max_seq_len fails)."""
    g = torch.Generator().manual_seed(SEED + 1)
    window = None if name == "posmlp" else torch.randn(B, k - 1, IN, generator=g)
    steps = torch.randint(0, HORIZON - T + 1, (B,), generator=g)
    steps[0], steps[1] = 0, HORIZON - T  # an episode's first window and the table's last
    return window, steps


def _run_both(ours, ref, mapping, window, steps, x):
    """Outputs, final windows and every gradient of a loss on outputs and final window, both sides
    (``outputs_and_grads``' dicts, each parameter's gradient by our name), and our final state."""
    g = torch.Generator().manual_seed(SEED + 2)
    weights = [torch.randn(T, B, H, generator=g)] + ([] if window is None else [torch.randn(window.shape, generator=g)])
    state = steps if window is None else (window, steps)

    def popgym(x, state):  # our layout, and POPGym's t_ends as the final steps
        w, t = (None, state) if window is None else state
        y, st = popgym_forward(ref, x.transpose(0, 1), [] if w is None else [w], t)
        return y.transpose(0, 1), (t + T if w is None else (st[0], t + T))

    ref_params = dict(ref.named_parameters())
    theirs, ref_last = outputs_and_grads(popgym, x, state, weights, {n: ref_params[m] for n, m in mapping.items()})
    mine, last = outputs_and_grads(ours, x, state, weights, ours.named_parameters())
    assert torch.equal(leaves(last)[-1], leaves(ref_last)[-1]) and leaves(last)[-1].dtype == torch.long
    return mine, theirs, last


def _without(tensors: dict, names: list) -> dict:
    return {k: v for k, v in tensors.items() if k not in names}


def _max(a, b):
    return (a - b).abs().amax().item() if a.numel() else 0.0


@pytest.mark.parametrize(
    "name, opts, cfg",
    [
        ("stack", {}, {}),
        ("stack", {"stack_size": 2}, {"stack_size": 2}),
        ("stack", {"stack_size": 1}, {"stack_size": 1}),
        ("stack", {"embedding": "none"}, {"embedding": None}),
        ("tcn", {}, {}),
        ("tcn", {"stack_size": 3}, {"stack_size": 3}),  # (3 does not divide 32)
        ("tcn", {"scale_embedding": False}, {"scale_embedding": False}),
        ("posmlp", {}, {}),
        ("posmlp", {"scale_embedding": False}, {"scale_embedding": False}),
        ("posmlp", {"embedding_horizon": 256}, {}),  # POPGym's table then 256 long: its max_seq_len is the base
    ],
)
def test_window_equals_popgym(name, opts, cfg, zoo_case):
    horizon = opts.get("embedding_horizon", HORIZON)
    ours, ref, mapping = _pair(name, opts, cfg)
    if name == "tcn" and opts.get("stack_size") == 3:
        # past POPGym's assertion that k divides h, which its convolution (built at h = 32) does not need
        ref.cfg["hidden_size"] = 33
    k = getattr(ours, "stack_size", 1)
    window, steps = _window(name, k)
    steps = steps % (horizon - T + 1)
    x = torch.randn(T, B, IN, generator=torch.Generator().manual_seed(SEED + 3))
    mine, theirs, _ = _run_both(ours, ref, mapping, window, steps, x)
    grads = [f"grad {n}" for n in mapping]
    assert_close_scaled(_without(mine, grads), _without(theirs, grads), **TOL)  # outputs, final window, x, window
    assert_close_scaled({g: mine[g] for g in grads}, {g: theirs[g] for g in grads}, **GRAD_TOL)


# The five models on the shared embedding and POPGym's (module, class) of each, its default cfg embedding "sine".
EMBEDDED = {
    "stack": (Stack, "ray_framestack", "Framestack"),
    "tcn": (TCN, "ray_frameconv", "Frameconv"),
    "posmlp": (PosMLP, "ray_mlp", "MLP"),
    "fart": (FART, "ray_linear_attention", "LinearAttention"),
    "fwp": (FWP, "ray_fwp", "FastWeightProgrammer"),
}


def test_sine_code_equals_popgyms_table():
    """PE(t) below the horizon equals POPGym's table (positional_encoding), bit for bit on a CPU, at its horizon
    and another, and each of the five models' embedding the table POPGym's model builds (its frozen
    ``embedding.weight``); an odd width drops the last cosine (POPGym's table needs an even one)."""
    from popgym.baselines.models.embeddings import positional_encoding

    for width, horizon in ((IN, HORIZON), (64, 1024), (12, 300)):
        code = SineTimeEmbedding(width, horizon).code(torch.arange(horizon))
        assert torch.equal(code, positional_encoding(horizon, width))
    for cls, module, ref_cls in EMBEDDED.values():
        ref = ray_model(module, ref_cls, IN, H, max_seq_len=HORIZON)
        code = cls(IN, H).embedding.code(torch.arange(HORIZON))
        assert ref.embedding.weight.shape == (HORIZON, IN) and torch.equal(code, ref.embedding.weight), cls
    t = torch.arange(100)
    freq = torch.exp(torch.arange(0, 5, 2, dtype=torch.float64) * (-math.log(100) / 5))  # 3 sines, 2 cosines
    odd = SineTimeEmbedding(5, 100).code(t).double()
    torch.testing.assert_close(odd[:, 0::2], torch.sin(t[:, None] * freq), rtol=0, atol=1e-5)
    torch.testing.assert_close(odd[:, 1::2], torch.cos(t[:, None] * freq[:2]), rtol=0, atol=1e-5)  # measured 6.4e-7


def test_time_index_past_popgyms_table():
    """POPGym's lookup fails past max_seq_len; ours continues the sinusoid (float64 reference, within the float32
    rounding of t N^(-2i/d), at most ~t eps), and stays finite at any index."""
    ours, ref, _ = _pair("posmlp")
    with pytest.raises(IndexError):
        ref.apply_embedding(torch.zeros(1, 2, IN), torch.tensor([HORIZON - 1]))
    emb = ours.embedding
    t = torch.arange(HORIZON, 8 * HORIZON)
    freq = torch.exp(torch.arange(0, IN, 2, dtype=torch.float64) * (-math.log(HORIZON) / IN))
    angle = t.double()[:, None] * freq
    exact = torch.stack((angle.sin(), angle.cos()), -1).flatten(-2)
    assert _max(emb.code(t).double(), exact) < 8 * HORIZON * 2**-23  # t eps: measured 1.7e-4 (2.0e-5 below N)
    y, steps = ours(torch.randn(3, 2, IN), torch.tensor([2**40, 2**62]))
    assert torch.isfinite(y).all() and steps.tolist() == [2**40 + 3, 2**62 + 3]


@pytest.mark.parametrize("name", list(MODELS))
def test_acting_step_by_step_equals_window(name):
    ours = MODELS[name][0](IN, H)
    window, steps = _window(name, 4)
    state0 = steps if window is None else (window, steps)
    x = torch.randn(24, B, IN, generator=torch.Generator().manual_seed(SEED + 4))
    y_seq, s_seq, y_steps, state = acting_steps(ours, x, state0)
    torch.testing.assert_close(y_steps, y_seq, rtol=1e-5, atol=1e-6)  # measured 0 (CPU)
    for got, want in zip(ours.state_tensors(state), ours.state_tensors(s_seq)):
        assert torch.equal(got, want)
    assert torch.equal(ours.state_tensors(state)[-1], steps + 24)


@pytest.mark.parametrize("name", list(MODELS))
def test_strength_out_of_range_is_used_clamped_and_bound(name):
    """POPGym clamps the embedding strength's data to [0, 1] at each call; ours uses the clamped value (the same
    output and gradient) and ``bound_`` (the owner's, after each write) and load_state_dict clamp the parameter."""
    ours, ref, mapping = _pair(name, strength=1.4)
    with torch.no_grad():
        ours.embedding.strength.fill_(1.4)
    window, steps = _window(name, getattr(ours, "stack_size", 1))
    x = torch.randn(T, B, IN, generator=torch.Generator().manual_seed(SEED + 5))
    mine, theirs, _ = _run_both(ours, ref, mapping, window, steps, x)
    assert ref.embedding_strength.item() == 1.0 and ours.embedding.strength.item() == pytest.approx(1.4)
    assert_close_scaled({"y": mine["y"]}, {"y": theirs["y"]}, **TOL)
    strength = "grad embedding.strength"
    assert_close_scaled({strength: mine[strength]}, {strength: theirs[strength]}, **GRAD_TOL)
    ours.bound_()
    assert ours.embedding.strength.item() == 1.0
    state = ours.state_dict()
    state["embedding.strength"] = torch.tensor([-0.5])
    ours.load_state_dict(state)
    assert ours.embedding.strength.item() == 0.0


def test_fresh_state_starts_the_episode():
    """State None is a zero window at step 0: the time index starts at 0 and the window before the episode is 0."""
    for cls in (Stack, TCN, PosMLP):
        model = cls(IN, H)
        x = torch.randn(5, 3, IN)
        y, state = model(x)
        y0, _ = model(x, model.initial_state(3))
        assert torch.equal(y, y0)
        tensors = model.state_tensors(state)
        assert torch.equal(tensors[-1], torch.full((3,), 5))
        if cls is not PosMLP:  # the last 3 embedded inputs, batch-first
            embedded = model.embedding(x, torch.zeros(3, dtype=torch.long))
            assert tensors[0].shape == (3, 3, IN) and torch.equal(tensors[0], embedded[2:].transpose(0, 1))


def _popgym_class(name: str) -> type:
    """POPGym's class of a model in EMBEDDED (built once through ray_model, which lets its module import without
    Ray, so that a test run alone finds it)."""
    _, module, ref_cls = EMBEDDED[name]
    return type(ray_model(module, ref_cls, IN, H))


def test_options_default_to_popgyms():
    for cls, ref in ((Stack, _popgym_class("stack")), (TCN, _popgym_class("tcn")), (PosMLP, _popgym_class("posmlp"))):
        fields = option_defaults(cls)
        assert (
            ref.MODEL_CONFIG["embedding"] == "sine"
            and fields["scale_embedding"] == ref.BASE_CONFIG["scale_embedding"]  # BaseModel's
        )
        if "stack_size" in fields:
            assert fields["stack_size"] == ref.MODEL_CONFIG["stack_size"] and fields["embedding"] == "sine"


def test_embedding_options_are_one_set():
    """The five models' embedding options: the same names, defaults (POPGym's) and rules (options.py's), in their
    option sections, the constructors' only ones (option_defaults); the switch in every model but PosMLP (always
    embedded); "none" turns the embedding off, POPGym's None is refused."""
    want = {"embedding": ("sine", EMBEDDING_RULE), "embedding_horizon": (HORIZON, HORIZON_RULE)}
    want["scale_embedding"] = (_popgym_class("fart").BASE_CONFIG["scale_embedding"], None)
    for name, (cls, _, _) in EMBEDDED.items():
        fields = {f.name: f for f in dataclasses.fields(section_of(cls))}
        option_defaults(cls)
        names = set(want) - ({"embedding"} if name == "posmlp" else set())
        assert names <= set(fields) and not (set(want) - names) & set(fields), name
        for option in names:
            default, rule = want[option]
            assert fields[option].default == default, (name, option)
            assert fields[option].metadata.get("rule") is rule, (name, option)
        if "embedding" in names:
            assert cls(IN, H, embedding="none").embedding is None
            with pytest.raises(ValueError, match="embedding=None must be of type str"):
                cls(IN, H, embedding=None)
        with pytest.raises(ValueError, match="embedding_horizon=0 must be >= 1"):
            cls(IN, H, embedding_horizon=0)
        assert not cls(IN, H, scale_embedding=False).embedding.scaled and cls(IN, H).embedding.horizon == HORIZON


def test_stack_needs_its_size_to_divide_the_width():
    with pytest.raises(ValueError, match="hidden_size=30 must be a multiple of stack_size=4"):
        Stack(IN, 30)
    with pytest.raises(ValueError, match=r"policy.rnn_hidden_size=30 must be a multiple of policy.stack.stack_size=4"):
        StackConfig().check_chosen("policy.stack", SimpleNamespace(rnn_hidden_size=30))
    StackConfig().check_chosen("policy.stack", SimpleNamespace(rnn_hidden_size=32))
    TCN(IN, 30)  # the convolution takes any width
