"""SLAKE from its native layout: cleaning counts, candidates, cache, bad input, splits."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from medvqa.data import records as R
from medvqa.data.questions import question_options
from medvqa.data.sources.slake import Slake, closed_candidates, keep_closed
from medvqa.errors import DataError
from tests.native import edit_json_row
from tests.native.slake import ROW_KINDS
from tests.native.slake import write as write_slake


@pytest.fixture
def slake(tmp_path: Path):
    return write_slake(tmp_path / "slake")


def test_question_options() -> None:
    assert question_options("Which is bigger, liver or spleen?") == ["liver", "spleen"]
    assert question_options("Which organ, liver, kidney, or spleen?") == [
        "liver",
        "kidney",
        "spleen",
    ]
    assert question_options("Is this a CT or MRI?") == []


@pytest.mark.parametrize(("lang", "atype", "ctype", "question", "answer", "kept"), ROW_KINDS)
def test_every_row_kind_meets_the_rule(lang, atype, ctype, question, answer, kept) -> None:
    import pandas as pd

    row = pd.Series({"answer_type": atype, "answer": answer, "question": question})
    assert keep_closed(row) == kept or lang != "en"


def test_cleaning_counts_match_the_fixture(slake, tmp_path: Path) -> None:
    source = Slake(slake.root, cache_dir=tmp_path / "cache")
    table = source.table()
    counts = table[R.SOURCE_SPLIT].value_counts().to_dict()
    assert counts == slake.kept
    steps = {s["step"]: s for s in source.report()["cleaning"]}
    assert steps["keep_english"]["dropped_by_split"] == {
        k: slake.raw[k] - slake.english[k] for k in slake.raw
    }
    assert steps["drop_multichoice_closed"]["dropped"] == sum(slake.english.values()) - sum(
        slake.kept.values()
    )
    unclean = Slake(slake.root, clean_closed=False).table()
    assert unclean[R.SOURCE_SPLIT].value_counts().to_dict() == slake.english
    assert set(table["q_lang"]) == {"en"}
    assert table[R.IMAGE].str.startswith("imgs/xmlab").all()


def test_closed_candidates() -> None:
    assert closed_candidates("Does the image look normal?", "No") == ["yes", "no"]
    assert closed_candidates("Which is bigger, liver or spleen?", "Liver") == ["Liver", "spleen"]
    assert closed_candidates("Is this a CT or MRI?", "MRI") == ["MRI", "CT"]
    assert closed_candidates("Is this a CT or MRI?", "CT") == ["CT", "MRI"]


def test_cache_is_reused_and_never_stale(slake, tmp_path: Path, monkeypatch, caplog) -> None:
    cache = tmp_path / "cache"
    first = Slake(slake.root, cache_dir=cache).table()
    # A second instance reads the cache instead of rebuilding.
    monkeypatch.setattr(Slake, "build", lambda *a: pytest.fail("rebuilt despite a valid cache"))
    again = Slake(slake.root, cache_dir=cache)
    assert again.table().equals(first)
    assert again.report()["cleaning"]
    monkeypatch.undo()
    # Editing an annotation file changes the key: the table is rebuilt.
    rows = slake.rows["test"][: len(ROW_KINDS)]
    (slake.root / "test.json").write_text(json.dumps(rows))
    changed = Slake(slake.root, cache_dir=cache).table()
    assert (changed[R.SOURCE_SPLIT] == "test").sum() == sum(k[5] for k in ROW_KINDS)
    # Parquet round trip keeps candidate lists as lists.
    closed = changed.loc[changed[R.ANSWER_TYPE] == "closed", R.CANDIDATES]
    assert all(isinstance(c, list) for c in closed)


@pytest.mark.parametrize(
    ("change", "kind", "message"),
    [
        ({"question": None}, "malformed", "missing field 'question'"),
        ({"answer_type": "MAYBE"}, "malformed", "'answer_type' is 'MAYBE'"),
        ({"img_name": "../../etc/passwd"}, "path_escape", "escapes the dataset root"),
    ],
)
def test_bad_rows_error_or_skip(slake, change, kind, message, caplog) -> None:
    edit_json_row(slake.root / "train.json", 2, **change)
    with pytest.raises(DataError) as err:
        Slake(slake.root).table()
    assert "train.json row 2" in str(err.value) and message in str(err.value)
    assert "on_bad_row=skip" in str(err.value)
    with caplog.at_level(logging.WARNING):
        source = Slake(slake.root, on_bad_row="skip")
        table = source.table()
    skipped = source.report()["skipped_rows"]
    assert skipped["counts"] == {kind: 1} and "train.json row 2" in skipped["examples"][0]
    assert (table[R.SOURCE_SPLIT] == "train").sum() == slake.kept["train"] - 1


def test_missing_annotation_file_names_it(slake) -> None:
    (slake.root / "validate.json").unlink()
    with pytest.raises(
        DataError, match=r"validate annotations not found .*validate.json, validation.json"
    ):
        Slake(slake.root).table()


def test_hub_copy_validation_json_is_read(tmp_path: Path) -> None:
    """The Hugging Face copy names the file validation.json: same table, same counts."""
    hub = write_slake(tmp_path / "hub", validate_file="validation.json")
    assert not (hub.root / "validate.json").exists()
    table = Slake(hub.root).table()
    assert table[R.SOURCE_SPLIT].value_counts().to_dict() == hub.kept
    (hub.root / "validate.json").write_text((hub.root / "validation.json").read_text())
    with pytest.raises(DataError, match=r"both .*validate.json and .*validation.json"):
        Slake(hub.root).table()


def test_closed_row_with_empty_answer_is_a_bad_row(slake) -> None:
    closed = next(i for i, k in enumerate(ROW_KINDS) if k[1] == "CLOSED" and k[0] == "en")
    edit_json_row(slake.root / "test.json", closed, answer="")
    with pytest.raises(DataError, match=r"test.json row \d+: a CLOSED question with an empty"):
        Slake(slake.root).table()
    source = Slake(slake.root, on_bad_row="skip")
    assert (source.table()[R.SOURCE_SPLIT] == "test").sum() == slake.kept["test"] - 1
    assert source.report()["skipped_rows"]["counts"] == {"malformed": 1}


def test_invalid_json_names_the_file(slake) -> None:
    (slake.root / "test.json").write_text("[{")
    with pytest.raises(DataError, match=r"test.json is not valid JSON"):
        Slake(slake.root).table()


def test_real_release_oddities_are_kept_and_counted(slake, tmp_path: Path) -> None:
    """The real train.json has an English OPEN row with an empty answer (the paper's 4866
    include it): it is kept, scored without error, and counted, as are numeric answers."""
    from medvqa.scoring.pipeline import build_families, score_frame
    from tests.conftest import compose

    source = Slake(slake.root, cache_dir=tmp_path / "cache")
    table = source.table()
    n_images = sum(len({r["img_id"] for r in rows}) for rows in slake.rows.values())
    per_split = {k: len({r["img_id"] for r in rows}) for k, rows in slake.rows.items()}
    empty = table[table[R.ANSWER] == ""]
    assert len(empty) == n_images and set(empty[R.ANSWER_TYPE]) == {"open"}
    assert (table[R.ANSWER] == "2").sum() == n_images  # the JSON number, as text
    # The double blank is kept as released (the paper's answers contain it).
    assert (table[R.ANSWER] == "Transverse  Plane").sum() == n_images
    report = source.report()["kept_oddities"]
    oddities = report["counts"]
    assert oddities == {
        "empty_answer": n_images,
        "non_string_answer": n_images,
        "inner_whitespace_answer": n_images,
    }
    assert report["by_split"]["empty_answer"] == per_split
    assert not source.report()["skipped_rows"]["counts"]
    cached = Slake(slake.root, cache_dir=tmp_path / "cache").report()["kept_oddities"]
    assert cached["counts"] == oddities  # the report survives the table cache
    preds = empty.assign(prediction=["liver"] * len(empty))
    scored, scores = score_frame(preds, build_families(compose([]).metric), ["question_type"])
    assert len(scored) == len(empty) and scores["n_open"] == len(empty)
    assert scores["open_f1"] == 0.0  # an empty reference shares no token with an answer


def test_oddities_in_rows_dropped_by_cleaning_are_reported_apart(slake) -> None:
    """A Chinese row (dropped by keep_english) with a numeric answer is counted, but as
    in_dropped_rows, so the per-split counts are those of the rows the table holds."""
    chinese = next(i for i, k in enumerate(ROW_KINDS) if k[0] == "zh")
    edit_json_row(slake.root / "validate.json", chinese, answer=3.0)
    source = Slake(slake.root)
    by_split = source.report()["kept_oddities"]["by_split"]["non_string_answer"]
    kept = {k: len({r["img_id"] for r in rows}) for k, rows in slake.rows.items()}
    assert by_split == {**kept, "in_dropped_rows": 1}
    assert source.table()[R.ANSWER].isin(["3"]).sum() == 0  # the row itself is gone


@pytest.mark.parametrize(
    ("value", "kinds"),
    [
        ("Lung", []),
        ("Transverse  Plane", ["inner_whitespace"]),
        ("Heart \tlungs", ["inner_whitespace"]),
        (" superficial ", ["padded"]),
        ("", ["empty"]),
        ("   ", ["empty"]),
        (2, ["non_string"]),
    ],
)
def test_text_oddities_kinds(tmp_path: Path, value, kinds) -> None:
    source = Slake(tmp_path)
    source.text_oddities({"answer": value}, ("answer",), "f row 0", "train/0")
    assert dict(source.oddities.counts) == {f"{k}_answer": 1 for k in kinds}


def test_answer_text() -> None:
    from medvqa.data.annotated import answer_text

    assert answer_text(2) == "2" and answer_text(2.0) == "2" and answer_text(0) == "0"
    assert answer_text(1.5) == "1.5" and answer_text(" Left ") == " Left "
