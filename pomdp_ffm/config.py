"""Config schemas, in the reference's vocabulary (docs/reference.md#config-schema), registered with Hydra's
ConfigStore.

Hydra composes every config against these dataclasses, so a misspelt key or a value of the wrong type (a field's
annotation) fails at start, in OmegaConf's words naming the key and the value. What a value must be beyond its
type is declared once, beside its field (``checked(default, rule)``), and ``check_rules`` checks every field
when the config is turned into these objects (``OmegaConf.to_object`` runs ``RunConfig.__post_init__``),
followed by the few rules that tie fields together (``_check_together``): a bad value fails with one line,
``ValueError: <full key>=<value> must be <rule>`` (or ``is not one of [...]``;
patches/105-values-validated-at-start.md). The names a field
may take come from their registries: tasks from pomdp_ffm.envs, memories and their options from
pomdp_ffm.seq_models. Values that depend on the task (e.g. ``sampled_seq_len: -1``) are resolved where they are
used, never written back into the config.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, List, NamedTuple, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from .envs import available_tasks, get_task
from .seq_models import available, options
from .seq_models.ffm import (AGGREGATORS, DECAY_CONTEXT_PRODUCTS, MAX_DECAY_HORIZON, MIN_CLOSED_DECAY_HORIZON,
                             PARAM_MODES, ffm_sizes)


class Rule(NamedTuple):
    ok: Callable[[Any], bool]
    says: str  # what the message says of a value that is not ok: "must be > 0", "is not one of [...]"


def must(ok, what: str) -> Rule:
    return Rule(ok, f"must be {what}")


def at_least(low, note: str = "") -> Rule:
    return must(lambda v: v >= low, f">= {low}{note}")


def above(low) -> Rule:
    return must(lambda v: v > low, f"> {low}")


def within(low, high, note: str = "") -> Rule:
    return must(lambda v: low <= v <= high, f"in [{low}, {high}]{note}")


def one_of(names) -> Rule:
    names = tuple(names)
    return Rule(lambda v: v in names, f"is not one of {list(names)}")


def checked(default, rule: Rule):
    """A schema field with its default and the rule its value must satisfy (a list default is copied per object)."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"rule": rule})
    return field(default=default, metadata={"rule": rule})


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _given(value) -> bool:
    # Hydra builds the schema's defaults (MISSING, "???", included) before any value is filled in.
    return not (isinstance(value, str) and value == MISSING)


DEVICE_PATTERN = r"auto|cpu|cuda(?::(\d+))?"  # the device's index, if any, is group 1
SEEDS = 2**32  # numpy's seeds: [0, 2^32 - 1]
_WIDTHS = must(lambda v: all(x >= 1 for x in v), "a list of layer widths >= 1")
_STEP_RANGE = must(lambda v: v is None or (len(v) == 2 and all(math.isfinite(x) for x in v) and 0 < v[0] <= v[1]),
                   "null or [low, high] in steps with 0 < low <= high, both finite, e.g. [32,104]")
_SIZE_OR_NULL = must(lambda v: v is None or v >= 1, "null (derived from policy.rnn_hidden_size) or >= 1")


@dataclass
class SACConfig:
    entropy_alpha: float = checked(0.2, at_least(0))  # used only when automatic_entropy_tuning is false
    automatic_entropy_tuning: bool = True
    alpha_lr: float = checked(3e-4, above(0))
    target_entropy: Optional[float] = None  # None: -|A|
    # The reference's temperature loss multiplies alpha itself; "log_alpha" is the SAC paper's form.
    alpha_loss: str = checked("alpha", one_of(("alpha", "log_alpha")))


@dataclass
class TD3Config:
    exploration_noise: float = checked(0.1, at_least(0))
    target_noise: float = checked(0.2, at_least(0))
    target_noise_clip: float = checked(0.5, at_least(0))
    policy_delay: int = checked(1, at_least(1))  # the reference updates the actor at every step (TD3 paper: 2)
    # The reference's actor maximises min(Q1, Q2) (TD3 paper: "q1").
    actor_q: str = checked("min", one_of(("min", "q1")))


