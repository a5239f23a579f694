"""``python -m pomdp_ffm.bench ledger``: the ledger's figures (patches/001, 004, 014, 019, 020, 021) measured on the
machine at hand.

Each figure compares two computations of one quantity: the project's form against the reference's, float32 against
float64, a fused step against the default one. Their last bits depend on the CPU's kernels (how a matmul blocks its
sums, how a libm rounds a sine), so the figures are printed here with the machine they came from, and
tests/test_ledger_measurements.py asserts on them only the bounds that hold on any IEEE-754 machine. The reference's
forms are written out from its code: the update's in reference_form.py (``policies/models/policy_rnn.py``), the
Polyak average's and the log-probability's here (``torchkit/pytorch_utils.py``, ``policies/models/actor.py``); they
serve these measurements only.
"""

from __future__ import annotations

import copy
import math
import os
import platform
import re
from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torch.distributions import Normal
from torch.nn import functional as F

from ..agent import RecurrentAgent
from ..buffer import Batch
from ..catalog import COMPARED
from ..nets import HALF_LOG_2PI
from ..optim import AdamForm
from ..seq_models import build
from ..seq_models.ffm import reference_decay_limit
from ..seq_models.recurrence import AGGREGATE, aggregate_loop
from ..update import mean_grad_norm, soft_update_
from .common import Row
from .reference_form import (
    FORM_B,
    FORM_CASES,
    FORM_T,
    form_differences,
    papers_shape_agent,
    papers_shape_batches,
    small_agent,
    td3_gru_updates_apart,
    ulp,
    updated,
    window_batch,
)

EPS32 = 2.0**-23  # float32's spacing at 1


def machine() -> str:
    """The CPU, torch's build and the kernel paths it takes: what the figures depend on."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    config = torch.__config__.show()
    mkl = re.search(r"Math Kernel Library Version ([0-9.]+)", config)
    onednn = re.search(r"MKL-DNN (v\S+)", config)
    libs = [f"MKL {mkl[1]}" if mkl else "no MKL", f"oneDNN {onednn[1]}" if onednn else "no oneDNN"]
    paths = [
        f"{k}={os.environ[k]}"
        for k in ("ATEN_CPU_CAPABILITY", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
        if k in os.environ
    ]
    isa = torch.backends.cpu.get_cpu_capability()
    under = f" under {' '.join(paths)}" if paths else ""
    return (
        f"{cpu}; torch {torch.__version__} (ATen {isa}, {', '.join(libs)}){under}; {torch.get_num_threads()} thread(s)"
    )


# --------------------------------------------------------------------------------------------------
# patches/001 and 020: FFM's aggregators in complex64 against the recurrence in complex128.

M, C, B_AGG = 32, 4, 4
OMEGA = 2 * math.pi / torch.linspace(1.0, 128.0, C)  # the default init's context (periods 1 ... 128)
SLOW_ALPHA = torch.cat([torch.tensor([1e-8, 1e-6, 1e-4, 1e-3]), torch.linspace(0.002, 0.05, M - 4)])
DEFAULT_ALPHA = torch.linspace(reference_decay_limit() - 0.01, -math.log(0.01) / 128, M)  # the default init's
AGGREGATOR_LENGTHS = (64, 200, 1100, 4096)


def gamma(alpha: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """gamma = exp(-alpha + i omega) of the float32 parameters, formed in ``dtype``'s real precision."""
    a, w = alpha.to(dtype), OMEGA.to(dtype)
    return torch.polar(torch.exp(-a).unsqueeze(1).expand(M, C), w.expand(M, C))


def _state_relative_error(got: torch.Tensor, truth: torch.Tensor) -> float:
    """max over steps t and batch rows b of |S_t,b - S*_t,b| / |S*_t,b|, Frobenius norms over the [m, c] state."""
    d = (got.to(torch.complex128) - truth).flatten(-2).norm(dim=-1)
    return (d / truth.flatten(-2).norm(dim=-1)).max().item()


