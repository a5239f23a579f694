"""Write the numbers behind every figure as CSV and as a Markdown table."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd


def _fmt(value, digits: int) -> str:
    if value is None or value is pd.NA:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.{digits}f}"
    return str(value).replace("|", "\\|")


def to_markdown(df: pd.DataFrame, digits: int = 3) -> str:
    """A GitHub-flavoured Markdown table (written here to avoid a ``tabulate`` dependency)."""
    header = "| " + " | ".join(str(c) for c in df.columns) + " |"
    rule = "| " + " | ".join("---:" if pd.api.types.is_numeric_dtype(df[c]) else "---" for c in df.columns) + " |"
    body = ["| " + " | ".join(_fmt(v, digits) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([header, rule, *body]) + "\n"


def write_table(df: pd.DataFrame, base: str | Path, digits: int = 3, title: str | None = None) -> list[Path]:
    """``<base>.csv`` (full precision) and ``<base>.md`` (rounded, optional title)."""
    base = Path(base)
    base.parent.mkdir(parents=True, exist_ok=True)
    csv_path = base.with_suffix(".csv")
    md_path = base.with_suffix(".md")
    df.to_csv(csv_path, index=False)
    text = (f"### {title}\n\n" if title else "") + to_markdown(df, digits)
    md_path.write_text(text)
    return [csv_path, md_path]
