"""patches/004's measurement: one update of the project's against the reference's form of it, from the same parameters,
batch and random numbers, and the small agents and batches every figure of ``bench ledger`` is measured on.

The reference runs every memory over all T+1 steps: the online critic keeps hidden states 0..T-1; the actor loss runs
the actor again over the T+1 steps (SAC: a second run and a second draw), scores all T+1 actions with the critic, its
memory with gradients, and drops the last step (``policies/models/policy_rnn.py``; docs/reference.md#critic-loss,
#actor-loss). Both sides use the project's forms of what other entries change (019's log-probability, 021's lerp),
so only 004's differences remain. These forms serve the measurement only.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
from torch import nn

from ..agent import RecurrentAgent
from ..algos import SAC
from ..buffer import Batch
from ..catalog import COMPARED
from ..config import PolicyConfig
from ..nets import TanhGaussianHead
from ..optim import PLAIN, AdamForm
from ..update import Aligned, actor_loss, actor_pass, critic_loss, soft_update_, update


def ulp(x: torch.Tensor) -> torch.Tensor:
    """The float32 spacing at |x| (as float64)."""
    x = x.float().abs()
    return (torch.nextafter(x, torch.full_like(x, math.inf)) - x).double()


def small_agent(algo: str, model: str, seed: int = 0, adam: AdamForm = PLAIN) -> RecurrentAgent:
    """Memory 32, layers 32x32, 5 observations, 2 actions: the size every small figure is measured at."""
    torch.manual_seed(seed)
    cfg = PolicyConfig(seq_model=model, algo_name=algo, rnn_hidden_size=32, dqn_layers=[32, 32], policy_layers=[32, 32])
    return RecurrentAgent(5, 2, cfg, adam)


def window_batch(T: int, B: int, seed: int = 0, obs: int = 5, act: int = 2) -> Batch:
    """A batch of B random T-step windows, one of them with a terminal step."""
    rng = np.random.default_rng(seed)
    f = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    terminals = np.zeros((T, B, 1), np.float32)
    terminals[3, min(2, B - 1)] = 1.0
    return Batch(
        f(T, B, obs),
        np.tanh(f(T, B, act)),
        f(T, B, 1),
        terminals,
        f(T, B, obs),
        np.ones((T, B, 1), np.float32),
        np.zeros(B, np.int64),
    )


def updated(agent: RecurrentAgent, batch: Batch, grad_norms: bool = False) -> dict:
    """One eager update of ``agent`` (its update count too), as the trainer's runner makes it: its statistics."""
    aligned = Aligned.from_batch(batch, agent.device)
    stats = update(agent, aligned, actor_step_due=agent.actor_step_due(), grad_norms=grad_norms)
    agent.count_update()
    return stats


def papers_shape_agent(algo: str, model: str, adam: AdamForm = PLAIN) -> RecurrentAgent:
    """The BLT shape (memory 128, layers 256x256) of bench update."""
    from .update import ACT, OBS

    torch.manual_seed(0)
    return RecurrentAgent(OBS, ACT, PolicyConfig(seq_model=model, algo_name=algo), adam)


def papers_shape_batches(n: int, seed: int = 0) -> list[Batch]:
    """Batches of 64 windows of 64 steps, as bench update's."""
    from .update import random_batch

    rng = np.random.default_rng(seed)
    return [random_batch(rng) for _ in range(n)]


FORM_CASES = tuple((algo, model) for algo in ("td3", "sac") for model in (*COMPARED, "mlp"))
FORM_T, FORM_B = 48, 6


def reference_critic_loss(agent: RecurrentAgent, s: Aligned, eps: torch.Tensor):
    """qf1_loss, qf2_loss as the reference computes them; ``eps``: the critic target's draw over the T+1 steps."""
    masks, num_valid = s.masks, s.masks.sum().clamp(min=1.0)
    sac = isinstance(agent.algo, SAC)
    with torch.no_grad():
        if sac:  # the actor's first run
            new_actions, new_log_probs = TanhGaussianHead.squash(*agent.actor.over(s)[0], eps)
        else:
            c = agent.algo.cfg
            noise = (eps * c.target_noise).clamp(-c.target_noise_clip, c.target_noise_clip)
            new_actions = (agent.actor_target.over(s)[0] + noise).clamp(-1, 1)
        next_q1, next_q2 = agent.critic_target(s, new_actions)
        min_next_q = torch.min(next_q1, next_q2)
        if sac:
            min_next_q = min_next_q + agent.algo.alpha * (-new_log_probs)
        q_target = (s.rewards + (1.0 - s.terminals) * agent.cfg.gamma * min_next_q)[1:]
    h = agent.critic.history(s)  # the online critic's memory over all T+1 steps
    q1, q2 = agent.critic.q(h[:-1], s.observs[:-1], s.actions[1:])
    q_target = q_target * masks
    return ((q1 * masks - q_target) ** 2).sum() / num_valid, ((q2 * masks - q_target) ** 2).sum() / num_valid


