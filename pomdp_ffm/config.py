"""Config schemas in the reference's vocabulary (docs/reference.md#config-schema), registered with Hydra. OmegaConf
checks keys and types, ``checked(default, rule)`` each field's rule (pomdp_ffm/rules.py), ``_check_together`` the
rules tying fields; a bad value is one line, ``<key>=<value> must be <rule>`` (patches/105). ``sampled_seq_len: -1``
is resolved where used. Names come from the registries: tasks (envs.py), algorithms (algos.py) and memories
(seq_models/), each of which declares its own option section, policy.<name>."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from . import catalog
from .envs import available_tasks, get_task
from .options import FFMConfig, SACConfig, TD3Config  # noqa: F401 (the option sections, where callers import them from)
from .rules import above, at_least, check_rules, checked, given, must, one_of, within

DEVICE_PATTERN = r"auto|cpu|cuda(?::(\d+))?"  # the device's index, if any, is group 1
SEEDS = 2**32  # numpy's seeds: [0, 2^32 - 1]
_WIDTHS = must(lambda v: all(x >= 1 for x in v), "a list of layer widths >= 1")


# An algorithm's or a memory's own options: a section of policy named after it, its catalog record's options (a
# dataclass of pomdp_ffm.options, or a plug-in's own): read without importing torch, so analysis can merge defaults.
ALGORITHM_OPTIONS = {a.name: a.options for a in catalog.ALGORITHMS}
MEMORY_OPTIONS = {m.name: m.options for m in catalog.memories().values() if m.options is not None}
SECTIONS = {**ALGORITHM_OPTIONS, **MEMORY_OPTIONS}


@dataclass
class _Policy:  # PolicyConfig but its option sections
    separate: bool = checked(
        True,
        must(
            lambda v: v is True,
            "true (one memory shared by actor and critic is not "
            "supported; the POMDP track and the FFM paper use separate memories)",
        ),
    )
    seq_model: str = checked("ffm", one_of(lambda: list(catalog.memories())))  # (read when checked: plug-ins)
    algo_name: str = checked("sac", one_of(tuple(ALGORITHM_OPTIONS)))
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

    def seq_model_kwargs(self) -> dict:
        """The memory's keyword arguments: its section ``policy.<memory>``, or ``num_layers`` for a stacked RNN."""
        if self.seq_model in MEMORY_OPTIONS:
            opts = dataclasses.asdict(getattr(self, self.seq_model))
            return {k: tuple(v) if isinstance(v, list) else v for k, v in opts.items()}
        return {"num_layers": self.rnn_num_layers} if _stacks_layers(self.seq_model) else {}


def _stacks_layers(name: str) -> bool:
    from .seq_models import keywords  # the model's class (torch), imported where a config is checked or used

    return "num_layers" in keywords(name)


# The policy's fields, then each option section in the registries' order (sac, td3, ffm).
PolicyConfig = dataclasses.make_dataclass(
    "PolicyConfig",
    bases=(_Policy,),
    fields=[(name, section, field(default_factory=section)) for name, section in SECTIONS.items()],
)
PolicyConfig.__module__ = __name__  # (where pickle finds it)


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
    # The reference writes 1e6, a float in YAML 1.2: integral floats are stored as ints (patches/100).
    buffer_size: Any = checked(
        1_000_000,
        must(
            lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
            "a positive whole number (e.g. 1000000 or 1e6)",
        ),
    )
    num_updates_per_iter: Any = checked(
        1.0,
        must(
            lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0,
            "> 0 (a float: updates per env step; an int: updates per iteration)",
        ),
    )
    batch_size: int = checked(MISSING, at_least(1))
    sampled_seq_len: int = checked(MISSING, must(lambda v: v == -1 or v >= 2, "-1 (whole episodes) or >= 2"))
    sample_weight_baseline: float = checked(0.0, at_least(0))
    cuda_graph: bool = True  # on CUDA, updates and acting steps replay captured graphs (patches/015); false: eager
    tf32: bool = False  # TF32 matmuls on CUDA: faster, 10-bit mantissas; off, as the reference (docs/benchmarks.md)
    # The update's losses through torch.compile, its Adam steps fused (patches/020; its first update compiles, tens of
    # seconds). null: where it was measured to pay, FFM on CUDA (docs/benchmarks.md). Off by default until the
    # compiled path with fused Adam has passed tests/test_cuda.py on a GPU (launch/gpu_check.sh).
    compile: Optional[bool] = False

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
    # One batched forward per step on env copies playing the reference's episodes (patches/013); false: one by one.
    episodes_together: bool = True
    workers: bool = False  # each env copy in a worker process: faster where env steps are slow (docs/benchmarks.md)
    during_updates: bool = False  # each evaluation played during the next burst, as the GPU updates (patches/017)


