"""Several seeds in one process (seeds=[...]): each seed is the run it would be alone, in its own directory."""

from __future__ import annotations

import importlib.util
import signal
from pathlib import Path

import pandas as pd
import pytest
from hang import HANG_S
from marks import parametrize_first_fast, slow_case
from test_trainer import collect

from pomdp_ffm.jobs.grid import combined_status, sweep_jobs
from pomdp_ffm.jobs.plan import seed_dirs
from pomdp_ffm.metrics import TIMING as TIME_COLUMNS
from pomdp_ffm.run.rundir import RunDir, RunStatus, Status
from pomdp_ffm.train import Refused, train_job
from pomdp_ffm.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]


def read(run_dir: Path) -> pd.DataFrame:
    return pd.read_csv(run_dir / "progress.csv").drop(columns=TIME_COLUMNS)


@parametrize_first_fast("overrides", [("algo=sac", "seq_model=ffm"), ("algo=td3", "seq_model=gru")])
def test_a_seed_in_the_axis_is_the_seed_alone(composed, tmp_path, overrides):
    # Exact: each seed's turns run with its own global random generators swapped in, so it draws what it draws alone.
    # On a CPU: on CUDA the seeds' updates run together and share the lead seed's generators (patches/016).
    overrides = (*overrides, "device=cpu")
    out = train_job(composed(*overrides, "seeds=[0,1]"), tmp_path / "axis" / "seed-0")
    assert set(out.seeds) == {0, 1} and not out.stopped
    for k in (0, 1):
        train_job(composed(*overrides, f"seed={k}"), tmp_path / "solo" / f"seed-{k}")
        axis, solo = tmp_path / "axis" / f"seed-{k}", tmp_path / "solo" / f"seed-{k}"
        pd.testing.assert_frame_equal(read(axis), read(solo), check_exact=True)
        assert f"seed: {k}\n" in (axis / "config.yaml").read_text()
        assert (axis / "DONE").exists() and RunDir(axis).status() == "done"
    # Each experiment.log holds its own seed's lines only.
    logs = [(tmp_path / "axis" / f"seed-{k}" / "experiment.log").read_text() for k in (0, 1)]
    assert logs[0] != logs[1] and logs[0].count("finished:") == logs[1].count("finished:") == 1


def test_a_seed_refused_under_its_lock_leaves_no_lock_in_the_seeds_before_it(composed, tmp_path):
    # Another process takes seed 1's directory after the axis checked it but before the axis locks it: the axis is
    # refused, and seed 0, already locked by then, is left as it was found: no lock file, no folder.

    other = RunDir(tmp_path / "axis" / "seed-1")

    class Raced(Trainer):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            if self.cfg.seed == 1:
                other.acquire()

    with pytest.raises(Refused, match=r"seed-1 is in use by pid "):
        train_job(composed("device=cpu", "seeds=[0,1]"), tmp_path / "axis" / "seed-0", trainer_cls=Raced)
    other.release()
    assert not (tmp_path / "axis" / "seed-0").exists()


@pytest.mark.slow
def test_a_stopped_axis_resumes_every_seed(composed, tmp_path):
    overrides = ("algo=sac", "seq_model=gru", "train.num_iters=5")

    class StopOnSeed1(Trainer):
        def _end_burst(self):
            evaluation = super()._end_burst()
            if self.cfg.seed == 1 and self.standing.env_steps >= 600:
                self.stop.request(signal.SIGTERM)
            return evaluation

    out = train_job(composed(*overrides, "seeds=[0,1]"), tmp_path / "axis" / "seed-0", trainer_cls=StopOnSeed1)
    assert out.stopped and all(r.stopped for r in out.seeds.values())
    assert all(RunDir(tmp_path / "axis" / f"seed-{k}").status() == "resumable" for k in (0, 1))
    train_job(composed(*overrides, "seeds=[0,1]", "resume=true"), tmp_path / "axis" / "seed-0")
    for k in (0, 1):
        train_job(composed(*overrides, f"seed={k}"), tmp_path / "solo" / f"seed-{k}")
        pd.testing.assert_frame_equal(
            read(tmp_path / "axis" / f"seed-{k}"), read(tmp_path / "solo" / f"seed-{k}"), check_exact=True
        )
    # A seed run alone can continue or skip a directory the axis wrote, and the axis one a seed wrote alone.
    assert train_job(composed(*overrides, "seed=1", "resume=true"), tmp_path / "axis" / "seed-1").skipped
    out = train_job(composed(*overrides, "seeds=[0,1]", "resume=true"), tmp_path / "solo" / "seed-0")
    assert all(r.skipped for r in out.seeds.values())


