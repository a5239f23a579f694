"""The recurrent agent: T+1 alignment, masking, separate memories, targets, one-step SAC/TD3 updates, and an
update that never reads a device value on the host (patches/014-update-without-host-sync.md)."""

import contextlib
import copy

import numpy as np
import pytest
import torch
from marks import every_memory_in_turn, parametrize_first_fast
from torch.utils._python_dispatch import TorchDispatchMode
from updating import updated

from pomdp_ffm import update as update_module
from pomdp_ffm.agent import RecurrentAgent, agent_shape
from pomdp_ffm.algos import SAC
from pomdp_ffm.buffer import Batch
from pomdp_ffm.config import PolicyConfig, SACConfig, TD3Config
from pomdp_ffm.optim import PLAIN
from pomdp_ffm.seq_models import FFM, available
from pomdp_ffm.seq_models.ffm import DECAY_MIN
from pomdp_ffm.update import Aligned, actor_loss, critic_loss, masked_mean, step_actor, step_critic

O, A, T, B = 5, 2, 12, 6


def make_batch(seed=0, pad_from=None):
    rng = np.random.default_rng(seed)
    f = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    mask = np.ones((T, B, 1), np.float32)
    if pad_from is not None:
        mask[pad_from:, 0] = 0.0  # window 0 ends early: its tail is another episode's data
    term = np.zeros((T, B, 1), np.float32)
    term[3, 2] = 1.0
    return Batch(
        observs=f(T, B, O),
        actions=np.tanh(f(T, B, A)),
        rewards=f(T, B, 1),
        terminals=term,
        next_observs=f(T, B, O),
        masks=mask,
        first_step=rng.integers(0, 1000, B),  # windows from anywhere in their episodes
    )


def make_agent(algo="sac", model="ffm", seed=0, adam=PLAIN, **kw):
    torch.manual_seed(seed)
    cfg = PolicyConfig(
        seq_model=model,
        algo_name=algo,
        **{"rnn_hidden_size": 32, "dqn_layers": [32, 32], "policy_layers": [32, 32], **kw},
    )
    return RecurrentAgent(O, A, cfg, adam)


def test_t_plus_one_alignment():
    batch = make_batch()
    s = Aligned.from_batch(batch, "cpu")
    assert s.observs.shape == (T + 1, B, O) and s.actions.shape == (T + 1, B, A)
    torch.testing.assert_close(s.observs[0], torch.from_numpy(batch.observs[0]), rtol=0, atol=0)
    torch.testing.assert_close(s.observs[1:], torch.from_numpy(batch.next_observs), rtol=0, atol=0)
    assert torch.count_nonzero(s.actions[0]) == 0 and torch.count_nonzero(s.rewards[0]) == 0
    assert torch.count_nonzero(s.terminals[0]) == 0
    torch.testing.assert_close(s.actions[1:], torch.from_numpy(batch.actions), rtol=0, atol=0)
    torch.testing.assert_close(s.rewards[1:], torch.from_numpy(batch.rewards), rtol=0, atol=0)
    assert s.masks.shape == (T, B, 1)


def test_masked_mean_counts_valid_steps_only():
    x = torch.tensor([[1.0], [3.0], [100.0]]).view(3, 1, 1)
    m = torch.tensor([[1.0], [1.0], [0.0]]).view(3, 1, 1)
    assert masked_mean(x, m).item() == 2.0
    assert masked_mean(x, torch.zeros_like(m)).item() == 0.0  # N = max(sum m, 1)


@pytest.mark.parametrize("model, algo", every_memory_in_turn(["sac", "td3"]))
def test_a_padded_step_changes_no_loss(algo, model):
    agent = make_agent(algo, model)
    clean = make_batch(pad_from=7)
    dirty = Batch(*(x.copy() for x in clean))
    for field in (dirty.observs, dirty.actions, dirty.rewards, dirty.next_observs):
        field[7:, 0] = 1e3  # garbage in the masked tail of window 0
    dirty.terminals[7:, 0] = 1.0

    def losses(batch):
        torch.manual_seed(123)  # the same policy/target noise for both
        s = Aligned.from_batch(batch, "cpu")
        out = agent.actor.over(s)[0] if agent.algo.shares_actor_pass else None
        q1, q2 = critic_loss(agent, s, out)
        pi, _ = actor_loss(agent, s, out)
        return torch.stack([q1, q2, pi])

    torch.testing.assert_close(losses(clean), losses(dirty), rtol=0, atol=0)
    # ...while a change at a valid step does change them (the test can fail)
    valid = Batch(*(x.copy() for x in clean))
    valid.rewards[2, 0] += 5.0
    assert not torch.allclose(losses(clean), losses(valid))


