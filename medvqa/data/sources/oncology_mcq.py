"""Report-derived oncology MCQ: private data, so only the loader and the format ship here.

Layout under `root`: a manifest (`manifest`, default `questions.jsonl`; `.csv` and `.parquet`
are read by suffix) with one multiple-choice question per row, and the image files it points
to (paths relative to `root`). Fields:

| field        | content                                                                  |
|--------------|--------------------------------------------------------------------------|
| case_id      | the patient/case; questions of one case never straddle train and val     |
| image        | a 2D image (PNG/JPEG/...) or a 3D volume (.nii, .nii.gz, .npy, .npz)     |
| question     | the question stem (the model is asked it with its lettered options)     |
| options      | 2-5 distinct option texts: a JSON list (in CSV: a JSON string)           |
| answer       | the correct option's text, or its letter A-E; stored as the option text  |
| source       | RADS-style or report-derived                                             |
| subcategory  | free text (e.g. the RADS category or report section); the question_type  |
| split        | train, val (or validate), test                                           |
| cohort       | optional (e.g. institution; missing -> "unknown"); the cohort shift's field |
| id           | optional question id, unique per split (default: the row number)        |

Row numbers in messages count data rows from 0. A row with a missing field, an answer that is
neither an option nor a valid letter, duplicate options, or fewer than 2 / more than 5 options
is a bad row (error, or skipped and counted with `on_bad_row=skip`).

Volumes are reduced to one axial slice when a sample is loaded (`build` never opens images):
`slice: middle` takes the middle index along the last axis; `slice: max_area` the slice with
the most voxels above the volume's mean (ties: lowest index), i.e. the slice where the imaged
body is largest. Intensities are windowed to the volume's 1st-99th percentile and scaled to
8 bits (grey as RGB). NIfTI volumes are first reoriented to the closest canonical (RAS+)
orientation, so the last axis is inferior-superior whatever the stored orientation, and shown
in radiological convention (anterior up, patient right on the image's left); `.npy`/`.npz`
arrays are taken as (rows, columns, slices) as stored. An `.npz` must hold one array, or one
named `volume`. A 2D array is used as it is.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from PIL import Image

from medvqa.data import records as R
from medvqa.data.annotated import (
    DEFAULT_ON_BAD_ROW,
    IDENTIFIER,
    MANIFEST_SPLITS,
    TEXT,
    TEXT_OR_NUMBER,
    AnnotatedSource,
    BadRows,
    read_manifest,
)
from medvqa.data.cleaning import CleaningLog
from medvqa.data.questions import LETTERS, resolve_answer
from medvqa.errors import DataError

SOURCES = ("RADS-style", "report-derived")
SLICE_MODES = ("middle", "max_area")
MIN_OPTIONS, MAX_OPTIONS = 2, 5
REQUIRED = ("case_id", "image", "question", "options", "answer", "source", "subcategory", "split")
# What each field read must hold (checked per row; a wrong type is a bad row): a category
# or cohort may be a number ("3" of a RADS scale) and is read as its text; `options` is a
# list, checked by the loader.
FIELD_TYPES = {
    **dict.fromkeys(("case_id", "id"), IDENTIFIER),
    **dict.fromkeys(("image", "question", "source", "split"), TEXT),
    **dict.fromkeys(("answer", "subcategory", "cohort"), TEXT_OR_NUMBER),
}
NO_COHORT = "unknown"
NIFTI_SUFFIXES = (".nii", ".nii.gz")
ARRAY_SUFFIXES = (".npy", ".npz")


def volume_suffix(path: str | Path) -> str | None:
    """The volume format of a path ('.nii.gz', '.npy', ...), or None for a 2D image."""
    name = str(path).lower()
    for suffix in (*NIFTI_SUFFIXES, *ARRAY_SUFFIXES):
        if name.endswith(suffix):
            return suffix
    return None


def lettered_question(stem: str, options: Sequence[str]) -> str:
    """What the model is asked: the stem, then one lettered option per line ("A. ...").

    The options must reach the model: answers are scored against them, by text or by letter
    (medvqa.scoring.metrics.mcq)."""
    lines = [f"{LETTERS[i]}. {option}" for i, option in enumerate(options)]
    return "\n".join([stem, *lines, "Answer with the letter of the correct option."])


def slice_index(volume: np.ndarray, mode: str) -> int:
    """Which index along the last axis represents the volume (see the module docstring)."""
    depth = volume.shape[-1]
    if mode == "middle":
        return depth // 2
    if mode == "max_area":
        area = (volume > volume.mean()).reshape(-1, depth).sum(axis=0)
        return int(np.argmax(area))  # argmax returns the first maximum: ties -> lowest index
    raise ValueError(f"slice mode must be one of {SLICE_MODES}, got {mode!r}")


def window(slice2d: np.ndarray, volume: np.ndarray) -> np.ndarray:
    """8-bit slice, intensities clipped to the volume's 1st-99th percentile."""
    lo, hi = np.percentile(volume, [1.0, 99.0])
    if hi <= lo:  # a constant volume carries no contrast
        return np.zeros(slice2d.shape, dtype=np.uint8)
    scaled = (np.clip(slice2d, lo, hi) - lo) / (hi - lo) * 255.0
    return np.round(scaled).astype(np.uint8)


