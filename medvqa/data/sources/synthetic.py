"""Built-in synthetic medical VQA: procedurally rendered scans with SLAKE-like questions.

Why it exists: the CPU demo and the tests need a dataset that needs no download, builds in a
few seconds and that a ~1M-parameter VLM can learn in minutes. So the visual cues are strong
and global (modality contrast, body outline, bright/dark blobs on one side, small vs large),
while metadata (sex, age, ethnicity, modality, body part) behave like real covariates that a
distribution shift can split on: age raises the lesion rate and dims bone, sex narrows the
body outline, ethnicity has no visual effect at all.

Everything is deterministic from the seed: each case draws from its own
`np.random.default_rng([stream, seed, case_index, ...])`, so one case's content never depends
on how many cases come before it. The generated images and `annotations.jsonl` are cached under
`<cache_dir>/synthetic/<hash of the parameters>/`; `manifest.json` is written last and marks
the directory complete.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from PIL import Image, ImageFilter

from medvqa.atomic import build_once
from medvqa.data import records as R
from medvqa.data.base import DataError, VQASource
from medvqa.hashing import content_hash

log = logging.getLogger(__name__)

# Bump whenever rendering or question generation changes, so stale caches are not reused.
GENERATOR_VERSION = 4

MODALITIES: tuple[str, ...] = ("ct", "mri", "x-ray")
MODALITY_PROBS: tuple[float, ...] = (0.4, 0.35, 0.25)
BODY_PARTS: tuple[str, ...] = ("head", "chest", "abdomen")
SEXES: tuple[str, ...] = ("F", "M")
ETHNICITIES: tuple[str, ...] = ("WHITE", "BLACK", "ASIAN", "HISPANIC/LATINO", "UNKNOWN/OTHER")
ETHNICITY_PROBS: tuple[float, ...] = (0.6, 0.15, 0.1, 0.1, 0.05)
AGE_RANGE: tuple[int, int] = (18, 90)
LESION_KINDS: tuple[str, ...] = ("mass", "cyst")
LESION_KIND_PROBS: tuple[float, ...] = (0.55, 0.45)
LESION_COUNT_PROBS: tuple[float, ...] = (0.6, 0.25, 0.15)  # for 1, 2, 3 lesions
LEFT_PROB = 0.55  # lesions are a bit more often on the viewer's left: a mild position prior
SMALL_PROB = 0.6
QUESTION_SETS: tuple[str, ...] = ("vqa", "pretrain")
PLANES = {"ct": "axial", "mri": "axial", "x-ray": "coronal"}
NO_FINDING = "none"

# Lesion radius as a fraction of the image side; shrunk a little when there are several.
LESION_RADIUS = {"small": 0.075, "large": 0.14}
LESION_COUNT_SCALE = {1: 1.0, 2: 0.9, 3: 0.75}
# Lesion centres in units of the lesion frame (u: away from the midline, v: down).
LESION_SLOTS: dict[int, tuple[tuple[float, float], ...]] = {
    1: ((0.5, 0.0),),
    2: ((0.5, -0.52), (0.5, 0.52)),
    3: ((0.7, -0.5), (0.7, 0.5), (0.25, 0.0)),
}

# Seed streams: keep the random draws for case content, rendering and questions independent.
_CASE_STREAM, _RENDER_STREAM, _QUESTION_STREAM, _SPLIT_STREAM = 11, 12, 13, 14

# ---------------------------------------------------------------------------------------------
# Cases and findings
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageSpec:
    """What one image shows; the renderer and the question templates both read it."""

    modality: str
    body_part: str
    sex: str
    age: int
    lesion_count: int = 0  # 0 = no lesion
    lesion_kind: str = NO_FINDING  # mass | cyst | none
    lesion_side: str = NO_FINDING  # left | right | none (viewer's left = smaller x)
    lesion_size: str = NO_FINDING  # small | large | none

    @property
    def lesion(self) -> bool:
        return self.lesion_count > 0

    @property
    def plane(self) -> str:
        return PLANES[self.modality]


@dataclass(frozen=True)
class Case:
    """One patient: demographics shared by all of the case's images."""

    case_id: str
    sex: str
    age: int
    ethnicity: str
    images: tuple[ImageSpec, ...]


def lesion_probability(age: int) -> float:
    """Lesions get likelier with age (~0.45 at 20, ~0.8 at 90), so age shifts change the prior."""
    return float(np.clip(0.45 + 0.35 * (age - 20) / 70.0, 0.0, 1.0))


def sample_case(seed: int, index: int, images_per_case: tuple[int, int]) -> Case:
    """Draw one case from its own random stream (independent of all other cases)."""
    rng = np.random.default_rng([_CASE_STREAM, seed, index])
    sex = str(rng.choice(SEXES))
    # Skewed towards older patients, as in hospital data (mean ~59).
    age = int(np.rint(AGE_RANGE[0] + (AGE_RANGE[1] - AGE_RANGE[0]) * rng.beta(2.0, 1.5)))
    ethnicity = str(rng.choice(ETHNICITIES, p=ETHNICITY_PROBS))
    n_images = int(rng.integers(images_per_case[0], images_per_case[1] + 1))
    images = []
    for _ in range(n_images):
        modality = str(rng.choice(MODALITIES, p=MODALITY_PROBS))
        body_part = str(rng.choice(BODY_PARTS))
        if rng.random() < lesion_probability(age):
            spec = ImageSpec(
                modality,
                body_part,
                sex,
                age,
                lesion_count=int(rng.choice((1, 2, 3), p=LESION_COUNT_PROBS)),
                lesion_kind=str(rng.choice(LESION_KINDS, p=LESION_KIND_PROBS)),
                lesion_side="left" if rng.random() < LEFT_PROB else "right",
                lesion_size="small" if rng.random() < SMALL_PROB else "large",
            )
        else:
            spec = ImageSpec(modality, body_part, sex, age)
        images.append(spec)
    return Case(f"case{index:04d}", sex, age, ethnicity, tuple(images))


