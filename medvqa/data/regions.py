"""Regions: the part of an image a question is about, where a dataset knows it.

A row's `region` column holds a `Region` as JSON text (None: the row has none, and its
`region_missing` column says why: `REASONS`). A region is a mask file under the dataset root
whose labelled (non-zero) pixels it is (the synthetic findings' masks written with the
images, a RoboSurg-VQA frame's mask), and/or boxes in the image's pixels (SLAKE's
`detection.json`, for the organs a question names), which a mask file refines to its labelled
pixels inside them where the file exists. `region_mask` reads it as the seen image's pixels;
`elsewhere` places an equal area away from it; `occlude` fills either. The region-occlusion
pass (`medvqa.generation.passes.region_occlusion`) answers a row's question again with each
hidden (docs/metrics.md#region-occlusion).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from PIL import Image

from medvqa.data import records as R
from medvqa.errors import DataError

if TYPE_CHECKING:
    from medvqa.data.base import VQASource

log = logging.getLogger(__name__)

REGION = "region"  # the region a row's question concerns (`Region.text`); None: none
REGION_MISSING = "region_missing"  # why a row has no region (one of REASONS); None: it has one
# Why a row has no region: its image has no region file (no mask, no detection.json, no finding
# drawn); its question names no region the dataset annotates; it names one (a label the release
# uses) that its image's annotation lacks.
NO_REGION_FILE, NAMES_NO_REGION, LABEL_UNMATCHED = (
    "no_region_file",
    "names_no_region",
    "label_unmatched",
)
REASONS = (NO_REGION_FILE, NAMES_NO_REGION, LABEL_UNMATCHED)
# How the occluded pixels are filled: the image's mean colour (no new edge colour), or black.
FILLS = ("mean", "black")
# Offsets tried when placing the equal-area region elsewhere (`elsewhere`).
_TRIES = 64


@dataclass(frozen=True)
class Region:
    """A mask file (relative to the dataset root: .png or .npy, its non-zero pixels) and/or
    boxes (x0, y0, x1, y1) in the image's pixels. Mask alone: the file must exist; with boxes,
    the mask refines them where the file exists (its labelled pixels inside the boxes)."""

    mask: str | None = None
    boxes: tuple[tuple[float, float, float, float], ...] = ()

    def text(self) -> str:
        """The `region` cell: plain JSON."""
        return json.dumps({"mask": self.mask, "boxes": [list(b) for b in self.boxes]})

    @classmethod
    def parse(cls, text: Any, where: str) -> Region:
        """A `region` cell read back; a cell that is no region (edited, hostile) is a
        DataError naming `where`."""
        try:
            value = json.loads(text) if isinstance(text, str) else None
        except ValueError:
            value = None
        ok = isinstance(value, dict) and set(value) <= {"mask", "boxes"}
        mask, boxes = (value.get("mask"), value.get("boxes", [])) if ok else (None, None)
        ok = ok and (mask is None or isinstance(mask, str)) and isinstance(boxes, list)
        ok = ok and all(
            isinstance(b, list) and len(b) == 4 and all(_number(v) for v in b) for b in boxes
        )
        if not ok or (mask is None and not boxes):
            raise DataError(
                f"{where}: region {text!r} is not a region (JSON with a 'mask' file and/or "
                "'boxes' [x0, y0, x1, y1]); rebuild the dataset's table"
            )
        return cls(mask, tuple(tuple(float(v) for v in b) for b in boxes))  # type: ignore[misc]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and np.isfinite(value)


def has_region(frame: pd.DataFrame) -> pd.Series:
    """Which rows of `frame` have a region (none without the column)."""
    if REGION not in frame.columns:
        return pd.Series(False, index=frame.index)
    return frame[REGION].map(lambda v: isinstance(v, str) and bool(v))


def region_counts(table: pd.DataFrame) -> dict[str, Any]:
    """How many rows have a region and, of the others, how many for each reason (`REASONS`;
    `unknown` where a row does not say)."""
    with_region = has_region(table)
    missing = table.get(REGION_MISSING, pd.Series(None, index=table.index, dtype=object))
    why = Counter(r if isinstance(r, str) else "unknown" for r in missing[~with_region])
    return {"with_region": int(with_region.sum()), "rows": len(table), "without": dict(why)}


def log_counts(source: str, counts: Mapping[str, Any]) -> None:
    """One line: how many rows got a region and why the others did not."""
    why = ", ".join(f"{k} {v}" for k, v in sorted(counts["without"].items())) or "none"
    log.info(
        "%s: %d of %d rows have a region (without one: %s)",
        source,
        counts["with_region"],
        counts["rows"],
        why,
    )


# -- pixels ---------------------------------------------------------------------------------------


def _mask_pixels(source: VQASource, ref: str, rid: str) -> np.ndarray | None:
    """A mask file's labelled pixels (height x width, bool); None where the file is missing."""
    root = source.root.resolve()
    path = (root / ref).resolve()
    if not path.is_relative_to(root):
        raise DataError(
            f"{source.name}: region mask {ref!r} (row {rid!r}) escapes the dataset root {root}; "
            "fix the annotation file"
        )
    if not path.is_file():
        return None
    try:
        if path.suffix.lower() == ".npy":
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        else:
            with Image.open(path) as image:
                array = np.asarray(image)
    except (OSError, ValueError) as err:
        raise DataError(
            f"{source.name}: cannot read region mask {path} (row {rid!r}): {err}; restore the "
            "dataset's file"
        ) from err
    if array.ndim not in (2, 3) or not np.issubdtype(array.dtype, np.number):
        raise DataError(
            f"{source.name}: region mask {path} (row {rid!r}) has shape {array.shape} and "
            f"dtype {array.dtype}; expected a numeric height x width (x channels) array"
        )
    labelled = np.asarray(array) != 0
    return labelled.any(axis=2) if labelled.ndim == 3 else labelled


