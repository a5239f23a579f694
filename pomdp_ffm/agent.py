"""Recurrent actor and critic with separate memories, and the SAC/TD3 update they share
(docs/reference.md#architecture, docs/reference.md#losses-and-batch-alignment).

Shapes: T = sampled sequence length, B = batch, O/A = observation/action dims, H = memory size.
Training streams are the reference's T+1 extension of a stored window (docs/reference.md#batch-alignment):

    observs = [o_0, o'_0, ..., o'_{T-1}]      [T+1, B, O]
    actions = [0,   a_0,  ..., a_{T-1}]       [T+1, B, A]   (previous-action stream)
    rewards = [0,   r_0,  ..., r_{T-1}]       [T+1, B, 1]
    dones   = [0,   d_0,  ..., d_{T-1}]       [T+1, B, 1]
    masks   =      [m_0,  ..., m_{T-1}]       [T,   B, 1]
"""
from __future__ import annotations

import copy
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from .algos import build_algorithm
from .config import PolicyConfig
from .nets import FeatureExtractor, Mlp
from .seq_models import build as build_seq_model
from .seq_models.ffm import FFM


class Streams(NamedTuple):
    observs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    dones: torch.Tensor
    masks: torch.Tensor

    @classmethod
    def from_batch(cls, batch, device, time_dim: int = 0) -> "Streams":
        """The T+1 alignment with a zero first previous action/reward (docs/reference.md#batch-alignment); time
        along ``time_dim`` (1 for seeds stacked first: from_batches)."""
        t = lambda a: torch.as_tensor(a, device=device)
        obs, act, rew, term, obs2, mask = (t(x) for x in batch)
        first = lambda x: x.narrow(time_dim, 0, 1)
        zero = lambda x: torch.zeros_like(first(x))
        cat = lambda a, b: torch.cat([a, b], dim=time_dim)
        return cls(
            observs=cat(first(obs), obs2),
            actions=cat(zero(act), act),
            rewards=cat(zero(rew), rew),
            dones=cat(zero(term), term),
            masks=mask,
        )

    @classmethod
    def from_batches(cls, batches, device) -> "Streams":
        """Several seeds' streams stacked along a leading seed dimension: one set of operators for any number of
        seeds (the stacked update's input, pomdp_ffm/stacked.py)."""
        def stacked(arrays):
            if all(isinstance(a, np.ndarray) for a in arrays):
                return torch.as_tensor(np.stack(arrays), device=device)  # one copy to the device
            return torch.stack([torch.as_tensor(a, device=device) for a in arrays])

        return cls.from_batch([stacked(arrays) for arrays in zip(*batches)], device, time_dim=1)

    def head(self, n: int) -> "Streams":
        """The first n steps of the history streams (the recurrence is causal)."""
        return Streams(self.observs[:n], self.actions[:n], self.rewards[:n], self.dones[:n], self.masks)


class HistoryEncoder(nn.Module):
    """Embeds (previous action, previous reward, current observation) and runs the memory over them."""

    def __init__(self, obs_dim: int, act_dim: int, cfg: PolicyConfig):
        super().__init__()
        self.action_embedder = FeatureExtractor(act_dim, cfg.action_embedding_size)
        self.reward_embedder = FeatureExtractor(1, cfg.reward_embedding_size)
        self.observ_embedder = FeatureExtractor(obs_dim, cfg.observ_embedding_size)
        self.input_size = cfg.action_embedding_size + cfg.reward_embedding_size + cfg.observ_embedding_size
        self.memory = build_seq_model(cfg.seq_model, input_size=self.input_size, hidden_size=cfg.rnn_hidden_size,
                                      **cfg.seq_model_options())
        self.hidden_size = cfg.rnn_hidden_size

    def forward(self, prev_actions, rewards, observs, state=None):
        x = torch.cat([self.action_embedder(prev_actions), self.reward_embedder(rewards),
                       self.observ_embedder(observs)], dim=-1)
        return self.memory(x, state)

    def initial_state(self, batch_size: int, device=None):
        return self.memory.initial_state(batch_size, device)


