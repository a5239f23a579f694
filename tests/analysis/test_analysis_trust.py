"""What analysis tells the user: one warning count, NaN evals, horizons, the learning-curve rule, single-run
tasks, checkpoints and caches that cannot run code, the --out check and the efficiency legend."""

import json
import math
import pickle
import re

import numpy as np
import pandas as pd
import pytest
import torch
from analysis_synth import (
    Payload,
    progress_text,
    run_cli,
    steps_grid,
    write_our_run,
    write_payload_checkpoint,
    write_reference_run,
)

from analysis import aggregate, bench, curves, figstyle, load, modelfigures, stats
from analysis.cache import CACHE_FORMAT, CACHE_VERSION


def _ffm_state(alpha=(0.2, 0.05), omega=(0.5,)):
    return {
        "actor.rnn.memory.alpha": torch.tensor(alpha),
        "actor.rnn.memory.omega": torch.tensor(omega),
        "critic.rnn.memory.alpha": torch.tensor(alpha) / 2,
        "critic.rnn.memory.omega": torch.tensor(omega),
    }


def _issues(report, kind="warning"):
    return [(i.path, i.reason) for i in report.issues if i.kind == kind]


# --------------------------------------------------------------------------- the tree the CLI tests share


@pytest.fixture(scope="module")
def trust_tree(tmp_path_factory):
    """Hopper-P: FFM x 3 (seed 2 has a NaN eval at 20000; seed 0 carries two checkpoints whose unpickling would
    create files), GRU x 3 (seed 0 stops at 28000, the others at 56000). Walker-V: one FFM run, two GRU runs."""
    base = tmp_path_factory.mktemp("trust")
    root = base / "runs"
    targets = {"last": base / "pwned_last", "snapshot": base / "pwned_snapshot"}
    rng = np.random.default_rng(0)
    runs = {}
    for seed in range(3):
        ret = list(np.cumsum(rng.normal(30, 10, 12)))
        if seed == 2:
            ret[2] = math.nan  # env step 12000 + 2 * 4000 = 20000
        runs["ffm", seed] = write_our_run(root, "HopperBLT-P-v0", "sac", "ffm", seed, steps_grid(12), ret)
        n = 5 if seed == 0 else 12
        runs["gru", seed] = write_our_run(
            root, "HopperBLT-P-v0", "sac", "gru", seed, steps_grid(n), np.cumsum(rng.normal(20, 10, n)), done=seed != 0
        )
    write_payload_checkpoint(runs["ffm", 0] / "checkpoints" / "last.pt", targets["last"], how="torch")
    write_payload_checkpoint(runs["ffm", 0] / "save" / "agent_1_perf0.pt", targets["snapshot"], how="pickle")
    (runs["ffm", 1] / "checkpoints").mkdir()
    torch.save({"agent": {"modules": _ffm_state(), "num_updates": 1}}, runs["ffm", 1] / "checkpoints" / "last.pt")
    write_our_run(root, "WalkerBLT-V-v0", "sac", "ffm", 0, steps_grid(12), np.arange(12.0) * 40)
    for seed in range(2):
        write_our_run(root, "WalkerBLT-V-v0", "sac", "gru", seed, steps_grid(12), np.arange(12.0) * (30 + seed))
    return root, runs, targets


@pytest.fixture(scope="module")
def cli_all(trust_tree, tmp_path_factory):
    root, _, _ = trust_tree
    out = tmp_path_factory.mktemp("out_all")
    res = run_cli(root, "--out", out, "--resamples", "100", "--formats", "png", cwd=out)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    return res, out, pd.read_csv(out / "issues.csv"), (out / "report.md").read_text()


def _warning_count(text):
    counts = re.findall(r"(\d+) warning\(s\)", text)
    assert len(counts) == 1, text
    return int(counts[0])


@pytest.mark.slow
def test_one_warning_count_in_console_report_and_issues(cli_all):
    res, out, issues, report = cli_all
    n = int((issues["kind"] == "warning").sum())
    summary = res.stdout.strip().splitlines()[-1]
    assert _warning_count(summary) == n > 0
    assert f"- summary: {summary}" in report
    assert _warning_count(report.split("## Runs per group")[0]) == n
    # Each kind of warning is printed once on stderr with how many more there are: together, every warning.
    shown = [ln for ln in res.stderr.splitlines() if ln.startswith("warning: ")]
    more = [int(k) for ln in shown for k in re.findall(r"\(and (\d+) more like it, listed in report.md\)$", ln)]
    assert len(shown) + sum(more) == n and more  # the two FFM runs without a checkpoint are one kind


