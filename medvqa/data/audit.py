"""Leakage audit of a set of splits: what a test split shares with the training data.

Shared images are expected for question-type shifts (same images, other questions) and for
transform shifts (the OoD test is the transformed i.i.d. test), so the audit reports and never
fails; the reader decides. Paraphrase groups (VQA-RAD's `qid_linked_id`) that straddle train and
a test split, and shared cases (patients), are the leaks that usually matter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from medvqa.data import records as R

# Optional column: questions that are paraphrases of one another share a group id.
PARAPHRASE_GROUP = R.PARAPHRASE_GROUP


def _overlap(reference: pd.DataFrame, split: pd.DataFrame, column: str) -> dict[str, int] | None:
    if column not in reference.columns or column not in split.columns:
        return None
    ours = set(reference[column].dropna().astype(str))
    theirs = split[column].dropna().astype(str)
    shared = theirs[theirs.isin(ours)]
    return {"shared": int(shared.nunique()), "rows": len(shared), "of": int(theirs.nunique())}


# (split, reference) pairs the audit compares: every evaluation split against training, and
# the OoD test against the i.i.d. test (a question-type shift shares all its images there).
PAIRS: tuple[tuple[str, str], ...] = (
    (R.VAL, R.TRAIN),
    (R.TEST_IID, R.TRAIN),
    (R.TEST_OOD, R.TRAIN),
    (R.TEST_OOD, R.TEST_IID),
)


def audit_leakage(frames: Mapping[str, pd.DataFrame]) -> dict[str, Any]:
    """Per pair `<split>~<reference>`: images, cases and paraphrase groups both contain.

    Each entry gives `shared` (distinct values also in the reference split), `rows` (rows of the
    split that carry one) and `of` (distinct values in the split).
    """
    out: dict[str, Any] = {}
    for name, reference in PAIRS:
        if name not in frames or reference not in frames:
            continue
        out[f"{name}~{reference}"] = {
            key: found
            for key, column in (
                ("images", R.IMAGE_ID),
                ("cases", R.CASE_ID),
                ("paraphrase_groups", PARAPHRASE_GROUP),
            )
            if (found := _overlap(frames[reference], frames[name], column)) is not None
        }
    return out


def leakage_warnings(audit: Mapping[str, Any]) -> list[str]:
    """One line per non-empty overlap, for the log."""
    return [
        f"{pair.split('~')[0]}: {info['shared']} {kind} of {info['of']} also in "
        f"{pair.split('~')[1]} ({info['rows']} rows)"
        for pair, entry in audit.items()
        for kind, info in entry.items()
        if info["shared"]
    ]
