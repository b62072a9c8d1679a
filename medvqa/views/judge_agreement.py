"""Agreement between the judges of a jury (`judge.jury`, docs/judge.md#agreement-between-
judges): how far the study's judge scores depend on which judge gave them.

Per split, overall and per value of each breakdown field (`evaluation.breakdown`, the question
type by default), over the rows each statistic applies to:

* each pair of jurors: Cohen's kappa on the closed verdicts (`closed_kappa`), quadratic-
  weighted kappa on the open 1-5 scores (`open_wkappa`);
* the whole jury: Fleiss' kappa on the closed verdicts (`closed_fleiss_kappa`), ordinal
  Krippendorff's alpha on the open scores (`open_alpha`);

each with a case-clustered bootstrap interval (`evaluation.bootstrap`), recorded as
`judge/agreement/<split>/[<field>=<value>/]<juror>~<juror>|jury/<stat>[_ci_lo|_ci_hi|_ci_half]`,
and the rows compared as `.../n_closed`, `.../n_open`. A set of rows one of its jurors failed on
has NaN agreement (`medvqa.statistics.agreement`).

Rows the judges did not read are left out: a prediction equal to the ground truth after
normalisation gets the rubric's maximum from every juror without a call (the engine's
shortcut), so it would add agreement no judge made (as the rater study leaves exact matches
out of its correlations).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from medvqa.data import records as R
from medvqa.judge.engine import SHORTCUT_REASON
from medvqa.scoring.metrics.base import breakdown_prefix, field_groups
from medvqa.scoring.metrics.judge import JUDGE_REASON, JUDGE_SCORE, juror_column, jurors_of
from medvqa.statistics.agreement import agreement, levels_for
from medvqa.views.base import JobRows, Presentation, View

PREFIX = "judge/agreement"
JURY = "jury"
# answer type -> (the statistic of a pair of jurors, of the whole jury)
STATS = {"closed": ("kappa", "fleiss_kappa"), "open": ("wkappa", "alpha")}


def pair_name(a: str, b: str) -> str:
    """How a pair of jurors is written in a key: `lenient~strict`."""
    return f"{a}~{b}"


def judge_agreement(
    scored: pd.DataFrame,
    breakdown: Sequence[str] = (),
    bootstrap: Mapping[str, Any] | None = None,
) -> dict[str, float]:
    """The agreement figures (see the module docstring) of a scored table with jurors'
    columns (`judge_score@<juror>`) and a `split` column."""
    jurors = jurors_of(scored)
    out: dict[str, float] = {}
    if len(jurors) < 2:
        return out
    reasons = [juror_column(JUDGE_REASON, j) for j in jurors]
    if all(r in scored for r in reasons):
        scored = scored.loc[~(scored[reasons] == SHORTCUT_REASON).all(axis=1)]
    for split, rows in scored.groupby(R.SPLIT, sort=False):
        groups: list[tuple[str, pd.DataFrame]] = [("", rows)]
        for field in breakdown:
            if field in rows:
                groups += [(breakdown_prefix(field, v), g) for v, g in field_groups(rows, field)]
        for where, group in groups:
            base = f"{PREFIX}/{split}/{where}"
            for answer_type, (pair_stat, jury_stat) in STATS.items():
                typed = group.loc[group[R.ANSWER_TYPE] == answer_type]
                if typed.empty:
                    continue
                out[f"{base}n_{answer_type}"] = float(len(typed))
                levels = levels_for(answer_type)
                clusters = typed[R.CASE_ID].to_numpy(object)
                columns = [juror_column(JUDGE_SCORE, j) for j in jurors]
                sets = [
                    (pair_name(a, b), pair_stat, [juror_column(JUDGE_SCORE, j) for j in (a, b)])
                    for a, b in itertools.combinations(jurors, 2)
                ]
                sets.append((JURY, jury_stat, columns))
                for who, stat, cols in sets:
                    ci = agreement(stat, typed[cols].to_numpy(float), clusters, levels, bootstrap)
                    name = f"{base}{who}/{answer_type}_{stat}"
                    out[name] = ci.point
                    if bootstrap is not None:
                        out.update(ci.entries(name))
    return out


class JudgeAgreement(View):
    name = "judge agreement"
    title = "Agreement between judges"
    order = 60
    family = "judge"
    presentation = Presentation(
        r"^judge/agreement/(?P<split>SPLIT)/(?P<what>[^/=]+)/"
        r"(?P<stat>closed_kappa|open_wkappa|closed_fleiss_kappa|open_alpha)$",
        {
            "closed_kappa": "closed κ",
            "open_wkappa": "open weighted κ",
            "closed_fleiss_kappa": "closed Fleiss κ",
            "open_alpha": "open α",
        },
        "The jurors of judge.jury on the same answers: Cohen's κ of each pair on the closed "
        "verdicts, quadratic-weighted κ on the open 1-5 scores; Fleiss' κ and ordinal "
        "Krippendorff's α of the whole jury. 1 is perfect agreement, 0 what chance gives; "
        "below about 0.6 the judges disagree enough that a conclusion can depend on which one "
        "graded (see the judge-sensitivity table).",
    )

    def applies(self, rows: JobRows) -> bool:
        return len(jurors_of(rows.main)) >= 2

    def apply(self, rows: JobRows) -> tuple[pd.DataFrame, dict[str, float]]:
        return rows.main, judge_agreement(rows.main, rows.breakdown, rows.bootstrap)
