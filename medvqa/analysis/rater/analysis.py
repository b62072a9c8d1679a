"""The analysis half of the rater study: read the exported items and the filled sheets back
(validated: every id known and rated once, integer scores 1–5), correlate the human scores with
each metric and each rater with the others, measure the chance-corrected agreement of each judge
(each juror of a jury too) with the raters and of the raters with each other (the ceiling), and
write the tables and figures."""

from __future__ import annotations

import csv
import itertools
import json
import logging
import math
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from medvqa.analysis.rater.plots import figures
from medvqa.analysis.rater.study import ITEMS, SCORE_RANGE, SHEET_CSV, RatingError, Study
from medvqa.analysis.summary import markdown_table
from medvqa.atomic import staged_dir
from medvqa.generation.files import json_lines
from medvqa.statistics.agreement import OPEN_LEVELS, agreement

log = logging.getLogger(__name__)

__all__ = ["analyze", "correlation_table", "read_items", "read_ratings"]


def read_items(directory: Path) -> pd.DataFrame:
    """``items.jsonl`` of an export as a table: id, ..., one column per metric score."""
    path = Path(directory) / ITEMS
    if not path.is_file():
        raise RatingError(f"{path} not found; run `medvqa-rater export` to create {directory}")

    def bad_line(line_no: int, err: json.JSONDecodeError) -> None:
        raise RatingError(f"{path}:{line_no} is not valid JSON: {err}") from err

    rows = []
    with path.open() as fh:
        for line_no, item in json_lines(fh, bad_line):
            if "id" not in item or not isinstance(item.get("scores"), dict):
                raise RatingError(f"{path}:{line_no} lacks 'id' or a 'scores' object")
            scores = item.pop("scores")
            rows.append(
                {**item, "id": str(item["id"]), **{f"metric:{k}": v for k, v in scores.items()}}
            )
    if not rows:
        raise RatingError(f"{path} holds no items")
    table = pd.DataFrame(rows)
    if table["id"].duplicated().any():
        raise RatingError(
            f"{path}: id {table.loc[table['id'].duplicated(), 'id'].iloc[0]!r} repeats"
        )
    return table.set_index("id")


def _parse_score(raw: str) -> int | None:
    """An integer score from a cell ("4", " 4 ", "4.0" as spreadsheets write it), else None."""
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    if not math.isfinite(value) or value != int(value):
        return None
    return int(value)


