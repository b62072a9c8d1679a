"""What finished runs of a dataset tell the power plan (`task=plan +task.icc_from=<dir>`): how
its test questions cluster in cases, its closed share, and how two methods' scores spread and
correlate within a case (medvqa.statistics.power).

The folder is a stranger's: each `results.json` is read through the record reader
(`medvqa.record.read_record`) and one that is not a record is skipped with a warning naming it;
`splits.json` and `scores.parquet` beside it are checked before use (a file that is not what the
run writes is skipped, named, never trusted). A run counts for a dataset by the dataset its own
`splits.json` names; the plan prefers the runs of the job's shift, then any run of the dataset.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from medvqa.config import EvaluationSchema
from medvqa.data import records as R
from medvqa.data.shifts import SPLITS_FILE
from medvqa.planning.setup import PlanError
from medvqa.record import RESULTS_FILE, read_record
from medvqa.scoring.pipeline import SCORES_FILE
from medvqa.statistics import power
from medvqa.untrusted import read_plain_json

log = logging.getLogger(__name__)

# Runs whose scores describe the data (an incomplete run's unscored items are left out).
FINISHED = ("finished", "incomplete")
TEST_SPLITS = (R.TEST_IID, R.TEST_OOD)
_SCORED_COLUMNS = (R.ID, R.CASE_ID, R.SPLIT, R.ANSWER_TYPE)


@dataclass(frozen=True)
class FinishedRun:
    """One finished run of the folder: where, which shift and method, its splits report and
    scored rows, and its per-row score columns (score -> (column, answer type))."""

    source: Path
    dataset: str
    shift: str
    method: str
    splits: Mapping[str, Any]
    scored: pd.DataFrame | None
    columns: Mapping[str, tuple[str, str]]
    primary: Mapping[str, str]  # answer type -> the run's headline score


def finished_runs(path: str | Path) -> list[FinishedRun]:
    """The finished runs under `path` (a run directory, a sweep, or a results.json); a
    PlanError if there is no such path or no readable finished run with a splits.json."""
    root = Path(path)
    if not root.exists():
        raise PlanError(
            f"+task.icc_from={path}: no such file or directory; give a finished run's directory "
            "(or a sweep's) of the dataset you plan"
        )
    records = [root] if root.is_file() else sorted(root.rglob(RESULTS_FILE))
    runs = [run for record in records if (run := _read(record)) is not None]
    if not runs:
        raise PlanError(
            f"+task.icc_from={path}: no finished run with its {SPLITS_FILE} under it "
            f"({len(records)} {RESULTS_FILE} file(s) read); give a finished run's directory"
        )
    return runs


def _read(record_path: Path) -> FinishedRun | None:
    """One run, or None (with a warning naming the file) where it cannot serve."""
    try:
        record = read_record(record_path)
    except ValueError as err:
        log.warning("%s; skipped", err)
        return None
    if record["status"] not in FINISHED:
        return None
    splits = _splits_report(record_path.parent / SPLITS_FILE)
    if splits is None:
        return None
    config = record.get("config") or {}
    choices = record.get("choices") or {}
    evaluation = config.get("evaluation") if isinstance(config.get("evaluation"), Mapping) else {}
    node = config.get("peft") if isinstance(config.get("peft"), Mapping) else {}
    peft = choices.get("peft") or node.get("name") or "?"
    baseline = choices.get("baseline")
    return FinishedRun(
        source=record_path.parent,
        dataset=str(splits["dataset"]),
        shift=str(splits.get("shift", "?")),
        method=f"{peft}+{baseline}" if baseline else str(peft),
        splits=splits,
        scored=_scored(record_path.parent / SCORES_FILE),
        columns=_score_columns(record),
        primary={
            "closed": str(evaluation.get("primary_closed", EvaluationSchema.primary_closed)),
            "open": str(evaluation.get("primary_open", EvaluationSchema.primary_open)),
        },
    )


def _splits_report(path: Path) -> dict[str, Any] | None:
    """A splits.json as the tasks write it (dataset, shift, per-split counts), else None."""
    if not path.is_file():
        return None
    try:  # a stranger's folder: plain values, a file naming code refused (medvqa.untrusted)
        report = read_plain_json(path, SPLITS_FILE, "its run is skipped").value
    except ValueError as err:
        log.warning("%s", err)
        return None
    splits = report.get("splits") if isinstance(report, dict) else None
    if not isinstance(report, dict) or not isinstance(report.get("dataset"), str):
        log.warning("%s: not a splits report (no 'dataset'); its run is skipped", path)
        return None
    if not isinstance(splits, dict) or not all(
        isinstance(v, dict) and all(_count(v.get(k)) for k in ("n", "open", "closed"))
        for v in splits.values()
    ):
        log.warning("%s: its 'splits' lack whole counts n/open/closed; its run is skipped", path)
        return None
    return report


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _scored(path: Path) -> pd.DataFrame | None:
    """The run's scored rows of the test splits, or None where there are none usable."""
    if not path.is_file():
        return None
    try:
        scored = pd.read_parquet(path)
    except Exception as err:  # a stranger's file: whatever pyarrow makes of it
        log.warning("%s: not a readable table (%s); its scores are not used", path, err)
        return None
    missing = [c for c in _SCORED_COLUMNS if c not in scored]
    if missing:
        log.warning("%s: lacks column(s) %s; its scores are not used", path, missing)
        return None
    scored = scored[scored[R.SPLIT].isin(TEST_SPLITS)]
    if scored[R.CASE_ID].isna().any():
        log.warning("%s: rows without a case_id; its scores are not used", path)
        return None
    return scored


