"""medvqa-score on the files VLMEvalKit and LLaVA/LLaVA-Med write (by their own writer code,
tests/peers/), on Excel and Parquet tables, and on binary files of unsupported formats."""

from __future__ import annotations

import io
import json
import logging
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from medvqa.cli.score import main
from medvqa.peers.readers import ScoreInputError, read
from tests.peers import llava, vlmevalkit


def score(out: Path, predictions: Path, *args: str) -> dict:
    assert main([str(predictions), "--out", str(out), *args]) == 0
    return json.loads((out / "results.json").read_text())


def refused(path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, *args: str) -> str:
    """The message of a file medvqa-score refuses with exit status 2."""
    caplog.clear()
    assert main([str(path), "--out", str(tmp_path / "refused"), *args]) == 2
    assert "Traceback" not in caplog.text
    return caplog.text


# -- VLMEvalKit ---------------------------------------------------------------------------------

IMAGE = "iVBORw0KGgo" + "A" * 120  # a base64 image cell (VLMEvalKit keeps > 64 characters)
# A medical MCQ dataset TSV as VLMEvalKit hosts them (GMAI-MMBench's columns): 2 to 4 options,
# NaN where a row has fewer, the key a letter, a hint on some rows, MMBench's `split`.
MCQ = [
    (1001, "Which modality is this image?", None, ["CT", "MRI", "X-ray", "Ultrasound"], "B"),
    (1002, "What abnormality is shown?", "Chest radiograph.", ["Edema", "Pneumothorax", "Effusion"], "C"),
    (1003, "Is the heart enlarged?", None, ["Yes", "No"], "A"),
    (1004, "Which organ is affected?", None, ["Liver", "Spleen", "Kidney", "Pancreas"], "D"),
    (1005, "Which sequence is this?", None, ["T1", "T2", "FLAIR"], "B"),
    (1006, "Which finding is shown?", None, ["Mass", "Nodule"], "A"),
]  # fmt: skip
# Easy replies: VLMEvalKit's exact matching and medvqa's mcq family read them alike.
MCQ_REPLIES = {
    1001: "B",
    1002: "The answer is C.",
    1003: "Yes",
    1004: "(A) Liver",  # valid, wrong
    1005: "I cannot tell from this image.",  # neither reads an option
    1006: "**A**",
}


def _mcq_dataset(tmp_path: Path) -> Path:
    rows = [
        {
            "index": index,
            "question": question,
            "hint": hint,
            **{letter: option for letter, option in zip("ABCD", options, strict=False)},
            "answer": key,
            "category": "radiology",
            "l2-category": "diagnosis" if index % 2 else "perception",
            "split": "dev",
            "image": IMAGE,
        }
        for index, question, hint, options, key in MCQ
    ]
    path = tmp_path / "GMAI-MMBench_VAL.tsv"
    pd.DataFrame(rows, columns=[*rows[0], "C", "D"]).to_csv(path, sep="\t", index=False)
    return path


@pytest.fixture
def mcq_files(tmp_path: Path) -> dict[str, Path]:
    """The prediction file of each PRED_FORMAT (xlsx is VLMEvalKit's default)."""
    pytest.importorskip("xlsxwriter")  # their dump_xlsx's engine (a dev dependency)
    dataset = _mcq_dataset(tmp_path)
    return {
        fmt: vlmevalkit.write_predictions(dataset, MCQ_REPLIES, tmp_path / fmt, fmt)
        for fmt in ("tsv", "xlsx", "json")
    }


def test_vlmevalkit_mcq_files_read_as_closed_questions_over_their_options(
    mcq_files: dict[str, Path],
) -> None:
    tsv = mcq_files["tsv"]
    written = pd.read_csv(tsv, sep="\t")  # what their writer left: NaN options, no image
    assert "image" not in written and written["index"].dtype == np.int64
    assert written["D"].isna().sum() == 4 and written["C"].isna().sum() == 2
    compared = ["id", "question", "answer", "candidates", "prediction", "answer_type"]
    frames = {}
    for fmt, path in mcq_files.items():
        frame, detected = read(path)
        assert detected == "vlmevalkit", fmt
        frames[fmt] = frame
    frame = frames["tsv"]
    assert frame["id"].tolist() == [str(i) for i, *_ in MCQ]
    assert frame["candidates"].tolist() == [options for *_, options, _ in MCQ]
    assert frame["answer"].tolist() == ["MRI", "Effusion", "Yes", "Pancreas", "T2", "Mass"]
    assert set(frame["answer_type"]) == {"closed"}
    assert frame["source_split"].tolist() == ["dev"] * 6  # MMBench's split is not medvqa's
    assert set(frame["split"]) == {"all"} and "image" not in frame and "A" not in frame
    assert frame["hint"].iloc[1] == "Chest radiograph."
    for fmt in ("xlsx", "json"):
        assert frames[fmt][compared].values.tolist() == frame[compared].values.tolist(), fmt