def assign_splits(n_cases: int, fractions: Sequence[float], seed: int) -> list[str]:
    """Split whole cases (never images of one case across splits) with exact proportions."""
    n_train = round(n_cases * fractions[0])
    n_val = min(round(n_cases * fractions[1]), n_cases - n_train)
    labels = ["train"] * n_train + ["validate"] * n_val
    labels += ["test"] * (n_cases - len(labels))
    order = np.random.default_rng([_SPLIT_STREAM, seed]).permutation(n_cases)
    out = [""] * n_cases
    for label, idx in zip(labels, order, strict=True):
        out[int(idx)] = label
    return out


# ---------------------------------------------------------------------------------------------
# Rendering (numpy + PIL only). Coordinates are normalised: the image spans [-0.5, 0.5]^2.
# ---------------------------------------------------------------------------------------------


class _Canvas:
    """A float image in [0, 1] with soft-edged drawing primitives on normalised coordinates."""

    def __init__(self, size: int, fill: float | np.ndarray = 0.0) -> None:
        self.size = size
        axis = (np.arange(size, dtype=np.float64) + 0.5) / size - 0.5
        self.y, self.x = np.meshgrid(axis, axis, indexing="ij")
        self.px = 1.0 / size  # one pixel in normalised units
        self.img = np.broadcast_to(np.asarray(fill, dtype=np.float64), (size, size)).copy()

    def ellipse(self, cx: float, cy: float, ax: float, ay: float) -> np.ndarray:
        """Soft mask of an ellipse (about one pixel of anti-aliasing)."""
        ax, ay = max(ax, self.px), max(ay, self.px)
        r = np.sqrt(((self.x - cx) / ax) ** 2 + ((self.y - cy) / ay) ** 2)
        edge = self.px / min(ax, ay)
        return np.clip((1.0 - r) / edge + 0.5, 0.0, 1.0)

    def ring(self, cx: float, cy: float, ax: float, ay: float, thickness: float) -> np.ndarray:
        """Soft mask of an elliptic ring whose outer edge is the ellipse (ax, ay)."""
        t = max(thickness, 1.2 * self.px)
        return np.clip(self.ellipse(cx, cy, ax, ay) - self.ellipse(cx, cy, ax - t, ay - t), 0, 1)

    def paint(self, mask: np.ndarray, value: float | np.ndarray) -> None:
        self.img = self.img * (1.0 - mask) + mask * value


@dataclass(frozen=True)
class _Geometry:
    """Where the body sits and where lesions go (the lesion frame), in normalised units."""

    cx: float
    cy: float  # body centre
    ax: float
    ay: float
    fy_centre: float  # lesion frame centre (x is cx)
    fx: float  # lesion frame half-width
    fy: float  # lesion frame half-height
    bone: float  # bone brightness (dimmer with age)


# Body half-axes per body part for cross-sections (ct, mri) and projections (x-ray).
_SECTION_AXES = {"head": (0.36, 0.36), "chest": (0.44, 0.30), "abdomen": (0.42, 0.32)}
_XRAY_AXES = {"head": (0.34, 0.41), "chest": (0.47, 0.62), "abdomen": (0.46, 0.65)}
_XRAY_LESION_FRAME = {"head": (0.28, 0.3), "chest": (0.4, 0.3), "abdomen": (0.38, 0.34)}


def _geometry(spec: ImageSpec, rng: np.random.Generator) -> _Geometry:
    """Body outline with a little jitter; women get a slightly narrower body, age dims bone."""
    table = _XRAY_AXES if spec.modality == "x-ray" else _SECTION_AXES
    ax, ay = table[spec.body_part]
    scale = rng.uniform(0.95, 1.04)
    ax, ay = ax * scale, ay * scale * rng.uniform(0.97, 1.03)
    if spec.sex == "F":
        ax *= 0.92
    cx, cy = rng.uniform(-0.02, 0.02, size=2)
    if spec.modality == "x-ray":
        cy += 0.08 if spec.body_part != "head" else 0.03
        fx, fy = _XRAY_LESION_FRAME[spec.body_part]
        fx *= 0.92 if spec.sex == "F" else 1.0
        frame_cy = cy - (0.1 if spec.body_part != "head" else 0.0)
    else:
        fx, fy, frame_cy = 0.85 * ax, 0.85 * ay, cy  # keep lesions off the rim
    age_frac = (spec.age - AGE_RANGE[0]) / (AGE_RANGE[1] - AGE_RANGE[0])
    bone = 1.0 - 0.3 * age_frac
    return _Geometry(float(cx), float(cy), ax, ay, float(frame_cy), fx, fy, bone)


