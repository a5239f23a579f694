"""The recurrent actor and critic with separate memories (docs/reference.md#architecture), and the agent that owns
them with their targets and optimisers; the update itself is pomdp_ffm/update.py."""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from .algos import build_algorithm
from .hostmem import host_memory_left
from .nets import FeatureExtractor, Mlp
from .optim import PLAIN, AdamForm, eager_state
from .seq_models import build as build_seq_model
from .seq_models import drop_caches
from .update import Aligned, bound_memories_


class DoesNotFit(ValueError):
    """An update needs more memory than its device has free (RecurrentAgent.check_update_fits)."""


def free_memory(device: torch.device) -> tuple[int | None, str]:
    """Bytes free on ``device`` and the words naming them: the GPU's, with what torch's allocator holds unused, or
    what the host's tightest limit leaves (hostmem.py; None where nothing can tell)."""
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device), f"free on {device}"
    return host_memory_left()


class HistoryEncoder(nn.Module):
    """Embeds (previous action, previous reward, current observation) and runs the memory over them."""

    def __init__(self, obs_dim: int, act_dim: int, cfg):
        super().__init__()
        self.action_embedder = FeatureExtractor(act_dim, cfg.action_embedding_size)
        self.reward_embedder = FeatureExtractor(1, cfg.reward_embedding_size)
        self.observ_embedder = FeatureExtractor(obs_dim, cfg.observ_embedding_size)
        self.input_size = cfg.action_embedding_size + cfg.reward_embedding_size + cfg.observ_embedding_size
        # Bounded by the update after each write (update.bound_memories_), not per call: no host read.
        self.memory = build_seq_model(
            cfg.seq_model, input_size=self.input_size, hidden_size=cfg.rnn_hidden_size, **cfg.seq_model_kwargs()
        ).bounded_by_owner()

    def forward(self, prev_actions, rewards, observs, state=None):
        x = torch.cat(
            [self.action_embedder(prev_actions), self.reward_embedder(rewards), self.observ_embedder(observs)], dim=-1
        )
        return self.memory(x, state)

    def initial_state(self, batch_size: int, device=None):
        return self.memory.initial_state(batch_size, device)

    def window_start(self, s: Aligned):
        """The state a training window starts from (SeqModel.window_state: zero, at the window's first step)."""
        return self.memory.window_state(s.first_step)


class Actor(nn.Module):
    """History branch + observation shortcut -> policy head (docs/reference.md#actor)."""

    def __init__(self, obs_dim: int, act_dim: int, cfg, head: nn.Module):
        super().__init__()
        self.encoder = HistoryEncoder(obs_dim, act_dim, cfg)
        self.shortcut = FeatureExtractor(obs_dim, cfg.observ_embedding_size)
        self.head = head

    def forward(self, prev_actions, rewards, observs, state=None):
        h, state = self.encoder(prev_actions, rewards, observs, state)
        return self.head(torch.cat([h, self.shortcut(observs)], dim=-1)), state

    def over(self, s: Aligned):
        """The output over a training window and the memory's last state, from where the window starts."""
        return self(*s.history, self.encoder.window_start(s))


class Critic(nn.Module):
    """One memory, one [obs, action] shortcut, twin Q heads (docs/reference.md#critic)."""

    def __init__(self, obs_dim: int, act_dim: int, cfg):
        super().__init__()
        self.encoder = HistoryEncoder(obs_dim, act_dim, cfg)
        self.shortcut = FeatureExtractor(obs_dim + act_dim, self.encoder.input_size)
        self.qf1, self.qf2 = (Mlp(cfg.rnn_hidden_size + self.encoder.input_size, cfg.dqn_layers, 1) for _ in range(2))

    def history(self, s: Aligned) -> torch.Tensor:
        return self.encoder(*s.history, self.encoder.window_start(s))[0]

    def q(self, h, observs, actions) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([h, self.shortcut(torch.cat([observs, actions], dim=-1))], dim=-1)
        return self.qf1(x), self.qf2(x)

    def forward(self, s: Aligned, actions) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q(self.history(s), s.observs, actions)


