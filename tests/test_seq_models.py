"""The registry contract, and FFM's claims: its parallel form equals its recurrence, at any length."""

import math
import re

import pytest
import torch

from pomdp_ffm import catalog
from pomdp_ffm.options import MAX_DECAY_HORIZON, MIN_CLOSED_DECAY_HORIZON
from pomdp_ffm.seq_models import ABLATIONS, SeqModel, available, build, get
from pomdp_ffm.seq_models.ffm import DECAY_MIN, reference_decay_limit
from pomdp_ffm.seq_models.recurrence import (
    aggregate_assoc,
    aggregate_closed,
    aggregate_loop,
    aggregate_scan,
    linear_scan,
    linear_scan_loop,
)
from pomdp_ffm.seq_models.rnn import TorchRNN

MODELS = available()


def test_registry_names_and_errors():
    assert available() == [m.name for m in catalog.BUILT_IN]  # (the order errors list them in)
    with pytest.raises(ValueError, match=rf"^unknown seq model 'hyena'; available: {re.escape(str(MODELS))}$"):
        build("hyena", input_size=4, hidden_size=32)
    with pytest.raises(TypeError, match=r"unknown keyword argument\(s\) \['contex_size'\].*context_size"):
        build("ffm", input_size=4, hidden_size=32, contex_size=2)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("T", [1, 7])
def test_shapes_and_state_round_trip(name, T):
    torch.manual_seed(0)
    model = build(name, input_size=5, hidden_size=64)
    x = torch.randn(T, 3, 5)
    y, state = model(x, None)
    assert y.shape == (T, 3, 64)
    y2, _ = model(x, model.initial_state(3))
    torch.testing.assert_close(y, y2, rtol=0, atol=0)  # None means a fresh zero state
    y3, _ = model(x, state)  # a carried state is accepted as returned
    assert y3.shape == (T, 3, 64)
    with pytest.raises(ValueError, match=r"expects input of shape \[T, B, 5\]"):
        model(torch.randn(T, 3, 4))


@pytest.mark.parametrize("name", MODELS)
def test_each_entry_declares_what_others_need(name):
    model = build(name, input_size=5, hidden_size=64)
    assert isinstance(model.activation_floats(), int) and model.activation_floats() >= 64
    _, state = model(torch.randn(3, 2, 5))
    copy = model.clone_state(state)
    tensors, copies = model.state_tensors(state), model.state_tensors(copy)
    # A carried state has a fresh one's tensors, shapes and dtypes (a captured acting step copies it tensor by tensor).
    fresh = model.state_tensors(model.initial_state(2))
    assert [(t.shape, t.dtype) for t in tensors] == [(t.shape, t.dtype) for t in fresh]
    assert len(copies) == len(tensors)
    for t, c in zip(tensors, copies):
        assert torch.equal(t, c) and t.data_ptr() != c.data_ptr()
    failure = model.compile_failure()
    assert failure is None or (isinstance(failure, str) and "\n" not in failure)


def test_ffm_names_what_fails_to_compile():
    assert build("ffm", input_size=5, hidden_size=32).compile_failure() == (
        "an FFM of one context column (policy.rnn_hidden_size below 64) fails in inductor on CUDA (torch 2.11); use "
        "policy.rnn_hidden_size >= 64 or train.compile=false"
    )


