"""Tests for per-sample VQA metrics and split-level scoring."""

from __future__ import annotations

import math
import random
import time

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torchmetrics.functional.text import bleu_score

from medvqa.data.answers import closed_choice, closed_correct, normalize_answer
from medvqa.scoring.metrics.traditional import (
    EMPTY_REFS,
    OPEN_METRICS,
    TraditionalMetric,
    bleu1,
    exact_match,
    per_sample_scores,
    ref_word_precision,
    score_predictions,
    token_f1,
    token_precision,
    token_recall,
)

# --------------------------------------------------------------------------------------------
# Normalisation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("The Liver.", "liver"),
        ("  Two  lesions ", "2 lesions"),
        ("X-ray", "x ray"),
        ("x ray", "x ray"),
        ("2.5 cm", "2.5 cm"),
        ("It is 5.", "it is 5"),
        ("1,000 ml", "1000 ml"),
        ("Yes, there is a mass!", "yes there is mass"),
        ("patient's left lung", "patients left lung"),
        ("T2-weighted MRI", "t2 weighted mri"),
        ("zero ten twenty", "0 10 20"),
        ("An apple", "apple"),
        ("the", ""),
        ("", ""),
        (None, ""),
        (float("nan"), ""),
    ],
)
def test_normalize_answer_examples(raw: str, expected: str) -> None:
    assert normalize_answer(raw) == expected


@given(st.text())
def test_normalize_idempotent(text: str) -> None:
    once = normalize_answer(text)
    assert normalize_answer(once) == once


@given(st.text(alphabet="abcXY019 .,-'!?_theanwotz", max_size=40))
def test_normalize_idempotent_on_tricky_alphabet(text: str) -> None:
    once = normalize_answer(text)
    assert normalize_answer(once) == once
    assert "  " not in once
    assert once == once.strip()


# --------------------------------------------------------------------------------------------
# Known answer: SURE-VQA paper, Fig. 4
# --------------------------------------------------------------------------------------------

FIG4_GT = "Fracture of the fifth metacarpal bone of left hand."
FIG4_PRED = "Fracture of the base of the first metacarpal bone of the right hand."


def test_sure_vqa_fig4_known_values() -> None:
    assert len(normalize_answer(FIG4_PRED).split()) == 10
    assert len(normalize_answer(FIG4_GT).split()) == 8
    assert round(bleu1(FIG4_PRED, FIG4_GT), 2) == 0.60
    assert round(ref_word_precision(FIG4_PRED, FIG4_GT), 2) == 0.50
    assert round(token_f1(FIG4_PRED, FIG4_GT), 2) == 0.74
    assert round(token_precision(FIG4_PRED, FIG4_GT), 2) == 0.70
    assert round(token_recall(FIG4_PRED, FIG4_GT), 2) == 0.78
    assert token_precision(FIG4_PRED, FIG4_GT) == pytest.approx(7 / 10)
    assert token_recall(FIG4_PRED, FIG4_GT) == pytest.approx(7 / 9)
    assert exact_match(FIG4_PRED, FIG4_GT) == 0.0


def test_fig4_bleu_matches_torchmetrics() -> None:
    p, r = normalize_answer(FIG4_PRED), normalize_answer(FIG4_GT)
    tm = float(bleu_score(preds=[p], target=[[r]], n_gram=1))
    assert bleu1(FIG4_PRED, FIG4_GT) == pytest.approx(tm, abs=1e-6)


def test_open_metrics_edge_cases() -> None:
    for name, fn in OPEN_METRICS.items():
        assert fn("", "liver") == 0.0, name
        assert fn("lung", "liver") == 0.0, name
    assert bleu1("liver", "liver of patient") == pytest.approx(math.exp(1 - 3))
    # recall counts tp on prediction counts, as LLaVA-Med does, so it can exceed naive recall
    assert token_recall("of of of", "of liver") == pytest.approx(3 / 4)
    assert ref_word_precision("liver liver", "liver") == 0.5
    assert exact_match("The Liver!", "liver") == 1.0


def test_open_metric_registry_names() -> None:
    assert set(OPEN_METRICS) == {
        "bleu1",
        "ref_word_precision",
        "f1",
        "precision",
        "recall",
        "exact_match",
    }


