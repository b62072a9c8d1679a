"""RoboSurg-VQA from its manifest: records per question, answer spaces, the smoke rule, splits."""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import pandas as pd
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from medvqa.data import records as R
from medvqa.data.base import DataError
from medvqa.data.shifts import Shift, make_splits
from medvqa.data.sources.robosurg_vqa import (
    ARTEFACT_SPACE,
    QUESTIONS,
    RoboSurgVqa,
    format_artefacts,
    parse_artefacts,
)
from tests.conftest import compose
from tests.native.robosurg_vqa import COLUMNS
from tests.native.robosurg_vqa import write as write_robosurg

# Native spelling -> canonical answer (the fixture's aliases and case variants).
CANONICAL = {
    "Robotic Camera": "robotic camera",
    "unknown": "Unknown",
    "UNKNOWN": "Unknown",
    "center": "centre",
    "Gallbladder": "gallbladder",
    "Yes": "yes",
}
QCOLUMNS = {
    "Q1": "q1_context",
    "Q2": "q2_anatomy",
    "Q3": "q3_view",
    "Q5": "q5_quality",
    "Q6": "q6_glare",
    "Q7": "q7_contrast",
    "Q8": "q8_centre_occluded",
    "Q9": "q9_smoke_region",
}


@pytest.fixture
def robosurg(tmp_path: Path):
    return write_robosurg(tmp_path / "robosurg")


def _canon(value: str) -> str:
    return CANONICAL.get(value, value)


def test_nine_records_per_kept_frame(robosurg, tmp_path: Path) -> None:
    source = RoboSurgVqa(robosurg.root, cache_dir=tmp_path / "cache")
    table = source.table()
    counts = table[R.SOURCE_SPLIT].value_counts().to_dict()
    assert counts == {split: 9 * n for split, n in robosurg.frames.items()}
    per_frame = table.groupby([R.SOURCE_SPLIT, R.IMAGE_ID])["question_id"].apply(sorted)
    assert per_frame.map(lambda q: q == sorted(QUESTIONS)).all()
    (step,) = source.report()["cleaning"]
    assert step["step"] == "drop_smoke_region_contradiction"
    assert step["dropped_by_split"] == robosurg.dropped
    # The rule holds on what is left.
    q9 = table[table["question_id"] == "Q9"]
    assert (q9.loc[q9["smoke"] == "no", R.ANSWER] == "none").all()
    assert table[R.ANSWER_TYPE].eq("closed").all()
    assert table[R.IMAGE].str.startswith("frames/").all()
    assert table["mask"].str.startswith("masks/").all()


def test_answers_match_the_manifest_in_canonical_spelling(robosurg) -> None:
    table = RoboSurgVqa(robosurg.root).table().set_index(R.ID)
    kept = [r for r in robosurg.rows if r["q4_smoke"] == "yes" or r["q9_smoke_region"] == "none"]
    assert len(table) == 9 * len(kept)
    split = {"train": "train", "val": "validate", "test": "test"}
    for row in kept:
        prefix = f"{row['site']}/{split[row['split']]}/{row['id']}"
        for qid, column in QCOLUMNS.items():
            assert table.loc[f"{prefix}/{qid}", R.ANSWER] == _canon(row[column])
        bits = {name: _canon(row[f"q4_{name}"]) for name in ("bleeding", "smoke", "occlusion")}
        q4 = table.loc[f"{prefix}/Q4"]
        assert q4[R.ANSWER] == format_artefacts(bits)
        assert {k: q4[k] for k in bits} == bits
        assert q4[R.CASE_ID] == q4[R.IMAGE_ID] == f"{row['site']}/{row['id']}"


def test_candidates_are_the_answer_spaces(robosurg) -> None:
    table = RoboSurgVqa(robosurg.root).table()
    for qid, (_, space) in QUESTIONS.items():
        rows = table[table["question_id"] == qid]
        assert rows[R.CANDIDATES].map(lambda c, s=space: c == list(s)).all(), qid
        assert rows[R.QUESTION].nunique() == 1
    assert len(ARTEFACT_SPACE) == len(set(ARTEFACT_SPACE)) == 8
    assert "Unknown" in QUESTIONS["Q3"][1] and "Unknown" in QUESTIONS["Q8"][1]
    # The fixture uses every value of every single-valued space (aliases included).
    for qid in ("Q3", "Q5", "Q8"):
        answers = set(table.loc[table["question_id"] == qid, R.ANSWER])
        assert answers == set(QUESTIONS[qid][1]), qid


def test_parse_artefacts_round_trip() -> None:
    for text in ARTEFACT_SPACE:
        assert format_artefacts(parse_artefacts(text)) == text
    assert parse_artefacts("Smoke=Yes; bleeding=no, occlusion=no.") == {
        "smoke": "yes",
        "bleeding": "no",
        "occlusion": "no",
    }
    for bad in ("bleeding=yes, smoke=no", "bleeding=yes, smoke=no, occlusion=maybe", "smoke"):
        assert parse_artefacts(bad) is None
    assert parse_artefacts("bleeding=yes, bleeding=no, smoke=no, occlusion=no") is None


