"""FART (pomdp_ffm/seq_models/fart.py) against POPGym's ray_linear_attention.LinearAttention: its sine time
embedding (BaseModel.apply_embedding) followed by its forward_memory, weights copied over, on a window carried in
from a first window's state."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
from popgym_reference import ray_model

from pomdp_ffm.seq_models.fart import FART, FARTConfig
from pomdp_ffm.seq_models.time_embedding import SineTimeEmbedding

I, H, T, B = 12, 32, 64, 8
# POPGym's parts around the memory core (its feature map, heads) and its frozen sine table, compared on its own
OUTSIDE_CORE = ("feature_map.", "actor.", "critic.", "embedding.weight")
# POPGym's cfg names -> ours (the embedding's the same: time_embedding.py)
OPTION_NAMES = {
    "S_aggregator": "s_aggregator",
    "Z_aggregator": "z_aggregator",
    "embedding": "embedding",
    "scale_embedding": "scale_embedding",
}
# Float32 rounding of a different summation order (the scan against POPGym's cumsum, our einsums against its): each
# compared tensor's largest difference within SCALED of its largest entry (a gradient sums 512 steps' terms, so its
# error scales with them, not with each entry). Largest measured over the four cases: 1.03e-6 of the largest entry
# (query.weight's grad, max-S), in absolute terms 1.8e-4 (value.weight's grad, unscaled embedding); outputs 2.0e-7,
# final states 1.1e-7, grads of x 7.2e-7 (unscaled embedding; 2.1e-7 otherwise) and of the carried-in state 2.4e-7
# of their largest entries.
SCALED, ATOL = 5e-6, 1e-7
# The acting steps against the window, the same model, elementwise (measured: output 1.2e-7, final S 3.1e-5 and z
# 2.3e-5 in entries up to ~140).
RTOL_STEP, ATOL_STEP = 1e-5, 1e-6


def _ours(popgym_cfg: dict) -> dict:
    """Our options for POPGym's cfg: its names and values, translated (its embedding None is our "none")."""
    return {OPTION_NAMES[k]: "none" if k == "embedding" and v is None else v for k, v in popgym_cfg.items()}


def _ref_name(ours: str) -> str:
    if ours == "embedding.strength":
        return "embedding_strength"
    return ours if ours.startswith("unmap.") else f"core.{ours}"


def _pair(popgym_cfg: dict, seed: int = 0):
    """POPGym's model and ours with its weights, and the (ours, POPGym's) parameter pairs."""
    torch.manual_seed(seed)
    ref = ray_model("ray_linear_attention", "LinearAttention", I, H, **popgym_cfg)
    with torch.no_grad():  # off their initial values, so that a dropped affine or strength shows
        ref.core.norm.weight.add_(0.3 * torch.randn(I))
        ref.core.norm.bias.add_(0.3 * torch.randn(I))
        if ref.cfg["scale_embedding"]:
            ref.embedding_strength.fill_(0.3)
    ours = FART(I, H, **_ours(popgym_cfg))
    theirs = dict(ref.named_parameters())
    pairs, used = [], set()
    for name, p in ours.named_parameters():
        ref_name = _ref_name(name)
        assert ref_name in theirs and ref_name not in used, name
        used.add(ref_name)
        with torch.no_grad():
            p.copy_(theirs[ref_name])
        pairs.append((name, p, theirs[ref_name]))
    left = set(theirs) - used
    if popgym_cfg.get("embedding", "sine") is None:
        left.discard("embedding_strength")  # POPGym makes it whether or not it embeds (when it scales)
    assert left and all(n.startswith(OUTSIDE_CORE) for n in left), left
    return ref, ours, pairs


def _ref_forward(ref, x: torch.Tensor, state: list, t_starts: torch.Tensor):
    """POPGym's BaseModel.forward from the feature map's output on: x [B, T, I]."""
    if ref.cfg["embedding"] is not None:
        x = ref.apply_embedding(x, t_starts)
    return ref.forward_memory(ref.pre(x), state, t_starts, torch.full((x.shape[0],), x.shape[1]))


def _carried_in(ref, gen: torch.Generator):
    """The state after a first random window through POPGym (batch first, [B, 1, ...]) and its steps t_starts."""
    h = ref.h
    t0 = torch.randint(0, 1024 - 2 * T, (B,), generator=gen)
    with torch.no_grad():
        zeros = [torch.zeros(B, 1, h, h), torch.zeros(B, 1, h)]
        _, state = _ref_forward(ref, torch.randn(B, T, I, generator=gen), zeros, t0)
    return state, t0 + T


def _close(ours: torch.Tensor, theirs: torch.Tensor, what: str) -> None:
    assert ours.shape == theirs.shape, what
    diff, scale = (ours - theirs).abs().max().item(), theirs.abs().max().item()
    assert diff <= SCALED * scale + ATOL, f"{what}: largest difference {diff:.3g}, largest entry {scale:.3g}"


