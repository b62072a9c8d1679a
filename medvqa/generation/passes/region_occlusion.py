"""The questions about a region asked again with it hidden, and with an equal area elsewhere
hidden (`passes.region_occlusion`: `true`, or `{fill: mean|black}`; off by default).

Rows whose dataset knows the region their question concerns (`medvqa.data.regions`: the
synthetic findings with `dataset.regions=true`, RoboSurg-VQA's masks, SLAKE's organ boxes) are
answered twice more: with that region filled (`occluded_region/...`) and with the same shape
moved away from it, by an offset drawn from the job's seed and the row's id, filled the same
way (`occluded_elsewhere/...`). Region occlusion's input (docs/metrics.md#region-occlusion).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pandas as pd
from PIL import Image

from medvqa.data import records as R
from medvqa.data.base import VQASource
from medvqa.data.regions import FILLS, REGION, elsewhere, has_region, occlude, region_mask
from medvqa.data.transforms import rng_for
from medvqa.generation.passes.base import EvalPass, Job
from medvqa.untrusted import config_get

log = logging.getLogger(__name__)

# What each pass hides: the row's region, or an equal area away from it.
WHERE = ("region", "elsewhere")
_SETTINGS = ("fill",)


@dataclass(frozen=True, kw_only=True)
class RegionOcclusion(EvalPass):
    name = "region_occlusion"
    setting = "passes.region_occlusion"
    sequence = 40
    row_kind = "extra region"
    transforms_image = True
    suffixes: ClassVar[dict[str, str]] = {
        "region": "region occluded",
        "elsewhere": "equal area elsewhere occluded",
    }

    where: str  # WHERE
    fill: str = FILLS[0]
    seed: int = 0  # the job's: with the row's id, where the equal area goes

    @classmethod
    def of_job(cls, job: Job) -> list[EvalPass]:
        asked = _asked(job.setting(cls.setting))
        if not isinstance(asked, dict):
            if isinstance(asked, str):
                raise ValueError(asked)
            return []
        seed = int(job.setting("seed") or 0)
        return [
            cls.after(job.label, image_mode=job.eval_image, where=w, seed=seed, **asked)
            for w in WHERE
        ]

    @classmethod
    def problems(cls, config: Any) -> list[str]:
        asked = _asked(config_get(config, cls.setting))
        return [asked] if isinstance(asked, str) else []

    @classmethod
    def check(
        cls, passes: Sequence[EvalPass], frames: Mapping[str, pd.DataFrame], job: Job
    ) -> None:
        """Log how many rows of each evaluated split have a region; refuse a job where none
        has one (nothing would be generated, every figure NaN)."""
        super().check(passes, frames, job)
        counts = {split: int(has_region(frame).sum()) for split, frame in frames.items()}
        log.info(
            "region occlusion: rows with a region: %s",
            ", ".join(f"{s} {n} of {len(frames[s])}" for s, n in counts.items()),
        )
        if not any(counts.values()):
            raise ValueError(
                f"{cls.setting}: no evaluated row has a region (a `{REGION}` its dataset "
                "gives: dataset=synthetic with dataset.regions=true, robosurg_vqa's masks, "
                "slake's detection.json); turn the pass off or use such a dataset"
            )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.where not in WHERE or self.fill not in FILLS:
            raise ValueError(f"{self!r}: where is one of {WHERE}, fill one of {FILLS}")

    @property
    def key(self) -> str:
        return f"occluded_{self.where}"

    @property
    def suffix(self) -> str:
        return self.suffixes[self.where]

    def rows(self, frame: pd.DataFrame) -> pd.DataFrame:
        return frame[has_region(frame)]

    def transform_image(self, image: Image.Image | None, row: pd.Series) -> Image.Image | None:
        raise TypeError(
            f"{self.label}: the region is read from the dataset's files; generate the pass "
            "through image_change(source)"
        )

    def image_key(self, key: str, row: pd.Series) -> str:
        placed = f"\0{self.seed}:{row[R.ID]}" if self.where == "elsewhere" else ""
        return f"{key}\0occluded {self.where} {self.fill}\0{row[REGION]}{placed}"

    def image_change(self, source: VQASource) -> Occlusion:
        return Occlusion(self, source)

    def planned(self, rows: int) -> tuple[str, float]:
        return f"{self.label}, the rows with a region (all rows at most)", rows


@dataclass(frozen=True)
class Occlusion:
    """A region-occlusion pass's change of each row's image, its region read from `source`:
    the region (or the equal area placed with `rng_for(seed, id)`) filled."""

    occluding: RegionOcclusion
    source: VQASource = field(repr=False)

    def transform_image(self, image: Image.Image | None, row: pd.Series) -> Image.Image | None:
        if image is None:
            return None
        mask = region_mask(self.source, row, image.size)
        if self.occluding.where == "elsewhere":
            mask = elsewhere(mask, rng_for(self.occluding.seed, str(row[R.ID])))
        return occlude(image, mask, self.occluding.fill)

    def image_key(self, key: str, row: pd.Series) -> str:
        return self.occluding.image_key(key, row)


def _asked(value: Any) -> dict[str, Any] | str | None:
    """`passes.region_occlusion` read: its settings (on), None (off) or why it is refused."""
    if value is None or value is False:
        return None
    if value is True:
        return {}
    if isinstance(value, Mapping) and set(value) <= set(_SETTINGS):
        settings = dict(value)
        if settings.get("fill", FILLS[0]) in FILLS:
            return settings
    return (
        f"{RegionOcclusion.setting}={value!r}: true (on), false (off) or {{fill: "
        f"{'|'.join(FILLS)}}}, e.g. +{RegionOcclusion.setting}=true"
    )
