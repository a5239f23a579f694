import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from analysis_synth import steps_grid, write_our_run, write_reference_run
from hang import HANG_S
from marks import parametrize_first_fast
from matplotlib.container import ErrorbarContainer

import analysis
from analysis import aggregate, bench, curves, decay, figures, load, modelfigures, stats

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _assert_png(paths):
    pngs = [Path(p) for p in paths if str(p).endswith(".png")]
    assert pngs, paths
    for p in pngs:
        assert p.stat().st_size > 5000, p  # a blank canvas is smaller than any real plot
        assert p.read_bytes()[:8] == PNG_MAGIC


def _save_ffm_checkpoint(run: Path, alpha_actor, omega_actor, alpha_critic, omega_critic, name="last.pt"):
    state = {
        "actor.rnn.memory.alpha": torch.tensor(alpha_actor, dtype=torch.float32),
        "actor.rnn.memory.omega": torch.tensor(omega_actor, dtype=torch.float32),
        "critic.rnn.memory.alpha": torch.tensor(alpha_critic, dtype=torch.float32),
        "critic.rnn.memory.omega": torch.tensor(omega_critic, dtype=torch.float32),
        # Targets must be ignored: their values would double-count the same network.
        "actor_target.rnn.memory.alpha": torch.full((4,), 123.0),
        "critic.q1.weight": torch.zeros(2, 2),
    }
    (run / "checkpoints").mkdir(exist_ok=True)
    torch.save({"agent": state}, run / "checkpoints" / name)


@pytest.fixture(scope="module")
def small_tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("tree") / "runs"
    rng = np.random.default_rng(0)
    for task in ("HopperBLT-P-v0", "WalkerBLT-V-v0", "Pendulum-V-v0"):
        for algo in ("sac", "td3"):
            for model, drift in (("ffm", 30.0), ("gru", 20.0)):
                for seed in range(3):
                    ret = np.cumsum(rng.normal(drift, 25.0, 12))
                    run = write_our_run(root, task, algo, model, seed, steps_grid(12), ret)
                    if model == "ffm":
                        a = rng.uniform(0.01, 0.5, 8)
                        _save_ffm_checkpoint(run, a, rng.uniform(0.05, 1.0, 2), a / 10, rng.uniform(0.05, 1.0, 2))
    write_reference_run(
        root, "HopperBLT", "P", "sac", "gru", 0, steps_grid(12), np.arange(12.0) * 50, "05-09:12-34:56.78"
    )
    (root / "broken").mkdir()
    (root / "broken" / "progress.csv").write_text("")
    bench_csv = root.parent / "bench.csv"
    lines = ["benchmark,shape,model,metric,value,unit"]
    for shape, scale in (("T64_B64_in64_h128", 1), ("T256_B64_in64_h128", 4)):
        for model, v in (("ffm", 10.0), ("gru", 30.0), ("lstm", 33.0)):
            lines += [
                f"memory,{shape},{model},fwd_bwd_ms,{v * scale},ms",
                f"memory,{shape},{model},act_us,{v},us",
                f"memory,{shape},{model},peak_mem_mb,{v * 2},MB",
                f"update,{shape},{model},update_ms,{v * 3},ms",
            ]
    bench_csv.write_text("\n".join(lines) + "\n")
    return root, bench_csv


@pytest.fixture(scope="module")
def loaded(small_tree):
    table, _ = load.build_table([small_tree[0]])
    table = load.separate_sources(table)
    return table, stats.run_scores(table)


def test_bars_png(loaded, tmp_path):
    table, scores = loaded
    summary = stats.summarize(scores, n_resamples=200)
    _assert_png(figures.plot_task_bars(summary, scores, tmp_path / "bars", "Best eval return", ("png",)))


@pytest.mark.parametrize("style", ["runmax", "smoothed"])
def test_lines_png(loaded, tmp_path, style):
    table, _ = loaded
    on_grid = curves.curves_on_grid(table, style=style)
    band = curves.curve_band(on_grid, n_resamples=200)
    _assert_png(figures.plot_curves(on_grid, band, tmp_path / "lines", "sac", "Return", ("png",)))


