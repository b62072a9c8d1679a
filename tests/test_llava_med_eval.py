"""metric=llava_med_eval: LLaVA-Med v1.0's run_eval.py, row for row and figure for figure.

The fixtures are what LLaVA-Med's own code reads and writes: a conversation-format `test.json`
(`id`, `conversations`, `answer_type` OPEN/CLOSED), its `train_open_answers.json` candidate
file (`{"0": [...]}`), and the answers file of its `model_vqa_med.py` (tests/peers/llava.py).
run_eval.py itself (tests/peers/llava_med_eval.py, copied at v1.0.0) scores them, and
`medvqa-score answers.jsonl --questions test.json 'metric=[llava_med_eval]'` must give the same
numbers exactly (==, not approximately), per row and per figure.
"""

from __future__ import annotations

import json
import logging
import math
import warnings
from pathlib import Path

import pandas as pd
import pytest
from tabulate import tabulate

from medvqa.cli.score import main
from medvqa.errors import ConfigError
from medvqa.scoring.metrics.llava_med_eval import (
    LlavaMedEval,
    closed_hit,
    exact_match,
    f1_precision_recall,
    left_to_right_mean,
    normalize_word,
    read_candidates,
)
from medvqa.scoring.pipeline import Scoring, build_families
from tests.conftest import compose
from tests.peers import llava, llava_med_eval

# (id, question, ground truth, answer_type, the model's reply): every quirk of run_eval.py.
ROWS = [
    # CLOSED: a substring test on the normalised reply.
    (1, "Is there a fracture?", "Yes", "CLOSED", "Yes, there is a fracture."),
    (2, "Is the lung normal?", "no", "CLOSED", "The lung is normal."),  # "no" in "normal"
    (3, "Is there a mass?", "no", "CLOSED", "Nodules are seen."),  # "no" in "nodules"
    (4, "Is this a CT or an MRI?", "CT", "CLOSED", "CT"),  # right, not yes/no: no credit
    (5, "Is the mass on the left or right?", "left", "CLOSED", "left, not right"),  # "no"t
    (6, "Is there edema?", "yes", "CLOSED", "yes or no"),  # a hedge is credited
    (7, "Is there air?", "yes", "CLOSED", ""),  # an empty reply
    (8, "Is the heart enlarged?", "No", "CLOSED", "NO."),  # case
    # OPEN: tokens keep the punctuation normalize_word leaves (* ' : %).
    (9, "Where is the lesion?", "left lobe", "OPEN", "In the left lobe."),
    (10, "Which sequence?", "t2-weighted", "OPEN", "T2*-weighted MRI"),
    (11, "Which side?", "patient's right", "OPEN", "the patients right side"),
    (12, "How large is it?", "5 cm", "OPEN", "size: 5 cm"),
    (13, "What is enlarged?", "liver", "OPEN", "liver liver"),  # "exact match" 0.5
    (14, "What organ?", "left lobe", "OPEN", ""),  # empty: the first candidate, a hit
    (15, "How many nodules?", "two", "OPEN", "2 nodules"),  # number words as digits
    (16, "What is seen?", "none", "OPEN", "0"),  # "none" is "0"
    (17, "Is it visible?", "can't tell", "OPEN", "cant tell"),  # the contraction table
    (18, "How much fluid?", "1,000 ml", "OPEN", "1000 ml (estimate)"),
    (19, "Which organ?", "liver", "OPEN", "liver" + "." * 40),  # 32 periods a call
    (20, "Where?", "fifth metacarpal", "OPEN", "fracture of the fifth metacarpal bone"),
    (21, "What percentage?", "50%", "OPEN", "about 50 %"),
    (22, "What is shown?", "fracture of the fifth metacarpal bone of left hand", "OPEN",
     "Fracture of the base of the first metacarpal bone of the right hand."),
]  # fmt: skip
# LLaVA-Med's train_open_answers.json: the first answer is what an empty reply maps to; an
# integer is written as text.
CANDIDATES = ["left lobe", "right lobe", "liver", "5 cm", 2, "spleen", "t2 weighted", "0"]
# run_eval.py's printed rows -> this family's scores.
FIGURES = {
    "exact match score": "llava_med_eval_open_exact_match",
    "f1 score": "llava_med_eval_open_f1",
    "precision": "llava_med_eval_open_precision",
    "recall": "llava_med_eval_open_recall",
    "bleu_score": "llava_med_eval_open_bleu",
    "bleu_score_1": "llava_med_eval_open_bleu_1",
    "bleu_score_2": "llava_med_eval_open_bleu_2",
    "bleu_score_3": "llava_med_eval_open_bleu_3",
    "open accuracy": "llava_med_eval_open_acc",
    "yes/no accuracy": "llava_med_eval_closed_acc",
}
# run_eval.py's per-row lists -> this family's per-sample columns.
ROW_LISTS = {
    ("exact", "hit"): "llava_med_eval_open_exact_match",
    ("f1", "f1"): "llava_med_eval_open_f1",
    ("f1", "precision"): "llava_med_eval_open_precision",
    ("f1", "recall"): "llava_med_eval_open_recall",
    ("bleu", "bleu_score"): "llava_med_eval_open_bleu",
    ("bleu", "bleu_score_1"): "llava_med_eval_open_bleu_1",
    ("bleu", "bleu_score_2"): "llava_med_eval_open_bleu_2",
    ("bleu", "bleu_score_3"): "llava_med_eval_open_bleu_3",
    ("open_hit", "hit"): "llava_med_eval_open_hit",
    ("closed", "hit"): "llava_med_eval_closed_hit",
}


