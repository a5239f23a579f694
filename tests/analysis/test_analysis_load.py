import contextlib
import os
import subprocess
import sys

import pandas as pd
import pytest
from analysis_synth import SAC_HEADER, progress_text, steps_grid, write_our_run, write_reference_run
from hang import HANG_S

from analysis import columns, load, rundirs, runmeta, stats


@contextlib.contextmanager
def lock_held(run_dir):
    """Another process holds ``run_dir``'s lock (as a run continuing it does) until the block ends."""
    from pomdp_ffm.run.rundir import RunDir

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time; "
            "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); "
            f"print('held', flush=True); time.sleep({HANG_S})",
            str(run_dir / RunDir.LOCK),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.kill()
        holder.wait()


def _reasons(report, kind=None):
    return [(i.path, i.reason) for i in report.issues if kind is None or i.kind == kind]


def _only(report, fragment, kind=None):
    hits = [r for p, r in _reasons(report, kind) if fragment in p]
    assert hits, f"no {kind or ''} issue for {fragment!r} in {_reasons(report)}"
    return hits


@pytest.fixture
def tree(tmp_path):
    """Two models x 3 seeds of ours on Hopper-P plus two reference-layout GRU runs; runmax = 100*(seed+1) (+1 for
    ffm)."""
    root = tmp_path / "runs"
    for model, bonus in (("ffm", 1.0), ("gru", 0.0)):
        for seed in range(3):
            best = 100.0 * (seed + 1) + bonus
            write_our_run(
                root, "HopperBLT-P-v0", "sac", model, seed, steps_grid(4), [0.0, best, best / 2, 1.0], done=seed != 2
            )
    write_reference_run(root, "HopperBLT", "P", "sac", "gru", 0, steps_grid(3), [1.0, 50.0, 2.0], "05-09:12-34:56.78")
    write_reference_run(
        root, "HopperBLT", "P", "sac", "gru", None, steps_grid(3), [1.0, 70.0, 2.0], "05-10:12-34:56.78"
    )
    return root


def test_tidy_table_from_mixed_tree(tree):
    table, report = load.build_table([tree])
    assert report.n_runs_found == report.n_runs_loaded == 8
    runs = table.drop_duplicates("run_id")
    assert len(table) == 6 * 4 + 2 * 3  # only eval rows, train rows dropped
    assert set(runs["source"]) == {"ours", "reference"}
    assert set(runs["task"]) == {"HopperBLT-P-v0"}
    assert set(runs.loc[runs.source == "ours", "seed"]) == {0, 1, 2}
    ours = runs[runs.source == "ours"]
    assert ours.loc[ours.seed == 2, "finished"].eq(False).all() and ours.loc[ours.seed < 2, "finished"].all()
    assert runs.loc[runs.source == "reference", "finished"].isna().all()
    assert set(table["model_label"]) == {"FFM", "GRU"}
    assert list(table.columns) == columns.TABLE_COLUMNS
    # Reference run without seed: trial id is its timestamp folder, with a warning.
    ref = runs[(runs.source == "reference") & runs.seed.isna()]
    assert ref["trial"].tolist() == ["05-10:12-34:56.78"]
    assert any("no seed" in r for r in _only(report, "05-10", "warning"))
    assert not report.skipped


def test_known_answers_in_summary(tree):
    table, _ = load.build_table([tree])
    table = load.separate_sources(table)
    scores = stats.run_scores(table)
    summary = stats.summarize(scores, n_resamples=200, seed=0).set_index("model")
    assert summary.loc["ffm", "mean"] == pytest.approx(201.0)
    assert summary.loc["gru", "mean"] == pytest.approx(200.0)
    assert summary.loc["gru@ref", "mean"] == pytest.approx(60.0)
    assert summary.loc["gru@ref", "model_label"] == "GRU (ref)"
    assert summary.loc["ffm", "n_runs"] == 3