def test_aggregate_and_profile_png(loaded, tmp_path):
    _, scores = loaded
    norm, _ = stats.normalize(scores)
    agg, _ = aggregate.aggregate_scores(norm, n_resamples=200)
    ours = agg[~agg.model.str.endswith("@ref")]
    assert set(ours["n_tasks"]) == {2}  # Pendulum has no constants
    assert set(agg.loc[agg.model == "gru@ref", "n_tasks"]) == {1}
    _assert_png(figures.plot_aggregate(agg, tmp_path / "agg", ("png",)))
    prof = aggregate.performance_profile(norm, np.linspace(0, 1, 21), n_resamples=200)
    _assert_png(figures.plot_profile(prof, tmp_path / "prof", ("png",)))


def test_decay_values_and_png(small_tree, loaded, tmp_path):
    table, _ = loaded
    runs = table.drop_duplicates("run_id")
    values, problems = decay.load_decay(runs, beta=0.01)
    assert values["run_id"].nunique() == 3 * 2 * 3
    assert not values["key"].str.contains("target").any()
    assert set(values["module"]) == {"actor", "critic"}
    assert problems == []
    _assert_png(modelfigures.plot_decay(values, tmp_path / "decay", "test", 0.01, ("png",)))


def test_timescale_formulas():
    # ln(1/0.01) / alpha steps until a trace is at 1%; 2 pi / |omega| per period.
    assert decay.timescales("alpha", np.array([math.log(100) / 50]), 0.01) == pytest.approx([50.0])
    assert decay.timescales("alpha", np.array([math.log(10) / 8]), 0.1) == pytest.approx([8.0])
    assert decay.timescales("omega", np.array([-2 * math.pi / 16]))[0] == pytest.approx(16.0)
    assert np.isinf(decay.timescales("alpha", np.array([0.0]))).all()
    with pytest.raises(ValueError, match="'gamma'"):
        decay.timescales("gamma", np.array([1.0]))


def test_decay_picks_last_pt_and_reports_missing(tmp_path):
    root = tmp_path / "runs"
    run = write_our_run(root, "HopperBLT-P-v0", "sac", "ffm", 0, steps_grid(2), [1.0, 2.0])
    _save_ffm_checkpoint(run, [1.0], [1.0], [1.0], [1.0], name="step_100.pt")
    _save_ffm_checkpoint(run, [math.log(100) / 20], [2 * math.pi / 7], [0.0], [1.0], name="last.pt")
    os.utime(run / "checkpoints" / "last.pt", (1, 1))  # older on disk, but last.pt still wins
    bare = write_our_run(root, "HopperBLT-P-v0", "sac", "ffm", 1, steps_grid(2), [1.0, 2.0])
    table, _ = load.build_table([root])
    values, problems = decay.load_decay(table.drop_duplicates("run_id"), beta=0.01)
    actor = values[values.module == "actor"].set_index("quantity")["steps"]
    assert actor["t_alpha"] == pytest.approx(20.0) and actor["t_omega"] == pytest.approx(7.0, rel=1e-5)
    assert (values["checkpoint"] == "last.pt").all()
    assert (bare.as_posix(), "warning", "FFM run has no checkpoint (*.pt under checkpoints/ or save/)") in problems
    assert any("no decay" in r for _, _, r in problems)  # critic alpha = 0


def test_efficiency_png_and_bad_bench_rows(small_tree, tmp_path):
    _, bench_csv = small_tree
    bad = tmp_path / "bad.csv"
    bad.write_text("benchmark,shape,model,metric,value,unit\nmemory,T1,ffm,fwd_ms,oops,ms\nmemory,T1,ffm,fwd_ms,2,ms\n")
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("a,b\n1,2\n")
    data, problems = bench.read_bench([bench_csv, bad, wrong])
    assert any("'oops'" in r for _, _, r in problems)
    assert any("missing column" in r and k == "skipped" for _, k, r in problems)
    summary = bench.summarize_bench(data)
    assert summary.loc[(summary.metric == "fwd_ms"), "value"].tolist() == [2.0]
    _assert_png(modelfigures.plot_efficiency(summary, tmp_path / "eff", ("png",)))
    with pytest.raises(FileNotFoundError, match="missing.csv"):
        bench.read_bench([tmp_path / "missing.csv"])


