"""`metric.mcq.matching=vlmevalkit_exact`: VLMEvalKit's exact matching, row for row against its
own code (tests/peers/vlmevalkit.py), on prediction files its own `dump` wrote; and an option
written "None", which VLMEvalKit's loader reads as missing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from medvqa.cli.score import main
from medvqa.peers.readers import read
from medvqa.scoring import vlmevalkit_matching
from medvqa.scoring.metrics.mcq import McqMetric
from medvqa.statistics.bootstrap import Bootstrap
from tests.peers import vlmevalkit

# (index, options A-D, key, reply): the replies the two readings disagree on (issue 49), the
# ones VLMEvalKit's can_infer treats specially, and options written "None".
ROWS = [
    (1, ["CT", "MRI", "X-ray", "Ultrasound"], "B", "b"),  # a lower-case letter
    (2, ["T1", "T2", "FLAIR"], "B",
     "B\nThe cerebrospinal fluid is bright, which is typical of a T2-weighted sequence."),
    (3, ["Liver", "Spleen", "Kidney", "Pancreas"], "D",
     "D is correct, since the lesion sits in the pancreatic head."),  # starts with the letter
    (4, ["Mass", "Nodule", "Cyst"], "A", "A or C"),  # two letters
    (5, ["Edema", "Pneumothorax", "Effusion"], "C", "Effusion"),  # the option's text
    (6, ["Yes", "No"], "A", "Cannot determine the answer from this view."),  # a refusal: 'Z'
    (7, ["Left", "Right", "Both"], "A", "Z"),  # 'Z' itself
    (8, ["I", "II", "III", "IV"], "C", "The correct answer is **C**."),
    (9, ["Effusion", "Atelectasis", "None"], "C", "C"),  # the key is the "None" option
    (10, ["Reticular", "Nodular", "None", "Both"], "D", "D"),  # "None" leaves a gap at C
    (11, ["A mass", "A cyst", "Normal"], "A", "A mass is seen"),  # 'A' the article
    (12, ["CT", "MRI"], "A", "(A)"),
]  # fmt: skip
REPLIES = {index: reply for index, *_, reply in ROWS}
IMAGE = "iVBORw0KGgo" + "A" * 120  # a base64 image cell (VLMEvalKit keeps > 64 characters)


def _dataset(tmp_path: Path) -> Path:
    """The dataset TSV as VLMEvalKit hosts one (an option "None" is the text None there)."""
    rows = [
        {
            "index": index,
            "question": "Which is it?",
            **dict(zip("ABCD", options, strict=False)),
            "answer": key,
            "category": "radiology",
            "image": IMAGE,
        }
        for index, options, key, _ in ROWS
    ]
    path = tmp_path / "MedMCQ.tsv"
    pd.DataFrame(rows, columns=[*rows[0], "C", "D"]).to_csv(path, sep="\t", index=False)
    return path


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """The prediction file of each PRED_FORMAT their dump writes, and a .tsv and an .xlsx whose
    options keep the text "None" (re-saved by a tool that does not read it as missing)."""
    pytest.importorskip("xlsxwriter")  # their dump_xlsx's engine (a dev dependency)
    dataset = _dataset(tmp_path)
    out = {
        fmt: vlmevalkit.write_predictions(dataset, REPLIES, tmp_path / fmt, fmt)
        for fmt in ("tsv", "xlsx", "json")
    }
    texts = pd.read_csv(dataset, sep="\t", keep_default_na=False).drop(columns="image")
    texts["prediction"] = [REPLIES[i] for i in texts["index"]]
    for suffix in ("tsv", "xlsx"):
        out[f"none_text_{suffix}"] = tmp_path / f"none_{suffix}" / f"MedVLM_MedMCQ.{suffix}"
        out[f"none_text_{suffix}"].parent.mkdir()
        vlmevalkit.dump(texts, str(out[f"none_text_{suffix}"]))
    assert "None" in out["none_text_tsv"].read_text()
    assert (pd.read_excel(out["none_text_xlsx"], keep_default_na=False)["C"] == "None").any()
    return out


def _score(out: Path, path: Path, *overrides: str) -> tuple[dict, pd.DataFrame]:
    assert main([str(path), "--out", str(out), "metric=[mcq]", *overrides]) == 0
    record = json.loads((out / "results.json").read_text())
    return record["metrics"], pd.read_parquet(out / "scores.parquet")


@pytest.mark.heavy
@pytest.mark.parametrize("fmt", ["tsv", "xlsx", "json", "none_text_tsv", "none_text_xlsx"])
def test_vlmevalkit_exact_equals_their_scorer_row_for_row(
    fmt: str, files: dict[str, Path], tmp_path: Path
) -> None:
    path = files[fmt]
    hits = vlmevalkit.exact_matching_hits(path, tmp_path / "MedMCQ.tsv")
    # Their reading: 'b', the letter before an explanation, 'D is correct, ...', 'A or C', the
    # refusal, 'Z' and the "None" key are wrong; the text, '**C**', the gap's 'D', the
    # article 'A' and '(A)' are right.
    assert [hits[i] for i, *_ in ROWS] == [0, 0, 0, 0, 1, 0, 0, 1, 0, 1, 1, 1]
    metrics, scores = _score(tmp_path / "exact", path, "metric.mcq.matching=vlmevalkit_exact")
    ours = dict(zip(scores["id"], scores["mcq_vlmevalkit_exact_correct"].fillna(0.0), strict=True))
    assert ours == {str(i): float(hit) for i, hit in hits.items()}
    assert metrics["all/mcq_vlmevalkit_exact_acc_strict"] == pytest.approx(
        np.mean([*hits.values()])
    )
    assert metrics["all/mcq_vlmevalkit_exact_n"] == len(ROWS)
    assert not any(key.startswith("all/mcq_acc") for key in metrics)  # the keys name the reading
    # medvqa's reading of the same file: the lower-case letter, the letter before its
    # explanation and the sentence starting with the letter are right there.
    metrics, scores = _score(tmp_path / "medvqa", path)
    medvqa = dict(zip(scores["id"], scores["mcq_correct"], strict=True))
    assert [medvqa[str(i)] for i in (1, 2, 3)] == [1.0, 1.0, 1.0]
    assert np.isnan(medvqa["9"]) and np.isnan(medvqa["10"])  # 'C' of two, 'D' of three options
    assert "all/mcq_acc_strict" in metrics and "all/mcq_vlmevalkit_exact_acc" not in metrics


@pytest.mark.heavy
@pytest.mark.parametrize("fmt", ["tsv", "xlsx"])
def test_options_of_numbers_are_typed_as_their_loader_types_them(fmt: str, tmp_path: Path) -> None:
    """A column of numbers with a missing cell is float to their loader (the option 3 is
    "3.0", as their prompt showed it), so the reply "3" reads as no option, "2" as B."""
    pytest.importorskip("xlsxwriter")
    dataset = tmp_path / "Counts.tsv"
    rows = [(1, [1, 2, 3], "C", "3"), (2, [1, 2, None], "B", "2"), (3, [1, 2, 3], "A", "A")]
    pd.DataFrame(
        [
            {"index": i, "question": "How many?", **dict(zip("ABC", o, strict=True)),
             "answer": key, "image": IMAGE}
            for i, o, key, _ in rows
        ]
    ).to_csv(dataset, sep="\t", index=False)  # fmt: skip
    path = vlmevalkit.write_predictions(dataset, {i: r for i, *_, r in rows}, tmp_path, fmt)
    hits = vlmevalkit.exact_matching_hits(path, dataset)
    assert hits == {1: 0, 2: 1, 3: 1}
    assert read(path)[0]["candidates"].iloc[0] == ["1", "2", "3.0"]
    _, scores = _score(tmp_path / "exact", path, "metric.mcq.matching=vlmevalkit_exact")
    ours = dict(zip(scores["id"], scores["mcq_vlmevalkit_exact_correct"].fillna(0.0), strict=True))
    assert ours == {str(i): float(hit) for i, hit in hits.items()}


def test_none_options_are_read_as_vlmevalkit_reads_them(
    files: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """An option "None" is missing (as their loader reads it), its letter kept; a key naming
    it is scored, with a warning naming the row, instead of refusing the file."""
    frames = {fmt: read(path)[0].set_index("id") for fmt, path in files.items()}
    for frame in frames.values():
        assert frame.loc["9", "candidates"] == ["Effusion", "Atelectasis"]
        assert frame.loc["9", "answer"] == "C"  # the key of an option not offered
        assert frame.loc["10", "candidates"] == ["Reticular", "Nodular", "Both"]
        assert frame.loc["10", "option_letters"] == ["A", "B", "D"]
        assert frame.loc["10", "answer"] == "Both"
    assert "1 id(s): '9': the answer key names an option the file leaves empty" in caplog.text


def test_the_port_is_their_can_infer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Known replies, each against their `prefetch_answer` (the 'Z' fallback added)."""
    monkeypatch.delenv("VERBOSE", raising=False)
    choices = {"A": "Pleural effusion", "B": "Pneumothorax", "C": "Normal", "D": "Edema"}
    replies = [
        "B", "b", "(B)", "B.", "**B**", "B\nbecause the lung edge is visible and no markings",
        "The answer is B", "The correct answer is **D**. Here's why: ...", "A or B", "A, B",
        "Normal", "normal study", "pneumothorax and edema", "Z", "", "I'm sorry, but without "
        "the image provided I cannot say", "Failed to obtain answer via API", "E", "C D",
        "Option C: Normal", "answer is c", "This is a very long reply that names no option at "
        "all and goes on and on about the image quality and the patient position.",
    ]  # fmt: skip
    for reply in replies:
        theirs = vlmevalkit.prefetch_answer({**choices, "prediction": reply}) or "Z"
        assert vlmevalkit_matching.can_infer(reply, choices) == theirs, reply


