"""progress.csv's header is pomdp_ffm/metrics.py's, and a resumed run's rows keep their columns: rows stored under
an older header are mapped onto the new one by column name, never shifted by position."""

import csv

import pytest

from pomdp_ffm.algos import SAC, TD3
from pomdp_ffm.logger import MetricsWriter
from pomdp_ffm.metrics import ENV_STEPS, EVAL_RETURN, GRAD_NORMS, STOCHASTIC, TIMING, UPDATE, burst_row, columns


def read(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return [dict(zip(rows[0], r)) for r in rows[1:]], rows[0]


def test_the_header_is_the_algorithms_metrics_then_the_evaluation_then_the_clock():
    cols = columns(SAC.metrics, eval_stochastic=False)
    assert cols[:5] == [f"rl_loss/{m}" for m in SAC.metrics] and cols[-2:] == TIMING
    assert [UPDATE[g].column for g in GRAD_NORMS] == cols[5:9]
    assert len(set(cols)) == len(cols) and EVAL_RETURN in cols
    assert set(columns(TD3.metrics, True)) - set(columns(TD3.metrics, False)) == set(STOCHASTIC.values())


def test_a_bursts_row_means_the_summed_statistics_and_keeps_the_last_grad_norm():
    row = burst_row(
        {"qf1_loss": 6.0, "policy_loss": 1.0}, {"qf1_loss": 3, "policy_loss": 2}, {"qf1_loss": 9.0, "q_grad_norm": 0.5}
    )
    assert row == {"rl_loss/qf1_loss": 2.0, "rl_loss/policy_loss": 0.5, "rl_loss/q_grad_norm": 0.5}


def test_a_resumed_run_with_a_new_column_keeps_every_value_under_its_own_column(tmp_path):
    # A run logged under an older header (here: without policy_entropy, as an older version's SAC), checkpointed,
    # then resumed by a version that logs one more column: its rows are rebuilt by column name.
    old_cols = [c for c in columns(SAC.metrics, False) if c != "rl_loss/policy_entropy"]
    path = tmp_path / "progress.csv"
    old = MetricsWriter(path, old_cols)
    old.write({"rl_loss/qf1_loss": 1.5, "rl_loss/alpha": 0.9}, 100)
    old.write({ENV_STEPS: 200, EVAL_RETURN: -123.4}, 200)
    state = old.state()
    old.close()

    new_cols = columns(SAC.metrics, False)
    new = MetricsWriter(path, new_cols, checkpoint=state)
    new.write({ENV_STEPS: 300, EVAL_RETURN: -50.0, "rl_loss/policy_entropy": 1.25}, 300)
    new.close()
    rows, header = read(path)
    assert header == new_cols
    assert rows[0]["rl_loss/qf1_loss"] == "1.5" and rows[0]["rl_loss/alpha"] == "0.9"
    assert rows[0]["rl_loss/policy_entropy"] == "" and rows[0][ENV_STEPS] == ""
    assert rows[1][ENV_STEPS] == "200" and rows[1][EVAL_RETURN] == "-123.4"  # not shifted into z/env_steps' place
    assert rows[2][EVAL_RETURN] == "-50.0" and rows[2]["rl_loss/policy_entropy"] == "1.25"
    (kept,) = tmp_path.glob("progress.csv.old-header-*")  # the file as it was, beside it
    assert read(kept)[1] == old_cols


def test_a_column_the_resumed_run_no_longer_logs_is_refused_not_dropped(tmp_path):
    cols = columns(SAC.metrics, True)
    path = tmp_path / "progress.csv"
    old = MetricsWriter(path, cols)
    old.write({ENV_STEPS: 200, STOCHASTIC[EVAL_RETURN]: -99.0}, 200)
    state = old.state()
    old.close()
    with pytest.raises(ValueError, match="metrics/return_eval_total_sto"):
        MetricsWriter(path, columns(SAC.metrics, False), checkpoint=state)
    assert read(path)[0][0][STOCHASTIC[EVAL_RETURN]] == "-99.0"  # untouched


@pytest.mark.parametrize("damage", ["bad-utf8", "nul", "fifo", "device", "huge"])
def test_an_unreadable_progress_csv_is_set_aside_and_rebuilt(tmp_path, damage):
    # Damaged bytes are damage: the resumed run keeps the file beside it and rebuilds the rows from its checkpoint,
    # reading no more than a bound.
    import os

    cols = columns(SAC.metrics, False)
    path = tmp_path / "progress.csv"
    w = MetricsWriter(path, cols)
    w.write({ENV_STEPS: 200, EVAL_RETURN: -123.4}, 200)
    state = w.state()
    w.close()
    if damage == "bad-utf8":
        with open(path, "ab") as f:
            f.write(b"\xff\n")
    elif damage == "nul":
        with open(path, "ab") as f:
            f.write(b"\0\0\0\n")
    elif damage == "fifo":
        path.unlink()
        os.mkfifo(path)
    elif damage == "device":
        path.unlink()
        path.symlink_to("/dev/zero")
    else:
        with open(path, "ab") as f:
            f.write(b"x" * (3 << 20))
    MetricsWriter(path, cols, checkpoint=state).close()
    rows, header = read(path)
    assert header == cols and len(rows) == 1 and rows[0][EVAL_RETURN] == "-123.4"
    (kept,) = tmp_path.glob("progress.csv.*")  # damaged, or (NUL bytes read as a row) logged after the checkpoint
    assert kept.name.startswith("progress.csv.damaged-" if damage != "nul" else "progress.csv.after-checkpoint-")