@dataclass
class CheckpointConfig:
    interval: int = checked(20, at_least(1))  # iterations between writes of checkpoints/last.pt
    save_buffer: bool = True


@dataclass
class RunConfig:
    seed: int = checked(0, within(0, SEEDS - 1))
    # Several seeds trained in one process (pomdp_ffm/jobs/seeds.py), each in its own run directory.
    seeds: Optional[List[int]] = checked(
        None,
        must(
            lambda v: v is None or (len(v) >= 1 and all(0 <= k < SEEDS for k in v) and len(set(v)) == len(v)),
            f"null or a list of distinct seeds in [0, {SEEDS - 1}]",
        ),
    )
    # Whether CUDA is there is checked when the run starts (resolve_device).
    device: str = checked(
        "auto", must(lambda v: re.fullmatch(DEVICE_PATTERN, v) is not None, "one of auto, cpu, cuda, cuda:N")
    )
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
        # Here, where every key's full name is known; a section built alone (in a test) is not a user's input.
        _check_plugged_in(self.policy.seq_model)
        check_rules(self)
        _check_together(self)

    def eval_in_workers(self) -> bool:
        e = self.eval  # (workers only where the evaluation plays on copies of the env)
        return bool(e.workers and e.episodes_together and (self.env.num_eval_tasks > 1 or e.during_updates))


def resolve_device(name: str):
    """The torch.device ``name`` (config's ``device``) means here."""
    import torch  # not at the top: analysis reads configs without torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    m = re.fullmatch(DEVICE_PATTERN, name)
    if m is None:
        raise ValueError(f"device={name!r} is not one of ['auto', 'cpu', 'cuda', 'cuda:N']")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} but CUDA is not available here; use device=cpu or device=auto")
    if m.group(1) is not None and int(m.group(1)) >= torch.cuda.device_count():
        raise ValueError(
            f"device={name!r} but this machine has {torch.cuda.device_count()} CUDA device(s), "
            f"cuda:0 to cuda:{torch.cuda.device_count() - 1}"
        )
    return torch.device(name)


def env_step_budget(train: TrainConfig, max_len: int) -> tuple[int, int]:
    """(env steps per iteration of the eval clock, the run's env-step budget) (docs/reference.md#budgets)."""
    iter_len = train.num_rollouts_per_iter * max_len
    return iter_len, max_len * train.num_init_rollouts_pool + train.num_iters * iter_len


def check_eval_clock(cfg: RunConfig, max_len: int) -> None:
    """Evaluations end the post-pool iterations whose count is a multiple of eval.log_interval: without one in the
    budget the run would fail at its end (full-length episodes of ``max_len`` steps; shorter ones only make it
    earlier)."""
    t = cfg.train
    iter_len, budget = env_step_budget(t, max_len)
    last_iters = budget // iter_len
    pool_iters = max_len * t.num_init_rollouts_pool // iter_len
    if last_iters // cfg.eval.log_interval == pool_iters // cfg.eval.log_interval:
        raise ValueError(
            f"eval.log_interval={cfg.eval.log_interval} divides none of the iterations "
            f"{pool_iters + 1}-{last_iters} that follow the initial pool on {cfg.env.env_name} "
            f"(train.num_iters={t.num_iters}, train.num_init_rollouts_pool={t.num_init_rollouts_pool})"
            ": no evaluation would ever be logged"
        )