def aggregator_errors(alpha: torch.Tensor, T: int, seed: int = 0) -> dict[str, float]:
    """Each aggregator's largest relative state error against the complex128 recurrence of the float32 parameters
    (``name``), and against the complex128 recurrence of its own complex64 gamma (``name arithmetic``: the gamma's
    rounding taken as exact, so only the aggregator's arithmetic is left)."""
    torch.manual_seed(seed)
    u = torch.randn(T, B_AGG, M)
    s0 = torch.zeros(B_AGG, M, C, dtype=torch.complex64)
    truth = aggregate_loop(u.double(), gamma(alpha, torch.float64), s0.to(torch.complex128))
    gamma32 = gamma(alpha, torch.float32)
    same_gamma = aggregate_loop(u.double(), gamma32.to(torch.complex128), s0.to(torch.complex128))
    out = {}
    for name, aggregate in AGGREGATE.items():  # loop, scan, assoc, closed
        got = aggregate(u, gamma32, s0)
        out[name] = _state_relative_error(got, truth)
        out[name + " arithmetic"] = _state_relative_error(got, same_gamma)
    return out


# --------------------------------------------------------------------------------------------------
# patches/014: the gradient-norm statistics, a float32 mean on the device, against the reference's float64 mean.


def gradient_norm_statistics(updates: int = 3) -> dict[str, float]:
    """Over SAC and TD3 x the compared memories, after ``updates`` updates: the largest relative distance of each
    logged gradient norm from the reference's float64 mean of the same per-tensor norms (utils/helpers.py
    get_grad_norm), how many of them differ at all, of how many, and whether each equals the same norms averaged
    in float32 here (``same_mean_failures``: must be 0)."""
    worst, differ, n, not_same = 0.0, 0, 0, 0
    for algo in ("sac", "td3"):
        for model in COMPARED:
            agent = small_agent(algo, model)
            for i in range(updates):
                stats = updated(agent, window_batch(12, 6, seed=i), grad_norms=True)
            modules = {
                "q_grad_norm": agent.critic,
                "q_rnn_grad_norm": agent.critic.encoder.memory,
                "pi_grad_norm": agent.actor,
                "pi_rnn_grad_norm": agent.actor.encoder.memory,
            }
            for key, module in modules.items():
                grads = [p.grad for p in module.parameters() if p.grad is not None]
                here = torch.stack([g.norm(2) for g in grads]).mean()
                not_same += int(not (torch.equal(stats[key], here) and torch.equal(stats[key], mean_grad_norm(module))))
                reference = np.mean([g.norm(2).item() for g in grads])
                worst = max(worst, abs(stats[key].item() - reference) / reference)
                differ, n = differ + int(stats[key].item() != reference), n + 1
    return {"worst_relative": worst, "differ": differ, "of": n, "same_mean_failures": not_same}


# --------------------------------------------------------------------------------------------------
# patches/019: SAC's Gaussian log-probability, ours (from eps) against the reference's (from z), float32.

LOG_STD_BANDS = ((-20.0, -7.0), (-7.0, -5.0), (-5.0, -3.0), (-3.0, 2.0))


def log_probability_errors(lo: float, hi: float, n: int = 200_000, seed: int = 0) -> dict[str, float]:
    """Over ``n`` draws with log_std in [lo, hi] and pre-tanh means in [-3, 3]: the largest |reference - ours| and
    each form's largest error against float64 of the same draw, in nats."""
    g = torch.Generator().manual_seed(seed)
    mean = torch.rand(n, generator=g) * 6 - 3
    log_std = lo + (hi - lo) * torch.rand(n, generator=g)
    eps = torch.randn(n, generator=g)
    z = mean + log_std.exp() * eps  # as TanhGaussianHead.sample, float32
    reference = Normal(mean, log_std.exp()).log_prob(z).double()  # policies/models/actor.py
    ours = (-0.5 * eps.square() - log_std - HALF_LOG_2PI).double()
    truth = -0.5 * eps.double().square() - log_std.double() - HALF_LOG_2PI
    return {
        "apart": (reference - ours).abs().max().item(),
        "ours_error": (ours - truth).abs().max().item(),
        "reference_error": (reference - truth).abs().max().item(),
    }


# --------------------------------------------------------------------------------------------------
# patches/020: the fused Adam step against the default one, the losses eager, from the same weights, batches and
# random numbers.


