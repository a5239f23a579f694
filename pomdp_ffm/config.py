"""Config schemas, in the reference's vocabulary (docs/reference.md#config-schema), registered with Hydra's
ConfigStore.

Hydra validates every composed config against these dataclasses, so a misspelt key or a wrong type fails
at start, not days into a run. Every value is also checked against its allowed range when the config is
turned into these objects (``OmegaConf.to_object`` runs each ``__post_init__``): a bad value fails with one
line, ``ValueError: <full key>=<value> must be <rule>`` (patches/105-values-validated-at-start.md). Values that
depend on the task (e.g. ``sampled_seq_len: -1``) are resolved where they are used, never written back into
the config.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, List, Optional

from omegaconf import MISSING


class Refused(Exception):
    """The run was not started: a bad setting or an unusable run directory. Nothing was written. Defined here,
    not in train.py, so that ``python -m pomdp_ffm.train`` (train.py run as ``__main__``, beside the
    ``pomdp_ffm.train`` that seeds.py imports) catches the one class every module raises."""


# Keys of earlier versions -> their current names (patches/104-ffm-option-names.md). check_known_keys and
# check_renamed_overrides refuse an old name with a message naming the new one.
RENAMED_KEYS = {
    "policy.ffm.gamma": "policy.ffm.decay_context_product",
    "policy.ffm.max_len": "policy.ffm.decay_horizon",
}


def _given(value) -> bool:
    # Hydra builds the schema's defaults (MISSING, "???", included) before any value is filled in.
    return not (isinstance(value, str) and value == MISSING)


def _require(key: str, value, ok, rule: str) -> None:
    """``ValueError: <key>=<value> must be <rule>`` unless ``ok(value)``."""
    if not _given(value):
        return
    try:
        good = bool(ok(value))
    except (TypeError, ValueError):
        good = False
    if not good:
        raise ValueError(f"{key}={value!r} must be {rule}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _int_at_least(key: str, value, low: int) -> None:
    _require(key, value, lambda v: _is_int(v) and v >= low, f">= {low}")


def _flag(key: str, value) -> None:
    _require(key, value, lambda v: isinstance(v, bool), "true or false")


def _real(key: str, value, ok, rule: str) -> None:
    """A finite number satisfying ``ok`` (nan and inf are refused as such)."""
    _require(key, value, _is_number, "a finite number")
    _require(key, value, ok, rule)


SEED_AXIS_UPDATES = ("branches", "stacked")
DEVICE_PATTERN = r"auto|cpu|cuda(?::(\d+))?"  # the device's index, if any, is group 1
# Bounds well past any use, that stop a typo from starting a run that cannot work: tens of thousands of torch
# threads crash the process, and every evaluation episode builds an env of its own (the reference plays 10-20).
MAX_THREADS = 256
MAX_EVAL_TASKS = 1000


def _one_of(name: str, value, allowed) -> None:
    if _given(value) and value not in allowed:
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
        _real("policy.sac.entropy_alpha", self.entropy_alpha, lambda v: v >= 0, ">= 0")
        _real("policy.sac.alpha_lr", self.alpha_lr, lambda v: v > 0, "> 0")
        if self.target_entropy is not None:
            _require("policy.sac.target_entropy", self.target_entropy, _is_number,
                     "null (-|A|) or a finite number")
        _one_of("policy.sac.alpha_loss", self.alpha_loss, ("alpha", "log_alpha"))


@dataclass
class TD3Config:
    exploration_noise: float = 0.1
    target_noise: float = 0.2
    target_noise_clip: float = 0.5
    policy_delay: int = 1  # the reference updates the actor at every step (TD3 paper: 2)
    actor_q: str = "min"  # the reference's actor maximises min(Q1, Q2) (TD3 paper: "q1")

    def __post_init__(self):
        for name in ("exploration_noise", "target_noise", "target_noise_clip"):
            _real(f"policy.td3.{name}", getattr(self, name), lambda v: v >= 0, ">= 0")
        _int_at_least("policy.td3.policy_delay", self.policy_delay, 1)
        _one_of("policy.td3.actor_q", self.actor_q, ("min", "q1"))


@dataclass
class FFMConfig:
    """FFM options (see pomdp_ffm.seq_models.ffm.FFM); None sizes mean c = h // 32, m = h // c."""

    context_size: Optional[int] = None
    memory_size: Optional[int] = None
    max_period: float = 128
    min_period: float = 1
    beta: float = 0.01
    # Bounds the learned decay so that |gamma|^(-t) stays representable in float64 over this many steps
    # (the reference's max_len; not the episode length). Also the "closed" aggregator's chunk length.
    decay_horizon: int = 1024
    decay_bound: bool = True
    input_gate: bool = True
    output_gate: bool = True
    context: str = "learned"
    decay: str = "learned"
    # gamma = exp(-alpha) exp(i omega)^T ("outer", the paper) or one alpha and omega per entry ("hadamard").
    # (FFM's complex decay gamma, not the discount policy.gamma.)
    decay_context_product: str = "outer"
    aggregator: str = "auto"
    # Informed initialisation (the paper's decay figure): ranges of t_alpha and t_omega in steps.
    init_trace_range: Optional[List[float]] = None
    init_period_range: Optional[List[float]] = None

    def __post_init__(self):
        from .seq_models.ffm import (AGGREGATORS, DECAY_CONTEXT_PRODUCTS, MAX_DECAY_HORIZON, MIN_CLOSED_DECAY_HORIZON,
                                     PARAM_MODES)

        for name in ("context_size", "memory_size"):
            if getattr(self, name) is not None:
                _require(f"policy.ffm.{name}", getattr(self, name), lambda v: _is_int(v) and v >= 1,
                         "null (derived from policy.rnn_hidden_size) or >= 1")
        _real("policy.ffm.min_period", self.min_period, lambda v: v > 0, "> 0")
        _real("policy.ffm.max_period", self.max_period, lambda v: v >= self.min_period,
              f">= policy.ffm.min_period={self.min_period!r}")
        _real("policy.ffm.beta", self.beta, lambda v: 0 < v < 1, "in (0, 1) (the fraction a trace decays to)")
        _require("policy.ffm.decay_horizon", self.decay_horizon, lambda v: _is_int(v) and 1 <= v <= MAX_DECAY_HORIZON,
                 f"in [1, {MAX_DECAY_HORIZON}] (steps)")
        _one_of("policy.ffm.context", self.context, PARAM_MODES)
        _one_of("policy.ffm.decay", self.decay, PARAM_MODES)
        _one_of("policy.ffm.decay_context_product", self.decay_context_product, DECAY_CONTEXT_PRODUCTS)
        _one_of("policy.ffm.aggregator", self.aggregator, AGGREGATORS)
        if self.aggregator == "closed" and self.decay_horizon < MIN_CLOSED_DECAY_HORIZON:
            raise ValueError(f"policy.ffm.decay_horizon={self.decay_horizon} must be >= {MIN_CLOSED_DECAY_HORIZON} "
                             "with policy.ffm.aggregator=closed (a shorter one lets the decay underflow gamma, whose "
                             "log the closed form takes); the other aggregators take any")
        for name in ("init_trace_range", "init_period_range"):
            r = getattr(self, name)
            if r is not None and not (len(r) == 2 and all(_is_number(v) for v in r)
                                      and 0 < r[0] <= r[1]):
                raise ValueError(f"policy.ffm.{name}={list(r)} must be null or [low, high] in steps with "
                                 "0 < low <= high, both finite, e.g. [32,104]")


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
        sizes = ("action_embedding_size", "observ_embedding_size", "reward_embedding_size")
        for name in sizes:
            _int_at_least(f"policy.{name}", getattr(self, name), 0)  # 0 leaves that input out
        if sum(getattr(self, name) for name in sizes) < 1:
            raise ValueError("policy.action_embedding_size + observ_embedding_size + reward_embedding_size = 0 "
                             "must be >= 1 (the memory needs an input)")
        _int_at_least("policy.rnn_hidden_size", self.rnn_hidden_size, 1)
        _int_at_least("policy.rnn_num_layers", self.rnn_num_layers, 1)
        if self.seq_model not in ("gru", "lstm"):
            _require("policy.rnn_num_layers", self.rnn_num_layers, lambda v: v == 1,
                     f"1 with policy.seq_model={self.seq_model} (only gru and lstm stack layers)")
        for name in ("dqn_layers", "policy_layers"):
            _require(f"policy.{name}", list(getattr(self, name)), lambda v: all(_is_int(x) and x >= 1 for x in v),
                     "a list of layer widths >= 1")
        _real("policy.lr", self.lr, lambda v: v > 0, "> 0")
        _real("policy.gamma", self.gamma, lambda v: 0 <= v <= 1, "in [0, 1]")
        _real("policy.tau", self.tau, lambda v: 0 < v <= 1, "in (0, 1]")
        if self.seq_model == "ffm":
            from .seq_models.ffm import ffm_sizes

            try:
                ffm_sizes(self.rnn_hidden_size, self.ffm.context_size, self.ffm.memory_size)
            except ValueError as e:
                raise ValueError(f"policy.rnn_hidden_size={self.rnn_hidden_size} with policy.ffm.context_size="
                                 f"{self.ffm.context_size}, memory_size={self.ffm.memory_size}: {e}") from None

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

    def __post_init__(self):
        _one_of("env.env_type", self.env_type, ("pomdp",))
        if _given(self.env_name):
            from .envs import get_task

            try:
                get_task(self.env_name)
            except ValueError as e:
                raise ValueError(f"env.env_name={self.env_name!r}: {e}") from None
        _require("env.num_eval_tasks", self.num_eval_tasks, lambda v: _is_int(v) and 1 <= v <= MAX_EVAL_TASKS,
                 f"in [1, {MAX_EVAL_TASKS}] (evaluation episodes, each with an env of its own)")


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
    # On CUDA, run each update, and each acting step, as the replay of a captured CUDA graph (pomdp_ffm/graph.py,
    # patches/015-cuda-graph-update.md); ignored on a CPU. false: eager, as the reference.
    cuda_graph: bool = True
    # TF32 tensor-core matmuls on CUDA (torch.backends.cuda.matmul.allow_tf32): faster, 10-bit mantissas in the
    # products. Off, as in the reference and PyTorch's default (docs/benchmarks.md has its measured effect).
    tf32: bool = False
    # The training env in a worker process (envs.EnvInWorker): the same episodes. In a seed axis whose acting is
    # gathered (on CUDA with graphs) the seeds' envs then step at once, on as many cores; a run alone only pays
    # the round trips (docs/benchmarks.md).
    env_worker: bool = False
    # How the seeds of a seed axis (seeds=[...]) update together on CUDA with train.cuda_graph: "branches", one
    # graph with each seed's update on a branch of its own; "stacked", one update over the seeds' stacked
    # weights (pomdp_ffm/stacked.py, patches/018-stacked-seed-update.md; FFM and MLP memories only).
    seed_axis_update: str = "branches"

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
        _real("train.num_updates_per_iter", self.num_updates_per_iter, lambda v: v > 0, "> 0")
        _int_at_least("train.num_iters", self.num_iters, 1)
        _int_at_least("train.num_init_rollouts_pool", self.num_init_rollouts_pool, 0)
        _int_at_least("train.num_rollouts_per_iter", self.num_rollouts_per_iter, 1)
        _int_at_least("train.batch_size", self.batch_size, 1)
        _require("train.sampled_seq_len", self.sampled_seq_len, lambda v: _is_int(v) and (v == -1 or v >= 2),
                 "-1 (whole episodes) or >= 2")
        if _given(self.sampled_seq_len) and self.sampled_seq_len > size:
            raise ValueError(f"train.buffer_size={size} must be >= train.sampled_seq_len={self.sampled_seq_len}")
        _real("train.sample_weight_baseline", self.sample_weight_baseline, lambda v: v >= 0, ">= 0")
        _flag("train.cuda_graph", self.cuda_graph)
        _flag("train.tf32", self.tf32)
        _flag("train.env_worker", self.env_worker)
        _one_of("train.seed_axis_update", self.seed_axis_update, SEED_AXIS_UPDATES)


