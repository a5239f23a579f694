"""The SAC/TD3 maths, recomputed independently step by step (docs/reference.md#critic-loss, #actor-loss, #update-order).

Each test takes a tiny float64 batch (T=4, B=3) with padded steps (mask 0, filled with garbage) and
terminal steps (done=1), and recomputes every quantity with a plain loop over batch element b and time t:
the memories (critic, target critic, actor, target actor) run one step at a time with their state carried
by hand, the Q and policy-head inputs are concatenated by hand, the tanh-Gaussian log-probability comes
from torch.distributions.Normal, and the losses are sums over valid steps divided by their count. None of
the update's loss code (Aligned, masked_mean, critic_loss, actor_loss, algos.*) is used for the expected
values. The agent's own noise draws (torch.randn_like) are recorded while it runs and fed to the loop, so
the two agree to float64 rounding (the loop sums in another order: at most 2e-15 relative measured; checked at
rtol 1e-9).

The networks are perturbed away from their near-zero output init and the targets away from the online
nets, so that Q values are O(1), min(Q1, Q2) differs from either head, and a target mixed up with its
online net shows.

Mutations checked to fail this file (each applied alone to a scratch copy of the package, with this file
run against the copy; every one of them fails at least one test here):

  algos.py  SAC.next_actions       entropy bonus -alpha*logp -> +alpha*logp;  bonus dropped
  algos.py  SAC.actor_objective    alpha*logp - min(Q) -> -alpha*logp - min(Q);  whole sign flipped;
                                   min -> max;  alpha dropped
  algos.py  SAC.temperature_loss   loss sign flipped (either form);  "alpha"/"log_alpha" forms swapped;
                                   logp + target -> logp - target
  algos.py  TD3.actor_objective    -min(Q) -> +min(Q);  actor_q="q1" uses Q2;  actor_q="min" uses Q1
  algos.py  TD3.next_actions       noise clip removed;  action clip to [-1, 1] removed;  the online actor
                                   instead of the target actor
  update.py critic_loss            (1 - d) dropped;  gamma -> 1;  min -> max of the target heads;  the online
                                   critic instead of the target critic
  update.py masked_mean            divided by T*B instead of the number of valid steps;  x.mean() (no mask)
  nets.py   TanhGaussianHead.sample  the tanh-Jacobian term's sign flipped
"""

import copy
import math

import numpy as np
import pytest
import torch
from torch.distributions import Normal
from updating import updated

from pomdp_ffm.agent import RecurrentAgent
from pomdp_ffm.buffer import Batch
from pomdp_ffm.catalog import COMPARED
from pomdp_ffm.config import PolicyConfig, SACConfig, TD3Config
from pomdp_ffm.seq_models import available
from pomdp_ffm.update import Aligned, actor_loss, critic_loss

O, A, T, B = 3, 2, 4, 3
GAMMA = 0.8
ALPHA0 = 0.5  # the SAC temperature the tests start from (log_alpha = log 0.5; not 1, so alpha's role shows)
RTOL, ATOL = 1e-9, 1e-12
FIRST_STEP = np.array([0, 7, 40])  # the windows' first steps in their episodes (a time-embedded memory reads them)
MODELS = available()


# ------------------------------------------------------------------------------------------------------
# fixtures: a tiny float64 agent and batch
def make_batch(seed=0) -> Batch:
    rng = np.random.default_rng(seed)
    f = lambda *shape: rng.standard_normal(shape)
    obs, act, rew, obs2 = f(T, B, O), np.tanh(f(T, B, A)), f(T, B, 1), f(T, B, O)
    mask = np.ones((T, B, 1))
    mask[2:, 0] = 0.0  # window 0: two valid steps, ending in a terminal step
    mask[3:, 1] = 0.0  # window 1: three valid steps
    term = np.zeros((T, B, 1))
    term[1, 0] = 1.0  # a terminal at the last valid step
    term[1, 2] = 1.0  # a done followed by more valid steps (the maths must not care)
    term[3, 1] = 1.0  # a done on a padded step: ignored
    for x, v in ((obs, 9.0), (act, 0.9), (rew, -50.0), (obs2, -9.0)):
        x[mask[..., 0] == 0] = v  # garbage in the padded steps
    return Batch(
        observs=obs, actions=act, rewards=rew, terminals=term, next_observs=obs2, masks=mask, first_step=FIRST_STEP
    )


