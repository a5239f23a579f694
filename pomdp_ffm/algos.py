"""What SAC and TD3 supply to the shared update skeleton in agent.py.

Each algorithm answers five questions: which policy head, which next actions (and entropy bonus) the
critic target uses, which actions the actor loss differentiates, the per-step actor objective, and what
happens to the temperature. Reference quirks are config fields with the reference's defaults.
"""
from __future__ import annotations

import torch
from torch import nn

from .config import PolicyConfig
from .nets import DeterministicHead, TanhGaussianHead



class SAC(nn.Module):
    uses_target_actor = False
    shares_actor_pass = True  # shared_actor_pass returns what both losses use
    policy_delay = 1
    # The statistics update() reports, in progress.csv's column order (the reference's SAC columns).
    stat_keys = ("qf1_loss", "qf2_loss", "policy_loss", "policy_entropy", "alpha")

    def __init__(self, cfg: PolicyConfig, act_dim: int):
        super().__init__()
        self.cfg = cfg.sac
        self.target_entropy = -float(act_dim) if cfg.sac.target_entropy is None else float(cfg.sac.target_entropy)
        if cfg.sac.automatic_entropy_tuning:
            # log(alpha) starts at 0, i.e. alpha = 1.0; the config's entropy_alpha is then unused (reference).
            self.log_alpha = nn.Parameter(torch.zeros(1))
            self.alpha_optim = torch.optim.Adam([self.log_alpha], lr=cfg.sac.alpha_lr)
        else:
            self.log_alpha, self.alpha_optim = None, None
            # float64 holds the config's number exactly, like the Python float the reference multiplies by: a
            # float32 tensor times this 0-d tensor rounds it to float32 first, as it rounds a Python float.
            # Not persistent: checkpoints keep their keys; the value always comes from the config.
            self.register_buffer("fixed_alpha", torch.tensor(float(cfg.sac.entropy_alpha), dtype=torch.float64),
                                 persistent=False)

    @property
    def alpha(self) -> torch.Tensor:
        """The temperature as a detached 0-d tensor on the agent's device: exp(log_alpha) when tuned (the value
        the reference reads with .item() after each temperature step, without the host synchronisation), else the
        config's entropy_alpha."""
        if self.log_alpha is None:
            return self.fixed_alpha
        return self.log_alpha.detach().exp().view(())

    def make_head(self, input_size, hidden_sizes, act_dim):
        return TanhGaussianHead(input_size, hidden_sizes, act_dim)

    def shared_actor_pass(self, agent, s):
        (mean, log_std), _ = agent.actor(s.actions, s.rewards, s.observs)  # [T+1, B, A] each
        return mean, log_std

    def next_actions(self, agent, s, actor_out):
        mean, log_std = actor_out
        action, log_prob = TanhGaussianHead.sample(mean.detach(), log_std.detach())
        return action, -self.alpha * log_prob

    def policy_actions(self, agent, s, actor_out):
        T = s.masks.shape[0]
        mean, log_std = actor_out
        return TanhGaussianHead.sample(mean[:T], log_std[:T])

    def actor_objective(self, q1, q2, log_prob):
        return self.alpha * log_prob - torch.min(q1, q2)

    def temperature_loss(self, log_prob_mean):
        if self.cfg.alpha_loss == "alpha":  # the reference multiplies alpha itself
            return -(self.log_alpha.exp() * (log_prob_mean + self.target_entropy)).sum()
        return -(self.log_alpha * (log_prob_mean + self.target_entropy)).sum()

    def update_temperature(self, log_prob_mean):
        if self.alpha_optim is not None:
            loss = self.temperature_loss(log_prob_mean)
            self.alpha_optim.zero_grad(set_to_none=True)
            loss.backward()
            self.alpha_optim.step()
        return {"alpha": self.alpha.clone()}  # a copy: never the fixed temperature's buffer itself

    def act(self, out, deterministic: bool):
        mean, log_std = out
        return torch.tanh(mean) if deterministic else TanhGaussianHead.sample(mean, log_std)[0]

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"alpha": self.alpha_optim} if self.alpha_optim is not None else {}


class TD3(nn.Module):
    uses_target_actor = True
    shares_actor_pass = False
    stat_keys = ("qf1_loss", "qf2_loss", "policy_loss")

    def __init__(self, cfg: PolicyConfig, act_dim: int):
        super().__init__()
        self.cfg = cfg.td3
        self.policy_delay = int(cfg.td3.policy_delay)

    def make_head(self, input_size, hidden_sizes, act_dim):
        return DeterministicHead(input_size, hidden_sizes, act_dim)

    def shared_actor_pass(self, agent, s):
        return None  # targets come from the target actor

    def next_actions(self, agent, s, actor_out):
        action, _ = agent.actor_target(s.actions, s.rewards, s.observs)
        c = self.cfg
        noise = (torch.randn_like(action) * c.target_noise).clamp(-c.target_noise_clip, c.target_noise_clip)
        return (action + noise).clamp(-1.0, 1.0), torch.zeros_like(action[..., :1])

    def policy_actions(self, agent, s, actor_out):
        action, _ = agent.actor(s.actions, s.rewards, s.observs)
        return action, None

    def actor_objective(self, q1, q2, log_prob):
        return -(torch.min(q1, q2) if self.cfg.actor_q == "min" else q1)

    def update_temperature(self, log_prob_mean):
        return {}

    def act(self, out, deterministic: bool):
        if deterministic:
            return out
        return (out + torch.randn_like(out) * self.cfg.exploration_noise).clamp(-1.0, 1.0)

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {}


_REGISTRY = {"sac": SAC, "td3": TD3}
ALGORITHMS = tuple(_REGISTRY)


def _lookup(name: str):
    if name not in _REGISTRY:
        raise ValueError(f"unknown algo_name {name!r}; available: {list(ALGORITHMS)}")
    return _REGISTRY[name]


def stat_keys(name: str) -> tuple[str, ...]:
    return _lookup(name).stat_keys


def build_algorithm(cfg: PolicyConfig, act_dim: int) -> nn.Module:
    return _lookup(cfg.algo_name)(cfg, act_dim)