@pytest.mark.parametrize("fmt", ["tsv", "xlsx"])
def test_vlmevalkit_mcq_scores_as_vlmevalkit_exact_matching_does(
    fmt: str, mcq_files: dict[str, Path], tmp_path: Path
) -> None:
    """`metric=[mcq]` on their file: the strict accuracy (an unreadable reply is wrong) is
    VLMEvalKit's own exact-matching accuracy, row by row."""
    path = mcq_files[fmt]
    hits = vlmevalkit.exact_matching_hits(path, tmp_path / "GMAI-MMBench_VAL.tsv")
    assert sum(hits.values()) == 4  # B, C, Yes, **A** right; (A) Liver wrong; 1005 unread
    record = score(tmp_path / "scored", path, "metric=[mcq]", "evaluation.breakdown=[category]")
    assert record["choices"] == {"format": "vlmevalkit"}
    metrics = record["metrics"]
    assert metrics["all/mcq_n"] == 6
    assert metrics["all/mcq_acc_strict"] == pytest.approx(np.mean(list(hits.values())))
    assert metrics["all/mcq_invalid_rate"] == pytest.approx(1 / 6)
    assert metrics["all/mcq_acc"] == pytest.approx(4 / 5)
    scores = pd.read_parquet(tmp_path / "scored" / "scores.parquet")
    ours = dict(zip(scores["id"], scores["mcq_correct"].fillna(0.0), strict=True))
    assert ours == {str(index): float(hit) for index, hit in hits.items()}


