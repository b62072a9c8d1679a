"""Synthetic cases: patients (sex, age, ethnicity) and the images taken of them, with findings.

Metadata behave like real covariates a shift can split on: age raises the lesion rate, sex and
ethnicity only change the rendering slightly or not at all. Every case draws from its own
`np.random.default_rng([CASE_STREAM, seed, case_index])`, so one case never depends on another.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

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
CASE_STREAM, RENDER_STREAM, QUESTION_STREAM, SPLIT_STREAM = 11, 12, 13, 14
PARAPHRASE_STREAM = 15  # dataset.paraphrases: which other wording a question gets


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
    rng = np.random.default_rng([CASE_STREAM, seed, index])
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
    order = np.random.default_rng([SPLIT_STREAM, seed]).permutation(n_cases)
    out = [""] * n_cases
    for label, idx in zip(labels, order, strict=True):
        out[int(idx)] = label
    return out