def test_actor_and_critic_memories_are_separate():
    agent = make_agent("td3", "ffm")
    mods = [agent.actor, agent.critic, agent.critic_target, agent.actor_target]
    mems = [m.encoder.memory for m in mods]
    assert len({id(m) for m in mems}) == 4
    params = [{id(p) for p in m.parameters()} for m in mods]
    for i in range(4):
        for j in range(i + 1, 4):
            assert not params[i] & params[j]
    assert make_agent("sac").actor_target is None  # SAC uses the current actor for next actions


@pytest.mark.parametrize(
    "model, layers, per_row",
    [
        ("ffm", 1, 25856),
        ("gru", 1, 24576),
        ("gru", 2, 29696),
        ("lstm", 1, 25856),
        ("lstm", 2, 32256),
        ("mlp", 1, 20736),
    ],
)
def test_update_memory_estimate_per_memory(model, layers, per_row):
    # Each memory's share comes from its class (SeqModel.activation_floats); the bytes per row are pinned as they
    # were when the agent held a table of them.
    cfg = PolicyConfig(seq_model=model, rnn_hidden_size=32, rnn_num_layers=layers)
    assert RecurrentAgent(O, A, cfg).update_memory()[1] == per_row


@pytest.mark.parametrize("algo", ["sac", "td3"])
@pytest.mark.parametrize("model", available())
def test_the_agents_shape_has_its_weights_and_draws_no_random_number(algo, model):
    # agent.agent_shape: what the trainer decides from before it builds the agent (the weights' bytes, compiling)
    cfg = make_agent(algo, model).cfg
    rng = torch.get_rng_state()
    shape = agent_shape(O, A, cfg)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(t.device.type == "meta" for t in (*shape.parameters(), *shape.buffers()))
    built = make_agent(algo, model)
    sizes = lambda agent: [(k, t.shape, t.dtype) for k, t in (*agent.named_parameters(), *agent.named_buffers())]
    assert sizes(shape) == sizes(built)


def test_reference_architecture_sizes():
    # docs/reference.md#actor, #critic, #heads-and-initialisation: actor head input H + obs_emb; critic shortcut
    # [o, a] -> rnn_input_size; twin heads
    agent = make_agent("sac", "gru")
    assert agent.critic.shortcut.fc.in_features == O + A
    assert agent.critic.shortcut.fc.out_features == 16 + 16 + 32
    assert agent.critic.qf1.net[0].in_features == 32 + 64
    assert agent.actor.head.trunk.net[0].in_features == 32 + 32
    first_hidden = agent.critic.qf1.net[0]
    assert torch.all(first_hidden.bias == 0.1)
    bound = 1 / np.sqrt(first_hidden.weight.shape[0])
    assert first_hidden.weight.abs().max() <= bound


@pytest.mark.parametrize("algo", ["sac", "td3"])
@pytest.mark.parametrize("model", available())
def test_one_update_changes_parameters_and_moves_targets(algo, model):
    agent = make_agent(algo, model)
    before = copy.deepcopy(agent.state_dict())
    stats = updated(agent, make_batch(), grad_norms=True)
    assert all(torch.isfinite(v) for v in stats.values())
    expected = {
        "qf1_loss",
        "qf2_loss",
        "policy_loss",
        "q_grad_norm",
        "q_rnn_grad_norm",
        "pi_grad_norm",
        "pi_rnn_grad_norm",
    } | ({"policy_entropy", "alpha"} if algo == "sac" else set())
    assert set(stats) == expected
    after = agent.state_dict()
    for prefix in ("actor.", "critic."):
        changed = [k for k in before if k.startswith(prefix) and not torch.equal(before[k], after[k])]
        assert changed, f"no {prefix} parameter changed"
    tau = agent.cfg.tau
    targets = [("critic_target.", "critic.")] + ([("actor_target.", "actor.")] if algo == "td3" else [])
    for tgt, src in targets:
        for k in before:
            if k.startswith(tgt):
                expect = (1 - tau) * before[k] + tau * after[src + k[len(tgt) :]]
                torch.testing.assert_close(after[k], expect, rtol=1e-6, atol=1e-7)
    if algo == "sac":
        assert stats["alpha"] < 1.0 or stats["alpha"] > 1.0  # the temperature moved off its 1.0 start