def make_agent(algo, model, seed=0, sac=None, td3=None) -> RecurrentAgent:
    torch.manual_seed(seed)
    cfg = PolicyConfig(
        seq_model=model,
        algo_name=algo,
        rnn_hidden_size=32,
        action_embedding_size=4,
        observ_embedding_size=8,
        reward_embedding_size=4,
        dqn_layers=[16, 16],
        policy_layers=[16, 16],
        gamma=GAMMA,
        sac=sac or SACConfig(),
        td3=td3 or TD3Config(),
    )
    agent = RecurrentAgent(O, A, cfg).double()
    gen = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        # Weight matrices only (FFM's decay/context vectors keep their valid ranges); a larger kick to the
        # heads' output layers (init ~1e-3) so that Q values are O(1) and the two heads differ.
        for net in filter(None, (agent.actor, agent.critic, agent.critic_target, agent.actor_target)):
            for name, p in net.named_parameters():
                if p.dim() == 2:
                    scale = 0.5 if p.shape[0] <= A or name.startswith(("qf1.net.4", "qf2.net.4")) else 0.1
                    p.add_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))
        if algo == "sac" and agent.algo.log_alpha is not None:
            agent.algo.log_alpha.fill_(math.log(ALPHA0))  # algo.alpha is exp(log_alpha)
    return agent


class NoiseRecorder:
    """Wraps torch.randn_like: the agent draws its own noise, the test keeps a copy of each draw."""

    def __init__(self):
        self.draws, self._randn_like = [], torch.randn_like

    def __call__(self, x, *args, **kwargs):
        out = self._randn_like(x, *args, **kwargs)
        self.draws.append(out.detach().clone())
        return out


# ------------------------------------------------------------------------------------------------------
# the independent computation
def fresh_memory(fresh, acted):
    """``acted`` with its memory part replaced by a fresh state's: only its step count (its integer tensors) kept."""
    if torch.is_tensor(fresh):
        return fresh if fresh.is_floating_point() or fresh.is_complex() else acted
    return type(fresh)(fresh_memory(f, a) for f, a in zip(fresh, acted, strict=True))


def run_memory(encoder, inputs, first_step):
    """Histories h_0..h_T of one batch element, one step at a time with the state carried by hand, from the state
    acting reaches at the window's first step in its episode with the memory reset there (the step count kept)."""
    hs, state, zero = [], None, torch.zeros(1, 1, 1, dtype=torch.float64)
    for _ in range(first_step):
        _, state = encoder(zero.expand(1, 1, A), zero, zero.expand(1, 1, O), state)
    steps = [t for t in encoder.memory.state_tensors(state) if not (t.is_floating_point() or t.is_complex())]
    state = fresh_memory(encoder.initial_state(1), state) if steps else None  # without a step count: a fresh state
    for prev_a, prev_r, o in inputs:
        y, state = encoder(prev_a.view(1, 1, -1), prev_r.view(1, 1, -1), o.view(1, 1, -1), state)
        hs.append(y.view(-1))
    return hs


def q_by_hand(critic, h, o, a):
    x = torch.cat([h, critic.shortcut(torch.cat([o, a]))])
    return critic.qf1(x).item(), critic.qf2(x).item()


def head_input(actor, h, o):
    return torch.cat([h, actor.shortcut(o)])


def tanh_gaussian(actor, h, o, eps):
    """a = tanh(mean + std * eps), log pi(a) = sum log N(u; mean, std) - sum log(1 - a^2 + 1e-6)."""
    mean, log_std = actor.head(head_input(actor, h, o))
    std = log_std.exp()
    u = mean + std * eps
    a = torch.tanh(u)
    logp = Normal(mean, std).log_prob(u).sum() - torch.log(1 - a * a + 1e-6).sum()
    return a, logp.item()


