"""The ledger's figures (patches/001, 004, 014, 019, 020, 021) held to bounds that hold on any IEEE-754 machine.

The figures themselves are measured by ``python -m pomdp_ffm.bench ledger`` (pomdp_ffm/bench/ledger.py) on the
machine at hand: how many last bits two computations of one quantity share depends on the CPU's kernels, so it is
printed there, never asserted here. Each bound below is derived from the arithmetic (how many roundings, of what
size, can reach a result), with the figure measured on one machine beside it for scale.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributions import Normal

from pomdp_ffm.bench import ledger
from pomdp_ffm.bench.ledger import EPS32
from pomdp_ffm.catalog import COMPARED
from pomdp_ffm.config import PolicyConfig
from pomdp_ffm.nets import TanhGaussianHead
from pomdp_ffm.seq_models.recurrence import AGGREGATE

LR = PolicyConfig().lr


def adam_reach(updates: int) -> float:
    """How far one parameter can move in ``updates`` Adam steps (betas 0.9, 0.999), whatever the gradients: by
    Cauchy-Schwarz, |m_hat| / sqrt(v_hat) <= sqrt(t) at step t while the bias corrections are young, so at most
    lr * sum sqrt(t). Two runs whose gradients differ only in their last bits stay within twice that of each other:
    where a gradient element is near zero, Adam's scale-free step turns a last-bit difference into a whole step."""
    return 2 * LR * sum(math.sqrt(t) for t in range(1, updates + 1))


# --------------------------------------------------------------------------------------------------
# patches/001 and 020: FFM's aggregators in complex64 against the recurrence in complex128.


def gamma_error(alpha: torch.Tensor) -> float:
    """The largest relative error of FFM's complex64 gamma against the same parameters' complex128 gamma."""
    g32, g64 = ledger.gamma(alpha, torch.float32), ledger.gamma(alpha, torch.float64)
    return ((g32.to(torch.complex128) - g64).abs() / g64.abs()).max().item()


@pytest.mark.parametrize("T", ledger.AGGREGATOR_LENGTHS)
def test_aggregator_error_against_complex128_for_slow_decays(T):
    errors = ledger.aggregator_errors(ledger.SLOW_ALPHA, T)
    delta = gamma_error(ledger.SLOW_ALPHA)
    assert delta <= 4 * EPS32, delta  # exp, cos, sin within an ulp each, then a product: a few roundings
    for name in AGGREGATE:  # loop, scan, assoc (patches/020), closed
        # The aggregator's own arithmetic: each of the T steps (or of a scan's log T levels, or of the associative
        # scan's products of gamma's powers) rounds by at most an ulp of the state; at most T of them add up.
        # Measured (one CPU): loop 7.2e-7, scan 2.1e-7, closed 6e-8 at most; assoc ~T eps / 14.
        assert errors[name + " arithmetic"] <= T * EPS32, (name, errors)
        # Against the exact gamma: gamma^t carries t delta, and a state of slow decays sums up to T such powers, so
        # at most T delta on top of the arithmetic. Measured at T = 4096: 7.0e-5 (assoc 8.7e-5) against 9.8e-4.
        assert errors[name] <= T * (delta + EPS32), (name, errors)


def test_aggregator_error_does_not_grow_for_the_default_decays():
    errors = ledger.aggregator_errors(ledger.DEFAULT_ALPHA, 4096)
    # The default decays forget: a rounding t steps back is weighted by |gamma|^t, so the errors sum to at most
    # (delta + eps) / alpha_min whatever T (alpha_min = 0.036 here: 6.6e-6; measured 6.7e-7 at T = 4096).
    horizon = 1 / ledger.DEFAULT_ALPHA.min().item()
    bound = horizon * (gamma_error(ledger.DEFAULT_ALPHA) + EPS32)
    assert max(errors[name] for name in AGGREGATE) <= bound, (bound, errors)


# --------------------------------------------------------------------------------------------------
# patches/004: one update's losses and gradients against the reference's form of them, from the same parameters,
# batch and random numbers. The two forms sum the same terms, the reference's with the dropped step's zeros among
# them, in matmuls of T B or (T + 1) B rows; an LSTM's kernel and FFM's chunks (isqrt(T) steps) can round the first
# T hidden states otherwise over T or T + 1 steps. So they agree to a few roundings of each tensor's scale:
LOSS_ULPS = 64  # a loss sums T B squared errors of Q values that went through a memory and three layers
GRADIENT_RELATIVE = 1e-5  # ~84 eps of the tensor's largest element: each of <= (T + 1) steps adds a rounding