def write_llava_med(folder: Path, rows: list = ROWS) -> tuple[Path, Path, Path]:
    """test.json, train_open_answers.json and the answers model_vqa_med.py writes for them."""
    folder.mkdir(parents=True, exist_ok=True)
    questions = llava.med_v1_test_json(folder / "test.json", [row[:4] for row in rows])
    candidates = folder / "train_open_answers.json"
    candidates.write_text(json.dumps({"0": CANDIDATES}))
    replies = {qid: reply for qid, *_, reply in rows}
    answers = llava.model_vqa_med_v1(
        questions, folder / "answers" / "test-answer-file.jsonl", replies
    )
    return questions, candidates, answers


def medvqa_score(out: Path, answers: Path, questions: Path, *overrides: str) -> dict:
    assert main([str(answers), "--questions", str(questions), "--out", str(out),
                 "metric=[llava_med_eval]", *overrides]) == 0  # fmt: skip
    return json.loads((out / "results.json").read_text())["metrics"]


def python310_sum(values: list, start: float = 0) -> float:
    """The builtin `sum` of Python 3.10 and 3.11 on numbers: each added in turn."""
    total = start
    for value in values:
        total = total + value
    return total


@pytest.fixture(scope="module")
def peer_and_medvqa(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    folder = tmp_path_factory.mktemp("vqa_rad")
    questions, candidates, answers = write_llava_med(folder)
    # run_eval.py ran on Python 3.10, whose `sum` adds left to right (3.12's compensates)
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(llava_med_eval, "sum", python310_sum, raising=False)
    with warnings.catch_warnings():  # as run_eval.py silences NLTK's (its line 12)
        warnings.simplefilter("ignore")
        peer = llava_med_eval.run_eval(questions, candidates, answers)
    monkeypatch.undo()
    cand = f"metric.llava_med_eval.candidate_file={candidates}"
    metrics = medvqa_score(folder / "scored", answers, questions, cand)
    scored = pd.read_parquet(folder / "scored" / "scores.parquet")
    return peer, metrics, scored, folder


def test_every_figure_is_run_evals_own(peer_and_medvqa: tuple) -> None:
    (table, figures, _), metrics, _, _ = peer_and_medvqa
    for label, score in FIGURES.items():
        assert metrics[f"all/{score}"] == figures[label], (label, score)
    # What the script prints: the same table from medvqa's figures, times 100.
    mine = tabulate(
        [[label, metrics[f"all/{score}"] * 100] for label, score in FIGURES.items()],
        headers=["Metric", "Performance"],
    )
    assert mine == table
    # Its counts, the other way round from their names (run_eval.py line 113).
    assert (figures["num_open"], figures["num_close"]) == (8, 14)
    assert (metrics["all/n_closed"], metrics["all/n_open"]) == (8, 14)


def test_the_summary_shows_the_papers_figures(peer_and_medvqa: tuple) -> None:
    """`metric=[llava_med_eval]` alone: summary.md holds its yes/no accuracy and open recall
    (the paper's table), not the token metrics nobody selected."""
    _, metrics, _, folder = peer_and_medvqa
    summary = (folder / "scored" / "summary.md").read_text()
    for score in ("llava_med_eval_closed_acc", "llava_med_eval_open_recall"):
        assert score in summary and f"{metrics[f'all/{score}']:.3f}" in summary
    assert "open_f1 " not in summary and "nan" not in summary


def test_every_row_is_run_evals_own(peer_and_medvqa: tuple) -> None:
    (_, _, rows), _, scored, _ = peer_and_medvqa
    by_id = scored.set_index("id")
    for (group, key), column in ROW_LISTS.items():
        ids = [str(q) for q in rows[group]["q_id"]]
        assert ids, group
        assert by_id.loc[ids, column].tolist() == rows[group][key], column
        others = by_id.drop(index=ids)[column]
        assert others.isna().all(), f"{column} scored rows run_eval.py does not"


def test_the_quirks_are_in_the_figures(peer_and_medvqa: tuple) -> None:
    """The fixture's rows do what docs/metrics.md says, so the equality above is not vacuous."""
    _, _, scored, _ = peer_and_medvqa
    row = scored.set_index("id")
    hit = row["llava_med_eval_closed_hit"]
    # "no" inside "normal"/"nodules", "not"; the hedge; case: credited. CT, empty: not.
    assert hit[["1", "2", "3", "5", "6", "8"]].tolist() == [1.0] * 6
    assert hit[["4", "7"]].tolist() == [0.0, 0.0]
    # "liver liver" is half an "exact match"; an empty reply maps to the first candidate.
    assert row.loc["13", "llava_med_eval_open_exact_match"] == 0.5
    assert row.loc["14", "llava_med_eval_open_hit"] == 1.0
    assert row.loc["14", "llava_med_eval_open_f1"] == 0.0
    # `*` and `:` stay in the tokens: "t2* weighted mri" shares only "weighted".
    assert row.loc["10", "llava_med_eval_open_recall"] == 0.5
    assert row.loc["12", "llava_med_eval_open_precision"] == 2 / 3
    # 40 periods: the token scores normalise twice (64 go), BLEU once (8 stay).
    assert row.loc["19", "llava_med_eval_open_f1"] == 1.0
    assert row.loc["19", "llava_med_eval_open_bleu_1"] == 0.0


def test_normalize_word_by_hand() -> None:
    assert normalize_word("t2*-weighted mri") == "t2* weighted mri"
    assert normalize_word("size: 5 cm") == "size: 5 cm"
    assert normalize_word("the patient's right") == "patient's right"
    assert normalize_word("cant tell") == "can't tell"
    assert normalize_word("none of the two") == "0 of 2"
    # a mark beside a space is deleted, else made a space; a digit comma digit deletes all
    assert normalize_word("left ( upper ) lobe") == "left upper lobe"
    assert normalize_word("left(upper)lobe") == "left upper lobe"
    assert normalize_word("1,000 ml (left)") == "1000 ml left"
    # periods: only 32 per call, and not before a digit
    assert normalize_word("liver" + "." * 40) == "liver" + "." * 8
    assert normalize_word("2.5 cm.") == "2.5 cm"


def test_scores_by_hand() -> None:
    assert closed_hit("normal", "no") == 1.0
    assert closed_hit("ct", "ct") == 0.0
    assert closed_hit("ct, not mri", "ct") == 1.0
    assert closed_hit("", "yes") == 0.0
    assert exact_match("liver liver", "liver") == 0.5
    assert exact_match("", "liver") == 0.0
    assert f1_precision_recall("left lower lobe", "left lobe") == (0.8, 2 / 3, 1.0)
    assert f1_precision_recall("spleen", "liver") == (0.0, 0.0, 0.0)
    assert f1_precision_recall("liver", "the") == (0.0, 0.0, 0.0)  # the truth has no token
    # added left to right as Python 3.10's sum: ten 0.1s are 0.9999999999999999, not 1.0
    assert left_to_right_mean([0.1] * 10) == 0.9999999999999999 / 10 != math.fsum([0.1] * 10) / 10


def test_without_a_candidate_file_there_is_no_open_accuracy(tmp_path: Path) -> None:
    questions, _, answers = write_llava_med(tmp_path / "vqa_rad")
    metrics = medvqa_score(tmp_path / "scored", answers, questions)
    assert "all/llava_med_eval_open_acc" not in metrics
    assert metrics["all/llava_med_eval_closed_acc"] == 6 / 8
    assert not math.isnan(metrics["all/llava_med_eval_open_f1"])


def test_no_rows_of_a_kind_is_nan_not_zero() -> None:
    """run_eval.py prints 0 for "yes/no accuracy" without closed rows (line 111) and divides
    by zero without open rows (line 100); here both are NaN, as every score over no rows."""
    family = LlavaMedEval()
    closed = pd.DataFrame(
        {"prediction": ["yes"], "answer": ["yes"], "answer_type": ["closed"], "id": ["a"]}
    )
    scores = family.aggregate(closed.join(family.per_sample(closed)))
    assert scores["llava_med_eval_closed_acc"] == 1.0
    assert math.isnan(scores["llava_med_eval_open_f1"])
    open_ = closed.assign(answer_type="open")
    scores = family.aggregate(open_.join(family.per_sample(open_)))
    assert math.isnan(scores["llava_med_eval_closed_acc"])
    assert scores["llava_med_eval_open_f1"] == 1.0


def test_a_missing_reply_or_a_third_answer_type_is_refused() -> None:
    family = LlavaMedEval()
    frame = pd.DataFrame(
        {"prediction": [None], "answer": ["yes"], "answer_type": ["closed"], "id": ["q7"]}
    )
    with pytest.raises(ValueError, match=r"row 0 \(id 'q7'\) has no prediction"):
        family.per_sample(frame)
    with pytest.raises(ValueError, match="answer_type 'other'"):
        family.per_sample(frame.assign(prediction="yes", answer_type="other"))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        ("{not json", "not JSON"),
        (json.dumps(["liver"]), 'no non-empty list under key "0"'),
        (json.dumps({"0": []}), 'no non-empty list under key "0"'),
        (json.dumps({"0": ["liver", 2.5]}), "answer 1 is 2.5"),
    ],
)
def test_a_bad_candidate_file_is_refused_before_anything_is_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: str | None, message: str
) -> None:
    questions, _, answers = write_llava_med(tmp_path / "vqa_rad", ROWS[:2])
    bad = tmp_path / "candidates.json"
    if content is not None:
        bad.write_text(content)
    with pytest.raises(ConfigError, match=message):
        read_candidates(bad, "metric.llava_med_eval.candidate_file")
    out = tmp_path / "scored"
    caplog.set_level(logging.ERROR)
    args = [str(answers), "--questions", str(questions), "--out", str(out)]
    assert main([*args, "metric=[llava_med_eval]", f"metric.llava_med_eval.candidate_file={bad}"]) == 2  # fmt: skip
    assert "metric.llava_med_eval.candidate_file" in caplog.text and message in caplog.text
    assert "Traceback" not in caplog.text
    assert not out.exists()


