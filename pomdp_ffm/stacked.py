"""Several seeds' updates as one: per-seed weights stacked along a leading seed dimension
(``train.seed_axis_update=stacked``, patches/018-stacked-seed-update.md).

On a GPU one SAC+FFM update at the BLT shape is a few hundred small kernels, and S seeds updated as S branches
of one CUDA graph are still S times as many. Here the S agents' tensors live in stacked storage ``[S, ...]``;
each agent's parameter is a view of its slice, so that the agent acts, checkpoints, loads and updates alone
exactly as before. A joint update maps the agent's own loss code over the seed dimension with
``torch.func.vmap`` + ``functional_call`` (one set of kernels, batched matmuls), differentiates the sum of the
per-seed losses (seed k's loss depends only on seed k's slice, so its gradient is the one it gets alone), and
steps every seed's own Adam state in one multi-tensor call.

What differs from the seed's updates alone:

* the random draws (SAC's sampled actions, TD3's target noise) are one draw for all seeds (vmap's
  ``randomness="different"``: independent across seeds), not the draws of the seed's own stream;
* batched matmuls sum in another order: float32 rounding (tests/test_stacked.py states the tolerance).

nn.GRU and nn.LSTM have no batching rule (a cuDNN call takes one set of weights): only the memories in
``STACKABLE_MEMORIES`` stack; FFM's recurrence maps through its own rule (seq_models/ffm.py).
"""
from __future__ import annotations

import copy
from typing import Callable, Sequence

import torch
from torch import nn
from torch.func import functional_call, vmap

from .agent import RecurrentAgent, Streams, mean_grad_norm
from .algos import SAC
from .seq_models.ffm import DECAY_MIN, FFM

STACKABLE_MEMORIES = ("ffm", "mlp")


def bump_versions(tensors: list[torch.Tensor]) -> None:
    """Move version counters as an in-place write through these tensors would: writes made through another
    tensor over the same memory (a graph replay, the stacked storage) leave them unmoved, and FFM's acting cache
    of gamma is keyed on them."""
    try:
        torch.autograd.graph.increment_version(tensors)
    except TypeError:  # an older torch takes one tensor at a time
        for t in tensors:
            torch.autograd.graph.increment_version(t)


def _own_storage(module: nn.Module, state_dict: dict, prefix: str, local_metadata) -> None:
    """state_dict post-hook of a stacked agent: its tensors are views of the seeds' shared storage, and
    torch.save writes a view's whole storage; a checkpoint gets copies of the agent's own slices."""
    for k, v in state_dict.items():
        if torch.is_tensor(v) and v.untyped_storage().nbytes() > v.numel() * v.element_size():
            state_dict[k] = v.clone()


class _Linear(torch.autograd.Function):
    """x @ W^T + b for a 2-d x, with the backward written out so that W's gradient is computed as W is laid out
    (g^T @ x, [out, in]); autograd's own backward of x @ W^T makes it as the gradient of W^T seen transposed,
    which the optimisers' kernels would need copied into W's layout first. vmap maps the forward and the
    backward alike (generate_vmap_rule)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        y = torch.mm(x, weight.t())
        return y if bias is None else y + bias

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, weight, _ = inputs
        ctx.save_for_backward(x, weight)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad  # need_b: false for no bias
        return g.mm(weight) if need_x else None, g.t().mm(x) if need_w else None, g.sum(0) if need_b else None


class _SeedMappedLinear(nn.Linear):
    """nn.Linear as the stacked template runs it. Under vmap with per-seed weights, F.linear decomposes into
    addmm's ``1 * b + 1 * (x @ W^T)``, whose multiplications by one are two kernels per layer (forward and
    backward) that change no value; ``_Linear`` is the same arithmetic without them, and lays W's gradient out
    as W. The input is flattened to one matrix per seed, so the product is one batched matmul (not one per
    leading index of the input, with the weight copied for each)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _Linear.apply(x.reshape(-1, x.shape[-1]), self.weight, self.bias)
        return y.reshape(*x.shape[:-1], y.shape[-1])


