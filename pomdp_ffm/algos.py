"""What SAC and TD3 supply to the one update (pomdp_ffm/update.py), as small functions over tensors; reference
quirks are config fields (``policy.sac.*``, ``policy.td3.*``: pomdp_ffm/options.py). Their names, labels and option
sections are pomdp_ffm.catalog's records, which name these classes."""

from __future__ import annotations

import torch
from torch import nn

from . import catalog
from .nets import DeterministicHead, TanhGaussianHead
from .optim import AdamForm


class SAC(nn.Module):
    shares_actor_pass = True  # one actor pass over T+1 steps serves the critic target and the actor loss
    uses_target_actor = False
    policy_delay = 1
    metrics = ("qf1_loss", "qf2_loss", "policy_loss", "policy_entropy", "alpha")  # update()'s, in column order
    make_head = TanhGaussianHead  # (input_size, hidden_sizes, act_dim) -> the policy head

    def __init__(self, policy_cfg, act_dim: int, adam: AdamForm):
        super().__init__()
        self.cfg = cfg = policy_cfg.sac
        self.target_entropy = -float(act_dim) if cfg.target_entropy is None else float(cfg.target_entropy)
        if cfg.automatic_entropy_tuning:
            # alpha starts at 1.0 and the config's entropy_alpha is unused (the reference)
            self.log_alpha = nn.Parameter(torch.zeros(1))
            self.alpha_optim = adam.adam([self.log_alpha], lr=cfg.alpha_lr)
        else:
            self.log_alpha, self.alpha_optim = None, None
            # float64: a float32 tensor times it rounds it as it rounds the reference's Python float. Not
            # persistent: the value always comes from the config.
            self.register_buffer(
                "fixed_alpha", torch.tensor(float(cfg.entropy_alpha), dtype=torch.float64), persistent=False
            )

    @property
    def alpha(self) -> torch.Tensor:
        """The temperature, a detached 0-d tensor (the reference's .item(), without the host read)."""
        return self.fixed_alpha if self.log_alpha is None else self.log_alpha.detach().exp().view(())

    def next_actions(self, policy_out):
        """Actions a' ~ pi(.|h_{t+1}) over the T+1 steps, and the soft value's bonus -alpha log pi(a')."""
        mean, log_std = policy_out
        action, log_prob = TanhGaussianHead.sample(mean.detach(), log_std.detach())
        return action, -self.alpha * log_prob

    @staticmethod
    def policy_actions(policy_out, T: int):
        """Reparameterised actions at steps 0..T-1 of the shared pass, and their log-probabilities."""
        mean, log_std = policy_out
        return TanhGaussianHead.sample(mean[:T], log_std[:T])

    def actor_objective(self, q1, q2, log_prob):
        return self.alpha * log_prob - torch.min(q1, q2)

    def temperature_loss(self, entropy: torch.Tensor) -> torch.Tensor:
        # target_entropy - entropy is the reference's log_prob + target_entropy bit for bit (negation is exact)
        scale = self.log_alpha.exp() if self.cfg.alpha_loss == "alpha" else self.log_alpha
        return -(scale * (self.target_entropy - entropy)).sum()

    def temperature_step(self, entropy: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.alpha_optim is not None:
            loss = self.temperature_loss(entropy)
            self.alpha_optim.zero_grad(set_to_none=True)
            loss.backward()
            self.alpha_optim.step()
        return {"alpha": self.alpha.clone()}  # a copy: never the fixed temperature's buffer itself

    @staticmethod
    def act(policy_out, deterministic: bool):
        mean, log_std = policy_out
        return torch.tanh(mean) if deterministic else TanhGaussianHead.sample(mean, log_std)[0]

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"alpha": self.alpha_optim} if self.alpha_optim is not None else {}


class TD3(nn.Module):
    shares_actor_pass = False  # the critic target's actions come from the target actor
    uses_target_actor = True
    metrics = ("qf1_loss", "qf2_loss", "policy_loss")
    make_head = DeterministicHead

    def __init__(self, policy_cfg, act_dim: int, adam: AdamForm):  # (no optimiser of its own)
        super().__init__()
        self.cfg = policy_cfg.td3
        self.policy_delay = int(self.cfg.policy_delay)

    def next_actions(self, target_actions):
        """The target actor's actions with clipped noise (target policy smoothing), and no bonus."""
        c = self.cfg
        noise = (torch.randn_like(target_actions) * c.target_noise).clamp(-c.target_noise_clip, c.target_noise_clip)
        return (target_actions + noise).clamp(-1.0, 1.0), torch.zeros_like(target_actions[..., :1])

    @staticmethod
    def policy_actions(actions, T: int):
        return actions, None

    def actor_objective(self, q1, q2, log_prob):
        return -(torch.min(q1, q2) if self.cfg.actor_q == "min" else q1)

    @staticmethod
    def temperature_step(entropy) -> dict[str, torch.Tensor]:
        return {}

    def act(self, actions, deterministic: bool):
        noisy = lambda: (actions + torch.randn_like(actions) * self.cfg.exploration_noise).clamp(-1.0, 1.0)
        return actions if deterministic else noisy()

    @staticmethod
    def optimizers() -> dict[str, torch.optim.Optimizer]:
        return {}


_TARGETS = {a.name: a.target for a in catalog.ALGORITHMS}
ALGORITHMS = tuple(_TARGETS)


def get(name: str) -> type[nn.Module]:
    if name not in _TARGETS:
        raise ValueError(f"unknown algo_name {name!r}; available: {list(ALGORITHMS)}")
    return catalog.load(_TARGETS[name])


def build_algorithm(policy_cfg, act_dim: int, adam: AdamForm) -> nn.Module:
    return get(policy_cfg.algo_name)(policy_cfg, act_dim, adam)