def test_configured_label_sets(robosurg) -> None:
    rows = [
        dict(r, q1_context={"dissection": "a", "suturing": "b", "idle": "c"}[r["q1_context"]])
        for r in robosurg.rows
    ]
    _write(robosurg.manifest, rows)
    with pytest.raises(DataError, match=r"'q1_context' is 'a'"):
        RoboSurgVqa(robosurg.root).table()
    table = RoboSurgVqa(robosurg.root, context_labels=["a", "b", "c"]).table()
    q1 = table[table["question_id"] == "Q1"]
    assert q1[R.CANDIDATES].map(lambda c: c == ["a", "b", "c"]).all()
    assert "a, b, c" in q1[R.QUESTION].iloc[0]
    with pytest.raises(ValueError, match="context_labels"):
        RoboSurgVqa(robosurg.root, context_labels=["a"])


def test_jsonl_and_parquet_manifests(robosurg, tmp_path: Path) -> None:
    expected = RoboSurgVqa(robosurg.root).table()
    (robosurg.root / "manifest.jsonl").write_text("\n".join(json.dumps(r) for r in robosurg.rows))
    pd.DataFrame(robosurg.rows).to_parquet(robosurg.root / "manifest.parquet")
    for name in ("manifest.jsonl", "manifest.parquet"):
        table = RoboSurgVqa(robosurg.root, manifest=name).table()
        pd.testing.assert_frame_equal(table, expected)


def _write(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


@pytest.mark.parametrize(
    ("change", "kind", "message"),
    [
        ({"q5_quality": "foggy"}, "malformed", "'q5_quality' is 'foggy'"),
        ({"q4_smoke": ""}, "malformed", "missing field 'q4_smoke'"),
        ({"split": "dev"}, "malformed", "'split' is 'dev'"),
        ({"frame": "../../etc/passwd"}, "path_escape", "escapes the dataset root"),
        ({"mask": "/etc/passwd"}, "path_escape", "escapes the dataset root"),
        ({"id": "f000"}, "duplicate", "occurs more than once"),
    ],
)
def test_bad_rows_error_or_skip(robosurg, change, kind, message, caplog) -> None:
    rows = [dict(r) for r in robosurg.rows]
    rows[1].update(change)  # row 1: site_a train frame f001 (f000 is row 0)
    _write(robosurg.manifest, rows)
    with pytest.raises(DataError) as err:
        RoboSurgVqa(robosurg.root).table()
    assert "manifest.csv row 1" in str(err.value) and message in str(err.value)
    with caplog.at_level(logging.WARNING):
        source = RoboSurgVqa(robosurg.root, on_bad_row="skip")
        table = source.table()
    skipped = source.report()["skipped_rows"]
    assert skipped["counts"] == {kind: 1} and "manifest.csv row 1" in skipped["examples"][0]
    assert (table[R.SOURCE_SPLIT] == "train").sum() == 9 * (robosurg.frames["train"] - 1)


def test_missing_manifest_names_it(robosurg) -> None:
    robosurg.manifest.unlink()
    with pytest.raises(DataError, match=r"RoboSurg-VQA manifest not found at .*manifest.csv"):
        RoboSurgVqa(robosurg.root).table()
    with pytest.raises(DataError, match=r"use .csv, .jsonl or .parquet"):
        (robosurg.root / "manifest.txt").write_text("x")
        RoboSurgVqa(robosurg.root, manifest="manifest.txt").table()


def test_site_shift_holds_out_one_site(robosurg, tmp_path: Path) -> None:
    cfg = compose(["+experiment=robosurg_site", f"dataset.root={robosurg.root}"], tmp_path)
    table = instantiate(cfg.dataset).table()
    shift = Shift.from_config(OmegaConf.to_container(cfg.shift, resolve=True))
    assert shift.field == "site" and shift.merge_train_ood
    splits = make_splits(table, shift, seed=0)
    (ood_site,) = shift.ood_values
    assert set(splits["test_ood"]["site"]) == {ood_site}
    for name in ("train", "val", "test_iid"):
        assert len(splits[name]) > 0 and ood_site not in set(splits[name]["site"])
    assert len(splits["train"]) >= 8
    # Site-level: every frame of the OoD site (train and test) is in the OoD test, none leaks.
    assert (
        len(splits["test_ood"])
        == (table["site"] == ood_site).sum()
        - ((table["site"] == ood_site) & (table[R.SOURCE_SPLIT] == "validate")).sum()
    )
    assert not set(splits["train"][R.IMAGE_ID]) & set(splits["test_ood"][R.IMAGE_ID])
    assert set(splits["val"][R.SOURCE_SPLIT]) == {"validate"}