def test_a_failing_seed_is_recorded_and_the_others_finish(composed, tmp_path):
    class FailSeed1(Trainer):
        def _log_evaluation(self, *results):
            if self.cfg.seed == 1:
                raise RuntimeError("seed 1 broke")
            return super()._log_evaluation(*results)

    with pytest.raises(RuntimeError, match="seed 1 broke"):
        train_job(composed("seeds=[0,1]"), tmp_path / "axis" / "seed-0", trainer_cls=FailSeed1)
    assert RunDir(tmp_path / "axis" / "seed-0").status() == "done"
    assert "seed 1 broke" in (tmp_path / "axis" / "seed-1" / "ERROR.txt").read_text()
    assert not (tmp_path / "axis" / "seed-0" / "ERROR.txt").exists()


def test_a_locked_seed_refuses_the_job_and_nothing_is_written(composed, tmp_path):
    held = RunDir(tmp_path / "axis" / "seed-1")
    held.acquire()
    try:
        with pytest.raises(Refused, match=r"seed-1 is in use by pid"):
            train_job(composed("seeds=[0,1]"), tmp_path / "axis" / "seed-0")
        assert not (tmp_path / "axis" / "seed-0").exists()
    finally:
        held.release()


def test_seed_settings_are_checked(composed, tmp_path):
    with pytest.raises(Refused, match=r"seeds=\[3, 4\] needs seed=3"):
        train_job(composed("seeds=[3,4]"), tmp_path / "seed-0")
    with pytest.raises(Refused, match=r"seeds=.*distinct seeds"):
        train_job(composed("seeds=[0,0]"), tmp_path / "seed-0")
    with pytest.raises(Refused, match=r"needs a run directory with a path component seed-0"):
        train_job(composed("seeds=[0,1]"), tmp_path / "somewhere")
    assert seed_dirs(Path("runs/T/a_m/seed-0/2026"), 0, [0, 2]) == [
        Path("runs/T/a_m/seed-0/2026"),
        Path("runs/T/a_m/seed-2/2026"),
    ]


