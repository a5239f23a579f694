"""One metrics writer: progress.csv in the reference's format, and TensorBoard when asked, fed the same rows.

The columns are pomdp_ffm/metrics.py's. Unlike the reference's writer, the header is known up front and written
first, so the file is never empty and never rewritten while a run is alive (values with precision 4, as the
reference's logger).

Every row is also kept in memory as the strings written, so that a checkpoint carries the exact rows up to it,
with their header (``state()``), and a resumed run can check progress.csv against them and repair it.
"""

from __future__ import annotations

import contextlib
import csv
import io
import logging
import math
from pathlib import Path

from .metrics import ENV_STEPS
from .run.rundir import replace_text, set_aside
from .run.unwritable import writing

log = logging.getLogger("pomdp_ffm")


def _csv_text(rows: list[list[str]]) -> str:
    out = io.StringIO()
    csv.writer(out).writerows(rows)
    return out.getvalue()


def _fmt(v) -> str:
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, float) and math.isfinite(v):
        return repr(round(v, 4))
    return str(v)


class MetricsWriter:
    def __init__(
        self, path: Path, columns: list[str], tensorboard_dir: Path | None = None, checkpoint: dict | None = None
    ):
        """Open progress.csv for appending.

        A fresh run (``checkpoint`` None) starts the file with its header. A resumed run passes what its
        checkpoint holds (``state()``): the file must start with exactly those rows. Rows logged after the
        checkpoint (the run went on before it stopped) are dropped with a warning, since the resumed run logs them
        again (the file as it was is kept as ``progress.csv.after-checkpoint-<time>``). A missing file is rebuilt
        from the checkpoint's rows; a shorter, different or unreadable one is moved aside to
        ``progress.csv.damaged-<time>`` and rebuilt, with a warning naming both files. Rows stored under another
        header (a version that logged other columns) are mapped onto this one by column name, never by
        position; a column this version no longer logs is refused (ValueError), since its values would be lost."""
        self.path, self.columns = Path(path), list(columns)
        self.rows: list[list[str]] = []
        if checkpoint is None:
            self._rewrite([])
        else:
            self._reconcile(list(checkpoint["columns"]), [list(r) for r in checkpoint["rows"]])
        with writing(self.path):
            self._file = open(self.path, "a", newline="")
        self._csv = csv.writer(self._file)
        self.tb = None
        if tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise ImportError(
                    "eval.log_tensorboard=true needs the tensorboard package: pip install 'pomdp-ffm[tensorboard]'"
                ) from e
            self.tb = SummaryWriter(str(tensorboard_dir))

    def state(self) -> dict:
        """What a checkpoint keeps: the header and the rows written so far."""
        return {"columns": list(self.columns), "rows": [list(r) for r in self.rows]}

    def _by_name(self, columns: list[str], rows: list[list[str]]) -> list[list[str]]:
        """Rows stored under ``columns``, as rows of this writer's columns."""
        if columns == self.columns:
            return rows
        lost = [c for i, c in enumerate(columns) if c not in self.columns and any(r[i] for r in rows)]
        if lost:
            raise ValueError(
                f"the checkpoint's rows have column(s) {lost} that this run does not log; resume it "
                "with the version (and eval.eval_stochastic setting) that wrote them"
            )
        log.warning(
            "%s: the checkpoint's rows were logged under another header; mapped onto this one by column "
            "name (new columns empty in the old rows)",
            self.path,
        )
        return [[dict(zip(columns, r)).get(c, "") for c in self.columns] for r in rows]

    def _reconcile(self, columns: list[str], stored: list[list[str]]) -> None:
        expected, n = self._by_name(columns, stored), len(stored)
        if not self.path.exists():
            log.warning("%s is missing: rebuilt its %d rows from the checkpoint", self.path, n)
            self._rewrite(expected)
            return
        found, unreadable = self._read(len(_csv_text([columns, *stored])))
        header, rows = (found[0], found[1:]) if found else (None, [])
        if unreadable is None and header == columns and rows[:n] == stored:
            if len(rows) > n:
                aside = set_aside(self.path, "after-checkpoint")
                log.warning(
                    "%s: %d row(s) were logged after the checkpoint; the resumed run logs them again (the "
                    "file as it was is kept in %s)",
                    self.path,
                    len(rows) - n,
                    aside.name,
                )
            elif header != self.columns:
                aside = set_aside(self.path, "old-header")
                log.warning(
                    "%s: rewritten under this run's header (the file as it was is kept in %s)", self.path, aside.name
                )
            self._rewrite(expected)
            return
        aside = set_aside(self.path, "damaged")
        why = (
            unreadable
            if unreadable is not None
            else "its header differs from the checkpoint's"
            if header != columns
            else f"it holds {len(rows)} row(s) where the checkpoint has {n}"
            if len(rows) < n
            else "its rows differ from the checkpoint's copy"
        )
        log.warning(
            "%s did not match the checkpoint (%s): moved it to %s and rebuilt its %d rows from the checkpoint",
            self.path,
            why,
            aside.name,
            n,
        )
        self._rewrite(expected)

    def _read(self, expected_bytes: int) -> tuple[list[list[str]], str | None]:
        """The file's rows, or why they cannot be read: not a regular file (a device, a FIFO), far larger than a run
        could have written beside the checkpoint's rows (read with that bound), or not UTF-8 CSV text."""
        if not self.path.is_file():
            return [], "it is not a regular file"
        bound = 4 * expected_bytes + (1 << 20)  # rows logged after the checkpoint: a few hundred at most
        with open(self.path, "rb") as f:
            data = f.read(bound + 1)
        if len(data) > bound:
            return [], f"it holds more than {bound} bytes, far more than this run wrote"
        try:
            return list(csv.reader(io.StringIO(data.decode("utf-8"), newline=""))), None
        except (UnicodeDecodeError, csv.Error) as e:
            return [], f"it is not CSV text ({type(e).__name__}: {str(e)[:80]})"

    def _rewrite(self, rows: list[list[str]]) -> None:
        # A complete file beside the old one, then swapped in: a crash never leaves half a file.
        replace_text(self.path, _csv_text([self.columns, *rows]))
        self.rows = [list(r) for r in rows]

    def write(self, values: dict, step: int) -> None:
        unknown = set(values) - set(self.columns)
        if unknown:
            raise KeyError(f"progress.csv has no column(s) {sorted(unknown)}")
        row = [_fmt(values[c]) if c in values else "" for c in self.columns]
        with writing(self.path):  # (a row cut short by a full disk is set aside at resume, as later rows)
            self._csv.writerow(row)
            self._file.flush()
        self.rows.append(row)
        if self.tb is not None:
            for k, v in values.items():
                self.tb.add_scalar(k, v, step)

    @property
    def num_eval_rows(self) -> int:
        i = self.columns.index(ENV_STEPS)
        return sum(1 for r in self.rows if r[i] != "")

    def close(self) -> None:
        with contextlib.suppress(OSError):  # the bytes of a row whose write() failed (and raised), still buffered
            self._file.close()
        if self.tb is not None:
            self.tb.close()
