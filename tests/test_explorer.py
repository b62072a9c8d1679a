"""The row explorer (medvqa.analysis.explorer) without a browser: the rows it builds from a run
folder, the passes and jurors it finds there, the images it shows and what a hostile run folder
can and cannot do to the page. tests/test_browser.py drives the page itself in Chromium; the W&B
rows table is checked in tests/test_wandb_rows.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from medvqa import plugins
from medvqa.analysis.aggregate import collect
from medvqa.analysis.explorer import (
    ASSETS,
    ROWS_JS,
    THUMBS,
    rows_script,
    run_rows,
    thumbnail,
    write_explorer,
)
from medvqa.data.transforms import apply_transform
from medvqa.generation.passes import ImageMode, Main
from tests.test_report import PEFT_LABELS, write_record

# Model output and data that are markup: the page shows them as text, never as elements.
MARKUP = '</script><img src=x onerror="alert(1)"><b>left</b> & "lobe"'
CORRUPTION = "corruption:high:0"
COLOURS = {"a.png": (200, 40, 40), "b.png": (40, 200, 40), "c.png": (40, 40, 200)}


def rows_data(out: Path) -> dict[str, Any]:
    """The JSON literal of explorer/rows.js, decoded."""
    text = (out / ASSETS / ROWS_JS).read_text()
    assert text.startswith("window.MEDVQA_EXPLORER = ") and text.endswith(";\n")
    return json.loads(text[len("window.MEDVQA_EXPLORER = ") : -2])


def write_images(root: Path) -> None:
    """Three small images of distinct colours, with a gradient a corruption visibly changes."""
    root.mkdir(parents=True, exist_ok=True)
    ramp = np.linspace(0, 1, 40)[None, :, None]
    for name, colour in COLOURS.items():
        pixels = (np.array(colour)[None, None, :] * (0.5 + 0.5 * ramp)).astype(np.uint8)
        Image.fromarray(np.repeat(pixels, 30, axis=0)).save(root / name)


def explorer_run(
    root: Path,
    data_root: Path,
    peft: str = "lora",
    wrong: tuple[int, ...] = (1, 4),
    dataset: dict[str, Any] | None = None,
) -> Path:
    """A finished run folder as train_eval writes it: results.json (a VQA-RAD record naming
    `data_root`, the modality shift, a jury of two, its passes: the main answers and a blank
    image's), scores.parquet, scores_blank.parquet and predictions.jsonl, six closed questions
    (three i.i.d., three OoD under a corruption)."""
    write_images(data_root)
    n = 6
    images = ["a.png", "b.png", "c.png", "a.png", "b.png", "c.png"]
    truth = ["yes", "no", "yes", "no", "yes", "no"]
    predicted = [("no" if t == "yes" else "yes") if i in wrong else t for i, t in enumerate(truth)]
    rows = pd.DataFrame(
        {
            "id": [f"q{i}" for i in range(n)],
            "image": images,
            "image_id": [im.removesuffix(".png") for im in images],
            "question": ["is there a lesion?", MARKUP, "is it ct?", "is it ct?", "x", "y"],
            "answer": truth,
            "answer_type": "closed",
            "question_type": "presence",
            "candidates": [["yes", "no"]] * n,
            "case_id": [f"c{i}" for i in range(n)],
            "source_split": "test",
            "modality": ["ct", "mri", "ct", "x-ray", "x-ray", "x-ray"],
            "split": ["test_iid"] * 3 + ["test_ood"] * 3,
            "image_transform": [None] * 3 + [CORRUPTION] * 3,
        }
    )
    label = PEFT_LABELS.get(peft, peft)
    passes = [Main(label=label, tuned=True), ImageMode.after(label, image_mode="blank")]
    extra = {
        "provenance": {
            "metrics": {
                "traditional": {"ci_columns": {"closed_acc": ["closed_correct", "closed"]}}
            },
            "passes": [p.record() for p in passes],
        }
    }
    path = write_record(root, peft, 0, metrics={"test_iid/closed_acc": 0.5}, extra=extra)
    record = json.loads(path.read_text())
    record["config"]["dataset"] = dataset or {
        "_target_": plugins.target_of(plugins.get("dataset", "vqa_rad")),
        "root": str(data_root),
    }
    record["config"]["shift"]["field"] = "modality"
    record["config"]["data"]["eval_image"] = "image"
    path.write_text(json.dumps(record))
    folder = path.parent
    with (folder / "predictions.jsonl").open("w") as fh:
        for row in rows.assign(prediction=predicted, model="m").to_dict("records"):
            fh.write(json.dumps(row) + "\n")
    main = rows.assign(prediction=predicted)
    main["closed_correct"] = [float(p == t) for p, t in zip(predicted, truth, strict=True)]
    main["judge_score"] = main["closed_correct"]
    main["judge_score@a"] = main["closed_correct"]
    main["judge_score@b"] = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0]  # disagrees with a on q2, q3, q4
    main.to_parquet(folder / "scores.parquet")
    # Under a blank image the model says "no" to everything: its "yes" answers change.
    blank = rows.assign(prediction="no")
    blank["closed_correct"] = [float(t == "no") for t in truth]
    blank.to_parquet(folder / "scores_blank.parquet")
    return folder


@pytest.fixture
def run_folder(tmp_path: Path) -> Path:
    return explorer_run(tmp_path / "runs", tmp_path / "data")


def test_a_run_folder_becomes_rows_with_every_pass_juror_and_field(
    run_folder: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    assert write_explorer(collect([tmp_path / "runs"]), out) == out / "explorer.html"
    data = rows_data(out)
    (run,) = data["runs"]
    assert run["passes"] == [{"key": "blank", "label": "LoRA, blank image"}]
    assert run["jurors"] == ["a", "b"] and run["group"] == "modality"
    # the dataset's own fields, in the order of its rows; none of the job's own keys
    assert run["fields"] == ["answer_type", "question_type", "modality"]
    rows = {r["id"]: r for r in data["rows"]}
    assert len(rows) == 6
    assert [rows[f"q{i}"]["c"] for i in range(6)] == [1, 0, 1, 1, 0, 1]
    assert [rows[f"q{i}"]["sc"] for i in range(6)] == [1, 0, 1, 1, 0, 1]  # closed_acc's column
    assert [rows[f"q{i}"]["p"][0][1] for i in range(6)] == [1, 1, 1, 0, 0, 0]  # changed (blank)
    assert [rows[f"q{i}"]["p"][0][2] for i in range(6)] == [0, 1, 0, 1, 0, 1]  # right (blank)
    assert [rows[f"q{i}"]["jd"] for i in range(6)] == [0, 0, 1, 1, 1, 0]
    assert rows["q3"]["g"] == "x-ray" and rows["q3"]["m"] == ["closed", "presence", "x-ray"]
    assert rows["q1"]["q"] == MARKUP  # the data as it was, character for character
    assert "<" not in (out / ASSETS / ROWS_JS).read_text()  # no value can end the script


def test_thumbnails_are_the_images_the_model_saw_each_written_once(
    run_folder: Path, tmp_path: Path
) -> None:
    """The i.i.d. rows show their file; the OoD rows their corrupted image, drawn as the
    dataset draws it for the model (per row): three files for three i.i.d. images, one per OoD
    row."""
    out = tmp_path / "out"
    out.mkdir()
    write_explorer(collect([tmp_path / "runs"]), out)
    rows = {r["id"]: r for r in rows_data(out)["rows"]}
    thumbs = sorted((out / ASSETS / THUMBS).iterdir())
    assert len(thumbs) == 6
    assert rows["q0"]["img"] != rows["q3"]["img"]  # one file, corrupted in the OoD split
    data = tmp_path / "data"
    for rid, seen in (
        ("q0", Image.open(data / "a.png")),
        ("q3", apply_transform(Image.open(data / "a.png").convert("RGB"), CORRUPTION, "q3", "a")),
    ):
        shown = np.asarray(Image.open(out / rows[rid]["img"]).convert("RGB"))
        assert np.array_equal(shown, np.asarray(thumbnail(seen)))


def test_two_runs_share_the_thumbnails_of_their_images(tmp_path: Path) -> None:
    explorer_run(tmp_path / "runs", tmp_path / "data", peft="lora")
    explorer_run(tmp_path / "runs", tmp_path / "data", peft="full", wrong=(0,))
    out = tmp_path / "out"
    out.mkdir()
    write_explorer(collect([tmp_path / "runs"]), out)
    data = rows_data(out)
    assert len(data["runs"]) == 2 and len(data["rows"]) == 12
    assert len(list((out / ASSETS / THUMBS).iterdir())) == 6


def test_a_hostile_run_folder_gets_no_code_and_no_file_outside_its_dataset(
    tmp_path: Path,
) -> None:
    """A record naming a class that is no dataset plug-in gets its rows without images (and
    says why); an image path that leaves the dataset's root gets no image; a scored table
    without the columns it needs leaves its run out; nothing fails."""
    Image.new("RGB", (8, 8)).save(tmp_path / "secret.png")  # beside the dataset, not in it
    hostile = {"_target_": "os.system", "command": "touch pwned"}
    explorer_run(tmp_path / "runs", tmp_path / "data", dataset=hostile)
    folder = explorer_run(tmp_path / "other", tmp_path / "data", peft="full")
    scored = pd.read_parquet(folder / "scores.parquet")
    scored.loc[0, "image"] = "../secret.png"
    scored.to_parquet(folder / "scores.parquet")
    odd = explorer_run(tmp_path / "odd", tmp_path / "data", peft="ia3")  # no answer types
    pd.read_parquet(odd / "scores.parquet").drop(columns="answer_type").to_parquet(
        odd / "scores.parquet"
    )
    out = tmp_path / "out"
    out.mkdir()
    write_explorer(collect([tmp_path / "runs", tmp_path / "other", tmp_path / "odd"]), out)
    data = rows_data(out)
    notes = {run["name"]: run["notes"] for run in data["runs"]}
    assert set(notes) == {"LoRA", "Full Finetune"}  # the odd one is left out, with a warning
    assert any("'os.system' is not a registered dataset" in n for n in notes["LoRA"])
    assert not (Path.cwd() / "pwned").exists()
    images = {(data["runs"][r["r"]]["name"], r["id"]): r["img"] for r in data["rows"]}
    assert all(images[("LoRA", f"q{i}")] is None for i in range(6))
    assert images[("Full Finetune", "q0")] is None and images[("Full Finetune", "q1")]


def test_rows_match_passes_by_split_and_id_and_miss_nothing_silently() -> None:
    """A pass without an answer for a row leaves its cells empty (never another row's); the
    score is the headline's per-sample column for the row's answer type."""
    main = pd.DataFrame(
        {
            "id": ["a", "a", "b"],
            "split": ["test_iid", "test_ood", "test_iid"],
            "answer_type": ["closed", "closed", "open"],
            "prediction": ["Yes", "no", "left lobe"],
            "closed_correct": [1.0, 0.0, np.nan],
            "open_f1": [np.nan, np.nan, 0.5],
        }
    )
    other = pd.DataFrame(
        {"id": ["a", "b"], "split": ["test_ood", "test_iid"], "prediction": ["no", "Left  lobe."]}
    )
    columns = {"closed_acc": ["closed_correct", "closed"], "open_f1": ["open_f1", "open"]}
    rows = run_rows({"": main, "order1/": other}, ["closed_acc", "open_f1"], columns, None)
    assert pd.isna(rows["order1/prediction"][0])
    assert rows["order1/prediction"].tolist()[1:] == ["no", "Left  lobe."]
    assert rows["order1/changed"].tolist()[1:] == [0.0, 0.0]  # the same once normalised
    assert np.isnan(rows["order1/changed"][0])
    assert rows["score"].tolist() == [1.0, 0.0, 0.5]
    assert "jurors_disagree" not in rows  # no jury


def test_the_script_holds_only_a_json_literal() -> None:
    """Every character that could end the script, open markup or break a line in JavaScript is
    escaped; the literal decodes to the data as it was."""
    data = {"rows": [{"q": MARKUP + "\u2028\u2029 é </SCRIPT> <!-- ]]>"}]}
    script = rows_script(data)
    assert not set(script[:-2]) & set("<>&\u2028\u2029") and script.isascii()
    assert json.loads(script.removeprefix("window.MEDVQA_EXPLORER = ").removesuffix(";\n")) == data