@dataclass
class FFMConfig:
    """FFM options (see pomdp_ffm.seq_models.ffm.FFM); None sizes mean c = h // 32, m = h // c."""

    context_size: Optional[int] = checked(None, _SIZE_OR_NULL)
    memory_size: Optional[int] = checked(None, _SIZE_OR_NULL)
    max_period: float = 128  # >= min_period (_check_together)
    min_period: float = checked(1, above(0))
    beta: float = checked(0.01, must(lambda v: 0 < v < 1, "in (0, 1) (the fraction a trace decays to)"))
    # Bounds the learned decay so that |gamma|^(-t) stays representable in float64 over this many steps
    # (the reference's max_len; not the episode length). Also the "closed" aggregator's chunk length.
    decay_horizon: int = checked(1024, within(1, MAX_DECAY_HORIZON, " (steps)"))
    decay_bound: bool = True
    input_gate: bool = True
    output_gate: bool = True
    context: str = checked("learned", one_of(PARAM_MODES))
    decay: str = checked("learned", one_of(PARAM_MODES))
    # gamma = exp(-alpha) exp(i omega)^T ("outer", the paper) or one alpha and omega per entry ("hadamard").
    # (FFM's complex decay gamma, not the discount policy.gamma.)
    decay_context_product: str = checked("outer", one_of(DECAY_CONTEXT_PRODUCTS))
    aggregator: str = checked("auto", one_of(AGGREGATORS))
    # Informed initialisation (the paper's decay figure): ranges of t_alpha and t_omega in steps.
    init_trace_range: Optional[List[float]] = checked(None, _STEP_RANGE)
    init_period_range: Optional[List[float]] = checked(None, _STEP_RANGE)


# An algorithm's or a memory's own options: a section of policy named after it, used by the runs that choose it.
# The algorithms are those this schema has options for (algos.py builds them; tests/test_config.py checks that the
# two agree).
ALGORITHM_OPTIONS = {"sac": SACConfig, "td3": TD3Config}
MEMORY_OPTIONS = {"ffm": FFMConfig}


@dataclass
class PolicyConfig:
    separate: bool = checked(True, must(lambda v: v is True, "true (one memory shared by actor and critic is not "
                                        "supported; the POMDP track and the FFM paper use separate memories)"))
    seq_model: str = checked("ffm", one_of(available()))
    algo_name: str = checked("sac", one_of(ALGORITHM_OPTIONS))
    # 0 leaves that input out; the three sum to >= 1 (_check_together)
    action_embedding_size: int = checked(16, at_least(0))
    observ_embedding_size: int = checked(32, at_least(0))
    reward_embedding_size: int = checked(16, at_least(0))
    rnn_hidden_size: int = checked(128, at_least(1))
    rnn_num_layers: int = checked(1, at_least(1))  # > 1 only for memories that stack layers (_check_together)
    dqn_layers: List[int] = checked([256, 256], _WIDTHS)
    policy_layers: List[int] = checked([256, 256], _WIDTHS)
    lr: float = checked(3e-4, above(0))
    gamma: float = checked(0.99, within(0, 1))
    tau: float = checked(0.005, must(lambda v: 0 < v <= 1, "in (0, 1]"))
    sac: SACConfig = field(default_factory=SACConfig)
    td3: TD3Config = field(default_factory=TD3Config)
    ffm: FFMConfig = field(default_factory=FFMConfig)

    def seq_model_options(self) -> dict:
        """The keyword options of this memory (seq_models.build): its own section, or the layer count of one
        that stacks layers."""
        if self.seq_model in MEMORY_OPTIONS:
            opts = dataclasses.asdict(getattr(self, self.seq_model))
            return {k: tuple(v) if isinstance(v, list) else v for k, v in opts.items()}
        return {"num_layers": self.rnn_num_layers} if "num_layers" in options(self.seq_model) else {}


@dataclass
class EnvConfig:
    env_type: str = checked("pomdp", one_of(("pomdp",)))
    env_name: str = checked(MISSING, one_of(available_tasks()))
    # A bound far past any use (the reference plays 10-20) that stops a typo from starting a run that cannot work.
    num_eval_tasks: int = checked(20, within(1, 1000, " (evaluation episodes, each with an env of its own)"))


@dataclass
class TrainConfig:
    num_iters: int = checked(MISSING, at_least(1))
    num_init_rollouts_pool: int = checked(MISSING, at_least(0))
    num_rollouts_per_iter: int = checked(1, at_least(1))
    # The reference writes 1e6, which YAML 1.2 (and OmegaConf, and Hydra's override parser) read as a float:
    # any float with an integral value is accepted and stored as an int (patches/100-yaml-numbers.md).
    # At least the sampled window and the task's episode length (_check_together).
    buffer_size: Any = checked(1_000_000, must(lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                                               "a positive whole number (e.g. 1000000 or 1e6)"))
    # A float is a ratio of updates to env steps collected; an int an absolute count per iteration.
    num_updates_per_iter: Any = checked(1.0, must(lambda v: _is_number(v) and v > 0, "> 0 (a float: updates per "
                                                  "env step; an int: updates per iteration)"))
    batch_size: int = checked(MISSING, at_least(1))
    sampled_seq_len: int = checked(MISSING, must(lambda v: v == -1 or v >= 2, "-1 (whole episodes) or >= 2"))
    sample_weight_baseline: float = checked(0.0, at_least(0))
    # On CUDA, run each update, and each acting step, as the replay of a captured CUDA graph (pomdp_ffm/graph.py,
    # patches/015-cuda-graph-update.md); ignored on a CPU. false: eager, as the reference.
    cuda_graph: bool = True
    # TF32 tensor-core matmuls on CUDA (torch.backends.cuda.matmul.allow_tf32): faster, 10-bit mantissas in the
    # products. Off, as in the reference and PyTorch's default (docs/benchmarks.md has its measured effect).
    tf32: bool = False

    def __post_init__(self):
        if isinstance(self.buffer_size, float) and self.buffer_size.is_integer():
            self.buffer_size = int(self.buffer_size)