class Actor(nn.Module):
    """History branch + observation shortcut -> policy head (docs/reference.md#actor)."""

    def __init__(self, obs_dim: int, act_dim: int, cfg: PolicyConfig, head: nn.Module):
        super().__init__()
        self.encoder = HistoryEncoder(obs_dim, act_dim, cfg)
        self.shortcut = FeatureExtractor(obs_dim, cfg.observ_embedding_size)
        self.head = head

    @staticmethod
    def head_input_size(cfg: PolicyConfig) -> int:
        return cfg.rnn_hidden_size + cfg.observ_embedding_size

    def forward(self, prev_actions, rewards, observs, state=None):
        h, state = self.encoder(prev_actions, rewards, observs, state)
        return self.head(torch.cat([h, self.shortcut(observs)], dim=-1)), state


class Critic(nn.Module):
    """One memory, one [obs, action] shortcut, twin Q heads (docs/reference.md#critic)."""

    def __init__(self, obs_dim: int, act_dim: int, cfg: PolicyConfig):
        super().__init__()
        self.encoder = HistoryEncoder(obs_dim, act_dim, cfg)
        size = self.encoder.input_size
        self.shortcut = FeatureExtractor(obs_dim + act_dim, size)
        head_in = cfg.rnn_hidden_size + size
        self.qf1 = Mlp(head_in, cfg.dqn_layers, 1)
        self.qf2 = Mlp(head_in, cfg.dqn_layers, 1)

    def history(self, streams: Streams) -> torch.Tensor:
        return self.encoder(streams.actions, streams.rewards, streams.observs)[0]

    def q(self, h, observs, actions) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([h, self.shortcut(torch.cat([observs, actions], dim=-1))], dim=-1)
        return self.qf1(x), self.qf2(x)


def masked_mean(x: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """Sum over valid steps divided by their count (docs/reference.md#critic-loss); padded steps contribute
    nothing."""
    return (x * masks).sum() / masks.sum().clamp(min=1.0)


def mean_grad_norm(module: nn.Module) -> torch.Tensor:
    """The reference's diagnostic: the mean over parameter tensors of each tensor's L2 gradient norm, as a 0-d
    tensor on the parameters' device (0 without gradients)."""
    params = list(module.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), device=params[0].device if params else None)
    return torch.stack(torch._foreach_norm(grads)).mean()


def polyak_(target: nn.Module, source: nn.Module, tau: float) -> None:
    with torch.no_grad():
        t, s = list(target.parameters()), list(source.parameters())
        torch._foreach_lerp_(t, s, tau)