def _resized(mask: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """`mask` at `size` (width, height) by nearest neighbour, where it differs."""
    if mask.shape[::-1] == tuple(size):
        return mask
    image = Image.fromarray(mask.astype(np.uint8) * 255).resize(size, Image.Resampling.NEAREST)
    return np.asarray(image) > 0


def region_mask(source: VQASource, row: Mapping[str, Any], size: tuple[int, int]) -> np.ndarray:
    """The pixels of `row`'s region in an image of `size` (width, height) as `source` shows
    it: height x width, bool."""
    rid = str(row[R.ID])
    region = Region.parse(row[REGION], f"{source.name} row {rid!r}")
    pixels = None if region.mask is None else _mask_pixels(source, region.mask, rid)
    if pixels is None and not region.boxes:
        raise DataError(
            f"{source.name}: region mask {region.mask!r} of row {rid!r} does not exist under "
            f"{source.root}; restore it (the dataset's own files) or rebuild the dataset"
        )
    pixels = None if pixels is None else _resized(pixels, size)
    if not region.boxes:
        return pixels  # type: ignore[return-value]
    boxes = np.zeros((size[1], size[0]), dtype=bool)
    for x0, y0, x1, y1 in region.boxes:
        left, top = max(0, int(np.floor(x0))), max(0, int(np.floor(y0)))
        boxes[top : max(top, int(np.ceil(y1))), left : max(left, int(np.ceil(x1)))] = True
    inside = boxes if pixels is None else boxes & pixels
    return inside if inside.any() else boxes


def elsewhere(mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """An equal-area region away from `mask`: its own shape moved by an offset drawn from
    `rng` that keeps it inside the image, the first drawn whose box clears the region's box;
    where none does (a region over half the image), the one that overlaps it least."""
    ys, xs = np.nonzero(mask)
    if ys.size == 0:
        return mask.copy()
    (height, width), (top, left) = mask.shape, (ys.min(), xs.min())
    tall, wide = ys.max() + 1 - top, xs.max() + 1 - left
    dy = rng.integers(-top, height - (top + tall) + 1, size=_TRIES)
    dx = rng.integers(-left, width - (left + wide) + 1, size=_TRIES)
    clear = (np.abs(dy) >= tall) | (np.abs(dx) >= wide)
    if clear.any():
        k = int(np.argmax(clear))
    else:
        k = int(np.argmin([mask[ys + a, xs + b].sum() for a, b in zip(dy, dx, strict=True)]))
    moved = np.zeros_like(mask, dtype=bool)
    moved[ys + dy[k], xs + dx[k]] = True
    return moved


def occlude(image: Image.Image, mask: np.ndarray, fill: str) -> Image.Image:
    """`image` with the pixels of `mask` filled (`FILLS`: the image's own mean colour, taken
    before the fill, or black)."""
    pixels = np.array(image.convert("RGB"))
    colour = pixels.reshape(-1, 3).mean(axis=0).round() if fill == "mean" else np.zeros(3)
    pixels[mask] = colour.astype(np.uint8)
    return Image.fromarray(pixels)