def _score_columns(record: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """score -> (per-row column, answer type) from the record's `provenance.metrics.<family>.
    ci_columns`; entries of another shape are left out."""
    families = (record.get("provenance") or {}).get("metrics") or {}
    out: dict[str, tuple[str, str]] = {}
    for family in families.values() if isinstance(families, Mapping) else ():
        columns = family.get("ci_columns") if isinstance(family, Mapping) else None
        for score, entry in (columns or {}).items() if isinstance(columns, Mapping) else ():
            if (
                isinstance(entry, list | tuple)
                and len(entry) == 2
                and all(isinstance(e, str) for e in entry)
                and entry[1] in R.ANSWER_TYPES
            ):
                out[str(score)] = (entry[0], entry[1])
    return out


# -- what the plan takes from them -----------------------------------------------------------


def designs(
    runs: Sequence[FinishedRun],
    dataset: str,
    shift: str,
    rows: Mapping[str, int],
    source: str,
) -> dict[tuple[str, str], power.Design]:
    """(split, answer type) -> Design of the job's test splits of `rows` rows each (`source`:
    where those counts come from): the closed and open counts of a finished run of the same
    shift (its splits.json), else the dataset's closed share; cases as the dataset's scored
    rows cluster (rows per case and Σ m² / n, of the same shift and split where scored); the
    defaults where no run of the dataset says."""
    mine = [r for r in runs if r.dataset == dataset]
    same = [r for r in mine if r.shift == shift]
    out: dict[tuple[str, str], power.Design] = {}
    for split, n in rows.items():
        closed, share_from = _closed_rows(same, mine, split, n)
        if closed is None:
            for answer_type, design in power.assumed_designs(n, source).items():
                out[(split, answer_type)] = design
            continue
        for answer_type, typed in (("closed", closed), ("open", n - closed)):
            where = f"{source}; closed/open: {share_from}"
            clustering = (
                _clustering(same, split, answer_type)
                or _audited(same, split, typed)
                or _clustering(mine, None, answer_type)
            )
            if clustering is None:
                cases = max(n / power.DEFAULT_ROWS_PER_CLUSTER, 1.0)
                out[(split, answer_type)] = power.Design.even(
                    typed, cases, f"{where}; cases {power.DEFAULT}"
                )
                continue
            per_case, size, found_at = clustering
            out[(split, answer_type)] = power.Design(
                typed,
                max(typed / per_case, 1.0) if typed else 0.0,
                max(size, 1.0) if typed else 1.0,
                f"{where}; cases: {found_at}",
            )
    return out


def _closed_rows(
    same: Sequence[FinishedRun], mine: Sequence[FinishedRun], split: str, n: int
) -> tuple[int | None, str]:
    """The closed rows among `n` of `split`: a same-shift run's splits.json count (scaled to
    `n` if the counts differ), else the dataset's share of closed scored test rows."""
    for run in same:
        counts = run.splits["splits"].get(split)
        if counts:
            share = counts["closed"] / counts["n"] if counts["n"] else 0.0
            return round(n * share), str(run.source / SPLITS_FILE)
    scored = [r for r in mine if r.scored is not None and not r.scored.empty]
    if not scored:
        return None, ""
    share = float(np.mean([(r.scored[R.ANSWER_TYPE] == "closed").mean() for r in scored]))
    return round(n * share), f"the closed share of {scored[0].source / SCORES_FILE}"


def _clustering(
    runs: Sequence[FinishedRun], split: str | None, answer_type: str
) -> tuple[float, float, str] | None:
    """(rows per case, Σ m² / n, where) of one answer type's scored rows of `split` (or of
    every test split), from the first run that scored the whole split (a run capped by
    `data.limit` would show its sample's clustering, not the split's)."""
    for run in runs:
        if run.scored is None:
            continue
        splits = [split] if split is not None else list(TEST_SPLITS)
        scored = run.scored[run.scored[R.SPLIT].isin(splits)]
        whole = all(
            (scored[R.SPLIT] == s).sum() == (run.splits["splits"].get(s) or {}).get("n")
            for s in splits
        )
        rows = scored[scored[R.ANSWER_TYPE] == answer_type]
        if not whole or len(rows) < 2:
            continue
        k, size = power.weighted_size(rows[R.CASE_ID].to_numpy(str))
        where = f"{run.source / SCORES_FILE}" + (f" ({split})" if split else "")
        return len(rows) / k, size, where
    return None


def _audited(runs: Sequence[FinishedRun], split: str, rows: int) -> tuple[float, float, str] | None:
    """(rows per case, the same as size, where) of `rows` rows of one answer type from a run's
    leakage audit: spread evenly over the cases of `split` (`<split>~train`'s `of`), every
    case holding both kinds of question."""
    for run in runs:
        audit = (run.splits.get("leakage") or {}).get(f"{split}~{R.TRAIN}") or {}
        cases = (audit.get("cases") or {}).get("of") if isinstance(audit, dict) else None
        if _count(cases) and cases:
            per_case = max(rows / cases, 1.0)
            return per_case, per_case, f"leakage audit of {run.source / SPLITS_FILE}"
    return None


def spreads(
    runs: Sequence[FinishedRun],
    dataset: str,
    shift: str,
    scores: Mapping[str, str],
) -> dict[tuple[str, str], power.Spread]:
    """(split, answer type) -> Spread of the job's headline `scores` (answer type -> score):
    from the scored rows of the dataset's finished runs of the same shift, else of any of its
    shifts (the same split), else the stated defaults."""
    mine = [r for r in runs if r.dataset == dataset and r.scored is not None]
    same = [r for r in mine if r.shift == shift]
    out: dict[tuple[str, str], power.Spread] = {}
    for split in TEST_SPLITS:
        for answer_type, score in scores.items():
            found = None
            for group, which in ((same, f"shift {shift}"), (mine, f"dataset {dataset}")):
                rows, names = _score_rows(group, split, answer_type, score)
                if rows:
                    where = os.path.commonpath([str(r.source) for r in group])
                    runs_of = f"{len(rows)} run(s) of {which} under {where}"
                    found = power.measured_spread(rows, f"{'/'.join(names)} of {runs_of}")
                if found is not None:
                    break
            out[(split, answer_type)] = found or power.assumed_spread(answer_type)
    return out


def _score_rows(
    runs: Sequence[FinishedRun], split: str, answer_type: str, score: str
) -> tuple[list[tuple[str, pd.DataFrame]], list[str]]:
    """(method, id/case_id/value rows) of `score` in each run that recorded it per row (a run
    whose headline of that type is another score gives that one), and the scores used."""
    out, names = [], []
    for run in runs:
        name = score if score in run.columns else run.primary.get(answer_type, "")
        if name not in run.columns or run.scored is None:
            continue
        column, kind = run.columns[name]
        rows = run.scored[(run.scored[R.SPLIT] == split) & (run.scored[R.ANSWER_TYPE] == kind)]
        if column not in rows or kind != answer_type:
            continue
        frame = pd.DataFrame(
            {
                "id": rows[R.ID].astype(str),
                "case_id": rows[R.CASE_ID].astype(str),
                "value": pd.to_numeric(rows[column], errors="coerce"),
            }
        )
        if frame["value"].notna().any():
            out.append((run.method, frame))
            names.append(name)
    return out, list(dict.fromkeys(names))