def _random_sentence(rng: random.Random) -> str:
    vocab = ["liver", "lung", "the", "of", "left", "right", "two", "mass", "ct", "x-ray", "2.5"]
    return " ".join(rng.choice(vocab) for _ in range(rng.randint(0, 8)))


def test_bleu1_equals_torchmetrics_on_random_pairs() -> None:
    rng = random.Random(0)
    for _ in range(300):
        pred, ref = _random_sentence(rng), _random_sentence(rng)
        p, r = normalize_answer(pred), normalize_answer(ref)
        tm = float(bleu_score(preds=[p], target=[[r]], n_gram=1))
        assert bleu1(pred, ref) == pytest.approx(tm, abs=1e-6), (pred, ref)


# --------------------------------------------------------------------------------------------
# Property tests on open metrics
# --------------------------------------------------------------------------------------------

words = st.sampled_from(["liver", "lung", "the", "a", "of", "two", "2", "left", "x-ray", "ct"])
sentences = st.lists(words, max_size=8).map(" ".join)


@given(sentences, sentences)
def test_open_scores_in_unit_interval(pred: str, ref: str) -> None:
    for name, fn in OPEN_METRICS.items():
        v = fn(pred, ref)
        assert 0.0 <= v <= 1.0 + 1e-12, (name, pred, ref, v)


@given(st.text(max_size=30), st.text(max_size=30))
def test_open_scores_in_unit_interval_any_text(pred: str, ref: str) -> None:
    for fn in OPEN_METRICS.values():
        assert 0.0 <= fn(pred, ref) <= 1.0 + 1e-12


@given(st.one_of(sentences, st.text(max_size=30)))
def test_identity_scores_one(text: str) -> None:
    toks = normalize_answer(text).split()
    if not toks:
        return
    for name, fn in OPEN_METRICS.items():
        if name == "ref_word_precision":
            # LLaVA-Med counts DISTINCT reference words over ALL prediction tokens, so a
            # repeated word keeps even a perfect answer below 1 ("liver liver" -> 0.5).
            assert fn(text, text) == pytest.approx(len(set(toks)) / len(toks)), text
        else:
            assert fn(text, text) == pytest.approx(1.0), (name, text)


# --------------------------------------------------------------------------------------------
# Closed questions
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pred", "cands", "expected"),
    [
        ("yes", ["yes", "no"], "yes"),
        ("Yes.", ["yes", "no"], "yes"),
        ("yes, there is", ["yes", "no"], "yes"),
        ("There is no fracture", ["yes", "no"], "no"),
        ("yes or no", ["yes", "no"], None),
        ("maybe", ["yes", "no"], None),
        ("", ["yes", "no"], None),
        ("nothing", ["yes", "no"], None),  # whole words only: "no" is not in "nothing"
        ("CT", ["CT", "MRI"], "CT"),
        ("It is an MRI scan", ["CT", "MRI"], "MRI"),
        ("the left lung", ["left", "left lung", "right lung"], "left lung"),
        ("left", ["left", "left lung"], "left"),
        ("X-ray", ["X-Ray", "CT"], "X-Ray"),
        ("yes", ["Yes", "yes."], None),  # indistinguishable candidates are ambiguous
        ("yes", [], None),
    ],
)
def test_closed_choice_examples(pred: str, cands: list[str], expected: str | None) -> None:
    assert closed_choice(pred, cands) == expected


def test_closed_correct() -> None:
    assert closed_correct("Yes, it is.", "yes", ["yes", "no"]) == 1.0
    assert closed_correct("no", "yes", ["yes", "no"]) == 0.0
    assert closed_correct("yes or no", "yes", ["yes", "no"]) == 0.0


@given(
    st.text(max_size=30),
    st.lists(st.one_of(st.text(max_size=10), st.sampled_from(["yes", "no", "ct"])), max_size=5),
)
def test_closed_choice_is_candidate_or_none(pred: str, cands: list[str]) -> None:
    ch = closed_choice(pred, cands)
    assert ch is None or ch in cands