def _draw_ct(c: _Canvas, part: str, g: _Geometry, rng: np.random.Generator) -> None:
    """CT: black air, mid-grey soft tissue, bright bone, air-dark lungs."""
    cx, cy, ax, ay, b = g.cx, g.cy, g.ax, g.ay, g.bone
    c.paint(c.ellipse(cx, cy, ax, ay), 0.45 + rng.uniform(-0.03, 0.03))
    if part == "head":
        c.paint(c.ring(cx, cy, ax, ay, 0.07), 0.95 * b)
        c.paint(c.ellipse(cx, cy, ax - 0.07, ay - 0.07), 0.42)
        for s in (-1, 1):  # lateral ventricles
            c.paint(c.ellipse(cx + s * 0.05, cy - 0.02, 0.03, 0.09), 0.18)
    elif part == "chest":
        c.paint(c.ring(cx, cy, ax, ay, 0.035), 0.75 * b)
        for s in (-1, 1):
            c.paint(c.ellipse(cx + s * 0.48 * ax, cy - 0.05 * ay, 0.36 * ax, 0.68 * ay), 0.07)
        c.paint(c.ellipse(cx + 0.12 * ax, cy + 0.2 * ay, 0.2 * ax, 0.3 * ay), 0.55)
        c.paint(c.ellipse(cx, cy + 0.75 * ay, 0.07 * ax, 0.07 * ax), 0.95 * b)
    else:
        c.paint(c.ring(cx, cy, ax, ay, 0.03), 0.65 * b)
        c.paint(c.ellipse(cx - 0.45 * ax, cy - 0.15 * ay, 0.38 * ax, 0.5 * ay), 0.6)  # liver
        c.paint(c.ellipse(cx + 0.55 * ax, cy - 0.25 * ay, 0.17 * ax, 0.25 * ay), 0.57)
        for s in (-1, 1):  # kidneys
            c.paint(c.ellipse(cx + s * 0.42 * ax, cy + 0.45 * ay, 0.13 * ax, 0.2 * ay), 0.63)
        for _ in range(3):  # bowel loops
            bx, by = rng.uniform(-0.2, 0.25) * ax, rng.uniform(-0.3, 0.3) * ay
            c.paint(c.ellipse(cx + bx, cy + by, 0.1 * ax, 0.12 * ay), 0.33)
        c.paint(c.ellipse(cx, cy + 0.72 * ay, 0.08 * ax, 0.08 * ax), 0.95 * b)


def _draw_mri(c: _Canvas, part: str, g: _Geometry, rng: np.random.Generator) -> None:
    """MRI (T1-like): bright fat rim and soft tissue, dark bone, dark lungs."""
    cx, cy, ax, ay = g.cx, g.cy, g.ax, g.ay
    c.paint(c.ellipse(cx, cy, ax, ay), 0.55 + rng.uniform(-0.03, 0.03))
    c.paint(c.ring(cx, cy, ax, ay, 0.06), 0.9)  # subcutaneous fat
    if part == "head":
        c.paint(c.ring(cx, cy, ax - 0.05, ay - 0.05, 0.05), 0.1)  # skull: dark on MRI
        c.paint(c.ellipse(cx, cy, ax - 0.1, ay - 0.1), 0.5)
        c.paint(c.ellipse(cx, cy, ax - 0.16, ay - 0.16), 0.62)  # white matter
        for s in (-1, 1):
            c.paint(c.ellipse(cx + s * 0.05, cy - 0.02, 0.03, 0.09), 0.12)
    elif part == "chest":
        for s in (-1, 1):
            c.paint(c.ellipse(cx + s * 0.48 * ax, cy - 0.05 * ay, 0.36 * ax, 0.66 * ay), 0.05)
        c.paint(c.ellipse(cx + 0.12 * ax, cy + 0.2 * ay, 0.2 * ax, 0.3 * ay), 0.7)
        c.paint(c.ellipse(cx, cy + 0.74 * ay, 0.08 * ax, 0.08 * ax), 0.25)
    else:
        c.paint(c.ellipse(cx - 0.45 * ax, cy - 0.15 * ay, 0.38 * ax, 0.5 * ay), 0.48)
        c.paint(c.ellipse(cx + 0.55 * ax, cy - 0.25 * ay, 0.17 * ax, 0.25 * ay), 0.44)
        for s in (-1, 1):
            c.paint(c.ellipse(cx + s * 0.42 * ax, cy + 0.45 * ay, 0.13 * ax, 0.2 * ay), 0.8)
        for _ in range(3):
            bx, by = rng.uniform(-0.2, 0.25) * ax, rng.uniform(-0.3, 0.3) * ay
            c.paint(c.ellipse(cx + bx, cy + by, 0.1 * ax, 0.12 * ay), 0.65)
        c.paint(c.ellipse(cx, cy + 0.72 * ay, 0.08 * ax, 0.08 * ax), 0.25)


def _draw_xray(c: _Canvas, part: str, g: _Geometry, rng: np.random.Generator) -> None:
    """X-ray projection: dense = bright (bones white, lungs dark), no black cross-section."""
    cx, cy, ax, ay, b = g.cx, g.cy, g.ax, g.ay, g.bone
    body = c.ellipse(cx, cy, ax, ay)
    if part == "head":
        c.paint(body, 0.45)
        c.paint(c.ring(cx, cy, ax, ay, 0.07), 0.92 * b)  # skull vault
        for s in (-1, 1):  # orbits
            c.paint(c.ellipse(cx + s * 0.12, cy + 0.12, 0.07, 0.06), 0.28)
        jaw = c.ring(cx, cy + 0.16, 0.24, 0.24, 0.04) * (c.y > cy + 0.24)
        c.paint(jaw, 0.85 * b)
    elif part == "chest":
        c.paint(body, 0.55)
        lungs = np.zeros_like(c.img)
        for s in (-1, 1):
            lungs = np.maximum(lungs, c.ellipse(cx + s * 0.2, g.fy_centre, 0.15, 0.3))
        c.paint(lungs, 0.17)
        dx = c.x - cx
        phase = (c.y - 0.9 * dx**2 - rng.uniform(0, 0.09)) / 0.09
        ribs = (np.sin(2 * np.pi * phase) > 0.7) * body * (np.abs(dx) > 0.05) * (c.y < cy + 0.25)
        c.paint(ribs.astype(np.float64), 0.35 + 0.35 * b)
        c.paint(c.ellipse(cx + 0.06, g.fy_centre + 0.17, 0.13, 0.12), 0.62)  # heart shadow
        spine = np.clip((0.035 - np.abs(dx)) / c.px + 0.5, 0, 1) * body
        c.paint(spine, 0.9 * b)
    else:
        c.paint(body, 0.45)
        dx = c.x - cx
        for _ in range(4):  # bowel gas
            gx, gy = rng.uniform(-0.28, 0.28), rng.uniform(-0.25, 0.2)
            c.paint(c.ellipse(cx + gx, cy + gy, 0.035, 0.03), 0.3)
        column = np.clip((0.05 - np.abs(dx)) / c.px + 0.5, 0, 1) * (c.y < cy + 0.3)
        gaps = (np.sin(2 * np.pi * (c.y - cy) / 0.1) > -0.75).astype(np.float64)
        c.paint(column * gaps, 0.88 * b)
        pelvis = c.ring(cx, cy + 0.45, 0.36, 0.24, 0.045) * (c.y > cy + 0.25)
        c.paint(pelvis, 0.88 * b)


