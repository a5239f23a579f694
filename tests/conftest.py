from pathlib import Path

import pytest
import torch
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


@pytest.fixture
def one_thread():
    """One thread, as a run's default (num_threads: 1) and as the reference runs torch: the bits do not depend on how
    matmuls split their work between threads, and tensors this small only lose time split over threads, many times
    over on a machine whose cores are busy (the memory zoo's test files: ``pytestmark =
    pytest.mark.usefixtures("one_thread")``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _quiet_cwd(tmp_path, monkeypatch):
    # MuJoCo writes MUJOCO_LOG.TXT into the working directory; keep it out of the checkout.
    monkeypatch.chdir(tmp_path)


# The costliest variants of test families whose cheaper variants stay in the default suite (`make test`, within 6
# minutes on 2 cores), and costly tests whose ground another default test covers; every one of them runs in `make
# test-all`, which CI runs. Matched against node ids.
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
    "test_launch.py::test_smoke_multirun_and_rerun_skips[local]",  # (sweeps run in ::test_a_failing_job_is_named...)
    "test_launch.py::test_a_joblib_sweep_killed_by_sigkill_leaves_no_worker",
    "test_launch.py::test_a_stop_before_a_joblib_sweeps_workers_exist_starts_no_job",
    "test_launch.py::test_a_stop_signal_while_a_sweeps_job_is_set_up_stops_that_job",
    "test_trainer.py::test_stop_inside_the_burst_of_a_deferred_evaluation_resumes_to_the_same_log",
    "test_compile.py::test_no_complex_operator_reaches_the_compiler",  # (its maths: ::test_ffm_in_real_arithmetic...)
    "test_ledger_measurements.py::test_fused_adam_against_the_default_step_at_the_papers_shape",
    "test_seeds.py::test_gathered_acting_leaves_each_seed_the_seed_alone[sac-ffm-pendulum]",  # (::..._graphs_logic)
    "test_seeds.py::test_a_stopped_axis_resumes_every_seed",
    "test_seeds.py::test_a_seed_axis_sweep_through_the_launchers[local]",  # (::test_the_paper_grid_as_32_...)
    "test_seeds.py::test_the_rows_and_checkpoints_after_gathered_acting_are_in_the_seeds_own_turn",
    "test_launch.py::test_dry_run_reports_run_status",  # (tests/test_rundir.py::test_status_command)
    "test_launch.py::test_env_workers_start_without_warnings_and_end_quietly_with_a_run_killed_by_sigkill",
    "test_launch.py::test_env_workers_under_joblibs_workers_are_refused_before_the_sweep_starts",
    "test_launch.py::test_a_sweep_names_every_refused_job_and_sums_up[basic]",
    "test_launch.py::test_a_stop_signal_to_a_sweep_stops_it[basic]",  # (::test_a_second_stop_signal_...)
    "test_config.py::test_a_duplicated_key_in_a_config_file_is_one_line_naming_the_file_and_key",
    "test_analysis_figures.py::test_cli_folder_without_runs_is_a_clear_error",
    "test_analysis_figures.py::test_cli_missing_runs_folder_is_a_usage_error",
    "test_analysis_trust.py::test_out_naming_a_file_is_a_one_line_error",
    "test_launch.py::test_the_paper_grid_names_a_damaged_slot_up_front_and_the_sweep_refuses_it",
    "test_config.py::test_cfg_job_prints_composed_config",
    "test_config.py::test_every_combination_composes_and_validates",  # (::test_every_file_validates)
    "test_config.py::test_every_configured_update_fits_in_4_gib",  # (tests/test_agent.py's update_memory tests)
)

# Families of cases that each start the entry point (a few seconds of imports apiece) or run a whole small training:
# the first case stays in the default suite, the others run in `make test-all`.
SLOW_AFTER_THE_FIRST = (
    "test_rundir.py::test_a_done_file_that_is_not_the_runs_is_refused",
    "test_rundir.py::test_bad_settings_exit_2_with_one_line_and_write_nothing",
    "test_rundir.py::test_damaged_progress_is_rebuilt_from_the_checkpoint",
    "test_rundir.py::test_a_config_cut_short_at_a_line_is_refused",
    "test_rundir.py::test_a_run_directory_that_cannot_be_made_is_refused_in_one_line",
    "test_rundir.py::test_a_checkpoint_with_counters_no_run_reaches_is_refused",
    "test_launch.py::test_the_paper_grid_checks_every_job_before_listing_or_launching",
    "test_launch.py::test_composition_errors_are_one_line_and_exit_2",
    "test_launch.py::test_a_stop_signal_while_a_single_run_starts_stops_it_with_a_checkpoint",
    "test_launch.py::test_a_file_where_a_jobs_run_directory_belongs_refuses_the_sweep_before_it_starts",
    "test_launch.py::test_every_override_hydra_cannot_lex_is_named_with_its_character",
    "test_trainer.py::test_evaluation_episodes_together_equal_one_after_another",
    "test_trainer.py::test_interrupted_run_resumes_to_the_same_log",
    "test_trainer.py::test_stop_between_two_updates_resumes_to_the_same_log",
    "test_agent.py::test_updates_equal_the_per_call_bound_path",
    "test_seeds.py::test_a_seed_in_the_axis_is_the_seed_alone",
    "test_seeds.py::test_seeds_parted_by_a_policy_delay_are_realigned",
    "test_graph.py::test_a_run_through_both_runners_logs_what_the_eager_run_logs",
    "test_graph.py::test_several_agents_update_as_each_alone",
    "test_graph.py::test_runner_logic_equals_the_eager_update",
    "test_graph.py::test_runner_on_cpu_is_the_eager_update",
    "test_compile.py::test_a_failed_compile_in_a_run_is_one_line_naming_the_switch_and_the_log",
    "test_analysis_figures.py::test_cli_rejects_bad_options",
    "test_analysis_reference_only.py::test_agent_variants_change_nothing_for_the_model_groups",
    "test_analysis_output.py::test_an_output_that_cannot_be_written_is_one_line_and_leaves_the_previous_report",
)


def pytest_collection_modifyitems(config, items):
    firsts = set()
    for item in items:
        family = next((f for f in SLOW_AFTER_THE_FIRST if item.nodeid.partition("[")[0].endswith(f)), None)
        if any(item.nodeid.endswith(name) for name in SLOW) or (family in firsts and "[" in item.nodeid):
            item.add_marker(pytest.mark.slow)
        if family is not None:
            firsts.add(family)
