"""``train.compile``: the one update through torch.compile (pomdp_ffm/update.py, patches/020-compiled-update.md).
Compiled against eager on a CPU: the same losses and parameters after SAC and TD3 updates to a float32 tolerance,
no graph break, a seed axis compiled equal to its seeds compiled alone, a compile failure as one line naming the
switch. Compiling takes tens of seconds (minutes for an unrolled GRU or LSTM), so all but the failure are slow;
tests/test_cuda.py runs the compiled path on a GPU at the paper's shape."""

import copy

import pytest
import torch
from test_agent import make_agent, make_batch

from pomdp_ffm.graph import CompileError, UpdateRunner
from pomdp_ffm.seq_models.recurrence import AGGREGATE
from pomdp_ffm.update import EAGER, Aligned, compiled_losses

# Measured on this suite's small agents (5 updates): losses agree to 2e-6 relative, parameters to 1e-4 absolute
# (Adam's scale-free step turns a last-bit difference in a near-zero gradient into up to lr = 3e-4 per step).
LOSS_RTOL, PARAM_ATOL = 1e-5, 5 * 3e-4


def updates(runner, agent, n=5):
    torch.manual_seed(11)
    stats = [{k: float(v) for k, v in runner(make_batch(i % 3)).items()} for i in range(n)]
    return stats, {k: v.detach().clone() for k, v in agent.state_dict().items()}


def assert_close_updates(out, ref):
    (stats, params), (ref_stats, ref_params) = out, ref
    for st, rs in zip(stats, ref_stats):
        assert st.keys() == rs.keys()
        for k in rs:
            assert st[k] == pytest.approx(rs[k], rel=LOSS_RTOL, abs=1e-6), (k, st[k], rs[k])
    for k, v in ref_params.items():
        torch.testing.assert_close(params[k], v, rtol=0, atol=PARAM_ATOL, msg=k)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["sac", "td3"])
@pytest.mark.parametrize("model", ["ffm", "gru", "lstm"])
def test_compiled_updates_equal_the_eager_updates(algo, model):
    eager, compiled = make_agent(algo, model), make_agent(algo, model)
    ref = updates(UpdateRunner(eager, cuda_graph=False), eager)
    out = updates(UpdateRunner(compiled, cuda_graph=False, compile=True), compiled)
    assert_close_updates(out, ref)


@pytest.mark.slow
def test_a_compiled_update_in_real_arithmetic_equals_the_eager_update():
    # The form a compiled update takes on CUDA (FFM's associative scan on (re, im) pairs, fused Adam), here on a
    # CPU through inductor's generic scan (minutes to compile), against the eager update with the complex loop.
    from pomdp_ffm.config import FFMConfig

    eager, compiled = make_agent("sac", "ffm"), make_agent("sac", "ffm", ffm=FFMConfig(aggregator="assoc"))
    ref = updates(UpdateRunner(eager, cuda_graph=False), eager)
    out = updates(UpdateRunner(compiled, cuda_graph=False, compile=True), compiled)
    assert_close_updates(out, ref)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_each_compiled_part_is_one_graph(algo):
    # fullgraph=True makes a graph break an error; explain() also counts graphs and breaks, independently of it.
    agent = make_agent(algo, "ffm")
    s = Aligned.from_batch(make_batch(), "cpu")
    policy_out = agent.actor(*s.history)[0] if agent.algo.shares_actor_pass else None
    for fn, args in (
        (EAGER.actor_pass, (agent, s)),
        (EAGER.critic_loss, (agent, s, policy_out)),
        (EAGER.actor_loss, (agent, s, policy_out)),
    ):
        report = torch._dynamo.explain(fn)(*args)
        assert (report.graph_count, report.graph_break_count) == (1, 0), (fn.__name__, report.break_reasons)
    assert compiled_losses() is compiled_losses()  # built once per process


@pytest.mark.slow
def test_a_seed_axis_compiled_equals_its_seeds_compiled_alone():
    agents = [make_agent("sac", "ffm", seed=k) for k in range(2)]
    alone = [copy.deepcopy(a) for a in agents]
    joint = UpdateRunner(agents, cuda_graph=False, compile=True)
    torch.manual_seed(3)
    together = [joint.update_all([make_batch(i), make_batch(i + 1)]) for i in range(3)]
    runners = [UpdateRunner(a, cuda_graph=False, compile=True) for a in alone]
    torch.manual_seed(3)
    turns = [[r(make_batch(i + k)) for k, r in enumerate(runners)] for i in range(3)]
    for st_joint, st_turns in zip(together, turns):
        for a, b in zip(st_joint, st_turns):
            assert {k: float(v) for k, v in a.items()} == {k: float(v) for k, v in b.items()}
    for a, b in zip(agents, alone):
        for (k, x), y in zip(a.state_dict().items(), b.state_dict().values()):
            assert torch.equal(x, y), k


def test_a_failed_compile_is_one_line_naming_the_switch(monkeypatch):
    from pomdp_ffm import update as update_mod

    def breaks(agent, s, policy_out=None):
        print("a print is a graph break")  # (dynamo cannot put a print in a graph: under fullgraph, an error)
        return agent.critic(s.head(s.masks.shape[0]), s.actions[1:])

    monkeypatch.setattr(
        update_mod,
        "compiled_losses",
        lambda: update_mod.Losses(*(torch.compile(breaks, fullgraph=True, backend="eager") for _ in range(3))),
    )
    agent = make_agent("sac", "ffm")
    before = copy.deepcopy(agent.state_dict())
    with pytest.raises(CompileError) as e:
        UpdateRunner(agent, cuda_graph=False, compile=True)(make_batch())
    assert len(str(e.value).splitlines()) == 1 and "train.compile=false" in str(e.value)
    assert all(torch.equal(v, before[k]) for k, v in agent.state_dict().items())  # no step was taken
    assert agent.num_updates == 0