_DRAW: dict[str, Callable[[_Canvas, str, _Geometry, np.random.Generator], None]] = {
    "ct": _draw_ct,
    "mri": _draw_mri,
    "x-ray": _draw_xray,
}
_BACKGROUND = {"ct": 0.0, "mri": 0.03}
_NOISE = {"ct": 0.035, "mri": 0.03, "x-ray": 0.03}


def lesion_centres(
    spec: ImageSpec, g: _Geometry, rng: np.random.Generator
) -> list[tuple[float, float]]:
    """Centres of the lesions, all on the chosen side so that 'where' has one answer."""
    side = -1.0 if spec.lesion_side == "left" else 1.0
    centres = []
    for u, v in LESION_SLOTS[spec.lesion_count]:
        du, dv = rng.uniform(-0.06, 0.06, size=2)
        centres.append((g.cx + side * (u + du) * g.fx, g.fy_centre + (v + dv) * g.fy))
    return centres


def lesion_radius(spec: ImageSpec) -> float:
    """Normalised radius: large is ~2.1x small, easy to tell apart at 64 px."""
    return LESION_RADIUS[spec.lesion_size] * LESION_COUNT_SCALE[spec.lesion_count]


def _draw_lesions(c: _Canvas, spec: ImageSpec, g: _Geometry, rng: np.random.Generator) -> None:
    """Mass = bright blob; cyst = dark blob with a bright wall (visible even inside a lung)."""
    r0 = lesion_radius(spec)
    for x, y in lesion_centres(spec, g, rng):
        r = r0 * rng.uniform(0.92, 1.08)
        if spec.lesion_kind == "mass":
            c.paint(c.ellipse(x, y, r, r * rng.uniform(0.85, 1.0)), 0.97)
        else:
            wall = max(0.2 * r, 1.0 * c.px)  # outside r, so small cysts keep a dark core
            c.paint(c.ellipse(x, y, r + wall, r + wall), 0.85)
            c.paint(c.ellipse(x, y, r, r), 0.03)


def render_image(spec: ImageSpec, size: int, seed: Sequence[int]) -> np.ndarray:
    """Render a grayscale image in [0, 1] (float, size x size) for one image spec.

    Anatomy, lesions and noise use separate random streams derived from `seed`, so the same
    seed with and without a lesion gives images that differ only around the lesion.
    """
    anatomy_rng = np.random.default_rng([*seed, 0])
    lesion_rng = np.random.default_rng([*seed, 1])
    noise_rng = np.random.default_rng([*seed, 2])
    geometry = _geometry(spec, anatomy_rng)
    if spec.modality == "x-ray":
        axis = (np.arange(size) + 0.5) / size
        background = np.repeat((0.3 - 0.22 * axis)[:, None], size, axis=1)
        canvas = _Canvas(size, background)
    else:
        canvas = _Canvas(size, _BACKGROUND[spec.modality])
    _DRAW[spec.modality](canvas, spec.body_part, geometry, anatomy_rng)
    if spec.lesion:
        _draw_lesions(canvas, spec, geometry, lesion_rng)
    img = canvas.img * anatomy_rng.uniform(0.95, 1.05)
    img = img + noise_rng.normal(0.0, _NOISE[spec.modality], img.shape)
    if spec.modality == "mri":
        img = _blur(np.clip(img, 0, 1), 0.75 * size / 64)
        theta = anatomy_rng.uniform(0, 2 * np.pi)  # receive-coil shading
        img = img * (1.0 + 0.6 * (canvas.x * np.cos(theta) + canvas.y * np.sin(theta)))
    elif spec.modality == "x-ray":
        img = _blur(np.clip(img, 0, 1), 0.6 * size / 64)
    return np.clip(img, 0.0, 1.0)


def _blur(img: np.ndarray, radius: float) -> np.ndarray:
    """Gaussian blur through PIL (no scipy/torchvision needed); 8-bit is what gets stored anyway."""
    pil = Image.fromarray(np.round(np.clip(img, 0, 1) * 255).astype(np.uint8))
    out = pil.filter(ImageFilter.GaussianBlur(radius))
    return np.asarray(out, dtype=np.float64) / 255.0


def to_png_image(img: np.ndarray) -> Image.Image:
    """Grayscale float image -> 8-bit RGB, the format every VLM processor expects."""
    gray = Image.fromarray(np.round(np.clip(img, 0, 1) * 255).astype(np.uint8))
    return gray.convert("RGB")


# ---------------------------------------------------------------------------------------------
# Questions
# ---------------------------------------------------------------------------------------------

