"""Paraphrase consistency and option-order invariance: does the model give the same answer to the same question in other
words? Answer flips under paraphrase reach 24–50 % in recent studies (arXiv 2606.26079,
2509.18234), and a single accuracy hides them.

Rows that share a `paraphrase_group` (VQA-RAD's `qid_linked_id`; the synthetic data's
`dataset.paraphrases`) ask the same thing about the same image with the same answer. Every two
rows of a group form a pair. A pair agrees when the two answers mean the same: the same chosen
candidate for a closed question (`closed_choice`, so "Yes" and "yes." agree), the same
normalised text for an open one. Per pair of splits (the two rows' splits; `test_iid~test_ood`
for VQA-RAD's paraphrase shift, whose free-form questions are i.i.d. and their paraphrases
OoD) and answer type, `<splits>/consistency_paraphrase_<type>_<stat>`:

- `flip_rate`: the share of pairs whose answers differ, with a case-clustered interval (the
  pair's case: its image);
- `both_correct`: the share of pairs right both times (`traditional.binary_correct`);
- `n_pairs`.

Per sample (`scores.parquet`): `consistency_paraphrase_agrees`, the share of the row's group
partners whose answer means the same as its own (NaN for a row without partners).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd

from medvqa.data import records as R
from medvqa.data.answers import normalize_answer
from medvqa.scoring.metrics.traditional import binary_correct
from medvqa.statistics.bootstrap import cluster_bootstrap

PREFIX = "consistency_paraphrase_"
AGREES = f"{PREFIX}agrees"
CHOICE = "closed_choice"  # the traditional family's chosen candidate of a closed question


def meaning(scored: pd.DataFrame) -> pd.Series:
    """What an answer says: the chosen candidate of a closed question where the traditional
    family chose one, else the normalised answer text."""
    text = scored[R.PREDICTION].map(lambda p: normalize_answer(str(p)))
    if CHOICE not in scored.columns:
        return text
    choice = scored[CHOICE].map(lambda c: None if c is None or c != c else normalize_answer(c))
    closed = (scored[R.ANSWER_TYPE] == "closed") & choice.notna()
    return text.where(~closed, choice)


def paraphrase_pairs(scored: pd.DataFrame, split_order: Sequence[str] = ()) -> pd.DataFrame:
    """One row per pair of rows sharing a paraphrase group: their splits (`splits`, the two
    joined by "~" when they differ, in `split_order`), case, answer type, whether they agree and
    whether both are right."""
    columns = ["splits", R.CASE_ID, R.ANSWER_TYPE, "agree", "both_correct", "id_a", "id_b"]
    if R.PARAPHRASE_GROUP not in scored.columns:
        return pd.DataFrame(columns=columns)
    frame = scored.assign(_meaning=meaning(scored), _correct=binary_correct(scored))
    frame = frame[frame[R.PARAPHRASE_GROUP].notna()]
    rank = {s: i for i, s in enumerate(split_order)}
    rows = []
    for _, group in frame.groupby(R.PARAPHRASE_GROUP, sort=True):
        for (_, a), (_, b) in combinations(group.sort_values(R.ID).iterrows(), 2):
            pair = sorted({str(a[R.SPLIT]), str(b[R.SPLIT])}, key=lambda s: (rank.get(s, 99), s))
            rows.append(
                (
                    "~".join(pair),
                    a[R.CASE_ID],
                    a[R.ANSWER_TYPE],
                    float(a["_meaning"] == b["_meaning"]),
                    float(a["_correct"] == 1 and b["_correct"] == 1)
                    if not (np.isnan(a["_correct"]) or np.isnan(b["_correct"]))
                    else np.nan,
                    a[R.ID],
                    b[R.ID],
                )
            )
    return pd.DataFrame(rows, columns=columns)


def add_agreement(scored: pd.DataFrame) -> pd.DataFrame:
    """`scored` with the per-sample `consistency_paraphrase_agrees` column (rows matched by
    split and id)."""
    pairs = paraphrase_pairs(scored)
    if pairs.empty:
        return scored
    ends = pd.concat(
        [
            pairs[["id_a", "agree"]].rename(columns={"id_a": R.ID}),
            pairs[["id_b", "agree"]].rename(columns={"id_b": R.ID}),
        ]
    )
    share = ends.groupby(R.ID)["agree"].mean()
    return scored.assign(**{AGREES: scored[R.ID].map(share).astype(float)})


def consistency_metrics(
    scored: pd.DataFrame,
    split_order: Sequence[str] = (),
    bootstrap: Mapping[str, Any] | None = None,
) -> dict[str, float]:
    """The figures of every pair of splits and answer type (see the module doc);
    `bootstrap`: `cluster_bootstrap`'s options, None for no intervals."""
    out: dict[str, float] = {}
    pairs = paraphrase_pairs(scored, split_order)
    for (splits, answer_type), rows in pairs.groupby(["splits", R.ANSWER_TYPE], sort=True):
        name = f"{splits}/{PREFIX}{answer_type}"
        flips = 1.0 - rows["agree"].to_numpy(float)
        if bootstrap is None:
            out[f"{name}_flip_rate"] = float(flips.mean())
        else:
            ci = cluster_bootstrap(flips, rows[R.CASE_ID].to_numpy(object), **bootstrap)
            out[f"{name}_flip_rate"] = ci.point
            out.update(ci.entries(f"{name}_flip_rate"))
        both = rows["both_correct"].to_numpy(float)
        out[f"{name}_both_correct"] = float(both.mean()) if not np.isnan(both).any() else np.nan
        out[f"{name}_n_pairs"] = float(len(rows))
    return out


