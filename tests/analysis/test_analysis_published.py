"""POMDP-Baselines' published final.csv files beside our runs: groups, selection, scores on the published grid,
what differs, and damaged or crafted files."""

import os
import re

import pandas as pd
import pytest
from analysis_synth import (
    published_method,
    published_variant,
    steps_grid,
    write_our_run,
    write_published,
    write_reference_run,
)

from analysis import cli, published
from analysis import constants as C

PUB = "results/data/pomdp"


def _variants(best_sac_lstm):
    """One task's final.csv groups: the tuned config for SAC (3 trials) and TD3 (2 trials of unequal length),
    TD3 with inputs oa, SAC with an LSTM, and a compared method."""
    return [
        published_variant("sac", **{f"05-0{k}:10": [100, 700.126 + 10 * k, 300] for k in range(3)}),
        published_variant("td3", **{"05-00:20": [100, 800, 200], "05-01:20": [100, 900]}),
        published_variant("td3", inputs="oa", **{f"05-0{k}:30": [100, 1200, 1100] for k in range(3)}),
        published_variant(
            "sac", encoder="lstm", **{f"05-0{k}:40": [100, best_sac_lstm, best_sac_lstm] for k in range(2)}
        ),
        published_method("ppo_gru", ["ppo", "gru", "128", "o", "shared"], **{"06-00:50": [0, 50, 100, 150]}),
    ]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """Ours: FFM (SAC, TD3) x 3 seeds on Hopper-P, Walker-V and Ant-P. Published: Hopper-P, Walker-V (where the
    SAC LSTM ranks best) and HalfCheetah-V. So Ant-P lacks a published side and HalfCheetah-V ours."""
    base = tmp_path_factory.mktemp("published")
    best = {"HopperBLT-P-v0": [1000, 1100, 1200], "WalkerBLT-V-v0": [705, 715, 1000], "AntBLT-P-v0": [900, 900, 900]}
    for task, values in best.items():
        for algo in ("sac", "td3"):
            for seed, b in enumerate(values):
                write_our_run(base / "runs", task, algo, "ffm", seed, steps_grid(3), [10.0, b, 10.0])
    for family, obs, lstm in (("HopperBLT", "P", 400), ("WalkerBLT", "V", 900), ("HalfCheetahBLT", "V", 400)):
        write_published(base / PUB, family, obs, *_variants(lstm))
    (base / PUB / "rank_return-max_x1500000.csv").write_text("instance,rank\ntd3-gru-64-oa-separate,1.0\n")
    return base


def _run(tree, tmp_path, *options, command="all"):
    out = tmp_path / "out"
    code = cli.main(
        [
            command,
            str(tree / "runs"),
            "--published",
            str(tree / PUB),
            "--out",
            str(out),
            "--resamples",
            "200",
            "--formats",
            "png",
            "--no-cache",
            *options,
        ]
    )
    return code, out


def _read(out, name):
    return pd.read_csv(out / "tables" / f"{name}.csv", keep_default_na=False)


def test_published_variants_are_groups_with_the_references_names(tree):
    table, problems, found, read = published.read_published([tree / PUB])
    assert (found, read, problems) == (3, 3, [])
    runs = table.drop_duplicates("run_id")
    hop = runs[runs.task == "HopperBLT-P-v0"]
    assert sorted(hop["instance"].unique()) == [
        "ppo_gru",
        "sac-gru-64-oar-separate",
        "sac-lstm-64-oar-separate",
        "td3-gru-64-oa-separate",
        "td3-gru-64-oar-separate",
    ]
    labels = {C.group_label(r.algo, r.model) for r in hop.itertuples()}
    assert labels == {
        "SAC GRU len-64 oar (published)",
        "TD3 GRU len-64 oar (published)",
        "ppo_gru (published)",
        "TD3 GRU len-64 oa (published)",
        "SAC LSTM len-64 oar (published)",
    }
    assert set(runs["source"]) == {"published"} and runs["seed"].isna().all()
    assert hop.groupby("instance")["trial"].nunique().to_dict()["td3-gru-64-oar-separate"] == 2
    assert list(table.columns) == [*published.TABLE_COLUMNS, "instance"]