def fused_adam_drift(make: Callable[[AdamForm], RecurrentAgent], batches: list[Batch], seed: int) -> list[float]:
    """max |fused - default| over every parameter and buffer after each update; ``make(adam)``: an agent, its
    weights the same whatever ``adam``."""
    runs = []
    for adam in (AdamForm(), AdamForm(fused=True)):
        agent = make(adam)
        torch.manual_seed(seed)
        runs.append([])
        for batch in batches:
            updated(agent, batch)
            runs[-1].append([v.detach().clone() for v in agent.state_dict().values()])
    return [max((a - b).abs().max().item() for a, b in zip(x, y)) for x, y in zip(*runs)]


# --------------------------------------------------------------------------------------------------
# patches/021: Polyak averaging and FFM's output gate as lerp.

TAU = 0.005


def polyak_step_ulps(seed: int = 0) -> dict[str, float]:
    """One Polyak step of three layers (two a few steps ahead of their target, one unrelated to it), in ulps of
    max(|target|, |source|): the largest distance of soft_update_ from the reference's formula, and each one's
    largest error against float64; ``share``: the elements where the two differ."""
    torch.manual_seed(seed)
    source = nn.Sequential(nn.Linear(64, 256), nn.Linear(256, 256), nn.Linear(256, 64))
    target = copy.deepcopy(source)
    with torch.no_grad():
        for p in source.parameters():
            p.add_(1e-3 * torch.randn_like(p))
        for p in list(target.parameters())[-2:]:
            p.uniform_(-0.1, 0.1)
    before = [p.detach().clone() for p in target.parameters()]
    soft_update_(target, source, TAU)
    apart, ours_err, ref_err, differ, n = 0.0, 0.0, 0.0, 0, 0
    for t, s, got in zip(before, source.parameters(), target.parameters()):
        s, got = s.detach(), got.detach()
        reference = t * (1.0 - TAU) + s * TAU  # torchkit/pytorch_utils.py soft_update_from_to
        truth = t.double() * (1 - TAU) + s.double() * TAU
        scale = ulp(torch.maximum(t.abs(), s.abs()))
        apart = max(apart, ((got.double() - reference.double()).abs() / scale).max().item())
        ours_err = max(ours_err, ((got.double() - truth).abs() / scale).max().item())
        ref_err = max(ref_err, ((reference.double() - truth).abs() / scale).max().item())
        differ, n = differ + int((got != reference).sum()), n + got.numel()
    return {"apart": apart, "ours_error": ours_err, "reference_error": ref_err, "share": differ / n}


def polyak_long_run(steps: int = 2000, n: int = 20_000) -> dict[str, float]:
    """``steps`` Polyak steps of a moving source: each form's largest error relative to max(|average|, |source|)
    and its median signed error relative to the float64 average."""
    g = torch.Generator().manual_seed(1)
    t0 = torch.rand(n, generator=g) * 0.2 - 0.1
    source, ours, reference, truth = t0.clone(), nn.Parameter(t0.clone()), t0.clone(), t0.double()
    lerp_net, src_net = nn.Module(), nn.Module()
    lerp_net.p, src_net.p = ours, nn.Parameter(source)
    for _ in range(steps):
        with torch.no_grad():
            source.add_(1e-4 * torch.randn(source.shape, generator=g))  # the online net moving
        soft_update_(lerp_net, src_net, TAU)
        reference = reference * (1.0 - TAU) + source * TAU
        truth = truth * (1 - TAU) + source.double() * TAU
    scale = torch.maximum(truth.abs(), source.double().abs())
    ours = ours.detach().double()
    return {
        "ours_error": ((ours - truth).abs() / scale).max().item(),
        "reference_error": ((reference.double() - truth).abs() / scale).max().item(),
        "ours_bias": ((ours - truth) / truth).median().item(),
        "reference_bias": ((reference.double() - truth) / truth).median().item(),
    }


