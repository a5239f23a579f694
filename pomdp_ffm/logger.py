"""One metrics writer: progress.csv in the reference's format, and TensorBoard when asked, fed the same rows.

Train rows carry the ``rl_loss/...`` columns, eval rows the ``z/...`` and ``metrics/...`` columns; the other
cells stay empty, as in the reference's logger (its policies/learner.py and utils/logger.py; precision 4).
Unlike the reference's writer, the header is known up front (the algorithm declares its statistics) and
written first, so the file is never empty and never rewritten while a run is alive.

Every row is also kept in memory as the strings written, so that a checkpoint carries the exact rows up
to it and a resumed run can check progress.csv against them and repair it (see ``MetricsWriter``).
"""
from __future__ import annotations

import csv
import logging
import math
import os
from pathlib import Path
from typing import Sequence

from .rundir import set_aside

log = logging.getLogger("pomdp_ffm")

GRAD_KEYS = ["q_grad_norm", "q_rnn_grad_norm", "pi_grad_norm", "pi_rnn_grad_norm"]
EVAL_COLUMNS = ["z/env_steps", "z/rollouts", "z/rl_steps", "metrics/total_steps_eval",
                "metrics/return_eval_total", "metrics/success_rate_eval"]
EVAL_STO_COLUMNS = ["metrics/total_steps_eval_sto", "metrics/return_eval_total_sto",
                    "metrics/success_rate_eval_sto"]
TIME_COLUMNS = ["z/time_cost", "z/fps"]


def columns_for(train_keys: Sequence[str] | str, eval_stochastic: bool) -> list[str]:
    """progress.csv's header. ``train_keys``: the statistics the algorithm declares, or its name."""
    if isinstance(train_keys, str):
        from .algos import stat_keys

        train_keys = stat_keys(train_keys)
    cols = [f"rl_loss/{k}" for k in [*train_keys, *GRAD_KEYS]] + EVAL_COLUMNS
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


class MetricsWriter:
    def __init__(self, path: Path, columns: list[str], tensorboard_dir: Path | None = None,
                 checkpoint_rows: list[list[str]] | None = None):
        """Open progress.csv for appending.

        A fresh run (``checkpoint_rows`` None) starts the file with its header. A resumed run passes the rows
        its checkpoint holds: the file must start with exactly those rows. Rows logged after the checkpoint
        (the run went on before it stopped) are dropped with a warning, since the resumed run logs them again.
        A missing file is rebuilt from the checkpoint's rows; a shorter or different one is moved aside to
        ``progress.csv.damaged-<time>`` and rebuilt, with a warning naming both files."""
        self.path, self.columns = Path(path), list(columns)
        self.rows: list[list[str]] = []
        if checkpoint_rows is None:
            self._rewrite([])
        else:
            self._reconcile([list(r) for r in checkpoint_rows])
        self._file = open(self.path, "a", newline="")
        self._csv = csv.writer(self._file)
        self.tb = None
        if tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise ImportError("eval.log_tensorboard=true needs the tensorboard package: "
                                  "pip install 'pomdp-ffm[tensorboard]'") from e
            self.tb = SummaryWriter(str(tensorboard_dir))

    def _reconcile(self, expected: list[list[str]]) -> None:
        n = len(expected)
        if not self.path.exists():
            log.warning("%s is missing: rebuilt its %d rows from the checkpoint", self.path, n)
            self._rewrite(expected)
            return
        with open(self.path, newline="") as f:
            found = list(csv.reader(f))
        header, rows = (found[0], found[1:]) if found else (None, [])
        if header == self.columns and rows[:n] == expected:
            if len(rows) > n:
                log.warning("%s: dropped %d row(s) logged after the checkpoint; the resumed run logs them again",
                            self.path, len(rows) - n)
            self._rewrite(expected)
            return
        aside = set_aside(self.path, "damaged")
        why = ("its header differs from this algorithm's columns" if header != self.columns else
               f"it holds {len(rows)} row(s) where the checkpoint has {n}" if len(rows) < n else
               "its rows differ from the checkpoint's copy")
        log.warning("%s did not match the checkpoint (%s): moved it to %s and rebuilt its %d rows from the "
                    "checkpoint", self.path, why, aside.name, n)
        self._rewrite(expected)

    def _rewrite(self, rows: list[list[str]]) -> None:
        # A complete file beside the old one, then swapped in: a crash never leaves half a file.
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with open(tmp, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(self.columns)
            w.writerows(rows)
        os.replace(tmp, self.path)
        self.rows = [list(r) for r in rows]

    def write(self, values: dict, step: int) -> None:
        unknown = set(values) - set(self.columns)
        if unknown:
            raise KeyError(f"progress.csv has no column(s) {sorted(unknown)}")
        row = [_fmt(values[c]) if c in values else "" for c in self.columns]
        self._csv.writerow(row)
        self._file.flush()
        self.rows.append(row)
        if self.tb is not None:
            for k, v in values.items():
                self.tb.add_scalar(k, v, step)

    @property
    def num_eval_rows(self) -> int:
        i = self.columns.index("z/env_steps")
        return sum(1 for r in self.rows if r[i] != "")

    def close(self) -> None:
        self._file.close()
        if self.tb is not None:
            self.tb.close()
