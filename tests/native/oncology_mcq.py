"""The oncology MCQ format: questions.jsonl + images/ (2D PNGs and 3D .npy/.npz/.nii.gz volumes).

The real data are private; this writes a tiny, hand-designed set in the same format.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tests.native import write_image

COHORTS = ("internal_a", "internal_b", "external")
CASES_PER_SPLIT = {"train": 4, "test": 2}  # per cohort
QUESTIONS_PER_CASE = 2
IMAGE_KINDS = (".png", ".npy", ".nii.gz", ".npz")
SHAPE = (16, 12, 7)  # rows, columns, slices


def volume(max_slice: int, shape: tuple[int, int, int] = SHAPE, seed: int = 0) -> np.ndarray:
    """A volume whose bright region is largest on `max_slice` (its max-area slice)."""
    rng = np.random.default_rng(seed)
    vol = rng.uniform(0.0, 10.0, size=shape).astype(np.float32)
    depth = shape[2]
    for k in range(depth):
        size = 1 + (k == max_slice) * 2  # a 1x1 blob everywhere, 3x3 on max_slice
        vol[:size, :size, k] += 1000.0
    return vol


def write_volume(path: Path, vol: np.ndarray) -> None:
    """Write `vol` as .npy, .npz (one array) or NIfTI (identity affine: RAS+ as stored)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    name = path.name
    if name.endswith(".npy"):
        np.save(path, vol)
    elif name.endswith(".npz"):
        np.savez(path, volume=vol)
    else:
        import nibabel as nib

        nib.Nifti1Image(vol, np.eye(4)).to_filename(str(path))


@dataclass
class OncologyFixture:
    root: Path
    questions: dict[str, int] = field(default_factory=dict)  # per source split
    rows: list[dict] = field(default_factory=list)
    max_slice: dict[str, int] = field(default_factory=dict)  # volume ref -> its max-area slice
    expected: dict[str, str] = field(default_factory=dict)  # question id -> correct option text

    @property
    def manifest(self) -> Path:
        return self.root / "questions.jsonl"


def write(root: Path, with_val: bool = False) -> OncologyFixture:
    """Per cohort: 4 train and 2 test cases (one image each), two questions per case.

    Images cycle through PNG, .npy, .nii.gz and .npz; answers alternate between option text
    (sometimes in another case) and letters; option counts cycle through 2-5. `with_val` moves
    the first train case of each cohort to the `val` split.
    """
    fixture = OncologyFixture(root)
    n_case, n_q = 0, 0
    for cohort in COHORTS:
        for split, n_cases in CASES_PER_SPLIT.items():
            for c in range(n_cases):
                row_split = "val" if with_val and split == "train" and c == 0 else split
                case_id = f"case{n_case:03d}"
                suffix = IMAGE_KINDS[n_case % len(IMAGE_KINDS)]
                ref = f"images/{case_id}{suffix}"
                if suffix == ".png":
                    write_image(root / ref, seed=n_case)
                else:
                    fixture.max_slice[ref] = n_case % SHAPE[2]
                    write_volume(root / ref, volume(fixture.max_slice[ref], seed=n_case))
                for _ in range(QUESTIONS_PER_CASE):
                    row, fixture.expected[f"q{n_q:03d}"] = _question(
                        n_q, case_id, ref, row_split, cohort
                    )
                    fixture.rows.append(row)
                    n_q += 1
                n_case += 1
    fixture.manifest.write_text("\n".join(json.dumps(r) for r in fixture.rows) + "\n")
    for row in fixture.rows:
        split = "validate" if row["split"] == "val" else row["split"]
        fixture.questions[split] = fixture.questions.get(split, 0) + 1
    return fixture


def _question(n: int, case_id: str, ref: str, split: str, cohort: str) -> tuple[dict, str]:
    """A native row and its correct option text."""
    n_options = 2 + n % 4
    options = [f"option {chr(65 + k)} of q{n}" for k in range(n_options)]
    correct = n % n_options
    # Letter, exact text, upper-cased text, "(B)" style.
    answer = (
        "ABCDE"[correct],
        options[correct],
        options[correct].upper(),
        f"({'ABCDE'[correct]})",
    )[n % 4]
    row = {
        "id": f"q{n:03d}",
        "case_id": case_id,
        "image": ref,
        "question": f"Question {n} about the lesion?",
        "options": options,
        "answer": answer,
        "source": ("RADS-style", "report-derived")[n % 2],
        "subcategory": ("LI-RADS", "staging", "findings")[n % 3],
        "split": split,
        "cohort": cohort,
    }
    return row, options[correct]