class _Calls(nn.Module):
    """fn(agent, *args) as a module's forward, for functional_call: the template agent called with given
    tensors."""

    def __init__(self, agent: RecurrentAgent):
        super().__init__()
        self.agent = agent

    def forward(self, fn: Callable, *args):
        return fn(self.agent, *args)


class StackedAgents:
    """S agents of one configuration whose updates run as one (module docstring). ``device_update(streams,
    grad_norms, actor_step)`` is RecurrentAgent.device_update for all of them, seed k on the k-th streams; it returns
    their statistics in the agents' order and reads no device value on the host (CUDA-graph safe)."""

    def __init__(self, agents: Sequence[RecurrentAgent], fused_adam: bool = False):
        self.agents = list(agents)
        # The seeds' Adam steps as PyTorch's fused kernel: one launch per chunk of tensors where the multi-tensor
        # step launches one per operation per chunk (the same arithmetic in another order: an ulp apart in
        # float32). Off until a GPU has timed it (bench update --seeds: stacked+fused).
        self.fused_adam = fused_adam
        first = self.agents[0]
        if len(self.agents) < 2:
            raise ValueError(f"stacking needs at least two agents, got {len(self.agents)}")
        if first.cfg.seq_model not in STACKABLE_MEMORIES:
            raise ValueError(f"train.seed_axis_update=stacked maps the update over the seeds with torch.func.vmap, "
                             f"which seq_model={first.cfg.seq_model!r} does not support; stackable: "
                             f"{list(STACKABLE_MEMORIES)} (train.seed_axis_update=branches runs any memory)")
        for a in self.agents[1:]:
            dtype = lambda x: next(x.parameters()).dtype
            if (a.cfg, a.obs_dim, a.act_dim, a.device, dtype(a)) != \
                    (first.cfg, first.obs_dim, first.act_dim, first.device, dtype(first)):
                raise ValueError("agents stacked together must share their configuration, dimensions, dtype and "
                                 "device")
        template = copy.deepcopy(first)
        for m in template.modules():
            if isinstance(m, FFM):
                m.cache_gamma = False
            if type(m) is nn.Linear:
                m.__class__ = _SeedMappedLinear
        self.calls = _Calls(template)
        self.names = [n for n, _ in first.named_parameters()] + [n for n, _ in first.named_buffers()]
        # the learned tensors of each optimiser, in its parameters' order
        self.learned = {"actor": [f"actor.{n}" for n, _ in first.actor.named_parameters()],
                        "critic": [f"critic.{n}" for n, _ in first.critic.named_parameters()]}
        if "alpha" in first.optimizers():
            self.learned["alpha"] = ["algo.log_alpha"]
        self.memories = {net: f"{net}.encoder.memory." for net in RecurrentAgent.NETS
                         if getattr(first, net) is not None and isinstance(getattr(first, net).encoder.memory, FFM)}
        self.stacked: dict[str, torch.Tensor] = {}
        self._per_seed: dict[str, list[torch.Tensor]] = {}
        for a in self.agents:
            if not getattr(a, "_own_storage_hook", False):
                a.register_state_dict_post_hook(_own_storage)
                a._own_storage_hook = True
        self.link()

    @property
    def template(self) -> RecurrentAgent:
        return self.calls.agent

    # --- storage ----------------------------------------------------------------------------------------
    def link(self) -> None:
        """Stack the agents' current tensors and make each agent's tensor a view of its slice (the Parameter
        objects stay the same, so optimisers and graphs that hold them see the stacked memory)."""
        learned = {n for names in self.learned.values() for n in names}
        tensors = [{**dict(a.named_parameters()), **dict(a.named_buffers())} for a in self.agents]
        for name in self.names:
            ts = [t[name] for t in tensors]
            with torch.no_grad():
                st = torch.stack([t.detach() for t in ts])
            for k, t in enumerate(ts):
                t.data = st[k]
            self.stacked[name] = st.requires_grad_(name in learned)
            self._per_seed[name] = ts
        self._prefixed = {f"agent.{n}": t for n, t in self.stacked.items()}
        # The actor's loss reads the critic, whose weights its step leaves alone: seen detached there, so that no
        # backward computes their gradients (autograd's own formulas skip what autograd.grad was not asked for;
        # a custom Function's backward, _Linear's, cannot tell).
        self._critic_held = {k: t.detach() if k.startswith("agent.critic.") else t for k, t in self._prefixed.items()}

    def linked(self) -> bool:
        return all(t.data_ptr() == self.stacked[n][k].data_ptr()
                   for n, ts in self._per_seed.items() for k, t in enumerate(ts))

    def ensure_linked(self) -> None:
        """Re-stack if anything re-allocated an agent's tensors since (a move, a replaced parameter)."""
        if not self.linked():
            self.link()

    # --- the update -------------------------------------------------------------------------------------
    def map(self, fn: Callable, *args, tensors: dict[str, torch.Tensor] | None = None):
        """fn(agent, *args) for every seed at once: the template agent with seed k's tensors (of ``tensors``,
        by default the stacked ones) and the k-th slice of each argument (the arguments' first dimension is the
        seeds')."""
        call = lambda tensors, *a: functional_call(self.calls, tensors, (fn, *a))
        in_dims = (0, *(None if a is None else 0 for a in args))  # None: an argument TD3 does not have
        return vmap(call, in_dims=in_dims, randomness="different")(tensors or self._prefixed, *args)

    def device_update(self, streams: Streams | Sequence[Streams], grad_norms: bool, actor_step: bool) \
            -> list[dict[str, torch.Tensor]]:
        """RecurrentAgent.device_update of every agent, in the same order of steps; streams: one per agent, or
        theirs stacked along a leading seed dimension (Streams.from_batches)."""
        S = len(self.agents)
        n = streams.observs.shape[0] if isinstance(streams, Streams) else len(streams)
        if n != S:
            raise ValueError(f"one batch per agent: got {n} for {S}")
        s = streams if isinstance(streams, Streams) else Streams(*(torch.stack(x) for x in zip(*streams)))
        out: list[dict[str, torch.Tensor]] = [{} for _ in range(S)]

        def add(stats: dict[str, torch.Tensor]) -> None:
            for k in range(S):
                out[k].update({name: v[k] for name, v in stats.items()})

        self._bound_decays(RecurrentAgent.NETS)
        actor_out = self.map(lambda a, s: a.algo.shared_actor_pass(a, s), s) \
            if self.template.algo.shares_actor_pass else None
        qf1, qf2 = self.map(lambda a, s, o: a.critic_loss(s, o), s, actor_out)
        self._step("critic", (qf1 + qf2).sum())
        self._bound_decays(("critic",))
        add({"qf1_loss": qf1.detach(), "qf2_loss": qf2.detach()})
        if grad_norms:
            for o, a in zip(out, self.agents):
                o["q_grad_norm"] = mean_grad_norm(a.critic)
                o["q_rnn_grad_norm"] = mean_grad_norm(a.critic.encoder.memory)
        if actor_step:
            policy_loss, stats = self.map(lambda a, s, o: a.actor_loss_and_stats(s, o), s, actor_out,
                                          tensors=self._critic_held)
            self._step("actor", policy_loss.sum())
            log_prob_mean = stats.pop("_log_prob_mean", None)
            add(stats)
            if grad_norms:
                for o, a in zip(out, self.agents):
                    o["pi_grad_norm"] = mean_grad_norm(a.actor)
                    o["pi_rnn_grad_norm"] = mean_grad_norm(a.actor.encoder.memory)
            self._polyak()
            self._bound_decays(RecurrentAgent.NETS)
            if isinstance(self.template.algo, SAC):
                if "alpha" in self.learned:
                    self._step("alpha", self.map(lambda a, lp: a.algo.temperature_loss(lp), log_prob_mean).sum())
                add({"alpha": self.map(lambda a: a.algo.alpha.clone())})
        return out

    def _step(self, net: str, loss: torch.Tensor) -> None:
        """The gradients of the seeds' summed loss, handed to each seed's parameters, and one step of all their
        optimisers together."""
        names = self.learned[net]
        grads = torch.autograd.grad(loss, [self.stacked[n] for n in names], allow_unused=True)
        for n, g in zip(names, grads):
            # autograd.grad hands a gradient over in the layout its backward made, where .backward() would lay
            # it out as the parameter is: PyTorch's multi-tensor optimiser kernels take their fast path only where
            # a parameter, its gradient and its state share their strides (else one launch per tensor and
            # operation), and its fused Adam misreads other layouts (measured on a CPU). The template's linear
            # layers make their weights' gradients so (_Linear): no copy there.
            g = None if g is None else _laid_out_as(g, self.stacked[n])
            for k, t in enumerate(self._per_seed[n]):
                t.grad = None if g is None else g[k]
        joint_step([a.optimizers()[net] for a in self.agents], fused=self.fused_adam)

    @torch.no_grad()
    def _polyak(self) -> None:
        tau, moved = self.template.cfg.tau, []
        for target, source in RecurrentAgent.TARGETS.items():
            if getattr(self.template, target) is None:
                continue
            names = [n for n, _ in getattr(self.template, source).named_parameters()]
            torch._foreach_lerp_([self.stacked[f"{target}.{n}"] for n in names],
                                 [self.stacked[f"{source}.{n}"] for n in names], tau)
            moved += [t for n in names for t in self._per_seed[f"{target}.{n}"]]
        bump_versions(moved)

    @torch.no_grad()
    def _bound_decays(self, nets: Sequence[str]) -> None:
        """RecurrentAgent._bound_decays for every seed: one clamp of the stacked decay per memory."""
        moved = []
        for net in nets:
            prefix = self.memories.get(net)
            memory = None if prefix is None else getattr(self.template, net).encoder.memory
            if memory is None or not memory.decay_bound:
                continue
            self.stacked[prefix + "alpha"].clamp_(DECAY_MIN, memory.decay_limit)
            moved += self._per_seed[prefix + "alpha"]
        bump_versions(moved)


