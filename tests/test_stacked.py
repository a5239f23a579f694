"""Seeds updated as one over stacked weights (train.seed_axis_update=stacked, pomdp_ffm/stacked.py): each seed's
update is the one it makes alone, but for the random draws and the summation order of batched matmuls."""
from __future__ import annotations

import copy
import io

import numpy as np
import pytest
import torch
from torch.func import functional_call, stack_module_state, vmap

from pomdp_ffm.agent import RecurrentAgent, Streams
from pomdp_ffm.bench.common import DispatchedOps
from pomdp_ffm.config import PolicyConfig, TD3Config
from pomdp_ffm.seq_models.ffm import FFM
from pomdp_ffm.stacked import StackedAgents, joint_step
from pomdp_ffm.train import Refused, validate

OBS, ACT, T, B = 5, 2, 12, 6
SMALL = dict(rnn_hidden_size=32, dqn_layers=[32, 32], policy_layers=[32, 32])


def fixed_noise(x: torch.Tensor) -> torch.Tensor:
    """A stand-in for torch.randn_like that gives every seed the same numbers (a function of the shape only), so
    that a seed's update inside the stack and alone draw the same noise."""
    return torch.sin(torch.arange(x.numel(), dtype=x.dtype, device=x.device).view(x.shape) * 0.37)


def batch(rng: np.random.Generator, dtype=torch.float32) -> tuple[torch.Tensor, ...]:
    f = lambda *s: torch.tensor(rng.standard_normal(s), dtype=dtype)
    masks = torch.ones(T, B, 1, dtype=dtype)
    masks[T - 3:, :2] = 0  # two windows end early: padded steps must stay out of every loss
    return (f(T, B, OBS), torch.tanh(f(T, B, ACT)), f(T, B, 1), torch.zeros(T, B, 1, dtype=dtype), f(T, B, OBS),
            masks)


def streams(rng: np.random.Generator, dtype=torch.float32) -> Streams:
    return Streams.from_batch(batch(rng, dtype), "cpu")


def agents_of(algo: str, model: str, n: int = 3, dtype=torch.float64, **cfg) -> list[RecurrentAgent]:
    out = []
    for k in range(n):
        torch.manual_seed(k)
        out.append(RecurrentAgent(OBS, ACT, PolicyConfig(seq_model=model, algo_name=algo, **SMALL, **cfg)).to(dtype))
    return out


CASES = [("sac", "ffm", {}), ("sac", "mlp", {}), ("td3", "ffm", {"td3": TD3Config(policy_delay=2)}),
         ("td3", "mlp", {})]


# --- FFM's recurrence under vmap ------------------------------------------------------------------------------
@pytest.mark.parametrize("aggregator", ["loop", "scan", "closed"])
def test_ffm_mapped_over_seeds_is_each_seed_alone(aggregator):
    torch.manual_seed(0)
    ffms = [FFM(8, 64, aggregator=aggregator).double() for _ in range(3)]  # 2 context columns
    for k, m in enumerate(ffms):  # seeds with different decays, so a mix-up of seeds' gammas would show
        with torch.no_grad():
            m.alpha.mul_(1 + 0.3 * k)
            m.omega.add_(0.1 * k)
        m.bound_decay_()  # what the module alone does before its call, and the stack's owner before the map
    x = torch.randn(3, 20, 4, 8, dtype=torch.float64)
    params, buffers = stack_module_state(ffms)
    template = copy.deepcopy(ffms[0])
    template.cache_gamma = False
    template.external_decay_bound = True  # its per-call check is a data-dependent branch; its owner bounds
    y = vmap(lambda p, b, x: functional_call(template, (p, b), (x,))[0])(params, buffers, x)
    (y.square().sum() + y.sum()).backward()
    for k, m in enumerate(ffms):
        alone = m(x[k])[0]
        (alone.square().sum() + alone.sum()).backward()
        torch.testing.assert_close(y[k], alone, rtol=1e-12, atol=1e-12)
        for name, p in m.named_parameters():
            torch.testing.assert_close(params[name].grad[k], p.grad, rtol=1e-9, atol=1e-9)