def test_the_paper_grid_as_32_seed_axis_jobs(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("paper_grid", ROOT / "launch" / "paper_grid.py")
    grid = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(grid)
    assert grid.main(["--seed-axis", "--dry-run", "--root", str(tmp_path / "grid")]) == 0
    assert (
        capsys.readouterr().out.splitlines()[-1]
        == "32 jobs (160 runs): 0 done, 0 running, 0 damaged, 0 failed, 0 resumable, 32 new"
    )
    jobs = sweep_jobs(["experiment=paper", f"hydra.sweep.dir={tmp_path / 'grid'}", *grid.SEED_AXIS])
    assert all([d.name for d in j.run_dirs] == [f"seed-{k}" for k in range(5)] for j in jobs)
    done, new, running = RunStatus(Status.DONE), RunStatus(Status.NEW), RunStatus(Status.RUNNING, "locked by x")
    assert combined_status([done, new]) == RunStatus(Status.RESUMABLE) and combined_status([done] * 5) == done
    assert combined_status([done, running, RunStatus(Status.FAILED)]) == running


@pytest.mark.parametrize("launcher", [slow_case("local"), slow_case("slurm_local")])
def test_a_seed_axis_sweep_through_the_launchers(tmp_path, launcher):
    # The launchers pickle the entry point: the seed axis must survive that, and each seed gets its directory.
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pomdp_ffm.train",
            "experiment=smoke",
            "seed=0",
            "seeds=[0,1]",
            "seq_model=gru",
            f"hydra/launcher={launcher}",
            f"hydra.sweep.dir={tmp_path / 'sw'}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.parent.name for p in (tmp_path / "sw").glob("*/*/*/DONE")) == ["seed-0", "seed-1"]


# --- bursts run together (on CUDA: one graph for the seeds' updates) ----------------------------------------------
def joint_with(monkeypatch, make):
    """Joint rounds through ``make(trainers)`` wherever the loop (trainer.py) would make a runner on CUDA (two seeds
    or more)."""
    from pomdp_ffm import trainer as loop_mod

    made = []
    monkeypatch.setattr(
        loop_mod,
        "joint_runner",
        lambda trainers: made.append(make(trainers)) or made[-1] if len(trainers) > 1 else None,
    )
    return made


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [
        ("algo=sac", "seq_model=ffm"),
        slow_case(("algo=td3", "seq_model=lstm")),  # (8 s)
        slow_case(
            (
                "env=HopperMJ-V-v0",
                "algo=td3",
                "policy.td3.policy_delay=2",
                "seq_model=mlp",
                "train.num_updates_per_iter=0.1",
                "train.num_iters=1",
            )
        ),
    ],
    ids=["sac-ffm", "td3-lstm", "td3-mlp-falls"],
)
def test_joint_bursts_through_the_graph_logic_equal_the_joint_eager_updates(composed, tmp_path, monkeypatch, overrides):
    # The joint path runs on CUDA only; here on a CPU, once through the runner's logic (the Python stand-in for
    # graphs) and once eagerly (each seed's update in turn within the joint round): the same logs, the same
    # number of updates as the seed alone, and a stop and resume in between changes nothing, not a bit (a resumed
    # process acts and updates on weights laid out as before).
    from test_cuda_graph import PythonGraphs

    from pomdp_ffm.cuda_graph import UpdateRunner

    overrides = ("train.num_iters=4", "device=cpu", *overrides)
    eager = joint_with(monkeypatch, lambda ts: UpdateRunner([t.agent for t in ts], cuda_graph=False))
    train_job(composed(*overrides, "seeds=[0,1,2]"), tmp_path / "eager" / "seed-0")
    assert eager and all(not r.graphed for r in eager)
    graphs = joint_with(monkeypatch, lambda ts: UpdateRunner([t.agent for t in ts], backend=PythonGraphs(), warmup=2))

    class StopOnSeed2(Trainer):
        def _end_burst(self):
            evaluation = super()._end_burst()
            if self.cfg.seed == 2 and self.standing.env_steps >= 600:
                self.stop.request(signal.SIGTERM)
            return evaluation

    out = train_job(composed(*overrides, "seeds=[0,1,2]"), tmp_path / "graphs" / "seed-0", trainer_cls=StopOnSeed2)
    assert out.stopped
    train_job(composed(*overrides, "seeds=[0,1,2]", "resume=true"), tmp_path / "graphs" / "seed-0")
    assert sum(r.replays for r in graphs) > 0
    for k in (0, 1, 2):
        a, b = read(tmp_path / "graphs" / f"seed-{k}"), read(tmp_path / "eager" / f"seed-{k}")
        pd.testing.assert_frame_equal(a, b, check_exact=True)
        assert (tmp_path / "graphs" / f"seed-{k}" / "DONE").exists()
    if not any(o.startswith("env=") for o in overrides):  # Pendulum's episodes all have one length
        train_job(composed(*overrides, "seed=1"), tmp_path / "solo" / "seed-1")
        solo = read(tmp_path / "solo" / "seed-1")
        assert (
            solo["z/rl_steps"].dropna().tolist() == read(tmp_path / "eager" / "seed-1")["z/rl_steps"].dropna().tolist()
        )


def _trainers_with_data(run_cfg, tmp_path, overrides=(), n=3):
    trainers = []
    for k in range(n):
        t = Trainer(run_cfg(*overrides, f"seed={k}"), tmp_path / f"t{k}")
        collect(t)
        trainers.append(t)
    return trainers


@pytest.mark.parametrize("lengths", [(5, 7, 7), (6, 6, 6), (1, 4, 4)])
def test_joint_rounds_go_until_the_first_burst_is_over(run_cfg, tmp_path, lengths):
    # One update per seed a round, until the shortest burst is over; gradient norms (a burst's last update) only
    # in the statistics of the seeds at their last update, though computed for all in that round.
    from pomdp_ffm.burst import update_bursts
    from pomdp_ffm.cuda_graph import UpdateRunner

    trainers = _trainers_with_data(run_cfg, tmp_path)
    for t, n in zip(trainers, lengths):
        t.standing.begin_burst(n, t.agent.device)
    bursts = [t.standing.burst for t in trainers]
    rounds = min(lengths)
    update_bursts(trainers, UpdateRunner([t.agent for t in trainers], cuda_graph=False))
    assert [b.done for b in bursts] == [rounds] * 3
    assert all(t.agent.num_updates == rounds == t.timers["n_joint_updates"] for t in trainers)
    assert [("q_grad_norm" in b.last) for b in bursts] == [n == rounds for n in lengths]
    assert all(set(b.counts) == set(bursts[0].counts) for b in bursts)  # no gradient norm summed
    for t, b in zip(trainers, bursts):
        update_bursts([t], t.updater)
        assert b.done == b.n and t.standing.rl_steps == b.n
        t.close()