@pytest.mark.parametrize(
    "popgym_cfg",
    [
        {},
        {"S_aggregator": "max", "Z_aggregator": "sum"},
        {"S_aggregator": "sum", "Z_aggregator": "max", "embedding": None},
        {"scale_embedding": False},
    ],
    ids=["defaults", "max-S", "max-Z-no-embedding", "unscaled-embedding"],
)
def test_matches_popgym(popgym_cfg):
    ref, ours, pairs = _pair(popgym_cfg)
    gen = torch.Generator().manual_seed(1)
    (S_in, z_in), t_in = _carried_in(ref, gen)
    x = torch.randn(T, B, I, generator=gen)
    h = ours.width
    g_y, g_S = torch.randn(T, B, H, generator=gen), torch.randn(B, h, h, generator=gen)
    g_z = torch.randn(B, h, generator=gen)

    ref_x = x.transpose(0, 1).clone().requires_grad_()
    ref_S, ref_z = S_in.clone().requires_grad_(), z_in.clone().requires_grad_()
    ref_y, (ref_S_out, ref_z_out) = _ref_forward(ref, ref_x, [ref_S, ref_z], t_in)
    ((ref_y * g_y.transpose(0, 1)).sum() + (ref_S_out[:, 0] * g_S).sum() + (ref_z_out[:, 0] * g_z).sum()).backward()

    ours_x = x.clone().requires_grad_()
    ours_S, ours_z = S_in[:, 0].clone().requires_grad_(), z_in[:, 0].clone().requires_grad_()
    y, (S_out, z_out, t_out) = ours(ours_x, (ours_S, ours_z, t_in.clone()))
    ((y * g_y).sum() + (S_out * g_S).sum() + (z_out * g_z).sum()).backward()

    _close(y, ref_y.transpose(0, 1), "output")
    _close(S_out, ref_S_out[:, 0], "final S")
    _close(z_out, ref_z_out[:, 0], "final z")
    assert torch.equal(t_out, t_in + T)
    for name, p, q in pairs:
        _close(p.grad, q.grad, f"grad {name}")
    _close(ours_x.grad, ref_x.grad.transpose(0, 1), "grad x")
    _close(ours_S.grad, ref_S.grad[:, 0], "grad carried-in S")
    _close(ours_z.grad, ref_z.grad[:, 0], "grad carried-in z")


@pytest.mark.parametrize("embedding", ["sine", "none"])
def test_acting_steps_match_the_window(embedding):
    torch.manual_seed(2)
    ours = FART(I, H, embedding=embedding)
    with torch.no_grad():
        ours.norm.bias.normal_()
        x = torch.randn(T, B, I)
        h = ours.width
        state = (torch.rand(B, h, h), torch.rand(B, h) + 1, torch.randint(0, 500, (B,)))
        y, last = ours(x, state)
        steps, s = [], state
        for t in range(T):
            y_t, s = ours(x[t : t + 1], s)
            steps.append(y_t)
    torch.testing.assert_close(torch.cat(steps), y, rtol=RTOL_STEP, atol=ATOL_STEP)
    for a, b in zip(s, last):
        torch.testing.assert_close(a, b, rtol=RTOL_STEP, atol=ATOL_STEP)
    assert torch.equal(s[2], state[2] + T)


def test_steps_past_popgyms_table_and_fresh_state():
    ours = FART(I, H)
    x = torch.randn(T, 2, I)
    h = ours.width
    y, (_, _, t) = ours(x, (torch.zeros(2, h, h), torch.zeros(2, h), torch.tensor([5000, 0])))
    assert torch.isfinite(y).all() and t.tolist() == [5000 + T, T]
    y0, (S, z, t0) = ours(x)  # None: a zero state at step 0
    torch.testing.assert_close(y0[:, 1], y[:, 1])
    assert S.shape == (2, h, h) and z.shape == (2, h) and t0.tolist() == [T, T]


def test_the_strength_is_used_clamped_and_bound_clamps_it():
    ours = FART(I, H)
    x = torch.randn(4, 2, I)
    with torch.no_grad():
        ours.embedding.strength.fill_(1.7)
    y = ours(x)[0]
    assert ours.embedding.strength.item() == pytest.approx(1.7)  # a call writes nothing
    ours.bound_()  # (the agent's update, after each optimiser write)
    assert ours.embedding.strength.item() == 1.0
    torch.testing.assert_close(ours(x)[0], y, rtol=0, atol=0)  # the call had used it clamped


def test_options_and_sizes():
    ref = ray_model("ray_linear_attention", "LinearAttention", I, H)
    defaults = {f.name: f.default for f in dataclasses.fields(FARTConfig)}
    signature = {k: p.default for k, p in inspect.signature(FART.__init__).parameters.items() if k in defaults}
    assert defaults == signature
    assert _ours({k: ref.cfg[k] for k in OPTION_NAMES}) == {k: defaults[k] for k in OPTION_NAMES.values()}
    # the shared embedding as POPGym's (time_embedding.py; its code against POPGym's table and the options' rules,
    # one set for the five models using it: test_zoo_windowed.py)
    emb = FART(I, H).embedding
    assert type(emb) is SineTimeEmbedding and (emb.width, emb.horizon, emb.scaled) == (I, ref.max_seq_len, True)
    assert FART(I, H).width == ref.h == 5 and FART(I, 128).width == 10
    assert FART(I, 3).width == 1
    with pytest.raises(ValueError, match="hidden_size >= 3"):
        FART(I, 2)
    with pytest.raises(ValueError, match="s_aggregator"):
        FART(I, H, s_aggregator="mean")