# --- option-order invariance -------------------------------------------------------------------

ORDER_PREFIX = "consistency_order_"
ORDER_FLIPS = f"{ORDER_PREFIX}flips"


def order_flips(
    main: pd.DataFrame, others: Mapping[str, pd.DataFrame]
) -> tuple[pd.DataFrame, list[str]]:
    """`main` with `consistency_order_flips`, the share of the reorderings (`others`: the
    option-order passes' prefixes -> their scored tables, e.g. `order1/`) under which a closed
    question's answer means something else (another chosen candidate, or other text where none
    was chosen); NaN for open rows and rows with fewer than two candidates. Returns the table
    and the reorderings used."""
    used = list(others)
    if not used:
        return main, []
    key = R.prediction_index(main)
    ours = meaning(main).to_numpy(object)
    flips = []
    for prefix in used:
        other = others[prefix]
        theirs = pd.Series(
            meaning(other).to_numpy(object),
            index=R.prediction_index(other),
        ).reindex(key)
        flips.append([np.nan if t is None or t != t else float(o != t) for o, t in
                      zip(ours, theirs.to_numpy(object), strict=True)])  # fmt: skip
    counts = main[R.CANDIDATES].map(
        lambda c: len(c) if isinstance(c, list | tuple | np.ndarray) else 0
    )
    eligible = (main[R.ANSWER_TYPE] == "closed") & (counts >= 2)
    # NaN where an answer is missing under one order: no figure from the other orders alone.
    share = np.array(flips, dtype=float).mean(axis=0)
    column = pd.Series(share, index=main.index).where(eligible)
    return main.assign(**{ORDER_FLIPS: column}), used


def order_metrics(
    main: pd.DataFrame, bootstrap: Mapping[str, Any] | None = None
) -> dict[str, float]:
    """Per split, `<split>/consistency_order_closed_flip_rate`: the mean share of reorderings
    that change a closed question's answer (case-clustered interval), and `_n`, the questions
    with candidates to reorder. A question without its reordered answer makes it NaN."""
    out: dict[str, float] = {}
    if ORDER_FLIPS not in main.columns:
        return out
    for split, rows in main.groupby(R.SPLIT, sort=True):
        eligible = (rows[R.ANSWER_TYPE] == "closed") & rows[R.CANDIDATES].map(
            lambda c: isinstance(c, list | tuple | np.ndarray) and len(c) >= 2
        )
        values = rows.loc[eligible, ORDER_FLIPS].to_numpy(float)
        name = f"{split}/{ORDER_PREFIX}closed"
        out[f"{name}_n"] = float(len(values))
        if not len(values) or np.isnan(values).any():
            out[f"{name}_flip_rate"] = float("nan")
        elif bootstrap is None:
            out[f"{name}_flip_rate"] = float(values.mean())
        else:
            cases = rows.loc[eligible, R.CASE_ID].to_numpy(object)
            ci = cluster_bootstrap(values, cases, **bootstrap)
            out[f"{name}_flip_rate"] = ci.point
            out.update(ci.entries(f"{name}_flip_rate"))
    return out