def test_the_associative_scan_equals_the_loop():
    # The recurrence as an associative scan over (gamma, u) pairs (the compiled CUDA path) against the chunked loop,
    # in float64 (torch's generic scan on a CPU: the same combine function inductor lowers on a GPU), forward and
    # backward (whose adjoint is the reverse scan).
    torch.manual_seed(0)
    T, B, m, c = 65, 3, 8, 4
    u = torch.randn(T, B, m, dtype=torch.float64, requires_grad=True)
    gamma = torch.polar(
        torch.exp(-torch.rand(m, 1, dtype=torch.float64) * 0.7).expand(m, c),
        torch.rand(1, c, dtype=torch.float64).expand(m, c) * 6,
    ).requires_grad_()
    s0 = torch.randn(B, m, c, dtype=torch.complex128, requires_grad=True)
    w = torch.randn(T, B, m, c, dtype=torch.complex128)
    results = []
    for method in ("loop", "assoc"):
        S = AGGREGATE[method](u, gamma, s0)
        torch.view_as_real(S * w).sum().backward()
        results.append([S.detach(), u.grad, gamma.grad, s0.grad])
        u.grad = gamma.grad = s0.grad = None
    for name, a, b in zip(("S", "grad u", "grad gamma", "grad s0"), *results):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=name)


def _ffm_pass(ffm, x, state):
    """Output, last state and every gradient of a loss over both."""
    ffm.zero_grad(set_to_none=True)
    y, last = ffm(x, state)
    (y.square().sum() + torch.view_as_real(last).sum()).backward()
    return [y.detach(), last.detach(), *(p.grad for p in ffm.parameters())]


@pytest.mark.parametrize("with_state", [False, True])
def test_ffm_in_real_arithmetic_equals_its_complex_loop(with_state):
    # aggregator="assoc" (the compiled CUDA path) runs FFM's recurrence on (re, im) pairs, gamma and state included,
    # with the adjoint written out in real arithmetic; the loop runs it in complex numbers. float64 throughout.
    from pomdp_ffm.seq_models import FFM

    torch.manual_seed(0)
    T, B = 33, 3
    x = torch.randn(T, B, 5, dtype=torch.float64)
    ffms = {}
    for method in ("loop", "assoc"):
        torch.manual_seed(1)
        ffms[method] = FFM(5, 64, aggregator=method).double().bounded_by_owner()
    m, c = ffms["loop"].memory_size, ffms["loop"].context_size
    state = torch.randn(B, m, c, dtype=torch.complex128) if with_state else None
    out, ref = (_ffm_pass(ffms[m], x, state) for m in ("assoc", "loop"))
    for name, a, b in zip(["y", "last state", *(n for n, _ in ffms["loop"].named_parameters())], out, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)


def test_no_complex_operator_reaches_the_compiler():
    # Inductor leaves complex operators to eager kernels, each a launch of its own on a GPU; in the compiled path
    # (aggregator "assoc") FFM's training pass, forward and backward, is real arithmetic from input to loss.
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified

    from pomdp_ffm.seq_models import FFM

    def complex_nodes(aggregator):
        graphs = []

        def keep(gm, _):
            graphs.append(gm)
            return make_boxed_func(gm.forward)

        def backend(gm, inputs):
            return aot_module_simplified(gm, inputs, fw_compiler=keep, bw_compiler=keep)

        torch._dynamo.reset()
        ffm = FFM(5, 64, aggregator=aggregator).bounded_by_owner()
        loss = torch.compile(lambda x: ffm(x)[0].square().sum(), backend=backend, fullgraph=True)
        loss(torch.randn(9, 2, 5)).backward()
        assert len(graphs) == 2  # forward, backward
        vals = [n.meta.get("val") for g in graphs for n in g.graph.nodes]
        return sum(torch.is_tensor(v) and v.is_complex() for v in vals)

    assert complex_nodes("loop") > 0  # (what the check sees where the recurrence is complex)
    assert complex_nodes("assoc") == 0


@pytest.mark.slow
def test_ffm_in_real_arithmetic_compiled_equals_the_eager_loop():
    # Through inductor (on a CPU its generic scan; on CUDA one Triton kernel a direction) against the eager complex
    # loop, float32: output, last state and gradients to the measured 1e-6 relative, with room.
    from pomdp_ffm.seq_models import FFM

    torch.manual_seed(0)
    x = torch.randn(16, 4, 5)
    ffms = {}
    for method in ("loop", "assoc"):
        torch.manual_seed(1)
        ffms[method] = FFM(5, 64, aggregator=method).bounded_by_owner()
    compiled = torch.compile(_ffm_pass)  # (backward() is a graph break: the pass is compiled around it)
    out, ref = compiled(ffms["assoc"], x, None), _ffm_pass(ffms["loop"], x, None)
    for name, a, b in zip(["y", "last state", *(n for n, _ in ffms["loop"].named_parameters())], out, ref):
        err = ((a - b).abs().max() / b.abs().max()).item()
        print(f"{name}: {err:.1e}")
        assert err < 1e-5, name