def test_the_summary_follows_the_selected_families(
    mcq_files: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`metric=[mcq]` alone: the headline and summary are the MCQ accuracy, with no warning
    about the token metrics nobody asked for; the record says which headline it used."""
    caplog.set_level(logging.INFO, logger="medvqa.record")
    record = score(tmp_path / "scored", mcq_files["xlsx"], "metric=[mcq]")
    summary = (tmp_path / "scored" / "summary.md").read_text()
    assert "mcq_acc" in summary and "closed_acc" not in summary and "open_f1" not in summary
    assert "0.800" in summary and "nan" not in summary
    assert record["config"]["evaluation"]["primary_closed"] == "mcq_acc"
    assert not [r for r in caplog.records if "is not a score" in r.getMessage()]
    # the log names where the record is, not the hidden folder it was written in
    said = [r.getMessage() for r in caplog.records if "record at" in r.getMessage()]
    assert said == [f"finished; record at {tmp_path / 'scored' / 'results.json'}"], said


def test_vlmevalkit_vqa_tsv(tmp_path: Path) -> None:
    """A VQA dataset's file (no options): yes/no answers closed, the rest open."""
    rows = [
        (1, "Is there evidence of necrosis?", "yes", "Yes."),
        (2, "What organ is shown?", "liver", "the liver"),
        (3, "How many nuclei are visible?", "2", "2"),
        (4, "Is the tissue normal?", "no", "yes"),
    ]
    dataset = tmp_path / "PathVQA_VAL.tsv"
    pd.DataFrame(
        [
            {"index": i, "image": IMAGE, "question": q, "answer": a, "category": "pathology"}
            for i, q, a, _ in rows
        ]
    ).to_csv(dataset, sep="\t", index=False)
    path = vlmevalkit.write_predictions(
        dataset, {i: p for i, *_, p in rows}, tmp_path / "vqa", "tsv"
    )
    frame, fmt = read(path)
    assert fmt == "vlmevalkit"
    assert frame[["id", "answer", "answer_type"]].values.tolist() == [
        ["1", "yes", "closed"],
        ["2", "liver", "open"],
        ["3", "2", "open"],
        ["4", "no", "closed"],
    ]
    assert frame["candidates"].iloc[0] == ["yes", "no"] and frame["candidates"].iloc[1] is None
    metrics = score(tmp_path / "scored", path, "metric=[traditional]")["metrics"]
    assert metrics["all/n"] == 4 and metrics["all/n_closed"] == 2
    assert metrics["all/closed_acc"] == 0.5
    assert metrics["all/open_recall"] == 1.0


def test_a_vlmevalkit_key_naming_no_option_is_named(
    mcq_files: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = mcq_files["tsv"]
    written = pd.read_csv(path, sep="\t")
    written.loc[2, "answer"] = "AB"  # a multiple-answer key (an empty C: test_vlmevalkit_exact)
    written.to_csv(path, sep="\t", index=False)
    text = refused(path, tmp_path, caplog)
    assert f"{path}: row 2 (index '1003'): answer key 'AB' names none of its options" in text
    written.loc[2, "answer"] = np.nan  # a test split: no answers
    written.to_csv(path, sep="\t", index=False)
    text = refused(path, tmp_path, caplog)
    assert f"{path}: row 2 (index '1003') has options but no answer key" in text


# -- Excel and Parquet tables -------------------------------------------------------------------

TABLE = [
    {"id": "1", "question": "How many polyps?", "answer": "2", "prediction": "2"},
    {"id": "2", "question": "What size?", "answer": "05", "prediction": "5"},
    {"id": "3", "question": "Is there a polyp?", "answer": "yes", "prediction": ""},
    {"id": "4", "question": "Which organ?", "answer": "NA", "prediction": "colon"},
    {"id": "5", "question": "What code?", "answer": "007", "prediction": "007"},
]


@pytest.mark.heavy
def test_xlsx_and_parquet_tables_score_as_the_same_rows_in_jsonl(tmp_path: Path) -> None:
    """Binary tables skip the UTF-8 check; Excel cells stay text ("05", "NA"), as in CSV."""
    jsonl = tmp_path / "preds.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in TABLE))
    xlsx, parquet = tmp_path / "preds.xlsx", tmp_path / "preds.parquet"
    pd.DataFrame(TABLE).to_excel(xlsx, index=False)
    pd.DataFrame(TABLE).to_parquet(parquet)
    expected, _ = read(jsonl)
    for path in (xlsx, parquet):
        frame, fmt = read(path)
        assert fmt == "table"
        assert frame[["id", "answer", "prediction"]].values.tolist() == (
            expected[["id", "answer", "prediction"]].values.tolist()
        )
    scored = {p.suffix: score(tmp_path / p.suffix[1:], p)["metrics"] for p in (jsonl, parquet)}
    for key, value in scored[".jsonl"].items():
        assert scored[".parquet"][key] == pytest.approx(value, nan_ok=True), key


def test_binary_parquet_columns_are_read_as_their_utf8_text(tmp_path: Path) -> None:
    """A bytes column (`b"yes"`) is its text, not "b'yes'"; one that is not UTF-8 is refused,
    naming the file, column and row, and nothing is scored."""
    from medvqa.peers.prediction_files import ScoreInputError, load_table

    jsonl = tmp_path / "preds.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in TABLE))
    binary = pd.DataFrame(TABLE)
    binary["prediction"] = [p.encode() for p in binary["prediction"]]
    path = tmp_path / "binary.parquet"
    binary.to_parquet(path)
    frame, _ = read(path)
    expected, _ = read(jsonl)
    assert frame["prediction"].tolist() == expected["prediction"].tolist()
    binary.loc[3, "prediction"] = b"\xff\xfe colon"
    bad = tmp_path / "bad.parquet"
    binary.to_parquet(bad)
    with pytest.raises(ScoreInputError, match=r"bad.parquet: column 'prediction', row 3: binary"):
        load_table(bad)


@pytest.mark.heavy
def test_parquet_candidates_and_a_vlmevalkit_parquet(
    mcq_files: dict[str, Path], tmp_path: Path
) -> None:
    """A Parquet list column is the candidates; VLMEvalKit's columns in Parquet are detected."""
    path = tmp_path / "mcq.parquet"
    pd.DataFrame(
        {
            "id": ["a", "b"],
            "question": ["Which sequence?", "Which finding?"],
            "answer": ["T2", "Effusion"],
            "prediction": ["T2", "edema"],
            "answer_type": ["closed", "closed"],
            "candidates": [["T1", "T2"], ["Edema", "Effusion", "Mass"]],
        }
    ).to_parquet(path)
    assert read(path)[0]["candidates"].tolist() == [["T1", "T2"], ["Edema", "Effusion", "Mass"]]
    assert score(tmp_path / "scored", path)["metrics"]["all/closed_acc"] == 0.5
    converted = tmp_path / "MedVLM_GMAI-MMBench_VAL.parquet"
    pd.read_excel(mcq_files["xlsx"]).to_parquet(converted)
    frame, fmt = read(converted)
    assert fmt == "vlmevalkit" and frame["answer"].tolist()[:2] == ["MRI", "Effusion"]


# -- LLaVA / LLaVA-Med model_vqa.py -------------------------------------------------------------

# LLaVA-Med v1.5's chat-eval question file (llava_med_eval_qa50_qa.jsonl): GPT-4's answer is
# the reference; `domain` is a dict (not metadata).
CHAT_QUESTIONS = [
    {
        "question_id": 10,
        "image": "PMC123_fig1.jpg",
        "text": "What is shown in the chest X-ray?",
        "gpt4_answer": "A right-sided pleural effusion.",
        "fig_caption": "Chest X-ray.",
        "domain": {"chest_xray": True, "mri": False},
        "type": "conversation",
    },
    {
        "question_id": 11,
        "image": "PMC456_fig2.jpg",
        "text": "Which organ is enlarged?",
        "gpt4_answer": "The spleen.",
        "fig_caption": "Abdominal CT.",
        "domain": {"chest_xray": False, "mri": False},
        "type": "conversation",
    },
]
CHAT_REPLIES = {10: "There is a right pleural effusion.", 11: "The spleen is enlarged."}


def _chat_files(tmp_path: Path) -> tuple[Path, Path]:
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps(q) + "\n" for q in CHAT_QUESTIONS))
    answers = llava.model_vqa(questions, tmp_path / "answers" / "answers.jsonl", CHAT_REPLIES)
    return answers, questions


