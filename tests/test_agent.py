"""The recurrent agent: T+1 alignment, masking, separate memories, targets, one-step SAC/TD3 updates."""
import copy

import numpy as np
import pytest
import torch

from pomdp_ffm.agent import RecurrentAgent, Streams, masked_mean
from pomdp_ffm.buffer import SeqBatch
from pomdp_ffm.config import PolicyConfig

O, A, T, B = 5, 2, 12, 6


def make_batch(seed=0, pad_from=None):
    rng = np.random.default_rng(seed)
    f = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    mask = np.ones((T, B, 1), np.float32)
    if pad_from is not None:
        mask[pad_from:, 0] = 0.0  # window 0 ends early: its tail is another episode's data
    term = np.zeros((T, B, 1), np.float32)
    term[3, 2] = 1.0
    return SeqBatch(obs=f(T, B, O), act=np.tanh(f(T, B, A)), rew=f(T, B, 1), term=term, obs2=f(T, B, O),
                    mask=mask)


def make_agent(algo="sac", model="ffm", seed=0, **kw):
    torch.manual_seed(seed)
    cfg = PolicyConfig(seq_model=model, algo_name=algo, rnn_hidden_size=32, dqn_layers=[32, 32],
                       policy_layers=[32, 32], **kw)
    return RecurrentAgent(O, A, cfg)


def test_t_plus_one_alignment():
    batch = make_batch()
    s = Streams.from_batch(batch, "cpu")
    assert s.observs.shape == (T + 1, B, O) and s.actions.shape == (T + 1, B, A)
    torch.testing.assert_close(s.observs[0], torch.from_numpy(batch.obs[0]))
    torch.testing.assert_close(s.observs[1:], torch.from_numpy(batch.obs2))
    assert torch.count_nonzero(s.actions[0]) == 0 and torch.count_nonzero(s.rewards[0]) == 0
    assert torch.count_nonzero(s.dones[0]) == 0
    torch.testing.assert_close(s.actions[1:], torch.from_numpy(batch.act))
    torch.testing.assert_close(s.rewards[1:], torch.from_numpy(batch.rew))
    assert s.masks.shape == (T, B, 1)


def test_masked_mean_counts_valid_steps_only():
    x = torch.tensor([[1.0], [3.0], [100.0]]).view(3, 1, 1)
    m = torch.tensor([[1.0], [1.0], [0.0]]).view(3, 1, 1)
    assert masked_mean(x, m).item() == 2.0
    assert masked_mean(x, torch.zeros_like(m)).item() == 0.0  # N = max(sum m, 1)


@pytest.mark.parametrize("algo", ["sac", "td3"])
@pytest.mark.parametrize("model", ["ffm", "gru", "lstm"])
def test_a_padded_step_changes_no_loss(algo, model):
    agent = make_agent(algo, model)
    clean = make_batch(pad_from=7)
    dirty = SeqBatch(*(x.copy() for x in clean))
    for field in (dirty.obs, dirty.act, dirty.rew, dirty.obs2):
        field[7:, 0] = 1e3  # garbage in the masked tail of window 0
    dirty.term[7:, 0] = 1.0

    def losses(batch):
        torch.manual_seed(123)  # the same policy/target noise for both
        s = Streams.from_batch(batch, "cpu")
        out = agent.algo.shared_actor_pass(agent, s)
        q1, q2 = agent.critic_loss(s, out)
        pi, _ = agent.actor_loss(s, out)
        return torch.stack([q1, q2, pi])

    torch.testing.assert_close(losses(clean), losses(dirty), rtol=1e-6, atol=1e-6)
    # ...while a change at a valid step does change them (the test can fail)
    valid = SeqBatch(*(x.copy() for x in clean))
    valid.rew[2, 0] += 5.0
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
@pytest.mark.parametrize("model", ["ffm", "gru", "lstm", "mlp"])
def test_one_update_changes_parameters_and_moves_targets(algo, model):
    agent = make_agent(algo, model)
    before = copy.deepcopy(agent.state_dict())
    stats = agent.update(make_batch(), grad_norms=True)
    assert all(np.isfinite(v) for v in stats.values())
    expected = {"qf1_loss", "qf2_loss", "policy_loss", "q_grad_norm", "q_rnn_grad_norm", "pi_grad_norm",
                "pi_rnn_grad_norm"} | ({"policy_entropy", "alpha"} if algo == "sac" else set())
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
                expect = (1 - tau) * before[k] + tau * after[src + k[len(tgt):]]
                torch.testing.assert_close(after[k], expect, rtol=1e-6, atol=1e-7)
    if algo == "sac":
        assert stats["alpha"] < 1.0 or stats["alpha"] > 1.0  # the temperature moved off its 1.0 start


def test_actor_step_leaves_critic_gradients_alone():
    agent = make_agent("sac", "gru")
    s = Streams.from_batch(make_batch(), "cpu")
    out = agent.algo.shared_actor_pass(agent, s)
    agent._critic_step(s, out)
    critic_grads = [p.grad.clone() for p in agent.critic.parameters()]
    critic_params = [p.detach().clone() for p in agent.critic.parameters()]
    agent._actor_step(s, out)
    for g, p, q in zip(critic_grads, agent.critic.parameters(), critic_params):
        torch.testing.assert_close(p.grad, g)  # the logged q_grad_norm is the critic loss's alone
        torch.testing.assert_close(p.detach(), q)


def test_td3_policy_delay_option():
    from pomdp_ffm.config import TD3Config

    agent = make_agent("td3", "gru", td3=TD3Config(policy_delay=2))
    a0 = copy.deepcopy(agent.actor.state_dict())
    agent.update(make_batch())
    assert all(torch.equal(a0[k], v) for k, v in agent.actor.state_dict().items())
    agent.update(make_batch(1))
    assert not all(torch.equal(a0[k], v) for k, v in agent.actor.state_dict().items())


def test_acting_carries_state_and_matches_sequence():
    agent = make_agent("td3", "ffm")
    batch = make_batch()
    s = Streams.from_batch(batch, "cpu")
    with torch.no_grad():
        seq_actions, _ = agent.actor(s.actions[:, :1], s.rewards[:, :1], s.observs[:, :1])
    state = agent.initial_state(1)
    for t in range(T + 1):
        a, state = agent.act(s.observs[t, 0].numpy(), s.actions[t, 0].numpy(), float(s.rewards[t, 0]), state,
                             deterministic=True)
        np.testing.assert_allclose(a, seq_actions[t, 0].numpy(), rtol=1e-5, atol=1e-5)
    noisy, _ = agent.act(s.observs[0, 0].numpy(), np.zeros(A), 0.0, agent.initial_state(1), deterministic=False)
    assert np.all(np.abs(noisy) <= 1.0)


def test_unknown_algorithm_and_model_fail_clearly():
    with pytest.raises(ValueError, match=r"policy.algo_name='ppo' is not one of \['sac', 'td3'\]"):
        PolicyConfig(algo_name="ppo")
    with pytest.raises(ValueError, match=r"policy.seq_model='rnn' is not one of \['lstm', 'gru', 'ffm', 'mlp'\]"):
        PolicyConfig(seq_model="rnn")


def test_shared_memory_is_refused():
    with pytest.raises(ValueError, match="policy.separate=false"):
        PolicyConfig(separate=False)