@pytest.mark.parametrize("delay, counts, joint_rounds", [(2, (0, 1), 0), (3, (0, 1), 1), (3, (1, 4), 6)])
def test_joint_rounds_stop_where_a_policy_delay_parts_the_seeds(run_cfg, tmp_path, delay, counts, joint_rounds):
    # After bursts of other lengths the seeds' update counts differ: they agree on the actor step for some rounds
    # (counts 0 and 1 with a delay of 3: one round), then part; the joint rounds stop there, without an error.
    from pomdp_ffm.burst import update_bursts
    from pomdp_ffm.cuda_graph import UpdateRunner

    trainers = _trainers_with_data(run_cfg, tmp_path, ("algo=td3", f"policy.td3.policy_delay={delay}"), n=2)
    for t, c in zip(trainers, counts):
        t.agent.num_updates = c
        t.standing.begin_burst(6, t.agent.device)
    update_bursts(trainers, UpdateRunner([t.agent for t in trainers], cuda_graph=False))
    assert [t.standing.burst.done for t in trainers] == [joint_rounds] * 2
    for t in trainers:
        t.close()


@pytest.mark.slow
def test_a_stop_while_a_seed_starts_its_next_episode_resumes_to_the_same_logs(composed, tmp_path, monkeypatch):
    # Episodes of different lengths give bursts of different lengths: the seed whose burst is over goes on with
    # its next episode while the others wait mid-burst. A stop there checkpoints them mid-burst; on resume the
    # rounds go on as they would have, and every log is the uninterrupted one's.
    from pomdp_ffm.cuda_graph import UpdateRunner
    from pomdp_ffm.run.checkpoint import load_checkpoint

    joint_with(monkeypatch, lambda ts: UpdateRunner([t.agent for t in ts], cuda_graph=False))
    overrides = (
        "env=HopperMJ-V-v0",
        "algo=sac",
        "seq_model=gru",
        "train.num_updates_per_iter=0.1",
        "train.num_iters=1",
        "device=cpu",
        "seeds=[0,1,2]",
    )
    train_job(composed(*overrides), tmp_path / "full" / "seed-0")

    class StopAtSeed1sSecondEpisode(Trainer):
        episodes = 0

        def _next_episode(self):
            rollout = super()._next_episode()
            if self.cfg.seed == 1 and rollout is not None and self.standing.pool_done:
                StopAtSeed1sSecondEpisode.episodes += 1
                if StopAtSeed1sSecondEpisode.episodes == 2:
                    self.stop.request(signal.SIGTERM)
            return rollout

    assert train_job(composed(*overrides), tmp_path / "cut" / "seed-0", trainer_cls=StopAtSeed1sSecondEpisode).stopped
    bursts = [load_checkpoint(RunDir(tmp_path / "cut" / f"seed-{k}").checkpoint)["counters"]["burst"] for k in range(3)]
    assert any(b is not None and 0 < b["done"] < b["n"] for b in bursts), bursts  # some seed stopped mid-burst
    train_job(composed(*overrides, "resume=true"), tmp_path / "cut" / "seed-0")
    for k in range(3):
        pd.testing.assert_frame_equal(
            read(tmp_path / "cut" / f"seed-{k}"), read(tmp_path / "full" / f"seed-{k}"), check_exact=True
        )


def _recording(made: list):
    class Recording(Trainer):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)

    return Recording


@pytest.mark.slow
def test_seeds_with_bursts_of_different_lengths_update_together(composed, tmp_path, monkeypatch):
    # HopperMJ falls: the seeds' episodes, hence bursts, have different lengths. Every seed takes one update in
    # every round, so all updates run joint, and a TD3 policy delay (2 here; the reference's is 1) never parts
    # the seeds (their update counts stay equal); the seeds also finish one after another, the last still joint.
    from pomdp_ffm.cuda_graph import UpdateRunner

    runners = joint_with(monkeypatch, lambda ts: UpdateRunner([t.agent for t in ts], cuda_graph=False))
    made = []
    overrides = (
        "env=HopperMJ-V-v0",
        "algo=td3",
        "policy.td3.policy_delay=2",
        "seq_model=gru",
        "train.num_updates_per_iter=0.25",
        "train.num_iters=1",
        "device=cpu",
        "seeds=[0,1,2]",
    )
    train_job(composed(*overrides), tmp_path / "axis" / "seed-0", trainer_cls=_recording(made))
    assert len({t.standing.rollouts for t in made}) > 1  # the seeds' episodes differ
    n = [t.timers["n_updates"] for t in made]
    alone = [k - t.timers["n_joint_updates"] for k, t in zip(n, made)]
    # alone: only the last seed to finish, once the others have (measured: 5 of 535); a schedule that ran the
    # bursts together only as far as the shortest ran 253 of 530 alone here
    assert sorted(alone)[:-1] == [0, 0] and max(alone) < 0.05 * min(n), (alone, n)
    assert [len(r.agents) for r in runners][:2] == [3, 2]