def test_nan_eval_return_is_a_warning_naming_run_and_step(cli_all, trust_tree):
    _, _, issues, report = cli_all
    _, runs, _ = trust_tree
    nan = issues[issues["reason"].str.contains("not finite")]
    assert nan["path"].tolist() == [str(runs["ffm", 2] / "progress.csv")]
    assert (nan["kind"] == "warning").all() and "20000" in nan["reason"].iloc[0]
    assert "20000" in report and "not finite" in report


def test_nan_eval_rows_are_dropped_and_counted(tmp_path):
    root = tmp_path / "runs"
    run = write_our_run(root, "HopperBLT-P-v0", "sac", "ffm", 0, steps_grid(5), [1.0, math.nan, 5.0, math.inf, 2.0])
    # An eval row whose return cell is empty counts too.
    text = progress_text(steps_grid(6), [1.0, 2.0, 3.0, 4.0, 5.0, 9.0]).replace(",9.0,", ",,")
    empty = write_our_run(root, "HopperBLT-P-v0", "sac", "ffm", 1, [], [])
    (empty / "progress.csv").write_text(text)
    all_nan = write_our_run(root, "HopperBLT-P-v0", "sac", "ffm", 2, steps_grid(2), [math.nan, math.nan])
    table, report = load.build_table([root])
    warnings = dict(_issues(report))
    w = warnings[str(run / "progress.csv")]
    assert w.startswith("2 eval return(s) not finite (NaN or empty, inf) at env step(s) 16000, 24000")
    assert "32000" in warnings[str(empty / "progress.csv")]
    assert table.loc[table.run_dir == run.as_posix(), "eval_return"].tolist() == [1.0, 5.0, 2.0]
    assert np.isfinite(table["eval_return"]).all()
    assert any("no eval row with a finite return" in r for p, r in _issues(report, "skipped") if str(all_nan) in p)
    assert len(report.warnings) == 3 and report.summary().endswith("1 skipped, 3 warning(s)")


# --------------------------------------------------------------------------- horizons


def test_different_horizons_warn_and_the_report_says_which(cli_all):
    _, out, issues, report = cli_all
    hop = issues[(issues["path"] == "HopperBLT-P-v0") & (issues["kind"] == "warning")]
    assert len(hop) == 1
    reason = hop["reason"].iloc[0]
    assert "28000 to 56000" in reason and "sac/gru 28000-56000 (3 runs)" in reason and "--max-steps 28000" in reason
    assert not (issues["path"] == "WalkerBLT-V-v0").any()
    horizons = report.split("## Runs per group and their horizon")[1].split("##")[0]
    gru = r"\| HopperBLT-P-v0 \| sac \| GRU \| 3 \| 28000 \| 56000 \| \S+sac_gru/seed-0/"
    assert re.search(gru, horizons), horizons
    assert re.search(r"\| WalkerBLT-V-v0 \| sac \| FFM \| 1 \| 56000 \| 56000 \|  \|", horizons), horizons
    summary = pd.read_csv(out / "tables" / "summary_runmax.csv").set_index(["task", "model"])
    assert summary.loc[("HopperBLT-P-v0", "gru"), ["env_steps_min", "env_steps_max"]].tolist() == [28000, 56000]


def _table(runs):
    """A tidy table from {run_id: (task, model, trial, steps, returns)}."""
    frames = [
        pd.DataFrame(
            {
                "run_id": rid,
                "source": "ours",
                "task": task,
                "algo": "sac",
                "model": model,
                "model_label": model.upper(),
                "seed": 0,
                "trial": trial,
                "finished": True,
                "status": "done",
                "env_steps": np.asarray(steps, float),
                "eval_return": np.asarray(ret, float),
            }
        )
        for rid, (task, model, trial, steps, ret) in runs.items()
    ]
    return pd.concat(frames, ignore_index=True)