YES_NO = ["yes", "no"]
QA = tuple[str, str, str, list[str] | None]  # question, answer, answer_type, candidates

_ARTICLE = {"ct": "a ct", "mri": "an mri", "x-ray": "an x-ray"}
_NUMBER_WORDS = {1: "a", 2: "two", 3: "three"}

# Knowledge questions name an organ found in the image's body part; the answer depends on the
# question text only (a pure language prior, like SLAKE's knowledge questions).
KNOWLEDGE: dict[str, dict[str, dict[str, str]]] = {
    "chest": {
        "lung": {"system": "respiratory", "function": "breathing"},
        "heart": {"system": "circulatory", "function": "pumping blood"},
    },
    "head": {
        "brain": {"system": "nervous", "function": "thinking"},
        "skull": {"system": "skeletal", "function": "protection"},
    },
    "abdomen": {
        "liver": {"system": "digestive", "function": "detoxification"},
        "kidney": {"system": "urinary", "function": "filtering blood"},
        "bowel": {"system": "digestive", "function": "absorption"},
    },
}


def _pick(rng: np.random.Generator, options: Sequence[str]) -> str:
    return str(options[int(rng.integers(len(options)))])


def _other(rng: np.random.Generator, values: Sequence[str], truth: str) -> str:
    return _pick(rng, [v for v in values if v != truth])


def _q_modality_open(s: ImageSpec, rng: np.random.Generator) -> QA:
    q = _pick(
        rng,
        [
            "what modality is used to take this image?",
            "what imaging modality was used?",
            "which imaging technique is shown?",
            "how was this image acquired?",
        ],
    )
    return q, s.modality, "open", None


def _q_modality_pair(s: ImageSpec, rng: np.random.Generator) -> QA:
    pair = [s.modality, _other(rng, MODALITIES, s.modality)]
    if rng.random() < 0.5:
        pair.reverse()
    a, b = pair
    q = _pick(
        rng,
        [
            f"is this {_ARTICLE[a]} or {_ARTICLE[b]}?",
            f"was this image taken with {a} or {b}?",
            f"which modality is this, {a} or {b}?",
        ],
    )
    return q, s.modality, "closed", pair


def _q_organ_open(s: ImageSpec, rng: np.random.Generator) -> QA:
    q = _pick(
        rng,
        [
            "which part of the body does this image show?",
            "what body part is shown?",
            "which region of the body is imaged?",
            "what part of the body is being imaged?",
        ],
    )
    return q, s.body_part, "open", None


def _q_organ_yesno(s: ImageSpec, rng: np.random.Generator) -> QA:
    asked = s.body_part if rng.random() < 0.6 else _other(rng, BODY_PARTS, s.body_part)
    q = _pick(
        rng,
        [
            f"is this an image of the {asked}?",
            f"does this image show the {asked}?",
            f"is the {asked} shown in this image?",
        ],
    )
    return q, "yes" if asked == s.body_part else "no", "closed", list(YES_NO)


def _q_lesion_yesno(s: ImageSpec, rng: np.random.Generator) -> QA:
    q = _pick(
        rng,
        [
            "is there a lesion in this image?",
            "does this image contain a lesion?",
            "is any lesion visible?",
            "are there abnormal findings in this image?",
        ],
    )
    return q, "yes" if s.lesion else "no", "closed", list(YES_NO)


def _q_normal_yesno(s: ImageSpec, rng: np.random.Generator) -> QA:
    q = _pick(
        rng,
        [
            "does this image look normal?",
            "is this a normal image?",
            f"is the {s.body_part} healthy?",
        ],
    )
    return q, "no" if s.lesion else "yes", "closed", list(YES_NO)


def _q_abnormality_open(s: ImageSpec, rng: np.random.Generator) -> QA:
    q = _pick(
        rng,
        [
            "what is the abnormality?",
            "what abnormality is present?",
            "what is abnormal in this image?",
        ],
    )
    return q, s.lesion_kind, "open", None


def _q_position_open(s: ImageSpec, rng: np.random.Generator) -> QA:
    q = _pick(
        rng,
        [
            "where is the lesion?",
            "on which side is the lesion?",
            "which side of the image is the lesion on?",
            "where is the abnormality located?",
        ],
    )
    return q, s.lesion_side, "open", None


def _q_position_yesno(s: ImageSpec, rng: np.random.Generator) -> QA:
    asked = "left" if rng.random() < 0.5 else "right"
    q = _pick(
        rng,
        [
            f"is the lesion on the {asked} side?",
            f"is the lesion located on the {asked}?",
            f"is the abnormality on the {asked} side of the image?",
        ],
    )
    return q, "yes" if asked == s.lesion_side else "no", "closed", list(YES_NO)


def _q_size_pair(s: ImageSpec, rng: np.random.Generator) -> QA:
    pair = ["large", "small"] if rng.random() < 0.5 else ["small", "large"]
    a, b = pair
    q = _pick(
        rng,
        [
            f"is the lesion {a} or {b}?",
            f"is the abnormality {a} or {b}?",
            f"how big is the lesion, {a} or {b}?",
        ],
    )
    return q, s.lesion_size, "closed", pair


def _q_quantity_open(s: ImageSpec, rng: np.random.Generator) -> QA:
    q = _pick(
        rng,
        [
            "how many lesions are there?",
            "how many lesions are visible?",
            "what is the number of lesions?",
            "how many abnormalities can be seen?",
        ],
    )
    return q, str(s.lesion_count), "open", None


def _q_plane_open(s: ImageSpec, rng: np.random.Generator) -> QA:
    q = _pick(
        rng,
        [
            "in which plane is this image taken?",
            "what is the scanning plane?",
            "which plane is this image in?",
            "what plane is shown?",
        ],
    )
    return q, s.plane, "open", None