def test_ffm_recurrence_with_a_decay_per_seed_has_the_right_gradients():
    # One gamma per seed ([S, 1, m, c], what the vmap rule passes) and a nonzero, batched starting state.
    from pomdp_ffm.seq_models.ffm import _LinearRecurrence

    torch.manual_seed(0)
    S_, T_, B_, m, c = 2, 5, 3, 4, 2
    u = torch.randn(T_, S_, B_, m, dtype=torch.float64, requires_grad=True)
    gamma = torch.polar(torch.rand(S_, 1, m, c, dtype=torch.float64) * 0.9 + 0.05,
                        torch.randn(S_, 1, m, c, dtype=torch.float64)).requires_grad_()
    s0 = torch.randn(S_, B_, m, c, dtype=torch.complex128, requires_grad=True)
    for method in ("loop", "scan"):
        assert torch.autograd.gradcheck(lambda u, g, s: _LinearRecurrence.apply(u, g, s, method), (u, gamma, s0))
    # and through vmap, against each seed's call
    f = lambda u, g, s: torch.view_as_real(_LinearRecurrence.apply(u, g, s, "loop")).square().sum()
    mapped = torch.func.grad(lambda g, s: vmap(f, in_dims=(1, 0, 0))(u.detach(), g, s).sum(), argnums=(0, 1))
    g_seeds, s_seeds = gamma.detach()[:, 0], s0.detach()
    got = mapped(g_seeds, s_seeds)
    for k in range(S_):
        want = torch.func.grad(f, argnums=(1, 2))(u.detach()[:, k], g_seeds[k], s_seeds[k])
        # (float64 rounding: the mapped call sums over the batch in another order, ~1e-14 measured)
        torch.testing.assert_close(got[0][k], want[0], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(got[1][k], want[1], rtol=1e-10, atol=1e-10)


# --- the update ---------------------------------------------------------------------------------------------------
def run_both(agents, n_updates, rng, dtype, fused_adam=False):
    alone = [copy.deepcopy(a) for a in agents]
    stack = StackedAgents(agents, fused_adam=fused_adam)
    for i in range(n_updates):
        batch = [streams(rng, dtype) for _ in agents]
        grad_norms = i % 3 == 2
        got = stack.device_update(batch, grad_norms, agents[0].actor_step_due())
        for a in agents:
            a.num_updates += 1
        want = [a.update_streams(s, grad_norms) for a, s in zip(alone, batch)]
        yield got, want, alone


@pytest.mark.parametrize("algo, model, extra, fused_adam", [*((*c, False) for c in CASES), (*CASES[0], True)],
                         ids=[*(f"{a}-{m}" for a, m, _ in CASES), "sac-ffm-fused-adam"])
def test_a_stacked_update_is_each_seeds_own_update(monkeypatch, algo, model, extra, fused_adam):
    # float64 and the same noise for the stack and the seeds alone: what is left is the summation order, ~1e-15.
    monkeypatch.setattr(torch, "randn_like", fixed_noise)
    agents = agents_of(algo, model, **extra)
    for got, want, alone in run_both(agents, 6, np.random.default_rng(0), torch.float64, fused_adam):
        for g, w in zip(got, want):
            assert list(g) == list(w)  # the same statistics, in the same order
            torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-12)
    for a, b in zip(agents, alone):
        torch.testing.assert_close(a.state_dict(), b.state_dict(), rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(a.optimizer_state(), b.optimizer_state(), rtol=1e-9, atol=1e-12)
        assert a.num_updates == b.num_updates == 6


def test_a_stacked_float32_update_is_each_seeds_own_to_rounding(monkeypatch):
    # float32: batched matmuls round differently. Measured over 6 SAC+FFM updates: losses within 1e-5 relative.
    # (A parameter whose gradient is near zero can take another Adam step, up to the learning rate, on a
    # rounding difference: its first steps are about lr * sign(gradient). The losses are what a log shows.)
    monkeypatch.setattr(torch, "randn_like", fixed_noise)
    for got, want, _ in run_both(agents_of("sac", "ffm", dtype=torch.float32), 6, np.random.default_rng(1),
                                 torch.float32):
        for g, w in zip(got, want):
            for key in ("qf1_loss", "qf2_loss", "policy_loss", "alpha"):
                torch.testing.assert_close(g[key], w[key], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("algo, model, extra", CASES, ids=[f"{a}-{m}" for a, m, _ in CASES])
@pytest.mark.parametrize("actor_step", [True, False])
def test_a_stacked_update_is_one_set_of_operators_for_any_number_of_seeds(algo, model, extra, actor_step):
    # What stacking is for: on a GPU each operator is a kernel launch. An operator without a batching rule runs once
    # per seed under vmap (torch warns once per process, easily missed), and a read of a value on the host would
    # stall the queue. Outside the optimisers' steps, 2 and 4 seeds dispatch the same operators, none of them a
    # host read, and few more than one agent's update (the streams built once for all seeds; a batched linear
    # layer is a bmm and an add where one agent's is an addmm, in the forward and the backward, without the
    # multiplications by one of vmap's own linear; no copy to hand a weight's gradient over: measured 1.14-1.25x
    # here, 1.3-1.6x before these three).
    rng = np.random.default_rng(0)
    counts = {}
    for n in (1, 2, 4):
        agents = agents_of(algo, model, n=n, dtype=torch.float32, **extra)
        batches = [batch(rng) for _ in range(n)]
        update = (lambda: agents[0].device_update(Streams.from_batch(batches[0], "cpu"), False, actor_step)) \
            if n == 1 else (lambda stack=StackedAgents(agents):
                            stack.device_update(Streams.from_batches(batches, "cpu"), False, actor_step))
        update()  # the optimisers' state is made at a first step
        with DispatchedOps(optimisers=False) as counted:
            update()
        counts[n] = counted
    assert counts[2].ops == counts[4].ops
    assert all(c.ops["aten._local_scalar_dense.default"] == 0 for c in counts.values())
    assert counts[2].ops["aten.copy_.default"] == counts[1].ops["aten.copy_.default"]
    assert counts[1].total < counts[2].total < 1.3 * counts[1].total


def test_the_stacked_seeds_draw_their_own_noise():
    # Without the stand-in: three identical agents on one batch end with three different losses (each seed's
    # sampled actions are its own draw), and the draws come from torch's generator (the same seed, the same ones).
    def losses(seed):
        agents = agents_of("sac", "ffm", dtype=torch.float32)
        for a in agents[1:]:
            a.load_state_dict(agents[0].state_dict())
        s = streams(np.random.default_rng(0))
        torch.manual_seed(seed)
        out = StackedAgents(agents).device_update([s] * 3, False, True)
        return torch.stack([o["policy_loss"] for o in out])

    first = losses(0)
    assert len(set(first.tolist())) == 3
    assert torch.equal(first, losses(0)) and not torch.equal(first, losses(1))


def test_stacked_agents_act_save_and_load_alone(monkeypatch):
    monkeypatch.setattr(torch, "randn_like", fixed_noise)
    agents = agents_of("sac", "ffm", dtype=torch.float32)
    copies = [copy.deepcopy(a) for a in agents]
    stack = StackedAgents(agents)
    obs, prev = np.ones(OBS, np.float32), np.zeros(ACT, np.float32)
    before = agents[1].act(obs, prev, 0.0, None, deterministic=True)[0]  # fills FFM's acting cache of gamma
    stack.device_update([streams(np.random.default_rng(2)) for _ in agents], False, True)
    # Acting sees the update (the cache keyed on the parameters' versions was dropped) ...
    copies[1].load_state_dict(agents[1].state_dict())
    after = agents[1].act(obs, prev, 0.0, None, deterministic=True)[0]
    assert not np.array_equal(before, after)
    np.testing.assert_array_equal(after, copies[1].act(obs, prev, 0.0, None, deterministic=True)[0])
    # ... a checkpoint holds the seed's own tensors only (torch.save writes a view's whole storage) ...
    sizes = []
    for a in (agents[1], copies[1]):
        buf = io.BytesIO()
        torch.save(a.state_dict(), buf)
        sizes.append(len(buf.getvalue()))
    assert sizes[0] == sizes[1]
    # (as a run alone lays them out: a resumed seed acts and updates alone on the same layout, the same rounding)
    assert all(t.is_contiguous() for t in agents[1].state_dict().values())
    assert all(p.is_contiguous() for p in agents[1].parameters())
    # ... and a load writes into the stack: the agents stay linked.
    agents[2].load_training_state(copies[0].training_state())
    assert stack.linked()
    assert torch.equal(stack.stacked["critic.qf1.net.0.weight"][2], copies[0].critic.qf1.net[0].weight)


def test_a_re_allocated_agent_is_stacked_again():
    agents = agents_of("td3", "mlp", dtype=torch.float32)
    stack = StackedAgents(agents)
    agents[0].actor.head.mlp.net[0].weight.data = agents[0].actor.head.mlp.net[0].weight.detach().clone() + 1
    assert not stack.linked()
    stack.ensure_linked()
    assert stack.linked()
    assert torch.equal(stack.stacked["actor.head.mlp.net.0.weight"][0], agents[0].actor.head.mlp.net[0].weight)


def test_the_stacked_gradients_are_laid_out_as_their_parameters():
    # What .backward() guarantees and autograd.grad does not: a weight's gradient in the weight's own strides.
    # Without it CUDA's multi-tensor Adam leaves its fast path (a launch per tensor and operation) and the fused
    # Adam updates the wrong elements.
    agents = agents_of("sac", "ffm", dtype=torch.float32)
    StackedAgents(agents).device_update([streams(np.random.default_rng(0)) for _ in agents], False, True)
    grads = [(n, p) for a in agents for n, p in a.named_parameters() if p.grad is not None]
    assert len(grads) == 3 * len(list(agents[0].parameters())) - 3 * len(list(agents[0].critic_target.parameters()))
    assert [n for n, p in grads if p.grad.stride() != p.stride()] == []


@pytest.mark.parametrize("input_grad", [False, True], ids=["first-layer", "inner-layer"])
def test_the_stacked_linear_layer_is_each_seeds_own(input_grad):
    # The template's x @ W^T + b with its own backward, mapped over 3 seeds: each seed's F.linear, values and
    # gradients (float64: a batched matmul sums in another order), and each weight's gradient laid out as the
    # weight.
    from pomdp_ffm.stacked import _SeedMappedLinear

    torch.manual_seed(0)
    layers = [torch.nn.Linear(5, 7).double() for _ in range(3)]
    template = copy.deepcopy(layers[0])
    template.__class__ = _SeedMappedLinear
    params, buffers = stack_module_state(layers)
    x = torch.randn(3, 4, 6, 5, dtype=torch.float64, requires_grad=input_grad)  # [seeds, T, B, in]
    y = vmap(lambda p, x: functional_call(template, p, (x,)))(params, x)
    wrt = [x] if input_grad else []
    grads = torch.autograd.grad((y.square() * 0.3).sum(), [params["weight"], params["bias"], *wrt])
    assert grads[0].stride() == params["weight"].stride()
    for k, layer in enumerate(layers):
        alone = layer(x[k])
        close = lambda a, b: torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        close(y[k], alone)
        want = torch.autograd.grad((alone.square() * 0.3).sum(), [layer.weight, layer.bias, *wrt])
        close(grads[0][k], want[0])
        close(grads[1][k], want[1])
        if input_grad:
            close(grads[2][k], want[2][k])


@pytest.mark.parametrize("fused", [False, True], ids=["multi-tensor", "fused"])
def test_joint_step_is_each_optimisers_step(fused):
    # The multi-tensor step bit for bit; the fused kernel orders its arithmetic otherwise (an ulp in float32).
    equal = torch.testing.assert_close if fused else lambda a, b: torch.equal(a, b) or pytest.fail(f"{a} != {b}")
    torch.manual_seed(0)
    ps = [[torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))] for _ in range(3)]
    qs = [[torch.nn.Parameter(p.detach().clone()) for p in group] for group in ps]
    opts = [torch.optim.Adam(g, lr=0.1) for g in ps]
    refs = [torch.optim.Adam(g, lr=0.1) for g in qs]
    for step in range(3):
        for group, ref in zip(ps, qs):
            for p, q in zip(group, ref):
                p.grad = torch.randn_like(p)
                q.grad = p.grad.clone()
        joint_step(opts, fused=fused)
        for r in refs:
            r.step()
    for group, ref, o, r in zip(ps, qs, opts, refs):
        for p, q in zip(group, ref):
            equal(p, q)
            equal(o.state[p]["exp_avg_sq"], r.state[q]["exp_avg_sq"])
    opts[1].param_groups[0]["lr"] = 0.2
    with pytest.raises(ValueError, match="share their settings"):
        joint_step(opts)


# --- refusals -----------------------------------------------------------------------------------------------------
def test_gru_and_lstm_do_not_stack(composed):
    with pytest.raises(ValueError, match=r"seq_model='gru' does not support; stackable: \['ffm', 'mlp'\]"):
        StackedAgents(agents_of("sac", "gru", n=2))
    with pytest.raises(Refused, match=r"train.seed_axis_update=stacked needs policy.seq_model in \['ffm', 'mlp'\]"):
        validate(composed("seq_model=lstm", "train.seed_axis_update=stacked"))
    with pytest.raises(Refused, match=r"train.seed_axis_update='stack' is not one of \['branches', 'stacked'\]"):
        validate(composed("train.seed_axis_update=stack"))