def _check_plugged_in(name: str) -> None:
    """A plug-in's memory the catalog left out is refused naming why (its package, entry point and error), not as a
    name unknown; a plug-in's class is imported here, among a start's checks, so that one whose module is missing is
    one line before any run directory is made, not a traceback in an empty one (the built-in ones are the package's)."""
    if name not in catalog.memories() and name in catalog.skipped():
        raise ValueError(f"policy.seq_model={name!r}: {catalog.skipped()[name]}")
    if name in catalog.memories() and not catalog.built_in(name):
        from .seq_models import get  # (torch: imported where a config is checked, as _stacks_layers does)

        get(name)


def _check_together(c: RunConfig) -> None:
    p, t, e = c.policy, c.train, c.eval
    # An option section's rules: among its fields (check_together), whichever memory is chosen; with the policy's
    # fields (check_chosen), where its memory is.
    for name in SECTIONS:
        section = getattr(p, name)
        if hasattr(section, "check_together"):
            section.check_together(f"policy.{name}")
    if p.action_embedding_size + p.observ_embedding_size + p.reward_embedding_size < 1:
        raise ValueError(
            "policy.action_embedding_size + observ_embedding_size + reward_embedding_size = 0 "
            "must be >= 1 (the memory needs an input)"
        )
    if p.rnn_num_layers != 1 and not _stacks_layers(p.seq_model):
        raise ValueError(
            f"policy.rnn_num_layers={p.rnn_num_layers} must be 1 with policy.seq_model={p.seq_model} "
            f"(only {', '.join(m for m in catalog.memories() if _stacks_layers(m))} stack layers)"
        )
    if p.seq_model in MEMORY_OPTIONS:
        section = getattr(p, p.seq_model)
        if hasattr(section, "check_chosen"):
            section.check_chosen(f"policy.{p.seq_model}", p)
    steps = get_task(c.env.env_name).max_episode_steps if given(c.env.env_name) else 0
    # A window longer than the task's episodes holds no more of an episode than -1's, only padding, masked out at
    # the update's every step (a window of 500000 on Pendulum crawled); checked before the buffer, which it would
    # otherwise be named as too small for.
    if steps and given(t.sampled_seq_len) and t.sampled_seq_len > steps:
        raise ValueError(
            f"train.sampled_seq_len={t.sampled_seq_len} must be -1 (whole episodes) or in [2, {steps}], "
            f"{steps} being the episode length of {c.env.env_name} (a longer window is only padding)"
        )
    if given(t.sampled_seq_len) and t.sampled_seq_len > t.buffer_size:
        raise ValueError(f"train.buffer_size={t.buffer_size} must be >= train.sampled_seq_len={t.sampled_seq_len}")
    if t.buffer_size < steps:
        raise ValueError(
            f"train.buffer_size={t.buffer_size} must be >= {steps}, the episode length of "
            f"{c.env.env_name} (the buffer stores whole episodes)"
        )
    if e.during_updates and e.eval_stochastic:
        raise ValueError(
            "eval.during_updates=true needs eval.eval_stochastic=false: a stochastic evaluation "
            "draws its action noise from torch's generator, which the updates draw from too, so "
            "it cannot move into them unchanged"
        )
    if e.during_updates and not e.episodes_together:
        raise ValueError(
            "eval.during_updates=true needs eval.episodes_together=true: the evaluation must play "
            "on copies of the env, while the training env collects the next episode"
        )
    if c.seeds is not None and c.seed != c.seeds[0]:
        raise ValueError(
            f"seeds={list(c.seeds)} needs seed={c.seeds[0]} (the first seed names the job's run "
            f"directory), not seed={c.seed}"
        )


