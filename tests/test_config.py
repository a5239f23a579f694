"""The config tree (conf/): every combination composes and validates, reference values, clear errors."""

from __future__ import annotations

import copy
import functools
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import DictConfig, OmegaConf

from pomdp_ffm.algos import ALGORITHMS
from pomdp_ffm.config import ALGORITHM_OPTIONS, RunConfig, check_known_keys, learning_settings, register_configs
from pomdp_ffm.envs import available_tasks
from pomdp_ffm.seq_models import available, build

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
ENVS = sorted(p.stem for p in (CONF / "env").glob("*.yaml"))
ALGOS = sorted(p.stem for p in (CONF / "algo").glob("*.yaml"))
MODELS = sorted(p.stem for p in (CONF / "seq_model").glob("*.yaml"))
PRESETS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
BLT_PAPER = [f"{n}BLT-{v}-v0" for n in ("Ant", "HalfCheetah", "Hopper", "Walker") for v in "PV"]
GROUPS = {p.name for p in CONF.iterdir() if p.is_dir()}
PARSER = OverridesParser.create()

register_configs()


@pytest.fixture(scope="module")
def hydra_ctx():
    with initialize_config_dir(str(CONF), version_base="1.3"):
        yield


@functools.cache
def _composed(choices: tuple[str, ...]) -> DictConfig:
    return compose("config", overrides=list(choices))


def make(overrides=()) -> RunConfig:
    """``config`` with ``overrides``, validated, as Hydra composes it: the config groups chosen by composing (once
    per choice: a composition takes a tenth of a second), then each value set as Hydra then sets it (the parsed
    override, ``OmegaConf.update``)."""
    parsed = PARSER.parse_overrides(list(overrides))
    cfg = copy.deepcopy(_composed(tuple(o.input_line for o in parsed if o.key_or_group in GROUPS)))
    for o in parsed:
        if o.key_or_group not in GROUPS:
            OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True)
    return OmegaConf.to_object(cfg)


def group_file(group: str, name: str) -> DictConfig:
    """A config file of a group, as its ``# @package _global_`` places it (its defaults list left out)."""
    cfg = OmegaConf.load(CONF / group / f"{name}.yaml")
    return OmegaConf.masked_copy(cfg, [k for k in cfg if k not in ("defaults", "hydra")])


def test_groups_cover_the_engine():
    # Every task the engine knows has a config.
    assert ENVS == sorted(available_tasks())
    assert ALGOS == ["sac", "td3"] == sorted(ALGORITHMS) == sorted(ALGORITHM_OPTIONS)
    assert MODELS == sorted(available())
    for group, key, names in (
        ("env", ("env", "env_name"), ENVS),
        ("algo", ("policy", "algo_name"), ALGOS),
        ("seq_model", ("policy", "seq_model"), MODELS),
    ):
        for name in names:
            # The launch dry-run (pomdp_ffm.jobs.grid) maps a group choice to the value of this key.
            data = yaml.safe_load((CONF / group / f"{name}.yaml").read_text())
            assert data[key[0]][key[1]] == name


@pytest.mark.slow
def test_every_combination_composes_and_validates(hydra_ctx):
    # Every file composes; every task x algorithm x memory then validates as Hydra composes it: the algo and
    # seq_model files (@package _global_) merged after the env's, in the defaults list's order (pinned below).
    for algo, model in itertools.product(ALGOS, MODELS):
        composed = compose("config", overrides=[f"algo={algo}", f"seq_model={model}"])
        assert composed == OmegaConf.merge(compose("config"), group_file("algo", algo), group_file("seq_model", model))
    for env in ENVS:
        base = compose("config", overrides=[f"env={env}"])
        for algo, model in itertools.product(ALGOS, MODELS):
            cfg = OmegaConf.to_object(OmegaConf.merge(base, group_file("algo", algo), group_file("seq_model", model)))
            assert (cfg.env.env_name, cfg.policy.algo_name, cfg.policy.seq_model) == (env, algo, model)
            assert isinstance(cfg.train.buffer_size, int) and cfg.train.buffer_size == 1_000_000
            # A float ratio (1.0 update per env step), not the int "1 update per iteration".
            assert isinstance(cfg.train.num_updates_per_iter, float)