def test_horizons_tolerate_one_eval_interval_and_respect_max_steps():
    long, short = steps_grid(30), steps_grid(9)  # 12000..128000 vs 12000..44000
    jitter = long + np.r_[np.zeros(29), -900.0]  # ends 900 steps early: less than one eval interval
    same = _table(
        {
            "a": ("HopperBLT-P-v0", "ffm", "s0", long, np.ones(30)),
            "b": ("HopperBLT-P-v0", "gru", "s0", jitter, np.ones(30)),
        }
    )
    groups, problems = stats.horizons(same)
    assert problems == [] and groups["env_steps_max"].tolist() == [128000.0, 127100.0]
    apart = _table(
        {
            "a": ("HopperBLT-P-v0", "ffm", "s0", long, np.ones(30)),
            "b": ("HopperBLT-P-v0", "gru", "s0", short, np.ones(9)),
        }
    )
    groups, problems = stats.horizons(apart)
    assert len(problems) == 1 and problems[0][:2] == ("HopperBLT-P-v0", "warning")
    assert "44000 to 128000" in problems[0][2] and "Shortest: b" in problems[0][2]
    assert groups.set_index("model")["shortest_run"].to_dict() == {"ffm": "a", "gru": "b"}
    cut, problems = stats.horizons(apart, max_steps=44000)
    assert problems == [] and set(cut["env_steps_max"]) == {44000.0}


def test_a_run_with_no_evaluation_up_to_max_steps_is_named():
    late = _table(
        {
            "a": ("HopperBLT-P-v0", "gru", "s0", steps_grid(5), np.ones(5)),
            "b": ("HopperBLT-P-v0", "gru", "s1", 48000 + steps_grid(5), np.ones(5)),
        }
    )
    groups, problems = stats.horizons(late, max_steps=40000)
    assert groups["n_runs"].tolist() == [1]
    assert problems == [
        ("b", "warning", "no evaluation up to --max-steps 40000 (its first is at 60000): left out of scores and curves")
    ]


# --------------------------------------------------------------------------- the learning-curve rule


def test_curve_mean_is_over_the_same_runs_up_to_the_shortest_run():
    # The "best so far" of run a stops at 16 evals while b and c go on to 24 with lower returns: a mean over the
    # runs still going would fall where a ends (1812 -> 1784 in the issue). The rule ends the mean there instead.
    grid = steps_grid(24)
    runs = {
        "a": ("HopperBLT-P-v0", "ffm", "seed-0", grid[:16], np.linspace(1000, 1900, 16)),
        "b": ("HopperBLT-P-v0", "ffm", "seed-1", grid, np.linspace(1000, 1780, 24)),
        "c": ("HopperBLT-P-v0", "ffm", "seed-2", grid, np.linspace(1000, 1790, 24)),
    }
    on_grid = curves.curves_on_grid(_table(runs), "runmax")
    band = curves.curve_band(on_grid, n_resamples=200, seed=0)
    assert band["env_steps"].max() == grid[15]  # the shortest run's last evaluation
    assert (band["n_runs"] == 3).all()
    assert (np.diff(band["mean"]) >= 0).all()  # a mean of running maxima over fixed runs never falls
    wide = on_grid.pivot(index="run_id", columns="env_steps", values="value")
    assert band["mean"].to_numpy() == pytest.approx(wide[band["env_steps"]].mean(axis=0).to_numpy())
    assert (band["ci_low"] <= band["mean"] + 1e-9).all() and (band["mean"] <= band["ci_high"] + 1e-9).all()
    ((path, kind, reason),) = curves.curve_cuts(on_grid)
    assert (path, kind) == ("HopperBLT-P-v0/sac_ffm", "warning")
    assert f"to {grid[15]:.0f} env steps" in reason and "shortest run (a)" in reason
    assert f"b (ends at {grid[-1]:.0f}), c (ends at {grid[-1]:.0f})" in reason
    # Runs of equal length: nothing is cut, nothing is said.
    same = {k: (t, m, tr, grid[:16], y[:16]) for k, (t, m, tr, _, y) in runs.items()}
    assert curves.curve_cuts(curves.curves_on_grid(_table(same))) == []