def read_ratings(path: Path, known_ids: Sequence[str]) -> pd.Series:
    """One rater's scores (index = item id), validated against the exported ids.

    Every known id must be rated exactly once with an integer in 1..5; anything else raises
    :class:`RatingError` naming the file, the data row (1 = first row after the header) and
    the fix.
    """
    path = Path(path)
    if not path.is_file():
        raise RatingError(f"ratings file {path} not found")
    with path.open(newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        if "id" not in header or "score" not in header:
            raise RatingError(
                f"{path}: header {header} lacks 'id' and/or 'score'; use the exported "
                f"{SHEET_CSV} (or the HTML page's download) and fill in 'score'"
            )
        known = set(known_ids)
        scores: dict[str, int] = {}
        lo, hi = SCORE_RANGE
        for row_no, row in enumerate(reader, 1):
            item = (row.get("id") or "").strip()
            if item not in known:
                raise RatingError(
                    f"{path}: row {row_no}: id {item!r} is not one of the exported items; "
                    "rate the sheet exported for this study"
                )
            if item in scores:
                raise RatingError(f"{path}: row {row_no}: id {item!r} is rated twice; keep one")
            raw = row.get("score") or ""
            value = _parse_score(raw)
            if value is None or not lo <= value <= hi:
                what = "no score" if not raw.strip() else f"score {raw!r}"
                raise RatingError(
                    f"{path}: row {row_no} (id {item!r}) has {what}; scores are integers {lo}–{hi}"
                )
            scores[item] = value
    unrated = [i for i in known_ids if i not in scores]
    if unrated:
        raise RatingError(
            f"{path}: {len(unrated)} item(s) not rated, e.g. {unrated[:3]}; every exported "
            "item needs a score"
        )
    return pd.Series(scores, dtype=float).reindex(list(known_ids))


def _correlate(x: pd.Series, y: pd.Series) -> dict[str, float]:
    """Kendall tau-b and Spearman rho with p-values over the rows where both are defined.

    A constant variable has no ranking, so its correlations are NaN (scipy's warning about it
    is silenced: the NaN in the table says it).
    """
    both = pd.concat([x, y], axis=1).dropna()
    n = len(both)
    nan = {"kendall_tau_b": math.nan, "kendall_p": math.nan}
    nan |= {"spearman_rho": math.nan, "spearman_p": math.nan, "n": float(n)}
    if n < 2 or both.iloc[:, 0].nunique() < 2 or both.iloc[:, 1].nunique() < 2:
        return nan
    a, b = both.iloc[:, 0].to_numpy(float), both.iloc[:, 1].to_numpy(float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tau = stats.kendalltau(a, b, variant="b")
        rho = stats.spearmanr(a, b)
    return {
        "kendall_tau_b": float(tau.statistic),
        "kendall_p": float(tau.pvalue),
        "spearman_rho": float(rho.statistic),
        "spearman_p": float(rho.pvalue),
        "n": float(n),
    }


# Chance-corrected agreement on the 1-5 scale, for a judge's scores and between raters:
# quadratic-weighted Cohen's kappa and ordinal Krippendorff's alpha (medvqa.statistics.agreement).
AGREEMENT = {"weighted_kappa": "wkappa", "alpha": "alpha"}
COLUMNS = [
    "kind",
    "a",
    "b",
    "kendall_tau_b",
    "kendall_p",
    "spearman_rho",
    "spearman_p",
    *AGREEMENT,
    "n",
]


def _agree(x: pd.Series, y: pd.Series) -> dict[str, float]:
    """Weighted kappa and alpha of two scorings of the items on the raters' 1-5 scale (a mean
    human score or a judge's expected score at its nearest grade); NaN if either misses an
    item (a judge that failed it): agreement over the rest would describe the survivors."""
    pair = np.column_stack([x.to_numpy(float), y.to_numpy(float)])
    return {
        column: agreement(stat, pair, np.arange(len(pair)), OPEN_LEVELS).point
        for column, stat in AGREEMENT.items()
    }


def _compare(x: pd.Series, y: pd.Series, on_scale: bool) -> dict[str, float]:
    """The correlations of `x` and `y`, and their agreement when both are on the 1-5 scale."""
    return _correlate(x, y) | (_agree(x, y) if on_scale else dict.fromkeys(AGREEMENT, math.nan))


def correlation_table(study: Study) -> pd.DataFrame:
    """Rows: mean human vs each metric, each rater vs each metric, each rater pair, pair mean.
    The judges' scores (each juror's too) and the raters' are on one scale, so those rows also
    carry weighted kappa and alpha; the rater pairs' are the ceiling a judge can reach."""
    rows = []
    judges = set(study.judges)
    for metric in study.metrics:
        rows.append(
            {"kind": "human_vs_metric", "a": "human_mean", "b": metric}
            | _compare(study.human, study.metric(metric), metric in judges)
        )
    for rater in study.ratings.columns:
        for metric in study.metrics:
            rows.append(
                {"kind": "rater_vs_metric", "a": rater, "b": metric}
                | _compare(study.ratings[rater], study.metric(metric), metric in judges)
            )
    pairs = []
    for r1, r2 in itertools.combinations(study.ratings.columns, 2):
        pairs.append(
            {"kind": "rater_vs_rater", "a": r1, "b": r2}
            | _compare(study.ratings[r1], study.ratings[r2], True)
        )
    rows.extend(pairs)
    if pairs:
        frame = pd.DataFrame(pairs)
        rows.append(
            {
                "kind": "rater_pairs_mean",
                "a": "raters",
                "b": f"{len(pairs)} pair(s)",
                "kendall_tau_b": float(frame["kendall_tau_b"].mean()),
                "kendall_p": math.nan,
                "spearman_rho": float(frame["spearman_rho"].mean()),
                "spearman_p": math.nan,
                **{column: float(frame[column].mean()) for column in AGREEMENT},
                "n": float(frame["n"].mean()),
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def analyze(directory: Path, ratings: Sequence[Path], out: Path) -> pd.DataFrame:
    """Validate the ratings, write correlations (CSV, Markdown) and figures; return the table."""
    if not ratings:
        raise RatingError("no ratings file given; pass --ratings r1.csv [r2.csv ...]")
    items = read_items(Path(directory))
    if not any(c.startswith("metric:") for c in items.columns):
        raise RatingError(f"{Path(directory) / ITEMS}: items carry no metric scores")
    ids = list(items.index)
    stems = [Path(p).stem for p in ratings]
    names = stems if len(set(stems)) == len(stems) else [str(p) for p in ratings]
    if len(set(names)) != len(names):
        raise RatingError(f"a ratings file is given twice: {[str(p) for p in ratings]}")
    table = pd.DataFrame(
        {name: read_ratings(Path(p), ids) for name, p in zip(names, ratings, strict=True)}
    )
    study = Study(items=items, ratings=table)
    result = correlation_table(study)
    with staged_dir(Path(out), "medvqa-rater analyze") as staging:  # swapped in whole
        result.to_csv(staging / "correlations.csv", index=False)
        (staging / "correlations.md").write_text(
            f"# Rater study: {len(ids)} items, {len(names)} rater(s)\n\n"
            + markdown_table(result, floatfmt=".3f")  # rater names are file names: data
            + "\n"
        )
        drawn = [path.name for path in figures(study, result, staging)]
    log.info("wrote correlations.csv, correlations.md and %s to %s", drawn, out)
    return result