def test_every_file_validates(hydra_ctx):
    # The default suite's share of the test above (which make test-all runs): every task with the default algorithm
    # and memory, every algorithm x memory on the default task and on a locomotion task's sizes.
    for env in ENVS:
        assert OmegaConf.to_object(compose("config", overrides=[f"env={env}"])).env.env_name == env
    for env in ("Pendulum-V-v0", "HopperBLT-V-v0"):
        base = compose("config", overrides=[f"env={env}"])
        for algo, model in itertools.product(ALGOS, MODELS):
            cfg = OmegaConf.to_object(OmegaConf.merge(base, group_file("algo", algo), group_file("seq_model", model)))
            assert (cfg.env.env_name, cfg.policy.algo_name, cfg.policy.seq_model) == (env, algo, model)


def test_blt_paper_tasks_match_reference_table(hydra_ctx):
    for env in BLT_PAPER:
        c = make([f"env={env}"])
        assert (c.train.batch_size, c.train.sampled_seq_len, c.train.num_iters) == (64, 64, 1500)
        assert (c.train.num_init_rollouts_pool, c.train.num_rollouts_per_iter) == (10, 1)
        assert (c.eval.log_interval, c.env.num_eval_tasks, c.eval.save_interval) == (4, 10, 100)
        assert (c.policy.action_embedding_size, c.policy.observ_embedding_size, c.policy.reward_embedding_size) == (
            16,
            32,
            16,
        )
        assert c.policy.dqn_layers == c.policy.policy_layers == [256, 256]
        assert (c.policy.rnn_hidden_size, c.policy.lr, c.policy.gamma, c.policy.tau) == (128, 3e-4, 0.99, 0.005)
        assert (c.policy.sac.entropy_alpha, c.policy.sac.automatic_entropy_tuning, c.policy.sac.alpha_lr) == (
            0.2,
            True,
            3e-4,
        )
        assert (c.policy.td3.exploration_noise, c.policy.td3.target_noise, c.policy.td3.target_noise_clip) == (
            0.1,
            0.2,
            0.5,
        )


def test_pendulum_v_matches_reference_table(hydra_ctx):
    c = make(["env=Pendulum-V-v0"])
    assert (c.train.batch_size, c.train.sampled_seq_len, c.policy.gamma) == (32, -1, 0.9)
    assert (c.train.num_iters, c.train.num_init_rollouts_pool, c.eval.log_interval, c.env.num_eval_tasks) == (
        250,
        5,
        5,
        20,
    )
    assert (c.policy.action_embedding_size, c.policy.observ_embedding_size, c.policy.reward_embedding_size) == (
        8,
        32,
        8,
    )
    assert c.policy.dqn_layers == c.policy.policy_layers == [128, 128]


