"""The benchmarks run and report what they claim; their numbers are not asserted (they are not timed tests)."""

import csv
import errno
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hang import HANG_S
from marks import slow_case
from torch.utils.flop_counter import FlopCounterMode
from updating import updated

from pomdp_ffm.agent import RecurrentAgent
from pomdp_ffm.bench.update import ACT, OBS, random_batch
from pomdp_ffm.buffer import SeqReplayBuffer
from pomdp_ffm.catalog import COMPARED
from pomdp_ffm.config import PolicyConfig
from pomdp_ffm.seq_models import available


def test_sac_ffm_update_flop_budget():
    # The reference spends 21.8 GFLOP per SAC+FFM update at the BLT shape; ours skips its redundant work.
    torch.manual_seed(0)
    agent = RecurrentAgent(OBS, ACT, PolicyConfig(seq_model="ffm", algo_name="sac"))
    with FlopCounterMode(display=False) as counter:
        updated(agent, random_batch(np.random.default_rng(0)))
    assert 15e9 < counter.get_total_flops() <= 19e9


@pytest.mark.slow
def test_memory_benchmark_command_writes_rows(tmp_path):
    out = tmp_path / "mem.csv"
    proc = subprocess.run(
        [sys.executable, "-m", "pomdp_ffm.bench", "memory", "--shapes", "rl", "--repeats", "1", "--csv", str(out)],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        check=True,
    )
    assert "fwd_bwd_ms" in proc.stdout and "x gru" in proc.stdout
    rows = list(csv.DictReader(open(out)))
    models = {r["model"] for r in rows}
    assert {*COMPARED, "gru-loop"} <= models
    assert {r["metric"] for r in rows} == {"fwd_bwd_ms", "fwd_ms", "peak_mem_mb", "act_us"}
    assert all(float(r["value"]) > 0 for r in rows)


def test_interleaved_rounds_rotate_the_starting_variant():
    import torch

    from pomdp_ffm.bench.common import interleaved_medians

    order = []
    fns = {k: (lambda k=k: order.append(k)) for k in "abc"}
    med = interleaved_medians(fns, repeats=6, device=torch.device("cpu"), warmup=0)
    assert set(med) == {"a", "b", "c"} and all(v >= 0 for v in med.values())
    firsts = order[::3]
    assert firsts == ["a", "b", "c", "a", "b", "c"]
    assert sorted(order) == sorted("abc" * 6)


@pytest.mark.slow
def test_the_efficiency_benchmark_follows_the_papers_protocol_and_its_figure_is_drawn(tmp_path):
    # Every registered memory at tiny sizes: each trial times the epoch's minibatches and a run of single steps for
    # every model, GRU, LSTM and Elman also as Python cells; memory once a model. The CSV, written as trials end,
    # holds what the run returned, and `python -m analysis efficiency` draws the paper's figure from it.
    from pomdp_ffm.bench import efficiency
    from pomdp_ffm.seq_models import available

    epoch = efficiency.Epoch(minibatches=2, episodes=2, steps=6, input_size=4, hidden_size=32)
    csv_path = tmp_path / "efficiency.csv"
    rows = efficiency.run(available(), 2, torch.device("cpu"), epoch, str(csv_path))
    names = [*available(), "gru+cells", "lstm+cells", "elman+cells"]
    count = lambda model, metric: sum(r.model == model and r.metric == metric for r in rows)
    assert {r.model for r in rows} == set(names)
    assert all(count(m, "train_s") == 2 and count(m, "latency_ms") == 2 and count(m, "peak_mem_mb") == 1 for m in names)
    assert all(r.value > 0 and r.shape == "2x[T6,B2]_in4_h32" for r in rows)
    written = pd.read_csv(csv_path)
    assert len(written) == len(rows) and set(written["model"]) == set(names)

    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "analysis", "efficiency", str(csv_path), "--out", str(out), "--resamples", "200"],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env={**os.environ, "MPLBACKEND": "Agg"},
    )
    assert proc.returncode == 0, proc.stderr
    assert (out / "figures" / "efficiency_paper.png").is_file() and (out / "figures" / "efficiency_paper.pdf").is_file()
    table = pd.read_csv(out / "tables" / "efficiency_paper.csv")
    train = table[table["metric"] == "train_s"].set_index("model")
    for model in names:  # the median of the two trials, inside its interval; the ratio to FFM's, inside its own
        trials = written[(written["model"] == model) & (written["metric"] == "train_s")]["value"]
        row = train.loc[model]
        assert row["median"] == pytest.approx(trials.median(), rel=1e-6)
        assert row["ci_low"] <= row["median"] <= row["ci_high"]
        assert row["to_ffm"] == pytest.approx(trials.median() / train.loc["ffm", "median"], rel=1e-6)
        assert row["to_ffm_low"] <= row["to_ffm"] <= row["to_ffm_high"]
    memory = table[table["metric"] == "peak_mem_mb"]  # measured once: no interval, of the value or of the ratio
    assert (memory["n_trials"] == 1).all() and memory[["ci_low", "to_ffm_low", "to_ffm_high"]].isna().all().all()