def _known_only(cfg: dict, schema=RunConfig, prefix: str = "", refuse: bool = False) -> dict:
    """``cfg`` without the keys no field reads; ``refuse``: a ValueError naming the first instead."""
    known = {
        f.name: f.default_factory if dataclasses.is_dataclass(f.default_factory) else None
        for f in dataclasses.fields(schema)
    }  # key -> the schema of its section, None for a value
    out = {}
    for k, v in cfg.items():
        if k not in known and refuse:
            raise ValueError(f"unknown config key {prefix}{k!r}; {schema.__name__} has {sorted(known)}")
        if k in known:
            out[k] = _known_only(v, known[k], f"{prefix}{k}.", refuse) if known[k] and isinstance(v, dict) else v
    return out


def check_known_keys(cfg: DictConfig) -> None:
    """Refuse keys no field reads (``+key=value``; OmegaConf.to_object would drop them silently)."""
    _known_only(OmegaConf.to_container(cfg), refuse=True)


# Keys (or prefixes) that may change between starts of one run: where and how it runs, not what it learns.
MAY_DIFFER = (
    "resume",
    "progress",
    "device",
    "num_threads",
    "checkpoint",
    "eval.episodes_together",
    "eval.workers",
    "eval.during_updates",
    "eval.save_interval",
    "eval.log_tensorboard",
    "train.cuda_graph",
    "train.tf32",
    "train.compile",
    "seeds",
)


def flat_keys(d: dict, prefix: str = "") -> dict:
    """A nested config as ``{"a.b.c": value}``."""
    return {
        key: value
        for k, v in d.items()
        for key, value in (flat_keys(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v}).items()
    }


_schema = functools.cache(lambda: OmegaConf.structured(RunConfig))  # (a tenth of a second each; merge copies it)


def as_read_now(cfg: dict):
    """A stored config as read now: unknown keys (old switches of how it ran) dropped, missing ones at defaults."""
    return OmegaConf.merge(_schema(), _known_only(cfg))


def _with_defaults(cfg: dict) -> dict:
    """``cfg`` as read now, as a plain dict (not to be changed: a start compares the same configs several times, so
    the merge, a tenth of a second, is made once per config)."""
    try:
        text = json.dumps(cfg, sort_keys=True)
    except (TypeError, ValueError):  # not JSON: merged each time
        return _merged_with_defaults(cfg)
    return _defaults_of_json(text)


@functools.lru_cache(maxsize=32)
def _defaults_of_json(text: str) -> dict:
    return _merged_with_defaults(json.loads(text))


def _merged_with_defaults(cfg: dict) -> dict:
    try:
        return OmegaConf.to_container(as_read_now(cfg))
    except Exception:  # a value of a type this version refuses: compared as it is
        return _known_only(cfg)


def learning_settings(cfg: dict, like: dict | None = None) -> dict:
    """The flat settings starts of one run agree on: not MAY_DIFFER, nor options ``like`` (or ``cfg``) does not use."""
    full = _with_defaults(cfg)
    policy = (full if like is None else _with_defaults(like)).get("policy", {}) or {}
    chosen = (policy.get("algo_name"), policy.get("seq_model"))
    unused = [f"policy.{k}." for k in SECTIONS if k not in chosen]
    return {
        k: v
        for k, v in flat_keys(full).items()
        if not any(k == m or k.startswith(m + ".") for m in MAY_DIFFER) and not any(k.startswith(u) for u in unused)
    }


def yaml_problem(e: BaseException) -> str | None:
    """A YAML file's error (a duplicated key, a bad indent) in one line naming file, line and problem; else None."""
    mark = getattr(e, "problem_mark", None)
    return None if mark is None else f"{mark.name}, line {mark.line + 1}: {getattr(e, 'problem', None) or e}"


def register_configs() -> None:
    store = ConfigStore.instance()
    store.store(name="run_schema", node=RunConfig)
    # A plug-in's memory (pomdp_ffm.catalog) gets its conf group option here, as a built-in one has its file in conf/.
    for name in catalog.memories():
        if not catalog.built_in(name):
            store.store(group="seq_model", name=name, node={"policy": {"seq_model": name}}, package="_global_")