def test_actor_step_leaves_critic_gradients_alone():
    agent = make_agent("sac", "gru")
    s = Aligned.from_batch(make_batch(), "cpu")
    out = agent.actor.over(s)[0]
    step_critic(agent, *critic_loss(agent, s, out), grad_norms=False)
    critic_grads = [p.grad.clone() for p in agent.critic.parameters()]
    critic_params = [p.detach().clone() for p in agent.critic.parameters()]
    step_actor(agent, s.masks, *actor_loss(agent, s, out), grad_norms=False)
    for g, p, q in zip(critic_grads, agent.critic.parameters(), critic_params):
        torch.testing.assert_close(p.grad, g, rtol=0, atol=0)  # the logged q_grad_norm is the critic loss's alone
        torch.testing.assert_close(p.detach(), q, rtol=0, atol=0)


def test_td3_policy_delay_option():
    agent = make_agent("td3", "gru", td3=TD3Config(policy_delay=2))
    a0 = copy.deepcopy(agent.actor.state_dict())
    updated(agent, make_batch())
    assert all(torch.equal(a0[k], v) for k, v in agent.actor.state_dict().items())
    updated(agent, make_batch(1))
    assert not all(torch.equal(a0[k], v) for k, v in agent.actor.state_dict().items())


def test_acting_carries_state_and_matches_sequence():
    agent = make_agent("td3", "ffm")
    batch = make_batch()
    s = Aligned.from_batch(batch, "cpu")
    with torch.no_grad():
        seq_actions, _ = agent.actor(s.actions[:, :1], s.rewards[:, :1], s.observs[:, :1])
    state = agent.initial_state(1)
    for t in range(T + 1):
        a, state = agent.act(
            s.observs[t, 0].numpy(), s.actions[t, 0].numpy(), float(s.rewards[t, 0]), state, deterministic=True
        )
        np.testing.assert_allclose(a, seq_actions[t, 0].numpy(), rtol=1e-5, atol=1e-8)
    noisy, _ = agent.act(s.observs[0, 0].numpy(), np.zeros(A), 0.0, agent.initial_state(1), deterministic=False)
    assert np.all(np.abs(noisy) <= 1.0)


# --------------------------------------------------------------------------------------------------
# An update without host synchronisation (patches/014-update-without-host-sync.md)
class HostSync(AssertionError):
    pass


_READS = ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__", "__complex__")