def test_curve_band_single_run_and_duplicate_seeds():
    grid = steps_grid(4)
    one = curves.curve_band(
        curves.curves_on_grid(
            _table({"a": ("Pendulum-V-v0", "gru", "s0", grid, [1, 3, 2, 5])}), grid_start=12000, grid_interval=4000
        )
    )
    assert one["mean"].tolist() == [1, 3, 3, 5] and one["ci_low"].isna().all() and (one["n_runs"] == 1).all()
    # Two runs of one seed (in two run directories) are two runs, not averaged into one.
    dup = _table(
        {
            "a": ("Pendulum-V-v0", "gru", "seed-0", grid, [1, 1, 1, 1]),
            "b": ("Pendulum-V-v0", "gru", "seed-0", grid, [3, 3, 3, 3]),
        }
    )
    band = curves.curve_band(curves.curves_on_grid(dup, grid_start=12000, grid_interval=4000), n_resamples=100)
    assert (band["n_runs"] == 2).all() and band["mean"].tolist() == [2.0] * 4


def test_cli_curves_follow_the_rule_and_warn(cli_all, trust_tree):
    _, out, issues, report = cli_all
    _, runs, _ = trust_tree
    lines = pd.read_csv(out / "tables" / "lines_runmax.csv")
    gru = lines[(lines.task == "HopperBLT-P-v0") & (lines.model == "gru")]
    assert gru["env_steps"].max() == 28000 and (gru["n_runs"] == 3).all()
    cut = issues[issues["path"] == "HopperBLT-P-v0/sac_gru"]["reason"].tolist()
    assert len(cut) == 1 and "ends at 56000" in cut[0]
    assert "up to the shortest run's last evaluation" in report  # the rule is stated in the report


# --------------------------------------------------------------------------- single-run tasks in the aggregate


def test_single_run_task_in_aggregate_is_noted():
    rows = [
        {"task": t, "algo": "sac", "model": m, "run_id": f"{m}{t}{i}", "score": v, "norm_score": v}
        for m, per_task in (
            ("ffm", {"A-P-v0": [0.5, 0.6], "B-P-v0": [0.9]}),
            ("gru", {"A-P-v0": [0.4, 0.3], "B-P-v0": [0.2, 0.1]}),
        )
        for t, vals in per_task.items()
        for i, v in enumerate(vals)
    ]
    agg, notes = aggregate.aggregate_scores(pd.DataFrame(rows), n_resamples=100, seed=0)
    assert agg.set_index("model")["single_run_tasks"].to_dict() == {"ffm": "B-P-v0", "gru": ""}
    assert len(notes) == 1 and "sac/ffm" in notes[0] and "B-P-v0" in notes[0] and "single run" in notes[0]


def test_cli_single_run_task_is_a_warning_and_a_note(cli_all):
    _, out, issues, report = cli_all
    w = issues[issues["path"] == "WalkerBLT-V-v0/sac_ffm"]
    assert w["kind"].tolist() == ["warning"] and "single sac/ffm run" in w["reason"].iloc[0]
    notes = report.split("## Notes")[1].split("##")[0]
    assert "WalkerBLT-V-v0 have a single run" in notes
    agg = pd.read_csv(out / "tables" / "aggregate_runmax.csv", keep_default_na=False)
    assert set(agg.loc[agg.model == "ffm", "single_run_tasks"]) == {"WalkerBLT-V-v0"}
    # The probability of improvement's interval has the same blind spot, and says so.
    poi = pd.read_csv(out / "tables" / "probability_of_improvement.csv", keep_default_na=False)
    assert poi[["model_x", "model_y", "single_run_tasks"]].values.tolist() == [["ffm", "gru", "WalkerBLT-V-v0"]]
    w = issues[issues["path"] == "sac: ffm vs gru"]
    assert w["kind"].tolist() == ["warning"] and "WalkerBLT-V-v0 have a single run" in w["reason"].iloc[0]


# --------------------------------------------------------------------------- loading never runs code


def test_payload_is_real(tmp_path):
    # The crafted object does run code when unpickled in full: the tests below mean something.
    target = tmp_path / "control"
    pickle.loads(pickle.dumps(Payload(target)))
    assert target.exists()


