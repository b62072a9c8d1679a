"""Oncology MCQ from its manifest: answers/options, volume slicing, bad rows, cohort shift."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from medvqa.data import records as R
from medvqa.data.questions import resolve_answer
from medvqa.data.shifts import Shift, make_splits
from medvqa.data.sources.oncology_mcq import OncologyMcq, slice_index, window
from medvqa.errors import DataError
from tests.conftest import compose
from tests.native.oncology_mcq import write as write_oncology
from tests.native.oncology_mcq import write_volume


@pytest.fixture
def oncology(tmp_path: Path):
    return write_oncology(tmp_path / "oncology")


def _tie_volume() -> np.ndarray:
    """0/1 volume: slices 1 and 3 tie for the largest area (6 voxels); 2 has 1, 4 has 2."""
    vol = np.zeros((4, 3, 5), dtype=np.float32)
    vol[:2, :, 1] = 1.0
    for r, c in ((0, 0), (1, 1), (2, 0), (1, 2), (2, 1), (3, 1)):
        vol[r, c, 3] = 1.0
    vol[3, 0, 2] = 1.0
    vol[0, 0, 4] = vol[3, 2, 4] = 1.0
    return vol


def test_table_matches_the_manifest(oncology, tmp_path: Path) -> None:
    table = OncologyMcq(oncology.root, cache_dir=tmp_path / "cache").table()
    assert table[R.SOURCE_SPLIT].value_counts().to_dict() == oncology.questions
    by_id = table.set_index(R.ID)
    for row in oncology.rows:
        rec = by_id.loc[f"{row['split']}/{row['id']}"]
        assert rec[R.ANSWER] == oncology.expected[row["id"]]  # letters, case, "(B)" resolved
        assert rec[R.CANDIDATES] == row["options"] and rec["n_options"] == len(row["options"])
        assert rec[R.CASE_ID] == row["case_id"] and rec["cohort"] == row["cohort"]
        assert rec["source"] == row["source"] and rec[R.QUESTION_TYPE] == row["subcategory"]
        assert rec[R.IMAGE] == rec[R.IMAGE_ID] == row["image"]
    assert table[R.ANSWER_TYPE].eq("closed").all()
    assert set(table["n_options"]) == {2, 3, 4, 5}


def test_resolve_answer() -> None:
    options = ["Benign", "Malignant", "Indeterminate"]
    assert resolve_answer("Malignant", options) == "Malignant"
    assert resolve_answer(" malignant ", options) == "Malignant"
    for letter in ("C", "c", "C)", "(C)", "C."):
        assert resolve_answer(letter, options) == "Indeterminate"
    assert resolve_answer("D", options) is None  # a letter beyond the options
    assert resolve_answer("Cancer", options) is None
    # An option that is itself a letter wins over the letter reading.
    assert resolve_answer("B", ["B", "A"]) == "B"


def test_csv_manifest_with_json_options(oncology) -> None:
    expected = OncologyMcq(oncology.root).table()
    frame = pd.DataFrame(oncology.rows).assign(options=lambda f: f["options"].map(json.dumps))
    frame.loc[0, "cohort"] = ""  # an empty cohort cell
    frame.to_csv(oncology.root / "questions.csv", index=False)
    table = OncologyMcq(oncology.root, manifest="questions.csv").table()
    assert table.loc[0, "cohort"] == "unknown"
    pd.testing.assert_frame_equal(table.drop(columns="cohort"), expected.drop(columns="cohort"))


def test_slice_index_max_area_and_middle() -> None:
    vol = _tie_volume()
    assert slice_index(vol, "max_area") == 1  # ties -> lowest index
    vol[0, 2, 3] = 1.0  # now slice 3 has the largest area
    assert slice_index(vol, "max_area") == 3
    assert slice_index(vol, "middle") == 2
    assert slice_index(np.zeros((2, 2, 4)), "middle") == 2
    with pytest.raises(ValueError, match="slice mode"):
        slice_index(vol, "first")


def test_window_clips_to_percentiles() -> None:
    vol = np.arange(100, dtype=np.float32).reshape(10, 10, 1)
    pixels = window(vol[..., 0], vol)
    assert pixels.dtype == np.uint8 and pixels.min() == 0 and pixels.max() == 255
    assert pixels[0, 0] == pixels[0, 1] == 0 and pixels[9, 8] == pixels[9, 9] == 255
    assert 0 < pixels[5, 0] < 255
    assert not window(np.ones((2, 2)), np.ones((2, 2, 2))).any()  # constant: no contrast


@pytest.mark.parametrize("suffix", [".npy", ".npz", ".nii.gz"])
@pytest.mark.parametrize("mode", ["max_area", "middle"])
def test_volume_loads_as_its_representative_slice(tmp_path: Path, suffix, mode) -> None:
    vol = _tie_volume()
    vol[0, 2, 3] = 1.0  # max-area slice: 3; middle: 2
    expected_slice = vol[..., 3 if mode == "max_area" else 2]
    if suffix == ".nii.gz":  # identity affine = RAS+: shown anterior up, patient right left
        expected_slice = expected_slice[::-1, ::-1].T
    write_volume(tmp_path / f"v{suffix}", vol)
    image = OncologyMcq(tmp_path, slice=mode).load_image(f"v{suffix}", "r1")
    assert image.mode == "RGB"
    pixels = np.asarray(image)
    # Volume 0/1 with 14-15 % ones: the 1st-99th percentile window is [0, 1] -> 0/255.
    np.testing.assert_array_equal(pixels[..., 0], (expected_slice * 255).astype(np.uint8))
    assert (pixels[..., 0] == pixels[..., 2]).all()


def test_nifti_is_reoriented_before_slicing(tmp_path: Path) -> None:
    """A volume stored left-right flipped (affine says so) gives the same image as RAS+."""
    import nibabel as nib

    vol = _tie_volume()
    nib.Nifti1Image(vol, np.eye(4)).to_filename(str(tmp_path / "ras.nii.gz"))
    nib.Nifti1Image(vol[::-1].copy(), np.diag([-1.0, 1.0, 1.0, 1.0])).to_filename(
        str(tmp_path / "las.nii.gz")
    )
    source = OncologyMcq(tmp_path, slice="max_area")
    ras = np.asarray(source.load_image("ras.nii.gz"))
    np.testing.assert_array_equal(np.asarray(source.load_image("las.nii.gz")), ras)


def test_fixture_volumes_load_their_known_slice(oncology) -> None:
    source = OncologyMcq(oncology.root, slice="max_area")
    table = source.table()
    for ref, k in oncology.max_slice.items():
        rid = table.loc[table[R.IMAGE] == ref, R.ID].iloc[0]
        pixels = np.asarray(source.load_image(ref, rid))[..., 0]
        bright = pixels > 200
        assert bright.sum() == 9, (ref, k)  # the 3x3 blob exists on the max-area slice only


def test_unreadable_volume_names_file_and_record(tmp_path: Path) -> None:
    (tmp_path / "broken.nii.gz").write_bytes(b"not a nifti")
    (tmp_path / "broken.npy").write_bytes(b"junk")
    np.save(tmp_path / "cube.npy", np.zeros((2, 2, 2, 2, 2)))
    source = OncologyMcq(tmp_path)
    for name in ("broken.nii.gz", "broken.npy", "cube.npy"):
        with pytest.raises(DataError, match=rf"cannot read volume .*{name} \(record 'q7'\)"):
            source.load_image(name, "q7")
    with pytest.raises(DataError, match="escapes the dataset root"):
        source.load_image("../outside.npy", "q7")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"answer": "not an option"}, "answer 'not an option' is neither one of the options"),
        ({"answer": "E", "options": ["a", "b", "c"]}, "nor a letter A-C"),
        ({"options": ["only one"], "answer": "only one"}, "1 options; a question needs 2-5"),
        ({"options": list("abcdef"), "answer": "a"}, "6 options; a question needs 2-5"),
        ({"options": ["a", "a"], "answer": "a"}, "empty or repeated entries"),
        ({"options": "a, b"}, "not a JSON list"),
        ({"question": None}, "missing field 'question'"),
        ({"case_id": ""}, "missing field 'case_id'"),
        ({"source": "guideline"}, "field 'source' is 'guideline'"),
        ({"split": "dev"}, "field 'split' is 'dev'"),
        ({"image": "../secret.npy"}, "escapes the dataset root"),
        ({"id": "q000"}, "occurs more than once"),
    ],
)
def test_bad_rows_error_or_skip(oncology, change, message, caplog) -> None:
    rows = [dict(r) for r in oncology.rows]
    rows[1].update(change)
    for key in [k for k, v in change.items() if v is None]:
        del rows[1][key]
    oncology.manifest.write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(DataError) as err:
        OncologyMcq(oncology.root).table()
    assert "questions.jsonl row 1" in str(err.value) and message in str(err.value)
    with caplog.at_level(logging.WARNING):
        source = OncologyMcq(oncology.root, on_bad_row="skip")
        table = source.table()
    skipped = source.report()["skipped_rows"]
    assert skipped["total"] == 1 and "questions.jsonl row 1" in skipped["examples"][0]
    assert len(table) == len(oncology.rows) - 1


def test_missing_manifest_and_bad_json(oncology) -> None:
    oncology.manifest.write_text('{"case_id": "c1"}\n{oops\n')
    with pytest.raises(DataError, match=r"questions.jsonl row 1 is not valid JSON"):
        OncologyMcq(oncology.root).table()
    oncology.manifest.unlink()
    with pytest.raises(DataError, match=r"oncology MCQ manifest not found at .*questions.jsonl"):
        OncologyMcq(oncology.root).table()
    with pytest.raises(ValueError, match=r"dataset\.slice"):
        OncologyMcq(oncology.root, slice="first")


def _cohort_splits(root: Path, cache: Path):
    cfg = compose(["+experiment=oncology_cohort", f"dataset.root={root}"], cache)
    table = instantiate(cfg.dataset).table()
    shift = Shift.from_config(OmegaConf.to_container(cfg.shift, resolve=True))
    return table, shift, make_splits(table, shift, seed=0)


def test_cohort_shift_carves_validation_by_case(oncology, tmp_path: Path) -> None:
    table, shift, splits = _cohort_splits(oncology.root, tmp_path / "cache")
    assert shift.field == "cohort" and shift.merge_train_ood and shift.val_group == R.CASE_ID
    (cohort,) = shift.ood_values
    assert set(splits["test_ood"]["cohort"]) == {cohort}
    assert len(splits["test_ood"]) == (table["cohort"] == cohort).sum()  # train rows merged
    for name in ("train", "val", "test_iid"):
        assert len(splits[name]) > 0 and cohort not in set(splits[name]["cohort"])
    assert len(splits["train"]) >= 8
    # No validate split in the data: validation comes from train, whole cases at a time.
    assert set(splits["val"][R.SOURCE_SPLIT]) == {"train"}
    assert not set(splits["train"][R.CASE_ID]) & set(splits["val"][R.CASE_ID])
    assert not set(splits["train"][R.CASE_ID]) & set(splits["test_ood"][R.CASE_ID])


def test_cohort_shift_uses_a_validate_split(tmp_path: Path) -> None:
    fixture = write_oncology(tmp_path / "oncology", with_val=True)
    table, _, splits = _cohort_splits(fixture.root, tmp_path / "cache")
    assert table[R.SOURCE_SPLIT].value_counts().to_dict() == fixture.questions
    assert set(splits["val"][R.SOURCE_SPLIT]) == {"validate"}
    assert "external" not in set(splits["val"]["cohort"])


def test_the_model_is_asked_the_stem_with_lettered_options(oncology, tmp_path: Path) -> None:
    """The options reach the prompt (answers are scored against them, by text or letter)."""
    from medvqa.data.answers import resolve_prediction

    table = OncologyMcq(oncology.root, cache_dir=tmp_path / "cache").table()
    row = oncology.rows[0]
    rec = table.set_index(R.ID).loc[f"{row['split']}/{row['id']}"]
    lines = rec[R.QUESTION].split("\n")
    assert rec["stem"] == lines[0] == row["question"].strip()
    assert lines[1 : 1 + len(row["options"])] == [
        f"{letter}. {option}" for letter, option in zip("ABCDE", row["options"], strict=False)
    ]
    assert lines[-1] == "Answer with the letter of the correct option."
    letter = "ABCDE"[list(row["options"]).index(rec[R.ANSWER])]
    assert resolve_prediction(letter, list(row["options"])) == rec[R.ANSWER]
    assert resolve_prediction(f"{letter}. {rec[R.ANSWER]}", list(row["options"])) == rec[R.ANSWER]
