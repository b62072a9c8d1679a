"""Image transforms that define shifts: SURE-VQA corruptions and Kvasir-VQA-x1's weak augments.

A transform shift puts a spec `name:level:seed` in a row's `image_transform` column; the
dataset applies it when the image is loaded. Every random draw comes from a generator seeded by
(seed, a stable hash of the row's key), so a sample looks the same whatever the worker count,
batch size or order: results never depend on how the data was loaded.

- `corruption` (docs/shifts.md), level low|medium|high: Gaussian blur (kernel 5/7/11), Gaussian noise
  (σ 0.1, mean drawn per level), brightness (×α drawn per level, saturating); each fires with
  probability 0.5 and, if none did, one is picked at random. Keyed by the record id.
- `kvasir_augment` (Kvasir-VQA-x1's transformed track), level = number of variants (10): a row
  gets one of the image's variants 1..N; a variant is RandomResizedCrop (scale 0.9-1.0),
  rotation ±10°, translation up to 10 %, brightness and contrast ×0.8-1.2, all bicubic. Keyed
  by (image, variant), so each image has exactly N reproducible variants shared by its questions.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np
from PIL import Image, ImageEnhance, ImageFilter

CORRUPTION_LEVELS: dict[str, dict[str, tuple[float, float] | int]] = {
    "low": {"kernel": 5, "noise_mean": (0.0, 0.06), "brightness": (1.1, 2.0)},
    "medium": {"kernel": 7, "noise_mean": (0.09, 0.15), "brightness": (2.5, 4.0)},
    "high": {"kernel": 11, "noise_mean": (0.18, 0.25), "brightness": (4.5, 6.0)},
}
NOISE_SIGMA = 0.1
APPLY_PROB = 0.5


def stable_hash(text: str) -> int:
    """A hash that, unlike `hash()`, is the same in every process."""
    return zlib.crc32(text.encode("utf-8"))


def rng_for(seed: int, key: str) -> np.random.Generator:
    return np.random.default_rng([int(seed), stable_hash(key)])


def kernel_sigma(kernel: int) -> float:
    """σ of a Gaussian kernel of this size, as OpenCV derives it when σ is not given."""
    return 0.3 * ((kernel - 1) * 0.5 - 1) + 0.8


def _blur(img: Image.Image, level: dict, rng: np.random.Generator) -> Image.Image:
    return img.filter(ImageFilter.GaussianBlur(radius=kernel_sigma(int(level["kernel"]))))


def _noise(img: Image.Image, level: dict, rng: np.random.Generator) -> Image.Image:
    mean = rng.uniform(*level["noise_mean"])
    arr = np.asarray(img, dtype=np.float32) / 255.0
    arr = arr + rng.normal(mean, NOISE_SIGMA, size=arr.shape).astype(np.float32)
    return Image.fromarray((np.clip(arr, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8))


def _brightness(img: Image.Image, level: dict, rng: np.random.Generator) -> Image.Image:
    alpha = rng.uniform(*level["brightness"])
    arr = np.asarray(img, dtype=np.float32) * alpha
    return Image.fromarray(np.clip(arr + 0.5, 0, 255).astype(np.uint8))


CORRUPTIONS: tuple[Callable[[Image.Image, dict, np.random.Generator], Image.Image], ...] = (
    _blur,
    _noise,
    _brightness,
)


def corrupt(img: Image.Image, strength: str, rng: np.random.Generator) -> Image.Image:
    """Apply the corruptions of docs/shifts.md at `strength` (low|medium|high)."""
    if strength not in CORRUPTION_LEVELS:
        raise ValueError(
            f"corruption strength {strength!r} unknown; use one of {list(CORRUPTION_LEVELS)} "
            "(shift.transform.strength)."
        )
    level = CORRUPTION_LEVELS[strength]
    fired = [f for f in CORRUPTIONS if rng.random() < APPLY_PROB]
    if not fired:
        fired = [CORRUPTIONS[int(rng.integers(len(CORRUPTIONS)))]]
    for fn in fired:
        img = fn(img, level, rng)
    return img


def kvasir_augment(img: Image.Image, rng: np.random.Generator) -> Image.Image:
    """One weak augmentation (Kvasir-VQA-x1's transformed track), output size = input size."""
    w, h = img.size
    # RandomResizedCrop(scale 0.9-1.0, aspect ratio kept near 1).
    scale = rng.uniform(0.9, 1.0)
    ratio = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
    cw = min(w, round(np.sqrt(scale * w * h * ratio)))
    ch = min(h, round(np.sqrt(scale * w * h / ratio)))
    x0 = int(rng.integers(0, w - cw + 1))
    y0 = int(rng.integers(0, h - ch + 1))
    img = img.crop((x0, y0, x0 + cw, y0 + ch)).resize((w, h), Image.Resampling.BICUBIC)
    angle = rng.uniform(-10.0, 10.0)
    shift = (round(rng.uniform(-0.1, 0.1) * w), round(rng.uniform(-0.1, 0.1) * h))
    img = img.rotate(angle, resample=Image.Resampling.BICUBIC, translate=shift)
    img = ImageEnhance.Brightness(img).enhance(rng.uniform(0.8, 1.2))
    return ImageEnhance.Contrast(img).enhance(rng.uniform(0.8, 1.2))


def kvasir_variant(record_id: str, variants: int, seed: int) -> int:
    """Which of an image's variants (1..N) a question is asked on."""
    return 1 + stable_hash(f"{seed}:{record_id}") % variants


def _draw(spec: str, record_id: str, image_id: str) -> tuple[str, str, int, str]:
    """(name, level, seed, key) of one row's transform: its random draws come from a
    generator seeded by (seed, key) and nothing else."""
    name, level, seed = spec.split(":")
    if name == "corruption":
        return name, level, int(seed), f"corruption:{record_id}"
    if name == "kvasir_augment":
        variant = kvasir_variant(record_id, int(level), int(seed))
        return name, level, int(seed), f"augment:{image_id}:{variant}"
    raise ValueError(
        f"unknown image transform {name!r} (row {record_id!r}); use corruption or kvasir_augment."
    )


def apply_transform(img: Image.Image, spec: str, record_id: str, image_id: str) -> Image.Image:
    """Apply the `image_transform` spec of one row (see the module docstring)."""
    name, level, seed, key = _draw(spec, record_id, image_id)
    rng = rng_for(seed, key)
    return corrupt(img, level, rng) if name == "corruption" else kvasir_augment(img, rng)


def transformed_identity(spec: str, record_id: str, image_id: str) -> str:
    """What a row's transformed pixels depend on besides the image file, known without reading
    it: rows with the same file and identity see the same pixels (a corruption is drawn per
    row, a Kvasir augment per image variant)."""
    name, level, seed, key = _draw(spec, record_id, image_id)
    return f"{name}:{level}:{seed}:{key}"


TRANSFORMS = ("corruption", "kvasir_augment")
