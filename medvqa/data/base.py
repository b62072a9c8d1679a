"""What every dataset adapter provides: a normalised table and lazily read images."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
from PIL import Image, UnidentifiedImageError

from medvqa.errors import DataError
from medvqa.hashing import content_hash
from medvqa.plugins import Plugin


class VQASource(Plugin, ABC):
    """A VQA dataset on disk.

    `table()` returns the normalised records (see `medvqa.data.records`); images are only read
    when a sample is requested, so building splits needs the annotation files alone.
    """

    plugin_kind: ClassVar[str] = "dataset"
    # A subclass that sets `name` is registered as that dataset (see medvqa.plugins); its
    # constructor's typed parameters are its config schema (`conf/dataset/<name>.yaml`).
    name: ClassVar[str] = "dataset"
    # New tokens a generated answer may need. 0: the model's `max_new_tokens` suffices (short
    # answers); datasets with long answers (lists, sentences) raise it, and generation takes
    # the larger of the two (medvqa.generation.lengths.generation_length).
    answer_tokens: ClassVar[int] = 0
    # Real clinical data (False: generated for running the pipeline): a toy model trained on it
    # would produce rows that look like results (medvqa.tasks.train_eval.check_model_for_data).
    real: ClassVar[bool] = True
    # The metadata columns `table()` has beside the core ones (medvqa.data.records): what a
    # shift's `field` or `evaluation.breakdown` may name, checked when a run starts
    # (medvqa.config.check_config) instead of after the data is prepared. None: undeclared,
    # so not checked until the table is loaded.
    metadata_fields: ClassVar[tuple[str, ...] | None] = None

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser()

    @abstractmethod
    def table(self) -> pd.DataFrame:
        """The normalised, cleaned table of all source splits."""

    def report(self) -> dict[str, Any]:
        """What loading did to the data (cleaning counts, skipped rows); empty if nothing."""
        return {}

    def fingerprint(self) -> str:
        """Identifies the data's content, so caches built from it are never reused stale.

        The default hashes the normalised table; adapters with a cheaper exact key override it.
        """
        content = pd.util.hash_pandas_object(self.table().astype(str), index=False)
        return content_hash(content.values.tobytes())

    def image_path(self, ref: str, record_id: str | None = None) -> Path:
        """Resolve an image reference, refusing paths that escape the dataset root."""
        root = self.root.resolve()
        path = (root / ref).resolve()
        where = f" (record {record_id!r})" if record_id is not None else ""
        if not path.is_relative_to(root):
            raise DataError(
                f"{self.name}: image path {ref!r}{where} escapes the dataset root {root}; "
                "fix the annotation file."
            )
        if not path.is_file():
            raise DataError(
                f"{self.name}: image file {path}{where} does not exist; check dataset.root "
                "or set on_bad_row=skip to drop such rows."
            )
        return path

    def check_image(self, ref: str, record_id: str | None = None) -> None:
        """Cheap pre-flight check: the file exists inside the root and PIL knows its header.

        Raises DataError (missing, escaping) or PIL's errors (unreadable); sources whose
        images are not PIL files (e.g. volumes) override it.
        """
        with Image.open(self.image_path(ref, record_id)):
            pass

    def load_image(self, ref: str, record_id: str | None = None) -> Image.Image:
        """Open an image as RGB, with an error that names the file if it cannot be decoded."""
        path = self.image_path(ref, record_id)
        try:
            with Image.open(path) as img:
                return img.convert("RGB")
        except (UnidentifiedImageError, OSError) as err:
            where = f" (record {record_id!r})" if record_id is not None else ""
            raise DataError(
                f"{self.name}: cannot read image {path}{where}: {err}. Replace the file or "
                "set on_bad_row=skip."
            ) from err