class RecurrentAgent(nn.Module):
    """Separate recurrent actor and critic, their targets and optimisers; SAC or TD3 supplies what differs."""

    def __init__(self, obs_dim: int, act_dim: int, cfg, adam: AdamForm = PLAIN):
        """``adam``: the form of every optimiser, chosen from the run's settings (trainer.Trainer) and kept for the
        agent's life, across a load."""
        super().__init__()
        self.cfg, self.obs_dim, self.act_dim, self.adam = cfg, obs_dim, act_dim, adam
        self.algo = build_algorithm(cfg, act_dim, adam)
        head = self.algo.make_head(cfg.rnn_hidden_size + cfg.observ_embedding_size, cfg.policy_layers, act_dim)
        self.actor = Actor(obs_dim, act_dim, cfg, head)
        self.critic = Critic(obs_dim, act_dim, cfg)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False) if self.algo.uses_target_actor else None
        self.actor_optim = adam.adam(self.actor.parameters(), lr=cfg.lr)
        self.critic_optim = adam.adam(self.critic.parameters(), lr=cfg.lr)
        self.num_updates = 0
        bound_memories_(self.actor, self.critic, *(t for t, _ in self.targets()))

    def targets(self) -> list[tuple[nn.Module, nn.Module]]:  # (target, source) pairs for Polyak averaging
        pairs = [(self.critic_target, self.critic)]
        return pairs + [(self.actor_target, self.actor)] if self.actor_target is not None else pairs

    def actor_step_due(self) -> bool:
        """Whether the next update moves the actor, targets and temperature (every d-th with a TD3 delay d)."""
        return (self.num_updates + 1) % self.algo.policy_delay == 0

    def count_update(self) -> None:  # by cuda_graph.UpdateRunner, after an update or a graph replay of it
        self.num_updates += 1

    def update_memory(self) -> tuple[int, int]:
        """An update's peak memory in bytes, (beyond the weights, per batch x (window + 1) row): saved activations,
        a float per row per unit of width 2.5 times over (targets, the actor loss's critic heads, gradients). It is
        1.5-2.9x the peak RSS measured on a CPU (torch 2.13; SAC, TD3; all memories; batch 8-64, window 64-4096,
        hidden 32-512)."""
        c, h = self.cfg, self.cfg.rnn_hidden_size
        memory = self.critic.encoder.memory.activation_floats()
        i, o = self.critic.encoder.input_size, c.observ_embedding_size
        actor = i + memory + o + (h + o) + sum(c.policy_layers) + 2 * self.act_dim
        critic = 2 * i + memory + (h + i) + 2 * (sum(c.dqn_layers) + 1)
        window = 3 * (2 * self.obs_dim + self.act_dim + 3) + 4  # the sampled arrays, their indices, as tensors
        params = [*self.actor.parameters(), *self.critic.parameters()]
        size = params[0].element_size()  # fixed: gradients and Adam's two moments
        return 3 * size * sum(p.numel() for p in params), int(size * (2.5 * (actor + critic) + window))

    def check_update_fits(self, train, seq_len: int) -> None:
        """DoesNotFit, naming the batch and window, where an update cannot fit the memory free: at the start, not
        out of memory at the first update."""
        fixed, per_row = self.update_memory()
        (free, where), need = free_memory(self.device), fixed + per_row * train.batch_size * (seq_len + 1)
        if free is None or need <= free:
            return
        rows = max(free - fixed, 0) // per_row
        fits = [f"train.sampled_seq_len <= {rows // train.batch_size - 1}"] if rows // train.batch_size > 2 else []
        fits += [f"train.batch_size <= {rows // (seq_len + 1)}"] if rows // (seq_len + 1) >= 1 else []
        fix = (
            " or ".join(fits) + " fits"
            if fits
            else "smaller networks (policy.rnn_hidden_size, policy.dqn_layers, policy.policy_layers) are needed"
        )
        window = f" ({seq_len} steps)" if train.sampled_seq_len == -1 else ""
        raise DoesNotFit(
            f"train.sampled_seq_len={train.sampled_seq_len}{window} with train.batch_size="
            f"{train.batch_size} needs about {need / 2**30:.1f} GiB for an update, more than the "
            f"{free / 2**30:.1f} GiB {where}; {fix}"
        )

    @property
    def device(self) -> torch.device:
        return next(self.critic.parameters()).device

    def initial_state(self, batch_size: int = 1):
        return self.actor.encoder.initial_state(batch_size, self.device)

    def act(self, obs, prev_action, prev_reward, state, deterministic: bool):
        """One acting step for one env (obs [O], prev_action [A], prev_reward a float) or a batch (obs [B, O], ...):
        (actions in [-1, 1] with obs's batch shape, the next memory state)."""
        return act_with(self.actor, self.algo, obs, prev_action, prev_reward, state, deterministic)

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Every optimiser, by what it learns (the keys of a checkpoint's optimiser state)."""
        return {"actor": self.actor_optim, "critic": self.critic_optim, **self.algo.optimizers()}

    def training_state(self) -> dict:
        """Everything an update depends on: weights, optimisers (in the plain form, whatever the agent's: a checkpoint
        does not depend on the switches), the update count (TD3's policy delay)."""
        return {
            "modules": self.state_dict(),
            "optim": {k: eager_state(o.state_dict()) for k, o in self.optimizers().items()},
            "num_updates": self.num_updates,
        }

    def load_training_state(self, state: dict) -> None:
        self.load_state_dict(state["modules"])
        for k, o in self.optimizers().items():
            o.load_state_dict(self.adam.loadable(state["optim"][k]))
        self.num_updates = int(state["num_updates"])


def agent_shape(obs_dim: int, act_dim: int, cfg) -> RecurrentAgent:
    """The agent as it would be built, on the meta device: its modules and sizes, nothing allocated, no random number
    drawn. What the run's settings are decided from before the agent is built (its weights' bytes, compiling)."""
    with torch.device("meta"), torch.random.fork_rng(devices=[]):
        return RecurrentAgent(obs_dim, act_dim, cfg)


def check_weights_fit(shape: RecurrentAgent) -> None:
    """DoesNotFit, naming the network sizes, where the agent's weights (actor, critic, their targets; ``shape``:
    ``agent_shape``'s) would not fit the host memory it is built in: a refusal by type before the allocation,
    where a failed one would be a torch error told only by its text."""
    need = sum(t.numel() * t.element_size() for t in (*shape.parameters(), *shape.buffers()))
    cfg = shape.cfg
    free, where = host_memory_left()
    if free is not None and need > free:
        raise DoesNotFit(
            f"policy.rnn_hidden_size={cfg.rnn_hidden_size}, policy.dqn_layers={list(cfg.dqn_layers)} and "
            f"policy.policy_layers={list(cfg.policy_layers)} need {need / 2**30:.3g} GiB of weights, more than "
            f"the {free / 2**30:.3g} GiB {where}; smaller networks are needed"
        )


@torch.no_grad()
def act_with(actor: Actor, algo, obs, prev_action, prev_reward, state, deterministic: bool):
    """RecurrentAgent.act with a given actor (the agent's own, or a copy); the action comes back as numpy."""
    dev = next(actor.parameters()).device
    # Copies, never views of the caller's arrays: a CPU matmul's last bits depend on its input's alignment, and
    # copies start aligned as the acting graph's static inputs do (acting_graph.ActingRunner).
    f32 = lambda x: torch.tensor(np.asarray(x, np.float32), device=dev)
    o, a, r = f32(obs), f32(prev_action), f32(prev_reward)
    single, act_dim = o.dim() == 1, a.shape[-1]
    out, state = actor(a.view(1, -1, act_dim), r.view(1, -1, 1), o.view(1, -1, o.shape[-1]), state)  # one step
    action = algo.act(out, deterministic).view(-1, act_dim).cpu().numpy()
    return (action[0] if single else action), state


class ActorSnapshot:
    """A copy of the agent's actor, set to its weights by ``take()``: an evaluation during the next burst of updates
    (``eval.during_updates``) acts with it, as the agent acts, while the updates move the actor itself."""

    def __init__(self, agent: RecurrentAgent):
        self.algo, self.obs_dim, self.act_dim, self.source = agent.algo, agent.obs_dim, agent.act_dim, agent
        self.actor = copy.deepcopy(agent.actor).requires_grad_(False)

    @property
    def device(self) -> torch.device:
        return next(self.actor.parameters()).device

    @torch.no_grad()
    def take(self) -> None:
        """The actor's weights, copied in place (graphs on this copy keep reading them), queued after the updates."""
        for dst, src in zip(self.actor.state_dict().values(), self.source.actor.state_dict().values()):
            dst.copy_(src)
        drop_caches(self.actor)

    initial_state, act = RecurrentAgent.initial_state, RecurrentAgent.act  # they read actor, algo and device


class OffStreamActing:
    """An ActorSnapshot acting on its own CUDA stream, beside the next burst's updates. Eagerly: a graph replay
    writes the generator state that (in some torch releases) queued update graphs read."""

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
