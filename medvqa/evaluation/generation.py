"""Batched greedy generation, appended to a JSONL file as it is produced (and resumed).

A killed run loses at most one batch: on restart the ids already in the file are skipped.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from medvqa.data import records as R
from medvqa.data.base import VQASource
from medvqa.data.datamodule import META_KEY, VQADataset, make_loader
from medvqa.evaluation.families.traditional import PREDICTION
from medvqa.hashing import Hasher

log = logging.getLogger(__name__)

SPLIT = R.SPLIT
MODEL = "model"  # fingerprint of the weights that produced a prediction


def weights_fingerprint(model: torch.nn.Module, probe: int = 4096) -> str:
    """Identify the weights cheaply: shapes plus the first `probe` values of trainable tensors.

    Resuming must only reuse predictions of the same weights: a restarted job whose training
    re-ran (and may differ) must not mix its answers with the previous model's.
    """
    key = Hasher()
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    for name, param in params or list(model.named_parameters()):
        flat = param.detach().reshape(-1)[:probe].float().cpu()
        key.update(name).update(tuple(param.shape)).update(flat.numpy().tobytes())
    return key.hexdigest()


def read_predictions(path: Path) -> pd.DataFrame:
    """All prediction records in a JSONL file (a torn last line from a crash is ignored)."""
    if not path.is_file():
        return pd.DataFrame()
    rows = []
    with path.open() as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                log.warning("%s:%d is not valid JSON (interrupted write?); ignoring it", path, n)
    return pd.DataFrame(rows)


def _end_torn_line(path: Path) -> None:
    """A crash mid-write leaves a line without newline; close it so appends stay parseable."""
    if path.is_file() and path.stat().st_size > 0:
        with path.open("rb") as fh:
            fh.seek(-1, 2)
            torn = fh.read(1) != b"\n"
        if torn:
            with path.open("a") as fh:
                fh.write("\n")


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if value is pd.NA or (isinstance(value, float) and np.isnan(value)):
        return None
    return value


@torch.no_grad()
def generate_predictions(
    model: torch.nn.Module,
    processor: Any,
    frame: pd.DataFrame,
    source: VQASource,
    out_path: Path,
    split: str,
    batch_size: int = 32,
    max_new_tokens: int = 16,
    image_mode: str = "image",
    progress: bool = True,
) -> pd.DataFrame:
    """Generate answers for `frame`, append them to `out_path`, return this split's records.

    Records already in the file for this split and these weights are kept, not regenerated.
    """
    model_id = weights_fingerprint(model)
    done = _ours(read_predictions(out_path), split, model_id)
    done_ids: set[str] = set(done[R.ID])
    todo = frame.loc[~frame[R.ID].isin(done_ids)]
    if done_ids:
        log.info("%s: resuming, %d of %d already predicted", split, len(done_ids), len(frame))
    by_id = frame.set_index(R.ID)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    _end_torn_line(out_path)
    if not todo.empty:
        dataset = VQADataset(todo, source, processor, with_answer=False, image_mode=image_mode)
        loader = make_loader(dataset, batch_size, shuffle=False, padding_side="left")
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        tokenizer = processor.tokenizer
        with (
            out_path.open("a") as fh,
            Progress(
                TextColumn(f"generate {split}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                disable=not progress,
            ) as bar,
        ):
            task = bar.add_task(split, total=len(todo))
            for batch in loader:
                ids = batch.pop(META_KEY)
                inputs = {k: v.to(device) for k, v in batch.items()}
                out = model.generate(
                    **inputs,
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    pad_token_id=tokenizer.pad_token_id,
                )
                texts = tokenizer.batch_decode(
                    out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True
                )
                for rid, text in zip(ids, texts, strict=True):
                    record = {k: _jsonable(v) for k, v in by_id.loc[rid].items()}
                    record.update(
                        {R.ID: rid, SPLIT: split, MODEL: model_id, PREDICTION: text.strip()}
                    )
                    fh.write(json.dumps(record) + "\n")
                fh.flush()
                bar.advance(task, len(ids))
        model.train(was_training)
    preds = _ours(read_predictions(out_path), split, model_id)
    return preds.drop_duplicates(subset=[R.ID], keep="last").reset_index(drop=True)


def _ours(preds: pd.DataFrame, split: str, model_id: str) -> pd.DataFrame:
    """The records of `split` made by the weights `model_id` (others are kept but ignored)."""
    if preds.empty:
        return pd.DataFrame(columns=[R.ID, SPLIT, MODEL, PREDICTION])
    mine = (preds[SPLIT] == split) & (preds.get(MODEL) == model_id)
    if (preds[SPLIT] == split).any() and not mine.any():
        log.warning("%s: predictions in the file come from other weights; regenerating", split)
    return preds.loc[mine]