@dataclass
class EvalConfig:
    eval_stochastic: bool = False
    log_interval: int = MISSING
    save_interval: int = -1
    log_tensorboard: bool = False
    # Play the num_eval_tasks deterministic episodes together, one batched actor forward per step, on copies of
    # the env whose RNG is chained as the reference's one-after-another episodes chain it: the same episodes
    # (patches/013-evaluation-episodes-together.md). false: one after another on the training env.
    episodes_together: bool = True
    # With episodes_together: each of those envs in a worker process, so that they step at once on several
    # cores (envs.EnvInWorker). The same episodes; faster where env steps cost more than a process round trip
    # and cores are free (docs/benchmarks.md).
    workers: bool = False
    # Play each evaluation during the next burst of updates instead of before it, acting with a copy of the
    # actor taken when the evaluation was due: on a GPU its envs step on the host while the device runs the
    # updates. The same episodes and progress.csv (patches/017-evaluation-during-updates.md). Deterministic
    # evaluations only (a stochastic one draws from torch's generator, as the updates do).
    during_updates: bool = False

    def __post_init__(self):
        _int_at_least("eval.log_interval", self.log_interval, 1)
        _require("eval.save_interval", self.save_interval, lambda v: _is_int(v) and (v == -1 or v >= 1),
                 "-1 (no snapshots) or >= 1")
        _flag("eval.workers", self.workers)
        _flag("eval.during_updates", self.during_updates)
        if self.during_updates is True and self.eval_stochastic is True:
            raise ValueError("eval.during_updates=true needs eval.eval_stochastic=false: a stochastic evaluation "
                             "draws its action noise from torch's generator, which the updates draw from too, so "
                             "it cannot move into them unchanged")
        if self.during_updates is True and self.episodes_together is False:
            raise ValueError("eval.during_updates=true needs eval.episodes_together=true: the evaluation must play "
                             "on copies of the env, while the training env collects the next episode")