@parametrize_first_fast("delay", [2, 3])
def test_seeds_parted_by_a_policy_delay_are_realigned(composed, tmp_path, monkeypatch, delay):
    # A seed whose update count is one off the others' (as a checkpoint from another schedule may leave it) takes,
    # alone and at once, the delay - 1 updates that bring its count to theirs mod the delay (fewer than the
    # others would take to meet it); from then on every update of every seed is joint.
    from pomdp_ffm import trainer as loop_mod
    from pomdp_ffm.burst import update_bursts
    from pomdp_ffm.cuda_graph import UpdateRunner

    joint_with(monkeypatch, lambda ts: UpdateRunner([t.agent for t in ts], cuda_graph=False))
    made, solo = [], []

    class OneOff(_recording(made)):
        def _open(self, resume=None):
            super()._open(resume)
            if self.cfg.seed == 1:
                self.agent.num_updates += 1

    def recorded(trainers, runner, limit=None):
        if limit is not None:
            solo.append((trainers[0].cfg.seed, limit))
        return update_bursts(trainers, runner, limit)

    monkeypatch.setattr(loop_mod, "update_bursts", recorded)

    out = train_job(
        composed(
            "algo=td3",
            f"policy.td3.policy_delay={delay}",
            "seq_model=mlp",
            "train.num_iters=3",
            "device=cpu",
            "seeds=[0,1,2]",
        ),
        tmp_path / "axis" / "seed-0",
        trainer_cls=OneOff,
    )
    assert not out.stopped
    assert solo == [(1, delay - 1)]
    alone = [t.timers["n_updates"] - t.timers["n_joint_updates"] for t in made]
    assert alone == [0, delay - 1, 0]
    assert len({t.timers["n_updates"] for t in made}) == 1  # each seed its own updates, no more


# --- acting steps gathered across the seeds (on CUDA: the seeds' acting graphs run at once) --------------------
def gathered(monkeypatch):
    """The seeds' acting steps gathered, as on CUDA with graphs, here on a CPU (where a submit computes)."""
    from pomdp_ffm import trainer as loop_mod

    monkeypatch.setattr(loop_mod, "gathers", lambda trainers: len(trainers) > 1)


GATHERED_CASES = [
    # evaluation episodes together, and a stochastic evaluation one episode after another
    ("algo=sac", "seq_model=ffm", "env.num_eval_tasks=3", "eval.eval_stochastic=true"),
    # episodes of different lengths (falls): the seeds' rollouts part and meet again
    ("env=HopperMJ-V-v0", "algo=td3", "seq_model=gru", "env.num_eval_tasks=2", "train.num_iters=2"),
]


@pytest.mark.parametrize(
    "overrides", [slow_case(c) for c in GATHERED_CASES], ids=["sac-ffm-pendulum", "td3-gru-hopper"]
)
def test_gathered_acting_leaves_each_seed_the_seed_alone(composed, tmp_path, monkeypatch, overrides):
    overrides = ("device=cpu", "train.num_iters=3", *overrides)
    for k in (0, 1, 2):
        train_job(composed(*overrides, f"seed={k}"), tmp_path / "solo" / f"seed-{k}")
    gathered(monkeypatch)
    calls = []
    from pomdp_ffm.rollout import AgentPolicy, Rollout

    submit = Rollout.submit
    monkeypatch.setattr(
        Rollout, "submit", lambda self: calls.append(isinstance(self.policy, AgentPolicy)) or submit(self)
    )
    out = train_job(composed(*overrides, "seeds=[0,1,2]"), tmp_path / "axis" / "seed-0")
    assert not out.stopped and calls and all(calls)  # only the agent's steps are gathered, not the pool's
    for k in (0, 1, 2):
        pd.testing.assert_frame_equal(
            read(tmp_path / "axis" / f"seed-{k}"), read(tmp_path / "solo" / f"seed-{k}"), check_exact=True
        )