def volume_to_image(volume: np.ndarray, mode: str, radiological: bool = False) -> Image.Image:
    """One representative slice of a volume (or a 2D array as is) as an RGB image."""
    volume = np.nan_to_num(np.squeeze(np.asarray(volume, dtype=np.float32)))
    if volume.ndim == 2:
        volume = volume[..., None]
    if volume.ndim != 3 or min(volume.shape) == 0:
        raise ValueError(f"expected a 2D image or a 3D volume, got shape {volume.shape}")
    plane = volume[..., slice_index(volume, mode)]
    if radiological:  # RAS+ array -> anterior up, patient right on the left
        plane = plane[::-1, ::-1].T
    pixels = window(plane, volume)
    return Image.fromarray(np.ascontiguousarray(pixels), mode="L").convert("RGB")


def read_volume(path: Path) -> tuple[np.ndarray, bool]:
    """The voxel array of a volume file and whether it is RAS+ (NIfTI, reoriented)."""
    suffix = volume_suffix(path)
    if suffix in NIFTI_SUFFIXES:
        import nibabel as nib

        image = nib.as_closest_canonical(nib.load(str(path)))
        return np.asanyarray(image.dataobj), True
    if suffix == ".npy":
        return np.load(path, allow_pickle=False), False
    with np.load(path, allow_pickle=False) as archive:
        names = list(archive.files)
        if len(names) == 1:
            return archive[names[0]], False
        if "volume" in names:
            return archive["volume"], False
        raise ValueError(f"an .npz volume must hold one array or one named 'volume'; got {names}")