WORDS = st.sampled_from(
    ["A", "B", "C", "D", "E", "Z", "a", "b", "the", "answer", "is", "correct", "Answer:",
     "(B)", "**C**", "B.", "liver", "Liver", "spleen", "kidney", "no", "\n", "option", ","]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    words=st.lists(WORDS, max_size=12),
    options=st.lists(st.sampled_from(["liver", "Spleen", "kidney", "no", "A"]), min_size=2,
                     max_size=4, unique=True),
    letters=st.sampled_from(["ABCD", "ABDE", "BCDA"]),
)  # fmt: skip
def test_the_port_agrees_on_generated_replies(
    words: list[str], options: list[str], letters: str
) -> None:
    reply = " ".join(words)
    choices = dict(zip(letters, options, strict=False))
    theirs = vlmevalkit.can_infer(reply, dict(choices)) or "Z"
    assert vlmevalkit_matching.can_infer(reply, choices) == theirs


def test_an_unknown_matching_is_refused(
    files: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """By medvqa-score too: exit status 2, the accepted values, nothing written."""
    with pytest.raises(ValueError, match=r"matching must be one of \('medvqa', 'vlmevalkit_exact'"):
        McqMetric(bootstrap=Bootstrap(samples=0), matching="vlmevalkit")
    out = tmp_path / "refused"
    args = [str(files["tsv"]), "--out", str(out), "metric=[mcq]", "metric.mcq.matching=exact"]
    assert main(args) == 2
    assert "matching must be one of ('medvqa', 'vlmevalkit_exact'), got 'exact'" in caplog.text
    assert "Traceback" not in caplog.text and not out.exists()


def test_the_readings_keys_are_classed_as_their_medvqa_namesakes() -> None:
    """Relative robustness and deltas apply to the same scores under either reading."""
    from medvqa.scoring.metrics.base import COUNT, ERROR_RATE, REFERENCE

    for reading in ("mcq_", "mcq_vlmevalkit_exact_"):
        assert McqMetric.score_info(f"test_ood/{reading}invalid_rate") == ERROR_RATE
        assert McqMetric.score_info(f"test_ood/{reading}n_valid") == COUNT
        assert McqMetric.score_info(f"all/{reading}random_baseline") == REFERENCE
        assert McqMetric.score_info(f"all/{reading}acc_strict").performance


def test_option_letters_that_do_not_fit_their_options_are_refused() -> None:
    table = pd.DataFrame(
        {
            "prediction": ["B"],
            "answer": ["MRI"],
            "answer_type": ["closed"],
            "candidates": [["CT", "MRI"]],
            "option_letters": [["A"]],
        },
        index=["q7"],
    )
    metric = McqMetric(bootstrap=Bootstrap(samples=0), matching="vlmevalkit_exact")
    with pytest.raises(ValueError, match=r"row 'q7' has option letters \['A'\] for the options"):
        metric.per_sample(table)
    table["option_letters"] = [["A", "C"]]  # B left empty in the file: 'B' reads as no option
    scored = metric.per_sample(table)
    assert scored["mcq_vlmevalkit_exact_invalid"].tolist() == [1.0]
    table["prediction"] = ["C"]
    assert metric.per_sample(table)["mcq_vlmevalkit_exact_correct"].tolist() == [1.0]
