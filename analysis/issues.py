"""The one list of skipped input, warnings and notes, its one count, and how the console shows it.

Every step adds to one :class:`LoadReport`; report.md and issues.csv hold every
entry, and the console shows each *kind* of entry once with how many there are
(:func:`console_lines`), so that a warning that repeats for every run of a big
tree cannot hide the one that matters.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

KINDS = ("skipped", "warning", "note")


@dataclass
class Issue:
    path: str
    kind: str  # "skipped" (input not used), "warning" (rows dropped or guessed), "note"
    reason: str


@dataclass
class LoadReport:
    issues: list[Issue] = field(default_factory=list)
    n_runs_found: int = 0
    n_runs_loaded: int = 0
    # Published result files (analysis.published): counted apart from run directories, never cached.
    n_published_found: int = 0
    n_published_read: int = 0

    def add(self, path: str | Path, kind: str, reason: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown issue kind {kind!r}; expected one of {', '.join(KINDS)}")
        self.issues.append(Issue(str(path), kind, reason))

    @property
    def skipped(self) -> list[Issue]:
        return [i for i in self.issues if i.kind == "skipped"]

    @property
    def warnings(self) -> list[Issue]:
        return [i for i in self.issues if i.kind == "warning"]

    @property
    def notes(self) -> list[Issue]:
        return [i for i in self.issues if i.kind == "note"]

    def extend(self, problems: Iterable[tuple[str, str, str]]) -> None:
        """Add ``(path, kind, reason)`` problems, as the analysis steps return them."""
        for path, kind, reason in problems:
            self.add(path, kind, reason)

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([asdict(i) for i in self.issues], columns=["path", "kind", "reason"])

    def summary(self) -> str:
        """The one count of skipped input and warnings: the console and report.md both print this line."""
        published = (
            f", {self.n_published_found} published file(s) found, {self.n_published_read} read"
            if self.n_published_found
            else ""
        )
        return (
            f"{self.n_runs_found} run dir(s) found, {self.n_runs_loaded} loaded{published}; "
            f"{len(self.skipped)} skipped, {len(self.warnings)} warning(s)"
        )


# What differs between two entries of one kind: quoted values, paths and group names (anything with a slash),
# task ids and numbers. Masked, a per-run warning ("no seed; trial id taken from folder name '05-09:12-34'") reads
# the same for every run.
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_PATHLIKE = re.compile(r"[^\s,;()]*/[^\s,;()]*")
_TASK = re.compile(r"\b[A-Za-z0-9]+-[FPV]-v\d+\b")
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def issue_kind(issue: Issue) -> str:
    """The entry with what changes from one run or group to the next masked: entries of one kind share it."""
    text = _QUOTED.sub("'*'", issue.reason)
    text = _PATHLIKE.sub("*", text)
    text = _TASK.sub("<task>", text)
    return f"{issue.kind}: {_NUMBER.sub('#', text)}"


def console_lines(report: LoadReport, limit: int = 50) -> list[str]:
    """The skipped input and warnings for stderr, each kind once: its first entry, and how many more there are
    (report.md and issues.csv list them all). Notes are left to report.md."""
    kinds: dict[str, list[Issue]] = {}
    for issue in report.issues:
        if issue.kind != "note":
            kinds.setdefault(issue_kind(issue), []).append(issue)
    lines = []
    for first, *more in list(kinds.values())[:limit]:
        alike = f" (and {len(more)} more like it, listed in report.md)" if more else ""
        lines.append(f"{first.kind}: {first.path}: {first.reason}{alike}")
    if len(kinds) > limit:
        lines.append(f"... and {len(kinds) - limit} more kinds of issue: see report.md")
    return lines