@pytest.mark.slow
def test_gathered_acting_with_envs_in_workers(composed, tmp_path, monkeypatch):
    # The evaluation envs step in worker processes; the axis turns to the other seeds while they step.
    from pomdp_ffm.rollout import Rollout

    overrides = ("algo=sac", "seq_model=gru", "env.num_eval_tasks=3", "device=cpu")
    for k in (0, 1):
        train_job(composed(*overrides, f"seed={k}"), tmp_path / "solo" / f"seed-{k}")
    gathered(monkeypatch)
    answered, receive = [], Rollout.receive
    monkeypatch.setattr(
        Rollout,
        "receive",
        lambda self: answered.append(any(getattr(env, "runs_elsewhere", False) for env in self.envs)) or receive(self),
    )
    train_job(composed(*overrides, "seeds=[0,1]", "eval.workers=true"), tmp_path / "axis" / "seed-0")
    assert any(answered)
    for k in (0, 1):
        pd.testing.assert_frame_equal(
            read(tmp_path / "axis" / f"seed-{k}"), read(tmp_path / "solo" / f"seed-{k}"), check_exact=True
        )


def test_gathered_acting_through_the_acting_graphs_logic(composed, tmp_path, monkeypatch):
    # Each seed acts through an ActingRunner on the Python stand-in for graphs, so the axis submits to the
    # runners' graphs and waits: by default the steps are gathered (every seed acts through a runner).
    from test_cuda_graph import PythonGraphs

    from pomdp_ffm import trainer as trainer_mod
    from pomdp_ffm.acting_graph import ActingRunner

    overrides = ("algo=sac", "seq_model=gru", "env.num_eval_tasks=3", "device=cpu")
    train_job(composed(*overrides, "seeds=[0,1]"), tmp_path / "turns" / "seed-0")
    runners = []
    monkeypatch.setattr(
        trainer_mod,
        "make_actor",
        lambda agent, cuda_graph: runners.append(ActingRunner(agent, backend=PythonGraphs(), warmup=2)) or runners[-1],
    )
    train_job(composed(*overrides, "seeds=[0,1]"), tmp_path / "graphs" / "seed-0")
    assert len(runners) == 2 and all(r.replays > 0 and r.captures == 2 for r in runners)
    for k in (0, 1):
        pd.testing.assert_frame_equal(
            read(tmp_path / "graphs" / f"seed-{k}"), read(tmp_path / "turns" / f"seed-{k}"), check_exact=True
        )


@pytest.mark.parametrize("where", [slow_case("collect"), slow_case("evaluate")])  # (16 s)
def test_a_stop_while_acting_is_gathered_waits_for_the_units_end(composed, tmp_path, monkeypatch, where):
    # A stop arrives while the other seeds are inside an episode or an evaluation: it is acted on once every
    # seed's unit of work is over, so every checkpoint is at a boundary and the resumed logs are the full ones.
    overrides = (
        "algo=sac",
        "seq_model=gru",
        "train.num_iters=5",
        "env.num_eval_tasks=2",
        "device=cpu",
        "seeds=[0,1,2]",
    )
    gathered(monkeypatch)
    train_job(composed(*overrides), tmp_path / "full" / "seed-0")

    class StopMidway(Trainer):
        def _next_episode(self):
            rollout = super()._next_episode()
            if where == "collect" and rollout is not None and self.cfg.seed == 1 and self.standing.env_steps == 600:
                self.stop.request(signal.SIGTERM)  # as its episode 600-800 begins
            return rollout

        def _end_burst(self):
            evaluation = super()._end_burst()
            if where == "evaluate" and self.cfg.seed == 0 and self.standing.env_steps == 600:
                self.stop.request(signal.SIGTERM)  # as the seeds' evaluations begin
            return evaluation

    out = train_job(composed(*overrides), tmp_path / "cut" / "seed-0", trainer_cls=StopMidway)
    assert out.stopped and all(r.stopped for r in out.seeds.values())
    # Every seed played its episode, or its evaluation, to the end: the stop is taken at the next burst or unit.
    from pomdp_ffm.run.checkpoint import load_checkpoint

    at = [load_checkpoint(RunDir(tmp_path / "cut" / f"seed-{k}").checkpoint)["counters"]["env_steps"] for k in range(3)]
    steps = [pd.read_csv(tmp_path / "cut" / f"seed-{k}" / "progress.csv")["z/env_steps"].max() for k in range(3)]
    assert at == ([800] * 3 if where == "collect" else [600] * 3) and steps == [600] * 3
    train_job(composed(*overrides, "resume=true"), tmp_path / "cut" / "seed-0")
    for k in range(3):
        pd.testing.assert_frame_equal(
            read(tmp_path / "cut" / f"seed-{k}"), read(tmp_path / "full" / f"seed-{k}"), check_exact=True
        )


