"""One SAC/TD3 update, top to bottom: critic step, actor step (when due), targets, temperature
(docs/reference.md#update-order, #critic-loss, #actor-loss). SAC and TD3 differ only in the small functions of
algos.py, which see tensors, never the agent.

Shapes: T = sampled sequence length, B = batch, O/A = observation/action dims. The update reads the reference's
T+1 extension of a stored window (docs/reference.md#batch-alignment), ``Aligned``:

    observs   = [o_0, o'_0, ..., o'_{T-1}]      [T+1, B, O]
    actions   = [0,   a_0,  ..., a_{T-1}]       [T+1, B, A]   (the previous actions)
    rewards   = [0,   r_0,  ..., r_{T-1}]       [T+1, B, 1]
    terminals = [0,   d_0,  ..., d_{T-1}]       [T+1, B, 1]
    masks     =      [m_0,  ..., m_{T-1}]       [T,   B, 1]
    first_step = k, o_0's index in its episode  [B]           (int64; where a time-embedded memory starts)

Nothing here reads a device value on the host (no .item(), no data-dependent branch): on a GPU an update only
queues kernels, so that it can be captured once in a CUDA graph and replayed (pomdp_ffm/cuda_graph.py).

``compiled=True`` (``train.compile``) runs the same functions through ``torch.compile``: the actor pass and the two
losses (forward and backward) become inductor's fused kernels; the targets and the temperature stay as they are,
and the agents' Adam is built fused (their optim.AdamForm, chosen by the trainer with the switch;
patches/020-compiled-update.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn

from .buffer import Batch


class Aligned(NamedTuple):
    """A batch in the T+1 alignment, as tensors on the update's device (module docstring)."""

    observs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    terminals: torch.Tensor
    masks: torch.Tensor
    first_step: torch.Tensor

    @classmethod
    def from_batch(cls, batch: Batch, device) -> Aligned:
        """A zero first previous action, reward and terminal; the first observation, then the next ones."""
        t = lambda a: torch.as_tensor(a, device=device)
        first_obs = t(batch.observs)[:1]
        zero_first = lambda a: torch.cat([torch.zeros_like(a[:1]), a])
        return cls(
            observs=torch.cat([first_obs, t(batch.next_observs)]),
            actions=zero_first(t(batch.actions)),
            rewards=zero_first(t(batch.rewards)),
            terminals=zero_first(t(batch.terminals)),
            masks=t(batch.masks),
            first_step=t(batch.first_step),
        )

    def head(self, n: int) -> Aligned:
        """The first n steps of the history (the recurrence is causal)."""
        return self._replace(
            observs=self.observs[:n], actions=self.actions[:n], rewards=self.rewards[:n], terminals=self.terminals[:n]
        )

    @property
    def history(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A memory's inputs: (previous actions, previous rewards, observations)."""
        return self.actions, self.rewards, self.observs


def masked_mean(x: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """Sum over valid steps divided by their count (docs/reference.md#critic-loss): padded steps contribute
    nothing."""
    return (x * masks).sum() / masks.sum().clamp(min=1.0)


def mean_grad_norm(module: nn.Module) -> torch.Tensor:
    """The reference's diagnostic: the mean over parameter tensors of each tensor's L2 gradient norm (0-d, on the
    parameters' device; 0 without gradients)."""
    params = list(module.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), device=params[0].device if params else None)
    return torch.stack(torch._foreach_norm(grads)).mean()


def soft_update_(target: nn.Module, source: nn.Module, tau: float) -> None:
    """Polyak averaging: target <- (1 - tau) target + tau source."""
    with torch.no_grad():
        torch._foreach_lerp_(list(target.parameters()), list(source.parameters()), tau)


def bound_memories_(*nets: nn.Module) -> None:
    """Each net's memory projected back into its allowed range after a write to it (FFM's decay bound; a no-op
    for the others): see SeqModel.bound_."""
    for net in nets:
        net.encoder.memory.bound_()


def critic_loss(agent, s: Aligned, policy_out) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked TD errors of both heads against min-of-targets. ``policy_out``: the actor's output over the T+1
    steps where the algorithm shares it (SAC), else None (TD3: the target actor acts)."""
    T = s.masks.shape[0]
    with torch.no_grad():
        if policy_out is None:
            policy_out = agent.actor_target.over(s)[0]
        next_actions, entropy_bonus = agent.algo.next_actions(policy_out)  # [T+1, B, A], [T+1, B, 1]
        q1_next, q2_next = agent.critic_target(s, next_actions)
        v_next = torch.min(q1_next, q2_next) + entropy_bonus
        # y_k = r_k + (1 - d_k) gamma V_{k+1}: drop the k = 0 entry of the extended sequences
        q_target = (s.rewards + (1.0 - s.terminals) * agent.cfg.gamma * v_next)[1:]
    # The online critic needs hidden states 0..T-1 only: its memory runs over T steps, not T+1.
    q1, q2 = agent.critic(s.head(T), s.actions[1:])
    return masked_mean((q1 - q_target).square(), s.masks), masked_mean((q2 - q_target).square(), s.masks)


def actor_loss(agent, s: Aligned, policy_out) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The masked actor objective over steps 0..T-1, and the policy's log-probabilities (SAC; None for TD3)."""
    T = s.masks.shape[0]
    s = s.head(T)
    if policy_out is None:
        policy_out = agent.actor.over(s)[0]
    actions, log_prob = agent.algo.policy_actions(policy_out, T)
    # The critic's memory sees only stored data, never the actor's actions: no graph through it.
    with torch.no_grad():
        h = agent.critic.history(s)
    q1, q2 = agent.critic.q(h, s.observs, actions)
    return masked_mean(agent.algo.actor_objective(q1, q2, log_prob), s.masks), log_prob


def actor_pass(agent, s: Aligned):
    """The actor's output over all T+1 steps (SAC's shared pass)."""
    return agent.actor.over(s)[0]


class Losses(NamedTuple):
    actor_pass: Callable
    critic_loss: Callable
    actor_loss: Callable


EAGER = Losses(actor_pass, critic_loss, actor_loss)


@functools.cache
def compiled_losses() -> Losses:
    """EAGER through ``torch.compile``, built once per process: one compiled function serves every agent of one
    architecture (a seed axis's too), the modules' parameters being its inputs. ``fullgraph``: a graph break is an
    error, never a silent split into eager pieces. ``fallback_random``: random numbers from the eager generator,
    so a compiled update draws the eager update's noise. ``dynamic=False``: one graph per window length."""

    def compile_(fn: Callable) -> Callable:
        compiled = torch.compile(fn, fullgraph=True, dynamic=False, options={"fallback_random": True})

        def call(*args):
            # allow_rnn: nn.GRU/nn.LSTM traced as their per-step operations (dynamo cannot call cuDNN's kernel)
            with torch._dynamo.config.patch(allow_rnn=True):
                return compiled(*args)

        return call

    return Losses(*map(compile_, EAGER))


def step_critic(agent, qf1_loss: torch.Tensor, qf2_loss: torch.Tensor, grad_norms: bool) -> dict[str, torch.Tensor]:
    """The critic's optimiser step on its two losses; their statistics."""
    agent.critic_optim.zero_grad(set_to_none=True)
    (qf1_loss + qf2_loss).backward()
    agent.critic_optim.step()
    bound_memories_(agent.critic)  # the actor loss runs the critic next
    stats = {"qf1_loss": qf1_loss.detach(), "qf2_loss": qf2_loss.detach()}
    if grad_norms:
        stats |= {
            "q_grad_norm": mean_grad_norm(agent.critic),
            "q_rnn_grad_norm": mean_grad_norm(agent.critic.encoder.memory),
        }
    return stats


def step_actor(agent, masks, policy_loss: torch.Tensor, log_prob, grad_norms: bool) -> dict[str, torch.Tensor]:
    """The actor's optimiser step on its loss; its memory is bounded by ``update`` after the targets have averaged it
    in. ``log_prob``: SAC's log-probabilities, for the entropy estimate the temperature step reads (TD3: None)."""
    agent.actor_optim.zero_grad(set_to_none=True)
    # Only the actor's gradients are wanted: skip the critic weight gradients the reference computes.
    policy_loss.backward(inputs=list(agent.actor.parameters()))
    agent.actor_optim.step()
    stats = {"policy_loss": policy_loss.detach()}
    if log_prob is not None:
        stats["policy_entropy"] = -masked_mean(log_prob.detach(), masks)
    if grad_norms:
        stats |= {
            "pi_grad_norm": mean_grad_norm(agent.actor),
            "pi_rnn_grad_norm": mean_grad_norm(agent.actor.encoder.memory),
        }
    return stats


def update(
    agent, s: Aligned, *, actor_step_due: bool, grad_norms: bool = False, compiled: bool = False
) -> dict[str, torch.Tensor]:
    """One gradient step of ``agent`` (a RecurrentAgent) on the aligned batch ``s``: its statistics as detached 0-d
    tensors on the device (the metric names of pomdp_ffm/metrics.py). ``actor_step_due``: whether the actor, the
    targets and the temperature move (every update, or every d-th with a TD3 policy delay d; the host decides);
    ``grad_norms``: the gradient-norm diagnostics; ``compiled``: the losses through torch.compile (module
    docstring)."""
    fns = compiled_losses() if compiled else EAGER
    # SAC's actor outputs are the same before and after the critic step (the actor has not moved), so one
    # forward pass serves both the critic target and the actor loss (patches/004).
    policy_out = fns.actor_pass(agent, s) if agent.algo.shares_actor_pass else None
    stats = step_critic(agent, *fns.critic_loss(agent, s, policy_out), grad_norms)
    if not actor_step_due:
        return stats
    stats |= step_actor(agent, s.masks, *fns.actor_loss(agent, s, policy_out), grad_norms)
    for target, source in agent.targets():
        soft_update_(target, source, agent.cfg.tau)
    # Only now: the reference clamps the actor's decay at its next call, so the target actor averages in the
    # unclamped one; the targets' averages are clamped at their next call too.
    bound_memories_(agent.actor, *(target for target, _ in agent.targets()))
    return stats | agent.algo.temperature_step(stats.get("policy_entropy"))
