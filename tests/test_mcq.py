"""Oncology MCQ metrics: response resolution, a hand-computed pool with invalid answers and
mixed option counts, and the case-clustered interval."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from medvqa.data.answers import closed_choice, key_option, resolve_prediction
from medvqa.data.questions import closed_candidates, or_options
from medvqa.scoring.metrics.mcq import MCQ_CHOICE, McqMetric
from medvqa.statistics.bootstrap import Bootstrap, cluster_bootstrap

# (case, options, answer, prediction, resolved option or None)
POOL = [
    ("c1", ["liver", "lung", "bone"], "liver", "A", "liver"),  # 1 correct, letter
    ("c1", ["yes", "no"], "no", "(B)", "no"),  # 2 correct, "(B)"
    ("c2", ["T1", "T2", "T3", "T4"], "T3", "b) T2", "T2"),  # 3 wrong, letter + matching text
    ("c2", ["benign", "malignant"], "benign", "E", None),  # 4 invalid: E past 2 options
    (
        "c3",
        ["none", "mild", "moderate", "severe", "critical"],
        "severe",
        "The answer is D.",
        "severe",
    ),  # 5 correct, lead-in + letter
    ("c3", ["kidney", "liver", "spleen", "pancreas"], "liver", "A) liver", None),  # 6 invalid:
    # letter A (kidney) contradicts the text (liver)
    ("c4", ["benign", "malignant"], "malignant", "MALIGNANT", "malignant"),  # 7 correct, case
    ("c4", ["CT", "MRI", "PET"], "MRI", "I am not sure", None),  # 8 invalid: no option
    ("c4", ["left", "right", "bilateral"], "left", "It is on the right side.", "right"),  # 9 wrong
]


def _table(pool=POOL) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "id": [f"test/q{i}" for i in range(len(pool))],
            "question": "q",
            "case_id": [p[0] for p in pool],
            "candidates": [p[1] for p in pool],
            "answer": [p[2] for p in pool],
            "prediction": [p[3] for p in pool],
            "answer_type": "closed",
            "n_options": [len(p[1]) for p in pool],
            "source": [("RADS-style", "report-derived")[i % 2] for i in range(len(pool))],
        },
        index=pd.RangeIndex(10, 10 + len(pool)),
    )


def _scored(metric: McqMetric, table: pd.DataFrame) -> pd.DataFrame:
    return table.join(metric.per_sample(table))


def test_resolution_of_the_pool() -> None:
    per = McqMetric(bootstrap=Bootstrap()).per_sample(_table())
    assert per[MCQ_CHOICE].tolist() == [p[4] for p in POOL]
    assert per["mcq_invalid"].tolist() == [float(p[4] is None) for p in POOL]
    assert np.isnan(per["mcq_correct"].to_numpy()[[3, 5, 7]]).all()  # invalid: no score
    assert per["mcq_chance"].tolist() == pytest.approx([1 / len(p[1]) for p in POOL])


def test_known_answer_pool() -> None:
    metric = McqMetric(bootstrap=Bootstrap())
    out = metric.aggregate(_scored(metric, _table()))
    # valid rows 1, 2, 3, 5, 7, 9; correct 1, 2, 5, 7 -> 4/6
    assert out["mcq_acc"] == pytest.approx(2 / 3)
    assert out["mcq_invalid_rate"] == pytest.approx(3 / 9)  # rows 4, 6, 8
    assert out["mcq_acc_strict"] == pytest.approx(4 / 9)  # invalid counted as wrong
    # 1/k over all nine: 3 x 1/3 + 3 x 1/2 + 2 x 1/4 + 1/5 = 3.2 -> 3.2 / 9 = 16/45
    assert out["mcq_random_baseline"] == pytest.approx(16 / 45)
    assert out["mcq_n"] == 9.0 and out["mcq_n_valid"] == 6.0
    # CI: cases resampled, invalid rows out; per-case valid scores c1 [1, 1], c2 [0],
    # c3 [1], c4 [1, 0] -> the same call on those rows gives the same interval.
    ci = cluster_bootstrap(
        [1, 1, 0, 1, 1, 0], ["c1", "c1", "c2", "c3", "c4", "c4"], B=2000, seed=42
    )
    assert (out["mcq_acc_ci_lo"], out["mcq_acc_ci_hi"]) == (ci.lo, ci.hi)
    assert out["mcq_acc_ci_half"] == pytest.approx((ci.hi - ci.lo) / 2)
    assert out["mcq_acc_ci_lo"] < 2 / 3 < out["mcq_acc_ci_hi"]
    # The smallest possible resample mean is 0 (only c2 drawn) and the largest 1.
    assert out["mcq_acc_ci_lo"] >= 0.0 and out["mcq_acc_ci_hi"] <= 1.0


def test_bootstrap_settings_are_passed_through() -> None:
    table = _table()
    a = McqMetric(bootstrap=Bootstrap(samples=500, seed=1)).aggregate(
        _scored(McqMetric(bootstrap=Bootstrap()), table)
    )
    b = McqMetric(bootstrap=Bootstrap(samples=500, seed=1)).aggregate(
        _scored(McqMetric(bootstrap=Bootstrap()), table)
    )
    assert a == b
    rng = np.random.default_rng(0)
    big = pd.concat([_table()] * 30, ignore_index=True)
    big["case_id"] = [f"case{i // 3}" for i in range(len(big))]
    pairs = zip(big["candidates"], big["answer"], strict=True)
    wrong = [next(o for o in opts if o != ans) for opts, ans in pairs]
    big["prediction"] = np.where(rng.random(len(big)) < 0.5, big["answer"], wrong)
    scored = _scored(McqMetric(bootstrap=Bootstrap()), big)
    one, two = (
        McqMetric(bootstrap=Bootstrap(seed=1)).aggregate(scored),
        McqMetric(bootstrap=Bootstrap(seed=2)).aggregate(scored),
    )
    assert one["mcq_acc"] == two["mcq_acc"] and one["mcq_acc_ci_lo"] != two["mcq_acc_ci_lo"]


def test_cases_are_resampled_not_questions() -> None:
    """All questions of a case answered alike: one case per row (question-level) would give a
    narrower interval than the true case-level one."""
    rng = np.random.default_rng(1)
    rows = []
    for case in range(40):
        right = rng.random() < 0.6
        for _ in range(8):
            opts = ["a1", "b1", "c1"]
            rows.append((f"k{case}", opts, "a1", "a1" if right else "b1", None))
    table = _table(rows)
    metric = McqMetric(bootstrap=Bootstrap())
    by_case = metric.aggregate(_scored(metric, table))
    by_question = McqMetric(cluster_field="id", bootstrap=Bootstrap()).aggregate(
        _scored(metric, table)
    )
    assert by_case["mcq_acc"] == by_question["mcq_acc"]
    assert by_question["mcq_acc_ci_half"] < 0.6 * by_case["mcq_acc_ci_half"]


def test_subsets_and_empty() -> None:
    metric = McqMetric(bootstrap=Bootstrap())
    scored = _scored(metric, _table())
    for _, group in scored.groupby("source"):
        assert metric.aggregate(group)["mcq_n"] == len(group)
    empty = metric.aggregate(scored.iloc[:0])
    assert empty["mcq_n"] == 0.0
    assert all(math.isnan(empty[k]) for k in ("mcq_acc", "mcq_acc_ci_half", "mcq_invalid_rate"))
    all_invalid = scored.assign(mcq_correct=np.nan, mcq_invalid=1.0)
    out = metric.aggregate(all_invalid)
    assert math.isnan(out["mcq_acc"]) and out["mcq_invalid_rate"] == 1.0
    assert out["mcq_acc_strict"] == 0.0
    with pytest.raises(ValueError, match="case_id"):
        metric.aggregate(scored.drop(columns="case_id"))


@pytest.mark.parametrize(
    ("prediction", "expected"),
    [
        ("B", "lung"),
        ("b", "lung"),
        ("B)", "lung"),
        ("(B)", "lung"),
        ("B.", "lung"),
        ("Answer: C", "bone"),
        ("The correct answer is (A).", "liver"),
        ("Option B", "lung"),
        ("LUNG", "lung"),
        ("B) lung", "lung"),
        ("B) because of the lesion", "lung"),  # text names no option: the letter decides
        ("C) lung", None),  # contradiction
        ("D", None),  # only three options
        ("The lesion is in the lung.", "lung"),
        ("liver or lung", None),  # two options
        ("", None),
        (None, None),
        (float("nan"), None),
    ],
)
def test_resolve_prediction(prediction, expected) -> None:
    assert resolve_prediction(prediction, ["liver", "lung", "bone"]) == expected


def test_real_records_through_the_configured_family(tmp_path) -> None:
    """Oncology records from the native fixture, scored by the family `metric=mcq` builds:
    answering each question by its letter is always valid and right."""
    from medvqa.data.questions import LETTERS
    from medvqa.data.sources.oncology_mcq import OncologyMcq
    from medvqa.scoring.pipeline import build_families, score_frame
    from tests.conftest import compose
    from tests.native.oncology_mcq import write as write_oncology

    table = OncologyMcq(write_oncology(tmp_path / "onc").root).table()
    (metric,) = build_families(compose(["metric=mcq"]).metric)
    assert isinstance(metric, McqMetric) and metric.bootstrap == Bootstrap(2000, 42, 0.95)
    letters = [
        f"({LETTERS[list(c).index(a)]})"
        for c, a in zip(table["candidates"], table["answer"], strict=True)
    ]
    _, scores = score_frame(table.assign(prediction=letters), [metric], ["source"])
    assert scores["mcq_acc"] == 1.0 and scores["mcq_invalid_rate"] == 0.0
    assert scores["mcq_random_baseline"] == pytest.approx((1 / table["n_options"]).mean())


# -- Replies as real models write them (issue #21, defect 4) ---------------------------------

REPLIES = [
    json.loads(line)
    for line in (Path(__file__).parent / "fixtures" / "mcq_replies.jsonl").read_text().splitlines()
    if line.strip()
]


def test_the_reply_fixture_covers_the_forms() -> None:
    """At least 50 forms, the ones models write and the ones that must stay invalid."""
    assert len(REPLIES) >= 50
    replies = {r["reply"] for r in REPLIES}
    for form in ("[B]", "**B**", "'B'", "<answer>B</answer>", "\\boxed{B}", "My answer: B"):
        assert form in replies
    invalid = {r["reply"] for r in REPLIES if r["expected"] == "invalid"}
    assert {"A or B", "none", "Answer: A\nAnswer: B"} <= invalid


@pytest.mark.parametrize("row", REPLIES, ids=[repr(r["reply"])[:40] for r in REPLIES])
def test_reply_forms_resolve_to_the_intended_option(row) -> None:
    options = row["options"]
    expected = None if row["expected"] == "invalid" else options["ABCDE".index(row["expected"])]
    assert resolve_prediction(row["reply"], options) == expected


def test_the_committed_answer_beats_options_mentioned_before_it() -> None:
    options = ["Edema", "Pneumonia", "Pleural effusion"]
    assert resolve_prediction("Although Edema was considered, the answer is B.", options) == (
        "Pneumonia"
    )
    assert resolve_prediction("Edema is unlikely.\nB", options) == "Pneumonia"
    # Two commitments that disagree are not a choice.
    assert resolve_prediction("The answer is A. Final answer: B", options) is None


def test_a_letter_key_maps_to_its_option_and_scores() -> None:
    options = ["liver", "lung", "bone"]
    assert key_option("B", options) == "lung"
    assert key_option("(b)", options) == "lung"
    assert key_option("Lung", options) == "lung"
    assert key_option("D", options) is None  # only three options
    assert key_option("kidney", options) is None
    table = _table(
        [
            ("c1", options, "B", "B", "lung"),
            ("c1", options, "B", "The answer is lung.", "lung"),
            ("c2", options, "B", "A", "liver"),
            ("c2", options, "lung", "B", "lung"),
        ]
    )
    per = McqMetric(bootstrap=Bootstrap()).per_sample(table)
    assert per["mcq_correct"].tolist() == [1.0, 1.0, 0.0, 1.0]
    assert McqMetric(bootstrap=Bootstrap()).aggregate(table.join(per))["mcq_acc"] == pytest.approx(
        3 / 4
    )


def test_a_key_naming_no_option_is_an_error_not_a_zero() -> None:
    table = _table([("c1", ["liver", "lung", "bone"], "kidney", "A", None)])
    with pytest.raises(ValueError, match=r"row 10 has answer key 'kidney'.*fix the key"):
        McqMetric(bootstrap=Bootstrap()).per_sample(table)


# -- "A or B" questions (issue #21, defect 5) ------------------------------------------------


@pytest.mark.parametrize(
    ("question", "answer", "expected"),
    [
        (
            "Is this a T1 weighted or T2 weighted MRI?",
            "T2 weighted",
            ["T2 weighted", "T1 weighted"],
        ),
        (
            "Is this a T1 weighted or T2 weighted MRI?",
            "T1 weighted",
            ["T1 weighted", "T2 weighted"],
        ),
        ("Is this a T1 weighted or T2 weighted MRI?", "T2", ["T2", "T1"]),
        ("Is this a T1 weighted or T2 weighted MRI?", "T1", ["T1", "T2"]),
        ("Is this an MRI or a CT scan?", "CT", ["CT", "MRI"]),
        ("Is this an MRI or a CT scan?", "MRI", ["MRI", "CT"]),
        ("Is this an MRI or a CT scan?", "CT scan", ["CT scan", "MRI"]),
        ("Is the lesion on the left or the right side?", "right", ["right", "left"]),
        # behaviours kept
        ("Is this a CT or MRI?", "MRI", ["MRI", "CT"]),
        ("Is this a CT or MRI?", "ct", ["ct", "MRI"]),
        ("Which is bigger, liver or spleen?", "Liver", ["Liver", "spleen"]),
        ("Is the mass solid or cystic?", "cystic", ["cystic", "solid"]),
        (
            "Is it in the left upper lobe or right lower lobe?",
            "left upper lobe",
            ["left upper lobe", "right lower lobe"],
        ),
        ("Is this a CT or MRI?", "PET", None),  # the answer is on neither side
        ("Is there a mass?", "mass", None),  # no " or "
        ("Is this a CT or CT?", "CT", None),  # one option twice
    ],
)
def test_or_options(question, answer, expected) -> None:
    assert or_options(question, answer) == expected


def test_a_full_reply_selects_one_or_candidate() -> None:
    """The candidates are what a closed reply is matched against: naming the option in full
    ("T2 weighted") must select the answer, not two candidates."""
    cands = closed_candidates("Is this a T1 weighted or T2 weighted MRI?", "T2")
    assert closed_choice("T2 weighted", cands) == "T2"
    assert closed_choice("It is a T1 weighted image", cands) == "T1"
    cands = closed_candidates("Is this an MRI or a CT scan?", "CT")
    assert closed_choice("a CT scan", cands) == "CT"
    assert closed_choice("MRI", cands) == "MRI"
