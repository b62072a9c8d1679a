"""Bad values in inputs end in errors that name the file, row and field (issue #20, defect 6).

Dataset files are written in their native layout (tests/native) with one wrongly typed metadata
value; run records are results.json files of every shape (null, a number, no config). Nothing
here may end in a library traceback (pyarrow's ArrowInvalid, a TypeError).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from medvqa.analysis.aggregate import collect
from medvqa.cli.report import main as report_main
from medvqa.data import records as R
from medvqa.data.annotated import AnnotatedSource, BadRows
from medvqa.data.cleaning import CleaningLog
from medvqa.data.sources.ovqa import Ovqa
from medvqa.data.sources.slake import Slake
from medvqa.data.sources.vqa_rad import VqaRad
from medvqa.errors import DataError
from medvqa.record import RunRecord, read_record
from tests.native import edit_json_row
from tests.native.ovqa import write as write_ovqa
from tests.native.slake import write as write_slake
from tests.native.vqa_rad import ANNOTATION_FILE
from tests.native.vqa_rad import write as write_vqa_rad
from tests.test_report import headline, write_record

SMALL_SLAKE = {"train": 2, "validate": 1, "test": 1}


def _slake(root: Path) -> tuple[Path, int]:
    fixture = write_slake(root, images=SMALL_SLAKE)
    return fixture.root / "train.json", fixture.kept["train"]


def _ovqa(root: Path) -> tuple[Path, int]:
    fixture = write_ovqa(root, images={"train": 2, "validate": 1, "test": 1})
    return fixture.root / "trainset.json", fixture.kept["train"]


def _vqa_rad(root: Path) -> tuple[Path, int]:
    fixture = write_vqa_rad(root, n_images=2)
    return fixture.root / ANNOTATION_FILE, fixture.kept["train"]


# (loader, fixture writer, row edited (a train row every loader keeps), field, bad value)
WRONG_TYPES = [
    pytest.param(Slake, _slake, 2, "modality", 7, id="slake-modality-int"),
    pytest.param(Slake, _slake, 2, "location", ["a", "b"], id="slake-location-list"),
    pytest.param(Slake, _slake, 2, "content_type", {"x": 1}, id="slake-content_type-object"),
    pytest.param(Ovqa, _ovqa, 0, "image_organ", 7, id="ovqa-image_organ-int"),
    pytest.param(VqaRad, _vqa_rad, 0, "evaluation", 5, id="vqa_rad-evaluation-int"),
]


@pytest.mark.parametrize(("loader", "writer", "row", "key", "value"), WRONG_TYPES)
def test_wrongly_typed_metadata_is_a_bad_row_naming_file_row_and_field(
    tmp_path: Path,
    loader: type[AnnotatedSource],
    writer: Any,
    row: int,
    key: str,
    value: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path, kept = writer(tmp_path / "data")
    edit_json_row(path, row, **{key: value})
    root = path.parent
    with pytest.raises(DataError) as err:
        loader(root, cache_dir=tmp_path / "cache").table()
    message = str(err.value)
    assert f"{path.name} row {row}" in message and repr(key) in message
    assert "expected a string" in message and "on_bad_row=skip" in message

    with caplog.at_level(logging.WARNING):
        source = loader(root, cache_dir=tmp_path / "cache", on_bad_row="skip")
        table = source.table()
    skipped = source.report()["skipped_rows"]
    assert skipped["counts"] == {"wrong_type": 1}
    assert (
        f"{path.name} row {row}" in skipped["examples"][0] and repr(key) in skipped["examples"][0]
    )
    assert (table[R.SOURCE_SPLIT] == "train").sum() == kept - 1
    # The table was cached, and the cached copy gives the same table back.
    again = loader(root, cache_dir=tmp_path / "cache", on_bad_row="skip")
    assert len(again.table()) == len(table) and again.report() == source.report()


class _MixedSlake(Slake):
    """A loader that lets a wrongly typed value through (no `name`: not a registered plug-in)."""

    def build(self, bad: BadRows, cleaning: CleaningLog) -> pd.DataFrame:
        table = super().build(bad, cleaning).reset_index(drop=True)
        table["modality"] = table["modality"].astype(object)
        table.loc[3, "modality"] = 7
        return table


@pytest.mark.parametrize("cached", [True, False], ids=["cache", "no-cache"])
def test_a_mixed_column_in_the_final_table_is_a_data_error_naming_it(
    tmp_path: Path, cached: bool
) -> None:
    _slake(tmp_path / "data")
    source = _MixedSlake(tmp_path / "data", cache_dir=tmp_path / "cache" if cached else None)
    with pytest.raises(DataError) as err:
        source.table()
    message = str(err.value)
    record = Slake(tmp_path / "data").table()[R.ID].iloc[3]
    assert message.startswith("slake: ") and "'modality'" in message and repr(record) in message
    assert not (tmp_path / "cache" / "tables").exists() or not any(
        (tmp_path / "cache" / "tables").rglob("table.parquet")
    )


# --- run records ---------------------------------------------------------------------------

NOT_RECORDS = [
    pytest.param("null", "not a JSON object", id="null"),
    pytest.param("5", "not a JSON object", id="number"),
    pytest.param('["status", "metrics"]', "not a JSON object", id="list"),
    pytest.param('{"status": 1, "metrics": {}}', "'status'", id="status-not-text"),
    pytest.param('{"status": "finished", "metrics": [0.5]}', "'metrics'", id="metrics-list"),
    pytest.param('{"status": "finished", "metrics": null}', "'metrics'", id="metrics-null"),
    pytest.param('{"status": "finished", "metrics": {}, "config": [1]}', "'config'", id="config"),
]


@pytest.mark.parametrize(("text", "what"), NOT_RECORDS)
def test_read_record_rejects_any_other_shape_naming_the_file(
    tmp_path: Path, text: str, what: str
) -> None:
    path = tmp_path / "run" / "results.json"
    path.parent.mkdir()
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        read_record(path)
    assert str(path) in str(err.value) and what in str(err.value)


def test_a_null_record_is_run_again_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text("null")
    record = RunRecord(tmp_path, OmegaConf.create({"seed": 0, "task": {"name": "train_eval"}}))
    assert record.finished_before() is None


def _no_config_record(root: Path) -> Path:
    path = root / "no_config" / "results.json"
    path.parent.mkdir(parents=True)
    metrics = headline(np.random.default_rng(3))
    path.write_text(json.dumps({"status": "finished", "seed": 0, "metrics": metrics}))
    return path


def test_a_record_without_config_is_skipped_with_a_warning_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_record(tmp_path, "lora", 0, metrics=headline(np.random.default_rng(1)))
    path = _no_config_record(tmp_path)
    with caplog.at_level(logging.WARNING, logger="medvqa.analysis.rows"):
        runs = collect([tmp_path])
    assert str(path) in caplog.text and "config" in caplog.text
    assert "?_?" not in set(runs["setting"])
    skipped = runs[runs["source"] == str(path)]
    assert skipped["status"].tolist() == ["unreadable"] and "config" in skipped["error"].item()


@pytest.mark.heavy
def test_report_over_bad_records_is_written_and_names_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runs = tmp_path / "runs"
    write_record(runs, "lora", 0, metrics=headline(np.random.default_rng(2)))
    bad = [_no_config_record(runs)]
    for name, text in (("null", "null"), ("five", "5")):
        path = runs / name / "results.json"
        path.parent.mkdir(parents=True)
        path.write_text(text)
        bad.append(path)
    with caplog.at_level(logging.WARNING):
        assert report_main([str(runs), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "report.html").is_file()
    for path in bad:
        assert str(path) in caplog.text
    issues = pd.read_csv(tmp_path / "out" / "issues.csv")
    assert sorted(issues["source"]) == sorted(map(str, bad))
    assert set(issues["status"]) == {"unreadable"}
    # Skipped records are listed, never turned into a table of their own.
    wide = pd.read_csv(tmp_path / "out" / "tables_wide.csv")
    assert set(wide["table"]) == {"synthetic_modality"}


def test_report_over_only_bad_records_is_still_written(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    _no_config_record(runs)
    (runs / "null").mkdir()
    (runs / "null" / "results.json").write_text("null")
    assert report_main([str(runs), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "report.html").is_file()
    assert len(pd.read_csv(tmp_path / "out" / "issues.csv")) == 2


@pytest.mark.slow
def test_a_callback_or_prompt_that_cannot_be_built_fails_before_any_data_or_model_work(
    tmp_path: Path, cache_dir: Path, tiny_model_dir: Path
) -> None:
    """Both were built after the splits and the zero-shot pass (the callbacks only when
    training began); now before anything is read or loaded."""
    from tests.conftest import run_main

    for bad, said in (
        ("+callbacks.broken._target_=medvqa.NoSuchCallback", "NoSuchCallback"),
        ("prompt._target_=medvqa.NoSuchPrompt", "NoSuchPrompt"),
    ):
        out = tmp_path / said
        proc = run_main(["debug=smoke", "logger=csv", bad], out, cache_dir)
        assert proc.returncode == 1 and said in proc.stderr, proc.stderr[-2000:]
        assert not (out / "splits.json").exists() and not (out / "predictions.jsonl").exists()