def test_peak_bytes_on_a_cpu_is_the_most_held_at_once():
    from pomdp_ffm.bench.common import peak_bytes

    def both_held():  # two 4 MB tensors alive together
        a = torch.ones(1000, 1000)
        b = a * 2
        del a, b

    def one_after_the_other():  # the first freed before the second is made
        a = torch.ones(1000, 1000)
        del a
        b = torch.ones(1000, 1000)
        del b

    cpu = torch.device("cpu")
    assert 8_000_000 <= peak_bytes(both_held, cpu) < 8_000_000 + 1024  # (+ the 2's scalar tensor)
    assert 4_000_000 <= peak_bytes(one_after_the_other, cpu) < 4_000_000 + 1024


@pytest.mark.slow
def test_the_scan_benchmark_times_every_form_at_every_shape():
    from pomdp_ffm.bench import scan

    rows = scan.run(1, torch.device("cpu"))
    assert [(r.shape, r.model) for r in rows] == [
        (shape, form) for shape in scan.SHAPES for form in ("loop", "scan", "step-by-step")
    ]
    assert all(r.metric == "fwd_bwd_ms" and r.value > 0 for r in rows)


def test_memory_bench_variant_subset_and_unknown_name():
    import pytest
    import torch

    from pomdp_ffm.bench import memory

    with pytest.raises(ValueError, match=r"unknown \['nope'\]; on cpu they are .*'gru-loop'"):
        memory.run(["rl"], 1, torch.device("cpu"), ["ffm", "nope"])


SMALL = [
    "env=Pendulum-V-v0",
    "train.batch_size=4",
    "train.sampled_seq_len=8",
    "train.num_updates_per_iter=0.05",
    "policy.rnn_hidden_size=32",
    "policy.dqn_layers=[32,32]",
    "policy.policy_layers=[32,32]",
    "env.num_eval_tasks=3",
]


def test_loop_benchmark_times_every_part_and_projects_the_budget():
    from pomdp_ffm.bench import loop

    r = loop.run(SMALL, steps=600, device="cpu", threads=1)
    assert r["n_steps"] >= 400 and r["n_updates"] > 0 and r["n_evals"] >= 2
    assert r["n_eval_steps"] == r["n_evals"] * 3 * 200  # Pendulum episodes always run 200 steps
    parts = r["parts"]
    assert all(parts[k] > 0 for k in ("env", "act", "update", "eval", "pool"))
    assert sum(parts.values()) == pytest.approx(r["wall"], rel=0.05)
    # The projection uses the task's own budget (Pendulum-V: 200 x (5 + 250) env steps).
    b = r["budget"]
    assert (b["pool_steps"], b["steps"], b["evals"]) == (1000, 50000, 51)  # an evaluation every 5 x 200 steps
    assert b["updates"] == int(1000 * 0.05) + 250 * 10
    assert all(v > 0 for v in r["projected"].values())


@pytest.mark.slow
def test_eval_benchmark_command(tmp_path):
    out = tmp_path / "eval.csv"
    proc = subprocess.run(
        [sys.executable, "-m", "pomdp_ffm.bench", "eval", *SMALL, "--repeats", "1", "--csv", str(out)],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        check=True,
    )
    assert "x one-after-another" in proc.stdout
    assert {r["model"] for r in csv.DictReader(open(out))} == {
        "one-after-another",
        "together",
        "workers",
        "sync-vector",
        "async-vector",
    }


@pytest.mark.slow
def test_overlap_benchmark_command(tmp_path):
    out = tmp_path / "overlap.csv"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pomdp_ffm.bench",
            "overlap",
            *SMALL,
            "--updates",
            "3",
            "--repeats",
            "1",
            "--csv",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        check=True,
    )
    assert "x after" in proc.stdout
    rows = list(csv.DictReader(open(out)))
    assert [r["model"] for r in rows] == ["updates", "evaluation", "after", "during"]
    assert all(float(r["value"]) > 0 for r in rows)