@pytest.mark.parametrize("algo, model", ledger.FORM_CASES, ids=[f"{a}-{m}" for a, m in ledger.FORM_CASES])
def test_update_gradients_against_the_reference_form(algo, model, one_thread):
    figures = ledger.form_differences(ledger.small_agent(algo, model), ledger.window_batch(ledger.FORM_T, 6))
    # measured (one CPU): losses at most 2 ulps apart; gradients by at most 1.3e-6 (FFM), 2e-7 (the others)
    assert figures["losses_ulps"] <= LOSS_ULPS, figures
    assert max(figures["critic_relative"], figures["actor_relative"]) <= GRADIENT_RELATIVE, figures


def test_update_gradients_against_the_reference_form_at_the_papers_shape(one_thread):
    # TD3+GRU at the BLT shape (memory 128, layers 256x256, batch 64 of 64-step windows)
    figures = ledger.form_differences(ledger.papers_shape_agent("td3", "gru"), ledger.papers_shape_batches(1)[0])
    assert figures["losses_ulps"] <= LOSS_ULPS, figures
    assert max(figures["critic_relative"], figures["actor_relative"]) <= GRADIENT_RELATIVE, figures


def test_td3_gru_updates_against_the_reference_form(one_thread):
    # Whole updates (critic step, actor step, Polyak averages) from the same weights, batches and noise.
    apart = ledger.td3_gru_updates_apart(5)
    assert apart[0]["losses_ulps"] <= LOSS_ULPS, apart  # the first losses: the same weights (measured 0)
    # Adam's first step is lr g / (|g| + 1e-8): a last-bit difference in g moves it by a rounding unless |g| is
    # near 1e-8, so after it the parameters are a few roundings apart (measured 2.0e-8 of a tensor's largest) ...
    assert apart[0]["relative"] <= GRADIENT_RELATIVE, apart
    # ... and the later steps can turn a last-bit difference into a whole step (measured 7.3e-7 after 5 updates).
    assert max(a["absolute"] for a in apart) <= adam_reach(5), apart


# --------------------------------------------------------------------------------------------------
# patches/014: the gradient-norm statistics, a float32 mean on the device, against the reference's float64 mean.


def test_gradient_norm_statistics_against_the_reference_mean(one_thread):
    figures = ledger.gradient_norm_statistics()
    assert figures["same_mean_failures"] == 0, figures  # the logged statistic is update.mean_grad_norm's value
    # The same per-tensor norms averaged in float32: a sum of n <= 32 positive terms rounds by at most (n - 1) eps / 2
    # of itself, the division by another half eps (measured 1.7e-7).
    assert figures["worst_relative"] <= 32 * EPS32 / 2, figures


# --------------------------------------------------------------------------------------------------
# patches/019: SAC's Gaussian log-probability, ours (from eps) against the reference's (from z), float32.


@pytest.mark.parametrize("band", ledger.LOG_STD_BANDS)
def test_log_probability_forms_per_log_std_band(band):
    figures = ledger.log_probability_errors(*band)
    # Ours: -0.5 eps^2 - log_std - log(2 pi) / 2, three roundings of results below 64 nats in size (|log_std| <= 20,
    # eps^2 / 2 <= 25 over these draws): at most 1.5 ulps of 32, 5.7e-6 (measured at most 3.8e-6).
    assert figures["ours_error"] <= 6e-6, figures
    if band[1] <= -7.0:
        # The reference's form recovers the draw from z = mean + std eps, which float32 keeps only to ulp(|z|)
        # (2.4e-7 for |mean| near 3): with std <= e^-7 the recovered eps is off by up to ulp(|z|) / std, which is
        # above 1 once log_std < -15, a property of float32 on any machine (measured 15.3 nats).
        assert figures["reference_error"] >= 1.0, figures


def test_the_head_computes_the_log_probability_from_the_draw():
    torch.manual_seed(3)
    mean, log_std = torch.randn(4096, 2) * 2, torch.empty(4096, 2).uniform_(-20.0, -7.0)
    torch.manual_seed(4)
    action, log_prob = TanhGaussianHead.sample(mean, log_std)
    torch.manual_seed(4)
    eps = torch.randn_like(mean)
    torch.testing.assert_close((action, log_prob), TanhGaussianHead.squash(mean, log_std, eps), rtol=0, atol=0)
    tanh_term = torch.log(1 - torch.tanh(mean + log_std.exp() * eps).square() + 1e-6)
    reference = (Normal(mean, log_std.exp()).log_prob(mean + log_std.exp() * eps) - tanh_term).sum(-1, keepdim=True)
    assert (log_prob - reference).abs().max() > 1.0  # in this band the reference's form is off by nats (above)


