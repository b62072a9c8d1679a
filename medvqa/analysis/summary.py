"""The per-run summary: closed/open x i.i.d./OoD/RR for the run and its reference rows."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from medvqa.console import console as console_for_output
from medvqa.data import records as R

COLUMNS = ("closed i.i.d.", "closed OoD", "closed RR", "open i.i.d.", "open OoD", "open RR")
_SPLITS = {"i.i.d.": "test_iid/", "OoD": "test_ood/"}
# A run scored on the validation split only (a hyperparameter grid, task.eval_splits=[val]).
VAL_COLUMNS = ("closed val", "open val")
_VAL_SPLITS = {R.VAL: f"{R.VAL}/"}
# Labels and metadata are data: in Markdown they must not become markup (HTML that a viewer
# renders or runs) or break the table (a `|` adds a cell, a newline ends the row).
_MARKDOWN_ESCAPES = str.maketrans(
    {
        "&": "&amp;",
        "<": "&lt;",
        ">": "&gt;",
        "|": "&#124;",
        "\\": "&#92;",
        "\r": " ",
        "\n": " ",
        "\u2028": " ",
        "\u2029": " ",
    }
)


def markdown_text(text: object) -> str:
    """`text` safe in a Markdown table cell or heading: HTML's `& < >` and the table
    breakers `|`, `\\` and line breaks escaped (entities render as the characters)."""
    return str(text).translate(_MARKDOWN_ESCAPES)


def markdown_table(frame: pd.DataFrame, **options: object) -> str:
    """`frame.to_markdown(index=False)` with every text cell and header escaped
    (`markdown_text`); numbers are left to the table's own formatting."""
    safe = frame.map(lambda v: markdown_text(v) if isinstance(v, str) else v)
    safe.columns = [markdown_text(c) for c in frame.columns]
    return safe.to_markdown(index=False, **options)


def summary_table(
    metrics: Mapping[str, float],
    rows: Sequence[tuple[str, str]],
    primary_closed: str,
    primary_open: str,
) -> pd.DataFrame:
    """One row per (label, metric-name prefix); a missing number is NaN, never dropped. For
    each i.i.d./OoD cell, `<column> failed` counts the items its score could not score (a
    judge that did not answer; the score is then NaN)."""
    from medvqa.scoring.pipeline import failed_items, unreliable

    val_only = not any(k.startswith(tuple(_SPLITS.values())) for k in metrics) and any(
        k.startswith(_VAL_SPLITS[R.VAL]) for k in metrics
    )
    splits, columns = (_VAL_SPLITS, VAL_COLUMNS) if val_only else (_SPLITS, COLUMNS)
    records = []
    for label, prefix in rows:
        record: dict[str, object] = {"method": label}
        failed: dict[str, object] = {}
        own = {k[len(prefix) :]: v for k, v in metrics.items() if k.startswith(prefix)}
        for kind, score in (("closed", primary_closed), ("open", primary_open)):
            for split_name, split in splits.items():
                record[f"{kind} {split_name}"] = metrics.get(f"{prefix}{split}{score}", math.nan)
                failed[f"{kind} {split_name} failed"] = failed_items(metrics, prefix + split, score)
            if not val_only:
                record[f"{kind} RR"] = metrics.get(f"{prefix}robustness/rr_{kind}", math.nan)
            failed[f"{kind} unreliable judge"] = unreliable(own, score)
        records.append({**record, **failed})
    extra = [f"{c} failed" for c in columns if not c.endswith("RR")]
    extra += [f"{kind} unreliable judge" for kind in ("closed", "open")]
    return pd.DataFrame.from_records(records, columns=["method", *columns, *extra])


def _columns(names: pd.Index) -> tuple[str, ...]:
    """The score columns a summary table has (test splits with RR, or validation only)."""
    return VAL_COLUMNS if VAL_COLUMNS[0] in names else COLUMNS


def _fmt(value: float, failed: int = 0, unreliable: bool = False) -> str:
    """A number, "—" where there is none, "incomplete (n)" where n items failed; a score of
    a judge that failed its self-check says so."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return f"incomplete ({failed})" if failed else "—"
    return f"{value:.3f} (unreliable judge)" if unreliable else f"{value:.3f}"


def _shown(row: pd.Series) -> dict[str, str]:
    """A row's cells as text; a NaN cell with failed items says so (RR: those of both splits)."""

    def failed(column: str) -> int:
        if column.endswith("RR"):
            kind = column.split()[0]
            return sum(failed(f"{kind} {split}") for split in _SPLITS)
        return int(row.get(f"{column} failed", 0) or 0)

    return {
        col: _fmt(row[col], failed(col), bool(row.get(f"{col.split()[0]} unreliable judge")))
        for col in _columns(row.index)
    }


def write_summary(table: pd.DataFrame, out_dir: Path, note: str | None = None) -> tuple[Path, Path]:
    """summary.csv (numbers) and summary.md (formatted, below `note` where there is one: a
    rehearsal's) in the run directory."""
    csv_path, md_path = out_dir / "summary.csv", out_dir / "summary.md"
    table.to_csv(csv_path, index=False)
    shown = table[["method"]].join(pd.DataFrame([_shown(r) for _, r in table.iterrows()]))
    md_path.write_text((f"**{note}**\n\n" if note else "") + markdown_table(shown) + "\n")
    return csv_path, md_path


def print_summary(table: pd.DataFrame, title: str, console: Console | None = None) -> None:
    """Render the summary in the terminal with rich."""
    view = Table(title=title, title_style="bold")
    view.add_column("method", style="bold", no_wrap=True)
    for col in _columns(table.columns):
        view.add_column(col, justify="right")
    for _, row in table.iterrows():
        view.add_row(escape(str(row["method"])), *_shown(row).values())  # not rich markup
    (console or console_for_output()).print(view)