class _NoDataDependentShapes(TorchDispatchMode):
    """An operator whose output's shape depends on its input's values (torch.Tag.dynamic_output_shape: nonzero, a
    boolean mask's indexing, unique, masked_select) reads those values on the host to size its output: on CUDA a
    synchronisation, and a failed capture inside a CUDA graph."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch.Tag.dynamic_output_shape in func.tags:
            raise HostSync(f"{func} sizes its output from a tensor's values, read on the host")
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def no_host_reads(allowed=()):
    """Inside the block, every way a tensor's value reaches Python raises HostSync: .item(), .tolist(), .numpy(),
    bool(), float(), int(), indexing with a tensor, and an operator that sizes its output from the values.
    `allowed` lists tensors whose .item() may run (Adam's step counters: CPU tensors even on a GPU, read by
    torch.optim without capturable=True)."""
    allowed = {id(t) for t in allowed}

    def guard(name, orig):
        def read(self, *args, **kwargs):
            if name == "item" and id(self) in allowed:
                return orig(self, *args, **kwargs)
            raise HostSync(f"Tensor.{name} read a tensor's value on the host")

        return read

    with pytest.MonkeyPatch.context() as m:
        for name in _READS:
            m.setattr(torch.Tensor, name, guard(name, getattr(torch.Tensor, name)))
        with _NoDataDependentShapes():
            yield


def optimizer_steps(agent):
    optims = [agent.actor_optim, agent.critic_optim, getattr(agent.algo, "alpha_optim", None)]
    return [st["step"] for o in optims if o is not None for st in o.state.values()]


def tensor_batch(batch, device="cpu"):
    return Batch(*(torch.as_tensor(x, device=device) for x in batch))


def test_the_host_read_guard_catches_what_it_should():
    x = torch.ones(3)
    ffm = FFM(4, 32)  # standalone: its forward checks the decay bound on the host
    for read in (
        lambda: x.sum().item(),
        lambda: float(x.sum()),
        lambda: bool(x.any()),
        lambda: x.tolist(),
        lambda: int(x[0]),
        lambda: x.numpy(),
        lambda: x[x > 1],
        lambda: x.nonzero(),
        lambda: torch.unique(x),
        lambda: ffm(torch.randn(2, 1, 4)),
    ):
        with no_host_reads(), pytest.raises(HostSync):
            read()
    with no_host_reads(allowed=[x]):
        assert x.item.__name__ == "read" and (x[:1] * 2).shape == (1,)
    assert float(x.sum()) == 3.0  # restored


@pytest.mark.parametrize("model, algo, grad_norms", every_memory_in_turn(["sac", "td3"], [False, True]))
def test_update_reads_no_device_value_on_the_host(algo, model, grad_norms):
    agent = make_agent(algo, model, td3=TD3Config(policy_delay=2))
    batch = tensor_batch(make_batch())
    for _ in range(2):  # the optimisers create their step counters at their first step
        updated(agent, batch)
    with no_host_reads(allowed=optimizer_steps(agent)):
        stats = [updated(agent, batch, grad_norms=grad_norms) for _ in range(2)]  # TD3: with and without actor step
    assert {"qf1_loss", "policy_loss"} <= set(stats[0]) | set(stats[1])
    for st in stats:
        for k, v in st.items():
            assert isinstance(v, torch.Tensor) and v.shape == () and not v.requires_grad, k
            assert v.device == agent.device and torch.isfinite(v), k


@pytest.mark.parametrize("algo", ["sac", "td3"])
@pytest.mark.parametrize("model", available())
def test_acting_steps_read_no_device_value_on_the_host(algo, model):
    # What an acting graph captures (acting_graph.ActingRunner): the actor's step from a carried state and the
    # algorithm's action, both ways; only the action's copy to the host (act_with) reads a value.
    agent = make_agent(algo, model)
    s = Aligned.from_batch(make_batch(), agent.device)
    state = agent.actor.encoder.memory.initial_state(B)
    with no_host_reads(), torch.no_grad():
        for t in range(3):
            step = slice(t, t + 1)
            out, state = agent.actor(s.actions[step], s.rewards[step], s.observs[step], state)
            for deterministic in (True, False):
                assert agent.algo.act(out, deterministic).shape == (1, B, A)


def test_fixed_temperature_is_a_constant_tensor():
    agent = make_agent("sac", "ffm", sac=SACConfig(automatic_entropy_tuning=False, entropy_alpha=0.3))
    assert isinstance(agent.algo.alpha, torch.Tensor) and agent.algo.alpha.item() == 0.3
    assert "algo.fixed_alpha" not in agent.state_dict()  # the value comes from the config, checkpoints keep their keys
    stats = updated(agent, make_batch())
    stats["alpha"].add_(1.0)  # a caller that accumulates in place
    assert agent.algo.alpha.item() == 0.3
    tuned = make_agent("sac", "ffm")
    assert tuned.algo.alpha.shape == () and not tuned.algo.alpha.requires_grad and tuned.algo.alpha.item() == 1.0


@contextlib.contextmanager
def per_call_bound_path(agent):
    """The update as it ran before patches/014: each FFM clamps its decay before every call when a value is out of
    range (a host read), the agent never clamps, and SAC multiplies by the Python float log_alpha.exp().item()."""
    for net in (agent.actor, agent.critic, *(t for t, _ in agent.targets())):
        net.encoder.memory.bounded_by_owner(False)

    def temperature_step(self, entropy):  # the old code, which kept alpha as a Python float
        log_prob_mean = -entropy
        if self.alpha_optim is not None:
            f = self.log_alpha.exp() if self.cfg.alpha_loss == "alpha" else self.log_alpha
            loss = -(f * (log_prob_mean + self.target_entropy)).sum()
            self.alpha_optim.zero_grad(set_to_none=True)
            loss.backward()
            self.alpha_optim.step()
        return {"alpha": self.alpha}

    with pytest.MonkeyPatch.context() as m:
        m.setattr(update_module, "bound_memories_", lambda *nets: None)
        m.setattr(
            SAC,
            "alpha",
            property(
                lambda self: (
                    self.log_alpha.exp().item() if self.log_alpha is not None else float(self.cfg.entropy_alpha)
                )
            ),
        )
        m.setattr(SAC, "temperature_step", temperature_step)
        yield


def run_updates(agent, n=20):
    """n updates (grad norms every other one), three acting steps after each, and how often a decay left its bound."""
    torch.manual_seed(7)  # CUDA's generator too
    stats, actions, out_of_bound = [], [], 0
    probe = make_batch(5)
    for i in range(n):
        st = updated(agent, make_batch(i % 3), grad_norms=i % 2 == 0)
        stats.append({k: float(v) for k, v in st.items()})
        out_of_bound += sum(
            bool(((m.alpha < DECAY_MIN) | (m.alpha > m.decay_limit)).any())
            for m in agent.modules()
            if isinstance(m, FFM)
        )
        state = agent.initial_state(1)
        for t in range(3):
            a, state = agent.act(probe.observs[t, 0], probe.actions[t, 0], float(probe.rewards[t, 0, 0]), state, True)
            actions.append(a)
    return stats, np.stack(actions), agent.state_dict(), out_of_bound


EQUIVALENCE_CASES = [
    ("sac", {}),
    ("sac", {"sac": SACConfig(automatic_entropy_tuning=False, entropy_alpha=0.3)}),
    ("td3", {}),
    ("td3", {"td3": TD3Config(policy_delay=2)}),
]


@parametrize_first_fast("algo, kw", EQUIVALENCE_CASES)
def test_updates_equal_the_per_call_bound_path(algo, kw, device="cpu", rtol=0.0):
    # lr 0.05: the optimiser steps push the FFM decays out of their bound at nearly every step, so when and where
    # the clamp runs matters (the target actor averages the actor's decay *before* its clamp, as before).
    make = lambda: make_agent(algo, "ffm", lr=0.05, **kw).to(device)
    old = make()
    with per_call_bound_path(old):
        old_stats, old_actions, old_params, _ = run_updates(old)
    # the same run without any bound leaves the bound (the per-call path clamped) and ends elsewhere
    loose = make()
    for m in loose.modules():
        if isinstance(m, FFM):
            m.decay_bound = False
    loose_stats, _, _, out_of_bound = run_updates(loose)
    assert out_of_bound >= 20 and loose_stats[-1] != old_stats[-1]

    new = make()
    new_stats, new_actions, new_params, out_of_bound = run_updates(new)
    assert out_of_bound == 0
    assert new_params.keys() == old_params.keys()
    if rtol == 0.0:  # bit for bit
        assert new_stats == old_stats
        np.testing.assert_array_equal(new_actions, old_actions)
        for k in new_params:
            assert torch.equal(new_params[k], old_params[k]), k
        return
    for key in old_stats[0]:
        a, b = (np.array([st[key] for st in ss if key in st]) for ss in (new_stats, old_stats))
        assert np.linalg.norm(a - b) <= rtol * np.linalg.norm(b), key
    np.testing.assert_allclose(new_actions, old_actions, rtol=rtol, atol=rtol)
    for k in new_params:
        a, b = new_params[k].double(), old_params[k].double()
        assert float((a - b).norm()) <= rtol * float(b.norm()) + 1e-6, k


def test_acting_gamma_cache_is_kept_between_updates(monkeypatch):
    agent = make_agent("sac", "ffm")
    calls = []
    gamma = FFM.gamma
    monkeypatch.setattr(FFM, "gamma", lambda self: calls.append(self) or gamma(self))
    obs, state = np.zeros(O, np.float32), agent.initial_state(1)

    def act(n):
        nonlocal state
        calls.clear()
        for _ in range(n):
            _, state = agent.act(obs, np.zeros(A), 0.0, state, deterministic=False)
        return len(calls)

    act(1)
    assert act(20) == 0  # no write between acting steps: gamma comes from the cache
    updated(agent, make_batch())
    assert act(20) == 1  # recomputed once after the update's writes


def test_loaded_state_is_bounded():
    agent = make_agent("td3", "ffm")
    state = agent.training_state()
    state = {**state, "modules": {k: v.clone() for k, v in state["modules"].items()}}
    for k in ("actor.encoder.memory.alpha", "actor_target.encoder.memory.alpha"):
        state["modules"][k][0], state["modules"][k][1] = 5.0, -1.0
    fresh = make_agent("td3", "ffm", seed=1)
    fresh.load_training_state(state)
    for net in (fresh.actor, fresh.actor_target):
        a = net.encoder.memory.alpha
        assert a[0].item() == pytest.approx(net.encoder.memory.decay_limit) and a[1].item() == pytest.approx(DECAY_MIN)