def output_gate_ulps(seed: int = 0) -> dict[str, float]:
    """FFM's output gate, lerp(thru, LN(z), gate), against the reference's z * gate + thru * (1 - gate)
    (standalone/ffm/ffm.py), from the same parts, in ulps of max(|LN(z)|, |thru|): the two forms' largest distance
    and each one's largest error against float64 (``share``: the outputs where they differ); ``model``: the model's
    own output against the lerp of the parts as recomputed here."""
    torch.manual_seed(seed)
    ffm = build("ffm", input_size=8, hidden_size=128)
    with torch.no_grad():
        ffm.pre.bias.normal_(0, 1)  # spread the gates over (0, 1)
    x = torch.randn(64, 16, 8)
    with torch.no_grad():
        y, _ = ffm(x)
        y_in, thru, in_gate, out_gate = torch.split(ffm.pre(x), ffm.split_sizes, dim=-1)
        S = aggregate_loop(y_in * torch.sigmoid(in_gate), ffm.gamma(), ffm.initial_state(16))
        z = F.layer_norm(ffm.mix(torch.view_as_real(S).reshape(64, 16, -1)), (128,))
        gate = torch.sigmoid(out_gate)
    ours = torch.lerp(thru, z, gate)
    reference = z * gate + thru * (1 - gate)
    truth = z.double() * gate.double() + thru.double() * (1 - gate.double())
    scale = ulp(torch.maximum(z.abs(), thru.abs()))
    in_ulps = lambda a, b: ((a.double() - b.double()).abs() / scale).max().item()
    return {
        "model": in_ulps(y, ours),
        "apart": in_ulps(ours, reference),
        "ours_error": in_ulps(ours, truth),
        "reference_error": in_ulps(reference, truth),
        "share": (ours != reference).float().mean().item(),
    }


# --------------------------------------------------------------------------------------------------


def run() -> list[Row]:
    """Every figure, printed per ledger entry as it is measured."""
    print(f"machine: {machine()}")
    rows: list[Row] = []

    def add(entry: str, shape: str, case: str, values: dict[str, float]) -> None:
        for metric, value in values.items():
            rows.append(Row(f"ledger {entry}", shape, case, metric, value, ""))
            print(f"  {entry}  {shape:<28} {case:<16} {metric:<20} {value:.3g}")

    for T in AGGREGATOR_LENGTHS:
        add("001", f"m={M} c={C} B={B_AGG} T={T}", "slow decays", aggregator_errors(SLOW_ALPHA, T))
    add("001", f"m={M} c={C} B={B_AGG} T=4096", "default decays", aggregator_errors(DEFAULT_ALPHA, 4096))
    for algo, model in FORM_CASES:
        figures = form_differences(small_agent(algo, model), window_batch(FORM_T, FORM_B))
        add("004", f"h=32 T={FORM_T} B={FORM_B}", f"{algo}-{model}", figures)
    figures = form_differences(papers_shape_agent("td3", "gru"), papers_shape_batches(1)[0])
    add("004", "BLT shape T=64 B=64", "td3-gru", figures)
    for i, figures in enumerate(td3_gru_updates_apart()):
        add("004", f"h=32 T={FORM_T} B={FORM_B}", f"td3-gru update {i + 1}", figures)
    add("014", "h=32 T=12 B=6, 3 updates", ",".join(COMPARED), gradient_norm_statistics())
    for lo, hi in LOG_STD_BANDS:
        add("019", "200000 draws", f"log_std {lo:g}..{hi:g}", log_probability_errors(lo, hi))
    for algo in ("sac", "td3"):
        for model in COMPARED:
            drift = fused_adam_drift(
                lambda adam: small_agent(algo, model, adam=adam), [window_batch(12, 6, i) for i in range(5)], 5
            )
            add("020", "h=32 T=12 B=6", f"{algo}-{model}", {f"after update {i + 1}": d for i, d in enumerate(drift)})
    drift = fused_adam_drift(lambda adam: papers_shape_agent("td3", "gru", adam), papers_shape_batches(5), 0)
    add("020", "BLT shape T=64 B=64", "td3-gru", {f"after update {i + 1}": d for i, d in enumerate(drift)})
    add("021", "64-256-256-64 layers", "one step", polyak_step_ulps())
    add("021", "20000 weights", "2000 steps", polyak_long_run())
    add("021", "h=128 T=64 B=16", "ffm output gate", output_gate_ulps())
    return rows