def test_a_failing_seed_with_gathered_acting(composed, tmp_path, monkeypatch):
    gathered(monkeypatch)

    class FailSeed1(Trainer):
        def _store(self, rollout):
            super()._store(rollout)
            if self.cfg.seed == 1 and self.standing.pool_done:
                raise RuntimeError("seed 1 broke mid-round")

    with pytest.raises(RuntimeError, match="seed 1 broke mid-round"):
        train_job(composed("seeds=[0,1,2]", "device=cpu"), tmp_path / "axis" / "seed-0", trainer_cls=FailSeed1)
    assert RunDir(tmp_path / "axis" / "seed-0").status() == "done"
    assert RunDir(tmp_path / "axis" / "seed-2").status() == "done"
    assert "seed 1 broke mid-round" in (tmp_path / "axis" / "seed-1" / "ERROR.txt").read_text()


def test_gathered_steps_that_draw_from_numpys_global_generator_fail_the_seeds(composed, tmp_path, monkeypatch):
    # Gathered steps swap torch's generators only; a step that draws from numpy's global one (here an episode's
    # end, stored in the seed's light turn) would draw from another seed's generator: found, and every seed fails
    # saying so.
    import numpy as np

    from pomdp_ffm.rng import SharedRNGDrawn

    gathered(monkeypatch)

    class DrawsGlobally(Trainer):
        def _store(self, rollout):
            super()._store(rollout)
            if self.standing.pool_done:
                np.random.random()

    with pytest.raises(SharedRNGDrawn, match="global random generator"):
        train_job(composed("seeds=[0,1]", "device=cpu"), tmp_path / "axis" / "seed-0", trainer_cls=DrawsGlobally)
    for k in (0, 1):
        assert "SharedRNGDrawn" in (tmp_path / "axis" / f"seed-{k}" / "ERROR.txt").read_text()


def _host_rng(run_dir: Path) -> tuple:
    from pomdp_ffm.run.checkpoint import load_checkpoint

    rng = load_checkpoint(RunDir(run_dir).checkpoint)["rng"]
    return rng["numpy"]["keys"].tolist(), rng["numpy"]["pos"], rng["python"]


def test_gathered_checkpoints_hold_each_seeds_own_host_rng(composed, tmp_path, monkeypatch):
    # A seed's last checkpoint is written after its last gathered acting step: it saves that seed's numpy and
    # Python states (what a resume restores), not another seed's.
    # The updates here draw from numpy's global generator (they run in full turns, where that is allowed), so
    # the seeds' numpy states differ.
    import numpy as np

    class DrawingUpdates(Trainer):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            sample = self.buffer.sample

            def drawing(batch_size):
                np.random.random()
                return sample(batch_size)

            self.buffer.sample = drawing

    overrides = ("algo=sac", "seq_model=gru", "device=cpu")
    for k in (0, 1):
        train_job(composed(*overrides, f"seed={k}"), tmp_path / "solo" / f"seed-{k}", trainer_cls=DrawingUpdates)
    gathered(monkeypatch)
    train_job(composed(*overrides, "seeds=[0,1]"), tmp_path / "axis" / "seed-0", trainer_cls=DrawingUpdates)
    states = {(w, k): _host_rng(tmp_path / w / f"seed-{k}") for w in ("solo", "axis") for k in (0, 1)}
    assert states["solo", 0] != states["solo", 1]
    for k in (0, 1):
        assert states["axis", k] == states["solo", k]


