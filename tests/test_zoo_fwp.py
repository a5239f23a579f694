"""FWP (pomdp_ffm/seq_models/fwp.py) against POPGym's ray_fwp.FastWeightProgrammer: its sine time
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

from pomdp_ffm.seq_models.fwp import FWP
from pomdp_ffm.seq_models.time_embedding import SineTimeEmbedding

I, H, T, B = 12, 32, 64, 8
SEED = 0  # added to every generator seed here (conftest.ZOO_CASES sets it, and the sizes above)
# POPGym's cfg names -> ours (the embedding's the same: time_embedding.py)
OPTION_NAMES = {
    "aggregator": "aggregator",
    "sum_normalization": "sum_normalization",
    "embedding": "embedding",
    "scale_embedding": "scale_embedding",
}
# Float32 rounding of a different summation order (the scan against POPGym's cumsum, our einsums against its): each
# compared tensor's largest difference within SCALED of its largest entry (a gradient sums 512 steps' terms, so its
# error scales with them, not with each entry). Largest measured over the four cases: 1.63e-6 of the largest entry
# (query.weight's grad, unscaled embedding), in absolute terms 3.4e-4 (the same grad, entries up to ~210); outputs
# 1.4e-7, final W 1.1e-7, grads of x 7.2e-7 (unscaled embedding; 1.3e-7 otherwise) and of the carried-in W 1.2e-7
# of their largest entries.
SCALED, ATOL = 5e-6, 1e-7
# The acting steps against the window, the same model, elementwise (measured: output 2.4e-7, final W 1.5e-5 in
# entries up to ~110).
RTOL_STEP, ATOL_STEP = 1e-5, 1e-6


@pytest.mark.parametrize(
    "popgym_cfg",
    [{}, {"aggregator": "max"}, {"sum_normalization": False, "embedding": None}, {"scale_embedding": False}],
    ids=["defaults", "max", "unnormalised-no-embedding", "unscaled-embedding"],
)
def test_matches_popgym(popgym_cfg, zoo_case):
    ref, ours, pairs = attention_pair(
        "ray_fwp", "FastWeightProgrammer", FWP, (I, H), popgym_cfg, OPTION_NAMES, seed=SEED
    )
    gen = torch.Generator().manual_seed(SEED + 1)
    h = ours.width
    t0 = torch.randint(0, 1024 - 2 * T, (B,), generator=gen)
    (W_in,), t_in = popgym_state_after(ref, [torch.zeros(B, 1, h, h)], torch.randn(B, T, I, generator=gen), t0)
    x = torch.randn(T, B, I, generator=gen)
    g_y, g_W = torch.randn(T, B, H, generator=gen), torch.randn(B, h, h, generator=gen)

    def popgym(x, state):  # on our layout: time first, the state without POPGym's time axis
        W, t = state
        y, (W_out,) = popgym_forward(ref, x.transpose(0, 1), [W.unsqueeze(1)], t)
        return y.transpose(0, 1), (W_out[:, 0],)

    state = (W_in[:, 0], t_in)
    theirs, _ = outputs_and_grads(popgym, x, state, [g_y, g_W], {n: q for n, _, q in pairs})
    mine, (_, t_out) = outputs_and_grads(ours, x, state, [g_y, g_W], {n: p for n, p, _ in pairs})
    assert_close_scaled(mine, theirs, SCALED, atol=ATOL)  # outputs, final W, every gradient
    assert torch.equal(t_out, t_in + T)


@pytest.mark.parametrize("embedding", ["sine", "none"])
def test_acting_steps_match_the_window(embedding):
    torch.manual_seed(SEED + 2)
    ours = FWP(I, H, embedding=embedding)
    with torch.no_grad():
        ours.norm.bias.normal_()
    x = torch.randn(T, B, I)
    h = ours.width
    state = (torch.randn(B, h, h), torch.randint(0, 500, (B,)))
    s = assert_steps_equal_window(ours, x, state, rtol=RTOL_STEP, atol=ATOL_STEP)
    assert torch.equal(s[1], state[1] + T)


def test_steps_past_popgyms_table_and_fresh_state():
    ours = FWP(I, H)
    x = torch.randn(T, 2, I)
    h = ours.width
    y, (_, t) = ours(x, (torch.zeros(2, h, h), torch.tensor([5000, 0])))
    assert torch.isfinite(y).all() and t.tolist() == [5000 + T, T]
    y0, (W, t0) = ours(x)  # None: a zero state at step 0
    torch.testing.assert_close(y0[:, 1], y[:, 1])
    assert W.shape == (2, h, h) and t0.tolist() == [T, T]


def test_the_strength_is_used_clamped_and_bound_clamps_it():
    assert_strength_used_clamped(FWP(I, H), I)


def test_options_and_sizes():
    ref = ray_model("ray_fwp", "FastWeightProgrammer", I, H)
    defaults = option_defaults(FWP)
    theirs = popgym_options({k: ref.cfg[k] for k in OPTION_NAMES}, OPTION_NAMES)
    assert theirs == {k: defaults[k] for k in OPTION_NAMES.values()}
    # the shared embedding as POPGym's (time_embedding.py; its code against POPGym's table and the options' rules,
    # one set for the five models using it: test_zoo_windowed.py)
    emb = FWP(I, H).embedding
    assert type(emb) is SineTimeEmbedding and (emb.width, emb.horizon, emb.scaled) == (I, ref.max_seq_len, True)
    assert FWP(I, H).width == ref.h == 6 and FWP(I, 128).width == 11 and FWP(I, 1).width == 1
    with pytest.raises(ValueError, match="aggregator"):
        FWP(I, H, aggregator="mean")
    with pytest.raises(ValueError, match="embedding"):
        FWP(I, H, embedding="learned")