@pytest.mark.parametrize("name", MODELS)
def test_step_by_step_equals_whole_sequence(name):
    # From a state carried in from an earlier window, in float64 so that only a different computation shows.
    torch.manual_seed(1)
    model = build(name, input_size=6, hidden_size=64).double()
    _, carried = model(torch.randn(9, 4, 6, dtype=torch.float64), None)
    x = torch.randn(24, 4, 6, dtype=torch.float64)
    y_seq, s_seq = model(x, model.clone_state(carried))
    state, ys = carried, []
    for t in range(24):
        y, state = model(x[t : t + 1], state)
        ys.append(y)
    torch.testing.assert_close(torch.cat(ys), y_seq, rtol=1e-9, atol=1e-9)
    for a, b in zip(model.state_tensors(state), model.state_tensors(s_seq), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", MODELS)
def test_a_window_starts_where_acting_reaches_with_the_memory_reset(name):
    """A training window's starting state (window_state) is the state acting reaches at the window's first step in
    its episode with the memory part fresh: a state's integer tensors (a step count) as acted, its other tensors a
    fresh state's; a memory without a step count starts from None, a fresh state, as before windows knew their
    step. A window from that state gives what acting gives from it, step by step."""
    torch.manual_seed(2)
    model = build(name, input_size=6, hidden_size=64).double()
    first = torch.tensor([0, 5, 37, 300])
    with torch.no_grad():
        states = [model(torch.randn(int(k), 1, 6, dtype=torch.float64), None)[1] if k else None for k in first]
    fresh = model.state_tensors(model.initial_state(4))
    counts = [i for i, t in enumerate(fresh) if not (t.is_floating_point() or t.is_complex())]
    start = model.window_state(first)
    if not counts:
        assert start is None
        return
    got = model.state_tensors(start)
    assert [(t.shape, t.dtype) for t in got] == [(t.shape, t.dtype) for t in fresh]
    for i, (g, f) in enumerate(zip(got, fresh)):
        if i in counts:  # the step count acting reached
            assert g.tolist() == [0 if s is None else model.state_tensors(s)[i].item() for s in states]
        else:
            assert torch.equal(g, f)
    x = torch.randn(9, 4, 6, dtype=torch.float64)
    y_window, _ = model(x, start)
    state, ys = start, []
    for t in range(9):
        y, state = model(x[t : t + 1], state)
        ys.append(y)
    torch.testing.assert_close(torch.cat(ys), y_window, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", [n for n in available() if issubclass(get(n), TorchRNN)])
def test_rnn_reference_init(name):
    model = build(name, input_size=64, hidden_size=128)
    for pname, p in model.named_parameters():
        if "bias" in pname:
            assert torch.count_nonzero(p) == 0
        else:  # the whole stacked matrix is (semi-)orthogonal, not each gate block
            W = p.detach().double()
            torch.testing.assert_close(W.T @ W, torch.eye(W.shape[1], dtype=torch.float64), atol=1e-5, rtol=0)


def test_parameter_counts_match_reference():
    # docs/reference.md#parameter-counts: GRU(64->128) = 74,496; FFM(64->128, m=32, c=4) = 53,732;
    # LSTM(48->128) = 91,136
    count = lambda m: sum(p.numel() for p in m.parameters())
    assert count(build("gru", input_size=64, hidden_size=128)) == 74_496
    assert count(build("ffm", input_size=64, hidden_size=128)) == 53_732
    assert count(build("lstm", input_size=48, hidden_size=128)) == 91_136


def test_ffm_reference_sizing_and_init():
    ffm = build("ffm", input_size=64, hidden_size=128)
    assert (ffm.memory_size, ffm.context_size) == (32, 4)
    limit = math.log(torch.finfo(torch.float64).max) / 1024 - 0.01
    assert reference_decay_limit() == pytest.approx(0.683147, abs=1e-6) == pytest.approx(limit)
    expected_alpha = torch.linspace(0.673147, 0.035978, 32)
    torch.testing.assert_close(ffm.alpha.detach(), expected_alpha, atol=2e-6, rtol=0)
    expected_omega = torch.tensor([6.2832, 0.14500, 0.073345, 0.049087])
    torch.testing.assert_close(ffm.omega.detach(), expected_omega, atol=1e-4, rtol=1e-4)
    # the reference code's gamma = exp(a + i b): magnitude exp(-alpha), phase +omega (patches/002)
    g = ffm.gamma().detach()
    torch.testing.assert_close(g.abs()[:, 0], torch.exp(-ffm.alpha.detach()))
    torch.testing.assert_close(torch.angle(g[0, 1:]), ffm.omega.detach()[1:])
    # interpretability: trace durability spans [~6.8, 128] steps, periods [1, 128] steps
    t_alpha = ffm.trace_durability(0.01)
    assert t_alpha.max().item() == pytest.approx(128, rel=1e-4)
    assert t_alpha.min().item() == pytest.approx(math.log(100) / 0.673147, rel=1e-4)
    torch.testing.assert_close(ffm.context_periods(), torch.linspace(1, 128, 4), rtol=1e-5, atol=1e-4)


def test_ffm_informed_init():
    ffm = build("ffm", input_size=8, hidden_size=128, init_trace_range=(32, 104), init_period_range=(32, 104))
    torch.testing.assert_close(ffm.trace_durability(0.01), torch.linspace(32, 104, 32), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(ffm.context_periods(), torch.linspace(32, 104, 4), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    "hidden,rule",
    [(16, "at least 32"), (100, "a multiple of its c = h // 32 = 3"), (130, "a multiple of its c = h // 32 = 4")],
)
def test_ffm_unsplittable_hidden_size(hidden, rule):
    with pytest.raises(ValueError, match=rf"FFM cannot split hidden_size={hidden}: it must be {re.escape(rule)} \("):
        build("ffm", input_size=8, hidden_size=hidden)


def test_ffm_explicit_sizes():
    ffm = build("ffm", input_size=8, hidden_size=100, context_size=2, memory_size=10)
    y, s = ffm(torch.randn(3, 2, 8))
    assert y.shape == (3, 2, 100) and s.shape == (2, 10, 2)


# --------------------------------------------------------------------------------------------------
# The aggregator against a float64 sequential reference.


def sequential_reference(u, gamma, s0):
    u, g, s = u.double(), gamma.to(torch.complex128), s0.to(torch.complex128)
    out = []
    for t in range(u.shape[0]):
        s = g * s + u[t].unsqueeze(-1)
        out.append(s)
    return torch.stack(out)


def gamma_from(alpha, omega):
    return torch.polar(
        torch.exp(-alpha).unsqueeze(1).expand(-1, omega.shape[0]), omega.unsqueeze(0).expand(alpha.shape[0], -1)
    )


EXTREME_ALPHAS = {
    "slowest": torch.full((8,), DECAY_MIN),
    "fastest": torch.full((8,), reference_decay_limit()),
    "spread": torch.linspace(reference_decay_limit(), DECAY_MIN, 8),
}


DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T", [1, 64, 1024, 8192])
@pytest.mark.parametrize("decay", list(EXTREME_ALPHAS))
@pytest.mark.parametrize("aggregate", [aggregate_loop, aggregate_scan, aggregate_assoc])
def test_parallel_form_equals_recurrence(T, decay, aggregate, device):
    if aggregate is aggregate_assoc and device == "cuda":
        pytest.skip("on CUDA the associative scan runs compiled (tests/test_cuda.py)")
    torch.manual_seed(T)
    alpha, omega = EXTREME_ALPHAS[decay], torch.tensor([2 * math.pi, 0.145, 0.049])
    gamma = gamma_from(alpha, omega)
    u = torch.randn(T, 2, 8)
    s0 = torch.randn(2, 8, 3, dtype=torch.complex64) * 5  # a non-zero incoming state
    ref = sequential_reference(u, gamma, s0)
    got = aggregate(u.to(device), gamma.to(device), s0.to(device)).cpu()
    assert torch.isfinite(torch.view_as_real(got)).all()
    err = (got.to(torch.complex128) - ref).abs().max() / ref.abs().max()
    # The associative scan multiplies gamma's powers out in float32, so for slow decays its drift grows about
    # linearly with T: measured 6.4e-7 at T = 64, 8.2e-6 at 1024 and 3.6e-5 at 8192 (the loop: 1.2e-6 at 8192).
    tol = 1e-5 + 1e-8 * T if aggregate is aggregate_assoc else 1e-5
    assert err < tol, f"relative error {err:.2e}"


@pytest.mark.parametrize("aggregate", [aggregate_loop, aggregate_scan, aggregate_assoc, aggregate_closed])
def test_aggregators_create_tensors_on_their_inputs_device(aggregate):
    # The meta device stands in for a GPU on a CPU-only machine: a helper tensor made on the default
    # device (the CPU) instead of the inputs' device fails here exactly as it would on CUDA.
    u = torch.empty(16, 2, 8, device="meta", requires_grad=True)
    gamma = torch.empty(8, 3, dtype=torch.complex64, device="meta", requires_grad=True)
    s0 = torch.empty(2, 8, 3, dtype=torch.complex64, device="meta")
    S = aggregate(u, gamma, s0)
    torch.view_as_real(S).sum().backward()
    assert S.device.type == "meta" and S.shape == (16, 2, 8, 3)


def test_reference_closed_form_matches_where_it_is_defined():
    torch.manual_seed(0)
    gamma = gamma_from(torch.linspace(0.6, 0.03, 8), torch.tensor([0.3, 0.1]))
    u, s0 = torch.randn(100, 2, 8), torch.randn(2, 8, 2, dtype=torch.complex64)
    ref = sequential_reference(u, gamma, s0)
    got = aggregate_closed(u, gamma, s0)
    assert ((got.to(torch.complex128) - ref).abs().max() / ref.abs().max()) < 1e-5


@pytest.mark.parametrize("T", [64, 1024])
def test_gradients_match_float64_recurrence(T):
    torch.manual_seed(3)
    ffm = build("ffm", input_size=4, hidden_size=32)  # m=32, c=1
    alpha = torch.linspace(reference_decay_limit(), 1e-4, 32, dtype=torch.float64)
    omega = torch.tensor([0.3], dtype=torch.float64)
    u = torch.randn(T, 2, 32, dtype=torch.float64)
    s0 = torch.randn(2, 32, 1, dtype=torch.complex128)
    w = torch.randn(T, 2, 32, 1, dtype=torch.complex128)  # a fixed random read-out

    def loss(agg, dtype):
        a = alpha.to(dtype).requires_grad_()
        o = omega.to(dtype).requires_grad_()
        x = u.to(dtype).requires_grad_()
        S = agg(x, gamma_from(a, o), s0.to(torch.complex128 if dtype == torch.float64 else torch.complex64))
        L = (torch.view_as_real(S.to(torch.complex128)) * torch.view_as_real(w)).sum()
        return torch.autograd.grad(L, (x, a, o))

    ref = loss(lambda x, g, s: sequential_reference(x, g, s), torch.float64)
    for agg in (aggregate_loop, aggregate_scan):
        got = loss(agg, torch.float32)
        for r, g, name in zip(ref, got, ("input", "alpha", "omega")):
            rel = (g.double() - r).abs().max() / r.abs().max()
            assert rel < 1e-4, f"{agg.__name__} grad wrt {name}: relative error {rel:.2e}"
    del ffm


@pytest.mark.parametrize("method", ["loop", "scan"])
def test_custom_backward_passes_gradcheck(method):
    torch.manual_seed(0)
    for T in (1, 17, 40):
        u = torch.randn(T, 2, 3, 1, dtype=torch.float64, requires_grad=True)
        g = torch.polar(
            torch.rand(1, 1, 3, 2, dtype=torch.float64) * 0.5 + 0.5, torch.randn(1, 1, 3, 2, dtype=torch.float64)
        ).requires_grad_()
        s0 = torch.randn(2, 3, 2, dtype=torch.complex128, requires_grad=True)
        assert torch.autograd.gradcheck(lambda g, u, s0: linear_scan(g, u, s0, method), (g, u, s0))
        # a decay per step
        gates = torch.rand(T, 2, 3, dtype=torch.float64, requires_grad=True)
        x, h0 = torch.randn(T, 2, 3, dtype=torch.float64, requires_grad=True), torch.randn(2, 3, dtype=torch.float64)
        assert torch.autograd.gradcheck(lambda a, x, s0: linear_scan(a, x, s0, method), (gates, x, h0.requires_grad_()))


@pytest.mark.parametrize("aggregate", [aggregate_loop, aggregate_scan])
def test_backward_accepts_expanded_and_conjugate_view_gradients(aggregate):
    # The backward works in place on its own copy of dL/dS: a broadcast (stride-0) or lazily conjugated
    # incoming gradient must give exactly what the materialised one gives.
    torch.manual_seed(0)
    u = torch.randn(40, 3, 8, dtype=torch.float64, requires_grad=True)
    g = torch.polar(torch.rand(8, 2, dtype=torch.float64) * 0.5 + 0.5, torch.randn(8, 2, dtype=torch.float64))
    g.requires_grad_()
    s0 = torch.randn(3, 8, 2, dtype=torch.complex128, requires_grad=True)
    S = aggregate(u, g, s0)
    ones = torch.ones(S.shape, dtype=torch.float64)
    G = torch.randn(S.shape, dtype=torch.complex128)
    for lazy, dense in (
        (torch.complex(ones[:1], ones[:1]).expand(S.shape), torch.complex(ones, ones)),
        (G.conj(), G.conj().resolve_conj()),
    ):
        got = torch.autograd.grad(S, (u, g, s0), grad_outputs=lazy, retain_graph=True)
        want = torch.autograd.grad(S, (u, g, s0), grad_outputs=dense, retain_graph=True)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_million_step_recurrence_stays_finite():
    gamma = gamma_from(torch.tensor([DECAY_MIN, reference_decay_limit()]), torch.tensor([6.2832, 0.05]))
    S = aggregate_loop(torch.ones(10**6, 1, 2), gamma, torch.zeros(1, 2, 2, dtype=torch.complex64))
    assert torch.isfinite(torch.view_as_real(S)).all()
    # with the slowest decay the state keeps (almost) every input: |S| grows like a sum, never explodes
    assert (S[-1, 0, 0].abs() < 1.1e6).all()


@pytest.mark.slow
def test_million_step_acting_loop_stays_finite():
    torch.manual_seed(0)
    ffm = build("ffm", input_size=4, hidden_size=32)
    with torch.no_grad():
        ffm.alpha.fill_(DECAY_MIN)
        state, x = ffm.initial_state(1), torch.randn(1, 1, 4)
        for _ in range(10**6):
            y, state = ffm(x, state)
    assert torch.isfinite(y).all() and torch.isfinite(torch.view_as_real(state)).all()


@pytest.mark.parametrize("device", DEVICES)
def test_ffm_module_parallel_equals_steps_with_incoming_state(device):
    torch.manual_seed(5)
    ffm = build("ffm", input_size=6, hidden_size=64).to(device)
    x, s0 = torch.randn(300, 2, 6, device=device), torch.randn(2, 32, 2, dtype=torch.complex64, device=device)
    y_seq, s_seq = ffm(x, s0)
    state, ys = s0, []
    with torch.no_grad():
        for t in range(300):
            y, state = ffm(x[t : t + 1], state)
            ys.append(y)
    torch.testing.assert_close(torch.cat(ys), y_seq.detach(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state, s_seq.detach(), rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------------------------------
def test_decay_bound_clamps_like_the_reference():
    ffm = build("ffm", input_size=4, hidden_size=32)
    with torch.no_grad():
        ffm.alpha[0], ffm.alpha[1] = 5.0, -1.0
    ffm(torch.randn(3, 1, 4))
    assert ffm.alpha[0].item() == pytest.approx(reference_decay_limit())
    assert ffm.alpha[1].item() == pytest.approx(DECAY_MIN)
    free = build("ffm", input_size=4, hidden_size=32, decay_bound=False)
    with torch.no_grad():
        free.alpha[0] = 5.0
    free(torch.randn(3, 1, 4))
    assert free.alpha[0].item() == 5.0


@pytest.mark.parametrize("hadamard", [False, True])
def test_owner_managed_decay_bound_gives_the_per_call_values(hadamard):
    # patches/014: an owner (the agent) clamps right after its writes; forward then reads nothing on the host
    from test_agent import HostSync, no_host_reads

    torch.manual_seed(0)
    opts = {"decay_context_product": "hadamard"} if hadamard else {}
    standalone = build("ffm", input_size=4, hidden_size=32, **opts)
    managed = build("ffm", input_size=4, hidden_size=32, **opts)
    managed.load_state_dict(standalone.state_dict())
    managed.bounded_by_owner()
    for ffm in (standalone, managed):
        with torch.no_grad():
            ffm.alpha.view(-1)[:3] = torch.tensor([5.0, -1.0, 0.0])  # a write out of the bound
    x = torch.randn(5, 2, 4)
    with no_host_reads(), pytest.raises(HostSync):
        standalone(x)
    with no_host_reads():
        managed(x)  # no host read, and no clamp: the write is the owner's to bound
    assert managed.alpha.view(-1)[0].item() == 5.0
    with no_host_reads():
        managed.bound_()
        y_managed, s_managed = managed(x)
    y_standalone, s_standalone = standalone(x)
    assert torch.equal(managed.alpha, standalone.alpha)
    assert managed.alpha.view(-1)[0].item() == pytest.approx(reference_decay_limit())
    assert managed.alpha.view(-1)[1].item() == pytest.approx(DECAY_MIN)
    assert torch.equal(y_managed, y_standalone) and torch.equal(s_managed, s_standalone)
    free = build("ffm", input_size=4, hidden_size=32, decay_bound=False)
    with torch.no_grad():
        free.alpha[0] = 5.0
    free.bound_()
    assert free.alpha[0].item() == 5.0


@pytest.mark.parametrize("managed", [False, True])
def test_load_state_dict_bounds_the_decay(managed):
    ffm = build("ffm", input_size=4, hidden_size=32)
    ffm.bounded_by_owner(managed)
    state = {k: v.clone() for k, v in ffm.state_dict().items()}
    state["alpha"][0], state["alpha"][1] = 5.0, -1.0
    ffm.load_state_dict(state)
    assert ffm.alpha[0].item() == pytest.approx(reference_decay_limit())
    assert ffm.alpha[1].item() == pytest.approx(DECAY_MIN)
    parent = torch.nn.Sequential(ffm)  # through a parent module's load_state_dict too
    parent.load_state_dict({f"0.{k}": v for k, v in state.items()})
    assert ffm.alpha[0].item() == pytest.approx(reference_decay_limit())


def test_decay_horizon_sets_the_bound_and_the_closed_form_chunks():
    # patches/104: decay_horizon (the reference's max_len) is the horizon the decay bound keeps
    # |gamma|^(-t) representable over; it is not an episode length.
    short = build("ffm", input_size=4, hidden_size=32, decay_horizon=64, aggregator="closed")
    assert short.decay_limit == pytest.approx(reference_decay_limit(64)) == pytest.approx(709.7827 / 64 - 0.01)
    with torch.no_grad():
        short.alpha.fill_(short.decay_limit)  # the fastest decay the bound allows
    x = torch.randn(300, 2, 4)
    y_closed, _ = short(x)  # chunks of 64 steps: with 1024-step chunks |gamma|^(-t) would overflow
    short.aggregator = "loop"
    y_loop, _ = short(x)
    assert torch.isfinite(y_closed).all()
    torch.testing.assert_close(y_closed, y_loop, rtol=1e-4, atol=1e-4)
    for bad, says in ((0, rf"in \[1, {MAX_DECAY_HORIZON}\]"), (MAX_DECAY_HORIZON + 1, "in"), (1.5, "of type int")):
        with pytest.raises(ValueError, match=rf"^policy.ffm.decay_horizon={bad!r} must be {says}"):  # the config's
            build("ffm", input_size=4, hidden_size=32, decay_horizon=bad)
    assert reference_decay_limit(MAX_DECAY_HORIZON) - 0.01 > DECAY_MIN  # the default init's top rate stays > 0


def test_the_closed_form_takes_no_horizon_whose_bound_underflows_gamma():
    # The closed form takes log(gamma), gamma complex64: at the shortest horizon it takes, the fastest decay the
    # bound allows still gives finite outputs and gradients, equal to the loop's; one step shorter is refused
    # (there the default initialisation alone gave a non-finite loss at the first update).
    ok = build("ffm", input_size=4, hidden_size=32, decay_horizon=MIN_CLOSED_DECAY_HORIZON, aggregator="closed")
    with torch.no_grad():
        ok.alpha.fill_(ok.decay_limit)
    x = torch.randn(20, 2, 4)
    y_closed, _ = ok(x)
    y_closed.sum().backward()
    assert torch.isfinite(y_closed).all() and all(torch.isfinite(p.grad).all() for p in ok.parameters())
    ok.aggregator = "loop"
    torch.testing.assert_close(y_closed, ok(x)[0], rtol=1e-4, atol=1e-4)
    with pytest.raises(
        ValueError,
        match=rf"policy.ffm.decay_horizon={MIN_CLOSED_DECAY_HORIZON - 1} must be >= "
        rf"{MIN_CLOSED_DECAY_HORIZON} with policy.ffm.aggregator=closed",
    ):
        build("ffm", input_size=4, hidden_size=32, decay_horizon=MIN_CLOSED_DECAY_HORIZON - 1, aggregator="closed")
    build("ffm", input_size=4, hidden_size=32, decay_horizon=1, aggregator="loop")


def test_acting_gamma_cache_follows_parameter_updates():
    torch.manual_seed(0)
    ffm = build("ffm", input_size=4, hidden_size=32)
    x = torch.randn(1, 1, 4)
    with torch.no_grad():
        y0, _ = ffm(x, ffm.initial_state(1) + 1)
        ffm.omega.add_(0.5)  # what an optimiser step does
        y1, _ = ffm(x, ffm.initial_state(1) + 1)
    with torch.enable_grad():
        y_ref, _ = ffm(x, ffm.initial_state(1) + 1)
    assert not torch.allclose(y0, y1)
    torch.testing.assert_close(y1, y_ref.detach(), rtol=0, atol=0)


@pytest.mark.parametrize("ablation", list(ABLATIONS))
def test_ablations_build_run_and_train(ablation):
    torch.manual_seed(0)
    ffm = build("ffm", input_size=8, hidden_size=64, **ABLATIONS[ablation])
    y, s = ffm(torch.randn(10, 3, 8))
    y.square().mean().backward()
    assert y.shape == (10, 3, 64) and torch.isfinite(y).all()
    names = dict(ffm.named_parameters())
    opts = ABLATIONS[ablation]
    assert ("alpha" in names) == (opts.get("decay", "learned") == "learned")
    assert ("omega" in names) == (opts.get("context", "learned") == "learned")
    if opts.get("decay") == "none":
        assert torch.count_nonzero(ffm.alpha) == 0
    if opts.get("context") == "none":
        assert torch.count_nonzero(ffm.omega) == 0
    if opts.get("decay_context_product") == "hadamard":
        assert ffm.alpha.shape == ffm.omega.shape == (32, 2)
    width = ffm.pre.out_features
    assert width == 32 + 64 + (32 if opts.get("input_gate", True) else 0) + (64 if opts.get("output_gate", True) else 0)


def test_unknown_ffm_option_value():
    with pytest.raises(
        ValueError, match=r"aggregator='fft' is not one of \['auto', 'loop', 'scan', 'assoc', 'closed'\]"
    ):
        build("ffm", input_size=4, hidden_size=32, aggregator="fft")


def test_float64_ffm_trains_with_a_complex128_state():
    ffm = build("ffm", input_size=8, hidden_size=32).double()
    assert ffm.initial_state(2).dtype == torch.complex128
    x = torch.randn(5, 2, 8, dtype=torch.float64, requires_grad=True)
    y, state = ffm(x, None)
    y.sum().backward()
    assert y.dtype == torch.float64 and state.dtype == torch.complex128 and x.grad is not None


def _scan_cases():
    d, c = torch.float64, torch.complex128
    gen = torch.Generator().manual_seed(3)
    rand = lambda *shape, dtype=d: torch.rand(*shape, generator=gen, dtype=dtype)
    randn = lambda *shape, dtype=d: torch.randn(*shape, generator=gen, dtype=dtype)
    for T in (1, 2, 5, 64, 70):  # (70: chunks of 8 and a tail of 6)
        for steps in (T, 1):  # a gate per step, or a constant decay
            yield f"real-T{T}-a{steps}", rand(steps, 3, 4), randn(T, 3, 4), randn(3, 4)
            yield f"broadcast-T{T}-a{steps}", rand(steps, 1, 4), randn(T, 3, 4), None
            yield (
                f"complex-T{T}-a{steps}",
                torch.polar(rand(steps, 1, 4), randn(steps, 1, 4)),
                randn(T, 3, 4, dtype=c),
                None,
            )
            # a complex decay of a real input, from a complex state (S4D's, LRU's)
            yield (
                f"mixed-T{T}-a{steps}",
                torch.polar(rand(steps, 1, 4), randn(steps, 1, 4)),
                randn(T, 3, 4),
                randn(3, 4, dtype=c),
            )
        yield f"summed-T{T}", torch.ones(1, 1, 1, 1, dtype=d), randn(T, 3, 4, 5), randn(3, 4, 5)


@pytest.mark.parametrize("method", ["loop", "scan"])
@pytest.mark.parametrize("name, a, x, s0", list(_scan_cases()), ids=[case[0] for case in _scan_cases()])
def test_the_shared_scan_and_its_backward_equal_the_loop(name, a, x, s0, method):
    def run(fn):
        inputs = [t.clone().requires_grad_(True) for t in (a, x, s0) if t is not None]
        S = fn(*inputs) if s0 is not None else fn(*inputs, None)
        weights = torch.randn(S.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
        loss = (S * weights).real.sum() if S.is_complex() else (S * weights).sum()
        return [S, *torch.autograd.grad(loss, inputs)]

    scan = lambda a, x, s0: linear_scan(a, x, s0, method)
    for got, want in zip(run(scan), run(linear_scan_loop), strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10 * want.abs().max().item())


@pytest.mark.parametrize("name", MODELS)
def test_the_declared_activation_cost_is_what_a_window_saves(name):
    # The memory estimate's share (RecurrentAgent.update_memory) against the bytes autograd keeps for the backward
    # of a [64, 8] window (saved_tensors_hooks; parameters not counted), per batch row and step: within 2x.
    model = build(name, input_size=64, hidden_size=128)
    _, carried = model(torch.randn(64, 8, 64))
    weights = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    storages = {}

    def keep(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        model(torch.randn(64, 8, 64), carried)
    saved = sum(storages.values()) / 4 / (64 * 8)
    assert saved / 2 <= model.activation_floats() <= 2 * saved, (model.activation_floats(), saved)


class _Leaky(SeqModel):
    """A memory that implements the model only: its runtime hooks are Runtime's defaults."""

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        self.cell = torch.nn.Linear(input_size + hidden_size, hidden_size)

    def initial_state(self, batch_size, device=None):
        return torch.zeros(batch_size, self.hidden_size, device=device)

    def forward(self, x, state=None):
        h = self.initial_state(x.shape[1], x.device) if state is None else state
        ys = []
        for x_t in x:
            h = torch.tanh(self.cell(torch.cat([x_t, h], -1)))
            ys.append(h)
        return torch.stack(ys), h


def test_a_memory_that_implements_only_the_model_gets_the_runtimes_defaults():
    model = _Leaky(5, 7)
    # the memory estimate measured: per row and step, what autograd keeps (each step's input to the Linear, its
    # tanh output, 12 + 7 floats), counted here as bytes of the tensors the backward unpacks
    before = torch.random.get_rng_state()
    floats = model.activation_floats()
    assert torch.equal(torch.random.get_rng_state(), before)  # (no draw from the global generator)
    kept = {}
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.setdefault(t.untyped_storage().data_ptr(), t), id):
        model(torch.randn(16, 2, 5), None)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    nbytes = sum(t.untyped_storage().nbytes() for k, t in kept.items() if k not in weights)
    assert floats == math.ceil(nbytes / 4 / (16 * 2)) and floats >= 12 + 7
    assert model.bounded_by_owner() is model and model.compile_failure() is None and not model.compile_pays
    model.drop_caches()  # (nothing cached: a no-op)
    assert model.window_state(torch.tensor([0, 5])) is None  # no step count: a window starts from a fresh state
