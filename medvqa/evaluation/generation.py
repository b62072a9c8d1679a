"""Batched greedy generation through the Lightning Trainer, written as it is produced.

Generation is a Trainer predict loop, so it runs on the strategy's devices (the GPUs training
used) under its precision (DeepSpeed excepted: DDP on the same devices). With N ranks, each rank
takes every N-th of the rows still to answer (possibly none); each rank appends its answers to
its own shard file as batches finish (`predictions.jsonl.rank<k>`) and, once every rank is done,
global rank 0 merges the shards into the predictions file. A
killed run loses at most one batch per rank: on restart the ids already predicted by the same
weights (in the file or in a shard left behind) are skipped. Answers of other weights (an
attempt that trained differently) are moved out of the file into `<file>.stale` before
generation starts, and a row answered twice is kept once: the file holds one answer per row.

With shared image prefixes (`model.share_image_prefix`, `medvqa.evaluation.prefix`) the rows to
answer are ordered by the image they show and each rank takes a contiguous run of them, so a
batch holds the questions of as few images as possible and each image's prompt prefix runs once.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pandas as pd
import torch
from hydra.utils import instantiate
from lightning.pytorch.callbacks import BasePredictionWriter
from omegaconf import OmegaConf
from torch.utils.data import DataLoader
from transformers import LogitsProcessor, LogitsProcessorList

from medvqa.atomic import write_file
from medvqa.data import records as R
from medvqa.data.base import VQASource
from medvqa.data.records import PREDICTION
from medvqa.distributed import is_global_zero
from medvqa.evaluation.prediction_files import read_predictions
from medvqa.evaluation.prefix import (
    SHARED_KEY,
    collate_shared,
    generate_shared,
    image_token_id,
    sharing_refusal,
    sliding_window,
)
from medvqa.hashing import Hasher, file_hash
from medvqa.interrupts import stage
from medvqa.measure import measured
from medvqa.models.adapters import mergeable_layers, merged_adapters
from medvqa.models.prompting import PLAIN, PromptTemplate
from medvqa.models.saving import weights_fingerprint
from medvqa.models.spec import ModelSchema
from medvqa.training.datamodule import (
    META_KEY,
    VQADataset,
    collate,
    loader_options,
    make_loader,
)
from medvqa.training.spec import DataSchema, TrainerSchema
from medvqa.training.strategies import prediction_strategy

log = logging.getLogger(__name__)

SPLIT = R.SPLIT
MODEL = "model"  # fingerprint of the weights that produced a prediction


class ChosenLogProbs(LogitsProcessor):
    """Records, at every decoding step, the log-probability of the token greedy decoding takes
    (the largest of the scores it sees: custom processors run after the model's own, so these
    are the scores the choice is made from), with the scores divided by each temperature of
    `R.TEMPERATURES` (the argmax is the same at every temperature). One [batch, temperatures]
    tensor per step; nothing else kept, where `output_logits` would keep batch × vocabulary
    floats per step."""

    def __init__(self, temperatures: Sequence[float] = R.TEMPERATURES) -> None:
        self.temperatures = tuple(float(t) for t in temperatures)
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        z = scores.float()
        top = z.amax(dim=-1, keepdim=True)
        # log softmax(z / T) at the argmax: (max - max) / T - logsumexp((z - max) / T)
        lse = torch.stack([torch.logsumexp((z - top) / t, dim=-1) for t in self.temperatures])
        self.steps.append(-lse.T)
        return scores

    def per_answer(
        self, new_tokens: torch.Tensor, end_ids: Sequence[int]
    ) -> list[tuple[float, float, int, dict[str, float]]]:
        """(mean, min, count, {temperature: sum}) of the log-probabilities per row of
        `new_tokens` (the generated part of the sequences), counting tokens up to and including
        the first end token; mean and min at temperature 1."""
        nan = float("nan")
        if not self.steps or new_tokens.shape[1] == 0:
            return [(nan, nan, 0, {})] * len(new_tokens)
        steps = torch.stack(self.steps, dim=1)[:, : new_tokens.shape[1]].cpu()  # [B, S, T]
        tokens = new_tokens[:, : steps.shape[1]].cpu()
        ends = torch.isin(tokens, torch.tensor(list(end_ids), dtype=tokens.dtype))
        after_end = (ends.int().cumsum(dim=1) - ends.int()) > 0
        valid = ~after_end
        count = valid.sum(dim=1)
        sums = (steps * valid[..., None]).sum(dim=1)  # [B, T]
        one = self.temperatures.index(1.0)
        at_one = steps[..., one]
        mean = sums[:, one] / count.clamp(min=1)
        low = at_one.masked_fill(after_end, float("inf")).amin(dim=1)
        out = []
        for m, lo, n, by_t in zip(mean.tolist(), low.tolist(), count.tolist(), sums.tolist(),
                                  strict=True):  # fmt: skip
            grid = {str(t): v for t, v in zip(self.temperatures, by_t, strict=True)}
            out.append((m, lo, n, grid) if n else (nan, nan, 0, {}))
        return out


def generate(model: torch.nn.Module, batch: dict[str, Any], **settings: Any) -> torch.Tensor:
    """`model.generate` of a plain batch (`prefix.generate_shared`'s counterpart)."""
    return model.generate(**batch, **settings)


def end_token_ids(model: torch.nn.Module, tokenizer: Any) -> list[int]:
    """The tokens that end an answer: the generation config's (Qwen has several), else the
    tokenizer's end-of-sequence token."""
    config = getattr(model, "generation_config", None)
    ids = getattr(config, "eos_token_id", None) if config is not None else None
    if ids is None:
        ids = tokenizer.eos_token_id
    return [int(i) for i in (ids if isinstance(ids, list | tuple) else [ids]) if i is not None]


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
            _end_torn_line(out_path)
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
    records = [{k: _jsonable(v) for k, v in r.items()} for r in kept.to_dict("records")]
    text = "".join(json.dumps(r) + "\n" for r in records)
    write_file(out_path, lambda tmp: tmp.write_text(text))
    return len(preds) - len(kept)


def done_ids(out_path: Path, split: str, model_id: str) -> set[str]:
    """Ids of `split` already answered by the weights `model_id` (shards merged and other
    weights' answers set aside first)."""
    set_aside_other_weights(out_path, model_id)
    return set(_ours(read_predictions(out_path), split, model_id)[R.ID])


class GenerationModule(L.LightningModule):
    """Greedy decoding of a batch of left-padded prompts; returns (id, answer) pairs.

    A module of its own (not the training module) so that the untuned base, a trained model and
    a model reloaded from a run all generate through the same predict loop.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        max_new_tokens: int,
        merge_adapters: bool,
    ) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.merge_adapters = merge_adapters
        self._merged: ExitStack | None = None

    def on_predict_start(self) -> None:
        # Here, not around trainer.predict: the strategy has put the weights on the device.
        self._merged = ExitStack()
        self._merged.enter_context(merged_adapters(self.model, self.merge_adapters))

    def on_predict_end(self) -> None:
        if self._merged is not None:
            self._merged.close()
            self._merged = None

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> list[tuple[Any, ...]]:
        """(id, answer, mean log-prob, min log-prob, tokens, {temperature: summed log-prob})
        per row of the batch."""
        ids = batch.pop(META_KEY)
        pad = self.tokenizer.pad_token_id
        recorder = ChosenLogProbs()
        settings = {
            "max_new_tokens": self.max_new_tokens,
            "do_sample": False,
            "pad_token_id": self.tokenizer.eos_token_id if pad is None else pad,
            "logits_processor": LogitsProcessorList([recorder]),
        }
        out = (generate_shared if SHARED_KEY in batch else generate)(self.model, batch, **settings)
        new = out[:, batch["input_ids"].shape[1] :]
        texts = self.tokenizer.batch_decode(new, skip_special_tokens=True)
        confidence = recorder.per_answer(new, end_token_ids(self.model, self.tokenizer))
        return [
            (str(rid), text.strip(), *conf)
            for rid, text, conf in zip(ids, texts, confidence, strict=True)
        ]


class GenerationData(L.LightningDataModule):
    """The prompts of one split that these weights have not answered yet.

    Built inside the predict loop, where the process group exists: global rank 0 reads what is
    done and broadcasts the ids to do, so every rank shards the same list.
    """

    def __init__(
        self,
        frame: pd.DataFrame,
        source: VQASource,
        processor: Any,
        out_path: Path,
        split: str,
        model_id: str,
        batch_size: int,
        image_mode: str = DataSchema.eval_image,
        num_workers: int | None = DataSchema.num_workers,
        prompt: PromptTemplate = PLAIN,
        mismatch_field: str = DataSchema.mismatch_field,
        pool: pd.DataFrame | None = None,
        share_image_prefix: bool = ModelSchema.share_image_prefix,
        shared_length: int | None = None,
    ) -> None:
        super().__init__()
        self.frame = frame
        # Shared image prefixes, on rows of at most `shared_length` tokens (a sliding window);
        # `share_image_prefix` as decided for the model (`shares_prefixes`).
        self.share_image_prefix = share_image_prefix
        self.shared_length = shared_length
        self.mismatch_field = mismatch_field
        # The rows the partner-image modes draw from: this whole split (not a rank's shard) or
        # what the caller gives (`mismatched`: every test split of the job).
        self.pool = frame if pool is None else pool
        self.prompt = prompt
        self.source = source
        self.processor = processor
        self.out_path = Path(out_path)
        self.split = split
        self.model_id = model_id
        self.batch_size = batch_size
        self.image_mode = image_mode
        self.num_workers = num_workers
        self.by_id = frame.set_index(R.ID)
        self.n_todo = 0
        # Fewer rows left than ranks (a resumed split, a tiny one): some ranks get none. They
        # still run the loop's set-up collectives; the merge waits for every rank after it.
        self.allow_zero_length_dataloader_with_multiple_devices = True

    def predict_dataloader(self) -> DataLoader:
        todo: list[str] | None = None
        if self.trainer.is_global_zero:
            self.out_path.parent.mkdir(parents=True, exist_ok=True)
            done = done_ids(self.out_path, self.split, self.model_id)
            todo = [rid for rid in self.frame[R.ID] if rid not in done]
            if done:
                log.info(
                    "%s: resuming, %d of %d already predicted",
                    self.split,
                    len(done),
                    len(self.frame),
                )
        todo = self.trainer.strategy.broadcast(todo, src=0)
        self.n_todo = len(todo)
        # This rank's shard, cut here rather than by Lightning's sampler, which refuses a rank
        # without rows (prediction_trainer turns it off).
        rank, ranks = self.trainer.global_rank, self.trainer.world_size
        if self.share_image_prefix:  # a contiguous run of the rows, in the order of their images
            pending = self.frame.loc[self.frame[R.ID].isin(set(todo))]
            pending = pending.iloc[self._dataset(pending).by_image()]
            rows = pending.iloc[rank * len(pending) // ranks : (rank + 1) * len(pending) // ranks]
        else:
            rows = self.frame.loc[self.frame[R.ID].isin(set(todo[rank::ranks]))]
        collate_fn = collate
        if self.share_image_prefix:
            collate_fn = partial(
                collate_shared,
                image_token=image_token_id(self.processor),
                meta_key=META_KEY,
                max_length=self.shared_length,
            )
        return make_loader(
            self._dataset(rows),
            self.batch_size,
            shuffle=False,
            padding_side="left",
            collate_fn=collate_fn,
            **loader_options(self.trainer, self.num_workers),
        )

    def _dataset(self, rows: pd.DataFrame) -> VQADataset:
        return VQADataset(
            rows,
            self.source,
            self.processor,
            False,
            self.image_mode,
            self.prompt,
            pool=self.pool,
            mismatch_field=self.mismatch_field,
        )

    def records(self, answers: Sequence[tuple[Any, ...]]) -> list[dict[str, Any]]:
        """Prediction records: the row's fields, split, weights fingerprint, the answer and its
        log-probabilities (`GenerationModule.predict_step`)."""
        out = []
        for rid, text, mean, low, count, by_temperature in answers:
            record = {k: _jsonable(v) for k, v in self.by_id.loc[rid].items()}
            record.update({R.ID: rid, SPLIT: self.split, MODEL: self.model_id, PREDICTION: text})
            record.update({R.LOGPROB_MEAN: _jsonable(mean), R.LOGPROB_MIN: _jsonable(low)})
            record[R.ANSWER_TOKENS] = count
            record[R.LOGPROB_BY_TEMPERATURE] = by_temperature
            out.append(record)
        return out


class PredictionWriter(BasePredictionWriter):
    """Each rank appends its batch's answers to its shard (`generate_predictions` merges them
    once every rank is done: a rank without rows skips the loop's end hooks)."""

    def __init__(self) -> None:
        super().__init__(write_interval="batch")

    def write_on_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        prediction: Any,
        batch_indices: Sequence[int] | None,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        data = _generation_data(trainer)
        shard = shard_path(data.out_path, trainer.global_rank)
        _end_torn_line(shard)
        with shard.open("a") as fh:  # one write per batch: at most one batch is lost
            fh.write("".join(json.dumps(r) + "\n" for r in data.records(prediction)))


def _generation_data(trainer: L.Trainer) -> GenerationData:
    data = trainer.datamodule
    if not isinstance(data, GenerationData):
        raise TypeError("PredictionWriter needs trainer.predict(..., datamodule=GenerationData)")
    return data


def prediction_trainer(trainer_cfg: Any = None) -> L.Trainer:
    """A Trainer that generates on the devices and precision of `trainer_cfg` (the run's
    `trainer` config; None: one CPU process, for tests and scripts), under its strategy except
    DeepSpeed, which generates under DDP (`medvqa.training.strategies`)."""
    fixed: dict[str, Any] = {
        "logger": False,
        "enable_checkpointing": False,
        "enable_model_summary": False,
        "callbacks": [PredictionWriter()],
        "use_distributed_sampler": False,  # GenerationData shards the rows itself
    }
    if trainer_cfg is None:
        return L.Trainer(accelerator="cpu", devices=1, enable_progress_bar=False, **fixed)
    options = OmegaConf.to_container(OmegaConf.create(trainer_cfg), resolve=True)
    assert isinstance(options, dict)
    options["strategy"] = prediction_strategy(
        options.get("strategy", TrainerSchema.strategy),
        options.get("devices", TrainerSchema.devices),
        options.get("num_nodes", TrainerSchema.num_nodes),
        options.get("accelerator", TrainerSchema.accelerator),
    )
    return instantiate(options, **fixed)


def generate_predictions(
    model: torch.nn.Module,
    processor: Any,
    frame: pd.DataFrame,
    source: VQASource,
    out_path: Path,
    split: str,
    *,
    batch_size: int = DataSchema.eval_batch_size,
    max_new_tokens: int = ModelSchema.max_new_tokens,
    image_mode: str = DataSchema.eval_image,
    trainer_cfg: Any = None,
    num_workers: int | None = DataSchema.num_workers,
    model_id: str | None = None,
    prompt: PromptTemplate = PLAIN,
    trainer: L.Trainer | None = None,
    mismatch_field: str = DataSchema.mismatch_field,
    pool: pd.DataFrame | None = None,
    merge_adapters: bool,
    share_image_prefix: bool = ModelSchema.share_image_prefix,
) -> pd.DataFrame | None:
    """Generate answers for `frame` into `out_path` (resuming), return this split's records.

    Every rank must call it (each generates its shard); only global rank 0 gets the records,
    the other ranks get None. `model_id`: the weights' fingerprint, if the caller has it;
    `trainer`: a `prediction_trainer` to reuse (a job generates every split and image mode with
    one), else one is made from `trainer_cfg`; `merge_adapters`: fold LoRA/(IA)³ into the base
    weights while generating (`model.merge_adapters`), the weights unchanged afterwards;
    `share_image_prefix`: run each image's prompt prefix once per batch (`shares_prefixes`).
    """
    model_id = model_id or weights_fingerprint(model)
    window = sliding_window(getattr(model, "config", None))
    data = GenerationData(
        frame,
        source,
        processor,
        out_path,
        split,
        model_id,
        batch_size,
        image_mode,
        num_workers,
        prompt,
        mismatch_field,
        pool,
        shares_prefixes(model, processor, share_image_prefix),
        None if window is None else window - max_new_tokens,
    )
    trainer = trainer or prediction_trainer(trainer_cfg)
    module = GenerationModule(model, processor.tokenizer, max_new_tokens, merge_adapters)
    with (
        stage(f"generate {split} -> {out_path.name}"),
        measured(f"generate/{out_path.stem}", "rows") as phase,
    ):
        try:
            trainer.predict(module, datamodule=data, return_predictions=False)
        finally:  # an exception skips on_predict_end: the weights come back all the same
            module.on_predict_end()
        phase.items = data.n_todo
    log.info("%s: generated %d of %d answers", split, data.n_todo, len(frame))
    trainer.strategy.barrier("medvqa-predictions")  # every rank's shard is complete
    if not trainer.is_global_zero:
        return None
    merge_shards(out_path)
    preds = _ours(read_predictions(out_path), split, model_id)
    return preds.drop_duplicates(subset=[R.ID], keep="last").reset_index(drop=True)


def shares_prefixes(model: torch.nn.Module, processor: Any, enabled: bool) -> bool:
    """Whether generation runs each image's prompt prefix once (`model.share_image_prefix` and a
    family that allows it; where it does not, a log line says why)."""
    if not enabled:
        return False
    refusal = sharing_refusal(model, processor)
    if refusal is not None:
        log.info("generating without shared image prefixes: %s", refusal)
    return refusal is None


def generate_splits(
    model: torch.nn.Module,
    processor: Any,
    source: VQASource,
    frames: Mapping[str, pd.DataFrame],
    out_path: Path,
    shared_dir: Path | None = None,
    trainer: L.Trainer | None = None,
    **settings: Any,
) -> dict[str, pd.DataFrame] | None:
    """`generate_predictions` for every split in `frames` (None on ranks other than 0), with one
    prediction Trainer (`trainer`, or one made from `settings["trainer_cfg"]`).

    With `shared_dir`, the file is shared between the jobs of a sweep: answers of the same
    weights to the same rows with the same prompt and settings are copied in instead of being
    generated again (the untuned base's zero-shot answers), and a complete file is published
    there for the next job.
    """
    model_id = weights_fingerprint(model)  # once for every split (it reads every tensor)
    # Decided (and a refusal logged) once for every split, not per split.
    enabled = settings.get("share_image_prefix", ModelSchema.share_image_prefix)
    settings = {**settings, "share_image_prefix": shares_prefixes(model, processor, enabled)}
    if is_global_zero():
        set_aside_other_weights(out_path, model_id)
    shared = None
    if shared_dir is not None:
        key = prediction_key(model_id, model, processor, frames, settings)
        shared = Path(shared_dir) / f"{key}.jsonl"
        empty = not out_path.is_file() or out_path.stat().st_size == 0
        if empty and is_global_zero() and intact_shared(shared):
            out_path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(shared, out_path)
            log.info("reusing the answers of the same weights and prompts from %s", shared)
    trainer = trainer or prediction_trainer(settings.get("trainer_cfg"))
    # Another modality's image may only exist in another split (a modality shift's OoD split).
    pool = pd.concat(frames.values()) if settings.get("image_mode") == "mismatched" else None
    out = {
        split: generate_predictions(
            model,
            processor,
            frame,
            source,
            out_path,
            split,
            model_id=model_id,
            trainer=trainer,
            pool=pool,
            **settings,
        )
        for split, frame in frames.items()
    }
    if any(v is None for v in out.values()):
        return None
    if shared is not None and not intact_shared(shared, quiet=True):
        write_file(shared, lambda tmp: shutil.copyfile(out_path, tmp))
        write_file(checksum_path(shared), lambda tmp: tmp.write_text(file_hash(shared) + "\n"))
    return out  # type: ignore[return-value]


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


def prediction_key(
    model_id: str,
    model: torch.nn.Module,
    processor: Any,
    frames: Mapping[str, pd.DataFrame],
    settings: Mapping[str, Any],
) -> str:
    """What determines a set of answers: the weights, their dtype and attention kernel; the
    templates and the image processor's settings (Qwen's size cap changes the tokens); the rows
    and prompt; and how they are computed: precision, matmul precision, device type, and the
    batches (batch size and ranks decide the left padding, which can flip a near tie in bf16;
    so do shared image prefixes and merged adapters).
    Not the strategy: generation runs under DDP for DeepSpeed runs too."""
    key = Hasher().update(model_id).update(str(next(model.parameters()).dtype))
    key.update(getattr(getattr(model, "config", None), "_attn_implementation", None))
    key.update(getattr(processor, "chat_template", None) or "")
    key.update(getattr(processor.tokenizer, "chat_template", None) or "")
    image_processor = getattr(processor, "image_processor", None)
    key.update(image_processor.to_dict() if image_processor is not None else None)
    trainer: Any = settings.get("trainer_cfg") or {}
    what = {
        k: v for k, v in settings.items() if k in ("max_new_tokens", "image_mode", "batch_size")
    }
    if settings.get("image_mode") == "mismatched":  # which rows' images it shows
        what["mismatch_field"] = settings.get("mismatch_field", DataSchema.mismatch_field)
    if settings.get("merge_adapters") and mergeable_layers(model):  # W + BA rounds otherwise
        what["merge_adapters"] = True
    shares = settings.get("share_image_prefix", ModelSchema.share_image_prefix)
    if shares and sharing_refusal(model, processor) is None:
        what["share_image_prefix"] = True  # other batches, other kernel shapes: bf16 rounds
    prompt = settings.get("prompt", PLAIN)
    key.update(
        {
            **what,
            "precision": trainer.get("precision"),
            "accelerator": trainer.get("accelerator"),
            "ranks": [trainer.get("devices"), trainer.get("num_nodes", TrainerSchema.num_nodes)],
            "matmul_precision": torch.get_float32_matmul_precision(),
            "prompt": prompt.settings(),
        }
    )
    for split, frame in sorted(frames.items()):
        key.update(split).update(frame.to_json(orient="records", default_handler=str))
    return key.hexdigest()


def _ours(preds: pd.DataFrame, split: str, model_id: str) -> pd.DataFrame:
    """The records of `split` made by the weights `model_id`."""
    if preds.empty:
        return pd.DataFrame(columns=[R.ID, SPLIT, MODEL, PREDICTION])
    return preds.loc[(preds[SPLIT] == split) & (preds.get(MODEL) == model_id)]