def _laid_out_as(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """t with like's strides (like: dense, non-overlapping, of t's shape): t itself seen so where the strides
    differ only in dimensions of size 1, else a copy."""
    if t.shape != like.shape:
        raise ValueError(f"_laid_out_as needs one shape: got {tuple(t.shape)} for {tuple(like.shape)}")
    if t.stride() == like.stride():
        return t
    if all(a == b for a, b, n in zip(t.stride(), like.stride(), t.shape) if n > 1):
        return t.as_strided(like.size(), like.stride())
    return torch.empty_like(like, dtype=t.dtype).copy_(t)


def joint_step(optims: Sequence[torch.optim.Optimizer], fused: bool = False) -> None:
    """One step of several Adam optimisers with the same settings as one optimiser over all their parameters:
    each parameter keeps its own state (moments, step count), so the arithmetic is each optimiser's own, in one
    multi-tensor call instead of one per optimiser (``fused``: as PyTorch's fused implementation)."""
    first = optims[0]
    groups = []
    for i, group in enumerate(first.param_groups):
        settings = {k: v for k, v in group.items() if k != "params"}
        for o in optims[1:]:
            other = {k: v for k, v in o.param_groups[i].items() if k != "params"}
            if other != settings:
                raise ValueError(f"optimisers stepped together must share their settings: {settings} vs {other}")
        if fused:
            settings.update(fused=True, foreach=None)
        groups.append({**settings, "params": [p for o in optims for p in o.param_groups[i]["params"]]})
    joint = type(first)(groups)
    for o in optims:  # the same state dicts (filled in place on a first step), not copies; only the parameters
        # Adam steps (a lookup in the defaultdict would add an empty entry to the seed's state_dict)
        joint.state.update({p: o.state[p] for g in o.param_groups for p in g["params"] if p.grad is not None})
    joint._warned_capturable_if_run_uncaptured = True
    joint.step()
