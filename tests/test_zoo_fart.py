"""FART (pomdp_ffm/seq_models/fart.py) against POPGym's ray_linear_attention.LinearAttention: its sine time
embedding (BaseModel.apply_embedding) followed by its forward_memory, weights copied over, on a window carried in
from a first window's state."""

from __future__ import annotations

import pytest
import torch
from popgym_reference import attention_pair, popgym_forward, popgym_options, popgym_state_after, ray_model
from zoo_checks import (
    assert_close_scaled,
    assert_steps_equal_window,
    assert_strength_used_clamped,
    option_defaults,
    outputs_and_grads,
)

from pomdp_ffm.seq_models.fart import FART
from pomdp_ffm.seq_models.time_embedding import SineTimeEmbedding

I, H, T, B = 12, 32, 64, 8
SEED = 0  # added to every generator seed here (conftest.ZOO_CASES sets it, and the sizes above)
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
def test_matches_popgym(popgym_cfg, zoo_case):
    ref, ours, pairs = attention_pair(
        "ray_linear_attention", "LinearAttention", FART, (I, H), popgym_cfg, OPTION_NAMES, seed=SEED
    )
    gen = torch.Generator().manual_seed(SEED + 1)
    h = ours.width
    t0 = torch.randint(0, 1024 - 2 * T, (B,), generator=gen)
    zeros = [torch.zeros(B, 1, h, h), torch.zeros(B, 1, h)]
    (S_in, z_in), t_in = popgym_state_after(ref, zeros, torch.randn(B, T, I, generator=gen), t0)
    x = torch.randn(T, B, I, generator=gen)
    g_y, g_S = torch.randn(T, B, H, generator=gen), torch.randn(B, h, h, generator=gen)
    g_z = torch.randn(B, h, generator=gen)

    def popgym(x, state):  # on our layout: time first, the state without POPGym's time axis
        S, z, t = state
        y, (S_out, z_out) = popgym_forward(ref, x.transpose(0, 1), [S.unsqueeze(1), z.unsqueeze(1)], t)
        return y.transpose(0, 1), (S_out[:, 0], z_out[:, 0])

    state, weights = (S_in[:, 0], z_in[:, 0], t_in), [g_y, g_S, g_z]
    theirs, _ = outputs_and_grads(popgym, x, state, weights, {n: q for n, _, q in pairs})
    mine, (_, _, t_out) = outputs_and_grads(ours, x, state, weights, {n: p for n, p, _ in pairs})
    assert_close_scaled(mine, theirs, SCALED, atol=ATOL)  # outputs, final S and z, every gradient
    assert torch.equal(t_out, t_in + T)


@pytest.mark.parametrize("embedding", ["sine", "none"])
def test_acting_steps_match_the_window(embedding):
    torch.manual_seed(SEED + 2)
    ours = FART(I, H, embedding=embedding)
    with torch.no_grad():
        ours.norm.bias.normal_()
    x = torch.randn(T, B, I)
    h = ours.width
    state = (torch.rand(B, h, h), torch.rand(B, h) + 1, torch.randint(0, 500, (B,)))
    s = assert_steps_equal_window(ours, x, state, rtol=RTOL_STEP, atol=ATOL_STEP)
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
    assert_strength_used_clamped(FART(I, H), I)


def test_options_and_sizes():
    ref = ray_model("ray_linear_attention", "LinearAttention", I, H)
    defaults = option_defaults(FART)
    theirs = popgym_options({k: ref.cfg[k] for k in OPTION_NAMES}, OPTION_NAMES)
    assert theirs == {k: defaults[k] for k in OPTION_NAMES.values()}
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
