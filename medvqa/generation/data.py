"""The prompts of one split, as generation reads them: ordered by image, sharded over ranks,
resumed, and each distinct image read and processed once per batch.

A batch's rows are fetched together (`GenerationDataset.__getitems__`): rows shown the same
pixels (`VQADataset.image_key`, from the metadata) share one image read from disk and one run of
the image processor (`OncePerImage`); only the text is tokenised per row. With shared prefixes
the vision tower then runs once per distinct image as well (`decode.prefill_shared`).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import lightning as L
import numpy as np
import pandas as pd
from PIL import Image
from torch.utils.data import DataLoader

from medvqa.data import records as R
from medvqa.data.base import VQASource
from medvqa.generation.files import MODEL, SPLIT, done_ids, jsonable
from medvqa.generation.prefix import IMAGE_KEY, collate_generation, image_token_id
from medvqa.generation.settings import GenerationSettings
from medvqa.models.prompting import PLAIN, PromptTemplate
from medvqa.training.datamodule import META_KEY, VQADataset, loader_options, make_loader
from medvqa.training.spec import PARTNER_MODES, DataSchema

log = logging.getLogger(__name__)

TARGET = "_target"  # a row's target among those generated together (GenerationData)


class OncePerImage:
    """An image processor that runs once per image object: a repeated call with the same
    images (by identity) and options returns a copy of the first call's output (processors
    pop keys from it). Everything else is the wrapped processor's."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._done: dict[Any, Any] = {}
        self.calls = 0  # how many times the wrapped processor ran

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        images = kwargs["images"] if "images" in kwargs else (args[0] if args else None)
        options = args if "images" in kwargs else args[1:]
        named = sorted((k, v) for k, v in kwargs.items() if k != "images")
        key = (tuple(id(i) for i in _flat(images)), repr(options), repr(named))
        if key not in self._done:
            self.calls += 1
            self._done[key] = self._inner(*args, **kwargs)
        return copy.copy(self._done[key])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _flat(images: Any) -> list[Any]:
    if isinstance(images, list | tuple):
        return [i for item in images for i in _flat(item)]
    return [images]


class ImageChange(Protocol):
    """A pass that changes the image a row is shown, with the row at hand (its metadata: a
    region to hide, a mask's file): `generation.passes.EvalPass` where `transforms_image`."""

    def transform_image(self, image: Image.Image | None, row: pd.Series) -> Image.Image | None: ...

    def image_key(self, key: str, row: pd.Series) -> str: ...


