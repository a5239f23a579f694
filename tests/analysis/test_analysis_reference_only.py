"""A tree of the reference's runs alone: the aggregate is over the tasks its model groups share, whatever agent
variants the tree also holds; FFM is compared with the RNN; a group's numbers do not depend on the other groups;
the console shows every kind of warning."""

import re
import zlib

import numpy as np
import pandas as pd
import pytest
from analysis_synth import steps_grid, write_reference_run
from marks import parametrize_first_fast

from analysis import aggregate, cli, stats
from analysis import constants as C
from analysis.options import BASELINES

# Normalised best returns (0 = Random, 1 = Oracle) per agent folder, task and seed.
PLAIN = {
    "sac_ffm": {"HopperBLT-V-v0": [0.5, 0.7], "WalkerBLT-V-v0": [0.6, 0.8]},
    "sac_gru": {"HopperBLT-V-v0": [0.3, 0.5], "WalkerBLT-V-v0": [0.2, 0.4]},
}
# Other agents: an oracle GRU on one shared task and, far above the Oracle, on a task no model group has; a
# two-layer FFM; the Markovian agent.
VARIANTS = {
    "oracle_sac_gru": {"HopperBLT-V-v0": [0.9, 0.9], "HopperBLT-P-v0": [2.0, 2.0]},
    "sac_2ffm": {"HopperBLT-V-v0": [0.1, 0.1], "WalkerBLT-V-v0": [0.1, 0.1]},
    "Markovian_sac": {"WalkerBLT-V-v0": [0.15, 0.15]},
}


def _write(root, agents):
    for agent, per_task in agents.items():
        model = agent.split("_")[-1].lstrip("2") if agent != "Markovian_sac" else "mlp"
        for task, fractions in per_task.items():
            family, obs = C.parse_task(task)
            ref = C.reference_for(task)
            for seed, f in enumerate(fractions):
                best = ref.random + f * (ref.oracle - ref.random)
                write_reference_run(
                    root,
                    family,
                    obs,
                    "sac",
                    model,
                    seed,
                    steps_grid(3),
                    [ref.random, best, ref.random],
                    f"05-0{seed}:{agent}",
                    agent=agent,
                )
    return root


def _analyse(tmp_path, name, agents, *options):
    out = tmp_path / f"out_{name}"
    runs = _write(tmp_path / name, agents)
    assert (
        cli.main(
            ["all", str(runs), "--out", str(out), "--resamples", "200", "--formats", "png", "--no-cache", *options]
        )
        == 0
    )
    return {
        t: pd.read_csv(out / "tables" / f"{t}.csv", keep_default_na=False)
        for t in ("aggregate_runmax", "summary_runmax", "probability_of_improvement", "profile_runmax", "lines_runmax")
    }


def _rows(frame, models, column="model"):
    return frame[frame[column].isin(models)].reset_index(drop=True)


@pytest.mark.slow
@parametrize_first_fast("pool", [False, True])
def test_agent_variants_change_nothing_for_the_model_groups(tmp_path, pool):
    options = ["--pool-sources"] if pool else []
    ffm, gru = ("ffm", "gru") if pool else ("ffm@ref", "gru@ref")
    alone = _analyse(tmp_path, "alone", PLAIN, *options)
    beside = _analyse(tmp_path, "beside", {**PLAIN, **VARIANTS}, *options)

    agg = alone["aggregate_runmax"].set_index(["model", "metric"])["value"]
    assert agg[(ffm, "IQM")] == pytest.approx(0.65) and agg[(ffm, "Mean")] == pytest.approx(0.65)
    assert agg[(ffm, "Optimality gap")] == pytest.approx(0.35)
    assert agg[(gru, "IQM")] == pytest.approx(0.35) and agg[(gru, "Optimality gap")] == pytest.approx(0.65)
    assert set(alone["aggregate_runmax"]["n_tasks"]) == {2}
    # The oracle agent, two-layer FFM and Markovian agent neither narrow the task set nor move a number.
    for table in ("aggregate_runmax", "summary_runmax", "profile_runmax", "lines_runmax"):
        pd.testing.assert_frame_equal(_rows(alone[table], [ffm, gru]), _rows(beside[table], [ffm, gru]))
    oracle = (
        beside["aggregate_runmax"]
        .set_index(["model", "metric"])
        .loc[("gru+oracle" if pool else "gru+oracle@ref", "Mean")]
    )
    assert oracle["n_tasks"] == 1 and oracle["value"] == pytest.approx(0.9)
    # The oracle's 2.0 on a task outside the aggregate does not stretch the profile's thresholds.
    assert beside["profile_runmax"]["tau"].max() == 1.0
    # FFM is compared with the RNN of the same source: Hopper 0.875 (a tie at 0.5), Walker 1.
    for res in (alone, beside):
        poi = res["probability_of_improvement"]
        assert poi[["model_x", "model_y"]].values.tolist() == [[ffm, gru]]
        assert poi["value"].iloc[0] == pytest.approx((0.875 + 1.0) / 2)
    pd.testing.assert_frame_equal(alone["probability_of_improvement"], beside["probability_of_improvement"])


