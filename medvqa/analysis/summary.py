"""The per-run summary: closed/open x i.i.d./OoD/RR for the run and its reference rows."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

COLUMNS = ("closed i.i.d.", "closed OoD", "closed RR", "open i.i.d.", "open OoD", "open RR")


def summary_table(
    metrics: Mapping[str, float],
    rows: Sequence[tuple[str, str]],
    primary_closed: str,
    primary_open: str,
) -> pd.DataFrame:
    """One row per (label, metric-name prefix); a missing number is NaN, never dropped."""
    records = []
    for label, prefix in rows:

        def get(key: str, prefix: str = prefix) -> float:
            return metrics.get(f"{prefix}{key}", math.nan)

        records.append(
            {
                "method": label,
                "closed i.i.d.": get(f"test_iid/{primary_closed}"),
                "closed OoD": get(f"test_ood/{primary_closed}"),
                "closed RR": get("robustness/rr_closed"),
                "open i.i.d.": get(f"test_iid/{primary_open}"),
                "open OoD": get(f"test_ood/{primary_open}"),
                "open RR": get("robustness/rr_open"),
            }
        )
    return pd.DataFrame.from_records(records, columns=["method", *COLUMNS])


def _fmt(value: float) -> str:
    return (
        "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3f}"
    )


def write_summary(table: pd.DataFrame, out_dir: Path) -> tuple[Path, Path]:
    """summary.csv (numbers) and summary.md (formatted) in the run directory."""
    csv_path, md_path = out_dir / "summary.csv", out_dir / "summary.md"
    table.to_csv(csv_path, index=False)
    shown = table.copy()
    for col in COLUMNS:
        shown[col] = shown[col].map(_fmt)
    md_path.write_text(shown.to_markdown(index=False) + "\n")
    return csv_path, md_path


def print_summary(table: pd.DataFrame, title: str, console: Console | None = None) -> None:
    """Render the summary in the terminal with rich."""
    view = Table(title=title, title_style="bold")
    view.add_column("method", style="bold", no_wrap=True)
    for col in COLUMNS:
        view.add_column(col, justify="right")
    for _, row in table.iterrows():
        view.add_row(row["method"], *(_fmt(row[c]) for c in COLUMNS))
    (console or Console()).print(view)