def test_bench_refuses_overrides_it_does_not_take():
    proc = subprocess.run(
        [sys.executable, "-m", "pomdp_ffm.bench", "memory", "seed=1"], capture_output=True, text=True, timeout=HANG_S
    )
    assert proc.returncode == 2 and "only `loop`, `eval` and `overlap` take key=value overrides" in proc.stderr


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["memory", "--repeats", "0"], "argument --repeats: 0 must be >= 1"),
        (["memory", "--threads", "-1"], "argument --threads: -1 must be >= 1"),
        (["memory", "--device", "tpu"], "--device tpu: device='tpu' is not one of"),
        (["memory", "--shapes", "foo"], "argument --shapes: invalid choice: 'foo'"),
        (["memory", "--variants", "nope"], "--variants: unknown ['nope']; on cpu they are"),
        (["act", "--seeds", "0"], "argument --seeds: 0 must be >= 1"),
        (["loop", "--steps", "-5"], "argument --steps: -5 must be >= 1"),
        (["overlap", "--updates", "0"], "argument --updates: 0 must be >= 1"),
        (["loop", "env=Nope-v0"], "Could not find 'env/Nope-v0'; the choices are"),
        (["loop", "policy.lr=-1"], "policy.lr=-1.0 must be > 0"),
        (["eval", "+foo=1"], "unknown config key 'foo'"),
        (["loop", "--project", "Nope-v0", "--env-step-ms", "1"], "--project Nope-v0: Unknown task 'Nope-v0'"),
        (
            ["loop", "--project", "HopperBLT-V-v0", "--env-step-ms", "-1"],
            "argument --env-step-ms: -1.0 must be a finite",
        ),
        (["loop", "--project", "HopperBLT-V-v0"], "--project and --env-step-ms go together"),
        (["loop", "--jobs", "3"], "unrecognized arguments: --jobs 3"),
        (["efficiency", "--models", "ffm", "rnn"], "--models rnn: not registered; the memories are mlp, posmlp"),
        (["efficiency", "--trials", "0"], "argument --trials: 0 must be >= 1"),
        (
            ["memory", "--models", "ffm"],
            "unrecognized arguments: --models ffm (`python -m pomdp_ffm.bench memory --help`",
        ),
        (["act", "--compile"], "unrecognized arguments: --compile"),
        (["eval", "--csv", "/nonexistent-folder/x.csv"], "--csv /nonexistent-folder/x.csv: its folder does not exist"),
        (["efficiency", "--csv", "/"], "--csv /: is a folder; give a file"),
        ([], "the following arguments are required: BENCHMARK"),
    ],
)
def test_bench_refuses_bad_input_in_one_line_before_any_work(capsys, argv, needle):
    from pomdp_ffm.bench.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert needle in err, err


# --- a benchmark's --csv: rows added after those it holds, whole, whenever it is stopped -------------------------
HEADER = "benchmark,shape,model,metric,value,unit\r\n"


def _held_rows(n: int) -> bytes:
    """A benchmark CSV of ``n`` rows, as a run of the efficiency benchmark leaves it."""
    rows = "".join(f'efficiency,"1x[T1024,B8]_in128_h256",gru,train_s,{0.5 + k / 1000:g},s\r\n' for k in range(n))
    return (HEADER + rows).encode()


def _efficiency_rows(data: bytes) -> list[list[str]]:
    rows = list(csv.reader(io.StringIO(data.decode(), newline="")))
    assert all(len(r) == 6 and r[0] == "efficiency" and float(r[4]) > 0 for r in rows), rows
    return rows


def test_write_csv_adds_whole_rows_after_those_a_file_holds(tmp_path):
    from pomdp_ffm.bench.common import Row, write_csv
    from pomdp_ffm.run.unwritable import Unwritable

    target = tmp_path / "bench.csv"
    target.write_bytes(_held_rows(3)[:-2])  # its last line without its newline (an older writer cut short)
    target.chmod(0o640)
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    write_csv([Row("memory", "T1", "ffm", "fwd_ms", 1.5, "ms")], str(link))
    write_csv([Row("memory", "T1", "gru", "fwd_ms", 2.0, "ms")], str(link))
    assert target.read_bytes() == _held_rows(3) + b"memory,T1,ffm,fwd_ms,1.5,ms\r\nmemory,T1,gru,fwd_ms,2,ms\r\n"
    assert link.is_symlink() and target.stat().st_mode & 0o777 == 0o640
    new = tmp_path / "new.csv"
    write_csv([Row("scan", "T1", "loop", "fwd_bwd_ms", 3.0, "ms")], str(new))
    assert new.read_bytes() == (HEADER + "scan,T1,loop,fwd_bwd_ms,3,ms\r\n").encode()
    foreign = tmp_path / "notes.csv"
    foreign.write_text("a,b\n1,2\n")
    with pytest.raises(Unwritable, match="holds something other than benchmark rows"):
        write_csv([Row("scan", "T1", "loop", "fwd_bwd_ms", 3.0, "ms")], str(foreign))
    assert foreign.read_text() == "a,b\n1,2\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.csv", "link.csv", "new.csv", "notes.csv"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, slow_case(signal.SIGKILL)])