@given(st.sampled_from(["yes", "no", "CT", "MRI", "left lung", "X-ray"]))
def test_closed_choice_selects_exact_candidate(answer: str) -> None:
    cands = ["yes", "no", "CT", "MRI", "left lung", "X-ray"]
    assert closed_choice(answer, cands) == answer


# --------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------


def _table() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "id": ["a", "b", "c", "d", "e"],
            "prediction": ["yes", "yes or no", "liver", "lung of the left", None],
            "answer": ["yes", "no", "Liver", "left lung", "kidney"],
            "answer_type": ["closed", "closed", "open", "open", "open"],
            "candidates": [["yes", "no"], ["yes", "no"], None, None, None],
            "modality": ["CT", "MRI", "CT", "MRI", "MRI"],
        }
    )


def test_per_sample_scores_columns() -> None:
    df = _table()
    out = per_sample_scores(df)
    assert list(out["id"]) == list(df["id"])
    for m in OPEN_METRICS:
        col = out[f"open_{m}"]
        assert col[df["answer_type"] == "closed"].isna().all()
        assert col[df["answer_type"] == "open"].notna().all()
    assert out["closed_choice"].tolist()[:2] == ["yes", None]
    assert out.loc[df["answer_type"] == "open", "closed_correct"].isna().all()
    assert out["closed_correct"].tolist()[:2] == [1.0, 0.0]
    assert "open_f1" not in df.columns  # input not mutated


def test_score_predictions_values_and_breakdown() -> None:
    s = score_predictions(_table(), breakdown=["modality"])
    assert s["closed_acc"] == 0.5
    assert s["closed_invalid_rate"] == 0.5
    assert s["n"] == 5 and s["n_open"] == 3 and s["n_closed"] == 2
    assert s["open_exact_match"] == pytest.approx(1 / 3)
    # "lung of the left" vs "left lung": tokens lung, of, left vs left, lung -> P 2/3, R 1
    assert s["open_f1"] == pytest.approx((1.0 + 0.8 + 0.0) / 3)
    assert s["modality=CT/closed_acc"] == 1.0
    assert s["modality=MRI/closed_acc"] == 0.0
    assert s["modality=CT/open_exact_match"] == 1.0
    assert s["modality=CT/n"] == 2 and s["modality=MRI/n"] == 3
    assert set(s) >= {f"open_{m}" for m in OPEN_METRICS}


def test_score_predictions_empty_groups_are_nan() -> None:
    df = _table()
    s = score_predictions(df[df["answer_type"] == "open"], breakdown=["modality"])
    assert math.isnan(s["closed_acc"]) and math.isnan(s["closed_invalid_rate"])
    assert math.isnan(s["modality=CT/closed_acc"])
    s = score_predictions(df.iloc[:0])
    assert s["n"] == 0 and math.isnan(s["open_f1"])


def test_score_predictions_subset_and_errors() -> None:
    s = score_predictions(_table(), open_metrics=["f1"])
    assert "open_f1" in s and "open_bleu1" not in s
    with pytest.raises(ValueError, match="unknown open metric"):
        score_predictions(_table(), open_metrics=["rouge"])
    with pytest.raises(ValueError, match="breakdown field"):
        score_predictions(_table(), breakdown=["sex"])


def test_closed_rows_without_candidates_are_invalid() -> None:
    df = _table()
    df.at[0, "candidates"] = None
    s = score_predictions(df)
    assert s["closed_acc"] == 0.0 and s["closed_invalid_rate"] == 1.0


def test_numpy_array_candidates() -> None:
    df = _table()
    df["candidates"] = [np.array(["yes", "no"]), np.array(["yes", "no"]), None, None, None]
    assert score_predictions(df)["closed_acc"] == 0.5


def _synthetic(n: int, seed: int = 0) -> pd.DataFrame:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        if rng.random() < 0.5:
            ans = rng.choice(["yes", "no"])
            pred = rng.choice(["yes", "no", "Yes, there is.", "There is no mass", "yes or no"])
            rows.append((f"r{i}", pred, ans, "closed", ["yes", "no"]))
        else:
            rows.append((f"r{i}", _random_sentence(rng), _random_sentence(rng), "open", None))
    df = pd.DataFrame(rows, columns=["id", "prediction", "answer", "answer_type", "candidates"])
    df["modality"] = [rng.choice(["CT", "MRI", "X-Ray"]) for _ in range(n)]
    return df


