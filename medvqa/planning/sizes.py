"""A job's rows per split before anything is loaded: from a run's `splits.json`, else the
published sizes of SURE-VQA's shifts (`known_sizes`), for the plan's GPU-hours."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.utils import get_class
from omegaconf import DictConfig

from medvqa.data.shifts import SPLITS, SPLITS_FILE
from medvqa.untrusted import read_plain_json

# SURE-VQA's shifts after cleaning: dataset, train / test i.i.d. / test OoD rows as published
# (docs/shifts.md#the-papers-shifts; SLAKE's checked on the real files, tests/test_real_data.py).
SHIFT_SIZES = {
    "slake_modality": ("slake", 3448, 689, 1779),
    "slake_question_type": ("slake", 4581, 994, 56),
    "ovqa_body_part": ("ovqa", 8755, 1044, 5350),
    "ovqa_question_type": ("ovqa", 11924, 1420, 237),
    "mimic_gender": ("mimic_cxr_vqa", 147790, 7277, 6120),
    "mimic_ethnicity": ("mimic_cxr_vqa", 171593, 8101, 3713),
    "mimic_age": ("mimic_cxr_vqa", 155941, 6686, 2076),
}
# The datasets' own splits after cleaning, train / validate / test (docs/datasets.md).
SOURCE_SIZES = {
    "slake": (4866, 1043, 1050),
    "ovqa": (13492, 1645, 1657),
    "mimic_cxr_vqa": (290031, 73567, 13793),
}


@dataclass(frozen=True)
class Sizes:
    """Rows per split of a job (before `data.limit`), and where they come from."""

    train: int
    val: int
    test_iid: int
    test_ood: int
    source: str

    def split(self, name: str) -> int:
        return int(getattr(self, name))


def dataset_name(cfg: DictConfig) -> str:
    return str(get_class(str(cfg.dataset._target_)).name)


def known_sizes(cfg: DictConfig, splits: str | Path | None = None) -> Sizes | str:
    """The job's rows per split without loading data: from a run's `splits.json` (`splits`: the
    file, or a folder searched for one of the same dataset and shift), else SURE-VQA's published
    counts with the val split estimated (its rows are not published: the dataset's validate rows
    x the share of its train rows the shift keeps). A string says why there are none."""
    dataset, shift = dataset_name(cfg), str(cfg.shift.name)
    if splits is not None:
        found = _splits_report(Path(splits), dataset, shift)
        if found is not None:
            path, report = found
            n = {name: int(v["n"]) for name, v in report["splits"].items()}
            return Sizes(*(n[s] for s in SPLITS), str(path))
    if shift in SHIFT_SIZES and SHIFT_SIZES[shift][0] == dataset:
        _, train, iid, ood = SHIFT_SIZES[shift]
        source_train, validate, _ = SOURCE_SIZES[dataset]
        val = round(validate * train / source_train)
        return Sizes(train, val, iid, ood, "published (docs/shifts.md); val estimated")
    where = f" under {splits}" if splits is not None else ""
    return (
        f"the rows of {dataset} under shift {shift} are not documented and no splits.json of "
        f"them was found{where}: give a run's: +task.splits=<run dir or splits.json>"
    )


def _splits_report(path: Path, dataset: str, shift: str) -> tuple[Path, dict[str, Any]] | None:
    candidates = [path] if path.is_file() else sorted(path.rglob(SPLITS_FILE))
    for candidate in candidates:
        # A run folder's file: plain values, refused by name if it names code (untrusted).
        report = read_plain_json(candidate, SPLITS_FILE, "give another run's splits.json").value
        if (
            isinstance(report, dict)
            and report.get("dataset") == dataset
            and report.get("shift") == shift
        ):
            return candidate, report
    return None


def capped(n: int, cap: Any) -> int:
    """A split's rows under `data.limit.<split>`."""
    return n if cap is None else min(n, int(cap))