def test_a_stopped_efficiency_benchmark_leaves_the_rows_its_csv_held_and_whole_new_ones(tmp_path, signum):
    # A real process, stopped (SIGTERM: Python's default, no handler; SIGKILL) once it has added a trial or two, at
    # whatever point of a write it is in: the file holds the 399 rows it held, then whole rows of this run (a rewrite
    # emptied the file before anything was measured; an append killed mid-write would leave half a row).
    held = _held_rows(399)
    out = tmp_path / "efficiency.csv"
    out.write_bytes(held)
    argv = ["efficiency", "--models", "mlp", "--trials", "100000", "--threads", "1", "--csv", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "pomdp_ffm.bench", *argv], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + HANG_S
        while out.read_bytes().count(b"\n") < 400 + 5 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)  # (the memory row, then two rows a trial)
        assert proc.poll() is None, "the benchmark ended before it was stopped"
        proc.send_signal(signum)
        assert proc.wait(HANG_S) == -signum
    finally:
        proc.kill()
    data = out.read_bytes()
    assert data.startswith(held) and data.endswith(b"\r\n")
    new = _efficiency_rows(data[len(held) :])
    assert len(new) >= 5 and {r[2] for r in new} == {"mlp"}


def test_a_folder_the_csv_cannot_be_written_in_is_refused_before_anything_runs(tmp_path, capsys, monkeypatch):
    # As root chmod stops no write: the folder's refusal is the kernel's answer on a read-only mount, injected.
    import tempfile

    from pomdp_ffm.bench.__main__ import main
    from pomdp_ffm.run.exits import EXIT_UNWRITABLE

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    out = tmp_path / "efficiency.csv"
    with pytest.raises(SystemExit) as e:
        main(["efficiency", "--models", "mlp", "--csv", str(out)])
    assert e.value.code == EXIT_UNWRITABLE  # the file system's refusal, as a run directory's (launch/README.md)
    err = capsys.readouterr().err
    assert err.startswith(f"error: {out} cannot be written (Read-only file system); ") and err.count("\n") == 1
    assert not out.exists()