class OncologyMcq(AnnotatedSource):
    """Oncology MCQ from a manifest under `root` (see the module docstring for the format)."""

    name = "oncology_mcq"
    loader_version = 2  # 2: the question carries its lettered options
    metadata_fields = ("stem", "source", "subcategory", "cohort", "n_options")
    field_types = FIELD_TYPES

    def __init__(
        self,
        root: str | Path,
        cache_dir: str | Path | None = None,
        on_bad_row: str = DEFAULT_ON_BAD_ROW,
        manifest: str = "questions.jsonl",
        slice: str = "middle",  # shadows the builtin: the config key is `slice`
    ) -> None:
        super().__init__(root, cache_dir, on_bad_row)
        if slice not in SLICE_MODES:
            raise ValueError(
                f"{self.name}: dataset.slice must be one of {SLICE_MODES}, got {slice!r}."
            )
        self.manifest = manifest
        self.slice = slice

    def annotation_files(self) -> list[Path]:
        return [self.root / self.manifest]

    def _options(self, value: Any, where: str, bad: BadRows) -> list[str] | None:
        """The option texts (a list, or a JSON list in a CSV cell), or None if invalid."""
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                bad("malformed", where, f"options {value!r} is not a JSON list of strings")
                return None
        if isinstance(value, np.ndarray):  # parquet list cells
            value = value.tolist()
        if not isinstance(value, list) or not all(isinstance(o, str | int | float) for o in value):
            bad("malformed", where, f"options must be a list of texts, got {value!r}")
            return None
        options = [str(o).strip() for o in value]
        if not MIN_OPTIONS <= len(options) <= MAX_OPTIONS:
            bad(
                "malformed",
                where,
                f"{len(options)} options; a question needs {MIN_OPTIONS}-{MAX_OPTIONS}",
            )
            return None
        if any(not o for o in options) or len(set(options)) != len(options):
            bad("malformed", where, f"options {options} has empty or repeated entries")
            return None
        return options

    def build(self, bad: BadRows, cleaning: CleaningLog) -> pd.DataFrame:
        path = self.require(self.root / self.manifest, "oncology MCQ manifest")
        rows, seen = [], set()
        for i, where, row in self.valid_rows(read_manifest(path, self.name), path, bad, REQUIRED):
            split = self.field(row, "split", where, bad, tuple(MANIFEST_SPLITS))
            source = {s.lower(): s for s in SOURCES}.get(str(row["source"]).strip().lower())
            if split is None:
                continue
            if source is None:
                bad("malformed", where, f"field 'source' is {row['source']!r}; expected {SOURCES}")
                continue
            options = self._options(row["options"], where, bad)
            if options is None:
                continue
            answer = resolve_answer(row["answer"], options)
            if answer is None:
                bad(
                    "malformed",
                    where,
                    f"answer {row['answer']!r} is neither one of the options {options} nor "
                    f"a letter A-{LETTERS[len(options) - 1]}",
                )
                continue
            qid = row.get("id")
            qid = str(qid) if qid not in (None, "") else f"row{i}"
            record_id = f"{MANIFEST_SPLITS[split]}/{qid}"
            if record_id in seen:
                bad("duplicate_id", where, f"question id {qid!r} occurs more than once in {split}")
                continue
            image = self.image_ref(str(row["image"]), where, bad)
            if image is None:
                continue
            seen.add(record_id)
            cohort = row.get("cohort")
            rows.append(
                {
                    R.ID: record_id,
                    R.IMAGE: image,
                    R.QUESTION: lettered_question(str(row["question"]).strip(), options),
                    "stem": str(row["question"]).strip(),
                    R.ANSWER: answer,
                    R.ANSWER_TYPE: "closed",
                    R.QUESTION_TYPE: str(row["subcategory"]).strip(),
                    R.CANDIDATES: options,
                    R.CASE_ID: str(row["case_id"]),
                    R.IMAGE_ID: image,
                    R.SOURCE_SPLIT: MANIFEST_SPLITS[split],
                    "source": source,
                    "subcategory": str(row["subcategory"]).strip(),
                    "cohort": NO_COHORT if cohort in (None, "") else str(cohort),
                    "n_options": len(options),
                }
            )
        columns = [*R.CORE_COLUMNS, "stem", "source", "subcategory", "cohort", "n_options"]
        return pd.DataFrame(rows, columns=columns)

    def check_image(self, ref: str, record_id: str | None = None) -> None:
        """Volumes are only located here (PIL cannot read them); they are read when loaded."""
        if volume_suffix(ref) is None:
            super().check_image(ref, record_id)
        else:
            self.image_path(ref, record_id)

    def load_image(self, ref: str, record_id: str | None = None) -> Image.Image:
        """A 2D image as RGB, or a volume's representative slice (see the module docstring)."""
        if volume_suffix(ref) is None:
            return super().load_image(ref, record_id)
        path = self.image_path(ref, record_id)  # keeps the root-escape and existence checks
        try:
            volume, ras = read_volume(path)
            return volume_to_image(volume, self.slice, radiological=ras)
        except Exception as err:  # nibabel/numpy raise many types for a corrupt file
            where = f" (record {record_id!r})" if record_id is not None else ""
            raise DataError(
                f"{self.name}: cannot read volume {path}{where}: {err}. Replace the file "
                "(volumes are read only when a sample is loaded, so on_bad_row cannot skip it)."
            ) from err