@pytest.mark.heavy
def test_llava_answers_join_their_question_file(tmp_path: Path) -> None:
    answers, questions = _chat_files(tmp_path)
    first = json.loads(answers.read_text().splitlines()[0])
    assert set(first) == {"question_id", "prompt", "text", "answer_id", "model_id", "metadata"}
    frame, fmt = read(answers, questions=questions)
    assert fmt == "llava"
    assert frame[["id", "question", "answer", "prediction", "answer_type"]].values.tolist() == [
        ["10", "What is shown in the chest X-ray?", "A right-sided pleural effusion.",
         "There is a right pleural effusion.", "open"],
        ["11", "Which organ is enlarged?", "The spleen.", "The spleen is enlarged.", "open"],
    ]  # fmt: skip
    assert frame["type"].tolist() == ["conversation"] * 2 and "domain" not in frame
    record = score(tmp_path / "scored", answers, "--questions", str(questions))
    assert record["choices"] == {"format": "llava"}
    assert record["config"]["questions"] == str(questions.resolve())  # what the truth came from
    assert record["metrics"]["all/n"] == 2 and record["metrics"]["all/open_recall"] > 0.5


def test_llava_med_v1_conversation_question_file(tmp_path: Path) -> None:
    """LLaVA-Med v1.0's VQA-RAD test.json (conversation format, `id`, OPEN/CLOSED), the file its
    model_vqa_med.py reads and its run_eval.py scores against."""
    rows = [
        (101, "Is there a fracture?", "yes", "CLOSED"),
        (102, "Is the lung clear?", "no", "CLOSED"),
        (103, "Where is the lesion?", "left lobe", "OPEN"),
    ]
    questions = llava.med_v1_test_json(tmp_path / "test.json", rows)
    replies = {101: "Yes, there is a fracture.", 102: "Yes", 103: "in the left lobe"}
    answers = llava.model_vqa_med_v1(questions, tmp_path / "vqa_rad" / "answer.jsonl", replies)
    assert json.loads(answers.read_text().splitlines()[0])["prompt"].endswith("\n<image>")
    frame, fmt = read(answers, questions=questions)
    assert fmt == "llava"
    assert frame["question"].tolist()[0] == "Is there a fracture?"
    assert frame["answer_type"].tolist() == ["closed", "closed", "open"]
    metrics = score(tmp_path / "scored", answers, "--questions", str(questions))["metrics"]
    assert metrics["all/closed_acc"] == 0.5 and metrics["all/open_recall"] == 1.0