def test_a_csv_that_is_not_a_benchmarks_is_refused_and_left_as_it_was(tmp_path, capsys):
    from pomdp_ffm.bench.__main__ import main

    notes = tmp_path / "notes.csv"
    notes.write_text("name,score\nffm,1\n")
    with pytest.raises(SystemExit) as e:
        main(["memory", "--csv", str(notes)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: --csv {notes}: holds something other than benchmark rows (its first line is not")
    assert notes.read_text() == "name,score\nffm,1\n"


def test_a_csv_that_cannot_be_written_at_a_trials_end_is_one_line_and_exit_74(tmp_path, capsys, monkeypatch):
    # The disk fills after the start's checks: the first write (the memory row) fails. One line naming the file,
    # the project's exit code for a file that cannot be written, the file as it was and no temporary beside it.
    from pomdp_ffm.bench.__main__ import main
    from pomdp_ffm.run.exits import EXIT_UNWRITABLE

    out = tmp_path / "efficiency.csv"
    out.write_bytes(_held_rows(4))
    rename = os.replace

    def full(src, dst):
        if Path(dst).name == out.name:
            raise OSError(errno.ENOSPC, "No space left on device")
        return rename(src, dst)

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(SystemExit) as e:
        main(["efficiency", "--models", "mlp", "--trials", "1", "--csv", str(out)])
    assert e.value.code == EXIT_UNWRITABLE
    where = Path(os.path.realpath(out))
    err = capsys.readouterr().err  # (after the progress bar, cleared: the last line, a whole one)
    assert err.endswith("\n") and err.splitlines()[-1] == (
        f"error: {where} cannot be written (No space left on device); free some space, then rerun (the file holds "
        "what it held before this write)"
    )
    assert out.read_bytes() == _held_rows(4) and [p.name for p in tmp_path.iterdir()] == [out.name]


# --- the acting benchmark's CPU copy computes what the agent computes -------------------------------------------
@pytest.mark.parametrize("algo", ["sac", "td3"])
@pytest.mark.parametrize("model", available())
def test_cpu_acting_is_the_agents_acting_as_of_its_last_refresh(algo, model):
    from test_agent import make_agent, make_batch

    from pomdp_ffm.bench.acting import CpuActing

    agent = make_agent(algo, model)
    copy_ = CpuActing(agent)
    probe = make_batch(5)

    def episode(actor, deterministic, seed=3):
        torch.manual_seed(seed)
        state, out = actor.initial_state(2), []
        for t in range(6):
            a, state = actor.act(
                probe.observs[t, :2], probe.actions[t, :2], probe.rewards[t, :2, 0], state, deterministic
            )
            out.append(a)
        return np.stack(out)

    for det in (True, False):
        np.testing.assert_array_equal(episode(copy_, det), episode(agent, det))
    updated(agent, make_batch(1))
    stale = episode(copy_, True)
    assert not np.array_equal(stale, episode(agent, True))  # the copy moves only at a refresh
    copy_.refresh()
    for det in (True, False):
        np.testing.assert_array_equal(episode(copy_, det), episode(agent, det))
    assert all(p.device.type == "cpu" and not p.requires_grad for p in copy_.actor.parameters())


def test_loop_benchmark_of_a_seed_axis_and_its_projection_to_another_task(capsys):
    # Two seeds in one process: the parts add up over the seeds, the budget is the two runs'; the projection takes
    # the other task's whole budget, this run's acting, update and evaluation-acting costs, and the given env cost.
    from pomdp_ffm.bench import loop

    r = loop.run([*SMALL, "seeds=[0,1]"], steps=400, device="cpu", threads=1)
    assert r["seeds"] == 2 and r["parts"]["once"] > 0
    assert sum(r["parts"].values()) == pytest.approx(r["wall"], rel=0.05)
    assert (r["budget"]["pool_steps"], r["budget"]["steps"]) == (2 * 1000, 2 * 50000)
    loop.report(r)
    projected = loop.report_projection(r, "HopperBLT-V-v0", 0.5, "cpu", 1)
    out = capsys.readouterr().out
    assert "2 runs of HopperBLT-V-v0 (3,020,000 env steps" in out
    assert f"updates in joint rounds: 0 of {r['n_updates']} (0.0 %" in out  # a CPU's seeds take turns
    assert projected["env steps"] == pytest.approx(2 * (1_510_000 - 1000 * 10) * 0.5e-3)  # after its 10-episode pool
    assert projected["acting"] == pytest.approx(2 * (1_510_000 - 10_000) * r["per"]["act"])


def test_acting_benchmark_with_seeds_times_both_ways():
    from pomdp_ffm.bench.acting import run_seeds

    rows = run_seeds([2], repeats=1, device=torch.device("cpu"), models=("gru",))
    assert [(r.shape, r.model) for r in rows] == [
        ("HopperBLT-V_B1_sac_gru_S2", "separate"),
        ("HopperBLT-V_B1_sac_gru_S2", "gathered"),
    ]
    assert all(r.value > 0 and r.unit == "us" for r in rows)


@pytest.mark.slow
def test_update_benchmark_with_seeds_times_separate_and_together():
    from pomdp_ffm.bench.update import run_seeds

    rows = run_seeds([2], repeats=1, device=torch.device("cpu"))
    got = {(r.model, r.metric) for r in rows}
    assert {(v, "seed_updates_per_s") for v in ("separate", "together")} <= got
    assert {r.model for r in rows if r.metric == "ops_per_round"} == {"separate"}
    assert all(r.value > 0 for r in rows)


def test_dispatched_ops_count_what_launches_and_can_leave_the_optimisers_out():
    from pomdp_ffm.bench.common import DispatchedOps

    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.Adam([p])
    for optimisers in (False, True):
        p.grad = torch.ones(3)
        with DispatchedOps(optimisers=optimisers) as counted:
            x = torch.ones(2, 3)
            (x + 1).view(-1).t()  # views launch nothing
            opt.step()
        launched = {"aten.ones.default": 1, "aten.add.Tensor": 1}
        assert (dict(counted.ops) == launched) != optimisers and counted.total >= 2
    with counted, pytest.raises(RuntimeError, match="already counting"):
        with counted:
            pass


def _stop_at_call(monkeypatch, cls, name: str, at: int) -> None:
    """A stop signal to this process at the ``at``-th call of ``cls.name``, as `timeout` sends one."""
    import os
    import signal

    original, calls = getattr(cls, name), []

    def patched(self, *a, **kw):
        calls.append(1)
        if len(calls) == at:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, *a, **kw)

    monkeypatch.setattr(cls, name, patched)


def test_a_stopped_loop_benchmark_reports_what_it_ran(monkeypatch, capsys):
    # A benchmark run stopped by a signal (a `timeout` around it) reports the part it ran, marked as stopped,
    # and the command exits with the training's "stopped" code; stopped before its first update, it has nothing to
    # report and says so.
    from pomdp_ffm.bench import loop
    from pomdp_ffm.bench.__main__ import main
    from pomdp_ffm.run.exits import EXIT_STOPPED
    from pomdp_ffm.trainer import Trainer

    _stop_at_call(monkeypatch, SeqReplayBuffer, "sample", 15)
    r = loop.run(SMALL, steps=3000, device="cpu", threads=1)
    assert r["stopped"] and 15 <= r["n_updates"] < 140 and 0 < r["n_steps"] < 2800
    assert r["unmeasured"] == ["evaluation (upper bound)"]  # stopped before its first evaluation
    assert all(v > 0 for k, v in r["projected"].items() if k not in r["unmeasured"])
    loop.report(r)
    out = capsys.readouterr().out
    assert "STOPPED by a signal before the planned steps" in out
    assert "not reached by this run: left out" in out and "(without the parts not reached)" in out
    assert "eval step         not reached by this run" in out
    # So in the projection to another task (its env step given): the evaluation is left out, not costed at zero.
    projected = loop.report_projection(r, "HopperBLT-V-v0", 0.5, "cpu", 1)
    out = capsys.readouterr().out
    assert projected["evaluation (upper bound)"] == 0 and projected["acting"] > 0
    assert out.count("not reached by this run: left out") == 1 and "(without the parts not reached)" in out

    _stop_at_call(monkeypatch, SeqReplayBuffer, "sample", 15)
    with pytest.raises(SystemExit) as e:
        main(["loop", "--steps", "3000", "--threads", "1", *SMALL])
    assert e.value.code == EXIT_STOPPED and "STOPPED by a signal" in capsys.readouterr().out

    _stop_at_call(monkeypatch, Trainer, "_start_burst", 1)  # after the random pool
    with pytest.raises(loop.StoppedEarly, match="stopped by a signal before it timed an update"):
        loop.run(SMALL, steps=3000, device="cpu", threads=1)
    _stop_at_call(monkeypatch, Trainer, "_start_burst", 1)  # the command: one line, the "stopped" exit code
    with pytest.raises(SystemExit) as e:
        main(["loop", "--steps", "3000", "--threads", "1", *SMALL])
    assert e.value.code == EXIT_STOPPED
    assert capsys.readouterr().err == "stopped: the benchmark's run was stopped by a signal before it timed an update\n"
    whole = loop.run(SMALL, steps=400, device="cpu", threads=1)
    assert not whole["stopped"] and not whole["unmeasured"]


def test_a_single_loop_benchmark_stopped_while_it_starts_stops(monkeypatch, capsys):
    # A stop signal before the run's own handler is in (Hydra composing, the trainers being built) is remembered,
    # and the run stops at its first chance: one line and the "stopped" exit code, not a killed process.
    import os
    import signal

    from pomdp_ffm.bench import loop
    from pomdp_ffm.bench.__main__ import main
    from pomdp_ffm.run.exits import EXIT_STOPPED
    from pomdp_ffm.run.signals import sweep_stopped

    got = []
    old = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))  # in case nothing else holds it
    compose_run = loop.compose_run

    def compose_then_stop(*a, **kw):
        os.kill(os.getpid(), signal.SIGTERM)
        return compose_run(*a, **kw)

    monkeypatch.setattr(loop, "compose_run", compose_then_stop)
    try:
        with pytest.raises(SystemExit) as e:
            main(["loop", "--steps", "3000", "--threads", "1", *SMALL])
    finally:
        signal.signal(signal.SIGTERM, old)
    assert e.value.code == EXIT_STOPPED and not got
    assert capsys.readouterr().err.startswith("stopped: ")
    assert sweep_stopped() is None  # forgotten: the next run in this process is not stopped by it