@pytest.mark.parametrize("hidden", [16, 31, 32, 33, 63, 64, 100])
def test_ffm_hidden_sizes_are_checked_by_the_rule_their_message_states(hydra_ctx, hidden):
    # FFM's state is m rows by c = h // 32 columns with m = h // c filling h (m * c = h): h >= 32 and a multiple
    # of its c. 33 splits (c = 1, m = 33) and builds FFM of the right sizes; the message of a value that does not
    # split states that rule, never "a multiple of 32", which 33 is not.
    c = hidden // 32
    splits = c >= 1 and hidden % c == 0
    if splits:
        p = make(["seq_model=ffm", f"policy.rnn_hidden_size={hidden}"]).policy
        ffm = build("ffm", input_size=8, hidden_size=hidden, **p.seq_model_kwargs())
        y, state = ffm(torch.randn(5, 2, 8))
        assert (ffm.context_size, ffm.memory_size) == (c, hidden // c) and ffm.memory_size * c == hidden
        assert y.shape == (5, 2, hidden) and state.shape == (2, hidden // c, c)
        return
    with pytest.raises(ValueError) as e:
        make(["seq_model=ffm", f"policy.rnn_hidden_size={hidden}"])
    text = str(e.value)
    assert "\n" not in text and "multiple of 32" not in text, text
    rule = "at least 32" if c < 1 else f"a multiple of its c = h // 32 = {c}"
    assert text.startswith(f"policy.rnn_hidden_size={hidden} must be {rule} with policy.seq_model=ffm ("), text
    if c >= 1:  # the values it offers split
        below, above = map(int, text.split("e.g. ")[1].split(";")[0].split(" or "))
        assert below < hidden < above and all(n % (n // 32) == 0 for n in (below, above))
        make(["seq_model=ffm", f"policy.rnn_hidden_size={below}"])
        make(["seq_model=ffm", f"policy.rnn_hidden_size={above}"])


def test_ffm_sizes_follow_the_reference(hydra_ctx):
    c = make(["seq_model=ffm"])
    opts = c.policy.seq_model_kwargs()
    assert opts["max_period"] == 128  # t_e
    ffm = build("ffm", input_size=64, hidden_size=c.policy.rnn_hidden_size, **opts)
    assert (ffm.context_size, ffm.memory_size) == (128 // 32, 128 // (128 // 32))


def test_informed_initialisation_from_the_command_line(hydra_ctx):
    import torch

    c = make(["seq_model=ffm", "policy.ffm.init_trace_range=[32,104]", "policy.ffm.init_period_range=[32,104]"])
    ffm = build("ffm", input_size=8, hidden_size=c.policy.rnn_hidden_size, **c.policy.seq_model_kwargs())
    torch.testing.assert_close(
        ffm.trace_durability(0.01), torch.linspace(32, 104, ffm.memory_size), rtol=1e-5, atol=1e-4
    )
    periods = 2 * torch.pi / ffm.omega.detach()
    torch.testing.assert_close(periods, torch.linspace(32, 104, ffm.context_size), rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match=r"policy.ffm.init_trace_range=\[104.0, 32.0\]"):
        make(["policy.ffm.init_trace_range=[104,32]"])


def test_halfcheetah_p_key_fixed(hydra_ctx):
    # patches/101: the reference's cheetah_blt/p files spell observ_embedding_sizeee.
    assert make(["env=HalfCheetahBLT-P-v0"]).policy.observ_embedding_size == 32
    with pytest.raises(ConfigCompositionException, match="observ_embedding_sizeee"):
        compose("config", overrides=["env=HalfCheetahBLT-P-v0", "policy.observ_embedding_sizeee=32"])


def test_yaml_numbers(hydra_ctx):
    # patches/100: 1e6 is a float in YAML 1.2 and Hydra's override grammar; buffer_size takes it as an int.
    c = make(["train.buffer_size=1e6"])
    assert c.train.buffer_size == 1_000_000 and isinstance(c.train.buffer_size, int)
    assert OmegaConf.create("buffer_size: 1e6").buffer_size == 1e6
    with pytest.raises(ValueError, match=r"train.buffer_size=0.5 must be a positive whole number"):
        make(["train.buffer_size=0.5"])
    assert isinstance(make(["train.num_updates_per_iter=1"]).train.num_updates_per_iter, int)
    assert isinstance(make(["train.num_updates_per_iter=1.0"]).train.num_updates_per_iter, float)


def test_misspelt_key_fails_clearly(hydra_ctx):
    with pytest.raises(ConfigCompositionException) as e:
        compose("config", overrides=["train.batch_sise=32"])
    msg = f"{e.value} {e.value.__cause__}"
    assert "batch_sise" in msg and "TrainConfig" in msg
    # Hydra's explicit append (+key) passes composition; the run refuses it before doing anything.
    with pytest.raises(ValueError, match=r"unknown config key policy.'taux'; PolicyConfig has \[.*'tau'"):
        check_known_keys(compose("config", overrides=["+policy.taux=0.1"]))
    with pytest.raises(ValueError, match=r"unknown config key 'sede'"):
        check_known_keys(compose("config", overrides=["+sede=1"]))
    check_known_keys(compose("config", overrides=["experiment=paper_sac"]))
    with pytest.raises(ConfigCompositionException) as e:
        compose("config", overrides=["policy.tau=abc"])
    assert "abc" in f"{e.value} {e.value.__cause__}"


def test_unknown_group_option_fails_clearly(hydra_ctx):
    with pytest.raises(MissingConfigException) as e:
        compose("config", overrides=["env=HopperBLT-X-v0"])
    msg = str(e.value)
    assert "HopperBLT-X-v0" in msg and "HopperBLT-V-v0" in msg  # names the bad value and the options
    with pytest.raises(MissingConfigException, match="ppo"):
        compose("config", overrides=["algo=ppo"])
    with pytest.raises(MissingConfigException, match="hyena"):
        compose("config", overrides=["seq_model=hyena"])


def test_ffm_options_reach_the_memory(hydra_ctx):
    # patches/104: FFM's decay_context_product (a form of its complex decay, not the discount policy.gamma) and
    # decay_horizon (the decay bound's horizon, not the episode length).
    c = make(["policy.ffm.decay_context_product=hadamard", "policy.ffm.decay_horizon=256"])
    ffm = build("ffm", input_size=8, hidden_size=c.policy.rnn_hidden_size, **c.policy.seq_model_kwargs())
    assert ffm.alpha.shape == ffm.omega.shape == (ffm.memory_size, ffm.context_size)
    assert ffm.decay_horizon == 256 and c.policy.gamma == 0.9  # the discount is untouched
    # Old names are unknown keys like any other (the migration is retired).
    with pytest.raises(ConfigCompositionException, match="policy.ffm.gamma"):
        compose("config", overrides=["policy.ffm.gamma=outer"])


# Each bad value fails when the config is validated, with one line naming the full key, the value and the rule
# (patches/105). Each case: the overrides and the message's start.
BAD_VALUES = [
    (["policy.lr=0"], "policy.lr=0.0 must be > 0"),
    (["policy.lr=-1e-4"], "policy.lr=-0.0001 must be > 0"),
    (["policy.lr=nan"], "policy.lr=nan must be a finite number"),
    (["policy.gamma=1.5"], "policy.gamma=1.5 must be in [0, 1]"),
    (["policy.gamma=-0.1"], "policy.gamma=-0.1 must be in [0, 1]"),
    (["policy.tau=0"], "policy.tau=0.0 must be in (0, 1]"),
    (["policy.tau=1.5"], "policy.tau=1.5 must be in (0, 1]"),
    (["policy.action_embedding_size=-1"], "policy.action_embedding_size=-1 must be >= 0"),
    (["policy.observ_embedding_size=-1"], "policy.observ_embedding_size=-1 must be >= 0"),
    (["policy.reward_embedding_size=-1"], "policy.reward_embedding_size=-1 must be >= 0"),
    (
        ["policy.action_embedding_size=0", "policy.observ_embedding_size=0", "policy.reward_embedding_size=0"],
        "policy.action_embedding_size + observ_embedding_size + reward_embedding_size = 0 must be >= 1",
    ),
    (["policy.rnn_hidden_size=0", "seq_model=gru"], "policy.rnn_hidden_size=0 must be >= 1"),
    (["policy.rnn_hidden_size=100"], "policy.rnn_hidden_size=100 must be a multiple of its c = h // 32 = 3 with "),
    (["policy.rnn_hidden_size=16"], "policy.rnn_hidden_size=16 must be at least 32 with policy.seq_model=ffm "),
    (["policy.rnn_num_layers=0", "seq_model=gru"], "policy.rnn_num_layers=0 must be >= 1"),
    (["policy.rnn_num_layers=2"], "policy.rnn_num_layers=2 must be 1 with policy.seq_model=ffm"),
    (["policy.separate=false"], "policy.separate=False must be true (one memory shared by actor and critic"),
    (["policy.algo_name=ppo"], "policy.algo_name='ppo' is not one of ['sac', 'td3']"),
    (["policy.seq_model=rnn"], f"policy.seq_model='rnn' is not one of {available()}"),
    (["policy.dqn_layers=[256,0]"], "policy.dqn_layers=[256, 0] must be a list of layer widths >= 1"),
    (["policy.policy_layers=[-1]"], "policy.policy_layers=[-1] must be a list of layer widths >= 1"),
    (["policy.sac.entropy_alpha=-0.1"], "policy.sac.entropy_alpha=-0.1 must be >= 0"),
    (["policy.sac.alpha_lr=0"], "policy.sac.alpha_lr=0.0 must be > 0"),
    (["policy.sac.target_entropy=inf"], "policy.sac.target_entropy=inf must be a finite number"),
    (["policy.sac.alpha_loss=foo"], "policy.sac.alpha_loss='foo' is not one of ['alpha', 'log_alpha']"),
    (["policy.td3.exploration_noise=-0.1"], "policy.td3.exploration_noise=-0.1 must be >= 0"),
    (["policy.td3.target_noise=-0.2"], "policy.td3.target_noise=-0.2 must be >= 0"),
    (["policy.td3.target_noise_clip=-0.5"], "policy.td3.target_noise_clip=-0.5 must be >= 0"),
    (["policy.td3.policy_delay=0"], "policy.td3.policy_delay=0 must be >= 1"),
    (["policy.td3.actor_q=q2"], "policy.td3.actor_q='q2' is not one of ['min', 'q1']"),
    (["policy.ffm.context_size=0"], "policy.ffm.context_size=0 must be null"),
    (["policy.ffm.memory_size=-2"], "policy.ffm.memory_size=-2 must be null"),
    (["policy.ffm.min_period=0"], "policy.ffm.min_period=0.0 must be > 0"),
    (["policy.ffm.max_period=0.5"], "policy.ffm.max_period=0.5 must be >= policy.ffm.min_period=1.0"),
    (["policy.ffm.beta=0"], "policy.ffm.beta=0.0 must be in (0, 1)"),
    (["policy.ffm.beta=1"], "policy.ffm.beta=1.0 must be in (0, 1)"),
    (["policy.ffm.decay_horizon=0"], "policy.ffm.decay_horizon=0 must be in [1, 35489]"),
    (["policy.ffm.decay_horizon=100000"], "policy.ffm.decay_horizon=100000 must be in [1, 35489]"),
    (["policy.ffm.context=off"], "policy.ffm.context='off' is not one of ['learned', 'fixed', 'none']"),
    (["policy.ffm.decay=off"], "policy.ffm.decay='off' is not one of ['learned', 'fixed', 'none']"),
    (
        ["policy.ffm.decay_context_product=inner"],
        "policy.ffm.decay_context_product='inner' is not one of ['outer', 'hadamard']",
    ),
    (
        ["policy.ffm.aggregator=fft"],
        "policy.ffm.aggregator='fft' is not one of ['auto', 'loop', 'scan', 'assoc', 'closed']",
    ),
    (["policy.ffm.init_trace_range=[104,32]"], "policy.ffm.init_trace_range=[104.0, 32.0] must be null"),
    (["policy.ffm.init_period_range=[0,32]"], "policy.ffm.init_period_range=[0.0, 32.0] must be null"),
    (["env.env_type=meta"], "env.env_type='meta' is not one of ['pomdp']"),
    (["env.env_name=HopperBLT-X-v0"], "env.env_name='HopperBLT-X-v0' is not one of ['Pendulum-F-v0', "),
    (["env.num_eval_tasks=0"], "env.num_eval_tasks=0 must be in [1, 1000]"),
    (["train.num_iters=-5"], "train.num_iters=-5 must be >= 1"),
    (["train.num_iters=0"], "train.num_iters=0 must be >= 1"),
    (["train.num_init_rollouts_pool=-1"], "train.num_init_rollouts_pool=-1 must be >= 0"),
    (["train.num_rollouts_per_iter=0"], "train.num_rollouts_per_iter=0 must be >= 1"),
    (["train.buffer_size=0"], "train.buffer_size=0 must be a positive whole number"),
    (["train.buffer_size=100"], "train.buffer_size=100 must be >= 200, the episode length of Pendulum-V-v0"),
    (
        ["train.buffer_size=100", "train.sampled_seq_len=8"],
        "train.buffer_size=100 must be >= 200, the episode length of Pendulum-V-v0 (the buffer stores whole episodes)",
    ),
    (["env.num_eval_tasks=100000"], "env.num_eval_tasks=100000 must be in [1, 1000]"),
    (["num_threads=100000"], "num_threads=100000 must be in [1, 256]"),
    (
        ["policy.ffm.init_trace_range=[1,inf]"],
        "policy.ffm.init_trace_range=[1.0, inf] must be null or [low, high] in steps with 0 < low <= high, both finite",
    ),
    (
        ["policy.ffm.aggregator=closed", "policy.ffm.decay_horizon=8"],
        "policy.ffm.decay_horizon=8 must be >= 9 with policy.ffm.aggregator=closed",
    ),
    (["train.buffer_size=32", "train.sampled_seq_len=64"], "train.buffer_size=32 must be >= train.sampled_seq_len=64"),
    (["train.num_updates_per_iter=0"], "train.num_updates_per_iter=0 must be > 0"),
    (["train.num_updates_per_iter=-0.5"], "train.num_updates_per_iter=-0.5 must be > 0"),
    (["train.batch_size=-3"], "train.batch_size=-3 must be >= 1"),
    (["train.sampled_seq_len=1"], "train.sampled_seq_len=1 must be -1 (whole episodes) or >= 2"),
    (["train.sampled_seq_len=-2"], "train.sampled_seq_len=-2 must be -1 (whole episodes) or >= 2"),
    (
        ["train.sampled_seq_len=500000"],
        "train.sampled_seq_len=500000 must be -1 (whole episodes) or in [2, 200], 200 being the episode length of "
        "Pendulum-V-v0 (a longer window is only padding)",
    ),
    (
        ["env=HopperBLT-V-v0", "train.sampled_seq_len=1001"],
        "train.sampled_seq_len=1001 must be -1 (whole episodes) or in [2, 1000], 1000 being the episode length of "
        "HopperBLT-V-v0",
    ),
    (["train.sample_weight_baseline=-1"], "train.sample_weight_baseline=-1.0 must be >= 0"),
    (["eval.log_interval=0"], "eval.log_interval=0 must be >= 1"),
    (["eval.save_interval=0"], "eval.save_interval=0 must be -1 (no snapshots) or >= 1"),
    (["eval.save_interval=-2"], "eval.save_interval=-2 must be -1 (no snapshots) or >= 1"),
    (
        ["eval.during_updates=true", "eval.eval_stochastic=true"],
        "eval.during_updates=true needs eval.eval_stochastic=false",
    ),
    (
        ["eval.during_updates=true", "eval.episodes_together=false"],
        "eval.during_updates=true needs eval.episodes_together=true",
    ),
    (["checkpoint.interval=0"], "checkpoint.interval=0 must be >= 1"),
    (["seed=-1"], "seed=-1 must be in [0, 4294967295]"),
    (["seed=4294967296"], "seed=4294967296 must be in [0, 4294967295]"),
    (["seeds=[0,0]"], "seeds=[0, 0] must be null or a list of distinct seeds in [0, 4294967295]"),
    (["seeds=[1,2]"], "seeds=[1, 2] needs seed=1 (the first seed names the job's run directory), not seed=0"),
    (["device=gpu"], "device='gpu' must be one of auto, cpu, cuda, cuda:N"),
    (["device=cuda:x"], "device='cuda:x' must be one of auto, cpu, cuda, cuda:N"),
    (["num_threads=0"], "num_threads=0 must be in [1, 256]"),
]


@pytest.mark.parametrize("overrides,message", BAD_VALUES, ids=[" ".join(o) for o, _ in BAD_VALUES])
def test_bad_values_fail_with_one_line(hydra_ctx, overrides, message):
    with pytest.raises(ValueError) as e:
        make(overrides)
    text = str(e.value)
    assert text.startswith(message) and "\n" not in text, text


def test_edge_values_are_accepted(hydra_ctx):
    c = make(
        [
            "policy.gamma=0",
            "policy.gamma=1",
            "policy.tau=1",
            "train.num_init_rollouts_pool=0",
            "train.num_updates_per_iter=1",
            "train.sampled_seq_len=2",
            "eval.save_interval=1",
            "seed=4294967295",
            "device=cuda:3",
            "policy.action_embedding_size=0",
            "policy.reward_embedding_size=0",
            "policy.sac.target_entropy=-2.5",
            "policy.ffm.decay_horizon=35489",
            "policy.ffm.beta=0.5",
            "num_threads=256",
            "env.num_eval_tasks=1000",
        ]
    )
    make(["policy.ffm.aggregator=closed", "policy.ffm.decay_horizon=9"])
    make(["policy.ffm.aggregator=scan", "policy.ffm.decay_horizon=1"])
    assert (c.policy.gamma, c.seed, c.device, c.train.num_init_rollouts_pool) == (1.0, 2**32 - 1, "cuda:3", 0)
    assert make(["seq_model=lstm", "policy.rnn_num_layers=2"]).policy.seq_model_kwargs() == {"num_layers": 2}
    assert make(["seq_model=gru", "policy.rnn_hidden_size=100"]).policy.rnn_hidden_size == 100
    assert make(["train.sampled_seq_len=200"]).train.sampled_seq_len == 200  # Pendulum's whole episode
    make(["policy.rnn_hidden_size=100", "policy.ffm.context_size=4", "policy.ffm.memory_size=25"])


@pytest.mark.slow
def test_defaults_and_every_preset_validate(hydra_ctx):
    assert PRESETS == ["paper", "paper_sac", "paper_td3", "pendulum", "smoke", "zoo_check"]
    with_groups = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())  # (glob sweeps)
    cfg = compose("config")
    check_known_keys(cfg)
    assert isinstance(OmegaConf.to_object(cfg), RunConfig)
    for name in PRESETS:
        # Every job of the preset's sweep, not only its base config: composed once per task, the algo and
        # seq_model files then merged as for test_every_combination_composes_and_validates, and the preset's own
        # values after them (it comes last in the defaults list); the seeds change nothing else.
        sweep = compose("config", overrides=[f"experiment={name}"], return_hydra_config=True).hydra.sweeper.params
        axes = {
            o.key_or_group: list(o.sweep_string_iterator())
            for o in with_groups.parse_overrides([f"{k}={v}" for k, v in sweep.items()])
        }
        assert set(axes) <= {"env", "algo", "seq_model", "seed"} and axes
        for env in axes.get("env", [None]):
            base = compose("config", overrides=[f"experiment={name}", *([f"env={env}"] if env else [])])
            check_known_keys(base)
            for algo, model in itertools.product(axes.get("algo", [None]), axes.get("seq_model", [None])):
                files = [group_file(g, c) for g, c in (("algo", algo), ("seq_model", model)) if c]
                cfg = OmegaConf.merge(base, *files, group_file("experiment", name))
                for seed in axes.get("seed", [cfg.seed]):
                    cfg.seed = int(seed)
                    assert isinstance(OmegaConf.to_object(cfg), RunConfig)
    job = ["experiment=paper", "env=HopperBLT-V-v0", "algo=td3", "seq_model=gru", "seed=3"]
    merged = OmegaConf.merge(
        compose("config", overrides=job[:2]),
        group_file("algo", "td3"),
        group_file("seq_model", "gru"),
        group_file("experiment", "paper"),
        {"seed": 3},
    )
    assert merged == compose("config", overrides=job)


def test_presets_compose(hydra_ctx):
    for name in PRESETS:
        cfg = compose("config", overrides=[f"experiment={name}"], return_hydra_config=True)
        assert cfg.resume is True  # a grid directory is resumable: reruns skip or continue
        assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    assert make(["experiment=paper_td3"]).policy.algo_name == "td3"
    smoke = make(["experiment=smoke"])
    assert smoke.train.num_iters <= 3 and smoke.policy.rnn_hidden_size % 32 == 0


@pytest.mark.slow
def test_cfg_job_prints_composed_config(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run(
        [sys.executable, "-m", "pomdp_ffm.train", "env=HopperBLT-V-v0", "algo=td3", "--cfg", "job"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    cfg = yaml.safe_load(out)
    assert cfg["train"]["batch_size"] == 64 and cfg["policy"]["algo_name"] == "td3"
    assert not (tmp_path / "runs").exists()  # printing starts nothing
    bad = subprocess.run(
        [sys.executable, "-m", "pomdp_ffm.train", "train.batch_size=-3", "--cfg", "job"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and bad.stdout == "" and bad.stderr.strip() == "error: train.batch_size=-3 must be >= 1"


def test_types_are_the_schemas(hydra_ctx):
    # OmegaConf checks each value against its field's type as the config is composed (no check of ours repeats
    # it), naming the key and the value; the entry point prints it on one line (tests/test_launch.py).
    for override, says in (
        ("eval.workers=maybe", "Value 'maybe' is not a valid bool"),
        ("train.batch_size=1.5", "Value '1.5' of type 'float' could not be converted to Integer"),
        ("policy.dqn_layers=[256,x]", "Value 'x' of type 'str' could not be converted to Integer"),
    ):
        with pytest.raises(ConfigCompositionException) as e:
            compose("config", overrides=[override])
        assert override in str(e.value) and str(e.value.__cause__).startswith(says)


def test_a_stored_config_is_read_as_this_version_reads_it(hydra_ctx):
    # An older run's config.yaml: switches this version no longer has (train.env_worker, a whole section), and
    # a key added since. Neither is a difference in what the run learns; a setting that is still is one.
    current = OmegaConf.to_container(compose("config"))
    old = copy.deepcopy(current)
    old["train"].update(env_worker=True, seed_axis_update="stacked")
    old["policy"]["hyena"] = {"order": 2}
    del old["policy"]["sac"]["alpha_loss"]
    assert learning_settings(old) == learning_settings(current)
    old["policy"]["lr"] = 1e-3
    assert {k for k, v in learning_settings(old).items() if learning_settings(current)[k] != v} == {"policy.lr"}


def test_a_device_is_one_this_machine_has(monkeypatch):
    import torch

    from pomdp_ffm.config import resolve_device

    with pytest.raises(ValueError, match=r"device='tpu' is not one of \['auto', 'cpu', 'cuda', 'cuda:N'\]"):
        resolve_device("tpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"device='cuda:1' but CUDA is not available here"):
        resolve_device("cuda:1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(ValueError, match=r"device='cuda:2' but this machine has 2 CUDA device\(s\), cuda:0 to cuda:1"):
        resolve_device("cuda:2")


@pytest.mark.slow
def test_a_duplicated_key_in_a_config_file_is_one_line_naming_the_file_and_key(tmp_path):
    # A user's experiment file, in a folder added with --config-dir (which Hydra reads, and so do the checks).
    (tmp_path / "extra" / "experiment").mkdir(parents=True)
    dup = tmp_path / "extra" / "experiment" / "mine.yaml"
    dup.write_text("# @package _global_\ntrain:\n  batch_size: 4\n  num_iters: 2\n  batch_size: 8\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    for flags in (
        ["--config-dir", str(tmp_path / "extra")],
        ["-cd", "extra", "--cfg", "job"],
        ["-cd", "extra", "--help"],
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "pomdp_ffm.train", *flags, "experiment=mine"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 2 and proc.stdout == ""
        assert proc.stderr.splitlines() == [f"error: {dup}, line 5: found duplicate key batch_size; remove one of them"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["extra"]  # nothing started


@pytest.mark.slow
def test_a_value_with_spaces_that_the_shell_split_gets_a_quoting_hint(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "pomdp_ffm.train", "hydra.run.dir=my", "runs"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "error: Error parsing override 'runs'; if 'my runs' is one value, quote it "
        "for the shell and Hydra: 'hydra.run.dir=\"my runs\"'"
    ]
    assert list(tmp_path.iterdir()) == []  # nothing started


@pytest.mark.slow
def test_every_configured_update_fits_in_4_gib(hydra_ctx):
    # The estimate that refuses a window or batch too large (RecurrentAgent.check_update_fits) never refuses a
    # config the presets and task files run, on a machine with 4 GiB free (observation and action sizes above
    # every task's).
    from pomdp_ffm.agent import RecurrentAgent
    from pomdp_ffm.envs import get_task

    sizes = {}  # the tasks' distinct sizes (batch, window, network), each with one task that has them
    for env in ENVS:
        cfg = make([f"env={env}"])
        t, p = cfg.train, cfg.policy
        window = get_task(env).max_episode_steps if t.sampled_seq_len == -1 else t.sampled_seq_len
        sizes.setdefault(
            (
                t.batch_size,
                window,
                repr(
                    (
                        p.action_embedding_size,
                        p.observ_embedding_size,
                        p.reward_embedding_size,
                        p.rnn_hidden_size,
                        p.dqn_layers,
                        p.policy_layers,
                    )
                ),
            ),
            env,
        )
    need = {}
    for (batch, window, _), env in sizes.items():
        for algo, model in itertools.product(ALGOS, MODELS):
            fixed, per_row = RecurrentAgent(
                64, 8, make([f"env={env}", f"algo={algo}", f"seq_model={model}"]).policy
            ).update_memory()
            need[env, algo, model] = fixed + per_row * batch * (window + 1)
    assert len(sizes) >= 2 and max(need.values()) < 4 << 30, (sizes, need)  # (largest: Mamba on Pendulum, 1.5 GiB)
