"""The recurrent actor and critic with separate memories (docs/reference.md#architecture), and the agent that
owns them with their targets and optimisers. The update itself is pomdp_ffm/update.py.
"""
from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from .algos import build_algorithm
from .buffer import Batch
from .nets import FeatureExtractor, Mlp
from .seq_models import build as build_seq_model
from .seq_models.ffm import FFM
from .update import Aligned, update


class HistoryEncoder(nn.Module):
    """Embeds (previous action, previous reward, current observation) and runs the memory over them."""

    def __init__(self, obs_dim: int, act_dim: int, cfg):
        super().__init__()
        self.action_embedder = FeatureExtractor(act_dim, cfg.action_embedding_size)
        self.reward_embedder = FeatureExtractor(1, cfg.reward_embedding_size)
        self.observ_embedder = FeatureExtractor(obs_dim, cfg.observ_embedding_size)
        self.input_size = cfg.action_embedding_size + cfg.reward_embedding_size + cfg.observ_embedding_size
        # Bounded by the update after each write (update.bound_memories_), not checked at each call: no host sync.
        self.memory = build_seq_model(cfg.seq_model, input_size=self.input_size, hidden_size=cfg.rnn_hidden_size,
                                      **cfg.seq_model_options()).bounded_by_owner()
        self.hidden_size = cfg.rnn_hidden_size

    def forward(self, prev_actions, rewards, observs, state=None):
        x = torch.cat([self.action_embedder(prev_actions), self.reward_embedder(rewards),
                       self.observ_embedder(observs)], dim=-1)
        return self.memory(x, state)

    def initial_state(self, batch_size: int, device=None):
        return self.memory.initial_state(batch_size, device)


class Actor(nn.Module):
    """History branch + observation shortcut -> policy head (docs/reference.md#actor)."""

    def __init__(self, obs_dim: int, act_dim: int, cfg, head: nn.Module):
        super().__init__()
        self.encoder = HistoryEncoder(obs_dim, act_dim, cfg)
        self.shortcut = FeatureExtractor(obs_dim, cfg.observ_embedding_size)
        self.head = head

    @staticmethod
    def head_input_size(cfg) -> int:
        return cfg.rnn_hidden_size + cfg.observ_embedding_size

    def forward(self, prev_actions, rewards, observs, state=None):
        h, state = self.encoder(prev_actions, rewards, observs, state)
        return self.head(torch.cat([h, self.shortcut(observs)], dim=-1)), state


class Critic(nn.Module):
    """One memory, one [obs, action] shortcut, twin Q heads (docs/reference.md#critic)."""

    def __init__(self, obs_dim: int, act_dim: int, cfg):
        super().__init__()
        self.encoder = HistoryEncoder(obs_dim, act_dim, cfg)
        size = self.encoder.input_size
        self.shortcut = FeatureExtractor(obs_dim + act_dim, size)
        head_in = cfg.rnn_hidden_size + size
        self.qf1 = Mlp(head_in, cfg.dqn_layers, 1)
        self.qf2 = Mlp(head_in, cfg.dqn_layers, 1)

    def history(self, s: Aligned) -> torch.Tensor:
        return self.encoder(*s.history)[0]

    def q(self, h, observs, actions) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([h, self.shortcut(torch.cat([observs, actions], dim=-1))], dim=-1)
        return self.qf1(x), self.qf2(x)

    def forward(self, s: Aligned, actions) -> tuple[torch.Tensor, torch.Tensor]:
        """Q1, Q2 of ``actions`` at each step of ``s``'s history."""
        return self.q(self.history(s), s.observs, actions)


class RecurrentAgent(nn.Module):
    """Separate recurrent actor and critic, their targets and optimisers; SAC or TD3 supplies what differs."""

    def __init__(self, obs_dim: int, act_dim: int, cfg):
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
        for net in (self.actor, self.critic, *(t for t, _ in self.targets())):
            net.encoder.memory.bound_()

    def targets(self) -> list[tuple[nn.Module, nn.Module]]:
        """(target, source) pairs, each target Polyak-averaged towards its source."""
        pairs = [(self.critic_target, self.critic)]
        return pairs + [(self.actor_target, self.actor)] if self.actor_target is not None else pairs

    def actor_step_due(self) -> bool:
        """Whether the next update moves the actor, the targets and the temperature: every update, or every d-th
        with a TD3 policy delay d (counted on the host, never data-dependent)."""
        return (self.num_updates + 1) % self.algo.policy_delay == 0

    def update(self, batch: Batch, grad_norms: bool = False) -> dict[str, torch.Tensor]:
        """One gradient step (pomdp_ffm/update.py) on a sampled batch, counted; the statistics as detached 0-d
        tensors on the agent's device."""
        stats = update(self, Aligned.from_batch(batch, self.device), actor_step_due=self.actor_step_due(),
                       grad_norms=grad_norms)
        self.count_update()
        return stats

    def count_update(self) -> None:
        """One more update done (by ``update``, or by a graph replay of it: pomdp_ffm/graph.py)."""
        self.num_updates += 1

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

    def training_state(self) -> dict:
        """Everything an update depends on, as tensors and plain containers: the weights (actor, critic, targets,
        SAC's log-temperature), the optimisers and the update count (TD3's policy delay)."""
        return {"modules": self.state_dict(), "optim": {k: o.state_dict() for k, o in self.optimizers().items()},
                "num_updates": self.num_updates}

    def load_training_state(self, state: dict) -> None:
        self.load_state_dict(state["modules"])
        for k, o in self.optimizers().items():
            o.load_state_dict(state["optim"][k])
        self.num_updates = int(state["num_updates"])


@torch.no_grad()
def act_with(actor: Actor, algo, obs, prev_action, prev_reward, state, deterministic: bool):
    """RecurrentAgent.act with a given actor (the agent's own, or its CPU copy): inputs go to the actor's device,
    the action comes back as numpy."""
    dev = next(actor.parameters()).device
    # Copies (torch.tensor), never views of the caller's numpy arrays: a CPU matmul's last bits depend on its
    # input's address alignment, and a view starts wherever the caller's array does. Copies start aligned, as
    # the CUDA-graph acting step's static inputs do (acting_graph.ActingRunner), so both compute the same bits.
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
    acting_graph.ActingRunner reads), with the same computation, so its actions are the actor's at ``take()``."""

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