def _run_cli(*args, cwd):
    env = dict(os.environ)
    # Run the package under test even if another checkout is installed in the environment.
    env["PYTHONPATH"] = str(Path(analysis.__file__).resolve().parent.parent)
    env["MPLBACKEND"] = "Agg"
    return subprocess.run(
        [sys.executable, "-m", "analysis", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=HANG_S
    )


@pytest.mark.slow  # (23 s; test_cli_single_command_and_options runs the same command in the default suite)
def test_cli_end_to_end(small_tree, tmp_path):
    root, bench_csv = small_tree
    out = tmp_path / "out"
    res = _run_cli(str(root), "--out", str(out), "--bench", str(bench_csv), "--resamples", "200", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    expected = [
        "tables/runs.csv",
        "tables/runs.parquet",
        "tables/summary_runmax.md",
        "tables/scores_runmax.csv",
        "tables/bars_runmax.csv",
        "figures/bars_runmax.png",
        "figures/bars_runmax.pdf",
        "figures/lines_runmax_sac.png",
        "figures/lines_runmax_td3.png",
        "tables/lines_runmax.csv",
        "figures/aggregate_runmax.png",
        "tables/aggregate_runmax.md",
        "figures/profile_runmax.png",
        "tables/probability_of_improvement.md",
        "figures/decay_HopperBLT-P_sac.png",
        "tables/decay_values.csv",
        "figures/efficiency.png",
        "tables/efficiency.md",
        "report.md",
        "issues.csv",
    ]
    for rel in expected:
        p = out / rel
        assert p.is_file() and p.stat().st_size > 0, rel
        assert f"wrote {p}" in res.stdout, rel
    report = (out / "report.md").read_text()
    assert "broken/progress.csv" in report and "empty file" in report
    assert "Pendulum-V-v0" in report  # excluded from normalised aggregates, with a note
    assert "empty file" in res.stderr

    summary = pd.read_csv(out / "tables" / "summary_runmax.csv")
    one_run = summary["n_runs"] == 1
    assert summary.loc[one_run, "ci_low"].isna().all() and summary.loc[~one_run, "ci_low"].notna().all()
    assert (out / ".cache").is_dir()

    # A second run with the same seed is served from the cache and gives identical numbers.
    res2 = _run_cli("table", str(root), "--out", str(out), "--resamples", "200", cwd=tmp_path)
    assert res2.returncode == 0, res2.stderr
    assert "figures/" not in res2.stdout
    pd.testing.assert_frame_equal(summary, pd.read_csv(out / "tables" / "summary_runmax.csv"))


def test_cli_single_command_and_options(small_tree, tmp_path):
    root, _ = small_tree
    out = tmp_path / "o"
    res = _run_cli(
        "bars",
        str(root),
        "--out",
        str(out),
        "--metric",
        "last20",
        "--resamples",
        "100",
        "--formats",
        "png",
        "--no-cache",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert (out / "figures" / "bars_last20.png").stat().st_size > 0
    assert not (out / "figures" / "bars_last20.pdf").exists()
    assert not (out / ".cache").exists()


@parametrize_first_fast(
    "args, message",
    [
        (["--resamples", "0"], "--resamples must be positive, got 0"),
        (["--formats", "png,jpg"], "'jpg'"),
        (["--metric", "best"], "invalid choice: 'best'"),
    ],
)
def test_cli_rejects_bad_options(small_tree, tmp_path, args, message):
    root, _ = small_tree
    res = _run_cli(str(root), "--out", str(tmp_path / "o"), *args, cwd=tmp_path)
    assert res.returncode == 2  # a usage error, as argparse's own
    assert message in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "o").exists()  # refused before the output folder is made


@pytest.mark.slow
def test_cli_missing_runs_folder_is_a_usage_error(tmp_path):
    res = _run_cli(str(tmp_path / "nope"), "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.startswith("error: no such RUNS folder")
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_cli_seed_reproducible(small_tree, tmp_path):
    root, _ = small_tree
    outs = []
    for name, seed in (("a", "5"), ("b", "5"), ("c", "6")):
        res = _run_cli(
            "aggregate",
            str(root),
            "--out",
            str(tmp_path / name),
            "--seed",
            seed,
            "--resamples",
            "300",
            "--formats",
            "png",
            cwd=tmp_path,
        )
        assert res.returncode == 0, res.stderr
        outs.append(pd.read_csv(tmp_path / name / "tables" / "aggregate_runmax.csv"))
    pd.testing.assert_frame_equal(outs[0], outs[1])
    assert not outs[0]["ci_low"].equals(outs[2]["ci_low"])


def test_decay_reads_both_checkpoint_layouts(tmp_path):
    # checkpoints/last.pt holds the weights under state["agent"]["modules"] next to optimiser and RNG tensors;
    # save/agent_*.pt snapshots under state["agent"]. Both are tensors-only and both are read.
    import pandas as pd
    import torch

    agent = {
        "actor.encoder.memory.alpha": torch.tensor([math.log(100) / 20.0]),
        "actor.encoder.memory.omega": torch.tensor([2 * math.pi / 8.0]),
    }
    resume = tmp_path / "resume"
    (resume / "checkpoints").mkdir(parents=True)
    torch.save(
        {
            "agent": {"modules": agent, "optim": {"actor": {"state": {}, "param_groups": []}}, "num_updates": 3},
            "rng": {"torch": torch.get_rng_state()},
            "counters": {"env_steps": 100},
        },
        resume / "checkpoints" / "last.pt",
    )
    snap = tmp_path / "snap"
    (snap / "save").mkdir(parents=True)
    torch.save({"agent": agent}, snap / "save" / "agent_3_perf-120.000.pt")
    runs = pd.DataFrame(
        [
            {"run_id": r.name, "run_dir": str(r), "task": "Pendulum-V-v0", "algo": "sac", "model": "ffm"}
            for r in (resume, snap)
        ]
    )
    values, problems = decay.load_decay(runs, beta=0.01)
    assert problems == []
    for rid, name in (("resume", "last.pt"), ("snap", "agent_3_perf-120.000.pt")):
        v = values[values.run_id == rid]
        assert sorted(v["steps"].round(6).tolist()) == [8.0, 20.0] and set(v["checkpoint"]) == {name}


def test_decay_reads_the_reference_snapshots_parameters(tmp_path):
    # The reference's FFM keeps the log-decay a = -alpha and the frequencies b = omega (an FFA module named ffm at
    # the paper's commit, ffa later); its snapshots are the agent's bare state dict, target networks included.
    import pandas as pd
    import torch

    a, b = -math.log(100) / torch.tensor([[[20.0, 50.0]]]), 2 * math.pi / torch.tensor([[[8.0]]])
    run = tmp_path / "logs" / "pomdp" / "HopperBLT" / "P" / "sac_ffm" / "05-09:12-34:56.78"
    (run / "save").mkdir(parents=True)
    torch.save(
        {
            "actor.rnn.ffa.a": a,
            "actor.rnn.ffa.b": b,
            "critic.rnn.ffm.a": a,
            "critic.rnn.ffm.b": b,
            "critic_target.rnn.ffa.a": 5 * a,
            "actor.rnn.pre.weight": torch.ones(2, 2),
        },
        run / "save" / "agent_10_perf100.000.pt",
    )
    runs = pd.DataFrame(
        [{"run_id": "r", "run_dir": str(run), "task": "HopperBLT-P-v0", "algo": "sac", "model": "ffm@ref"}]
    )
    values, problems = decay.load_decay(runs, beta=0.01)
    assert problems == []
    got = values.groupby(["module", "param"])["steps"].apply(lambda s: sorted(s.round(3)))  # float32 weights
    assert got.to_dict() == {
        ("actor", "alpha"): [20.0, 50.0],
        ("actor", "omega"): [8.0],
        ("critic", "alpha"): [20.0, 50.0],
        ("critic", "omega"): [8.0],
    }


def test_decay_skips_checkpoints_the_safe_loader_refuses(tmp_path):
    # An old-format resume checkpoint holding numpy RNG states is refused (never unpickled in full), named in a
    # warning, and the run's snapshot is used instead.
    import pandas as pd
    import torch

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "save").mkdir()
    torch.save(
        {"agent": {"actor.encoder.memory.alpha": torch.tensor([1.0])}, "rng": np.random.get_state()},
        run / "checkpoints" / "last.pt",
    )
    torch.save(
        {"agent": {"actor.encoder.memory.alpha": torch.tensor([math.log(100) / 20.0])}},
        run / "save" / "agent_1_perf0.000.pt",
    )
    runs = pd.DataFrame([{"run_id": "r", "run_dir": str(run), "task": "Pendulum-V-v0", "algo": "sac", "model": "ffm"}])
    values, problems = decay.load_decay(runs, beta=0.01)
    assert [(p, k) for p, k, _ in problems] == [(str(run / "checkpoints" / "last.pt"), "warning")]
    assert "refused" in problems[0][2] and "never unpickled" in problems[0][2] and "\x1b" not in problems[0][2]
    assert values["steps"].round(6).tolist() == [20.0] and set(values["checkpoint"]) == {"agent_1_perf0.000.pt"}


@pytest.mark.slow
def test_cli_folder_without_runs_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    res = _run_cli("lines", str(tmp_path / "empty"), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert res.returncode != 0
    assert "no usable runs" in res.stderr and "empty" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize("product", ["outer", "hadamard"])
def test_decay_tables_use_the_models_own_timescales(product):
    # One formula, the model's (pomdp_ffm.seq_models.ffm): in float64 the analysis's numbers are the module's but for
    # rounding (torch divides by multiplying with a reciprocal, numpy divides).
    from pomdp_ffm.seq_models import build

    ffm = build("ffm", input_size=4, hidden_size=128, decay_context_product=product).double()
    with torch.no_grad():
        ffm.omega[..., 0] = -ffm.omega[..., 1]  # (a negative frequency: its period is that of |omega|)
    for beta in (0.01, 0.1, 0.9):
        np.testing.assert_allclose(
            decay.timescales("alpha", ffm.alpha.detach().numpy().reshape(-1), beta),
            ffm.trace_durability(beta).numpy().reshape(-1),
            rtol=1e-15,
            atol=0,
        )
    np.testing.assert_allclose(
        decay.timescales("omega", ffm.omega.detach().numpy().reshape(-1)),
        ffm.context_periods().numpy().reshape(-1),
        rtol=1e-15,
        atol=0,
    )


def test_the_efficiency_figure_has_the_papers_panels_and_the_runs_best_returns(tmp_path, monkeypatch):
    # Benchmark trials for FFM and GRU (GRU also as Python cells), and two runs of each on Pendulum-V: the figure's
    # panels are train time (log axis), latency, memory and best return, whose bars are the runs' mean best return.
    from analysis import cli, figstyle

    csv_path = tmp_path / "efficiency.csv"
    trials = [("train_s", "s", [2.0, 2.2]), ("latency_ms", "ms", [0.4, 0.5]), ("peak_mem_mb", "MB", [70.0])]
    lines = ["benchmark,shape,model,metric,value,unit"]
    for k, model in enumerate(["ffm", "gru", "gru+cells"]):
        lines += [f"efficiency,s1,{model},{m},{v * (k + 1)},{u}" for m, u, values in trials for v in values]
    csv_path.write_text("\n".join(lines) + "\n")
    root = tmp_path / "runs"
    best = {"ffm": [-300.0, -200.0], "gru": [-500.0, -400.0]}
    for model, bests in best.items():
        for seed, top in enumerate(bests):
            write_our_run(
                root, "Pendulum-V-v0", "sac", model, seed, steps_grid(4, 2_000, 1_000), [-900, top, -700, -800]
            )
    figs = {}
    monkeypatch.setattr(figstyle, "save", lambda fig, base, formats: figs.setdefault(Path(base).name, fig) and [])
    assert cli.main(["efficiency", str(csv_path), str(root), "--out", str(tmp_path / "out"), "--resamples", "50"]) == 0
    axes = figs["efficiency_paper"].axes
    titles = [ax.get_title().split("\n")[-1] for ax in axes]
    assert titles == ["Train time", "Inference latency", "Peak memory (fwd + bwd)", "Best return (learning check)"]
    assert axes[0].get_xscale() == "log" and axes[1].get_xscale() == "linear"
    # trial medians in the registry's order (FFM last), the Python-cell variant hatched beside its memory
    assert [b.get_width() for b in axes[0].patches] == pytest.approx([4.2, 6.3, 2.1])
    # beside each bar its ratio to FFM's median with that ratio's interval; one trial (memory): n=1, no interval
    labels = [t.get_text() for t in axes[0].texts]
    assert labels[2] == "FFM" and labels[0].startswith("2.00x [") and labels[1].startswith("3.00x [")
    assert [t.get_text() for t in axes[2].texts] == ["2.00x, n=1", "3.00x, n=1", "FFM"]
    error_bars = lambda ax: [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(error_bars(axes[0])) == 1 and not error_bars(axes[2])  # (never a zero-width bar for one trial)
    assert [b.get_hatch() for b in axes[0].patches] == [None, "////", None]
    assert [b.get_width() for b in axes[3].patches] == pytest.approx([-450.0, -250.0])  # (no run of GRU cells)


def test_the_return_panel_of_several_tasks_or_algorithms_is_refused_before_anything_is_written(tmp_path, capsys):
    from analysis import cli

    csv_path = tmp_path / "efficiency.csv"
    csv_path.write_text("benchmark,shape,model,metric,value,unit\nefficiency,s1,ffm,train_s,1.0,s\n")
    root = tmp_path / "runs"
    for algo in ("sac", "td3"):
        write_our_run(root, "Pendulum-V-v0", algo, "ffm", 0, steps_grid(4, 2_000, 1_000), [-900, -300, -700, -800])
    out = tmp_path / "out"
    assert cli.main(["efficiency", str(csv_path), str(root), "--out", str(out), "--resamples", "50"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        "error: the efficiency figure's return panel shows one task and algorithm; the runs given hold 2: "
        "Pendulum-V-v0 sac, Pendulum-V-v0 td3; give the folder of one (or no runs, for no return panel)"
    )
    assert not (out / "figures").exists() and not (out / "tables").exists()


def test_one_stray_trial_moves_a_ratio_to_ffm_by_less_than_a_tenth():
    # Ten trials each (S4D's case: one trial 6-8x the others); the ratio to FFM and its interval, by medians.
    from analysis.bench import summarize_efficiency

    rng = np.random.default_rng(0)
    ffm, s4d = 0.18 * (1 + 0.1 * rng.random(10)), 0.55 * (1 + 0.2 * rng.random(10))
    stray = s4d.copy()
    stray[3] = 3.93
    rows = lambda other: pd.DataFrame(
        [("efficiency", "s", m, "train_s", v, "s") for m, vs in (("ffm", ffm), ("s4d", other)) for v in vs],
        columns=["benchmark", "shape", "model", "metric", "value", "unit"],
    )
    clean, moved = (
        summarize_efficiency(rows(x), 0.95, 2000, 0, ["s4d", "ffm"]).set_index("model").loc["s4d"] for x in (s4d, stray)
    )
    assert abs(moved["to_ffm"] / clean["to_ffm"] - 1) < 0.1  # the mean's ratio moves by 55% here
    assert abs(np.mean(stray) / np.mean(s4d) - 1) > 0.1  # (the stray trial is one a mean would follow)
    for r in (clean, moved):
        assert r["to_ffm_low"] <= r["to_ffm"] <= r["to_ffm_high"] and r["ci_method"] == "percentile"
        assert r["to_ffm"] == pytest.approx(np.median(stray if r is moved else s4d) / np.median(ffm), rel=1e-12)