TASKS = ("HalfCheetahBLT-V-v0", "HopperBLT-P-v0", "WalkerBLT-V-v0")


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("config", {(t, a, "gru-64-oar-separate") for t in TASKS for a in ("sac", "td3")}),
        # The reference's rundown rule (mean of the last 20% of the smoothed curve): TD3's oa variant everywhere (800
        # against 433), SAC's LSTM on Walker only (633 against 370).
        (
            "best",
            {(t, "td3", "gru-64-oa-separate") for t in TASKS}
            | {
                ("HalfCheetahBLT-V-v0", "sac", "gru-64-oar-separate"),
                ("HopperBLT-P-v0", "sac", "gru-64-oar-separate"),
                ("WalkerBLT-V-v0", "sac", "lstm-64-oar-separate"),
            },
        ),
        (
            "ppo_gru,td3-gru-64-oa-separate",
            {(t, a, m) for t in TASKS for a, m in (("ppo", "ppo_gru"), ("td3", "gru-64-oa-separate"))},
        ),
    ],
)
def test_the_selection(tree, spec, expected):
    table, _, _, _ = published.read_published([tree / PUB])
    chosen, why = published.select(table, spec)
    got = {(r.task, r.algo, r.model.removesuffix("@pub")) for r in chosen.drop_duplicates("run_id").itertuples()}
    assert got == expected
    assert set(zip(why["task"], why["algo"], why["model"].str.removesuffix("@pub"))) == expected
    assert "instance" not in chosen.columns and list(chosen.columns) == published.TABLE_COLUMNS


def test_scores_means_and_aggregates_beside_our_runs(tree, tmp_path, capsys):
    code, out = _run(tree, tmp_path)
    assert code == 0
    summary = _read(out, "summary_runmax").set_index(["task", "algo", "model"])
    pub = summary.xs("gru-64-oar-separate@pub", level="model")
    # Best so far of the published grid values: 700.13, 710.13, 720.13 (rounded as the reference wrote them).
    assert pub.loc[("HopperBLT-P-v0", "sac"), ["mean", "n_runs"]].tolist() == [pytest.approx(710.13), 3]
    # TD3's two trials of unequal length: 800 and 900.
    assert pub.loc[("HopperBLT-P-v0", "td3"), ["mean", "n_runs", "env_steps_min", "env_steps_max"]].tolist() == [
        pytest.approx(850.0),
        2,
        16000,
        20000,
    ]
    assert pub.loc[("HalfCheetahBLT-V-v0", "sac"), "mean"] == pytest.approx(710.13)
    assert not summary.index.get_level_values("model").str.contains("lstm|oa-|ppo").any()  # not selected
    assert summary.loc[("HopperBLT-P-v0", "sac", "ffm"), "mean"] == pytest.approx(1100.0)
    # The aggregate is over the tasks both sides have: not Ant-P (ours only), not HalfCheetah-V (published only).
    agg = _read(out, "aggregate_runmax")
    assert set(agg["tasks"]) == {"HopperBLT-P-v0 WalkerBLT-V-v0"}
    assert set(agg["model"]) == {"ffm", "gru-64-oar-separate@pub"}
    # FFM against the published GRU: Hopper 1; Walker 705, 715, 1000 against 700.13, 710.13, 720.13: 6/9.
    poi = _read(out, "probability_of_improvement").set_index("algo")
    assert poi.loc["sac", "value"] == pytest.approx((1 + 6 / 9) / 2)
    assert poi.loc["sac", "comparison"] == "P(FFM + SAC > SAC GRU len-64 oar (published))"
    lines = _read(out, "lines_runmax")
    assert "gru-64-oar-separate@pub" in set(lines["model"]) and (out / "figures" / "bars_runmax.png").is_file()
    runs = _read(out, "runs")
    assert set(runs["source"]) == {"ours", "published"} and set(runs.loc[runs.source == "published", "status"]) == {
        "published"
    }
    stdout = capsys.readouterr().out
    assert "4 published file(s) found" not in stdout and "3 published file(s) found, 3 read" in stdout