@dataclass
class CheckpointConfig:
    # Resume checkpoints (checkpoints/last.pt), on the reference's env-step clock of "iterations".
    interval: int = 20
    save_buffer: bool = True

    def __post_init__(self):
        _int_at_least("checkpoint.interval", self.interval, 1)


@dataclass
class RunConfig:
    seed: int = 0
    # Several seeds of this config trained in one process, each in its own run directory (pomdp_ffm/seeds.py):
    # the directory named by seed (the first of them) and its siblings named by the others.
    seeds: Optional[List[int]] = None
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    num_threads: int = 1  # the reference pins torch to one thread per run
    resume: bool = False  # continue from <run dir>/checkpoints/last.pt when it exists
    progress: bool = True  # a one-line status bar
    env: EnvConfig = field(default_factory=EnvConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def __post_init__(self):
        _require("seed", self.seed, lambda v: _is_int(v) and 0 <= v < 2**32, f"in [0, {2**32 - 1}]")
        if self.seeds is not None:
            seeds = list(self.seeds)
            _require("seeds", seeds, lambda v: len(v) >= 1 and all(_is_int(k) and 0 <= k < 2**32 for k in v)
                     and len(set(v)) == len(v), f"null or a list of distinct seeds in [0, {2**32 - 1}]")
            if self.seed != seeds[0]:
                raise ValueError(f"seeds={seeds} needs seed={seeds[0]} (the first seed names the job's run "
                                 f"directory), not seed={self.seed}")
        _require("device", self.device, lambda v: re.fullmatch(DEVICE_PATTERN, v) is not None,
                 "one of auto, cpu, cuda, cuda:N")  # whether CUDA is there is checked when the run starts
        _require("num_threads", self.num_threads, lambda v: _is_int(v) and 1 <= v <= MAX_THREADS,
                 f"in [1, {MAX_THREADS}] (torch's threads for this run)")
        t = self.train
        if t.seed_axis_update == "stacked":
            from .stacked import STACKABLE_MEMORIES

            if self.policy.seq_model not in STACKABLE_MEMORIES:
                raise ValueError(f"train.seed_axis_update=stacked needs policy.seq_model in "
                                 f"{list(STACKABLE_MEMORIES)} (torch.func.vmap has no rule for nn.GRU and nn.LSTM), "
                                 f"not {self.policy.seq_model!r}; train.seed_axis_update=branches runs any memory")
        if _given(self.env.env_name) and _is_int(t.buffer_size):
            from .envs import get_task

            length = get_task(self.env.env_name).max_episode_steps
            if t.buffer_size < length:
                raise ValueError(f"train.buffer_size={t.buffer_size} must be >= {length}, the episode length of "
                                 f"{self.env.env_name} (the buffer stores whole episodes)")

    def eval_in_workers(self) -> bool:
        """Whether the evaluation plays in worker processes: ``eval.workers`` asks for it, and it applies where the
        evaluation plays on copies of the env (several episodes together, or one deferred by eval.during_updates)."""
        e = self.eval
        return bool(e.workers and e.episodes_together and (self.env.num_eval_tasks > 1 or e.during_updates))

    def env_workers(self) -> bool:
        """Whether this run starts env worker processes (train.env_worker, or an evaluation in workers)."""
        return bool(self.train.env_worker or self.eval_in_workers())


def check_known_keys(cfg, schema=RunConfig, prefix: str = "") -> None:
    """Hydra lets ``+key=value`` append keys that no schema field reads (OmegaConf.to_object then drops them
    silently): refuse them, so that a misspelt option never looks as if it had been applied."""
    import dataclasses

    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key in cfg.keys():
        if f"{prefix}{key}" in RENAMED_KEYS:
            raise ValueError(_renamed(f"{prefix}{key}"))
        if key not in fields:
            raise ValueError(f"unknown config key {prefix}{key!r}; {schema.__name__} has {sorted(fields)}")
        sub = fields[key].default_factory if fields[key].default_factory is not dataclasses.MISSING else None
        if sub is not None and dataclasses.is_dataclass(sub):
            check_known_keys(cfg[key], sub, f"{prefix}{key}.")


def _renamed(old: str) -> str:
    return f"config key {old} was renamed to {RENAMED_KEYS[old]} (patches/104-ffm-option-names.md)"


def check_renamed_overrides(overrides) -> None:
    """Refuse command-line overrides that use a renamed key (``policy.ffm.gamma=outer``, ``+...``, ``~...``)
    with a message naming the new key. Hydra's own error for them ("Could not override ... Key 'gamma' is
    not in struct") names only the old key; call this on ``sys.argv[1:]`` before Hydra composes."""
    for arg in overrides:
        key = str(arg).split("=", 1)[0].lstrip("+~")
        if key in RENAMED_KEYS:
            raise ValueError(_renamed(key))


def with_current_key_names(stored: dict) -> dict:
    """A copy of a stored config (a nested dict, e.g. a run directory's config.yaml or a checkpoint's copy) with
    renamed keys under their current names, so that a run started before a rename compares equal to its
    config composed today. A key present under both names is left as it is (check_known_keys refuses it)."""
    out = {k: with_current_key_names(v) if isinstance(v, dict) else v for k, v in stored.items()}
    for old, new in RENAMED_KEYS.items():
        *path, old_leaf = old.split(".")
        new_leaf = new.rsplit(".", 1)[1]
        node = out
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and old_leaf in node and new_leaf not in node:
            node[new_leaf] = node.pop(old_leaf)
    return out


# Keys (or key prefixes) that may change between the starts of one run directory: where and how it runs, not
# what it learns.
MAY_DIFFER = ("resume", "progress", "device", "num_threads", "checkpoint", "eval.episodes_together", "eval.workers",
              "eval.during_updates", "eval.save_interval", "eval.log_tensorboard", "train.cuda_graph", "train.tf32",
              "train.env_worker", "train.seed_axis_update", "seeds")


def flat_keys(d: dict, prefix: str = "") -> dict:
    """A nested config as ``{"a.b.c": value}``, the form MAY_DIFFER's keys are written in."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat_keys(v, key + "."))
        else:
            out[key] = v
    return out


def _with_defaults(cfg: dict) -> dict:
    """A stored config with the keys it lacks at their defaults: a run started before a key existed ran as its
    default says (a new key's default keeps the old behaviour), so the key's absence is no difference."""
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(RunConfig), cfg))
    except Exception:  # keys this version does not know: compared as they are
        return cfg


def learning_settings(cfg: dict, like: dict | None = None) -> dict:
    """The settings of a config (a nested dict: a run directory's config.yaml, a checkpoint's copy) that change
    what a run learns, flat (``flat_keys``): at their defaults where it lacks them, without MAY_DIFFER's keys,
    and without the options of an algorithm or memory that ``like`` (default: the config itself) does not use (a
    GRU run ignores policy.ffm). Two starts of one run directory must agree on these; two runs of one experiment
    differ in their seed alone."""
    full = _with_defaults(cfg)
    policy = (full if like is None else _with_defaults(like)).get("policy", {}) or {}
    unused = {f"policy.{k}." for k in ("sac", "td3") if k != policy.get("algo_name")}
    if policy.get("seq_model") != "ffm":
        unused.add("policy.ffm.")
    return {k: v for k, v in flat_keys(full).items()
            if not any(k == m or k.startswith(m + ".") for m in MAY_DIFFER)
            and not any(k.startswith(u) for u in unused)}


def register_configs() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="run_schema", node=RunConfig)