@torch.no_grad()
def reference(agent, batch, next_noise, pi_noise=None, actor_critic=None, alpha=None):
    """Expected qf1/qf2 losses, actor objective and mean log-prob, by plain loops over b and t.

    next_noise: the noise of the next actions ([T+1, B, A]: SAC's eps, TD3's raw target noise);
    pi_noise: SAC's eps of the policy actions ([T, B, A]); actor_critic: the critic the actor loss uses
    (update() takes it after the critic step); alpha: SAC's temperature.
    """
    cfg = agent.cfg
    sac = cfg.algo_name == "sac"
    b64 = lambda x: torch.as_tensor(x, dtype=torch.float64)
    obs, act, rew, term = b64(batch.observs), b64(batch.actions), b64(batch.rewards), b64(batch.terminals)
    obs2, mask = b64(batch.next_observs), b64(batch.masks)
    actor_critic = agent.critic if actor_critic is None else actor_critic
    next_actor = agent.actor if sac else agent.actor_target
    sum_q1 = sum_q2 = sum_pi = sum_logp = 0.0
    n = 0
    for b in range(B):
        # history inputs at t = 0..T: (previous action, previous reward, observation), zeros before t = 0
        inputs = [(torch.zeros(A, dtype=torch.float64), torch.zeros(1, dtype=torch.float64), obs[0, b])]
        inputs += [(act[t, b], rew[t, b], obs2[t, b]) for t in range(T)]
        k = int(batch.first_step[b])
        h_critic = run_memory(agent.critic.encoder, inputs, k)
        h_target = run_memory(agent.critic_target.encoder, inputs, k)
        h_actor = run_memory(agent.actor.encoder, inputs, k)
        h_next_actor = run_memory(next_actor.encoder, inputs, k)
        h_actor_critic = run_memory(actor_critic.encoder, inputs, k)
        for t in range(T):
            if mask[t, b, 0].item() == 0.0:
                continue
            n += 1
            o_t, o_next = inputs[t][2], inputs[t + 1][2]
            # ---- critic target y_t = r_t + (1 - d_t) gamma (min Q'(h'_{t+1}, o_{t+1}, a'_{t+1}) + bonus)
            if sac:
                a_next, logp_next = tanh_gaussian(agent.actor, h_next_actor[t + 1], o_next, next_noise[t + 1, b])
                bonus = -alpha * logp_next
            else:
                c = cfg.td3
                mu = next_actor.head(head_input(next_actor, h_next_actor[t + 1], o_next))
                eps = [
                    min(max(z * c.target_noise, -c.target_noise_clip), c.target_noise_clip)
                    for z in next_noise[t + 1, b].tolist()
                ]
                a_next = torch.tensor(
                    [min(max(m + e, -1.0), 1.0) for m, e in zip(mu.tolist(), eps)], dtype=torch.float64
                )
                bonus = 0.0
            q1_next, q2_next = q_by_hand(agent.critic_target, h_target[t + 1], o_next, a_next)
            y = rew[t, b, 0].item() + (1.0 - term[t, b, 0].item()) * GAMMA * (min(q1_next, q2_next) + bonus)
            q1, q2 = q_by_hand(agent.critic, h_critic[t], o_t, act[t, b])
            sum_q1 += (q1 - y) ** 2
            sum_q2 += (q2 - y) ** 2
            # ---- actor objective at step t
            if sac:
                a, logp = tanh_gaussian(agent.actor, h_actor[t], o_t, pi_noise[t, b])
                q1_pi, q2_pi = q_by_hand(actor_critic, h_actor_critic[t], o_t, a)
                sum_pi += alpha * logp - min(q1_pi, q2_pi)
                sum_logp += logp
            else:
                a = agent.actor.head(head_input(agent.actor, h_actor[t], o_t))
                q1_pi, q2_pi = q_by_hand(actor_critic, h_actor_critic[t], o_t, a)
                sum_pi += -(min(q1_pi, q2_pi) if cfg.td3.actor_q == "min" else q1_pi)
    assert n == 2 + 3 + 4
    return {"qf1_loss": sum_q1 / n, "qf2_loss": sum_q2 / n, "policy_loss": sum_pi / n, "log_prob": sum_logp / n}


def close(actual, expected, what):
    actual = float(actual.detach()) if torch.is_tensor(actual) else float(actual)
    assert math.isclose(actual, expected, rel_tol=RTOL, abs_tol=ATOL), f"{what}: {actual} != {expected}"


