"""Config schemas, in the reference's vocabulary (spec 2.1), registered with Hydra's ConfigStore.

Hydra validates every composed config against these dataclasses, so a misspelt key or a wrong type fails
at start, not days into a run. Values that depend on the task (e.g. ``sampled_seq_len: -1``) are resolved
where they are used, never written back into the config.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from omegaconf import MISSING


def _one_of(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not one of {list(allowed)}")


@dataclass
class SACConfig:
    entropy_alpha: float = 0.2  # used only when automatic_entropy_tuning is false
    automatic_entropy_tuning: bool = True
    alpha_lr: float = 3e-4
    target_entropy: Optional[float] = None  # None: -|A|
    # The reference's temperature loss multiplies alpha itself; "log_alpha" is the SAC paper's form.
    alpha_loss: str = "alpha"

    def __post_init__(self):
        _one_of("policy.sac.alpha_loss", self.alpha_loss, ("alpha", "log_alpha"))


@dataclass
class TD3Config:
    exploration_noise: float = 0.1
    target_noise: float = 0.2
    target_noise_clip: float = 0.5
    policy_delay: int = 1  # the reference updates the actor at every step (TD3 paper: 2)
    actor_q: str = "min"  # the reference's actor maximises min(Q1, Q2) (TD3 paper: "q1")

    def __post_init__(self):
        _one_of("policy.td3.actor_q", self.actor_q, ("min", "q1"))
        if self.policy_delay < 1:
            raise ValueError(f"policy.td3.policy_delay={self.policy_delay} must be >= 1")


@dataclass
class FFMConfig:
    """FFM options (see pomdp_ffm.seq_models.ffm.FFM); None sizes mean c = h // 32, m = h // c."""

    context_size: Optional[int] = None
    memory_size: Optional[int] = None
    max_period: float = 128
    min_period: float = 1
    beta: float = 0.01
    max_len: int = 1024
    decay_bound: bool = True
    input_gate: bool = True
    output_gate: bool = True
    context: str = "learned"
    decay: str = "learned"
    gamma: str = "outer"
    aggregator: str = "auto"
    # Informed initialisation (the paper's decay figure): ranges of t_alpha and t_omega in steps.
    init_trace_range: Optional[List[float]] = None
    init_period_range: Optional[List[float]] = None

    def __post_init__(self):
        for name in ("init_trace_range", "init_period_range"):
            r = getattr(self, name)
            if r is not None and not (len(r) == 2 and 0 < r[0] <= r[1]):
                raise ValueError(f"policy.ffm.{name}={list(r)} must be null or [low, high] in steps with "
                                 "0 < low <= high, e.g. [32,104]")


@dataclass
class PolicyConfig:
    separate: bool = True
    seq_model: str = "ffm"
    algo_name: str = "sac"
    action_embedding_size: int = 16
    observ_embedding_size: int = 32
    reward_embedding_size: int = 16
    rnn_hidden_size: int = 128
    rnn_num_layers: int = 1
    dqn_layers: List[int] = field(default_factory=lambda: [256, 256])
    policy_layers: List[int] = field(default_factory=lambda: [256, 256])
    lr: float = 3e-4
    gamma: float = 0.99
    tau: float = 0.005
    sac: SACConfig = field(default_factory=SACConfig)
    td3: TD3Config = field(default_factory=TD3Config)
    ffm: FFMConfig = field(default_factory=FFMConfig)

    def __post_init__(self):
        from .algos import ALGORITHMS
        from .seq_models import available

        _one_of("policy.algo_name", self.algo_name, ALGORITHMS)
        _one_of("policy.seq_model", self.seq_model, available())
        if not self.separate:
            raise ValueError("policy.separate=false (one memory shared by actor and critic) is not supported; "
                             "the POMDP track and the FFM paper use separate memories")

    def seq_model_options(self) -> dict:
        if self.seq_model == "ffm":
            opts = {k: getattr(self.ffm, k) for k in FFMConfig.__dataclass_fields__}
            for k in ("init_trace_range", "init_period_range"):
                if opts[k] is not None:
                    opts[k] = tuple(opts[k])
            return opts
        if self.seq_model in ("gru", "lstm"):
            return {"num_layers": self.rnn_num_layers}
        return {}


@dataclass
class EnvConfig:
    env_type: str = "pomdp"
    env_name: str = MISSING
    num_eval_tasks: int = 20


@dataclass
class TrainConfig:
    num_iters: int = MISSING
    num_init_rollouts_pool: int = MISSING
    num_rollouts_per_iter: int = 1
    # The reference writes 1e6, which YAML 1.2 (and OmegaConf, and Hydra's override parser) read as a float:
    # any float with an integral value is accepted and stored as an int (patches/100-yaml-numbers.md).
    buffer_size: Any = 1_000_000
    # A float is a ratio of updates to env steps collected; an int an absolute count per iteration.
    num_updates_per_iter: Any = 1.0
    batch_size: int = MISSING
    sampled_seq_len: int = MISSING  # -1: the task's max episode length
    sample_weight_baseline: float = 0.0

    def __post_init__(self):
        size = self.buffer_size
        if isinstance(size, float) and size.is_integer():
            size = self.buffer_size = int(size)
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"train.buffer_size={self.buffer_size!r} must be a positive whole number "
                             "(e.g. 1000000 or 1e6)")
        if not isinstance(self.num_updates_per_iter, (int, float)) or isinstance(self.num_updates_per_iter, bool):
            raise ValueError(f"train.num_updates_per_iter={self.num_updates_per_iter!r} must be a number "
                             "(float: updates per env step; int: updates per iteration)")


@dataclass
class EvalConfig:
    eval_stochastic: bool = False
    log_interval: int = MISSING
    save_interval: int = -1
    log_tensorboard: bool = False


@dataclass
class CheckpointConfig:
    # Resume checkpoints (checkpoints/last.pt), on the reference's env-step clock of "iterations".
    interval: int = 20
    save_buffer: bool = True


@dataclass
class RunConfig:
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    num_threads: int = 1  # the reference pins torch to one thread per run
    resume: bool = False  # continue from <run dir>/checkpoints/last.pt when it exists
    progress: bool = True  # a one-line status bar
    env: EnvConfig = field(default_factory=EnvConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)


def check_known_keys(cfg, schema=RunConfig, prefix: str = "") -> None:
    """Hydra lets ``+key=value`` append keys that no schema field reads (OmegaConf.to_object then drops them
    silently): refuse them, so that a misspelt option never looks as if it had been applied."""
    import dataclasses

    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key in cfg.keys():
        if key not in fields:
            raise ValueError(f"unknown config key {prefix}{key!r}; {schema.__name__} has {sorted(fields)}")
        sub = fields[key].default_factory if fields[key].default_factory is not dataclasses.MISSING else None
        if sub is not None and dataclasses.is_dataclass(sub):
            check_known_keys(cfg[key], sub, f"{prefix}{key}.")


def register_configs() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="run_schema", node=RunConfig)
