"""RoboSurg-VQA in its release layout: records per wording, fixed labels, sequence keys, the
wording conditions, bad rows, frame arrays and the site shift."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from medvqa.data import records as R
from medvqa.data.shifts import Shift, make_splits
from medvqa.data.sources.robosurg_vqa import NEUTRAL_QUESTION, RoboSurgVqa
from medvqa.errors import DataError
from tests.conftest import compose
from tests.native.robosurg_vqa import LABELS, QUESTIONS, write_jsonl
from tests.native.robosurg_vqa import write as write_robosurg

# The release's shared answer space (data/vqa_summary.json "global_answer_vocabulary").
VOCABULARY = (
    "nephrectomy (robot-assisted); covered kidney (fat/fascia-covered kidney); kidney "
    "(parenchyma); other abdominal soft tissue (peritoneum/mesentery/fat); small intestine; "
    "robotic camera; no; yes; blurry; clear; mixed; near instrument jaws; none"
)


@pytest.fixture
def robosurg(tmp_path: Path):
    return write_robosurg(tmp_path / "robosurg")


def _by_split(table, split: str):
    return table[table[R.SOURCE_SPLIT] == split]


def test_records_per_split_and_wording(robosurg, tmp_path: Path) -> None:
    source = RoboSurgVqa(robosurg.root, cache_dir=tmp_path / "cache")
    table = source.table()
    for split, copies in (("train", 3), ("validate", 1), ("test", 1)):
        base = robosurg.base_rows(split)
        # 2 frames x (8 tasks on site1 + 9 on site2) x 2 sequences, q1/q3 dropped.
        assert len(base) == 34
        rows = _by_split(table, split)
        assert len(rows) == copies * len(base)
        wordings = rows["wording"].value_counts().to_dict()
        if split == "train":
            assert wordings == {"train_paraphrase": 68, "canonical": 34}
        else:
            assert wordings == {"canonical": 34}
    (step,) = source.report()["cleaning"]
    assert step["step"] == "drop_single_label_tasks"
    assert step["dropped_by_split"] == {"train": 8, "validate": 8, "test": 8}
    assert not set(table["question_id"]) & {"q1", "q3"}
    # The cached table is the same table.
    cached = RoboSurgVqa(robosurg.root, cache_dir=tmp_path / "cache").table()
    assert cached.equals(table)


def test_answers_labels_and_sequence_keys(robosurg) -> None:
    table = RoboSurgVqa(robosurg.root).table().set_index(R.ID)
    for record in robosurg.records:
        if len(record["valid_answers"]) < 2:
            continue
        row = table.loc[record["qa_id"]]
        assert row[R.ANSWER] == record["answer"]
        assert row[R.CANDIDATES] == LABELS[record["task"]]
        assert row["question_id"] == record["task"]
        assert row[R.IMAGE_ID] == record["record_id"]
        assert row[R.CASE_ID] == record["source_sequence_id"]
    # site2/video1 is a training and a test sequence: two clusters, never one.
    sequences = set(table.loc[table["video_key"] == "site2/video1", R.CASE_ID])
    assert sequences == {"train|site2/video1", "test|site2/video1"}
    assert not set(table.loc[table[R.SOURCE_SPLIT] == "test", R.CASE_ID]) & set(
        table.loc[table[R.SOURCE_SPLIT] != "test", R.CASE_ID]
    )
    # q2 (anatomy) only on site2, as the release's task_applicability says.
    assert set(table.loc[table["question_id"] == "q2", "site"]) == {"site2"}


def test_training_wordings_are_canonical_and_both_paraphrases(robosurg) -> None:
    table = RoboSurgVqa(robosurg.root).table().set_index(R.ID)
    qa = "site2/train/video1frame000|q6"
    asked = [
        table.loc[qa + suffix, R.QUESTION]
        for suffix in ("", "#train_paraphrase_1", "#train_paraphrase_2")
    ]
    spec = QUESTIONS["q6"]
    expected = [spec["canonical"], *spec["train_paraphrases"]]
    assert asked == [f"{text} Answer with one of: {VOCABULARY}." for text in expected]
    assert spec["heldout_paraphrase"] not in " ".join(table[R.QUESTION])


@pytest.mark.parametrize(
    ("wording", "task", "asked"),
    [
        ("canonical", "q5", QUESTIONS["q5"]["canonical"]),
        ("heldout_paraphrase", "q5", QUESTIONS["q5"]["heldout_paraphrase"]),
        # The next task's canonical question, in the release's task order (q1, q3 included).
        ("wrong_question", "q2", QUESTIONS["q3"]["canonical"]),
        ("wrong_question", "q4.occlusion", QUESTIONS["q5"]["canonical"]),
        ("wrong_question", "q9", QUESTIONS["q1"]["canonical"]),  # cyclic
    ],
)
def test_test_wording(robosurg, wording: str, task: str, asked: str) -> None:
    table = RoboSurgVqa(robosurg.root, test_wording=wording).table()
    test = _by_split(table, "test").set_index(R.ID)
    assert set(test["wording"]) == {wording}
    assert test.loc[f"site2/test/video1frame001|{task}", R.QUESTION] == (
        f"{asked} Answer with one of: {VOCABULARY}."
    )
    # Test ids do not depend on the wording (runs pair up row by row); training is unchanged.
    canonical = RoboSurgVqa(robosurg.root).table()
    assert set(test.index) == set(_by_split(canonical, "test")[R.ID])
    assert _by_split(table, "train").equals(_by_split(canonical, "train"))


def test_neutral_question_is_the_image_only_control(robosurg) -> None:
    table = RoboSurgVqa(robosurg.root, neutral_question=True).table()
    assert set(table[R.QUESTION]) == {f"{NEUTRAL_QUESTION} Answer with one of: {VOCABULARY}."}
    assert set(table["wording"]) == {"neutral"}
    assert table[R.SOURCE_SPLIT].value_counts().to_dict() == {
        "train": 34,
        "validate": 34,
        "test": 34,
    }
    with pytest.raises(ValueError, match="test_wording must be one of"):
        RoboSurgVqa(robosurg.root, test_wording="paraphrase")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"answer": "maybe"}, "answer 'maybe' is not one of valid_answers"),
        ({"record_id": "site9/train/x"}, "is not a frame of data/manifest.jsonl"),
        ({"source_sequence_id": "train|site2/video1"}, "is not the frame's 'train|site1/video1'"),
        ({"validation_role": "test"}, "contradicts the frame's split 'train'"),
        ({"task": "q10"}, "task 'q10' is not in configs/questions.json"),
        ({"valid_answers": ["yes", "no"]}, "differ from task"),
        ({"question_canonical": "Bleeding?"}, "differs from configs/questions.json"),
        ({"validation_role": "dev"}, "'validation_role' is 'dev'"),
    ],
)
def test_bad_records_error_or_skip(robosurg, change, message, caplog) -> None:
    records = [dict(r) for r in robosurg.records]
    occlusion = [i for i, r in enumerate(records) if r["task"] == "q4.occlusion"]
    # The first record of a task fixes its labels; the second is compared with it.
    index = occlusion[1 if "valid_answers" in change else 0]
    records[index].update(change)
    write_jsonl(robosurg.records_file, records)
    with pytest.raises(DataError, match=rf"vqa_records.jsonl row {index}: .*{message}"):
        RoboSurgVqa(robosurg.root).table()
    with caplog.at_level(logging.WARNING):
        source = RoboSurgVqa(robosurg.root, on_bad_row="skip")
        source.table()
    assert source.report()["skipped_rows"]["total"] == 1


def test_missing_files_are_named(robosurg) -> None:
    robosurg.records_file.unlink()
    with pytest.raises(DataError, match=r"vqa_records.jsonl not found at .*data/vqa_records"):
        RoboSurgVqa(robosurg.root).table()
    robosurg.questions_file.write_text(json.dumps({"tasks": {"q1": {"canonical": "x"}}}))
    with pytest.raises(DataError, match=r"task 'q1' needs 'canonical', 'heldout_paraphrase'"):
        RoboSurgVqa(robosurg.root).table()


def test_frames_are_read_from_the_release_arrays(robosurg) -> None:
    source = RoboSurgVqa(robosurg.root)
    table = source.table()
    ref = table.loc[table["site"] == "site1"].loc[lambda t: t[R.SOURCE_SPLIT] == "test", R.IMAGE]
    source.check_image(ref.iloc[0])
    image = source.load_image(ref.iloc[0])
    assert image.mode == "RGB" and image.size == (16, 9)  # 2017 test frames: another shape
    assert np.array_equal(np.asarray(image), np.load(robosurg.root / ref.iloc[0]))
    np.save(robosurg.root / ref.iloc[0], np.zeros((9, 16), dtype=np.uint8))
    with pytest.raises(DataError, match=r"expected uint8 height x width x 3"):
        source.check_image(ref.iloc[0], "r0")


def test_site_shift_keeps_the_release_split(robosurg, tmp_path: Path) -> None:
    cfg = compose(["+experiment=robosurg_site", f"dataset.root={robosurg.root}"], tmp_path)
    table = instantiate(cfg.dataset).table()
    shift = Shift.from_config(OmegaConf.to_container(cfg.shift, resolve=True))
    splits = make_splits(table, shift, seed=0)
    assert set(splits["test_ood"][R.CASE_ID]) == {"test|site2/video1"}
    assert set(splits["test_iid"][R.CASE_ID]) == {"test|site1/video9"}
    assert set(splits["train"][R.CASE_ID]) == {"train|site1/video1"}
    assert set(splits["val"][R.CASE_ID]) == {"train|site1/video3"}
    assert (
        splits.dropped["ood_in_validate"] == 18 and splits.dropped["ood_in_train_not_merged"] == 54
    )
    assert "q2" not in cfg.metric.closed_set.primary


def test_image_only_baseline_sets_the_neutral_question(robosurg, tmp_path: Path) -> None:
    cfg = compose(
        ["dataset=robosurg_vqa", "baseline=image_only", f"dataset.root={robosurg.root}"], tmp_path
    )
    assert cfg.dataset.neutral_question is True
    table = instantiate(cfg.dataset).table()
    assert set(table["wording"]) == {"neutral"}