# ------------------------------------------------------------------------------------------------------
# the loss functions themselves
def agent_losses(agent, batch, monkeypatch):
    """The agent's own critic and actor losses on the batch, with its noise draws recorded."""
    rec = NoiseRecorder()
    with monkeypatch.context() as m:
        m.setattr(torch, "randn_like", rec)
        s = Aligned.from_batch(batch, "cpu")
        out = agent.actor.over(s)[0] if agent.algo.shares_actor_pass else None
        qf1, qf2 = critic_loss(agent, s, out)
        pi, log_prob = actor_loss(agent, s, out)
    return qf1, qf2, pi, log_prob, rec


@pytest.mark.parametrize("model", MODELS)
def test_sac_critic_and_actor_losses(model, monkeypatch):
    agent, batch = make_agent("sac", model), make_batch()
    qf1, qf2, pi, log_prob, rec = agent_losses(agent, batch, monkeypatch)
    assert [d.shape for d in rec.draws] == [(T + 1, B, A), (T, B, A)]
    exp = reference(agent, batch, rec.draws[0], rec.draws[1], alpha=ALPHA0)
    close(qf1, exp["qf1_loss"], "qf1_loss")
    close(qf2, exp["qf2_loss"], "qf2_loss")
    close(pi, exp["policy_loss"], "policy_loss")
    masked_lp = (log_prob * torch.as_tensor(batch.masks)).sum() / batch.masks.sum()
    close(masked_lp, exp["log_prob"], "mean log-prob")
    assert exp["qf1_loss"] != pytest.approx(exp["qf2_loss"], rel=1e-3)  # the twin heads differ


@pytest.mark.parametrize(
    "td3",
    [
        TD3Config(),
        TD3Config(target_noise=1.0, target_noise_clip=0.3),
        TD3Config(target_noise=2.0, target_noise_clip=5.0, actor_q="q1"),
    ],
    ids=["default", "noise-clip", "action-clip-q1"],
)
@pytest.mark.parametrize("model", MODELS)
def test_td3_critic_and_actor_losses(model, td3, monkeypatch):
    agent, batch = make_agent("td3", model, td3=td3), make_batch()
    qf1, qf2, pi, log_prob, rec = agent_losses(agent, batch, monkeypatch)
    assert log_prob is None and [d.shape for d in rec.draws] == [(T + 1, B, A)]
    noise = rec.draws[0]
    if td3.target_noise_clip == 0.3:
        assert (noise * td3.target_noise).abs().max() > 0.6  # the noise clip is exercised
    if td3.target_noise_clip == 5.0:
        assert (noise * td3.target_noise).abs().max() > 2.0  # the action clip to [-1, 1] is exercised
    exp = reference(agent, batch, noise)
    close(qf1, exp["qf1_loss"], "qf1_loss")
    close(qf2, exp["qf2_loss"], "qf2_loss")
    close(pi, exp["policy_loss"], "policy_loss")


# ------------------------------------------------------------------------------------------------------
# one update(): the values it reports, and the temperature step
def adam_first_step(x0, grad, lr, eps=1e-8):
    # Adam's first step from zero moments: the bias-corrected moments are g and g^2
    return x0 - lr * grad / (abs(grad) + eps)


def recorded_update(agent, batch, monkeypatch):
    """updated(agent, batch), with its noise draws recorded."""
    rec = NoiseRecorder()
    with monkeypatch.context() as m:
        m.setattr(torch, "randn_like", rec)
        stats = updated(agent, batch)
    return stats, rec


