"""Batched greedy generation through the Lightning Trainer, written as it is produced.

Generation is a Trainer predict loop, so it runs on the strategy's devices (the GPUs training
used) under its precision (DeepSpeed excepted: DDP on the same devices). With N ranks, each rank
takes its share of the rows still to answer (possibly none, `data.GenerationData`), appends its
answers to its own shard file as batches finish and, once every rank is done, global rank 0
merges the shards into the predictions file (`files`). How a batch is decoded is one job's
`GenerationSettings` (`settings`), resolved once by the caller; `decode.Decoder` decodes.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import pandas as pd
import torch
from hydra.utils import instantiate
from lightning.pytorch.callbacks import BasePredictionWriter
from omegaconf import OmegaConf

from medvqa.atomic import write_file
from medvqa.data import records as R
from medvqa.data.base import VQASource
from medvqa.distributed import is_global_zero
from medvqa.generation.data import GenerationData, ImageChange, Target
from medvqa.generation.decode import Decoder
from medvqa.generation.files import (
    checksum_path,
    end_torn_line,
    intact_shared,
    merge_shards,
    ours,
    read_predictions,
    set_aside_other_weights,
    shard_path,
)
from medvqa.generation.logprobs import ChosenLogProbs, end_token_ids
from medvqa.generation.settings import GenerationSettings
from medvqa.hashing import Hasher, file_hash
from medvqa.interrupts import stage
from medvqa.measure import measured
from medvqa.models.adapters import merged_adapters
from medvqa.models.prompting import PLAIN, PromptTemplate
from medvqa.models.saving import weights_fingerprint
from medvqa.training.datamodule import META_KEY
from medvqa.training.progress import PredictProgress
from medvqa.training.spec import DataSchema, TrainerSchema
from medvqa.training.strategies import prediction_strategy

log = logging.getLogger(__name__)


class GenerationModule(L.LightningModule):
    """Greedy decoding of a batch of left-padded prompts; returns (id, answer) pairs.

    A module of its own (not the training module) so that the untuned base, a trained model and
    a model reloaded from a run all generate through the same predict loop.
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any, settings: GenerationSettings):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.settings = settings
        pad = tokenizer.pad_token_id
        self.decoder = Decoder(settings, tokenizer.eos_token_id if pad is None else pad)
        self.end_ids = end_token_ids(model, tokenizer)
        self._merged: ExitStack | None = None

    def on_predict_start(self) -> None:
        # Here, not around trainer.predict: the strategy has put the weights on the device.
        self._merged = ExitStack()
        self._merged.enter_context(merged_adapters(self.model, self.settings.merge_adapters))

    def on_predict_end(self) -> None:
        if self._merged is not None:
            self._merged.close()
            self._merged = None

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> list[tuple[Any, ...]]:
        """((target, id), answer, mean log-prob, min log-prob, tokens, {temperature: summed
        log-prob}) per row of the batch."""
        ids = batch.pop(META_KEY)
        recorder = ChosenLogProbs()
        out = self.decoder(self.model, batch, recorder)
        new = out[:, batch["input_ids"].shape[1] :]
        texts = self.tokenizer.batch_decode(new, skip_special_tokens=True)
        confidence = recorder.per_answer(new, self.end_ids)
        return [
            ((target, str(rid)), text.strip(), *conf)
            for (target, rid), text, conf in zip(ids, texts, confidence, strict=True)
        ]


