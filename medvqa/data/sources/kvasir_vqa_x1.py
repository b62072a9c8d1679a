"""Kvasir-VQA-x1 from its Hub snapshot (parquet) or a `datasets.save_to_disk` folder.

Layout under `root`:
- annotations in `annotation_dir` (default `Kvasir-VQA-x1/`), either the Hub snapshot's parquet
  files (`data/train-00000-of-00001.parquet`, `data/test-...parquet`; the split is the file
  name's prefix, several shards per split are read in name order) or a folder written by
  `DatasetDict.save_to_disk` (`dataset_dict.json` + `train/`, `test/`), read with
  `datasets.load_from_disk`; the folder wins when `dataset_dict.json` exists;
- images from Kvasir-VQA in `image_dir` (default `Kvasir-VQA/images/`) as `<img_id>.jpg`.

Columns: `img_id, complexity (1|2|3), question, answer, original (JSON list of the atomic QA
pairs), question_class (list of classes, e.g. polyp_type, instrument_presence)`. Rows carry no
id, so a record's id is `<split>/<position in the split>` (shards in name order).

All answers are free text and are open questions, except that with `yes_no_closed` (default) an
answer that is exactly yes or no (case and a final period ignored) becomes a closed question
with candidates [yes, no], so closed accuracy can score it. Metadata kept for shifts and
breakdowns: `complexity` (int), `question_class` (list[str]), `original` (the JSON string);
`question_type` is the classes joined with "|" in sorted order. There is no validate split: the
shifts carve validation from train by image, stratified by complexity and question class.

`eval_subset: medico_val` keeps, of the test split, only the MediaEval Medico challenge's public
validation subset: the rows `datasets.Dataset.shuffle(seed=42)` puts first, 1,500 of them, in
that order (the permutation is `np.random.default_rng(seed).permutation(n)` over the split's
native rows). Ids stay `test/<position in the split>`, so each row maps back to the release.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from medvqa.data import records as R
from medvqa.data.annotated import DEFAULT_ON_BAD_ROW, IDENTIFIER, TEXT, AnnotatedSource, BadRows
from medvqa.data.cleaning import CleaningLog
from medvqa.data.questions import YES_NO
from medvqa.errors import DataError

COMPLEXITIES = (1, 2, 3)
REQUIRED = ("img_id", "complexity", "question", "answer", "question_class")
SPLIT_NAMES = {"train": "train", "test": "test", "validate": "validate", "validation": "validate"}
DISK_MARKER = "dataset_dict.json"
METADATA = ("complexity", "question_class", "original")
# What each field read must hold (checked per row; a wrong type is a bad row). `complexity`
# and `question_class` are parsed (and checked) by `_complexity` and `class_list`.
FIELD_TYPES = {"img_id": IDENTIFIER, "question": TEXT, "answer": TEXT}
EVAL_SUBSETS = ("medico_val",)


def medico_val_positions(n_rows: int, size: int, seed: int) -> np.ndarray:
    """Positions of the test split's rows in the Medico public validation subset, in order:
    the first `size` of `Dataset.shuffle(seed)`'s permutation (numpy's PCG64 `default_rng`)."""
    return np.random.default_rng(seed).permutation(n_rows)[:size]


def class_list(value: Any) -> list[str] | None:
    """`question_class` as a list of strings (parquet gives numpy arrays); None if malformed."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                return None
        else:
            return [text] if text else None
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, list | tuple) or not value:
        return None
    classes = [str(v).strip() for v in value]
    return classes if all(classes) else None


def yes_no(answer: str) -> str | None:
    """'yes'/'no' if the answer is exactly that (case and a final period ignored), else None."""
    text = answer.strip().rstrip(".").strip().lower()
    return text if text in YES_NO else None


def _missing_as_none(value: Any) -> Any:
    """Parquet nulls arrive as NaN / pd.NA in pandas; the row checks expect None."""
    if isinstance(value, np.ndarray | list | tuple | dict):
        return value
    return None if pd.isna(value) else value


def _complexity(value: Any) -> int | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    if math.isnan(number) or not number.is_integer() or int(number) not in COMPLEXITIES:
        return None
    return int(number)


