"""Distribution shifts as data: one pure function turns (table, shift) into the four splits.

A shift names a metadata `field` and which of its values are out-of-distribution (OoD): a list
of OoD values, a list of i.i.d. values (everything else is OoD), or numeric thresholds with a gap
(i.i.d. if value >= `iid_min`, OoD if value < `ood_max`, rows in between are excluded). The
dataset's own splits are kept: i.i.d. train from its train split, i.i.d. validation from its
validate split (or carved from train by image when it has none), i.i.d./OoD test from its test
split. `merge_train_ood` moves OoD rows of the train split into the OoD test set, which is how
SURE-VQA builds image-level shifts such as SLAKE modality -> X-ray.

Two more kinds are data too: `any_of` (a list of such definitions; a row is OoD if any of them
says so, e.g. OVQA's multimodal shift "LEG images or Organ System questions"), and `transform`
(no field: the OoD test is the i.i.d. test with an image transform such as a corruption applied
per sample; `transformed: iid` flips it, so training sees transformed images and the OoD test
is the original).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from medvqa.data import records as R
from medvqa.data.transforms import (
    CORRUPTION_LEVELS,
    TRANSFORMS,
    apply_transform,
    transformed_identity,
)
from medvqa.errors import DataError

if TYPE_CHECKING:
    from PIL import Image

    from medvqa.data.base import VQASource

SPLITS: tuple[str, ...] = (R.TRAIN, R.VAL, R.TEST_IID, R.TEST_OOD)
# The splits' report in a run directory (`medvqa.tasks.common.prepare_splits` writes it: sizes,
# cleaning, leakage audit, each split's row ids).
SPLITS_FILE = "splits.json"
# Set by transform shifts: how a row's image is altered when loaded (None: as stored).
IMAGE_TRANSFORM = "image_transform"


def seen_image(source: VQASource, row: Mapping[str, Any]) -> Image.Image:
    """The image of `row` as a model is shown it: its file, with its transform shift's
    corruption or augment where the row carries one (`IMAGE_TRANSFORM`). Training, generation
    and the row explorer all go through here, so what the explorer shows is what was seen."""
    image = source.load_image(row[R.IMAGE], row[R.ID])
    spec = row.get(IMAGE_TRANSFORM)
    if isinstance(spec, str):
        image = apply_transform(image, spec, str(row[R.ID]), str(row[R.IMAGE_ID]))
    return image


def seen_key(row: Mapping[str, Any]) -> str:
    """Which pixels `seen_image` gives `row`, from its metadata (no pixels read): rows with
    one key see the same pixels (the image file and what its transform draws from)."""
    spec = row.get(IMAGE_TRANSFORM)
    drawn = ""
    if isinstance(spec, str):
        drawn = transformed_identity(spec, str(row[R.ID]), str(row[R.IMAGE_ID]))
    return f"{row[R.IMAGE]}\0{drawn}"


@dataclass(frozen=True)
class Shift:
    """A shift definition (the `shift=` config group without Hydra around it)."""

    name: str
    field: str | None = None
    ood_values: Sequence[Any] | None = None
    iid_values: Sequence[Any] | None = None
    iid_min: float | None = None
    ood_max: float | None = None
    exclude_values: Sequence[Any] = ()
    merge_train_ood: bool = False
    val_fraction: float = 0.1
    val_group: str = R.IMAGE_ID
    val_stratify: Sequence[str] = ()
    any_of: Sequence[Mapping[str, Any]] | None = None
    transform: Mapping[str, Any] | None = None
    transformed: str = "ood"

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> Shift:
        return cls(
            **{
                k: (list(v) if isinstance(v, Sequence) and not isinstance(v, str) else v)
                for k, v in dict(cfg).items()
            }
        )

    def parts(self) -> list[Shift]:
        """The `any_of` definitions as shifts of their own."""
        return [
            Shift.from_config({"name": f"{self.name}[{i}]", **dict(part)})
            for i, part in enumerate(self.any_of or ())
        ]

    def __post_init__(self) -> None:
        if self.transformed not in ("ood", "iid"):
            raise ValueError(f"shift {self.name!r}: transformed must be 'ood' or 'iid'.")
        if self.transform is not None:
            if self.transform.get("name") not in TRANSFORMS:
                raise ValueError(
                    f"shift {self.name!r}: transform.name must be one of {TRANSFORMS}, got "
                    f"{self.transform.get('name')!r}."
                )
            level = self.transform.get("strength")
            if self.transform["name"] == "corruption" and level not in CORRUPTION_LEVELS:
                raise ValueError(
                    f"shift {self.name!r}: transform.strength must be one of "
                    f"{list(CORRUPTION_LEVELS)}, got {level!r}."
                )
            if self.field is not None or self.any_of:
                raise ValueError(
                    f"shift {self.name!r}: a transform shift has no field/any_of: its OoD test "
                    "is the transformed i.i.d. test."
                )
            return
        if self.any_of:
            if self.field is not None:
                raise ValueError(f"shift {self.name!r}: set either field or any_of, not both.")
            self.parts()  # validates every part
            return
        if self.field is None:
            raise ValueError(f"shift {self.name!r}: set field (or any_of, or transform).")
        modes = [
            self.ood_values is not None,
            self.iid_values is not None,
            self.iid_min is not None or self.ood_max is not None,
        ]
        if sum(modes) != 1:
            raise ValueError(
                f"shift {self.name!r}: set exactly one of ood_values, iid_values or the "
                "thresholds iid_min/ood_max."
            )
        if modes[2] and (self.iid_min is None or self.ood_max is None):
            raise ValueError(f"shift {self.name!r}: thresholds need both iid_min and ood_max.")
        if modes[2] and self.ood_max > self.iid_min:  # type: ignore[operator]
            raise ValueError(
                f"shift {self.name!r}: ood_max ({self.ood_max}) must be <= iid_min "
                f"({self.iid_min}); the values in between form the excluded gap."
            )
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"shift {self.name!r}: val_fraction must be in (0, 1).")


@dataclass
class Splits:
    """The four splits plus what was dropped on the way (for the splits report)."""

    frames: dict[str, pd.DataFrame]
    source_counts: dict[str, int]
    dropped: dict[str, int] = field(default_factory=dict)

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.frames[name]

    def report(self) -> dict[str, Any]:
        """The `splits.json` record: source sizes after cleaning and per-split counts."""
        return {
            "source": dict(self.source_counts),
            "splits": {
                name: {
                    "n": len(df),
                    "open": int((df[R.ANSWER_TYPE] == "open").sum()),
                    "closed": int((df[R.ANSWER_TYPE] == "closed").sum()),
                }
                for name, df in self.frames.items()
            },
            "dropped": dict(self.dropped),
        }


def _label_field(table: pd.DataFrame, shift: Shift) -> pd.Series:
    """Label rows by one field: 'iid', 'ood' or 'excluded' (gap or excluded value)."""
    if shift.field not in table.columns:
        raise DataError(
            f"shift {shift.name!r}: field {shift.field!r} is not a column of the dataset; "
            f"available fields: {[*R.metadata_columns(table), R.QUESTION_TYPE, R.ANSWER_TYPE]}."
        )
    values = table[shift.field]
    label = pd.Series("iid", index=table.index, dtype=object)
    if shift.ood_values is not None or shift.iid_values is not None:
        listed = list(shift.ood_values if shift.ood_values is not None else shift.iid_values)
        present = set(values.dropna().unique().tolist())
        unknown = [v for v in listed if v not in present]
        if unknown:
            raise DataError(
                f"shift {shift.name!r}: value(s) {unknown} of field {shift.field!r} do not occur "
                f"in the data; values that exist: {sorted(map(str, present))}. Fix the shift's "
                "ood_values/iid_values."
            )
        hit = values.isin(listed)
        label[hit if shift.ood_values is not None else ~hit] = "ood"
    else:
        numeric = pd.to_numeric(values, errors="coerce")
        label[numeric < shift.ood_max] = "ood"
        label[(numeric >= shift.ood_max) & (numeric < shift.iid_min)] = "excluded"
        label[numeric.isna()] = "excluded"
    if shift.exclude_values:
        label[values.isin(list(shift.exclude_values))] = "excluded"
    # A row without a value (e.g. a patient with no demographics) is on neither side.
    label[values.isna()] = "excluded"
    return label


def label_rows(table: pd.DataFrame, shift: Shift) -> tuple[pd.Series, pd.Series]:
    """Label every row 'iid', 'ood' or 'excluded', and say which OoD train rows to merge.

    With `any_of`, a row is OoD if any part calls it OoD, excluded if a part excludes it and
    none calls it OoD; a train row is merged into the OoD test if a part that calls it OoD
    merges. A transform shift labels everything i.i.d. (the OoD copy is made later).
    """
    if shift.transform is not None:
        iid = pd.Series("iid", index=table.index, dtype=object)
        return iid, pd.Series(False, index=table.index)
    if not shift.any_of:
        label = _label_field(table, shift)
        return label, (label == "ood") & shift.merge_train_ood
    label = pd.Series("iid", index=table.index, dtype=object)
    merge = pd.Series(False, index=table.index)
    for part in shift.parts():
        part_label = _label_field(table, part)
        label[(part_label == "excluded") & (label == "iid")] = "excluded"
        label[part_label == "ood"] = "ood"
        merge |= (part_label == "ood") & part.merge_train_ood
    return label, merge


def transform_spec(transform: Mapping[str, Any]) -> str:
    """The per-row `image_transform` value: 'name:level:seed' (see `medvqa.data.transforms`)."""
    level = transform.get("strength", transform.get("variants", ""))
    return f"{transform['name']}:{level}:{int(transform.get('seed', 0))}"


def _stratum(frame: pd.DataFrame, columns: Sequence[str]) -> pd.Series:
    """One hashable stratum label per row (list cells, e.g. question classes, are joined)."""
    parts = [
        frame[c].map(lambda v: "|".join(sorted(map(str, v))) if isinstance(v, list) else str(v))
        for c in columns
    ]
    out = parts[0]
    for p in parts[1:]:
        out = out + "/" + p
    return out


def _carve_validation(
    train: pd.DataFrame, shift: Shift, seed: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split i.i.d. train into train/val by group (image), so no group straddles the two.

    With `val_stratify`, groups are drawn per stratum (a group's stratum is that of its first
    row), so validation keeps e.g. Kvasir's complexity levels and question classes in proportion.
    """
    group = train[shift.val_group].astype(str)
    if group.empty:
        return train, train
    if shift.val_stratify:
        strata = _stratum(train, shift.val_stratify).groupby(group).first()
    else:
        strata = pd.Series("all", index=sorted(group.unique()))
    rng = np.random.default_rng(seed)
    val_groups: set[str] = set()
    for _, members in sorted(strata.groupby(strata), key=lambda kv: kv[0]):
        groups = np.array(sorted(members.index))
        n_val = max(1, round(len(groups) * shift.val_fraction)) if len(groups) > 1 else 0
        val_groups |= set(rng.choice(groups, size=n_val, replace=False).tolist())
    if not val_groups:  # a single group per stratum: take one group overall
        val_groups = {sorted(group.unique())[0]}
    is_val = group.isin(val_groups)
    return train.loc[~is_val], train.loc[is_val]


