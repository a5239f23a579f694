"""The config tree (conf/): every combination composes and validates, reference values, clear errors."""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import OmegaConf

from pomdp_ffm.config import RunConfig, check_known_keys, register_configs
from pomdp_ffm.envs import available_tasks, get_task
from pomdp_ffm.seq_models import available, build

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
ENVS = sorted(p.stem for p in (CONF / "env").glob("*.yaml"))
ALGOS = sorted(p.stem for p in (CONF / "algo").glob("*.yaml"))
MODELS = sorted(p.stem for p in (CONF / "seq_model").glob("*.yaml"))
BLT_PAPER = [f"{n}BLT-{v}-v0" for n in ("Ant", "HalfCheetah", "Hopper", "Walker") for v in "PV"]

register_configs()


@pytest.fixture(scope="module")
def hydra_ctx():
    with initialize_config_dir(str(CONF), version_base="1.3"):
        yield


def make(overrides=()) -> RunConfig:
    return OmegaConf.to_object(compose("config", overrides=list(overrides)))


def test_groups_cover_the_engine():
    # Every task the engine knows has a config.
    assert ENVS == sorted(available_tasks())
    assert ALGOS == ["sac", "td3"]
    assert MODELS == sorted(available())
    for group, key, names in (("env", ("env", "env_name"), ENVS), ("algo", ("policy", "algo_name"), ALGOS),
                              ("seq_model", ("policy", "seq_model"), MODELS)):
        for name in names:
            # The launch dry-run (pomdp_ffm.grid) maps a group choice to the value of this key.
            data = yaml.safe_load((CONF / group / f"{name}.yaml").read_text())
            assert data[key[0]][key[1]] == name


def test_every_combination_composes_and_validates(hydra_ctx):
    for env, algo, model in itertools.product(ENVS, ALGOS, MODELS):
        cfg = make([f"env={env}", f"algo={algo}", f"seq_model={model}"])
        assert (cfg.env.env_name, cfg.policy.algo_name, cfg.policy.seq_model) == (env, algo, model)
        assert isinstance(cfg.train.buffer_size, int) and cfg.train.buffer_size == 1_000_000
        # A float ratio (1.0 update per env step), not the int "1 update per iteration".
        assert isinstance(cfg.train.num_updates_per_iter, float)


def test_blt_paper_tasks_match_reference_table(hydra_ctx):
    for env in BLT_PAPER:
        c = make([f"env={env}"])
        assert (c.train.batch_size, c.train.sampled_seq_len, c.train.num_iters) == (64, 64, 1500)
        assert (c.train.num_init_rollouts_pool, c.train.num_rollouts_per_iter) == (10, 1)
        assert (c.eval.log_interval, c.env.num_eval_tasks, c.eval.save_interval) == (4, 10, 100)
        assert (c.policy.action_embedding_size, c.policy.observ_embedding_size,
                c.policy.reward_embedding_size) == (16, 32, 16)
        assert c.policy.dqn_layers == c.policy.policy_layers == [256, 256]
        assert (c.policy.rnn_hidden_size, c.policy.lr, c.policy.gamma, c.policy.tau) == (128, 3e-4, 0.99, 0.005)
        assert (c.policy.sac.entropy_alpha, c.policy.sac.automatic_entropy_tuning, c.policy.sac.alpha_lr) == \
            (0.2, True, 3e-4)
        assert (c.policy.td3.exploration_noise, c.policy.td3.target_noise, c.policy.td3.target_noise_clip) == \
            (0.1, 0.2, 0.5)


def test_pendulum_v_matches_reference_table(hydra_ctx):
    c = make(["env=Pendulum-V-v0"])
    assert (c.train.batch_size, c.train.sampled_seq_len, c.policy.gamma) == (32, -1, 0.9)
    assert (c.train.num_iters, c.train.num_init_rollouts_pool, c.eval.log_interval, c.env.num_eval_tasks) == \
        (250, 5, 5, 20)
    assert (c.policy.action_embedding_size, c.policy.observ_embedding_size,
            c.policy.reward_embedding_size) == (8, 32, 8)
    assert c.policy.dqn_layers == c.policy.policy_layers == [128, 128]


def test_ffm_sizes_follow_the_reference(hydra_ctx):
    c = make(["seq_model=ffm"])
    opts = c.policy.seq_model_options()
    assert opts["max_period"] == 128  # t_e
    ffm = build("ffm", input_size=64, hidden_size=c.policy.rnn_hidden_size, **opts)
    assert (ffm.context_size, ffm.memory_size) == (128 // 32, 128 // (128 // 32))


def test_informed_initialisation_from_the_command_line(hydra_ctx):
    import torch

    c = make(["seq_model=ffm", "policy.ffm.init_trace_range=[32,104]", "policy.ffm.init_period_range=[32,104]"])
    ffm = build("ffm", input_size=8, hidden_size=c.policy.rnn_hidden_size, **c.policy.seq_model_options())
    torch.testing.assert_close(ffm.trace_durability(0.01), torch.linspace(32, 104, ffm.memory_size),
                               rtol=1e-5, atol=1e-4)
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
    with pytest.raises(MissingConfigException, match="transformer"):
        compose("config", overrides=["seq_model=transformer"])


def test_invalid_value_names_allowed_ones(hydra_ctx):
    with pytest.raises(ValueError, match=r"policy.sac.alpha_loss='foo' is not one of \['alpha', 'log_alpha'\]"):
        make(["policy.sac.alpha_loss=foo"])


def test_presets_compose(hydra_ctx):
    for name in ("smoke", "pendulum", "paper", "paper_sac", "paper_td3"):
        cfg = compose("config", overrides=[f"experiment={name}"], return_hydra_config=True)
        assert cfg.resume is True  # a grid directory is resumable: reruns skip or continue
        assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    assert make(["experiment=paper_td3"]).policy.algo_name == "td3"
    smoke = make(["experiment=smoke"])
    assert smoke.train.num_iters <= 3 and smoke.policy.rnn_hidden_size % 32 == 0


def test_cfg_job_prints_composed_config(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-m", "pomdp_ffm.train", "env=HopperBLT-V-v0", "algo=td3", "--cfg", "job"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout
    cfg = yaml.safe_load(out)
    assert cfg["train"]["batch_size"] == 64 and cfg["policy"]["algo_name"] == "td3"
    assert not (tmp_path / "runs").exists()  # printing starts nothing