@pytest.mark.heavy
def test_in_a_run_with_splits_breakdowns_intervals_and_robustness() -> None:
    """The family as run.py scores with it: beside `traditional`, per split and per breakdown
    value, with bootstrap intervals and relative robustness on its scores."""
    rows = [(str(q), qu, a, t.lower(), r) for q, qu, a, t, r in ROWS]
    frame = pd.DataFrame(rows, columns=["id", "question", "answer", "answer_type", "prediction"])
    options = {"4": ["ct", "mri"], "5": ["left", "right"]}  # the closed rows that are not yes/no
    frame["candidates"] = [
        (options.get(i, ["yes", "no"]) if t == "closed" else None)
        for i, t in zip(frame.id, frame.answer_type, strict=True)
    ]
    frame["case_id"] = frame["id"]
    frame["modality"] = ["CT", "MRI"] * (len(frame) // 2)
    ood = frame.assign(prediction=frame.prediction.str.upper().where(frame.id != "2", "yes"))
    cfg = compose(["metric=[traditional,llava_med_eval]", "evaluation.breakdown=[modality]",
                   "evaluation.bootstrap.samples=50",
                   "evaluation.primary_closed=llava_med_eval_closed_acc",
                   "evaluation.primary_open=llava_med_eval_open_recall"], Path("."))  # fmt: skip
    with Scoring(build_families(cfg.metric), cfg.evaluation) as scoring:
        results, scored = scoring.score({"test_iid": frame, "test_ood": ood})
    assert results["test_iid/llava_med_eval_closed_acc"] == 6 / 8
    assert results["test_ood/llava_med_eval_closed_acc"] == 5 / 8  # "yes" for "no"
    assert "robustness/rr_llava_med_eval_closed_acc" in results
    assert "test_iid/modality=CT/llava_med_eval_open_f1" in results
    # its scores as the headline: intervals from their per-row values
    assert "test_iid/llava_med_eval_open_recall_ci_lo" in results
    assert "test_ood/llava_med_eval_closed_acc_ci_hi" in results
    assert "closed_acc" in {k.rsplit("/", 1)[-1] for k in results}  # traditional's beside it
    assert "llava_med_eval_closed_hit" in scored.columns