def test_ffm_is_compared_with_each_rnn_within_and_across_sources():
    models = [
        "ffm",
        "gru",
        "lstm",
        "mlp",
        "ffm@ref",
        "gru@ref",
        "gru+oracle@ref",
        "markovian@ref",
        "gru-64-oar-separate@pub",
        "ppo_gru@pub",
    ]
    rnn = ["gru", "gru-64-oar-separate@pub", "gru@ref", "lstm"]
    assert aggregate.improvement_pairs(models) == [(x, y) for x in ("ffm", "ffm@ref") for y in rnn]
    assert aggregate.improvement_pairs(models, ("gru",)) == [(x, y) for x in ("ffm", "ffm@ref") for y in rnn[:3]]
    assert aggregate.improvement_pairs(["ffm", "gru+oracle@ref", "markovian"]) == []


def test_a_groups_bootstrap_is_seeded_from_its_name():
    assert stats.group_seed(3, "sac", "ffm@ref") == [3, zlib.crc32(b"sac/ffm@ref")] == [3, 1351204387]
    rng = np.random.default_rng(0)
    per_task = {"A-P-v0": rng.uniform(0, 1, 5), "B-P-v0": rng.uniform(0, 1, 4)}
    rows = [
        {"task": t, "algo": "sac", "model": m, "score": v + shift, "norm_score": v + shift}
        for m, shift in (("ffm", 0.1), ("gru", 0.0))
        for t, vals in per_task.items()
        for v in vals
    ]
    base = pd.DataFrame(rows)
    # A group that sorts before both (as a position-seeded stream would shift every group after it).
    more = pd.concat([base, base[base.model == "gru"].assign(model="aaa", score=0.0, norm_score=0.0)])
    for fn in (
        lambda d: stats.summarize(d, n_resamples=300, seed=1),
        lambda d: aggregate.aggregate_scores(d, n_resamples=300, seed=1)[0],
        lambda d: aggregate.performance_profile(d, np.linspace(0, 1, 5), n_resamples=300, seed=1),
        lambda d: aggregate.compare_models(d, ("gru",), n_resamples=300, seed=1),
    ):
        a, b = fn(base), fn(more)
        column = "model_x" if "model_x" in a.columns else "model"
        pd.testing.assert_frame_equal(_rows(a, ["ffm", "gru"], column), _rows(b, ["ffm", "gru"], column))


def test_the_console_shows_every_kind_of_warning_once_with_its_count(tmp_path, capsys):
    # The FFM fork's copied logs: no variant file, so every run lacks a config and a seed, and an FFM run a
    # checkpoint; 40 such runs once hid, after the first 50 warnings, the one that says the runs end apart.
    root = tmp_path / "fork"
    for seed in range(20):
        for model, n in (("ffm", 6), ("gru", 6 if seed else 3)):
            write_reference_run(
                root,
                "HopperBLT",
                "V",
                "sac",
                model,
                None,
                steps_grid(n),
                np.arange(n) * 10.0,
                f"05-09:{seed:02d}",
                config=False,
            )
    assert cli.main(["decay", str(root), "--out", str(tmp_path / "out"), "--formats", "png"]) == 0
    err = capsys.readouterr().err.splitlines()
    kinds = {re.sub(r"^warning: \S+: ", "", ln.split(" (and ")[0]): ln for ln in err if ln.startswith("warning: ")}
    assert len(err) == len(kinds) == 4, err
    counts = {
        reason.split(";")[0].split(" (")[0]: int((re.findall(r"\(and (\d+) more like it", ln) or [0])[0]) + 1
        for reason, ln in kinds.items()
    }
    assert counts == {
        "no config file": 40,
        "no seed": 40,
        "FFM run has no checkpoint": 20,
        "runs end at different env steps": 1,
    }, counts
    issues = pd.read_csv(tmp_path / "out" / "issues.csv")
    assert (issues["kind"] == "warning").sum() == 101  # report.md and issues.csv keep every one


@pytest.mark.parametrize(
    "option, message",
    [
        (
            ["--compare", "gru,hyena"],
            f"error: --compare: unknown baseline 'hyena'; choose from {', '.join(BASELINES)}, comma separated\n",
        ),
        (["--seed", "-1"], "error: --seed must be >= 0, got -1\n"),
    ],
)
def test_a_bad_baseline_or_seed_is_a_one_line_error(tmp_path, capsys, option, message):
    runs = _write(tmp_path / "runs", PLAIN)
    assert cli.main(["aggregate", str(runs), "--out", str(tmp_path / "out"), *option]) == 2
    assert capsys.readouterr().err == message and not (tmp_path / "out").exists()
