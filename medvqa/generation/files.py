"""The predictions file on disk: one answer per (split, row) of one set of weights.

Each rank appends its answers to its own shard (`predictions.jsonl.rank<k>`) as batches finish;
global rank 0 merges the shards once every rank is done. A killed run loses at most one batch per
rank: on restart the ids already answered by the same weights (in the file or in a shard left
behind) are skipped. Answers of other weights (an attempt that trained differently) are moved out
of the file into `<file>.stale` before generation starts, and a row answered twice is kept once.
A file shared between the jobs of a sweep (`intact_shared`) carries its SHA-256 beside it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from medvqa.atomic import write_file
from medvqa.data import records as R
from medvqa.data.records import PREDICTION
from medvqa.hashing import file_hash

log = logging.getLogger(__name__)

SPLIT = R.SPLIT
MODEL = "model"  # fingerprint of the weights that produced a prediction


def end_torn_line(path: Path) -> None:
    """A crash mid-write leaves a line without newline; close it so appends stay parseable."""
    if path.is_file() and path.stat().st_size > 0:
        with path.open("rb") as fh:
            fh.seek(-1, 2)
            torn = fh.read(1) != b"\n"
        if torn:
            with path.open("a") as fh:
                fh.write("\n")


def jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if value is pd.NA or (isinstance(value, float) and np.isnan(value)):
        return None
    return value


def shard_path(out_path: Path, rank: int) -> Path:
    """Where global rank `rank` appends its answers before rank 0 merges them."""
    return out_path.with_name(f"{out_path.name}.rank{rank}")


def merge_shards(out_path: Path) -> int:
    """Append every rank's shard file to `out_path` and remove it; returns records moved.

    A crash mid-merge at worst repeats records, which readers drop (`keep="last"`)."""
    moved = 0
    for shard in sorted(out_path.parent.glob(f"{out_path.name}.rank*")):
        records = read_predictions(shard)
        if not records.empty:
            end_torn_line(out_path)
            with out_path.open("a") as fh:
                fh.write("".join(json.dumps(r) + "\n" for r in records.to_dict("records")))
            moved += len(records)
        shard.unlink()
    return moved


def set_aside_other_weights(out_path: Path, model_id: str) -> int:
    """Leave in `out_path` only the answers of the weights `model_id`, one per (split, row):
    other weights' answers are appended to `<file>.stale`, repeats dropped (the last kept).
    Returns how many records left the file."""
    merge_shards(out_path)
    preds = read_predictions(out_path)
    if preds.empty:
        return 0
    ours = preds[MODEL] == model_id if MODEL in preds else pd.Series(False, index=preds.index)
    kept = preds.loc[ours].drop_duplicates(subset=[SPLIT, R.ID], keep="last")
    if len(kept) == len(preds):
        return 0
    stale = preds.loc[~ours]
    if not stale.empty:
        aside = out_path.with_name(f"{out_path.name}.stale")
        with aside.open("a") as fh:
            fh.write("".join(json.dumps(r) + "\n" for r in stale.to_dict("records")))
        log.warning(
            "%s: %d answers of other weights (an earlier attempt) moved to %s",
            out_path,
            len(stale),
            aside,
        )
    records = [{k: jsonable(v) for k, v in r.items()} for r in kept.to_dict("records")]
    text = "".join(json.dumps(r) + "\n" for r in records)
    write_file(out_path, lambda tmp: tmp.write_text(text))
    return len(preds) - len(kept)


def done_ids(out_path: Path, split: str, model_id: str) -> set[str]:
    """Ids of `split` already answered by the weights `model_id` (shards merged and other
    weights' answers set aside first)."""
    set_aside_other_weights(out_path, model_id)
    return set(ours(read_predictions(out_path), split, model_id)[R.ID])


def checksum_path(shared: Path) -> Path:
    """Beside a shared answers file: its SHA-256, written after it is published."""
    return shared.with_name(f"{shared.name}.sha256")


def intact_shared(shared: Path, quiet: bool = False) -> bool:
    """Whether a shared answers file is there and is what was published (its SHA-256): a
    damaged or edited one is generated again (and replaced), with a warning naming the file,
    expected and found, unless `quiet`. One published before checksums is used, with a
    warning."""
    if not shared.is_file():
        return False
    sidecar = checksum_path(shared)
    if not sidecar.is_file():
        if not quiet:
            log.warning(
                "%s has no checksum (published before they were kept); used unchecked", shared
            )
        return True
    expected, found = sidecar.read_text().strip(), file_hash(shared)
    if found != expected and not quiet:
        log.warning(
            "%s has SHA-256 %s, %s records %s: damaged or edited; its answers are generated "
            "again and the file replaced",
            shared,
            found,
            sidecar.name,
            expected,
        )
    return found == expected


def ours(preds: pd.DataFrame, split: str, model_id: str) -> pd.DataFrame:
    """The records of `split` made by the weights `model_id`."""
    if preds.empty:
        return pd.DataFrame(columns=[R.ID, SPLIT, MODEL, PREDICTION])
    return preds.loc[(preds[SPLIT] == split) & (preds.get(MODEL) == model_id)]


def json_lines(
    lines: Iterable[str], bad_line: Callable[[int, json.JSONDecodeError], None]
) -> Iterator[tuple[int, Any]]:
    """(line number from 1, value) of each non-blank line of JSONL text. A line that is not
    JSON goes to `bad_line`, which raises (naming the file) or notes it and lets it be skipped:
    each reader decides whether a torn line is an error."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            bad_line(number, err)
            continue
        yield number, value


def read_predictions(path: Path) -> pd.DataFrame:
    """All prediction records in a medvqa predictions JSONL file (a torn last line from a crash
    is ignored); no model code, so that readers and console scripts start quickly."""
    if not path.is_file():
        return pd.DataFrame()

    def torn(number: int, err: json.JSONDecodeError) -> None:
        log.warning("%s:%d is not valid JSON (interrupted write?); ignoring it", path, number)

    with path.open() as fh:
        return pd.DataFrame([row for _, row in json_lines(fh, torn)])
