"""RoboSurg-VQA's native layout: manifest.csv + frames/<site>/<id>.png + masks/<site>/<id>.png."""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

from tests.native import write_image

SITES = ("site_a", "site_b", "site_c")
FRAMES_PER_SPLIT = {"train": 3, "val": 1, "test": 2}  # per site
COLUMNS = (
    "site",
    "split",
    "id",
    "frame",
    "mask",
    "q1_context",
    "q2_anatomy",
    "q3_view",
    "q4_bleeding",
    "q4_smoke",
    "q4_occlusion",
    "q5_quality",
    "q6_glare",
    "q7_contrast",
    "q8_centre_occluded",
    "q9_smoke_region",
)
# Native spellings vary in case and use aliases (center, unknown); the loader canonicalises.
VIEWS = ("endoscopic", "Robotic Camera", "synthetic", "unknown")
QUALITIES = ("clear", "blurry", "reflective", "mixed", "Unknown")
CENTRE = ("yes", "no", "UNKNOWN")
REGIONS = ("left", "right", "center", "multi")


@dataclass
class RoboSurgFixture:
    root: Path
    frames: dict[str, int] = field(default_factory=dict)  # frames kept, per source split
    dropped: dict[str, int] = field(default_factory=dict)  # contradiction frames, per split
    rows: list[dict[str, str]] = field(default_factory=list)

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.csv"


def write(root: Path) -> RoboSurgFixture:
    """Six frames per site (3 train, 1 val, 2 test) plus one frame breaking the smoke rule.

    Answers cycle through every answer space; smoke = yes on every other frame, with a region.
    """
    fixture = RoboSurgFixture(root)
    n = 0
    for site in SITES:
        for split, count in FRAMES_PER_SPLIT.items():
            for _ in range(count):
                fixture.rows.append(_row(root, site, split, n, smoke=n % 2 == 0))
                n += 1
    # smoke = no but a smoke region: dropped by drop_smoke_region_contradiction.
    bad = _row(root, "site_a", "train", n, smoke=False)
    bad["q9_smoke_region"] = "left"
    fixture.rows.append(bad)
    with fixture.manifest.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(fixture.rows)
    native = {"train": "train", "val": "validate", "test": "test"}
    for split, count in FRAMES_PER_SPLIT.items():
        fixture.frames[native[split]] = count * len(SITES)
    fixture.dropped = {"train": 1}
    return fixture


def _row(root: Path, site: str, split: str, n: int, smoke: bool) -> dict[str, str]:
    frame_id = f"f{n:03d}"
    frame, mask = f"frames/{site}/{frame_id}.png", f"masks/{site}/{frame_id}.png"
    write_image(root / frame, seed=n)
    write_image(root / mask, seed=1000 + n)
    return {
        "site": site,
        "split": split,
        "id": frame_id,
        "frame": frame,
        "mask": mask,
        "q1_context": ("dissection", "suturing", "idle")[n % 3],
        "q2_anatomy": ("liver", "Gallbladder", "bowel", "other")[n % 4],
        "q3_view": VIEWS[n % len(VIEWS)],
        "q4_bleeding": ("yes", "no")[n % 3 == 0],
        "q4_smoke": "yes" if smoke else "no",
        "q4_occlusion": ("no", "Yes")[n % 5 == 0],
        "q5_quality": QUALITIES[n % len(QUALITIES)],
        "q6_glare": ("yes", "no")[n % 2],
        "q7_contrast": ("no", "yes")[n % 3 != 0],
        "q8_centre_occluded": CENTRE[n % len(CENTRE)],
        "q9_smoke_region": REGIONS[n % len(REGIONS)] if smoke else "none",
    }