def test_the_report_says_once_what_differs_and_what_is_missing(tree, tmp_path):
    code, out = _run(tree, tmp_path, command="bars")
    assert code == 0
    report = (out / "report.md").read_text()
    section = report.split("## Published results beside the runs")[1].split("\n## ")[0]
    for fact in (
        "gym 0.21",
        "pybullet 3.1.0",
        "Gymnasium",
        "pybullet 3.2.7",
        "first contact",
        "rounded to 2 decimals",
        "interpolated",
        "12000 env steps every 4000",
    ):
        assert report.count(fact) == 1 and fact in section, fact
    assert "--published-select config` (the default" in section and "![" in section
    missing = section.split("Missing from one side: ")[1]
    assert "no published group for the runs on AntBLT-P-v0 (SAC), AntBLT-P-v0 (TD3)" in missing
    assert "published only, no runs on HalfCheetahBLT-V-v0 (SAC), HalfCheetahBLT-V-v0 (TD3)" in missing
    assert (
        "HopperBLT-P-v0 (TD3) has unequal numbers of runs: FFM + TD3 3 (seed-0, seed-1, seed-2); "
        "TD3 GRU len-64 oar (published) 2 (05-00:20, 05-01:20)"
    ) in missing
    assert "HopperBLT-P-v0 (SAC) has unequal" not in missing
    # Our evaluations lie on the published grid here, so the grid lowers nothing.
    assert "lowers the best so far by 0.00 on average" in section