@pytest.mark.heavy
def test_llava_answers_without_or_with_a_mismatched_question_file_are_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    answers, questions = _chat_files(tmp_path)
    text = refused(answers, tmp_path, caplog)
    assert f"{answers}: a LLaVA/LLaVA-Med model_vqa.py answers file" in text
    assert "--questions QUESTIONS.jsonl" in text
    questions.write_text(json.dumps(CHAT_QUESTIONS[0]) + "\n")  # question 11 missing
    text = refused(answers, tmp_path, caplog, "--questions", str(questions))
    assert "1 id(s): '11' answered but not in the question file" in text
    extra = {**CHAT_QUESTIONS[1], "question_id": 12}
    questions.write_text("".join(json.dumps(q) + "\n" for q in [*CHAT_QUESTIONS, extra]))
    text = refused(answers, tmp_path, caplog, "--questions", str(questions))
    assert f"{questions}: 1 id(s): '12' have no answer in {answers}" in text
    assert "concatenate them" in text
    no_truth = [{k: v for k, v in q.items() if k != "gpt4_answer"} for q in CHAT_QUESTIONS]
    questions.write_text("".join(json.dumps(q) + "\n" for q in no_truth))
    with pytest.raises(ScoreInputError, match=r"question '10' has no ground truth.*gpt4_answer"):
        read(answers, questions=questions)
    table = tmp_path / "preds.csv"
    table.write_text("question,answer,prediction\nIs it normal?,yes,yes\n")
    text = refused(table, tmp_path, caplog, "--questions", str(questions))
    assert "only a LLaVA/LLaVA-Med model_vqa.py answers file is joined" in text


# -- binary files of unsupported formats --------------------------------------------------------


@pytest.mark.heavy
def test_binary_files_of_unsupported_formats_are_named_not_called_bad_utf8(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    csv_text = "question,answer,prediction\nIs it normal?,yes,yes\n"
    zipped = tmp_path / "preds.zip"
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.writestr("preds.csv", csv_text)
    workbook = tmp_path / "preds.xlsx"
    pd.read_csv(io.StringIO(csv_text)).to_excel(workbook, index=False)
    misnamed = tmp_path / "workbook.csv"
    misnamed.write_bytes(workbook.read_bytes())
    cases = {
        tmp_path / "report.pdf": (b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj", "a PDF document"),
        zipped: (None, "a zip archive"),
        tmp_path / "preds.pkl": (pickle.dumps(pd.DataFrame(TABLE)), "a Python pickle"),
        tmp_path / "preds.bin": (bytes(range(256)) * 4, "a binary file (NUL byte at offset 0)"),
        tmp_path / "preds.dat": (b"\x7fELF\x02\x01\x01\x00" + bytes(64), "a binary file"),
        misnamed: (None, "an Excel workbook without the .xlsx suffix: rename it"),
    }
    for path, (data, what) in cases.items():
        if data is not None:
            path.write_bytes(data)
        text = refused(path, tmp_path, caplog)
        assert f"{path}: unsupported format: {what}" in text, path
        assert "Excel (.xlsx) and Parquet (.parquet)" in text
        assert "not UTF-8" not in text  # not the bad-text message
    fake = tmp_path / "table.xlsx"
    fake.write_text(csv_text)
    assert f"{fake}: named .xlsx but not an Excel workbook" in refused(fake, tmp_path, caplog)
    fake = tmp_path / "table.parquet"
    fake.write_text(csv_text)
    assert f"{fake}: named .parquet but not a Parquet file" in refused(fake, tmp_path, caplog)
    empty = tmp_path / "empty.xlsx"
    empty.write_bytes(b"")
    assert f"{empty}: the file is empty (0 bytes)" in refused(empty, tmp_path, caplog)