class GenerationDataset(VQADataset):
    """Generation prompts (no answers), each with its pixels' identity (`IMAGE_KEY`) and its
    (target, id) as its meta; a batch fetched together reads and processes each of its
    distinct images once. The frame's `TARGET` column says which target a row answers.
    `change`: a pass's change of each row's image (None: the image mode's image)."""

    def __init__(self, *args: Any, change: ImageChange | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.change = change

    def image_key(self, i: int) -> str:
        key = super().image_key(i)
        return key if self.change is None else self.change.image_key(key, self.frame.iloc[i])

    def image(self, i: int) -> Image.Image | None:
        image = super().image(i)
        if self.change is None:
            return image
        return self.change.transform_image(image, self.frame.iloc[i])

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        processor = copy.copy(self.processor)
        image_processor = getattr(self.processor, "image_processor", None)
        if image_processor is not None:
            processor.image_processor = OncePerImage(image_processor)
        images: dict[str, Image.Image | None] = {}
        out = []
        for i in indices:
            key = self.image_key(i)
            if key not in images:
                images[key] = self.image(i)
            features = self.example(i, images[key], processor)
            features[IMAGE_KEY] = key
            # the row's target (one predictions file of several generated together) and id
            target = int(self.frame[TARGET].iloc[i]) if TARGET in self.frame else 0
            features[META_KEY] = (target, features[META_KEY])
            out.append(features)
        return out

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.__getitems__([i])[0]


@dataclass(frozen=True)
class Target:
    """The rows of one split that one predictions file holds answers to (one pass's)."""

    out_path: Path
    split: str
    frame: pd.DataFrame


class GenerationData(L.LightningDataModule):
    """The prompts of one split that these weights have not answered yet, for one predictions
    file or several (`targets`: passes that show the same images, such as the option orders,
    whose rows are batched together so that they share each image's prefix), each row's image
    changed by `image_change` where a pass changes it.

    Built inside the predict loop, where the process group exists: global rank 0 reads what is
    done and broadcasts the rows to do, so every rank shards the same list. With shared
    prefixes the rows are ordered by the image they show and each rank takes a contiguous run
    of them, so a batch holds the questions of as few images as possible.
    """

    def __init__(
        self,
        targets: Sequence[Target],
        source: VQASource,
        processor: Any,
        model_id: str,
        settings: GenerationSettings,
        image_mode: str = DataSchema.eval_image,
        num_workers: int | None = DataSchema.num_workers,
        prompt: PromptTemplate = PLAIN,
        mismatch_field: str = DataSchema.mismatch_field,
        pool: pd.DataFrame | None = None,
        image_change: ImageChange | None = None,
    ) -> None:
        super().__init__()
        if len(targets) > 1 and image_mode in PARTNER_MODES:
            raise ValueError(
                f"image_mode={image_mode!r} draws partner rows by id: one target at a time"
            )
        self.targets = list(targets)
        # Every target's rows, each marked with its target (`TARGET`).
        self.frame = pd.concat(
            [t.frame.assign(**{TARGET: i}) for i, t in enumerate(self.targets)],
            ignore_index=True,
        )
        self.settings, self.processor, self.model_id = settings, processor, model_id
        self.num_workers = num_workers
        # A dataset of some of the rows. The partner-image modes draw from this whole split (not
        # a rank's shard) or what the caller gives (`mismatched`: every test split of the job).
        self._dataset = partial(
            GenerationDataset,
            source=source,
            processor=processor,
            with_answer=False,
            image_mode=image_mode,
            prompt=prompt,
            pool=self.targets[0].frame if pool is None else pool,
            mismatch_field=mismatch_field,
            change=image_change,
        )
        self.by_id = [t.frame.set_index(R.ID) for t in self.targets]
        self.n_todo = 0
        self.progress_label: str | None = None  # its progress lines' name (PredictProgress)
        # Fewer rows left than ranks (a resumed split, a tiny one): some ranks get none. They
        # still run the loop's set-up collectives; the merge waits for every rank after it.
        self.allow_zero_length_dataloader_with_multiple_devices = True

    def predict_dataloader(self) -> DataLoader:
        todo: list[int] | None = None
        if self.trainer.is_global_zero:
            todo = []
            for i, target in enumerate(self.targets):
                target.out_path.parent.mkdir(parents=True, exist_ok=True)
                done = done_ids(target.out_path, target.split, self.model_id)
                ours = (self.frame[TARGET] == i) & ~self.frame[R.ID].isin(done)
                todo += np.flatnonzero(ours.to_numpy()).tolist()
                if done:
                    log.info(
                        "%s: resuming, %d of %d already predicted (%s)",
                        target.split,
                        len(done),
                        len(target.frame),
                        target.out_path.name,
                    )
            todo.sort()
        todo = self.trainer.strategy.broadcast(todo, src=0)
        self.n_todo = len(todo)
        # This rank's shard, cut here rather than by Lightning's sampler, which refuses a rank
        # without rows (prediction_trainer turns it off).
        rank, ranks = self.trainer.global_rank, self.trainer.world_size
        pending = self.frame.iloc[todo]
        share = self.settings.share_image_prefix
        if share:  # a contiguous run of the rows, in the order of their images
            pending = pending.iloc[self._dataset(pending).by_image()]
            rows = pending.iloc[rank * len(pending) // ranks : (rank + 1) * len(pending) // ranks]
        else:
            rows = pending.iloc[rank::ranks]
        collate = partial(
            collate_generation,
            image_token=image_token_id(self.processor),
            meta_key=META_KEY,
            share=share,
            max_length=self.settings.shared_length,
        )
        return make_loader(
            self._dataset(rows),
            self.settings.batch_size,
            shuffle=False,
            padding_side="left",
            collate_fn=collate,
            **loader_options(self.trainer, self.num_workers),
        )

    def records(self, answers: Sequence[tuple[Any, ...]]) -> dict[int, list[dict[str, Any]]]:
        """Prediction records by target: the row's fields, split, weights fingerprint, the
        answer and its log-probabilities (`GenerationModule.predict_step`)."""
        out: dict[int, list[dict[str, Any]]] = {}
        for (target, rid), *answer in answers:
            row = self.by_id[target].loc[rid]
            record = prediction_record(row, rid, self.targets[target].split, self.model_id, *answer)
            out.setdefault(target, []).append(record)
        return out


def prediction_record(
    row: Any,
    rid: str,
    split: str,
    model_id: str,
    text: str | None,
    mean: float,
    low: float,
    count: int,
    by_temperature: dict[str, float],
) -> dict[str, Any]:
    """One line of a predictions file: the row's fields, its split, the fingerprint of what
    answered (weights, or a served model), the answer (None: never answered) and its
    log-probabilities (mean and min at temperature 1, tokens, sums by temperature)."""
    record = {k: jsonable(v) for k, v in row.items()}
    record.update({R.ID: rid, SPLIT: split, MODEL: model_id, R.PREDICTION: text})
    record.update({R.LOGPROB_MEAN: jsonable(mean), R.LOGPROB_MIN: jsonable(low)})
    record[R.ANSWER_TOKENS] = count
    record[R.LOGPROB_BY_TEMPERATURE] = by_temperature
    return record