# --------------------------------------------------------------------------------------------------
# patches/020: the fused Adam step (optim.AdamForm(fused=True)) against the default one, the losses eager, 5 updates
# from the same weights, batches and random numbers. Adam's formula rounded otherwise: a few ulps of the weights
# after the first step (measured 3.0e-8), then at most adam_reach apart (measured after 5 updates: 6.0e-8 at the
# small size over noise seeds 0-9, up to 2.5e-5 at the BLT shape).
FIRST_STEP = 4 * EPS32  # a few roundings of weights below 1 in size


@pytest.mark.parametrize("algo", ["sac", "td3"])
@pytest.mark.parametrize("model", COMPARED)
def test_fused_adam_against_the_default_step(algo, model, one_thread):
    batches = [ledger.window_batch(12, 6, i) for i in range(5)]
    drift = ledger.fused_adam_drift(lambda adam: ledger.small_agent(algo, model, adam=adam), batches, 5)
    assert drift[0] <= FIRST_STEP, drift
    assert max(drift) <= adam_reach(5), drift


@pytest.mark.slow
def test_fused_adam_against_the_default_step_at_the_papers_shape(one_thread):
    make = lambda adam: ledger.papers_shape_agent("td3", "gru", adam)
    drift = ledger.fused_adam_drift(make, ledger.papers_shape_batches(5), seed=0)
    assert drift[0] <= FIRST_STEP, drift
    assert max(drift) <= adam_reach(5), drift


# --------------------------------------------------------------------------------------------------
# patches/021: Polyak averaging and FFM's output gate as lerp. Errors in ulps of the larger input's magnitude.


def test_polyak_step_against_the_reference_formula():
    figures = ledger.polyak_step_ulps()
    # lerp with weight tau < 0.5 is target + tau (source - target): the difference's rounding is scaled by tau, so
    # only the final sum's half ulp is left, plus tau's own float32 rounding (eps / 2 of a step tau times smaller).
    assert figures["ours_error"] <= 0.55, figures  # measured 0.505
    # The reference's t (1 - tau) + s tau: two products and a sum round, and (1 - tau) in float32: up to 1.5 ulps.
    assert figures["reference_error"] <= 1.55, figures  # measured 1.06
    assert figures["apart"] <= 2.1, figures  # measured 1.00


def test_polyak_averages_over_many_steps():
    figures = ledger.polyak_long_run()
    # Each step adds at most ~half an ulp, eps / 2 of the scale, and the average forgets a step's error at rate tau:
    # the errors sum to at most eps / (2 tau) = 1.2e-5 (measured 2.2e-6; the reference's form 8.0e-6).
    assert figures["ours_error"] <= EPS32 / (2 * ledger.TAU), figures
    # Round-to-nearest is unbiased, so the median error of lerp stays at rounding level (measured -5e-9); the
    # reference's weights, rounded to float32, sum to fl(1 - tau) + fl(tau) = 1 + 4.66e-9, an IEEE-754 fact: once
    # the start is forgotten its average sits 4.66e-9 / tau = 9.3e-7 above the true one (measured median 9.4e-7).
    assert abs(figures["ours_bias"]) <= 1e-7, figures
    weights = torch.tensor(1.0 - ledger.TAU, dtype=torch.float32).double() + torch.tensor(ledger.TAU).double()
    expected = (weights.item() - 1) / ledger.TAU
    assert abs(figures["reference_bias"] - expected) <= expected / 2, (figures, expected)


def test_ffm_output_gate_against_the_reference_form():
    figures = ledger.output_gate_ulps()
    # The model's gate is the lerp of its parts (recomputed here with the same kernels, up to the aggregator:
    # measured 0).
    assert figures["model"] <= 2.0, figures
    # lerp: (end - start) rounds by at most an ulp (|end - start| <= 2 max), scaled by a weight <= 1; the product
    # and the sum by half an ulp each: 2 ulps (measured 0.84, 1.10 without FMA).
    assert figures["ours_error"] <= 2.0, figures
    # The reference's z g + thru (1 - g): (1 - g), two products and a sum, half an ulp each: 2 ulps (measured 1.60).
    assert figures["reference_error"] <= 2.0, figures
    assert figures["apart"] <= 4.0, figures  # measured 2.00