def test_damaged_files_are_reported_not_fatal(tmp_path):
    root = tmp_path / "runs"
    good = write_our_run(root, "WalkerBLT-V-v0", "td3", "gru", 0, steps_grid(3), [1.0, 2.0, 3.0])

    def make(name, text, config=True):
        run = write_our_run(
            root,
            "WalkerBLT-V-v0",
            "td3",
            "ffm",
            10 + len(os.listdir(root / "WalkerBLT-V-v0")),
            [],
            [],
            stamp=name,
            config=config,
        )
        (run / "progress.csv").write_text(text)
        return run

    full = progress_text(steps_grid(3), [5.0, 6.0, 7.0])
    make("empty", "")
    make("blank", "\n\n\n")
    make("truncated", full + "0.5,0.5,0.5,0.5,0.5,0.5,0.5,0.5,0.5,24000,1")
    make("noeval", ",".join(SAC_HEADER[:9]) + "\n" + ",".join(["0.1"] * 9) + "\n")
    make("mixed", full + ",".join(["1"] * (len(SAC_HEADER) + 2)) + "\n")
    make("rewritten", ",".join(SAC_HEADER[:9]) + "\n" + ",".join(["0.1"] * 9) + "\n" + full)
    make("garbage", full.replace("6.0", "n/a"))
    nocfg = write_our_run(root, "WalkerBLT-V-v0", "td3", "lstm", 3, steps_grid(2), [1.0, 9.0], config=False)
    orphan = tmp_path / "runs" / "somewhere" / "else"
    orphan.mkdir(parents=True)
    (orphan / "progress.csv").write_text(full)

    table, report = load.build_table([root])
    skipped = {p.split("/")[-2]: r for p, r in _reasons(report, "skipped")}
    assert "0 bytes" in skipped["empty"]
    assert "blank" in skipped["blank"]
    assert "no eval rows" in skipped["noeval"]
    assert "cannot determine" in skipped["else"]
    assert any("truncated" in r for r in _only(report, "truncated", "warning"))
    assert any("more fields" in r for r in _only(report, "mixed", "warning"))
    assert any("header rewritten" in r for r in _only(report, "rewritten", "note"))
    assert any("'n/a'" in r for r in _only(report, "garbage", "warning"))
    assert any("no config" in r for r in _only(report, nocfg.name, "warning"))

    loaded = table.groupby("run_id")["eval_return"].apply(list)
    by_stamp = {rid.split("/")[-1]: v for rid, v in loaded.items()}
    assert by_stamp["truncated"] == [5.0, 6.0, 7.0]  # the cut-off row is gone, the rest kept
    assert by_stamp["mixed"] == [5.0, 6.0, 7.0]
    assert by_stamp["rewritten"] == [5.0, 6.0, 7.0]
    assert by_stamp["garbage"] == [5.0, 7.0]
    lstm = table[table.model == "lstm"]
    assert len(lstm) == 2 and lstm["seed"].iloc[0] == 3  # metadata recovered from the path
    assert good.name in set(r.split("/")[-1] for r in table["run_id"])
    assert report.n_runs_found == 10 and report.n_runs_loaded == 6


def test_reference_header_padding(tmp_path):
    # The reference writer rewrites the header when keys appear and pads old rows with empty cells.
    run = write_reference_run(tmp_path, "AntBLT", "V", "td3", "gru", 4, [], [], "01-01:00-00:00.00")
    header = ["rl_loss/qf1_loss", "z/env_steps", "metrics/return_eval_total", "rl_loss/q_rnn_grad_norm"]
    rows = ["0.3,,,", ",12000,10.5,", "0.2,,,0.7", ",16000,11.5,"]
    (run / "progress.csv").write_text("\n".join([",".join(header), *rows]) + "\n")
    table, report = load.build_table([tmp_path])
    assert table["eval_return"].tolist() == [10.5, 11.5]
    assert table["task"].iloc[0] == "AntBLT-V-v0" and table["seed"].iloc[0] == 4
    assert not report.skipped and not report.warnings