@pytest.mark.parametrize("alpha_loss", ["alpha", "log_alpha"])
@pytest.mark.parametrize("target_entropy", [-10.0, 10.0])
@pytest.mark.parametrize("model", COMPARED)
def test_sac_update_reports_losses_and_moves_temperature(model, target_entropy, alpha_loss, monkeypatch):
    agent = make_agent("sac", model, sac=SACConfig(alpha_loss=alpha_loss, target_entropy=target_entropy))
    batch = make_batch(1)
    before = copy.deepcopy(agent)
    stats, rec = recorded_update(agent, batch, monkeypatch)
    assert [d.shape for d in rec.draws] == [(T + 1, B, A), (T, B, A)]
    # The actor loss is taken after the critic step: with the updated critic (which the actor step, the Polyak
    # averaging and the temperature step leave alone) and the not yet updated actor.
    exp = reference(before, batch, rec.draws[0], rec.draws[1], actor_critic=agent.critic, alpha=ALPHA0)
    close(stats["qf1_loss"], exp["qf1_loss"], "qf1_loss")
    close(stats["qf2_loss"], exp["qf2_loss"], "qf2_loss")
    close(stats["policy_loss"], exp["policy_loss"], "policy_loss")
    close(stats["policy_entropy"], -exp["log_prob"], "policy_entropy")

    # Temperature loss: "alpha" -(alpha (E log pi + H_target)), "log_alpha" -(log alpha (E log pi + H_target))
    log_alpha0, lp = math.log(ALPHA0), exp["log_prob"]
    grad = -(ALPHA0 if alpha_loss == "alpha" else 1.0) * (lp + target_entropy)
    close(agent.algo.log_alpha.grad.item(), grad, "d(temperature loss)/d(log alpha)")
    alpha = math.exp(adam_first_step(log_alpha0, grad, agent.cfg.sac.alpha_lr))
    close(stats["alpha"], alpha, "alpha after one step")
    close(agent.algo.alpha, alpha, "algo.alpha")
    # Direction: entropy above its target lowers alpha, below raises it.
    entropy = -lp
    if target_entropy < 0:
        assert entropy > target_entropy and stats["alpha"] < ALPHA0
    else:
        assert entropy < target_entropy and stats["alpha"] > ALPHA0


def test_sac_fixed_temperature_update(monkeypatch):
    agent = make_agent("sac", "ffm", sac=SACConfig(automatic_entropy_tuning=False, entropy_alpha=0.3))
    batch = make_batch(2)
    before = copy.deepcopy(agent)
    stats, rec = recorded_update(agent, batch, monkeypatch)
    exp = reference(before, batch, rec.draws[0], rec.draws[1], actor_critic=agent.critic, alpha=0.3)
    for k in ("qf1_loss", "qf2_loss", "policy_loss"):
        close(stats[k], exp[k], k)
    close(stats["alpha"], 0.3, "fixed alpha")


@pytest.mark.parametrize("actor_q", ["min", "q1"])
@pytest.mark.parametrize("model", COMPARED)
def test_td3_update_reports_losses(model, actor_q, monkeypatch):
    agent = make_agent("td3", model, td3=TD3Config(actor_q=actor_q, target_noise=1.0, target_noise_clip=0.3))
    batch = make_batch(3)
    before = copy.deepcopy(agent)
    stats, rec = recorded_update(agent, batch, monkeypatch)
    assert set(stats) == {"qf1_loss", "qf2_loss", "policy_loss"}
    exp = reference(before, batch, rec.draws[0], actor_critic=agent.critic)
    for k in ("qf1_loss", "qf2_loss", "policy_loss"):
        close(stats[k], exp[k], k)


def test_the_reference_loop_is_sensitive():
    """The expected values respond to what the mutations change (guards against a vacuous comparison)."""
    agent, batch = make_agent("sac", "gru"), make_batch()
    torch.manual_seed(5)
    nn_, pn = torch.randn(T + 1, B, A, dtype=torch.float64), torch.randn(T, B, A, dtype=torch.float64)
    base = reference(agent, batch, nn_, pn, alpha=ALPHA0)
    other = reference(agent, batch, nn_, pn, alpha=2 * ALPHA0)
    assert abs(base["qf1_loss"] - other["qf1_loss"]) > 1e-3 and abs(base["policy_loss"] - other["policy_loss"]) > 1e-3
    # garbage on the padded steps changes nothing; a valid step's reward does
    dirty = Batch(*(x.copy() for x in batch))
    dirty.rewards[3, 1] = 1e6
    assert reference(agent, dirty, nn_, pn, alpha=ALPHA0) == base
    dirty.rewards[2, 1] += 1.0
    assert reference(agent, dirty, nn_, pn, alpha=ALPHA0)["qf1_loss"] != base["qf1_loss"]