@dataclass
class EvalConfig:
    eval_stochastic: bool = False
    log_interval: int = checked(MISSING, at_least(1))
    # 0 and other negatives, which the trainer would also read as "off", are refused as ambiguous.
    save_interval: int = checked(-1, must(lambda v: v == -1 or v >= 1, "-1 (no snapshots) or >= 1"))
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
    # evaluations on copies of the env only (_check_together).
    during_updates: bool = False


@dataclass
class CheckpointConfig:
    # Resume checkpoints (checkpoints/last.pt), on the reference's env-step clock of "iterations".
    interval: int = checked(20, at_least(1))
    save_buffer: bool = True


@dataclass
class RunConfig:
    seed: int = checked(0, within(0, SEEDS - 1))
    # Several seeds of this config trained in one process, each in its own run directory (pomdp_ffm/seeds.py):
    # the directory named by seed (the first of them) and its siblings named by the others.
    seeds: Optional[List[int]] = checked(None, must(
        lambda v: v is None or (len(v) >= 1 and all(0 <= k < SEEDS for k in v) and len(set(v)) == len(v)),
        f"null or a list of distinct seeds in [0, {SEEDS - 1}]"))
    # Whether CUDA is there is checked when the run starts (trainer.resolve_device).
    device: str = checked("auto", must(lambda v: re.fullmatch(DEVICE_PATTERN, v) is not None,
                                       "one of auto, cpu, cuda, cuda:N"))
    # The reference pins torch to one thread per run; tens of thousands of threads crash the process.
    num_threads: int = checked(1, within(1, 256, " (torch's threads for this run)"))
    resume: bool = False  # continue from <run dir>/checkpoints/last.pt when it exists
    progress: bool = True  # a one-line status bar
    env: EnvConfig = field(default_factory=EnvConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def __post_init__(self):
        # Once, for the whole tree, where every key's full name is known (OmegaConf.to_object builds the sections
        # first); a section built alone (an agent in a test or a benchmark) is not a user's input.
        check_rules(self)
        _check_together(self)

    def eval_in_workers(self) -> bool:
        """Whether the evaluation plays in worker processes: ``eval.workers`` asks for it, and it applies where the
        evaluation plays on copies of the env (several episodes together, or one deferred by eval.during_updates)."""
        e = self.eval
        return bool(e.workers and e.episodes_together and (self.env.num_eval_tasks > 1 or e.during_updates))


def check_rules(cfg, prefix: str = "") -> None:
    """Every field of a schema object and of its sections against its rule (``checked``); floats must be finite
    (nan and inf are refused as such). Types are OmegaConf's to check."""
    for f in dataclasses.fields(cfg):
        key, value = prefix + f.name, getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            check_rules(value, key + ".")
            continue
        if not _given(value):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{key}={value!r} must be a finite number")
        rule = f.metadata.get("rule")
        try:
            ok = rule is None or bool(rule.ok(value))
        except (TypeError, ValueError):  # a value of another type, in an object built without OmegaConf
            ok = False
        if not ok:
            raise ValueError(f"{key}={value!r} {rule.says}")


def _check_together(c: RunConfig) -> None:
    """The rules that tie one field to another, after each field passed its own."""
    p, f, t, e = c.policy, c.policy.ffm, c.train, c.eval
    if f.max_period < f.min_period:
        raise ValueError(f"policy.ffm.max_period={f.max_period!r} must be >= policy.ffm.min_period={f.min_period!r}")
    if f.aggregator == "closed" and f.decay_horizon < MIN_CLOSED_DECAY_HORIZON:
        raise ValueError(f"policy.ffm.decay_horizon={f.decay_horizon} must be >= {MIN_CLOSED_DECAY_HORIZON} "
                         "with policy.ffm.aggregator=closed (a shorter one lets the decay underflow gamma, whose "
                         "log the closed form takes); the other aggregators take any")
    if p.action_embedding_size + p.observ_embedding_size + p.reward_embedding_size < 1:
        raise ValueError("policy.action_embedding_size + observ_embedding_size + reward_embedding_size = 0 "
                         "must be >= 1 (the memory needs an input)")
    if p.rnn_num_layers != 1 and "num_layers" not in options(p.seq_model):
        stacking = [m for m in available() if "num_layers" in options(m)]
        raise ValueError(f"policy.rnn_num_layers={p.rnn_num_layers} must be 1 with policy.seq_model={p.seq_model} "
                         f"(only {', '.join(stacking)} stack layers)")
    if p.seq_model == "ffm":
        try:
            ffm_sizes(p.rnn_hidden_size, f.context_size, f.memory_size)
        except ValueError as err:
            raise ValueError(f"policy.rnn_hidden_size={p.rnn_hidden_size} with policy.ffm.context_size="
                             f"{f.context_size}, memory_size={f.memory_size}: {err}") from None
    if _given(t.sampled_seq_len) and t.sampled_seq_len > t.buffer_size:
        raise ValueError(f"train.buffer_size={t.buffer_size} must be >= train.sampled_seq_len={t.sampled_seq_len}")
    if _given(c.env.env_name) and t.buffer_size < get_task(c.env.env_name).max_episode_steps:
        raise ValueError(f"train.buffer_size={t.buffer_size} must be >= "
                         f"{get_task(c.env.env_name).max_episode_steps}, the episode length of {c.env.env_name} "
                         "(the buffer stores whole episodes)")
    if e.during_updates and e.eval_stochastic:
        raise ValueError("eval.during_updates=true needs eval.eval_stochastic=false: a stochastic evaluation "
                         "draws its action noise from torch's generator, which the updates draw from too, so "
                         "it cannot move into them unchanged")
    if e.during_updates and not e.episodes_together:
        raise ValueError("eval.during_updates=true needs eval.episodes_together=true: the evaluation must play "
                         "on copies of the env, while the training env collects the next episode")
    if c.seeds is not None and c.seed != c.seeds[0]:
        raise ValueError(f"seeds={list(c.seeds)} needs seed={c.seeds[0]} (the first seed names the job's run "
                         f"directory), not seed={c.seed}")


def _sections(schema) -> dict:
    """A schema's keys -> the schema of the section each holds (None for a value)."""
    return {f.name: f.default_factory if dataclasses.is_dataclass(f.default_factory) else None
            for f in dataclasses.fields(schema)}


def check_known_keys(cfg, schema=RunConfig, prefix: str = "") -> None:
    """Hydra lets ``+key=value`` append keys that no schema field reads (OmegaConf.to_object then drops them
    silently): refuse them, so that a misspelt option never looks as if it had been applied."""
    known = _sections(schema)
    for key in cfg.keys():
        if key not in known:
            raise ValueError(f"unknown config key {prefix}{key!r}; {schema.__name__} has {sorted(known)}")
        if known[key] is not None:
            check_known_keys(cfg[key], known[key], f"{prefix}{key}.")


def _known_only(cfg: dict, schema=RunConfig) -> dict:
    known = _sections(schema)
    return {k: _known_only(v, known[k]) if known[k] is not None and isinstance(v, dict) else v
            for k, v in cfg.items() if k in known}


# Keys (or key prefixes) that may change between the starts of one run directory: where and how it runs, not
# what it learns.
MAY_DIFFER = ("resume", "progress", "device", "num_threads", "checkpoint", "eval.episodes_together", "eval.workers",
              "eval.during_updates", "eval.save_interval", "eval.log_tensorboard", "train.cuda_graph", "train.tf32",
              "seeds")


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
    """A stored config as this version reads it: without the keys it does not know (an older version's switches,
    e.g. train.env_worker, which changed how a run ran, not what it learnt), and with the keys it lacks at their
    defaults (a run started before a key existed ran as its default says: a new key's default keeps the old
    behaviour). Neither is a difference."""
    known = _known_only(cfg)
    try:
        return OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(RunConfig), known))
    except Exception:  # a value of a type this version refuses: compared as it is
        return known


def learning_settings(cfg: dict, like: dict | None = None) -> dict:
    """The settings of a config (a nested dict: a run directory's config.yaml, a checkpoint's copy) that change
    what a run learns, flat (``flat_keys``), as this version reads them (``_with_defaults``), without MAY_DIFFER's
    keys, and without the options of an algorithm or memory that ``like`` (default: the config itself) does not
    use (a GRU run ignores policy.ffm). Two starts of one run directory must agree on these; two runs of one
    experiment differ in their seed alone."""
    full = _with_defaults(cfg)
    policy = (full if like is None else _with_defaults(like)).get("policy", {}) or {}
    chosen = (policy.get("algo_name"), policy.get("seq_model"))
    unused = [f"policy.{k}." for k in (*ALGORITHM_OPTIONS, *MEMORY_OPTIONS) if k not in chosen]
    return {k: v for k, v in flat_keys(full).items()
            if not any(k == m or k.startswith(m + ".") for m in MAY_DIFFER)
            and not any(k.startswith(u) for u in unused)}


def register_configs() -> None:
    ConfigStore.instance().store(name="run_schema", node=RunConfig)
