"""Torch datasets and the Lightning DataModule over the splits of one (dataset, shift)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import lightning as L
import pandas as pd
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from medvqa.data import records as R
from medvqa.data.base import VQASource
from medvqa.data.shifts import IMAGE_TRANSFORM
from medvqa.data.transforms import apply_transform
from medvqa.models.prompting import PLAIN, PromptTemplate, encode, pad_batch

META_KEY = "record_ids"
IMAGE_MODES = ("image", "none", "blank")


class VQADataset(Dataset):
    """Examples of one split, tokenised on access (images are read lazily).

    `with_answer=True` gives training examples (prompt + answer, labels on the answer);
    `False` gives generation prompts. `image_mode`: "image"; "none" (no image and no image
    tokens: the no-image baseline); "blank" (a black image of the same size: the blind test).
    `prompt`: the protocol's template (system turn, closed options) every row goes through.
    """

    def __init__(
        self,
        frame: pd.DataFrame,
        source: VQASource,
        processor: Any,
        with_answer: bool,
        image_mode: str = "image",
        prompt: PromptTemplate = PLAIN,
    ) -> None:
        if image_mode not in IMAGE_MODES:
            raise ValueError(f"image_mode must be one of {IMAGE_MODES}, got {image_mode!r}")
        self.frame = frame.reset_index(drop=True)
        self.source = source
        self.processor = processor
        self.with_answer = with_answer
        self.image_mode = image_mode
        self.prompt = prompt

    def __len__(self) -> int:
        return len(self.frame)

    def __getitem__(self, i: int) -> dict[str, Any]:
        row = self.frame.iloc[i]
        image = None
        if self.image_mode != "none":
            image = self.source.load_image(row[R.IMAGE], row[R.ID])
            spec = row.get(IMAGE_TRANSFORM)
            if isinstance(spec, str):  # transform shifts (corruption, Kvasir augments)
                image = apply_transform(image, spec, str(row[R.ID]), str(row[R.IMAGE_ID]))
            if self.image_mode == "blank":
                image = Image.new("RGB", image.size)
        features: dict[str, Any] = encode(
            self.processor,
            self.prompt.question(row[R.QUESTION], row.get(R.ANSWER_TYPE), row.get(R.CANDIDATES)),
            image,
            answer=row[R.ANSWER] if self.with_answer else None,
            system=self.prompt.system,
        )
        features[META_KEY] = row[R.ID]
        return features


def collate(features: list[dict[str, Any]], pad_token_id: int, padding_side: str) -> dict[str, Any]:
    """Pad a list of examples; record ids travel beside the tensors."""
    ids = [f.pop(META_KEY) for f in features]
    batch: dict[str, Any] = pad_batch(features, pad_token_id, padding_side)
    batch[META_KEY] = ids
    return batch


def make_loader(
    dataset: VQADataset,
    batch_size: int,
    *,
    shuffle: bool,
    padding_side: str,
    num_workers: int = 0,
    seed: int = 0,
) -> DataLoader:
    tokenizer = dataset.processor.tokenizer
    pad_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    generator = torch.Generator().manual_seed(seed) if shuffle else None
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        generator=generator,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
        collate_fn=partial(collate, pad_token_id=pad_id, padding_side=padding_side),
    )


class VQADataModule(L.LightningDataModule):
    """Train/val loaders for fine-tuning; evaluation builds its own prompt loaders."""

    def __init__(
        self,
        frames: Mapping[str, pd.DataFrame],
        source: VQASource,
        processor: Any,
        batch_size: int = 16,
        eval_batch_size: int = 32,
        num_workers: int = 0,
        seed: int = 0,
        image_mode: str = "image",
        prompt: PromptTemplate = PLAIN,
    ) -> None:
        super().__init__()
        self.frames = dict(frames)
        self.source = source
        self.processor = processor
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.num_workers = num_workers
        self.seed = seed
        self.image_mode = image_mode
        self.prompt = prompt

    def _dataset(self, split: str) -> VQADataset:
        return VQADataset(
            self.frames[split], self.source, self.processor, True, self.image_mode, self.prompt
        )

    def train_dataloader(self) -> DataLoader:
        return make_loader(
            self._dataset("train"),
            self.batch_size,
            shuffle=True,
            padding_side="right",
            num_workers=self.num_workers,
            seed=self.seed,
        )

    def val_dataloader(self) -> DataLoader:
        return make_loader(
            self._dataset("val"),
            self.eval_batch_size,
            shuffle=False,
            padding_side="right",
            num_workers=self.num_workers,
        )