@pytest.mark.slow
def test_the_rows_and_checkpoints_after_gathered_acting_are_in_the_seeds_own_turn(composed, tmp_path, monkeypatch):
    # Only the gathered rollouts run in light turns: the evaluation's row and the checkpoints after it run in the
    # seed's full turn, so a draw from numpy's global generator there is the seed's own, as alone (the last
    # checkpoint saves it).
    import numpy as np

    class DrawsAtTheLastRow(Trainer):
        def _log_evaluation(self, *results):
            if self.standing.env_steps >= self.budget:
                np.random.random()
            return super()._log_evaluation(*results)

    overrides = ("algo=sac", "seq_model=gru", "device=cpu")
    for k in (0, 1):
        train_job(composed(*overrides, f"seed={k}"), tmp_path / "solo" / f"seed-{k}", trainer_cls=DrawsAtTheLastRow)
    gathered(monkeypatch)
    train_job(composed(*overrides, "seeds=[0,1]"), tmp_path / "axis" / "seed-0", trainer_cls=DrawsAtTheLastRow)
    for k in (0, 1):
        assert RunDir(tmp_path / "axis" / f"seed-{k}").status() == "done"
        assert _host_rng(tmp_path / "axis" / f"seed-{k}") == _host_rng(tmp_path / "solo" / f"seed-{k}")


@pytest.mark.parametrize(
    "way", [slow_case("turns"), slow_case("joint and gathered"), slow_case("joint, gathered, workers")]
)
def test_evaluations_during_updates_in_an_axis(composed, tmp_path, monkeypatch, way):
    # eval.during_updates in a seed axis: the deferred evaluations advance between the joint rounds (or the
    # seed's own updates) and finish gathered with the other seeds' steps. Each seed's log is the one it writes
    # without the deferral: alone (in turns), or in the same joint axis (whose rounds draw from the lead seed's
    # streams, patches/016).
    from test_trainer import DURING, Spread

    from pomdp_ffm.cuda_graph import UpdateRunner

    overrides = ("algo=sac", "seq_model=ffm", "device=cpu", *DURING)
    extra = ["eval.workers=true"] if "workers" in way else []
    if way == "turns":
        for k in (0, 1, 2):
            train_job(composed(*overrides, f"seed={k}"), tmp_path / "before" / f"seed-{k}")
    else:
        joint = joint_with(monkeypatch, lambda ts: UpdateRunner([t.agent for t in ts], cuda_graph=False))
        gathered(monkeypatch)
        train_job(composed(*overrides, "seeds=[0,1,2]", *extra), tmp_path / "before" / "seed-0")
    spread = Spread(monkeypatch)
    out = train_job(
        composed(*overrides, "seeds=[0,1,2]", "eval.during_updates=true", *extra), tmp_path / "axis" / "seed-0"
    )
    assert not out.stopped and spread.between > 0
    if way != "turns":
        assert len(joint) == 2 and all(r is not None for r in joint)
    for k in (0, 1, 2):
        pd.testing.assert_frame_equal(
            read(tmp_path / "axis" / f"seed-{k}"), read(tmp_path / "before" / f"seed-{k}"), check_exact=True
        )


@pytest.mark.slow
def test_a_failing_deferred_evaluation_in_a_joint_round_fails_only_its_seed(composed, tmp_path, monkeypatch):
    # The joint rounds advance every seed's deferred evaluation; one that fails there is its own seed's failure,
    # raised in that seed's turn, and the other seeds finish.
    from test_trainer import DURING, Spread, after_defer

    from pomdp_ffm.cuda_graph import UpdateRunner
    from pomdp_ffm.run.rundir import RunDir

    class FailingCopy(Trainer):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            after_defer(self, self.break_the_copy)

        def break_the_copy(self):
            copy = self.evaluator.actor_copy
            if self.cfg.seed != 1 or "act" in vars(copy):
                return
            calls, act = [0], copy.act

            def failing(*a, **kw):
                calls[0] += 1
                if calls[0] == 2:
                    raise RuntimeError("seed 1's evaluation failed")
                return act(*a, **kw)

            copy.act = failing

    joint = joint_with(monkeypatch, lambda ts: UpdateRunner([t.agent for t in ts], cuda_graph=False))
    gathered(monkeypatch)
    spread = Spread(monkeypatch)
    with pytest.raises(RuntimeError, match="seed 1's evaluation failed"):
        train_job(
            composed("algo=sac", "seq_model=ffm", "device=cpu", *DURING, "seeds=[0,1,2]", "eval.during_updates=true"),
            tmp_path / "axis" / "seed-0",
            trainer_cls=FailingCopy,
        )
    assert joint and spread.between > 0
    assert [RunDir(tmp_path / "axis" / f"seed-{k}").status() for k in (0, 1, 2)] == ["done", "failed", "done"]