def reference_actor_loss(agent: RecurrentAgent, s: Aligned, eps: torch.Tensor | None):
    """The policy loss as the reference computes it; ``eps``: SAC's second draw, over the T+1 steps."""
    out = agent.actor.over(s)[0]  # over all T+1 steps
    new_actions, log_probs = TanhGaussianHead.squash(*out, eps) if eps is not None else (out, None)
    q1, q2 = agent.critic(s, new_actions)  # the critic's memory over T+1 steps, in the graph
    policy_loss = -torch.min(q1, q2)
    if log_probs is not None:
        policy_loss = policy_loss + agent.algo.alpha * log_probs
    return (policy_loss[:-1] * s.masks).sum() / s.masks.sum().clamp(min=1.0)


def _grads(loss: torch.Tensor, module: nn.Module, **kw) -> list[torch.Tensor]:
    for p in module.parameters():
        p.grad = None
    loss.backward(**kw)
    return [p.grad.clone() for p in module.parameters()]


def update_both_ways(agent: RecurrentAgent, s: Aligned):
    """((losses, critic gradients, actor gradients) of the project's update, the same of the reference's form),
    without the optimiser steps between them; losses: qf1, qf2, policy."""
    T, B, A = s.masks.shape[0], s.masks.shape[1], s.actions.shape[-1]
    sac = agent.algo.shares_actor_pass
    torch.manual_seed(1)
    out = actor_pass(agent, s) if sac else None
    q1, q2 = critic_loss(agent, s, out)  # draws eps over [T+1, B, A] ...
    critic_grads = _grads(q1 + q2, agent.critic)
    pi, _ = actor_loss(agent, s, out)  # ... then SAC's actions over [T, B, A]
    actor_grads = _grads(pi, agent.actor, inputs=list(agent.actor.parameters()))
    torch.manual_seed(1)
    eps = torch.randn(T + 1, B, A)
    eps_actor = torch.cat([torch.randn(T, B, A), torch.randn(1, B, A)]) if sac else None  # the same T steps
    r1, r2 = reference_critic_loss(agent, s, eps)
    reference_critic = _grads(r1 + r2, agent.critic)
    reference_pi = reference_actor_loss(agent, s, eps_actor)
    reference_actor = _grads(reference_pi, agent.actor)  # (it deposits into the critic too)
    ours, reference = torch.stack([q1, q2, pi]).detach(), torch.stack([r1, r2, reference_pi]).detach()
    return (ours, critic_grads, actor_grads), (reference, reference_critic, reference_actor)


def differences(got: list[torch.Tensor], reference: list[torch.Tensor]) -> tuple[float, float]:
    """The share of elements that differ, and the largest difference relative to its tensor's largest reference
    element."""
    differ = sum(int((g != r).sum()) for g, r in zip(got, reference))
    relative = max(((g - r).abs().max() / r.abs().max().clamp(min=1e-30)).item() for g, r in zip(got, reference))
    return differ / sum(g.numel() for g in got), relative


def form_differences(agent: RecurrentAgent, batch: Batch) -> dict[str, float]:
    """The project's update against the reference's form: the losses' largest distance in ulps, and for the critic's
    and the actor's gradients the share of elements that differ and the largest relative difference."""
    (losses, critic, actor), (ref_losses, ref_critic, ref_actor) = update_both_ways(
        agent, Aligned.from_batch(batch, "cpu")
    )
    critic_share, critic_rel = differences(critic, ref_critic)
    actor_share, actor_rel = differences(actor, ref_actor)
    return {
        "losses_ulps": ((losses - ref_losses).abs().double() / ulp(ref_losses)).max().item(),
        "critic_share": critic_share,
        "critic_relative": critic_rel,
        "actor_share": actor_share,
        "actor_relative": actor_rel,
    }


def td3_gru_updates_apart(n: int = 5, T: int = FORM_T, B: int = FORM_B) -> list[dict[str, float]]:
    """Whole TD3+GRU updates (critic step, actor step, Polyak averages), the project's against the reference's form,
    from the same weights, batches and noise: after each, the losses' distance in ulps, the share of parameters that
    differ, their largest difference relative to its tensor's largest element, and their largest difference."""
    ours = small_agent("td3", "gru")
    theirs = copy.deepcopy(ours)
    apart = []
    for i in range(n):
        batch = window_batch(T, B, seed=i)
        torch.manual_seed(i)
        stats = updated(ours, batch)
        s = Aligned.from_batch(batch, "cpu")
        torch.manual_seed(i)
        q1, q2 = reference_critic_loss(theirs, s, torch.randn_like(s.actions))
        theirs.critic_optim.zero_grad()
        (q1 + q2).backward()
        theirs.critic_optim.step()
        pi = reference_actor_loss(theirs, s, None)
        theirs.actor_optim.zero_grad()
        pi.backward()
        theirs.actor_optim.step()
        for target, source in theirs.targets():
            soft_update_(target, source, theirs.cfg.tau)
        losses = torch.stack([stats[k] for k in ("qf1_loss", "qf2_loss", "policy_loss")])
        reference = torch.stack([q1, q2, pi]).detach()
        a, b = ours.state_dict(), theirs.state_dict()
        share, relative = differences([a[k] for k in a], [b[k] for k in a])
        losses_ulps = ((losses - reference).abs().double() / ulp(reference)).max().item()
        absolute = max((a[k] - b[k]).abs().max().item() for k in a)
        apart.append({"losses_ulps": losses_ulps, "share": share, "relative": relative, "absolute": absolute})
    return apart