@pytest.mark.heavy
def test_score_predictions_fast_on_20k_rows() -> None:
    df = _synthetic(20_000)
    t0 = time.perf_counter()
    s = score_predictions(df, breakdown=["modality"])
    elapsed = time.perf_counter() - t0
    assert s["n"] == 20_000
    assert elapsed < 5.0, f"score_predictions took {elapsed:.2f}s on 20k rows"


@pytest.mark.heavy
@settings(max_examples=25, deadline=None)
@given(st.integers(min_value=0, max_value=10_000))
def test_aggregate_scores_in_unit_interval(seed: int) -> None:
    s = score_predictions(_synthetic(40, seed), breakdown=["modality"])
    for k, v in s.items():
        if k.endswith("n") or k.startswith("n_") or math.isnan(v):
            continue
        assert 0.0 <= v <= 1.0, k


def test_empty_reference_rows_are_scored_and_stay_in_the_means() -> None:
    # SLAKE's release has an English OPEN question whose answer is ""; SURE-VQA scores it
    # (every token score 0: no reference word to find) and divides by all open questions.
    df = pd.DataFrame(
        {
            "prediction": ["liver", "liver", "", "yes"],
            "answer": ["liver", "", "", "yes"],
            "answer_type": ["open", "open", "open", "closed"],
            "candidates": [None, None, None, ["yes", "no"]],
        }
    )
    out = per_sample_scores(df)
    for m in ("bleu1", "ref_word_precision", "f1", "precision", "recall"):
        assert out[f"open_{m}"].tolist()[:3] == [1.0, 0.0, 0.0], m
    # Exact match is string equality: "" == "" holds, "liver" == "" does not.
    assert out["open_exact_match"].tolist()[:3] == [1.0, 0.0, 1.0]
    family = TraditionalMetric()
    agg = family.aggregate(out)
    assert agg["open_f1"] == pytest.approx(1 / 3)
    assert agg["open_bleu1"] == pytest.approx(1 / 3)
    assert agg["open_exact_match"] == pytest.approx(2 / 3)
    assert agg[EMPTY_REFS] == 2
    assert agg["closed_acc"] == 1.0
    # The count is not a performance: no robustness ratio is computed for it.
    assert not family.score_info(f"test_ood/{EMPTY_REFS}").performance
    assert score_predictions(df)[EMPTY_REFS] == 2


def test_chinese_yes_no_answers_get_their_own_answer_space(caplog: pytest.LogCaptureFixture):
    """SLAKE's zh half (lmms-eval's slake_zh): answer 是, reply 是的。 used to get the candidates
    ['是', 'not 是'] and score 0 silently. The space is 是 / 否 (the answer's own word on its
    side), a reply's side read from lmms-eval's synonym lists; a non-English answer with no
    answer space rule is warned about."""
    from medvqa.data.questions import closed_candidates
    from medvqa.scoring.metrics.traditional import per_sample_scores

    assert closed_candidates("图像正常吗?", "是") == ["是", "否"]
    assert closed_candidates("有病变吗?", "没有") == ["是", "没有"]
    assert closed_candidates("有病变吗?", "有") == ["有", "否"]
    for reply, side in (
        ("是的。", "是"),
        ("是的，图像正常。", "是"),
        ("不是", "否"),
        ("没有，图像异常", "否"),
        ("yes", "是"),
        ("我不确定", None),
    ):
        assert closed_choice(reply, ["是", "否"]) == side, reply
    rows = pd.DataFrame(
        {
            "answer_type": ["closed"] * 4,
            "answer": ["是", "否", "有", "是"],
            "prediction": ["是的。", "不是", "有的", "否"],
        }
    )
    rows["candidates"] = [closed_candidates("q", a) for a in rows["answer"]]
    assert per_sample_scores(rows)["closed_correct"].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert closed_choice("yes, there is", ["yes", "no"]) == "yes"  # English unchanged
    with caplog.at_level("WARNING"):
        assert closed_candidates("图中显示的是哪个器官?", "肺") == ["肺", "not 肺"]
    assert "'肺' is not a yes/no answer medvqa knows in its language" in caplog.text