class PredictionWriter(BasePredictionWriter):
    """Each rank appends its batch's answers to its shards (`generate_targets` merges them
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
        for target, records in data.records(prediction).items():
            shard = shard_path(data.targets[target].out_path, trainer.global_rank)
            end_torn_line(shard)
            with shard.open("a") as fh:  # one write per batch: at most one batch is lost
                fh.write("".join(json.dumps(r) + "\n" for r in records))


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
        "callbacks": [PredictionWriter(), PredictProgress()],
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
    settings: GenerationSettings,
    **options: Any,
) -> pd.DataFrame | None:
    """Generate answers for `frame` into `out_path` (resuming), return this split's records
    (None on ranks other than 0): `generate_targets` of one target, with its `options`."""
    target = Target(Path(out_path), split, frame)
    out = generate_targets(model, processor, [target], source, settings, **options)
    return None if out is None else out[0]


def generate_targets(
    model: torch.nn.Module,
    processor: Any,
    targets: Sequence[Target],
    source: VQASource,
    settings: GenerationSettings,
    *,
    image_mode: str = DataSchema.eval_image,
    trainer_cfg: Any = None,
    num_workers: int | None = DataSchema.num_workers,
    model_id: str | None = None,
    prompt: PromptTemplate = PLAIN,
    trainer: L.Trainer | None = None,
    mismatch_field: str = DataSchema.mismatch_field,
    pool: pd.DataFrame | None = None,
    image_change: ImageChange | None = None,
) -> list[pd.DataFrame] | None:
    """Generate answers for every target (a split's rows into a predictions file; several
    targets, such as one split of several passes, are batched together) in one predict loop,
    resuming; return each target's records.

    Every rank must call it (each generates its shard); only global rank 0 gets the records,
    the other ranks get None. `settings`: the job's (`settings.resolve`); `model_id`: the
    weights' fingerprint, if the caller has it; `trainer`: a `prediction_trainer` to reuse (a
    job generates every split and image mode with one), else one is made from `trainer_cfg`;
    `image_change`: a pass's change of each row's image (`data.ImageChange`).
    """
    model_id = model_id or weights_fingerprint(model)
    data = GenerationData(
        targets,
        source,
        processor,
        model_id,
        settings,
        image_mode,
        num_workers,
        prompt,
        mismatch_field,
        pool,
        image_change,
    )
    trainer = trainer or prediction_trainer(trainer_cfg)
    module = GenerationModule(model, processor.tokenizer, settings)
    split = ", ".join(dict.fromkeys(t.split for t in targets))
    names = "+".join(t.out_path.stem for t in targets)
    data.progress_label = f"generate {split} -> {names}"
    with (
        stage(f"generate {split} -> {names}"),
        measured(f"generate/{names}", "rows") as phase,
    ):
        try:
            trainer.predict(module, datamodule=data, return_predictions=False)
        finally:  # an exception skips on_predict_end: the weights come back all the same
            module.on_predict_end()
        phase.items = data.n_todo
    log.info("%s: generated %d of %d answers (%s)", split, data.n_todo, len(data.frame), names)
    trainer.strategy.barrier("medvqa-predictions")  # every rank's shard is complete
    if not trainer.is_global_zero:
        return None
    out = []
    for target in targets:
        merge_shards(target.out_path)
        preds = ours(read_predictions(target.out_path), target.split, model_id)
        out.append(preds.drop_duplicates(subset=[R.ID], keep="last").reset_index(drop=True))
    return out


@dataclass(frozen=True)
class PassFiles:
    """One pass's answers: its rows per split, its predictions file, and where a complete file
    is shared between the jobs of a sweep (None: not shared)."""

    frames: Mapping[str, pd.DataFrame]
    out_path: Path
    shared_dir: Path | None = None


def generate_passes(
    model: torch.nn.Module,
    processor: Any,
    source: VQASource,
    passes: Sequence[PassFiles],
    settings: GenerationSettings,
    *,
    trainer: L.Trainer | None = None,
    trainer_cfg: Any = None,
    image_mode: str = DataSchema.eval_image,
    num_workers: int | None = DataSchema.num_workers,
    prompt: PromptTemplate = PLAIN,
    mismatch_field: str = DataSchema.mismatch_field,
    model_id: str | None = None,
    image_change: ImageChange | None = None,
) -> list[dict[str, pd.DataFrame]] | None:
    """Every split of every pass (None on ranks other than 0), with one prediction Trainer
    (`trainer`, or one made from `trainer_cfg`); the passes of one split are generated together
    (`generate_targets`: passes that show the same images share each image's prefix).

    A pass with a `shared_dir` shares its file between the jobs of a sweep: answers of the same
    weights to the same rows with the same prompt and settings are copied in instead of being
    generated again (the untuned base's zero-shot answers), and a complete file is published
    there for the next job. `model_id`: the weights' fingerprint, if the caller has it;
    `image_change`: the passes' change of each row's image (`data.ImageChange`), if any.
    """
    model_id = model_id or weights_fingerprint(model)  # once for every split: it reads every tensor
    keys = [
        None
        if p.shared_dir is None
        else prediction_key(
            model_id,
            model,
            processor,
            p.frames,
            settings,
            image_mode=image_mode,
            mismatch_field=mismatch_field,
            prompt=prompt,
            trainer_cfg=trainer_cfg,
            image_change=image_change,
        )
        for p in passes
    ]
    shared = _reuse_shared(passes, keys, model_id)
    trainer = trainer or prediction_trainer(trainer_cfg)
    out: list[dict[str, pd.DataFrame]] = [{} for _ in passes]
    # Another modality's image may only exist in another split (a modality shift's OoD split):
    # one pass at a time in the partner modes.
    pool = pd.concat(passes[0].frames.values()) if image_mode == "mismatched" else None
    for split in passes[0].frames:
        frames = [p.frames[split] for p in passes]
        targets = [Target(p.out_path, split, f) for p, f in zip(passes, frames, strict=True)]
        got = generate_targets(
            model,
            processor,
            targets,
            source,
            settings,
            image_mode=image_mode,
            trainer_cfg=trainer_cfg,
            num_workers=num_workers,
            model_id=model_id,
            prompt=prompt,
            trainer=trainer,
            mismatch_field=mismatch_field,
            pool=pool,
            image_change=image_change,
        )
        for i, preds in enumerate(got or []):  # None on ranks other than 0
            out[i][split] = preds
    if not is_global_zero():
        return None
    _publish_shared(passes, shared)
    return out


def _reuse_shared(
    passes: Sequence[PassFiles], keys: Sequence[str | None], model_id: str
) -> list[Path | None]:
    """Each pass's file in its shared folder (None: not shared, `keys` None), its complete
    answers copied in where the pass's own file is empty; rank 0 first sets aside answers of
    other weights (a file is never resumed from another model's answers)."""
    shared: list[Path | None] = []
    for p, key in zip(passes, keys, strict=True):
        if is_global_zero():
            set_aside_other_weights(p.out_path, model_id)
        if p.shared_dir is None or key is None:
            shared.append(None)
            continue
        path = Path(p.shared_dir) / f"{key}.jsonl"
        shared.append(path)
        empty = not p.out_path.is_file() or p.out_path.stat().st_size == 0
        if empty and is_global_zero() and intact_shared(path):
            p.out_path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, p.out_path)
            log.info("reusing the answers of the same weights and prompts from %s", path)
    return shared


def _publish_shared(passes: Sequence[PassFiles], shared: Sequence[Path | None]) -> None:
    """Publish each shared pass's complete file (with its checksum, so that a torn copy is
    never reused) for the next job of the sweep, unless an intact one is there already."""
    for p, path in zip(passes, shared, strict=True):
        if path is not None and not intact_shared(path, quiet=True):
            write_file(path, lambda tmp, p=p: shutil.copyfile(p.out_path, tmp))
            write_file(
                checksum_path(path), lambda tmp, path=path: tmp.write_text(file_hash(path) + "\n")
            )


def prediction_key(
    model_id: str,
    model: torch.nn.Module,
    processor: Any,
    frames: Mapping[str, pd.DataFrame],
    settings: GenerationSettings,
    *,
    image_mode: str = DataSchema.eval_image,
    mismatch_field: str = DataSchema.mismatch_field,
    prompt: PromptTemplate = PLAIN,
    trainer_cfg: Any = None,
    image_change: ImageChange | None = None,
) -> str:
    """What determines a set of answers: the weights, their dtype and attention kernel; the
    templates and the image processor's settings (Qwen's size cap changes the tokens); the rows,
    the images shown and the prompt; and how they are computed: the generation settings (batch
    size and ranks decide the left padding, which can flip a near tie in bf16; so do shared
    image prefixes, merged adapters, the decode engine and its compilation), precision, matmul
    precision and device type. Not the strategy: generation runs under DDP for DeepSpeed runs
    too."""
    key = Hasher().update(model_id).update(str(next(model.parameters()).dtype))
    key.update(getattr(getattr(model, "config", None), "_attn_implementation", None))
    key.update(getattr(processor, "chat_template", None) or "")
    key.update(getattr(processor.tokenizer, "chat_template", None) or "")
    image_processor = getattr(processor, "image_processor", None)
    key.update(image_processor.to_dict() if image_processor is not None else None)
    trainer: Any = trainer_cfg or {}
    what: dict[str, Any] = {"image_mode": image_mode, **settings.computing(model)}
    if image_mode == "mismatched":  # which rows' images it shows
        what["mismatch_field"] = mismatch_field
    if image_change is not None:  # the pass that changes them, with its settings
        what["image_change"] = repr(image_change)
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
