"""Running the views beyond accuracy: figures over all of a job's scored answers together,
where a metric family scores one predictions file at a time (docs/metrics.md#image-reliance and
the sections after it). The views are plug-ins (`medvqa.views.base.View`, one module
each in this package, or a module named in `MEDVQA_PLUGINS`), each declaring what it reads:

- image reliance, against the counterfactual image modes' answers (`reliance.py`);
- paraphrase consistency, over rows that share a `paraphrase_group` (`consistency.py`);
- option-order flips, against the reordered options' answers (`consistency.py`);
- and every metric family's own hook over the job's rows (`MetricFamily.over_rows`:
  calibration's temperature, fitted on the validation answers).

A view applies where the job has its inputs (the other passes, the grouping column); one that
applies but misses every per-sample column it reads is skipped with a warning naming the
columns and the metric family that makes them (missing some, e.g. open answers scored without
exact match, it warns and those answers' figures are NaN). `train_eval` and
`medvqa-score` run the same views (`run_views`), so a predictions file scored again gives the
figures of the run that made it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from medvqa.generation.passes import EvalPass
from medvqa.scoring.pipeline import Scoring, bootstrap_options, prefixed, unanswered
from medvqa.views.base import JobRows, views

log = logging.getLogger(__name__)


def run_views(rows: JobRows, families: Sequence[Any] = ()) -> tuple[pd.DataFrame, dict[str, float]]:
    """Every view whose inputs the job has, then each metric family's hook over the job's rows
    (`MetricFamily.over_rows`); returns `main` with their per-sample columns and their figures."""
    out: dict[str, float] = {}
    for view in views():
        if not view.applies(rows):
            continue
        needed = view.needed(rows)
        missing = [c for c in needed if c not in rows.main]
        if missing:
            log.warning(
                "%s: the scored answers have no column(s) %s, which the %s metric family makes "
                "(metric=[%s,...]): %s",
                view.name,
                missing,
                view.family,
                view.family,
                "skipped" if missing == needed else "its figures for those answers are NaN",
            )
            if missing == needed:
                continue
        rows.main, figures = view.apply(rows)
        out.update(figures)
    for family in families:
        rows.main, figures = family.over_rows(rows.main)
        out.update(figures)
    return rows.main, out


def score_job(
    scoring: Scoring,
    answers: Mapping[str, Mapping[str, pd.DataFrame]],
    passes: Sequence[EvalPass] = (),
    breakdown: Sequence[str] | None = None,
) -> tuple[dict[str, float], dict[str, pd.DataFrame]]:
    """Score every pass of a job and run the views over them: what `train_eval` and
    `medvqa-score` both do. `answers`: each pass's answers by its metric prefix ("" the main
    answers, `<mode>/`, `order<k>/`, ...) -> split -> predictions; `passes`: the job's
    (`generation.passes`: what each prefix is; the main answers may be left out), a pass that
    pairs its scores with the main ones (a counterfactual image's) also giving `delta_<key>/`:
    main - it, with paired intervals; `breakdown`: the fields to break the figures down by
    (default `evaluation.breakdown`; intervals by `evaluation.bootstrap`). Returns the prefixed
    figures and the scored tables by prefix (the main one with the views' per-sample columns);
    nothing is written."""
    unknown = sorted(set(answers) - {"", *(p.prefix for p in passes)})
    if unknown or "" not in answers:
        raise ValueError(f"answers of no pass of the job: {unknown}, or none of the main answers")
    metrics: dict[str, float] = {}
    results: dict[str, dict[str, float]] = {}
    scored: dict[str, pd.DataFrame] = {}
    for prefix, by_split in answers.items():
        results[prefix], scored[prefix] = scoring.score(by_split, breakdown=breakdown)
        metrics.update(prefixed(prefix, results[prefix]))
    for p in passes:  # e.g. the blind ablation: delta = sighted - blank
        if p.paired_delta and p.prefix in answers:
            delta = f"delta_{p.prefix}"
            metrics.update(scoring.deltas(results[""], results[p.prefix], delta))
            metrics.update(scoring.paired_delta_intervals(scored[""], scored[p.prefix], delta))
    rows = JobRows(
        scored[""],
        others=scored,
        passes=list(passes),
        breakdown=list(scoring.evaluation.breakdown if breakdown is None else breakdown),
        bootstrap=bootstrap_options(scoring.evaluation),
    )
    scored[""], figures = run_views(rows, scoring.families)
    if any(unanswered(table).any() for table in scored.values()):
        # The views compare a job's passes row by row: never over the rows that happen to have
        # answers (`scoring.UNANSWERED` counts the others; the next run asks them again).
        figures = dict.fromkeys(figures, math.nan)
    metrics.update(figures)
    return metrics, scored
