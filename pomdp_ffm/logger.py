"""progress.csv in the reference's format (spec 6.6), written and flushed row by row.

Train rows carry the ``rl_loss/...`` columns, eval rows the ``z/...`` and ``metrics/...`` columns; the
other cells stay empty, as in the reference. Unlike the reference writer, the header is known up front
and written first, so the file is never empty and never rewritten while a run is alive.
"""
from __future__ import annotations

import csv
import math
import os
from pathlib import Path

TRAIN_KEYS_SAC = ["qf1_loss", "qf2_loss", "policy_loss", "policy_entropy", "alpha"]
TRAIN_KEYS_TD3 = ["qf1_loss", "qf2_loss", "policy_loss"]
GRAD_KEYS = ["q_grad_norm", "q_rnn_grad_norm", "pi_grad_norm", "pi_rnn_grad_norm"]
EVAL_COLUMNS = ["z/env_steps", "z/rollouts", "z/rl_steps", "metrics/total_steps_eval",
                "metrics/return_eval_total", "metrics/success_rate_eval"]
EVAL_STO_COLUMNS = ["metrics/total_steps_eval_sto", "metrics/return_eval_total_sto",
                    "metrics/success_rate_eval_sto"]
TIME_COLUMNS = ["z/time_cost", "z/fps"]


def columns_for(algo_name: str, eval_stochastic: bool) -> list[str]:
    train = TRAIN_KEYS_SAC if algo_name == "sac" else TRAIN_KEYS_TD3
    cols = [f"rl_loss/{k}" for k in train + GRAD_KEYS] + EVAL_COLUMNS
    if eval_stochastic:
        cols += EVAL_STO_COLUMNS
    return cols + TIME_COLUMNS


def _fmt(v) -> str:
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(round(v, 4)) if math.isfinite(v) else str(v)
    return str(v)


class ProgressCSV:
    def __init__(self, path: Path, columns: list[str], keep_rows: int | None = None):
        """Open for appending. ``keep_rows`` (on resume) first cuts the file back to that many data rows,
        dropping rows logged after the checkpoint the run resumes from."""
        self.path, self.columns = Path(path), columns
        if keep_rows is None or not self.path.exists():
            self._rewrite([])
            self.rows = 0
        else:
            with open(self.path, newline="") as f:
                reader = csv.reader(f)
                header = next(reader, None)
                rows = [r for _, r in zip(range(keep_rows), reader)]
            if header != columns:
                raise ValueError(f"{self.path} has columns {header}, expected {columns}: "
                                 "is this the same algorithm's run?")
            self._rewrite(rows)
            self.rows = len(rows)
        self._file = open(self.path, "a", newline="")
        self._writer = csv.writer(self._file)

    def _rewrite(self, rows: list[list[str]]) -> None:
        # Write a complete file beside the old one and swap it in: a crash never leaves half a file.
        tmp = self.path.with_suffix(".csv.tmp")
        with open(tmp, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(self.columns)
            w.writerows(rows)
        os.replace(tmp, self.path)

    def write(self, values: dict) -> None:
        unknown = set(values) - set(self.columns)
        if unknown:
            raise KeyError(f"progress.csv has no column(s) {sorted(unknown)}")
        self._writer.writerow([_fmt(values[c]) if c in values else "" for c in self.columns])
        self._file.flush()
        self.rows += 1

    def close(self) -> None:
        self._file.close()