@pytest.mark.slow
def test_cli_refuses_crafted_checkpoints_without_running_them(cli_all, trust_tree, tmp_path):
    root, runs, targets = trust_tree
    _, out_all, issues_all, _ = cli_all
    res = run_cli("decay", root, "--out", tmp_path / "out", "--formats", "png", cwd=tmp_path)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    issues_decay = pd.read_csv(tmp_path / "out" / "issues.csv")
    for issues in (issues_all, issues_decay):
        refused = issues[issues["reason"].str.contains("refused")]
        assert sorted(refused["path"]) == sorted(
            str(runs["ffm", 0] / rel) for rel in ("checkpoints/last.pt", "save/agent_1_perf0.pt")
        )
        assert (refused["kind"] == "warning").all()
    for target in targets.values():
        assert not target.exists(), f"{target}: a checkpoint's payload ran"
    # The good FFM checkpoints (new layout) still make the figure.
    for out in (out_all, tmp_path / "out"):
        values = pd.read_csv(out / "tables" / "decay_values.csv")
        assert set(values["run_id"].str.extract(r"(seed-\d)")[0]) == {"seed-1"}
        assert (out / "figures" / "decay_HopperBLT-P_sac.png").is_file()


def test_cache_is_json_and_a_planted_pickle_never_runs(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    write_our_run(root, "HopperBLT-P-v0", "sac", "ffm", 0, steps_grid(4), [1.0, 2.0, math.nan, 3.0])
    write_reference_run(root, "HopperBLT", "P", "sac", "gru", None, steps_grid(3), [1.0, 7.0, 2.0], "05-10:1")
    cache = tmp_path / "out" / ".cache"
    first, rep1 = load.load_runs([root], cache_dir=cache)
    (written,) = cache.iterdir()
    assert written.suffix == ".json" and json.loads(written.read_text())["format"] == CACHE_FORMAT
    # Read back: the same table (dtypes included) and the same report.
    second, rep2 = load.load_runs([root], cache_dir=cache)
    pd.testing.assert_frame_equal(first, second)
    pd.testing.assert_frame_equal(rep1.to_frame(), rep2.to_frame())
    assert rep1.summary() == rep2.summary() and len(rep2.warnings) >= 1
    # A tree that ships a pickle under the cache's names (the old one and the new one) is never unpickled.
    target = tmp_path / "pwned_cache"
    evil = pickle.dumps(Payload(target))
    written.with_suffix(".pkl").write_bytes(evil)
    written.write_bytes(evil)
    calls = []
    real = load.build_table
    monkeypatch.setattr(load, "build_table", lambda roots: calls.append(1) or real(roots))
    third, _ = load.load_runs([root], cache_dir=cache)
    assert calls == [1] and not target.exists()
    pd.testing.assert_frame_equal(first, third)
    assert json.loads(written.read_text())["version"] == CACHE_VERSION
    assert not written.with_suffix(".pkl").exists()


# --------------------------------------------------------------------------- --out and the efficiency legend


@pytest.mark.slow
def test_out_naming_a_file_is_a_one_line_error(tmp_path):
    (tmp_path / "report.txt").write_text("keep me\n")
    res = run_cli(tmp_path, "--out", "report.txt", cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr == "error: --out report.txt is a file; give a directory\n"
    assert (tmp_path / "report.txt").read_text() == "keep me\n"


def test_out_below_a_file_is_a_one_line_error(tmp_path, capsys):
    from analysis import cli

    (tmp_path / "report.txt").write_text("")
    assert cli._prepare_out(str(tmp_path / "report.txt" / "sub")) is None
    err = capsys.readouterr().err
    assert err.startswith(f"error: --out {tmp_path}/report.txt/sub cannot be created: ") and err.count("\n") == 1
    assert cli._prepare_out(str(tmp_path / "new" / "dir")) == tmp_path / "new" / "dir"
    assert (tmp_path / "new" / "dir").is_dir()


def test_efficiency_panels_say_which_way_is_better(tmp_path, monkeypatch):
    assert bench.better("update_ms", "ms") == bench.better("peak_mem_mb", "MB") == "lower"
    assert bench.better("updates_per_s", "1/s") == bench.better("achieved_gflop_s", "GFLOP/s") == "higher"
    assert bench.better("new_rate", "steps/s") == "higher" and bench.better("mystery", "") is None
    rows = [
        ("update", "S", m, metric, v, unit)
        for m, v in (("ffm", 1.0), ("gru", 2.0))
        for metric, unit in (("update_ms", "ms"), ("updates_per_s", "1/s"), ("achieved_gflop_s", "GFLOP/s"))
    ]
    summary = bench.summarize_bench(pd.DataFrame(rows, columns=bench.BENCH_COLUMNS))
    figs = []
    monkeypatch.setattr(figstyle, "save", lambda fig, base, formats: figs.append(fig) or [])
    modelfigures.plot_efficiency(summary, tmp_path / "eff", ("png",))
    (fig,) = figs
    titles = {ax.get_ylabel().split(" ")[0]: ax.get_title() for ax in fig.axes if ax.get_visible()}
    assert titles["update_ms"].endswith("lower is better")
    assert titles["updates_per_s"].endswith("higher is better")
    assert titles["achieved_gflop_s"].endswith("higher is better")
    texts = [t.get_text() for legend in fig.legends for t in [legend.get_title(), *legend.get_texts()]]
    assert not any("lower is better" in t.lower() for t in texts)
    figstyle.plt.close(fig)


# --------------------------------------------------------------------------- benchmark CSVs that cannot be trusted
BENCH_HEADER = "benchmark,shape,model,metric,value,unit\n"


def test_a_benchmark_csv_with_bytes_that_are_not_utf8_loses_those_rows_only_and_is_named(tmp_path, capsys):
    # As a run's progress.csv, the file is read with its undecodable bytes replaced; a row they touch is left out
    # (its model would be a new one, "g?ru"), and one warning names the file and the row's line.
    from analysis import cli

    rows = "".join(f"efficiency,s1,{m},train_s,{v},s\n" for m in ("ffm", "gru") for v in (1.0, 2.0, 3.0))
    path = tmp_path / "efficiency.csv"
    path.write_bytes((BENCH_HEADER + rows).encode().replace(b"gru,train_s,2.0", b"g\xffru,train_s,2.0"))
    out = tmp_path / "out"
    argv = ["efficiency", str(path), "--out", str(out), "--resamples", "50", "--formats", "png"]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err.splitlines()
    assert f"warning: {path}: 1 row(s) left out: line 6 (bytes that are not UTF-8)" in err
    table = pd.read_csv(out / "tables" / "efficiency_paper.csv").set_index("model")
    assert table["n_trials"].to_dict() == {"ffm": 3, "gru": 2}
    assert table.loc["gru", "median"] == pytest.approx(2.0)


@pytest.mark.parametrize("how", ["argument", "--bench"])
def test_a_missing_benchmark_csv_is_named_and_nothing_is_written(tmp_path, capsys, how):
    from analysis import cli

    gone, out = tmp_path / "gone.csv", tmp_path / "out"
    given = [str(gone)] if how == "argument" else ["--bench", str(gone)]
    assert cli.main(["efficiency", *given, "--out", str(out)]) == 2
    assert capsys.readouterr().err == f"error: no benchmark CSV file at {gone}\n"
    assert not out.exists()


def test_impossible_benchmark_values_are_left_out_with_one_warning_naming_each_row(tmp_path):
    # A time or a size that cannot be (negative, NaN, infinite, a time over a year, memory over 1 EiB) is a broken
    # clock or a damaged file: left out, the file, line and value named, not averaged into a model's mean. A
    # figure of a metric no rule knows (the ledger's, no unit) may be negative.
    lines = [
        "efficiency,s1,ffm,train_s,-1,s",
        "efficiency,s1,ffm,train_s,1e308,s",
        "efficiency,s1,ffm,train_s,nan,s",
        "efficiency,s1,ffm,latency_ms,inf,ms",
        "efficiency,s1,ffm,peak_mem_mb,1e40,MB",
        "efficiency,s1,ffm,train_s,oops,s",
        "efficiency,s1,ffm,train_s,0.5,s",
        "efficiency,s1,ffm,latency_ms,0.2,ms",
        "efficiency,s1,ffm,peak_mem_mb,16,MB",
        "ledger decay,s1,float32,log_error,-3.5,",
    ]
    path = tmp_path / "efficiency.csv"
    path.write_text(BENCH_HEADER + "\n".join(lines) + "\n")
    data, problems = bench.read_bench([path])
    assert problems == [
        (
            str(path),
            "warning",
            "6 row(s) left out: line 2 value '-1' (train_s in s: negative); line 3 value '1e308' (train_s in s: longer "
            "than a year); line 4 value 'nan' (train_s in s: not a number); line 5 value 'inf' (latency_ms in ms: "
            "infinite); line 6 value '1e40' (peak_mem_mb in MB: more than 1 EiB), and 1 more",
        )
    ]
    assert data["value"].tolist() == [0.5, 0.2, 16.0, -3.5]


# --------------------------------------------------------------------------- what the console and labels say


def test_last_fraction_and_curve_settings_are_what_the_labels_and_report_say(trust_tree, tmp_path, capsys):
    from analysis import cli

    root, _, _ = trust_tree
    assert (
        cli.main(
            [
                "table",
                str(root),
                "--out",
                str(tmp_path),
                "--metric",
                "last20",
                "--last-frac",
                "0.5",
                "--window",
                "4",
                "--resamples",
                "50",
            ]
        )
        == 0
    )
    report = (tmp_path / "report.md").read_text()
    assert "mean of the last 50% of the smoothed" in report and "20%" not in report
    assert "smoothing window 4 grid points" in report and "start the task's default" in report
    assert "last 50%" in (tmp_path / "tables" / "summary_last20.md").read_text()


def test_tasks_the_aggregate_leaves_out_are_a_warning_on_the_console(tmp_path, capsys):
    from analysis import cli

    for seed in range(2):
        for task in ("HopperBLT-P-v0", "WalkerBLT-V-v0"):
            write_our_run(tmp_path / "runs", task, "sac", "ffm", seed, steps_grid(3), [1.0, 100.0 + seed, 2.0])
        for model in ("ffm", "gru"):
            write_our_run(
                tmp_path / "runs", "HopperBLT-P-v0", "td3", model, seed, steps_grid(3), [1.0, 90.0 + seed, 2.0]
            )

    def aggregate_tasks(out):
        assert (
            cli.main(["aggregate", str(tmp_path / "runs"), "--out", str(out), "--resamples", "50", "--formats", "png"])
            == 0
        )
        agg = pd.read_csv(out / "tables" / "aggregate_runmax.csv")
        return agg.drop_duplicates(["algo", "model"]).set_index(["algo", "model"])["n_tasks"].to_dict()

    # The task TD3 lacks is SAC's all the same: the task set is per algorithm.
    assert aggregate_tasks(tmp_path / "out") == {("sac", "ffm"): 2, ("td3", "ffm"): 1, ("td3", "gru"): 1}
    assert "left out" not in capsys.readouterr().err
    # A SAC group without it narrows SAC's aggregate, and the console says so.
    for seed in range(2):
        write_our_run(tmp_path / "runs", "HopperBLT-P-v0", "sac", "gru", seed, steps_grid(3), [1.0, 80.0 + seed, 2.0])
    assert aggregate_tasks(tmp_path / "out2") == {
        ("sac", "ffm"): 1,
        ("sac", "gru"): 1,
        ("td3", "ffm"): 1,
        ("td3", "gru"): 1,
    }
    err = capsys.readouterr().err
    assert "warning: sac_ffm: aggregate (runmax): task(s) WalkerBLT-V-v0 left out, as not every compared sac " in err
    assert "td3_ffm" not in err


def test_with_pool_sources_the_references_other_agents_do_not_narrow_the_aggregate(tmp_path, capsys):
    from analysis import cli

    for seed in range(2):
        for task in ("HopperBLT-P-v0", "WalkerBLT-V-v0"):
            for model in ("ffm", "gru"):
                write_our_run(tmp_path / "ours", task, "sac", model, seed, steps_grid(3), [1.0, 100.0 + seed, 2.0])
    oracle = tmp_path / "ref" / "logs" / "pomdp" / "HopperBLT" / "P" / "oracle_sac_gru" / "gamma-0.99" / "x"
    oracle.mkdir(parents=True)
    (oracle / "progress.csv").write_text(progress_text(steps_grid(3), [1.0, 2000.0, 2.0]))
    (oracle / "variant_1.yml").write_text(
        "seed: 0\nenv:\n  env_name: HopperBLT-P-v0\npolicy:\n  seq_model: gru\n  algo_name: sac\n"
    )
    out = tmp_path / "out"
    assert (
        cli.main(
            [
                "aggregate",
                str(tmp_path / "ours"),
                str(tmp_path / "ref"),
                "--out",
                str(out),
                "--pool-sources",
                "--resamples",
                "50",
                "--formats",
                "png",
                "--no-cache",
            ]
        )
        == 0
    )
    agg = pd.read_csv(out / "tables" / "aggregate_runmax.csv")
    assert agg.set_index(["model", "metric"]).loc[("ffm", "IQM"), "n_tasks"] == 2
    assert agg.set_index(["model", "metric"]).loc[("gru+oracle", "IQM"), "n_tasks"] == 1
