"""medvqa-score: predictions made elsewhere, in each format, scored as a run scores them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from medvqa.cli.score import main
from medvqa.peers.readers import ScoreInputError, read
from tests.conftest import run_main
from tests.judge_server import JudgeServer, judge_overrides

# The same two splits' worth of scores a run records, compared key by key.
COMPARED = (
    "closed_acc",
    "open_f1",
    "open_exact_match",
    "open_bleu1",
    "open_recall",
    "n",
    "n_closed",
)


@pytest.fixture(scope="module")
def baseline_run(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """A real run's predictions and record (the most-frequent baseline: no model needed)."""
    run_dir = tmp_path_factory.mktemp("most_frequent")
    proc = run_main(["debug=smoke", "logger=csv", "baseline=most_frequent"], run_dir, cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def run_metrics(run_dir: Path) -> dict[str, float]:
    return json.loads((run_dir / "results.json").read_text())["metrics"]


def score(tmp_path: Path, predictions: Path, *args: str) -> dict:
    out = tmp_path / "scored"
    assert main([str(predictions), "--out", str(out), *args]) == 0
    return json.loads((out / "results.json").read_text())


def test_a_runs_own_predictions_score_to_its_numbers(baseline_run: Path, tmp_path: Path) -> None:
    record = score(tmp_path, baseline_run / "predictions.jsonl")
    assert record["status"] == "finished" and record["choices"] == {"format": "medvqa"}
    ours, theirs = record["metrics"], run_metrics(baseline_run)
    for split in ("test_iid", "test_ood"):
        for key in COMPARED:
            assert ours[f"{split}/{key}"] == pytest.approx(theirs[f"{split}/{key}"]), key
    assert ours["robustness/rr_closed"] == pytest.approx(theirs["robustness/rr_closed"])
    assert ours["test_iid/closed_acc_ci_lo"] == pytest.approx(theirs["test_iid/closed_acc_ci_lo"])
    scores = pd.read_parquet(tmp_path / "scored" / "scores.parquet")
    assert len(scores) == 24 and "closed_correct" in scores
    assert record["provenance"]["versions"]["torch"] and "commit" in record["provenance"]["git"]


def test_sure_format_gives_the_runs_traditional_metrics(baseline_run: Path, tmp_path: Path) -> None:
    """SURE-VQA's test_results.json (no split, no candidates, upper-case answer types)."""
    preds = pd.read_json(baseline_run / "predictions.jsonl", lines=True)
    iid = preds[preds["split"] == "test_iid"]
    sure = [
        {
            "qid": int(i),
            "question": q,
            "gt": a,
            "pred": p,
            "answer_type": t.upper(),
            "img_name": "xmlab1/source.jpg",
        }
        for i, (q, a, p, t) in enumerate(
            zip(iid["question"], iid["answer"], iid["prediction"], iid["answer_type"], strict=True)
        )
    ]
    path = tmp_path / "test_results.json"
    path.write_text(json.dumps(sure))
    record = score(tmp_path, path)
    assert record["choices"] == {"format": "sure"}
    ours, theirs = record["metrics"], run_metrics(baseline_run)
    for key in COMPARED:
        assert ours[f"all/{key}"] == pytest.approx(theirs[f"test_iid/{key}"]), key
    assert not any(k.startswith("robustness/") for k in ours)  # one split: no RR


@pytest.mark.heavy
def test_lmms_eval_samples(tmp_path: Path) -> None:
    samples = [
        {
            "doc_id": 0,
            "doc": {"question": "Is there a fracture?", "answer_type": "CLOSED", "modality": "x"},
            "target": "yes",
            "resps": [["Yes, there is."]],
            "filtered_resps": ["Yes, there is."],
        },
        {
            "doc_id": 1,
            "doc": {"question": "Which organ is shown?", "answer_type": "OPEN", "modality": "y"},
            "target": "liver",
            "resps": [["the liver"]],
            "filtered_resps": ["the liver"],
        },
    ]
    path = tmp_path / "samples_vqa_rad.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in samples))
    frame, fmt = read(path)
    assert fmt == "lmms-eval"
    assert frame[["id", "answer", "prediction", "answer_type"]].values.tolist() == [
        ["0", "yes", "Yes, there is.", "closed"],
        ["1", "liver", "the liver", "open"],
    ]
    assert frame["candidates"].iloc[0] == ["yes", "no"]
    metrics = score(tmp_path, path, "evaluation.breakdown=[modality]")["metrics"]
    assert metrics["all/closed_acc"] == 1.0 and metrics["all/open_recall"] == 1.0
    assert metrics["all/modality=x/n"] == 1.0


@pytest.mark.heavy
def test_a_table_with_aliases_infers_yes_no_as_closed(tmp_path: Path) -> None:
    path = tmp_path / "preds.csv"
    pd.DataFrame(
        {
            "question": ["Is it normal?", "Is this a CT or MRI?", "What is enlarged?"],
            "gt": ["no", "CT", "spleen"],
            "pred": ["no", "MRI", "the spleen"],
            "split": ["test_iid", "test_iid", "test_ood"],
        }
    ).to_csv(path, index=False)
    frame, fmt = read(path)
    assert fmt == "table"
    assert frame["answer_type"].tolist() == ["closed", "open", "open"]  # no answer_type column
    typed = tmp_path / "typed.csv"
    pd.read_csv(path).assign(answer_type=["CLOSED", "closed", "Open"]).to_csv(typed, index=False)
    metrics = score(tmp_path, typed)["metrics"]
    assert metrics["test_iid/closed_acc"] == 0.5  # "Is this a CT or MRI?" -> [CT, MRI]
    assert metrics["test_ood/open_recall"] == 1.0
    assert math.isnan(metrics.get("robustness/rr_closed") or math.nan)  # no OoD closed rows


@pytest.mark.heavy
def test_bad_rows_are_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "preds.jsonl"
    rows = [
        {"id": "a", "question": "Q?", "answer": "yes", "prediction": "no", "answer_type": "closed"},
        {"id": "b", "question": "Q?", "answer": "yes", "prediction": None, "answer_type": "closed"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main([str(path), "--out", str(tmp_path / "o")]) == 2
    assert "row 1 (id 'b') has no prediction" in caplog.text
    rows[1]["prediction"], rows[1]["answer_type"] = "yes", "boolean"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main([str(path), "--out", str(tmp_path / "o")]) == 2
    assert "row 1 (id 'b') has answer type 'boolean'" in caplog.text
    assert main([str(tmp_path / "missing.json"), "--out", str(tmp_path / "o")]) == 2


@pytest.mark.heavy
def test_companion_files_are_named_mode_or_order_and_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`--image-mode MODE=FILE` takes a counterfactual image mode, `--order K=FILE` a whole
    number; anything else is refused (exit 2) naming the option and the form, nothing written."""
    path = tmp_path / "preds.jsonl"
    row = {
        "id": "a",
        "question": "Q?",
        "answer": "yes",
        "prediction": "no",
        "answer_type": "closed",
        "split": "test_iid",
    }
    path.write_text(json.dumps(row) + "\n")
    out = tmp_path / "o"
    for bad in (["--image-mode", f"sideways={path}"], ["--image-mode", "blank"],
                ["--order", f"first={path}"]):  # fmt: skip
        assert main([str(path), "--out", str(out), *bad]) == 2
        assert not out.exists()
    assert "not a counterfactual image mode" in caplog.text
    assert "write it as KEY=FILE, e.g. --order 1=" in caplog.text
    assert main([str(path), "--out", str(out), "--image-mode", f"blank={path}"]) == 0
    assert (out / "scores_blank.parquet").is_file()
    metrics = json.loads((out / "results.json").read_text())["metrics"]
    assert metrics["delta_blank/test_iid/closed_acc"] == 0.0  # the same answers
    assert metrics["test_iid/reliance_blank_closed_changed"] == 0.0


@pytest.mark.heavy
def test_the_judge_scores_a_file_and_a_dead_one_leaves_it_incomplete(tmp_path: Path) -> None:
    path = tmp_path / "preds.csv"
    pd.DataFrame(
        {
            "question": ["Is there a mass?", "Is it normal?", "Which organ?"],
            "answer": ["yes", "no", "liver"],
            "prediction": ["yes", "yes", "the liver"],
            "answer_type": ["closed", "closed", "open"],
        }
    ).to_csv(path, index=False)
    server = JudgeServer().start()
    judge = judge_overrides(server, tmp_path / "judgments", "judge.retries=0")
    try:
        server.fail_first = 10**9
        record = score(tmp_path, path, *judge)
        # "yes"/"yes" and "the liver"/"liver" are exact matches, judged without a call.
        assert record["status"] == "incomplete" and record["failed_items"] == 1
        assert record["metrics"]["all/judge_closed_acc"] is None  # one shortcut + one failure
        assert record["metrics"]["all/judge_open_score"] == 5.0
        assert record["provenance"]["metrics"]["judge"]["judge_id"] == "openai:scripted:generate"
        server.fail_first = 0
        record = score(tmp_path, path, *judge)
        assert record["status"] == "finished"
        assert record["metrics"]["all/judge_closed_acc"] == 0.5
        assert record["metrics"]["judge/calls"] == 1  # only the failed item
    finally:
        server.stop()


def _slake_raw(rows: list[tuple[int, str, str, str]]) -> pd.DataFrame:
    """SLAKE's raw test.json rows (qid, answer type, question, answer as released)."""
    return pd.DataFrame(
        [
            {
                "qid": qid,
                "img_name": f"xmlab{qid}/source.jpg",
                "img_id": qid,
                "question": question,
                "answer": answer,
                "q_lang": "en",
                "location": "Abdomen",
                "modality": "CT",
                "answer_type": kind,
                "base_type": "vqa",
                "content_type": "Organ",
            }
            for qid, kind, question, answer in rows
        ]
    )


@pytest.mark.heavy
def test_sure_written_file_scores_closed_accuracy_as_sure_does(tmp_path: Path) -> None:
    """A test_results.json written by SURE-VQA's own code (raw "Yes"/"No" answers) gets the
    closed accuracy SURE-VQA's get_accuracy reports on the same rows."""
    from tests.peers.sure_vqa import get_accuracy, write_test_results

    raw = _slake_raw(
        [
            (11, "CLOSED", "Does the picture contain liver?", "Yes"),
            (12, "CLOSED", "Is the lung healthy?", "No"),
            (13, "CLOSED", "Is this a CT?", "Yes"),
            (14, "CLOSED", "Is there a mass?", "No"),
            (15, "CLOSED", "Which is bigger, liver or spleen?", "Liver"),
            (16, "CLOSED", "Is the heart enlarged?", "Yes"),
            (17, "OPEN", "How many lungs are shown?", "2"),
            (18, "OPEN", "What is the lesion's diameter code?", "05"),
            (19, "OPEN", "Where is the abnormality?", ""),
        ]
    )
    preds = {11: "Yes", 12: "no", 13: "Yes, it is.", 14: "Yes", 15: "The liver"}
    preds |= {16: "yes or no", 17: "2", 18: "05", 19: ""}
    path = write_test_results(raw, preds, tmp_path)
    written = json.loads(path.read_text())
    assert written[0]["gt"] == "Yes" and written[0]["qid"] == 11
    assert written[0]["question"].endswith("two options: [yes, no].")

    sure = pd.read_json(path)  # as SURE-VQA's run_eval.py reads it
    categories = pd.DataFrame(
        {
            "qid": [11, 12, 13, 14, 15, 16],
            "list_categories": [["yes", "no"]] * 4 + [["liver", "spleen"], ["yes", "no"]],
        }
    )
    theirs = get_accuracy(sure[sure["answer_type"] == "CLOSED"], categories)[0]["avg_accuracy"]
    assert theirs == pytest.approx(4 / 6)

    metrics = score(tmp_path, path, "--format", "sure")["metrics"]
    assert metrics["all/closed_acc"] == pytest.approx(theirs)
    assert metrics["all/n_closed"] == 6
    assert metrics["all/open_exact_match"] == 1.0  # "2", "05" and the empty answer, as text
    assert metrics["all/open_empty_ref_n"] == 1


@pytest.mark.heavy
def test_csv_answers_stay_text(tmp_path: Path) -> None:
    """Answers, predictions and ids that look numeric, "NA", "None" and "" are read as text."""
    numeric = tmp_path / "numeric.csv"
    numeric.write_text(
        "id,question,answer,prediction,answer_type\n"
        "001,How many?,05,05,open\n"
        "002,Which code?,007,007,open\n"
        "003,What dose?,3.0,3.0,open\n"
        "004,What value?,NA,4,open\n"
        "005,What else?,,0,open\n"
    )
    frame, _ = read(numeric)
    assert frame["id"].tolist() == ["001", "002", "003", "004", "005"]
    assert frame["answer"].tolist() == ["05", "007", "3.0", "NA", ""]
    assert frame["prediction"].tolist() == ["05", "007", "3.0", "4", "0"]
    metrics = score(tmp_path, numeric)["metrics"]
    assert metrics["all/open_exact_match"] == pytest.approx(3 / 5)
    assert metrics["all/open_empty_ref_n"] == 1

    closed = tmp_path / "closed.csv"
    closed.write_text(
        "question,answer,prediction,answer_type\n"
        "Is there a mass?,Yes,yes,CLOSED\n"
        "Is it normal?,No,,CLOSED\n"  # an empty prediction: scored, and invalid
        "Is it enlarged?,No,NO.,CLOSED\n"
        "What value?,NA,NA,OPEN\n"
        "Which finding?,None,none,OPEN\n"
    )
    frame, _ = read(closed)
    assert frame["prediction"].tolist() == ["yes", "", "NO.", "NA", "none"]
    metrics = score(tmp_path, closed)["metrics"]
    assert metrics["all/closed_acc"] == pytest.approx(2 / 3)
    assert metrics["all/closed_invalid_rate"] == pytest.approx(1 / 3)
    assert metrics["all/open_exact_match"] == 1.0


def test_closed_answers_compare_normalised_on_both_sides() -> None:
    """A "Yes" reference, the lower-case yes/no space and a "YES." prediction agree."""
    from medvqa.data.answers import closed_correct
    from medvqa.data.questions import closed_candidates
    from medvqa.scoring.metrics.traditional import per_sample_scores

    cands = closed_candidates("Is there a mass?", "Yes")
    assert closed_correct("YES.", "Yes", cands) == 1.0
    assert closed_correct("no", "Yes", cands) == 0.0
    rows = pd.DataFrame(
        {
            "answer": ["Yes", "No", "Liver"],
            "prediction": ["YES.", "yes or no", "the liver"],
            "answer_type": ["closed"] * 3,
            "candidates": [cands, cands, ["Liver", "spleen"]],
        }
    )
    scored = per_sample_scores(rows)
    assert scored["closed_correct"].tolist() == [1.0, 0.0, 1.0]
    assert scored["closed_invalid"].tolist() == [0.0, 1.0, 0.0]


@pytest.mark.heavy
def test_a_letter_answer_key_scores_against_its_option(tmp_path: Path) -> None:
    """An MCQ file whose key is the letter ("B"): scored as the option it names, not as 0."""
    options = ["Edema", "Pneumothorax", "Effusion"]
    rows = [
        {"id": "1", "question": "Finding?", "answer": "B", "prediction": "The answer is B."},
        {"id": "2", "question": "Finding?", "answer": "C", "prediction": "**C**"},
        {"id": "3", "question": "Finding?", "answer": "A", "prediction": "B"},
        {"id": "4", "question": "Finding?", "answer": "Edema", "prediction": "A"},
    ]
    path = tmp_path / "mcq.jsonl"
    path.write_text(
        "".join(
            json.dumps({**r, "answer_type": "closed", "candidates": options}) + "\n" for r in rows
        )
    )
    metrics = score(tmp_path, path, "metric=[traditional,mcq]")["metrics"]
    assert metrics["all/mcq_acc"] == pytest.approx(3 / 4)
    assert metrics["all/mcq_invalid_rate"] == 0.0
    # the closed-question accuracy reads option text: "Pneumothorax" is right for key "B"
    texts = [{**r, "prediction": options[ord(r["answer"][0]) - ord("A")]} for r in rows[:3]]
    path.write_text(
        "".join(
            json.dumps({**r, "answer_type": "closed", "candidates": options}) + "\n" for r in texts
        )
    )
    assert score(tmp_path, path)["metrics"]["all/closed_acc"] == 1.0


# -- lmms-eval sample logs as each version's own writer leaves them ------------------------------

LMMS_ROWS = [
    (11, "CLOSED", "Does the picture contain liver?", "Yes"),
    (12, "CLOSED", "Is the lung healthy?", "No"),
    (15, "CLOSED", "Which is bigger, liver or spleen?", "Liver"),
    (16, "CLOSED", "Is the heart enlarged?", "Yes"),
    (17, "OPEN", "How many lungs are shown?", "2"),
    (19, "OPEN", "Where is the abnormality?", ""),
]
LMMS_PREDS = {11: "Yes", 12: "yes", 15: "The liver", 16: "Yes", 17: "2", 19: "lung"}


def _lmms_samples(version: str, tmp_path: Path) -> Path:
    from tests.peers.lmms_eval import write_samples

    docs = _slake_raw(LMMS_ROWS).to_dict("records")
    return write_samples(version, docs, LMMS_PREDS, tmp_path)


@pytest.mark.parametrize("version", ["v0.4", "head"])
@pytest.mark.heavy
def test_lmms_eval_logs_without_doc_score_as_v035_logs_do(
    version: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """lmms-eval >= 0.4 drops `doc`: the question comes from `input` less the task's post
    prompt and the answer type from the task's per-sample metric dict, so the same rows score
    the same as in a v0.3.5 log, and the warning says what the file lacks."""
    old = _lmms_samples("v0.3.5", tmp_path)
    new = _lmms_samples(version, tmp_path)
    assert "doc" in json.loads(old.read_text().splitlines()[0])
    first = json.loads(new.read_text().splitlines()[0])
    assert "doc" not in first and first["input"].endswith("single word or phrase.")
    assert isinstance(first["filtered_resps"], list if version == "v0.4" else str)

    old_frame, _ = read(old, "lmms-eval")
    caplog.clear()
    new_frame, fmt = read(new, "lmms-eval")
    assert fmt == "lmms-eval"
    compared = ["id", "question", "answer", "prediction", "answer_type"]
    assert new_frame[compared].values.tolist() == old_frame[compared].values.tolist()
    assert new_frame["question"].iloc[2] == "Which is bigger, liver or spleen?"
    assert new_frame["candidates"].iloc[2] == old_frame["candidates"].iloc[2]
    assert "no `doc` in 6 of 6 row(s)" in caplog.text
    assert "question taken from `input`" in caplog.text
    assert "answer type from the per-sample metric dict `slake_accuracy`" in caplog.text

    theirs = score(tmp_path / "old", old)["metrics"]
    ours = score(tmp_path / "new", new, "evaluation.breakdown=[modality]")["metrics"]
    for key in ("closed_acc", "n_closed", "open_exact_match", "open_empty_ref_n", "n"):
        assert ours[f"all/{key}"] == pytest.approx(theirs[f"all/{key}"]), key
    assert ours["all/n_closed"] == 4 and ours["all/closed_acc"] == pytest.approx(3 / 4)
    assert ours["all/modality=ct/n"] == 6  # from the metric dict, lower-cased by the task


def test_lmms_eval_log_without_doc_or_metric_dict_infers_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A task whose per-sample metrics are plain numbers leaves no answer type: yes/no targets
    are closed, and the warning says the type was inferred."""
    path = _lmms_samples("head", tmp_path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:
        for key in ("slake_accuracy", "slake_open_accuracy", "slake_closed_accuracy"):
            row[key] = 1.0
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    frame, _ = read(path, "lmms-eval")
    assert frame["answer_type"].tolist() == ["closed", "closed", "open", "closed", "open", "open"]
    assert "answer type inferred for 6 row(s) (yes/no target -> closed)" in caplog.text


def test_lmms_eval_row_without_doc_or_input_is_named(tmp_path: Path) -> None:
    path = _lmms_samples("head", tmp_path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    del rows[3]["input"]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ScoreInputError, match=rf"{path}: line 4 .*neither `doc` nor `input`"):
        read(path, "lmms-eval")


def refused(path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> str:
    """The message of a file medvqa-score refuses with exit status 2."""
    caplog.clear()
    assert main([str(path), "--out", str(tmp_path / "refused")]) == 2
    return caplog.text


def test_unmapped_columns_list_the_columns_found_and_the_names_accepted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "preds.csv"
    path.write_text("question,truth,output\nIs it normal?,yes,no\n")
    text = refused(path, tmp_path, caplog)
    assert f"{path}: no column for ['answer', 'prediction']" in text
    assert "columns are ['output', 'question', 'truth']" in text
    assert "answer: answer or gt or ground_truth or target" in text
    assert "prediction: prediction or pred or response" in text


def test_an_unknown_split_is_named_and_split_case_is_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "preds.csv"
    path.write_text(
        "id,question,answer,prediction,answer_type,split\n"
        "a,Is it normal?,yes,yes,CLOSED,TEST_IID\n"
        "b,Which organ?,liver,liver,Open,dev\n"
    )
    text = refused(path, tmp_path, caplog)
    assert f"{path}: row 1 (id 'b') has split 'dev'" in text
    assert "use one of train, val, test_iid, test_ood (any case)" in text
    path.write_text(path.read_text().replace(",dev", ",Test_OOD"))
    frame, _ = read(path)
    assert frame["split"].tolist() == ["test_iid", "test_ood"]
    assert frame["answer_type"].tolist() == ["closed", "open"]


def test_a_repeated_id_names_both_rows(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "preds.csv"
    path.write_text(
        "id,question,answer,prediction,split\n"
        "a,Is it normal?,yes,yes,test_iid\n"
        "a,Is it normal?,yes,yes,test_ood\n"  # another split: not a repeat
        "b,Which organ?,liver,liver,test_iid\n"
        "a,Is it big?,no,no,test_iid\n"
    )
    text = refused(path, tmp_path, caplog)
    assert f"{path}: id 'a' occurs in rows 0 and 3 of split 'test_iid'" in text
    assert "drop the repeated row, or give each question its own id" in text


@pytest.mark.heavy
def test_bytes_that_are_not_utf8_are_placed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    table = "question,answer,prediction\nIs it normal?,yes,yes\nWhich organ?,fémur,femur\n"
    for suffix in (".csv", ".jsonl"):
        path = tmp_path / f"latin1{suffix}"
        if suffix == ".jsonl":
            row = {"question": "Which organ?", "answer": "fémur", "prediction": "femur"}
            path.write_bytes(b"\n" + json.dumps(row, ensure_ascii=False).encode("latin-1"))
        else:
            path.write_bytes(table.encode("latin-1"))
        offset = path.read_bytes().index("é".encode("latin-1"))
        text = refused(path, tmp_path, caplog)
        assert f"{path}: byte {offset} (line {2 if suffix == '.jsonl' else 3})" in text
        assert "re-save the file as UTF-8" in text
        assert "Traceback" not in text
    utf16 = tmp_path / "unicode.txt.csv"  # Excel's "Unicode Text", PowerShell's default
    utf16.write_bytes(table.encode("utf-16"))
    text = refused(utf16, tmp_path, caplog)
    assert "UTF-16 byte-order mark" in text and "iconv -f UTF-16 -t UTF-8" in text
    assert "WINDOWS-1252" not in text
    bom = tmp_path / "excel.csv"  # Excel's "CSV UTF-8": a byte-order mark, then UTF-8
    bom.write_bytes(table.encode("utf-8-sig"))
    assert read(bom)[0]["answer"].tolist() == ["yes", "fémur"]


@pytest.mark.heavy
def test_empty_files_are_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    for name in ("empty.csv", "empty.jsonl", "empty.json"):
        (tmp_path / name).write_bytes(b"")
        assert f"{tmp_path / name}: the file is empty (0 bytes)" in refused(
            tmp_path / name, tmp_path, caplog
        )
    header = tmp_path / "header.csv"
    header.write_text("question,answer,prediction\n")
    text = refused(header, tmp_path, caplog)
    assert f"{header}: no prediction rows (columns: ['question', 'answer', 'prediction'])" in text
    (tmp_path / "none.json").write_text("[]")
    assert "no prediction rows" in refused(tmp_path / "none.json", tmp_path, caplog)


@pytest.mark.heavy
def test_kvasir_official_scores_a_csv_as_the_same_rows_in_jsonl(tmp_path: Path) -> None:
    """Numeric-looking answers and an empty prediction survive CSV as they do JSONL."""
    rows = [
        {"id": "1", "question": "How many polyps?", "answer": "2", "prediction": "2"},
        {"id": "2", "question": "What size?", "answer": "05", "prediction": "5"},
        {"id": "3", "question": "Is there a polyp?", "answer": "yes", "prediction": ""},
        {
            "id": "4",
            "question": "Where is the polyp?",
            "answer": "in the upper-left of the image",
            "prediction": "upper left",
        },
        {"id": "5", "question": "What code?", "answer": "007", "prediction": "007"},
    ]
    jsonl, csv = tmp_path / "preds.jsonl", tmp_path / "preds.csv"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pd.DataFrame(rows).to_csv(csv, index=False)
    scored = {}
    for path in (jsonl, csv):
        out = tmp_path / path.suffix.lstrip(".")
        assert main([str(path), "--out", str(out), "metric=[kvasir_official]"]) == 0
        scored[path.suffix] = json.loads((out / "results.json").read_text())["metrics"]
    keys = {k for k in scored[".jsonl"] if "/kvasir_" in k}
    assert keys and keys == {k for k in scored[".csv"] if "/kvasir_" in k}
    assert "all/kvasir_bleu" in keys
    for key in sorted(keys):
        assert scored[".csv"][key] == pytest.approx(scored[".jsonl"][key], nan_ok=True), key
    assert scored[".csv"]["all/kvasir_failures"] == 0


def test_csv_candidates_are_read_and_a_missing_question_is_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A CSV's candidates cell holds a JSON list (a cell is text): used, not silently dropped;
    a file without questions is scored with a warning saying what that costs."""
    path = tmp_path / "mcq.csv"
    path.write_text(
        "id,answer,prediction,answer_type,candidates\n"
        '1,T2 weighted,T2 weighted,closed,"[""T1 weighted"", ""T2 weighted""]"\n'
        '2,Effusion,mass,closed,"[""Edema"", ""Effusion"", ""Mass""]"\n'  # valid, wrong
        "3,yes,no,closed,\n"
    )
    with caplog.at_level("WARNING"):
        metrics = score(tmp_path, path)["metrics"]
    assert metrics["all/closed_acc"] == pytest.approx(1 / 3)
    assert metrics["all/closed_invalid_rate"] == 0.0  # "mass" is one of the file's options
    assert "no question column" in caplog.text
    path.write_text("id,answer,prediction,answer_type,candidates\n1,a,a,closed,a;b\n")
    with pytest.raises(ScoreInputError, match=r"row 0: candidates 'a;b' is not a list"):
        read(path)


def test_a_rescoring_killed_midway_leaves_the_earlier_one_and_a_run_is_never_overwritten(
    baseline_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """medvqa-score writes its folder whole: killed while writing, the earlier results stay;
    `--out` at a run directory is refused (exit 2) with the run untouched."""
    from medvqa.cli import score as score_module

    first = score(tmp_path, baseline_run / "predictions.jsonl")
    out = tmp_path / "scored"
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}

    def killed(*args: object) -> None:
        raise KeyboardInterrupt("killed while writing the summary")

    monkeypatch.setattr(score_module, "_summary", killed)
    with pytest.raises(KeyboardInterrupt):
        main([str(baseline_run / "predictions.jsonl"), "--out", str(out), "metric=[traditional]"])
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scored"]
    monkeypatch.undo()
    assert score(tmp_path, baseline_run / "predictions.jsonl")["metrics"] == first["metrics"]
    run_files = sorted(p.name for p in baseline_run.iterdir())
    assert main([str(baseline_run / "predictions.jsonl"), "--out", str(baseline_run)]) == 2
    assert sorted(p.name for p in baseline_run.iterdir()) == run_files


@pytest.mark.heavy
def test_sure_number_words_match_sures_open_scores_exactly(tmp_path: Path) -> None:
    """SURE-VQA's open scorer reads "none" as "0" and only zero..ten as numbers; medvqa keeps
    "none" (no finding) and maps up to twenty. `metric.traditional.sure_number_words=true`
    gives SURE-VQA's open F1 on a file its own code wrote; the default differs on such rows."""
    from tests.peers.sure_vqa import calculate_f1score, normalize_word, write_test_results

    raw = _slake_raw(
        [
            (21, "OPEN", "How many masses are there?", "0"),
            (22, "OPEN", "How many lesions?", "none"),
            (23, "OPEN", "How many ribs are visible?", "12"),
            (24, "OPEN", "How many kidneys?", "two"),
            (25, "OPEN", "Which organ is abnormal?", "Left lung"),
            (26, "OPEN", "What modality is this?", "MRI"),
        ]
    )
    preds = {21: "none", 22: "zero", 23: "twelve", 24: "2", 25: "the left lung", 26: "CT"}
    path = write_test_results(raw, preds, tmp_path)

    def theirs(pred: str, gt: str) -> float:  # run_eval.py: lower-case, normalise, then F1
        return calculate_f1score(normalize_word(pred.lower()), normalize_word(gt.lower()))[0]

    sure = pd.read_json(path)
    expected = float(np.mean([theirs(p, g) for p, g in zip(sure["pred"], sure["gt"], strict=True)]))
    assert expected == pytest.approx(4 / 6)  # none = 0 = zero; "twelve" is not 12 for SURE
    exact = score(tmp_path, path, "metric.traditional.sure_number_words=true")["metrics"]
    assert exact["all/open_f1"] == pytest.approx(expected)
    ours = score(tmp_path, path)["metrics"]
    assert ours["all/open_f1"] == pytest.approx(3 / 6)  # "twelve" is 12, "none" is not "0"
    per_row = pd.read_parquet(tmp_path / "scored" / "scores.parquet").set_index("id")["open_f1"]
    assert per_row.to_dict() == {"21": 0, "22": 0, "23": 1, "24": 1, "25": 1, "26": 0}


@pytest.mark.heavy
def test_chinese_yes_no_rows_score_as_closed_questions(tmp_path: Path) -> None:
    """SLAKE's zh half scored from a file without answer types: 是/否 answers are closed over
    是 / 否, and "是的。" is a right answer (it scored 0, over ['是', 'not 是'], silently)."""
    path = tmp_path / "zh.csv"
    path.write_text(
        "id,question,answer,prediction\n"
        "1,图像正常吗?,是,是的。\n"
        "2,有病变吗?,否,不是\n"
        "3,肝脏有病变吗?,有,没有\n"
        "4,图中显示的是哪个器官?,肺,肺\n",
        encoding="utf-8",
    )
    metrics = score(tmp_path, path, "metric=[traditional]")["metrics"]
    assert metrics["all/n_closed"] == 3 and metrics["all/n_open"] == 1
    assert metrics["all/closed_acc"] == pytest.approx(2 / 3)
    assert metrics["all/closed_invalid_rate"] == 0