def test_published_results_alone_and_a_bad_selection(tree, tmp_path, capsys):
    out = tmp_path / "alone"
    assert (
        cli.main(
            [
                "table",
                "--published",
                str(tree / PUB),
                "--out",
                str(out),
                "--resamples",
                "50",
                "--published-select",
                "all",
            ]
        )
        == 0
    )
    assert set(_read(out, "summary_runmax")["model"]) == {
        "gru-64-oar-separate@pub",
        "gru-64-oa-separate@pub",
        "lstm-64-oar-separate@pub",
        "ppo_gru@pub",
    }
    capsys.readouterr()
    code = cli.main(
        [
            "table",
            "--published",
            str(tree / PUB),
            "--out",
            str(tmp_path / "no"),
            "--published-select",
            "config,td3-gru-128-oa",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and not (tmp_path / "no").exists()
    assert (
        err.startswith(
            "error: --published-select: no published variant or method 'td3-gru-128-oa'; choose "
            "from config, best, all or one of ppo_gru, sac-gru-64-oar-separate"
        )
        and err.count("\n") == 1
    )
    (tmp_path / "empty").mkdir()
    assert cli.main(["table", "--published", str(tmp_path / "empty"), "--out", str(tmp_path / "no")]) == 2
    assert "no final.csv below --published" in capsys.readouterr().err and not (tmp_path / "no").exists()
    # Files that are all damaged leave nothing to select from: a report that says so, not a traceback.
    (tmp_path / "damaged" / "HopperBLT" / "P").mkdir(parents=True)
    (tmp_path / "damaged" / "HopperBLT" / "P" / "final.csv").write_text("a,b\n1,2\n")
    assert (
        cli.main(
            [
                "table",
                "--published",
                str(tmp_path / "damaged"),
                "--out",
                str(tmp_path / "d"),
                "--published-select",
                "best,all",
            ]
        )
        == 0
    )
    assert "1 published file(s) found, 0 read; 1 skipped" in capsys.readouterr().out


def test_damaged_unexpected_and_crafted_files_are_named_skipped_and_counted(tmp_path, capsys):
    root = tmp_path / "pomdp"
    good = write_published(root, "HopperBLT", "P", published_variant("sac", **{"05-00:1": [1, 2, 3]}))
    header = ",".join(["env_steps", "return", "trial", "method", "RL", "Encoder", "Len", "Inputs", "Arch"])
    tag = "sac,gru,64,oar,separate"
    files = {
        "WalkerBLT/V": "\n\n",
        "AntBLT/V": "a,b\n1,2\n",
        "HopperBLT/V": "\n".join(
            [
                header,
                f"12000,5,05-00:1,ours,{tag}",
                f"16000,abc,05-00:1,ours,{tag}",
                f"20000,9,=HYPERLINK(\"http://x\"),ours,{tag}",
                f"24000,9,05-00:1,__import__('os').system('touch {tmp_path}/pwned'),{tag}",
                f"28000,7,05-00:1,ours,{tag},extra",
                f"32000,inf,05-00:1,ours,{tag}",
            ]
        )
        + "\n",
        "meta/Wind-v0": f"{header}\n12000,5,05-00:1,ours,{tag}\n",
        "HalfCheetahBLT/P": b"PK\x03\x04\x00\xff\xfe binary",
    }
    for rel, text in files.items():
        path = root / rel / "final.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
    # A final.csv that is a pipe: opening it to read would wait for a writer forever.
    (root / "AntBLT" / "P").mkdir(parents=True)
    os.mkfifo(tmp_path / "pipe")
    (root / "AntBLT" / "P" / "final.csv").symlink_to(tmp_path / "pipe")
    again = tmp_path / "copy"
    write_published(again, "HopperBLT", "P", published_variant("td3", **{"05-00:9": [7, 8]}))

    table, problems, found, read = published.read_published([root, again])
    by_file = {}
    for path, kind, reason in problems:
        by_file.setdefault(os.path.relpath(path, tmp_path), []).append((kind, reason))
    assert (found, read) == (8, 2)
    assert by_file["pomdp/WalkerBLT/V/final.csv"] == [("skipped", "empty file")]
    assert (
        by_file["pomdp/AntBLT/V/final.csv"][0][0] == "skipped"
        and "missing column(s)" in by_file["pomdp/AntBLT/V/final.csv"][0][1]
    )
    assert by_file["pomdp/AntBLT/P/final.csv"] == [("skipped", "not a regular file")]
    assert by_file["pomdp/meta/Wind-v0/final.csv"] == [
        ("skipped", "not at <Env>/<P|V>/final.csv, so its task is unknown")
    ]
    assert [k for k, _ in by_file["pomdp/HalfCheetahBLT/P/final.csv"]] == ["warning", "skipped"]
    assert by_file["copy/HopperBLT/P/final.csv"] == [("skipped", f"HopperBLT-P-v0 was read already, from {good}")]
    crafted = " | ".join(r for _, r in by_file["pomdp/HopperBLT/V/final.csv"])
    assert "1 row(s) with another number of fields" in crafted and "2 row(s) whose trial/method" in crafted
    assert "2 row(s) whose env_steps or return is not a finite number" in crafted
    kept = table[table.task == "HopperBLT-V-v0"]
    assert kept[["trial", "env_steps", "eval_return"]].values.tolist() == [["05-00:1", 12000.0, 5.0]]
    assert not (tmp_path / "pwned").exists()
    # The size bound: a file over it is skipped before it is read.
    _, problems, _, read = published.read_published([good], max_bytes=64)
    assert read == 0 and problems[0][2].startswith(f"{good.stat().st_size} bytes, over the limit of 64")

    # On the command line: each named, and counted in the one summary line.
    runs = tmp_path / "runs"
    write_reference_run(runs, "HopperBLT", "P", "sac", "ffm", 0, steps_grid(3), [1.0, 5.0, 2.0], "05-09:1")
    assert (
        cli.main(
            [
                "table",
                str(runs),
                "--published",
                str(root),
                "--out",
                str(tmp_path / "out"),
                "--resamples",
                "50",
                "--published-select",
                "all",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert "1 run dir(s) found, 1 loaded, 7 published file(s) found, 2 read; 5 skipped" in captured.out
    issues = pd.read_csv(tmp_path / "out" / "issues.csv")
    assert sorted(issues.loc[issues.kind == "skipped", "path"]) == sorted(
        str(root / rel / "final.csv")
        for rel in ("WalkerBLT/V", "AntBLT/V", "AntBLT/P", "meta/Wind-v0", "HalfCheetahBLT/P")
    )
    # The console: each kind once (the two files without the columns are one), with how many more.
    shown = [ln for ln in captured.err.splitlines() if ln.startswith("skipped: ")]
    assert len(shown) + sum(int(n) for ln in shown for n in re.findall(r"\(and (\d+) more like it", ln)) == 5
