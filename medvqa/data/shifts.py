"""Distribution shifts as data: one pure function turns (table, shift) into the four splits.

A shift names a metadata `field` and which of its values are out-of-distribution (OoD): a list
of OoD values, a list of i.i.d. values (everything else is OoD), or numeric thresholds with a gap
(i.i.d. if value >= `iid_min`, OoD if value < `ood_max`, rows in between are excluded). The
dataset's own splits are kept: i.i.d. train from its train split, i.i.d. validation from its
validate split (or carved from train by image when it has none), i.i.d./OoD test from its test
split. `merge_train_ood` moves OoD rows of the train split into the OoD test set, which is how
SURE-VQA builds image-level shifts such as SLAKE modality -> X-ray.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from medvqa.data import records as R
from medvqa.data.base import DataError

SPLITS: tuple[str, ...] = ("train", "val", "test_iid", "test_ood")


@dataclass(frozen=True)
class Shift:
    """A shift definition (the `shift=` config group without Hydra around it)."""

    name: str
    field: str
    ood_values: Sequence[Any] | None = None
    iid_values: Sequence[Any] | None = None
    iid_min: float | None = None
    ood_max: float | None = None
    exclude_values: Sequence[Any] = ()
    merge_train_ood: bool = False
    val_fraction: float = 0.1
    val_group: str = R.IMAGE_ID

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> Shift:
        return cls(
            **{
                k: (list(v) if isinstance(v, Sequence) and not isinstance(v, str) else v)
                for k, v in dict(cfg).items()
            }
        )

    def __post_init__(self) -> None:
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


def label_rows(table: pd.DataFrame, shift: Shift) -> pd.Series:
    """Label every row 'iid', 'ood' or 'excluded' (gap or excluded value) under `shift`."""
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
    return label


def _carve_validation(
    train: pd.DataFrame, shift: Shift, seed: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split i.i.d. train into train/val by group (image), so no image straddles the two."""
    groups = np.array(sorted(train[shift.val_group].astype(str).unique()))
    rng = np.random.default_rng(seed)
    n_val = max(1, round(len(groups) * shift.val_fraction))
    val_groups = set(rng.choice(groups, size=min(n_val, len(groups)), replace=False).tolist())
    is_val = train[shift.val_group].astype(str).isin(val_groups)
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
    label = label_rows(table, shift)
    src = table[R.SOURCE_SPLIT]
    iid, ood = label == "iid", label == "ood"

    train = table.loc[(src == "train") & iid]
    if (src == "validate").any():
        val = table.loc[(src == "validate") & iid]
    else:
        train, val = _carve_validation(train, shift, seed)
    test_iid = table.loc[(src == "test") & iid]
    ood_parts = [table.loc[(src == "test") & ood]]
    if shift.merge_train_ood:
        ood_parts.append(table.loc[(src == "train") & ood])
    test_ood = pd.concat(ood_parts)

    frames = {"train": train, "val": val, "test_iid": test_iid, "test_ood": test_ood}
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
        "ood_in_train_not_merged": 0
        if shift.merge_train_ood
        else int(((src == "train") & ood).sum()),
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