class RecurrentAgent(nn.Module):
    """Separate recurrent actor and critic; SAC or TD3 supplies what differs (see algos.py)."""

    NETS = ("actor", "critic", "critic_target", "actor_target")  # actor_target: None where the algorithm has none
    TARGETS = {"critic_target": "critic", "actor_target": "actor"}  # each Polyak-averaged towards its source

    def __init__(self, obs_dim: int, act_dim: int, cfg: PolicyConfig):
        super().__init__()
        self.cfg, self.obs_dim, self.act_dim = cfg, obs_dim, act_dim
        self.algo = build_algorithm(cfg, act_dim)
        head = self.algo.make_head(Actor.head_input_size(cfg), cfg.policy_layers, act_dim)
        self.actor = Actor(obs_dim, act_dim, cfg, head)
        self.critic = Critic(obs_dim, act_dim, cfg)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False) if self.algo.uses_target_actor else None
        self.actor_optim = torch.optim.Adam(self.actor.parameters(), lr=cfg.lr)
        self.critic_optim = torch.optim.Adam(self.critic.parameters(), lr=cfg.lr)
        self.num_updates = 0
        # FFM's decay bound without a host synchronisation: the agent clamps its memories after every write it
        # makes to them (see _bound_decays), and their forward no longer checks (ffm.FFM, "Decay bound").
        for net in self._nets():
            if isinstance(net.encoder.memory, FFM):
                net.encoder.memory.external_decay_bound = True
        self._bound_decays()

    # --------------------------------------------------------------------------------------------
    def update(self, batch, grad_norms: bool = False) -> dict[str, torch.Tensor]:
        """One gradient step: critic, actor, targets, temperature (docs/reference.md#update-order). With a TD3
        policy delay d > 1, the actor and both targets move every d-th step only, as in the TD3 paper.

        Returns the statistics as detached 0-d tensors on the agent's device. Nothing here reads a device value
        on the host (no .item(), no data-dependent branch), so on a GPU the update only queues kernels; the
        caller decides when to synchronise (e.g. once per burst). With tensors already on the device, the only
        host reads left are Adam's step counters, which live on the CPU (unless the optimisers were made
        capturable, see pomdp_ffm/graph.py)."""
        return self.update_streams(Streams.from_batch(batch, self.device), grad_norms)

    def update_streams(self, s: Streams, grad_norms: bool = False) -> dict[str, torch.Tensor]:
        """`update` on streams already built (Streams.from_batch): the host's decision, the device work, the
        count."""
        stats = self.device_update(s, grad_norms, self.actor_step_due())
        self.num_updates += 1
        return stats

    def actor_step_due(self) -> bool:
        """Whether the next update moves the actor, the targets and the temperature: every update, or every d-th
        with a TD3 policy delay d (counted by num_updates, a host integer: never data-dependent)."""
        return (self.num_updates + 1) % self.algo.policy_delay == 0

    def device_update(self, s: Streams, grad_norms: bool, actor_step: bool) -> dict[str, torch.Tensor]:
        """The device work of one update, with the host's two decisions given (gradient-norm diagnostics, the
        actor step): it reads no device value on the host and changes no host state the next update depends
        on (num_updates is the caller's to count), so one call can be captured in a CUDA graph and replayed
        (pomdp_ffm/graph.py)."""
        # Whatever wrote the memories' decays since the last update (a hand-made edit, a dtype change) is bounded
        # before the first call, as the reference's per-call clamp would.
        self._bound_decays()
        # SAC's actor outputs on these inputs are the same before and after the critic step (the actor
        # has not changed), so one forward pass serves both the critic target and the actor loss.
        actor_out = self.algo.shared_actor_pass(self, s)
        stats = self._critic_step(s, actor_out)
        if grad_norms:
            stats["q_grad_norm"] = mean_grad_norm(self.critic)
            stats["q_rnn_grad_norm"] = mean_grad_norm(self.critic.encoder.memory)
        if actor_step:
            stats.update(self._actor_step(s, actor_out))
            if grad_norms:
                stats["pi_grad_norm"] = mean_grad_norm(self.actor)
                stats["pi_rnn_grad_norm"] = mean_grad_norm(self.actor.encoder.memory)
            for target, source in self.TARGETS.items():
                if getattr(self, target) is not None:
                    polyak_(getattr(self, target), getattr(self, source), self.cfg.tau)
            # Only now: the reference's actor is clamped at its next call, so the target actor averages in the
            # unclamped decay; the targets' averages are clamped at their next call too.
            self._bound_decays()
            stats.update(self.algo.update_temperature(stats.pop("_log_prob_mean", None)))
        return stats

    def _nets(self) -> list[nn.Module]:
        return [n for n in (getattr(self, name) for name in self.NETS) if n is not None]

    def _bound_decays(self, *nets: nn.Module) -> None:
        """Clamp the decay of the FFM memories of `nets` (default: all four) in place, unconditionally: the
        values every later call sees are those of the reference's clamp before each call, with no host
        synchronisation. Called at construction, at the start of each update, after the critic's optimiser step
        (the actor loss then runs the critic), and after the actor step and the Polyak averages; load_state_dict
        clamps by itself (an FFM post-hook). Acting calls see no write, so the acting gamma cache stays valid
        between updates."""
        for net in nets or self._nets():
            memory = net.encoder.memory
            if isinstance(memory, FFM):
                memory.bound_decay_()

    def critic_loss(self, s: Streams, actor_out) -> tuple[torch.Tensor, torch.Tensor]:
        """Masked TD errors of both heads against min-of-targets (docs/reference.md#critic-loss)."""
        T = s.masks.shape[0]
        with torch.no_grad():
            next_actions, entropy_bonus = self.algo.next_actions(self, s, actor_out)  # [T+1, B, A], [T+1, B, 1]
            h_target = self.critic_target.history(s)
            q1_t, q2_t = self.critic_target.q(h_target, s.observs, next_actions)
            v_next = torch.min(q1_t, q2_t) + entropy_bonus
            # y_k = r_k + (1 - d_k) * gamma * V_{k+1}: drop the t = 0 entry of the extended stream
            q_target = (s.rewards + (1.0 - s.dones) * self.cfg.gamma * v_next)[1:]
        # The online critic needs hidden states 0..T-1 only: run its memory over T steps, not T+1.
        h = self.critic.history(s.head(T))
        q1, q2 = self.critic.q(h, s.observs[:T], s.actions[1:])
        return masked_mean((q1 - q_target).square(), s.masks), masked_mean((q2 - q_target).square(), s.masks)

    def actor_loss(self, s: Streams, actor_out) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Masked actor objective over steps 0..T-1 (docs/reference.md#actor-loss), and the policy's log-probs
        (SAC)."""
        s = s.head(s.masks.shape[0])
        actions, log_prob = self.algo.policy_actions(self, s, actor_out)
        # The critic's memory sees only stored data, never the actor's actions: no graph through it.
        with torch.no_grad():
            h = self.critic.history(s)
        q1, q2 = self.critic.q(h, s.observs, actions)
        return masked_mean(self.algo.actor_objective(q1, q2, log_prob), s.masks), log_prob

    def _critic_step(self, s: Streams, actor_out) -> dict[str, torch.Tensor]:
        qf1_loss, qf2_loss = self.critic_loss(s, actor_out)
        self.critic_optim.zero_grad(set_to_none=True)
        (qf1_loss + qf2_loss).backward()
        self.critic_optim.step()
        self._bound_decays(self.critic)
        return {"qf1_loss": qf1_loss.detach(), "qf2_loss": qf2_loss.detach()}

    def actor_loss_and_stats(self, s: Streams, actor_out) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The actor's loss, and what the update reports of it (SAC: the policy's entropy, and the mean log-prob
        the temperature step takes)."""
        policy_loss, log_prob = self.actor_loss(s, actor_out)
        stats = {"policy_loss": policy_loss.detach()}
        if log_prob is not None:
            lp = masked_mean(log_prob.detach(), s.masks)
            stats["_log_prob_mean"] = lp
            stats["policy_entropy"] = -lp
        return policy_loss, stats

    def _actor_step(self, s: Streams, actor_out) -> dict[str, torch.Tensor]:
        """The actor's loss and optimiser step; its decay is bounded by update(), after the Polyak averages."""
        policy_loss, stats = self.actor_loss_and_stats(s, actor_out)
        self.actor_optim.zero_grad(set_to_none=True)
        # Only the actor's gradients are wanted: skip the critic weight gradients the reference computes.
        policy_loss.backward(inputs=list(self.actor.parameters()))
        self.actor_optim.step()
        return stats

    # --------------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.critic.parameters()).device

    def initial_state(self, batch_size: int = 1):
        return self.actor.encoder.initial_state(batch_size, self.device)

    def act(self, obs, prev_action, prev_reward, state, deterministic: bool):
        """One acting step with the carried memory state, for one env (obs [O], prev_action [A], prev_reward a
        float) or a batch of envs stepped together (obs [B, O], prev_action [B, A], prev_reward [B]).
        Returns (actions in [-1, 1] with the batch shape of obs, state)."""
        return act_with(self.actor, self.algo, obs, prev_action, prev_reward, state, deterministic)

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Every optimiser, by what it learns (the keys of a checkpoint's optimiser state): actor, critic and SAC's
        learned temperature."""
        return {"actor": self.actor_optim, "critic": self.critic_optim, **self.algo.optimizers()}

    def optimizer_state(self) -> dict:
        return {k: o.state_dict() for k, o in self.optimizers().items()}

    def load_optimizer_state(self, state: dict) -> None:
        for k, o in self.optimizers().items():
            o.load_state_dict(state[k])

    def training_state(self) -> dict:
        """Everything an update depends on, as tensors and plain containers: the weights (actor, critic, targets,
        SAC's log-temperature), the optimisers and the update count (TD3's policy delay)."""
        return {"modules": self.state_dict(), "optim": self.optimizer_state(), "num_updates": self.num_updates}

    def load_training_state(self, state: dict) -> None:
        self.load_state_dict(state["modules"])
        self.load_optimizer_state(state["optim"])
        self.num_updates = int(state["num_updates"])


@torch.no_grad()
def act_with(actor: Actor, algo, obs, prev_action, prev_reward, state, deterministic: bool):
    """RecurrentAgent.act with a given actor (the agent's own, or its CPU copy): inputs go to the actor's device,
    the action comes back as numpy."""
    dev = next(actor.parameters()).device
    # Copies (torch.tensor), never views of the caller's numpy arrays: a CPU matmul's last bits depend on its
    # input's address alignment, and a view starts wherever the caller's array does. Copies start aligned, as
    # the CUDA-graph acting step's static inputs do (graph.ActingRunner), so both compute the same bits.
    f32 = lambda x: torch.tensor(np.asarray(x, np.float32), device=dev)
    o = f32(obs)
    single = o.dim() == 1
    obs_dim, act_dim = o.shape[-1], np.shape(prev_action)[-1]
    o = o.view(1, -1, obs_dim)  # [1, B, O]: one time step
    a = f32(prev_action).view(1, -1, act_dim)
    r = f32(prev_reward).view(1, -1, 1)
    out, state = actor(a, r, o, state)
    action = algo.act(out, deterministic).view(-1, act_dim).cpu().numpy()
    return (action[0] if single else action), state



class ActorSnapshot:
    """A copy of an agent's actor on the agent's device, set to the actor's weights by ``take()``: what an
    evaluation played during the next burst of updates acts with (``eval.during_updates``), while those updates
    move the actor itself. It acts as the agent does (``initial_state``, ``act``, and the attributes
    graph.ActingRunner reads), with the same computation, so its actions are the actor's at ``take()``."""

    def __init__(self, agent: RecurrentAgent):
        self.algo, self.obs_dim, self.act_dim, self.source = agent.algo, agent.obs_dim, agent.act_dim, agent
        self.actor = copy.deepcopy(agent.actor).requires_grad_(False)

    @property
    def device(self) -> torch.device:
        return next(self.actor.parameters()).device

    @torch.no_grad()
    def take(self) -> None:
        """The actor's current weights, copied in place (graphs captured on this copy keep reading them); on
        CUDA the copy is queued after the updates already queued, and before those queued next."""
        for dst, src in zip(self.actor.state_dict().values(), self.source.actor.state_dict().values()):
            dst.copy_(src)
        for m in self.actor.modules():
            if isinstance(m, FFM):
                m.drop_gamma_cache()

    def initial_state(self, batch_size: int = 1):
        return self.actor.encoder.initial_state(batch_size, self.device)

    def act(self, obs, prev_action, prev_reward, state, deterministic: bool):
        return act_with(self.actor, self.algo, obs, prev_action, prev_reward, state, deterministic)


class OffStreamActing:
    """An ActorSnapshot acting eagerly on a CUDA stream of its own, which waits for the work queued before each
    ``take()`` (the updates whose result it copies) and for nothing queued after: its steps run while the
    device works through the next burst's updates, and a step's wait is for its own kernels only.

    Not CUDA-graph replays: a replay writes the default generator's seed and offset into tensors that every
    graph of that generator reads (in some torch releases), so a replay beside queued update graphs could hand
    them the wrong offset. Deterministic eager acting draws nothing and touches no generator state."""

    def __init__(self, snapshot: ActorSnapshot):
        self.snapshot = snapshot
        self.stream = torch.cuda.Stream(device=snapshot.device)

    def take(self) -> None:
        self.snapshot.take()
        self.stream.wait_stream(torch.cuda.current_stream(self.snapshot.device))

    def initial_state(self, batch_size: int = 1):
        with torch.cuda.stream(self.stream):
            return self.snapshot.initial_state(batch_size)

    def act(self, obs, prev_action, prev_reward, state, deterministic: bool):
        with torch.cuda.stream(self.stream):
            return self.snapshot.act(obs, prev_action, prev_reward, state, deterministic)