class KvasirVqaX1(AnnotatedSource):
    """Kvasir-VQA-x1 from `root` (see the module docstring for the layout and decisions)."""

    name = "kvasir_vqa_x1"
    loader_version = 1
    metadata_fields = METADATA
    field_types = FIELD_TYPES

    def __init__(
        self,
        root: str | Path,
        cache_dir: str | Path | None = None,
        on_bad_row: str = DEFAULT_ON_BAD_ROW,
        annotation_dir: str = "Kvasir-VQA-x1",
        image_dir: str = "Kvasir-VQA/images",
        yes_no_closed: bool = True,
        eval_subset: str | None = None,
        eval_subset_size: int = 1500,
        eval_subset_seed: int = 42,
    ) -> None:
        super().__init__(root, cache_dir, on_bad_row)
        if eval_subset is not None and eval_subset not in EVAL_SUBSETS:
            raise ValueError(
                f"dataset.eval_subset={eval_subset!r} is not one of {list(EVAL_SUBSETS)}; use "
                "null for the whole test split"
            )
        if eval_subset_size <= 0:
            raise ValueError(f"dataset.eval_subset_size must be positive, got {eval_subset_size}")
        self.annotation_dir = annotation_dir
        self.image_dir = image_dir
        self.yes_no_closed = yes_no_closed
        self.eval_subset = eval_subset
        self.eval_subset_size = eval_subset_size
        self.eval_subset_seed = eval_subset_seed

    # -- where the annotations are --------------------------------------------------------------

    @property
    def _dir(self) -> Path:
        return self.root / self.annotation_dir

    def _disk_splits(self) -> dict[str, Path]:
        """Split -> folder of a `save_to_disk` DatasetDict (empty if it is not one)."""
        marker = self._dir / DISK_MARKER
        if not marker.is_file():
            return {}
        try:
            names = json.loads(marker.read_text(encoding="utf-8"))["splits"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise DataError(
                f"{self.name}: {marker} is not a datasets DatasetDict index ({err!r}); write the "
                "folder again with DatasetDict.save_to_disk."
            ) from err
        return {str(n): self._dir / str(n) for n in names}

    def _parquet_splits(self) -> dict[str, list[Path]]:
        """Split -> parquet shards, from the file name prefix (`train-00000-of-00001.parquet`)."""
        shards: dict[str, list[Path]] = {}
        for path in sorted(self._dir.rglob("*.parquet")):
            prefix = path.name.split("-", 1)[0].removesuffix(".parquet")
            shards.setdefault(prefix, []).append(path)
        rank = {"train": 0, "validation": 1, "validate": 1, "test": 2}
        return dict(sorted(shards.items(), key=lambda kv: (rank.get(kv[0], 3), kv[0])))

    def _splits(self) -> dict[str, list[Path]]:
        """Native split name -> the files that hold it (parquet shards or a disk folder)."""
        disk = self._disk_splits()
        found: dict[str, list[Path]] = (
            {name: [folder] for name, folder in disk.items()} if disk else self._parquet_splits()
        )
        if not found:
            raise DataError(
                f"{self.name}: Kvasir-VQA-x1 annotations not found under {self._dir}: expected the "
                "Hub snapshot's data/<split>-*.parquet files or a datasets.save_to_disk folder "
                f"with {DISK_MARKER}; set dataset.root / dataset.annotation_dir."
            )
        unknown = [n for n in found if n not in SPLIT_NAMES]
        if unknown:
            raise DataError(
                f"{self.name}: split(s) {unknown} under {self._dir} ({found[unknown[0]][0]}) are "
                f"not one of {sorted(SPLIT_NAMES)}; rename the file(s) or folder(s)."
            )
        return found

    def annotation_files(self) -> list[Path]:
        files: list[Path] = []
        disk = self._disk_splits()
        if disk:
            files.append(self._dir / DISK_MARKER)
            for folder in disk.values():
                files.extend(sorted(p for p in folder.rglob("*") if p.is_file()))
            return files
        for shards in self._splits().values():
            files.extend(shards)
        return files

    # -- reading -----------------------------------------------------------------------------

    def _read(self, split: str, paths: list[Path]) -> list[tuple[str, pd.DataFrame]]:
        """(file, frame) per shard of one split."""
        out = []
        for path in paths:
            if path.is_dir():
                from datasets import load_from_disk

                if not (path / "state.json").is_file():
                    raise DataError(
                        f"{self.name}: split folder {path} (listed in {DISK_MARKER}) has no "
                        "state.json; write the folder again with DatasetDict.save_to_disk."
                    )
                frame = load_from_disk(str(path)).to_pandas()
            else:
                try:
                    frame = pd.read_parquet(path)
                except Exception as err:  # pyarrow raises several types for a broken file
                    raise DataError(
                        f"{self.name}: cannot read {path} as parquet ({err}); download the "
                        "file again."
                    ) from err
            missing = [c for c in REQUIRED if c not in frame.columns]
            if missing:
                raise DataError(
                    f"{self.name}: {path} lacks column(s) {missing} of the {split} split; "
                    f"expected {list(REQUIRED)} (+ original)."
                )
            out.append((str(path), frame))
        return out

    def _native(self, bad: BadRows) -> pd.DataFrame:
        rows = []
        for native_split, paths in self._splits().items():
            split = SPLIT_NAMES[native_split]
            position = 0
            split_rows: dict[int, dict[str, Any]] = {}  # native position -> kept row
            for path, frame in self._read(native_split, paths):
                native = [
                    {k: _missing_as_none(v) for k, v in record.items()}
                    for record in frame.to_dict("records")
                ]
                # Ids count rows over the split's shards, bad rows included.
                offset, position = position, position + len(native)
                for i, where, row in self.valid_rows(native, Path(path), bad, REQUIRED):
                    index = offset + i
                    complexity = _complexity(row["complexity"])
                    if complexity is None:
                        bad(
                            "malformed",
                            where,
                            f"field 'complexity' is {row['complexity']!r}; expected 1, 2 or 3",
                        )
                        continue
                    classes = class_list(row["question_class"])
                    if classes is None:
                        bad(
                            "malformed",
                            where,
                            f"field 'question_class' is {row['question_class']!r}; expected a "
                            "non-empty list of class names",
                        )
                        continue
                    img_id = str(row["img_id"]).strip()
                    ref = self.image_ref(f"{self.image_dir}/{img_id}.jpg", where, bad)
                    if ref is None:
                        continue
                    original = row.get("original")
                    split_rows[index] = {
                        R.ID: f"{split}/{index}",
                        R.IMAGE: ref,
                        R.IMAGE_ID: img_id,
                        R.QUESTION: str(row["question"]).strip(),
                        R.ANSWER: str(row["answer"]).strip(),
                        "complexity": complexity,
                        "question_class": classes,
                        "original": None if original is None else str(original),
                        R.SOURCE_SPLIT: split,
                    }
            if split == "test" and self.eval_subset is not None:
                order = self._subset_order(position, paths)
                rows.extend(split_rows[i] for i in order if i in split_rows)
            else:
                rows.extend(split_rows.values())
        columns = [R.ID, R.IMAGE, R.IMAGE_ID, R.QUESTION, R.ANSWER, *METADATA, R.SOURCE_SPLIT]
        return pd.DataFrame(rows, columns=columns)

    def _subset_order(self, n_rows: int, paths: list[Path]) -> np.ndarray:
        """Native positions of the `eval_subset` rows of the test split, in subset order."""
        if self.eval_subset_size > n_rows:
            raise DataError(
                f"{self.name}: dataset.eval_subset={self.eval_subset} takes "
                f"{self.eval_subset_size} rows but the test split ({paths[0]}) has {n_rows}; "
                "set dataset.eval_subset_size, or use the full release."
            )
        return medico_val_positions(n_rows, self.eval_subset_size, self.eval_subset_seed)

    def build(self, bad: BadRows, cleaning: CleaningLog) -> pd.DataFrame:
        native = self._native(bad)
        binary = (
            native[R.ANSWER].map(yes_no)
            if self.yes_no_closed
            else pd.Series(None, index=native.index, dtype=object)
        )
        closed = binary.notna()
        return pd.DataFrame(
            {
                R.ID: native[R.ID],
                R.IMAGE: native[R.IMAGE],
                R.QUESTION: native[R.QUESTION],
                R.ANSWER: binary.where(closed, native[R.ANSWER]),
                R.ANSWER_TYPE: closed.map({True: "closed", False: "open"}),
                R.QUESTION_TYPE: native["question_class"].map(lambda c: "|".join(sorted(c))),
                R.CANDIDATES: [list(YES_NO) if c else None for c in closed],
                R.CASE_ID: native[R.IMAGE_ID],
                R.IMAGE_ID: native[R.IMAGE_ID],
                R.SOURCE_SPLIT: native[R.SOURCE_SPLIT],
                **{k: native[k] for k in METADATA},
            }
        )