def _q_knowledge_system(s: ImageSpec, rng: np.random.Generator) -> QA:
    organ = _pick(rng, sorted(KNOWLEDGE[s.body_part]))
    q = _pick(
        rng,
        [
            f"which organ system does the {organ} belong to?",
            f"the {organ} is part of which organ system?",
            f"to which body system does the {organ} belong?",
        ],
    )
    return q, KNOWLEDGE[s.body_part][organ]["system"], "open", None


def _q_knowledge_function(s: ImageSpec, rng: np.random.Generator) -> QA:
    organ = _pick(rng, sorted(KNOWLEDGE[s.body_part]))
    q = _pick(
        rng,
        [
            f"what is the function of the {organ}?",
            f"what is the main function of the {organ}?",
            f"what does the {organ} do?",
        ],
    )
    return q, KNOWLEDGE[s.body_part][organ]["function"], "open", None


@dataclass(frozen=True)
class Template:
    """A question kind: its content type, whether it needs a lesion, and its generator."""

    name: str
    question_type: str
    needs_lesion: bool
    make: Callable[[ImageSpec, np.random.Generator], QA]
    weight: float = 1.0  # sampling weight: higher = asked for (almost) every image


VQA_TEMPLATES: tuple[Template, ...] = (
    Template("modality_open", "modality", False, _q_modality_open),
    Template("modality_pair", "modality", False, _q_modality_pair),
    Template("organ_open", "organ", False, _q_organ_open),
    Template("organ_yesno", "organ", False, _q_organ_yesno),
    Template("lesion_yesno", "abnormality", False, _q_lesion_yesno, 4.0),
    Template("normal_yesno", "abnormality", False, _q_normal_yesno, 4.0),
    Template("abnormality_open", "abnormality", False, _q_abnormality_open, 3.0),
    Template("position_open", "position", True, _q_position_open, 1.5),
    Template("position_yesno", "position", True, _q_position_yesno, 1.5),
    Template("size_pair", "size", True, _q_size_pair, 1.5),
    Template("quantity_open", "quantity", True, _q_quantity_open, 1.5),
    Template("plane_open", "plane", False, _q_plane_open),
    Template("knowledge_system", "knowledge", False, _q_knowledge_system),
    Template("knowledge_function", "knowledge", False, _q_knowledge_function),
)
QUESTION_TYPES: tuple[str, ...] = tuple(dict.fromkeys(t.question_type for t in VQA_TEMPLATES))

CAPTION_QUESTION = "Describe the image."


def caption(s: ImageSpec) -> str:
    """One-line report, e.g. 'ct of the chest with a large mass on the left'."""
    if not s.lesion:
        return f"{s.modality} of the {s.body_part} with no lesion"
    noun = (
        {"mass": "masses", "cyst": "cysts"}[s.lesion_kind] if s.lesion_count > 1 else s.lesion_kind
    )
    count = _NUMBER_WORDS[s.lesion_count]
    return f"{s.modality} of the {s.body_part} with {count} {s.lesion_size} {noun} on the {s.lesion_side}"


def _generic(
    questions: Sequence[str], answer: Callable[[ImageSpec], str]
) -> Callable[[ImageSpec, np.random.Generator], QA]:
    def make(s: ImageSpec, rng: np.random.Generator) -> QA:
        return _pick(rng, questions), answer(s), "open", None

    return make


def _fact(s: ImageSpec, rng: np.random.Generator) -> QA:
    """General medical knowledge, as a language model's pre-training text would hold it."""
    organ = _pick(rng, sorted(KNOWLEDGE[s.body_part]))
    fact = KNOWLEDGE[s.body_part][organ]
    answer = f"the {organ} belongs to the {fact['system']} system; its role is {fact['function']}"
    return (
        _pick(rng, [f"tell me about the {organ}.", f"explain the {organ}."]),
        answer,
        "open",
        None,
    )


def _region_check(s: ImageSpec, rng: np.random.Generator) -> QA:
    part = _pick(rng, BODY_PARTS)
    return (
        f"does this picture show the {part}?",
        "yes" if part == s.body_part else "no",
        "open",
        None,
    )


def _finding_check(s: ImageSpec, rng: np.random.Generator) -> QA:
    return "can you see a finding?", "yes" if s.lesion else "no", "open", None


def _side_check(s: ImageSpec, rng: np.random.Generator) -> QA:
    side = _pick(rng, ["left", "right"])
    return f"is the finding on the {side}?", "yes" if side == s.lesion_side else "no", "open", None


def _extent_check(s: ImageSpec, rng: np.random.Generator) -> QA:
    size = _pick(rng, ["small", "large"])
    return f"is the finding {size}?", "yes" if size == s.lesion_size else "no", "open", None


# Pre-training questions: the same answer vocabulary, phrased unlike the vqa templates, all open.
# Yes/no checks are included because a language model's pre-training teaches it what "yes" and
# "no" mean; without them the tiny base could only learn that during fine-tuning.
PRETRAIN_TEMPLATES: tuple[Template, ...] = (
    Template("finding_check", "generic", False, _finding_check, 2.0),
    Template("side_check", "generic", True, _side_check, 1.5),
    Template("extent_check", "generic", True, _extent_check, 1.5),
    Template("fact", "generic", False, _fact),
    Template("region_check", "generic", False, _region_check),
    Template(
        "scan",
        "generic",
        False,
        _generic(
            ["what kind of scan is this?", "which scanner made this picture?"], lambda s: s.modality
        ),
    ),
    Template(
        "region",
        "generic",
        False,
        _generic(
            ["what body region is this?", "which area of the body is pictured?"],
            lambda s: s.body_part,
        ),
    ),
    Template(
        "finding",
        "generic",
        False,
        _generic(["what is the finding?", "name the finding."], lambda s: s.lesion_kind),
    ),
    Template(
        "abnormal",
        "generic",
        False,
        _generic(["is anything abnormal here?"], lambda s: "yes" if s.lesion else "no"),
    ),
    Template(
        "orientation",
        "generic",
        False,
        _generic(["what is the orientation of the slice?"], lambda s: s.plane),
    ),
    Template(
        "side",
        "generic",
        True,
        _generic(["which side is the finding on?"], lambda s: s.lesion_side),
    ),
    Template(
        "extent", "generic", True, _generic(["how big is the finding?"], lambda s: s.lesion_size)
    ),
    Template(
        "count",
        "generic",
        True,
        _generic(["count the findings."], lambda s: str(s.lesion_count)),
    ),
)