def make_splits(table: pd.DataFrame, shift: Shift, seed: int = 0) -> Splits:
    """Turn a normalised table and a shift into i.i.d. train/val/test and OoD test.

    Pure: the table is not modified and the result depends only on (table, shift, seed).
    """
    source_counts = {
        s: int((table[R.SOURCE_SPLIT] == s).sum())
        for s in R.SOURCE_SPLITS
        if (table[R.SOURCE_SPLIT] == s).any()
    }
    label, merge = label_rows(table, shift)
    src = table[R.SOURCE_SPLIT]
    iid, ood = label == "iid", label == "ood"

    train = table.loc[(src == "train") & iid]
    if (src == "validate").any():
        val = table.loc[(src == "validate") & iid]
    else:
        train, val = _carve_validation(train, shift, seed)
    test_iid = table.loc[(src == "test") & iid]
    test_ood = pd.concat([table.loc[(src == "test") & ood], table.loc[(src == "train") & merge]])

    frames = {"train": train, "val": val, "test_iid": test_iid, "test_ood": test_ood}
    if shift.transform is not None:
        spec = transform_spec(shift.transform)
        side = ("train", "val", "test_iid") if shift.transformed == "iid" else ("test_ood",)
        frames["test_ood"] = test_iid
        frames = {
            k: v.assign(**{IMAGE_TRANSFORM: spec if k in side else None}) for k, v in frames.items()
        }
    for name, df in frames.items():
        if df.empty:
            raise DataError(
                f"shift {shift.name!r} leaves split {name!r} empty (source splits: "
                f"{source_counts}; OoD rows: {int(ood.sum())}, i.i.d. rows: {int(iid.sum())}). "
                "Choose other OoD values/thresholds, set merge_train_ood, or use a larger dataset."
            )
    dropped = {
        "excluded_by_shift": int((label == "excluded").sum()),
        "ood_in_validate": int(((src == "validate") & ood).sum()),
        "ood_in_train_not_merged": int(((src == "train") & ood & ~merge).sum()),
    }
    return Splits(
        frames={k: v.reset_index(drop=True) for k, v in frames.items()},
        source_counts=source_counts,
        dropped=dropped,
    )


def limit_splits(splits: Splits, limits: Mapping[str, int | None], seed: int) -> Splits:
    """Subsample each split to at most `limits[name]` rows (debug runs), reproducibly."""
    frames = {}
    for name, df in splits.frames.items():
        n = limits.get(name)
        frames[name] = (
            df.sample(n=n, random_state=seed).reset_index(drop=True)
            if n is not None and len(df) > n
            else df
        )
    return Splits(frames=frames, source_counts=splits.source_counts, dropped=splits.dropped)