def test_cache_hits_and_is_never_stale(tree, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    first, _ = load.load_runs([tree], cache_dir=cache)
    calls = []
    real = load.build_table
    monkeypatch.setattr(load, "build_table", lambda roots: calls.append(1) or real(roots))
    second, _ = load.load_runs([tree], cache_dir=cache)
    assert calls == []
    pd.testing.assert_frame_equal(first, second)

    target = next((tree / "HopperBLT-P-v0" / "sac_ffm" / "seed-0").rglob("progress.csv"))
    target.write_text(progress_text(steps_grid(2), [1.0, 999.0]))
    os.utime(target, ns=(target.stat().st_atime_ns, target.stat().st_mtime_ns + 10**9))
    third, _ = load.load_runs([tree], cache_dir=cache)
    assert calls == [1]
    assert 999.0 in third["eval_return"].tolist()
    assert len(list(cache.glob("runs-*.json"))) == 1 and not list(cache.glob("*.pkl"))

    (target.parent / "DONE").unlink()
    fourth, _ = load.load_runs([tree], cache_dir=cache)
    assert calls == [1, 1]
    assert not fourth.loc[fourth.run_dir == target.parent.as_posix(), "finished"].any()


def test_export_roundtrip_and_bad_format(tree, tmp_path):
    table, _ = load.build_table([tree])
    csv = pd.read_csv(load.export_table(table, tmp_path / "t.csv"))
    assert len(csv) == len(table)
    pq = pd.read_parquet(load.export_table(table, tmp_path / "t.parquet"))
    assert pq["eval_return"].tolist() == table["eval_return"].tolist()
    with pytest.raises(ValueError, match="'.xlsx'"):
        load.export_table(table, tmp_path / "t.xlsx")


def test_missing_root_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        load.build_table([tmp_path / "nope"])


def test_parse_run_path_layouts():
    ref = runmeta.parse_run_path(["logs", "pomdp", "WalkerBLT", "V", "td3_ffm", "gamma-0.99", "oar", "05-09:1"])
    assert ref == {"task": "WalkerBLT-V-v0", "layout": "reference", "algo": "td3", "model": "ffm"}
    ours = runmeta.parse_run_path(["runs", "Pendulum-V-v0", "sac_lstm", "seed-7", "2026"])
    assert ours == {"task": "Pendulum-V-v0", "algo": "sac", "model": "lstm", "seed": 7}
    mark = runmeta.parse_run_path(["logs", "pomdp", "HopperBLT", "P", "Markovian_sac", "gamma-0.99", "x"])
    # The reference's observation-only agent is not our seq_model=mlp (patches/012): a label of its own.
    assert mark["model"] == "markovian" and mark["task"] == "HopperBLT-P-v0"


def test_runs_behind_symlinks_are_found_once(tmp_path):
    store = tmp_path / "disk2"
    run = write_our_run(store, "Pendulum-V-v0", "td3", "ffm", 0, steps_grid(3), [1.0, 2.0, 3.0])
    gathered = tmp_path / "gathered"
    gathered.mkdir()
    (gathered / "td3_ffm").symlink_to(run.parent.parent, target_is_directory=True)
    (gathered / "loop").symlink_to(gathered, target_is_directory=True)  # a cycle must not hang discovery
    found = rundirs.find_run_dirs([gathered])
    assert [r for _, r in found] == [gathered / "td3_ffm" / "seed-0" / run.name]
    table, _ = load.build_table([gathered])
    assert set(table["model"]) == {"ffm"} and set(table["algo"]) == {"td3"} and set(table["seed"]) == {0}


def _reference_run(root, name, returns, stamp, seq_model="gru", seed=0, after=("gamma-0.99", "len-64", "bs-64")):
    """A reference run in the algorithm folder ``name`` (the reference's run name, e.g. oracle_sac_gru)."""
    run = root / "logs" / "pomdp" / "HopperBLT" / "P" / name
    for part in (*after, stamp):
        run = run / part
    run.mkdir(parents=True)
    (run / "progress.csv").write_text(progress_text(steps_grid(len(returns)), returns))
    (run / "variant_1.yml").write_text(
        f"seed: {seed}\nenv:\n  env_name: HopperBLT-P-v0\npolicy:\n  seq_model: {seq_model}\n  algo_name: sac\n"
    )
    return run


def test_reference_runs_of_other_agents_are_their_own_groups(tmp_path):
    # Oracle, two-layer, shared-memory and Markovian runs are other agents than sac_gru: pooling them with it
    # would count them as more GRU seeds (an oracle run's returns are several times higher).
    for i, name in enumerate(["sac_gru", "sac_gru", "oracle_sac_gru", "sac_2gru", "sac_gru_shared"]):
        _reference_run(tmp_path, name, [1.0, 500.0], f"05-09:12-00:0{i}.00", seed=i)
    _reference_run(tmp_path, "Markovian_sac", [1.0, 450.0], "05-09:12-00:09.00", seq_model="mlp", after=("gamma-0.99",))
    _reference_run(tmp_path, "oracle_sac", [1.0, 2400.0], "05-09:12-00:08.00", seq_model="mlp", after=("gamma-0.99",))
    table, report = load.build_table([tmp_path])
    runs = table.drop_duplicates("run_id")
    assert sorted(runs["model"].value_counts().items()) == [
        ("gru", 2),
        ("gru+2layer", 1),
        ("gru+oracle", 1),
        ("gru+shared", 1),
        ("markovian", 1),
        ("oracle", 1),
    ]
    labels = set(load.separate_sources(table)["model_label"])
    assert labels == {
        "GRU (ref)",
        "GRU (ref, oracle)",
        "GRU (ref, 2 layers)",
        "GRU (ref, shared memory)",
        "Markovian (ref)",
        "Oracle (ref)",
    }
    assert not report.warnings, _reasons(report)


def test_the_references_gru_mlp_runs_are_its_gru_without_a_word(tmp_path):
    # The reference's configs name the memory "gru-mlp" (a GRU and an MLP head) where its run folder says sac_gru.
    _reference_run(tmp_path, "sac_gru", [1.0, 2.0], "05-09:12-00:00.00", seq_model="gru-mlp")
    table, report = load.build_table([tmp_path])
    assert table["model"].unique().tolist() == ["gru"] and not report.warnings, _reasons(report)


def test_a_failed_and_a_diverged_run_are_named_with_their_status(tmp_path):
    runs = {}
    for seed, status in enumerate(["done", "failed", "diverged", "unfinished"]):
        runs[status] = write_our_run(
            tmp_path, "HopperBLT-P-v0", "sac", "ffm", seed, steps_grid(3), [1.0, 2.0, 3.0], done=status == "done"
        )
    (runs["failed"] / "ERROR.txt").write_text("Traceback ...\nRuntimeError: CUDA out of memory\n")
    (runs["diverged"] / "ERROR.txt").write_text("Traceback ...\nTrainingDiverged: non-finite critic loss\n")
    (runs["diverged"] / "checkpoints").mkdir()
    (runs["diverged"] / "checkpoints" / "diverged.pt").write_bytes(b"")
    table, report = load.build_table([tmp_path])
    status = table.drop_duplicates("run_id").set_index("seed")["status"].to_dict()
    assert status == {0: "done", 1: "failed", 2: "diverged", 3: "unfinished"}
    # A failed run being continued by a process that holds its lock is running, whatever its last attempt left.
    with lock_held(runs["failed"]):
        table, _ = load.build_table([tmp_path])
        assert table.drop_duplicates("run_id").set_index("seed")["status"][1] == "running"
    assert any("failed (RuntimeError: CUDA out of memory)" in r for r in _only(report, "seed-1", "warning"))
    assert any("diverged (TrainingDiverged: non-finite critic loss)" in r for r in _only(report, "seed-2", "warning"))
    assert not [r for p, r in _reasons(report, "warning") if "seed-3" in p or "seed-0" in p]


def test_runs_pooled_in_one_group_that_differ_in_a_setting_are_warned_about(tmp_path):
    def ours(seed, lr, device="cpu", snapshots=-1):
        run = write_our_run(tmp_path, "HopperBLT-P-v0", "sac", "ffm", seed, steps_grid(3), [1.0, 2.0, 3.0])
        (run / "config.yaml").write_text(
            f"seed: {seed}\ndevice: {device}\nenv:\n  env_name: HopperBLT-P-v0\n"
            f"policy:\n  algo_name: sac\n  seq_model: ffm\n  lr: {lr}\neval:\n  save_interval: {snapshots}\n"
        )

    ours(0, 0.0003), ours(1, 0.0003, device="cuda", snapshots=1), ours(2, 0.001)
    _, report = load.build_table([tmp_path])
    hits = _only(report, "HopperBLT-P-v0/sac_ffm (ours)", "warning")
    assert len(hits) == 1 and "policy.lr: 0.0003 (2 runs), 0.001 (1 run)" in hits[0], hits
    assert "device:" not in hits[0] and "seed:" not in hits[0] and "save_interval" not in hits[0]

    # The seeds of one experiment (the seed and where it ran apart) are one group without a word.
    (tmp_path / "HopperBLT-P-v0" / "sac_ffm" / "seed-2").rename(tmp_path / "elsewhere")
    _, report = load.build_table([tmp_path / "HopperBLT-P-v0"])
    assert not report.warnings, _reasons(report)

    # The reference's run name holds its settings: the fork's long-sequence configs are another experiment.
    ref = tmp_path / "ref"
    _reference_run(ref, "sac_ffm", [1.0, 2.0], "05-09:12-00:00.00", seq_model="ffm")
    _reference_run(
        ref,
        "sac_ffm",
        [1.0, 2.0],
        "05-09:12-00:01.00",
        seq_model="ffm",
        seed=1,
        after=("gamma-0.99", "len-1024", "bs-4"),
    )
    _, report = load.build_table([ref])
    hits = _only(report, "(reference)", "warning")
    assert "gamma-0.99/len-1024/bs-4" in hits[0] and "gamma-0.99/len-64/bs-64" in hits[0]


def test_the_cache_answers_alike_from_another_working_directory(tmp_path, monkeypatch):
    root = tmp_path / "a" / "runs"
    write_our_run(root, "HopperBLT-P-v0", "sac", "ffm", 0, steps_grid(3), [1.0, 2.0, 3.0])
    (tmp_path / "b").mkdir()
    cache = tmp_path / "cache"
    monkeypatch.chdir(tmp_path / "a")
    first, rep1 = load.load_runs(["runs"], cache_dir=cache)
    monkeypatch.chdir(tmp_path / "b")
    second, rep2 = load.load_runs(["../a/runs"], cache_dir=cache)
    assert first["run_dir"].tolist() == second["run_dir"].tolist()
    assert all(os.path.isabs(d) and os.path.isdir(d) for d in second["run_dir"])
    assert [i.path for i in rep2.issues] == [i.path for i in load.build_table(["../a/runs"])[1].issues]


def test_a_cached_status_follows_the_runs_lock(tmp_path):
    # "running" depends on whether a process holds the run's lock, not on any file's contents: the cache must not
    # go on answering "running" once the holder is gone.
    run = write_our_run(
        tmp_path / "runs", "HopperBLT-P-v0", "sac", "ffm", 0, steps_grid(3), [1.0, 2.0, 3.0], done=False
    )
    with lock_held(run):
        table, _ = load.load_runs([tmp_path / "runs"], cache_dir=tmp_path / "cache")
        assert table["status"].unique().tolist() == ["running"]
    table, _ = load.load_runs([tmp_path / "runs"], cache_dir=tmp_path / "cache")
    assert table["status"].unique().tolist() == ["unfinished"]


def test_a_progress_file_that_is_no_log_is_skipped_without_reading_it_whole(tmp_path, monkeypatch):
    import os

    from analysis import progress

    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)
    device = tmp_path / "device.csv"
    device.symlink_to("/dev/urandom")
    big = tmp_path / "big.csv"
    big.write_bytes(b"z/env_steps,metrics/return_eval_total\n" + b"1,2\n" * 64)
    monkeypatch.setattr(progress, "MAX_PROGRESS_BYTES", 100)
    for path, why in ((fifo, "not a regular file"), (device, "not a regular file"), (big, "larger than")):
        table, problems = progress.read_progress(path)
        assert table is None and problems[0][0] == "skipped" and why in problems[0][1], path