def make_questions(
    spec: ImageSpec, question_set: str, n_questions: int, rng: np.random.Generator
) -> list[tuple[str, str, QA]]:
    """(template name, question_type, qa) for one image: distinct applicable templates."""
    if question_set == "pretrain":
        out: list[tuple[str, str, QA]] = [
            ("caption", "caption", (CAPTION_QUESTION, caption(spec), "open", None))
        ]
        templates, n_questions = PRETRAIN_TEMPLATES, n_questions - 1
    else:
        out, templates = [], VQA_TEMPLATES
    usable = [t for t in templates if spec.lesion or not t.needs_lesion]
    k = max(0, min(n_questions, len(usable)))
    # Weighted so that the abnormality questions are asked about nearly every image, lesion or
    # not; uniform sampling would ask them more often of normal images (fewer templates apply)
    # and wash out the yes/no priors.
    weights = np.array([t.weight for t in usable])
    chosen = sorted(rng.choice(len(usable), size=k, replace=False, p=weights / weights.sum()))
    for i in chosen:
        t = usable[int(i)]
        out.append((t.name, t.question_type, t.make(spec, rng)))
    return out


# ---------------------------------------------------------------------------------------------
# The dataset
# ---------------------------------------------------------------------------------------------

METADATA_COLUMNS: tuple[str, ...] = (
    "modality",
    "body_part",
    "sex",
    "age",
    "ethnicity",
    "lesion",
    "lesion_kind",
    "lesion_count",
    "lesion_side",
    "lesion_size",
    "plane",
    "template",
)
MANIFEST = "manifest.json"
ANNOTATIONS = "annotations.jsonl"
IMAGES_DIR = "images"


def _pair(value: Sequence[int], key: str) -> tuple[int, int]:
    items = list(value)
    if len(items) != 2 or not 1 <= int(items[0]) <= int(items[1]):
        raise ValueError(f"dataset.{key} must be [min, max] with 1 <= min <= max; got {value!r}.")
    return int(items[0]), int(items[1])


