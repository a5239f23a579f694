"""A report is written whole or not at all: it is built beside the previous one and swapped in at the end, so that
bad input or a failure half-way leaves the previous report as it was (and a folder the command made, nothing)."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from analysis_synth import steps_grid, write_our_run
from hang import HANG_S
from marks import parametrize_first_fast

from analysis import cli


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "runs"
    for model in ("ffm", "gru"):
        for seed in range(2):
            write_our_run(root, "HopperBLT-V-v0", "sac", model, seed, steps_grid(8), np.linspace(100, 900, 8) + seed)
    return root


def snapshot(out):
    return {
        p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and ".cache" not in p.parts
    }


def test_max_steps_below_every_first_evaluation_is_one_line_and_writes_nothing(tree, tmp_path, capsys):
    out = tmp_path / "report"
    assert cli.main([str(tree), "--out", str(out), "--max-steps", "1000", "--resamples", "50"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        "error: --max-steps 1000 is below every run's first evaluation (the earliest is at 12000 env "
        "steps): nothing would be left to analyse"
    )
    assert not out.exists()


@pytest.mark.slow
def test_a_failure_half_way_leaves_the_previous_report(tree, tmp_path, monkeypatch):
    out = tmp_path / "report"
    assert cli.main([str(tree), "--out", str(out), "--resamples", "50"]) == 0
    before = snapshot(out)
    assert (out / "report.md").exists() and any(p.parts[0] == "figures" for p in before)

    def broken(ctx):
        raise RuntimeError("a figure failed")

    monkeypatch.setitem(cli._RUNNERS, "lines", broken)
    with pytest.raises(RuntimeError, match="a figure failed"):
        cli.main([str(tree), "--out", str(out), "--resamples", "50"])
    assert snapshot(out) == before
    assert sorted(p.name for p in out.iterdir()) == sorted({".cache", *(p.parts[0] for p in before)})


@parametrize_first_fast("where", ["a read-only --out", "a full disk half-way"])
def test_an_output_that_cannot_be_written_is_one_line_and_leaves_the_previous_report(
    tree, tmp_path, monkeypatch, capsys, where
):
    import errno

    from pomdp_ffm.run.exits import EXIT_UNWRITABLE

    out = tmp_path / "report"
    assert cli.main([str(tree), "--out", str(out), "--resamples", "50"]) == 0
    before = snapshot(out)
    capsys.readouterr()
    if where == "a read-only --out":  # (as root, chmod stops no write: the kernel's error, injected)

        def mkdtemp(prefix, dir):
            raise PermissionError(errno.EACCES, "Permission denied", f"{dir}/{prefix}x")

        monkeypatch.setattr(cli.tempfile, "mkdtemp", mkdtemp)
        said = f"error: the report cannot be written ({out}/.new-report-x): Permission denied; "
    else:

        def full(ctx):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setitem(cli._RUNNERS, "lines", full)
        said = "error: the report cannot be written: No space left on device; "
    assert cli.main([str(tree), "--out", str(out), "--resamples", "50"]) == EXIT_UNWRITABLE
    assert capsys.readouterr().err.splitlines() == [
        said + "the previous report in --out is unchanged: free some space or make --out writable, then rerun"
    ]
    assert snapshot(out) == before
    assert sorted(p.name for p in out.iterdir()) == sorted({".cache", *(p.parts[0] for p in before)})


def test_the_command_reads_runs_without_importing_torch(tmp_path):
    # Each run's config is merged with the schema's defaults, every algorithm's and memory's option section
    # included (pomdp_ffm.options), to tell its settings apart: the whole command runs without torch.
    root = tmp_path / "runs"
    for model in ("ffm", "s4d"):
        write_our_run(root, "Pendulum-V-v0", "sac", model, 0, steps_grid(8, 2_000, 1_000), np.linspace(-900, -200, 8))
    code = (
        "import runpy, sys\n"
        "sys.argv = ['analysis', *sys.argv[1:]]\n"
        "try:\n"
        "    runpy.run_module('analysis', run_name='__main__', alter_sys=True)\n"
        "finally:\n"
        "    print('torch imported:', 'torch' in sys.modules)\n"
    )
    args = ["table", str(root), "--out", str(tmp_path / "report"), "--resamples", "50"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "MPLBACKEND": "Agg"}
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=HANG_S, cwd=tmp_path, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "torch imported: False"
    assert (tmp_path / "report").is_dir()
