"""Each run's W&B rows table (`tracking.log_rows`), read back from the offline run's own files:
the table `wandb sync` uploads (the run's `run_table` artifact, recorded in `run-<id>.wandb`)
holds every row with its image as a `wandb.Image`, each distinct image stored once, beside the
explorer's columns (the answers under every pass, the jurors' verdicts)."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from PIL import Image

from medvqa.analysis.explorer import run_rows, wandb_images
from medvqa.tracking import IMAGE_COLUMN, log_rows

# The offline run file: a LevelDB-style log of protobuf records (wandb-core's own format):
# a 7-byte header, then 32 KiB blocks of chunks, each with a 7-byte header (CRC, length, kind).
HEADER, BLOCK, CHUNK_HEADER = 7, 32 * 1024, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def wandb_records(path: Path) -> Iterator[Any]:
    """The records of an offline run's `run-<id>.wandb`, as wandb's protobuf `Record`s."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, parts = HEADER, []
    while pos + CHUNK_HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < CHUNK_HEADER:  # the block's tail is padding
            pos += left
            continue
        length = int.from_bytes(data[pos + 4 : pos + 6], "little")
        kind = data[pos + 6]
        if pos + CHUNK_HEADER + length > len(data):  # still being written
            return
        parts.append(data[pos + CHUNK_HEADER : pos + CHUNK_HEADER + length])
        pos += CHUNK_HEADER + length
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(b"".join(parts))
            parts = []
            yield record


def complete_records(run_file: Path, timeout: float = 30.0) -> list[Any]:
    """The run file's records once it holds the run's `exit` record: wandb-core may still be
    writing it for a moment after `wandb.finish()` returns."""
    deadline = time.monotonic() + timeout
    while True:
        records = list(wandb_records(run_file))
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        assert time.monotonic() < deadline, f"{run_file} has no exit record after {timeout} s"
        time.sleep(0.2)


def offline_table(run_dir: Path, key: str) -> tuple[dict[str, Any], dict[str, Path]]:
    """(the table `key` as its run_table artifact holds it, {each file of the artifact: the
    local file `wandb sync` uploads}) of the one offline W&B run under `run_dir`."""
    (run_file,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    records = complete_records(run_file)
    seen = []
    for record in records:
        if record.WhichOneof("record_type") != "artifact" or record.artifact.type != "run_table":
            continue
        files = {e.path: Path(e.local_path) for e in record.artifact.manifest.contents}
        seen += [p for p in files if p.endswith(".table.json")]
        table = f"{key}.table.json"
        if table in files:
            return json.loads(files[table].read_text()), files
    raise AssertionError(f"{run_file} logged no table {key!r}; its tables: {seen}")


def check_rows_table(run_dir: Path, key: str, n_rows: int, n_images: int) -> dict[str, Any]:
    """The table `key` has `n_rows` rows, each with an image, `n_images` of them distinct
    (each stored once, a PNG the upload holds); returns the table."""
    table, files = offline_table(run_dir, key)
    assert len(table["data"]) == n_rows and table["columns"][0] == IMAGE_COLUMN
    cells = [row[0] for row in table["data"]]
    assert all(c and c["_type"] == "image-file" for c in cells), cells[:3]
    images = {c["path"] for c in cells}
    assert len(images) == n_images
    stored = [p for p in files if p.startswith("media/images/")]
    assert sorted(stored) == sorted(images)
    for path in stored:
        assert files[path].read_bytes()[:4] == b"\x89PNG"
    return table


@pytest.mark.heavy
def test_the_rows_table_holds_each_image_once_and_every_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning.pytorch.loggers import WandbLogger

    from medvqa import plugins
    from medvqa.tracking import finish
    from tests.test_explorer import explorer_run

    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb-data"))  # staged uploads
    monkeypatch.setenv("WANDB_SILENT", "true")
    folder = explorer_run(tmp_path / "runs", tmp_path / "data")
    scored = {
        "": pd.read_parquet(folder / "scores.parquet"),
        "blank/": pd.read_parquet(folder / "scores_blank.parquet"),
    }
    rows = run_rows(
        scored, ["closed_acc"], {"closed_acc": ["closed_correct", "closed"]}, "modality"
    )
    source = plugins.get("dataset", "vqa_rad")(root=tmp_path / "data")
    logger = WandbLogger(project="medvqa", mode="offline", save_dir=str(tmp_path / "run"))
    try:
        with tempfile.TemporaryDirectory() as thumbs:  # gone once logged, as in report_run
            log_rows([logger], "predictions", rows, wandb_images(rows, source, Path(thumbs)))
    finally:
        finish([logger])
        import wandb

        wandb.teardown()  # wandb's process-wide settings (its data dir) go with this test
    # three i.i.d. images, and each OoD row's own corruption of its image
    table = check_rows_table(tmp_path / "run", "predictions", n_rows=6, n_images=6)
    columns = table["columns"]
    assert {"prediction", "blank/prediction", "blank/changed", "judge_score@a"} <= set(columns)
    assert {"jurors_disagree", "correct", "score", "group"} <= set(columns)
    changed = [row[columns.index("blank/changed")] for row in table["data"]]
    assert changed == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]


def test_rows_past_the_cap_keep_their_row_without_an_image(tmp_path: Path) -> None:
    from medvqa import plugins
    from tests.test_explorer import explorer_run

    folder = explorer_run(tmp_path / "runs", tmp_path / "data")
    rows = pd.read_parquet(folder / "scores.parquet")
    source = plugins.get("dataset", "vqa_rad")(root=tmp_path / "data")
    images = wandb_images(rows, source, tmp_path / "thumbs", cap=2)
    assert [im is not None for im in images] == [True, True, False, True, True, False]
    assert Image.open(images[0]).size == (40, 30)  # within the thumbnail size: never enlarged