class SyntheticVQA(VQASource):
    """Procedurally generated medical-like VQA, cached on disk under a hash of its parameters."""

    name = "synthetic"

    def __init__(
        self,
        cache_dir: str | Path,
        seed: int = 0,
        n_cases: int = 500,
        images_per_case: Sequence[int] = (1, 2),
        image_size: int = 64,
        questions_per_image: int = 8,
        question_set: str = "vqa",
        split_fractions: Sequence[float] = (0.7, 0.15, 0.15),
    ) -> None:
        if int(seed) < 0:
            raise ValueError(f"dataset.seed must be >= 0; got {seed}.")
        if int(n_cases) < 1:
            raise ValueError(f"dataset.n_cases must be >= 1; got {n_cases}.")
        if int(image_size) < 16:
            raise ValueError(f"dataset.image_size must be >= 16 pixels; got {image_size}.")
        if int(questions_per_image) < 1:
            raise ValueError(
                f"dataset.questions_per_image must be >= 1; got {questions_per_image}."
            )
        if question_set not in QUESTION_SETS:
            raise ValueError(
                f"dataset.question_set must be one of {QUESTION_SETS}; got {question_set!r}."
            )
        fractions = [float(f) for f in split_fractions]
        if len(fractions) != 3 or min(fractions) < 0 or abs(sum(fractions) - 1.0) > 1e-6:
            raise ValueError(
                "dataset.split_fractions must be three non-negative numbers (train, validate, "
                f"test) summing to 1; got {split_fractions!r}."
            )
        self.seed = int(seed)
        self.n_cases = int(n_cases)
        self.images_per_case = _pair(images_per_case, "images_per_case")
        self.image_size = int(image_size)
        self.questions_per_image = int(questions_per_image)
        self.question_set = str(question_set)
        self.split_fractions = tuple(fractions)
        self.cache_dir = Path(cache_dir).expanduser()
        canonical = json.dumps(self.params, sort_keys=True, separators=(",", ":"))
        self.config_hash = content_hash(canonical)
        super().__init__(self.cache_dir / "synthetic" / self.config_hash)
        self._table: pd.DataFrame | None = None

    @property
    def root(self) -> Path:
        """The cache directory of this configuration; images live under it."""
        return self._root

    @root.setter
    def root(self, value: str | Path) -> None:
        self._root = Path(value)

    @property
    def params(self) -> dict[str, Any]:
        """Everything that determines the content (hashed to name the cache directory)."""
        return {
            "seed": self.seed,
            "n_cases": self.n_cases,
            "images_per_case": list(self.images_per_case),
            "image_size": self.image_size,
            "questions_per_image": self.questions_per_image,
            "question_set": self.question_set,
            "split_fractions": list(self.split_fractions),
            "generator_version": GENERATOR_VERSION,
        }

    # -- public ----------------------------------------------------------------------------------

    def fingerprint(self) -> str:
        """The config hash already covers the generator version and every parameter."""
        return self.config_hash

    def table(self) -> pd.DataFrame:
        """All records; generates the cache on first use, afterwards only reads it."""
        if self._table is None:
            self.prepare()
            table = self._read()
            R.validate_table(table, self.name, required=METADATA_COLUMNS)
            self._table = table
        return self._table.copy()

    def prepare(self) -> Path:
        """Make sure the cache directory is complete (generating it if not); returns it."""
        if not self._complete(self.root):
            self._generate()
        return self.root

    def image_path(self, ref: str, record_id: str | None = None) -> Path:
        """Like the base class, but generates the cache first if images are asked for early."""
        if self._table is None:
            self.prepare()
        return super().image_path(ref, record_id)

    # -- cache -----------------------------------------------------------------------------------

    def _complete(self, directory: Path) -> bool:
        """A directory counts only with a manifest for exactly these parameters."""
        try:
            manifest = json.loads((directory / MANIFEST).read_text())
        except (OSError, ValueError):
            return False
        return (
            isinstance(manifest, dict)
            and manifest.get("hash") == self.config_hash
            and manifest.get("params") == self.params
            and (directory / ANNOTATIONS).is_file()
        )

    def _unwritable(self, err: OSError) -> DataError:
        return DataError(
            f"{self.name}: cannot write the generated dataset to {self.root} ({err}). Set "
            "paths.cache_dir (or the environment variable MEDVQA_CACHE) to a writable directory."
        )

    def _generate(self) -> None:
        """Generate once, atomically (`medvqa.atomic.build_once`): readers never see halves."""
        final = self.root
        if final.exists() and not self._complete(final):
            log.info("Removing incomplete synthetic cache %s", final)
            shutil.rmtree(final, ignore_errors=True)
        start = time.perf_counter()
        log.info(
            "Generating synthetic VQA dataset (%d cases, %s questions) in %s",
            self.n_cases,
            self.question_set,
            final,
        )
        counts: dict[str, Any] = {}
        try:
            built = build_once(
                final, lambda tmp: counts.update(self._write(tmp)), MANIFEST, "generated dataset"
            )
        except OSError as err:
            raise self._unwritable(err) from err
        if built:
            log.info(
                "Generated %d images and %d records in %.1fs",
                counts["images"],
                counts["records"],
                time.perf_counter() - start,
            )

    def _write(self, directory: Path) -> dict[str, Any]:
        """Render images and questions into `directory`; the manifest goes last, atomically."""
        (directory / IMAGES_DIR).mkdir()
        splits = assign_splits(self.n_cases, self.split_fractions, self.seed)
        n_images = n_records = 0
        split_counts = dict.fromkeys(R.SOURCE_SPLITS, 0)
        with open(directory / ANNOTATIONS, "w", encoding="utf-8") as out:
            for index in range(self.n_cases):
                case = sample_case(self.seed, index, self.images_per_case)
                split_counts[splits[index]] += 1
                for j, spec in enumerate(case.images):
                    image_id = f"img{n_images:05d}"
                    n_images += 1
                    ref = f"{IMAGES_DIR}/{image_id}.png"
                    pixels = render_image(
                        spec, self.image_size, (_RENDER_STREAM, self.seed, index, j)
                    )
                    to_png_image(pixels).save(directory / ref, format="PNG")
                    q_rng = np.random.default_rng([_QUESTION_STREAM, self.seed, index, j])
                    qas = make_questions(spec, self.question_set, self.questions_per_image, q_rng)
                    for k, (template, qtype, (question, answer, atype, cands)) in enumerate(qas):
                        record = {
                            R.ID: f"{image_id}_q{k}",
                            R.IMAGE: ref,
                            R.QUESTION: question,
                            R.ANSWER: answer,
                            R.ANSWER_TYPE: atype,
                            R.QUESTION_TYPE: qtype,
                            R.CANDIDATES: cands,
                            R.CASE_ID: case.case_id,
                            R.IMAGE_ID: image_id,
                            R.SOURCE_SPLIT: splits[index],
                            "modality": spec.modality,
                            "body_part": spec.body_part,
                            "sex": case.sex,
                            "age": case.age,
                            "ethnicity": case.ethnicity,
                            "lesion": "yes" if spec.lesion else "no",
                            "lesion_kind": spec.lesion_kind,
                            "lesion_count": spec.lesion_count,
                            "lesion_side": spec.lesion_side,
                            "lesion_size": spec.lesion_size,
                            "plane": spec.plane,
                            "template": template,
                        }
                        out.write(json.dumps(record) + "\n")
                        n_records += 1
        counts = {"cases": self.n_cases, "images": n_images, "records": n_records}
        manifest = {
            "hash": self.config_hash,
            "params": self.params,
            "counts": counts,
            "cases_per_split": split_counts,
        }
        part = directory / f"{MANIFEST}.tmp"
        part.write_text(json.dumps(manifest, indent=2, sort_keys=True))
        os.replace(part, directory / MANIFEST)
        return counts

    def _read(self) -> pd.DataFrame:
        """Load `annotations.jsonl`; lists stay lists and open candidates stay None."""
        path = self.root / ANNOTATIONS
        rows = []
        with open(path, encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                try:
                    rows.append(json.loads(line))
                except ValueError as err:
                    raise DataError(
                        f"{self.name}: {path} line {line_no} is not valid JSON ({err}); delete "
                        f"{self.root} to regenerate it."
                    ) from err
        columns = [*R.CORE_COLUMNS, *METADATA_COLUMNS]
        return pd.DataFrame.from_records(rows, columns=columns)
