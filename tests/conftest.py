from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from pomdp_ffm.config import register_configs

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")
register_configs()

# Settings that make a training run take seconds: short windows, a handful of updates, one eval episode.
TINY = [
    "train.num_iters=3",
    "train.num_init_rollouts_pool=1",
    "train.batch_size=4",
    "train.sampled_seq_len=16",
    "train.num_updates_per_iter=0.02",
    "eval.log_interval=1",
    "env.num_eval_tasks=1",
    "progress=false",
    "policy.rnn_hidden_size=32",
    "policy.dqn_layers=[32,32]",
    "policy.policy_layers=[32,32]",
    "checkpoint.interval=1",
]


def compose_cfg(overrides=()):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.fixture
def composed():
    """A factory: composed(*overrides, tiny=True) -> the composed DictConfig, as the entry point gets it."""

    def make(*overrides, tiny=True):
        return compose_cfg([*(TINY if tiny else []), *overrides])

    return make


@pytest.fixture
def run_cfg():
    """A factory: run_cfg(*overrides, tiny=True) -> a validated RunConfig."""

    def make(*overrides, tiny=True):
        return OmegaConf.to_object(compose_cfg([*(TINY if tiny else []), *overrides]))

    return make


@pytest.fixture(autouse=True)
def _quiet_cwd(tmp_path, monkeypatch):
    # MuJoCo writes MUJOCO_LOG.TXT into the working directory; keep it out of the checkout.
    monkeypatch.chdir(tmp_path)


# The costliest variants of test families whose cheaper variants stay in the default suite (`make test`, within 6
# minutes on 2 cores); every one of them runs in `make test-all`, which CI runs. Matched against node ids.
SLOW = (
    "test_trainer.py::test_evaluation_during_updates_writes_the_same_log[HopperBLT-V-v0-td3-ffm-workers]",
    "test_trainer.py::test_evaluation_during_updates_writes_the_same_log[HopperMJ-V-v0-sac-ffm-spread]",
    "test_trainer.py::test_evaluation_during_updates_writes_the_same_log[Pendulum-V-v0-sac-gru-workers]",
    "test_trainer.py::test_evaluation_during_updates_writes_the_same_log[Pendulum-V-v0-sac-ffm-spread]",
    "test_trainer.py::test_evaluation_during_updates_writes_the_same_log[Pendulum-V-v0-td3-gru-spread]",
    "test_trainer.py::test_envs_in_workers_train_and_resume_as_envs_here[HopperMJ-V-v0]",
    "test_seeds.py::test_evaluations_during_updates_in_an_axis[joint, gathered, workers]",
    "test_seeds.py::test_evaluations_during_updates_in_an_axis[joint and gathered]",
    "test_seeds.py::test_evaluations_during_updates_in_an_axis[turns]",
    "test_seeds.py::test_gathered_acting_leaves_each_seed_the_seed_alone[td3-gru-hopper]",
    "test_seeds.py::test_a_stop_while_a_seed_starts_its_next_episode_resumes_to_the_same_logs",
    "test_seeds.py::test_seeds_with_bursts_of_different_lengths_update_together",
    "test_seeds.py::test_joint_bursts_through_the_graph_logic_equal_the_joint_eager_updates[td3-mlp-falls]",
    "test_seeds.py::test_a_failing_deferred_evaluation_in_a_joint_round_fails_only_its_seed",
    "test_seeds.py::test_a_stop_while_acting_is_gathered_waits_for_the_units_end[collect]",
    "test_seeds.py::test_a_seed_axis_sweep_through_the_launchers[slurm_local]",
    "test_launch.py::test_scheduler_warning_checkpoints_requeues_and_resumes",
    "test_launch.py::test_a_stop_signal_to_a_sweep_stops_it[local]",
    "test_rundir.py::test_two_writers_real_processes_then_a_killed_holder_is_taken_over",
    "test_bench.py::test_update_benchmark_with_seeds_times_separate_and_together",
    "test_bench.py::test_memory_benchmark_command_writes_rows",
    "test_bench.py::test_overlap_benchmark_command",
    "test_bench.py::test_eval_benchmark_command",
    "test_analysis_figures.py::test_cli_seed_reproducible",
    "test_seeds.py::test_gathered_acting_with_envs_in_workers",
    "test_launch.py::test_a_stop_after_a_jobs_last_look_still_stops_the_sweep",
    "test_launch.py::test_dry_run_counts_the_paper_grid",  # (the grid as 32 seed-axis jobs stays: tests/test_seeds.py)
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(item.nodeid.endswith(name) for name in SLOW):
            item.add_marker(pytest.mark.slow)
