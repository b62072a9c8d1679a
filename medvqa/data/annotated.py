"""Datasets read from annotation files in their native layout, cleaned, normalised and cached.

Every real adapter (SLAKE, OVQA, MIMIC-CXR-VQA, VQA-RAD, Kvasir-VQA-x1, RoboSurg-VQA, oncology
MCQ) subclasses `AnnotatedSource` and implements two things: which files define the data
(`annotation_files`) and how to turn them into the normalised table (`build`). This base does
the rest the same way for all of them:

- bad rows (malformed, path escaping the root, ...) go through `BadRows`: with
  `on_bad_row=error` the first one raises a `DataError` naming the file and row; with `skip`
  they are dropped and counted in the report;
- every native field a loader reads is declared with its type (`field_types`: TEXT,
  TEXT_OR_NUMBER, IDENTIFIER) and checked on each row as it is read, so a value of the wrong
  type (a modality 7, a location list) is a bad row of kind `wrong_type`, not a column of mixed
  types that pyarrow rejects at the end; the final table is checked once more before it is
  stored (`arrow_table`);
- the normalised table is cached under `<cache_dir>/tables/<name>/<key>/`, where the key hashes
  the annotation files' *content*, the loader version and the loader's parameters, so an edited
  annotation file or a changed cleaning rule never reuses a stale table;
- only annotation files are read: images are opened lazily when a sample is requested, so
  `task=splits` works with the annotation files alone.
"""

from __future__ import annotations

import json
import logging
import re
from abc import abstractmethod
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from medvqa import plugins
from medvqa.atomic import build_once, is_built
from medvqa.data import records as R
from medvqa.data.base import VQASource
from medvqa.data.cleaning import CleaningLog
from medvqa.data.regions import REGION, log_counts, region_counts
from medvqa.errors import DataError
from medvqa.hashing import Hasher, file_hash

log = logging.getLogger(__name__)

ON_BAD_ROW = ("error", "skip")
DEFAULT_ON_BAD_ROW = ON_BAD_ROW[0]  # every loader's `on_bad_row` default, and a run's
# How manifests name their splits -> the normalised source splits.
MANIFEST_SPLITS = {"train": "train", "val": "validate", "validate": "validate", "test": "test"}
_TABLE_FILE = "table.parquet"
_REPORT_FILE = "report.json"
_EXAMPLES_KEPT = 5


# What can be wrong with a row, as splits.json counts bad rows (one name per kind, every source).
BAD_ROW_KINDS = (
    "malformed",
    "wrong_type",
    "duplicate_id",
    "path_escape",
    "missing_image",
    "unreadable_image",
)


class BadRows:
    """Collects rows that cannot be used: raise at the first one, or count them and go on."""

    def __init__(self, source: str, policy: str) -> None:
        if policy not in ON_BAD_ROW:
            raise ValueError(f"{source}: on_bad_row must be one of {ON_BAD_ROW}, got {policy!r}")
        self.source = source
        self.policy = policy
        self.counts: Counter[str] = Counter()
        self.examples: list[str] = []

    def __call__(self, kind: str, where: str, reason: str) -> None:
        """Report one bad row; `where` names the file and row, `reason` what is wrong."""
        if kind not in BAD_ROW_KINDS:  # a source's own name would split one kind's count
            raise ValueError(f"bad row kind {kind!r} is not one of {BAD_ROW_KINDS}")
        message = f"{self.source}: {where}: {reason}"
        if self.policy == "error":
            raise DataError(
                f"{message}. Fix the row, or set dataset.on_bad_row=skip to drop such rows "
                "(they are counted in splits.json)."
            )
        self.counts[kind] += 1
        if len(self.examples) < _EXAMPLES_KEPT:
            self.examples.append(message)
        if self.counts.total() <= _EXAMPLES_KEPT:
            log.warning("skipping bad row: %s", message)

    def report(self) -> dict[str, Any]:
        return {
            "counts": dict(self.counts),
            "total": self.counts.total(),
            "examples": self.examples,
        }


class KeptOddities:
    """Rows the release really contains that look odd but are kept as the papers kept them
    (an empty answer, an integer answer): counted in splits.json, never dropped.

    Each oddity may name its record (the table's `id`), so the report can say in which source
    split the kept rows landed and how many sat in rows a later cleaning step dropped.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self.counts: Counter[str] = Counter()
        self.examples: list[str] = []
        self.records: dict[str, list[str]] = {}

    def __call__(self, kind: str, where: str, record: str | None = None) -> None:
        self.counts[kind] += 1
        if record is not None:
            self.records.setdefault(kind, []).append(record)
        if len(self.examples) < _EXAMPLES_KEPT:
            self.examples.append(f"{where}: {kind}")
        if self.counts[kind] == 1:
            log.info("%s: kept %s (%s); counted in splits.json", self.source, kind, where)

    def report(self, table: pd.DataFrame | None = None) -> dict[str, Any]:
        """Counts and examples; with the final table, where each kind's records ended up."""
        out: dict[str, Any] = {"counts": dict(self.counts), "examples": self.examples}
        if table is not None and self.records:
            split_of = dict(zip(table[R.ID], table[R.SOURCE_SPLIT], strict=True))
            out["by_split"] = {
                kind: dict(Counter(split_of.get(r, "in_dropped_rows") for r in records))
                for kind, records in self.records.items()
            }
        return out


# Whitespace inside a value that a clean label would not have: a tab or newline, or a run of
# two or more blanks ("Transverse  Plane").
_INNER_WHITESPACE = re.compile(r"\s{2,}|[^\S ]")


def answer_text(value: Any) -> str:
    """A release's answer as text. Counts stored as JSON numbers become their digits
    (3 and 3.0 -> "3"); other values are given back as written (no stripping)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return value if isinstance(value, str) else str(value)


def safe_relative(ref: str) -> bool:
    """True if an image reference stays inside the dataset root (checked without any I/O)."""
    path = PurePosixPath(str(ref).replace("\\", "/"))
    if path.is_absolute() or not path.parts:
        return False
    depth = 0
    for part in path.parts:
        depth += -1 if part == ".." else (0 if part == "." else 1)
        if depth < 0:
            return False
    return True


def read_json_rows(path: Path, source: str) -> list[dict[str, Any]]:
    """A JSON file holding a list of row objects (the SLAKE/OVQA/MIMIC/VQA-RAD layout)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataError(
            f"{source}: {path} is not valid JSON ({err}); re-extract the annotation file."
        ) from err
    if not isinstance(data, list):
        raise DataError(f"{source}: {path} should hold a JSON list of rows, got {type(data)}.")
    return data


def is_missing(value: Any) -> bool:
    """None, NA or NaN: a cell that pandas or parquet left empty."""
    return value is None or value is pd.NA or (isinstance(value, float) and value != value)


@dataclass(frozen=True)
class FieldType:
    """The type a native field must hold; `expected` is how error messages name it."""

    expected: str
    accepts: Callable[[Any], bool]

    def __call__(self, value: Any) -> bool:
        return self.accepts(value)


def _is_number(value: Any) -> bool:
    # A JSON true/false is an int to Python, but never a count, a label or an id.
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
    )


# Labels and metadata (modality, organ, question type): text only, so a shift compares like
# with like. Questions and answers: releases store counts as JSON numbers (kept as their text).
# Ids: the releases use integers or strings.
TEXT = FieldType("a string", lambda v: isinstance(v, str))
TEXT_OR_NUMBER = FieldType(
    "a string or a number (read as its text)", lambda v: isinstance(v, str) or _is_number(v)
)
IDENTIFIER = FieldType(
    "a string or an integer",
    lambda v: isinstance(v, str) or (_is_number(v) and float(v).is_integer()),
)


def describe(value: Any) -> str:
    """What kind of value a cell holds, in the words of a JSON file."""
    if isinstance(value, bool | np.bool_):
        return "a boolean"
    if _is_number(value):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple | np.ndarray):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    return f"a {type(value).__name__}"


def shown(value: Any, width: int = 60) -> str:
    """A value's repr, cut short for a message."""
    text = repr(value.tolist() if isinstance(value, np.ndarray) else value)
    return text if len(text) <= width else f"{text[: width - 3]}..."


def _unstorable_column(table: pd.DataFrame, source: str, err: Exception) -> str:
    """Which column (and which record in it) keeps the table from being stored as Arrow."""
    for column in table.columns:
        try:
            pa.array(table[column], from_pandas=True)
        except pa.ArrowException:
            break
    else:
        return (
            f"{source}: the normalised table cannot be stored ({err}); this is a loader bug: "
            "report it with the dataset's name."
        )
    kinds = [None if is_missing(v) else describe(v) for v in table[column]]
    common = Counter(k for k in kinds if k).most_common(1)
    odd = next((i for i, k in enumerate(kinds) if k and common and k != common[0][0]), None)
    if odd is None:
        where = f"its values cannot be stored together ({err})"
    else:
        value = table[column].iloc[odd]
        where = (
            f"record {table[R.ID].iloc[odd]!r} holds {shown(value)} ({kinds[odd]}) where the "
            f"other rows hold {common[0][0]}"
        )
    return (
        f"{source}: column {column!r} of the normalised table mixes kinds of value: {where}. "
        "Fix that row in the annotation files; the loader should have reported it as a bad "
        f"row: declare {column!r} in its `field_types`."
    )


def arrow_table(table: pd.DataFrame, source: str) -> pa.Table:
    """The normalised table as Arrow (what the cache stores). A column that mixes kinds of
    value is a DataError naming the dataset, the column and a record, never pyarrow's bare
    ArrowInvalid; checked whether or not a cache is used, so a run fails the same either way."""
    try:
        return pa.Table.from_pandas(table, preserve_index=False)
    except pa.ArrowException as err:
        raise DataError(_unstorable_column(table, source, err)) from err


def read_manifest(path: Path, source: str) -> list[dict[str, Any]]:
    """Rows of a CSV, JSONL or parquet manifest (chosen by suffix), as dicts.

    CSV cells are read as text with no NA guessing, so answers such as 'none' stay strings and
    an empty cell is a missing field. A JSONL line that is not an object is kept as-is for the
    caller to report as a bad row (with its row number).
    """
    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            frame = pd.read_csv(path, dtype=str, keep_default_na=False)
            return frame.to_dict("records")
        if suffix == ".parquet":
            frame = pd.read_parquet(path)
            return [
                {k: (None if is_missing(v) else v) for k, v in row.items()}
                for row in frame.to_dict("records")
            ]
        if suffix == ".jsonl":
            rows: list[Any] = []
            for line in path.read_text(encoding="utf-8").splitlines():
                if not line.strip():  # blank lines are not rows (row numbers skip them)
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise DataError(
                        f"{source}: {path} row {len(rows)} is not valid JSON ({err}); fix the line."
                    ) from err
            return rows
    except DataError:
        raise
    except (pd.errors.ParserError, UnicodeDecodeError, OSError, ValueError) as err:
        raise DataError(f"{source}: cannot read manifest {path}: {err}; fix the file.") from err
    raise DataError(
        f"{source}: manifest {path} has suffix {suffix!r}; use .csv, .jsonl or .parquet."
    )


def _restore_lists(table: pd.DataFrame) -> pd.DataFrame:
    """Parquet gives list cells back as numpy arrays; the schema promises plain lists."""
    for col in table.columns:
        if table[col].dtype == object and table[col].map(lambda v: isinstance(v, np.ndarray)).any():
            table[col] = table[col].map(lambda v: v.tolist() if isinstance(v, np.ndarray) else v)
    return table


class AnnotatedSource(VQASource):
    """A dataset in its native layout under `root`; see the module docstring.

    Subclasses set `name` and `loader_version` (bump it whenever `build` or a cleaning step
    changes what the table holds) and implement `annotation_files` and `build`.
    """

    loader_version: int = 1
    # The native fields `build` reads, with the type each must hold: every row `valid_rows`
    # yields has them (where present and not null), the others are `wrong_type` bad rows
    # naming the file, row and field. Part of the cache key, so a table cached before a
    # field was declared is built again.
    field_types: ClassVar[Mapping[str, FieldType]] = {}

    def __init__(
        self,
        root: str | Path,
        cache_dir: str | Path | None = None,
        on_bad_row: str = DEFAULT_ON_BAD_ROW,
    ) -> None:
        super().__init__(root)
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else None
        self.on_bad_row = on_bad_row
        BadRows(self.name, on_bad_row)  # validates the policy early
        self._table: pd.DataFrame | None = None
        self._report: dict[str, Any] = {}
        self.oddities = KeptOddities(self.name)  # `build` counts what it keeps but finds odd
        self._key: str | None = None

    # -- what subclasses provide ------------------------------------------------------------

    @abstractmethod
    def annotation_files(self) -> list[Path]:
        """Every file whose content defines the table (not the images)."""

    @abstractmethod
    def build(self, bad: BadRows, cleaning: CleaningLog) -> pd.DataFrame:
        """Read the annotation files and return the normalised, cleaned table."""

    def region_files(self) -> list[Path]:
        """Files besides the annotations whose content decides the table's regions (SLAKE's
        `detection.json` per image; `medvqa.data.regions`): part of the cache key."""
        return []

    # Constructor parameters that are locations, not content: never part of the cache key.
    _NOT_CONTENT = ("root", "cache_dir", "on_bad_row")

    def params(self) -> dict[str, Any]:
        """The loader's options (part of the cache key): every constructor parameter except
        the locations, read from the attribute of the same name (each loader stores them so)."""
        return {
            name: getattr(self, name)
            for name in plugins.parameters(type(self))
            if name not in self._NOT_CONTENT
        }

    # -- shared machinery ---------------------------------------------------------------------

    def require(self, path: Path, what: str) -> Path:
        """A file the layout needs, with an error that says what was expected where."""
        if not path.is_file():
            raise DataError(
                f"{self.name}: {what} not found at {path}; point dataset.root at the dataset's "
                f"folder in its native layout (see the dataset's config in conf/dataset/)."
            )
        return path

    def fingerprint(self) -> str:
        """The cache key: annotation files' content + loader version + parameters."""
        if self._key is None:
            key = Hasher().update(
                {
                    "loader": f"{type(self).__module__}.{type(self).__qualname__}",
                    "version": self.loader_version,
                    "params": self.params(),
                    "on_bad_row": self.on_bad_row,
                    "field_types": {k: t.expected for k, t in self.field_types.items()},
                }
            )
            for path in [*self.annotation_files(), *self.region_files()]:
                key.update(str(path.relative_to(self.root)))
                key.update(file_hash(self.require(path, "annotation file")))
            self._key = key.hexdigest(20)
        return self._key

    def table(self) -> pd.DataFrame:
        if self._table is None:
            self._table = self._load_or_build()
        return self._table

    def report(self) -> dict[str, Any]:
        """Cleaning steps with their counts and the skipped bad rows (for splits.json)."""
        self.table()
        return self._report

    def _cache_entry(self) -> Path | None:
        if self.cache_dir is None:
            return None
        return self.cache_dir / "tables" / self.name / self.fingerprint()

    def _load_or_build(self) -> pd.DataFrame:
        entry = self._cache_entry()
        if entry is not None and is_built(entry, _REPORT_FILE):
            table = _restore_lists(pd.read_parquet(entry / _TABLE_FILE))
            self._report = json.loads((entry / _REPORT_FILE).read_text())
            log.info("%s: normalised table from cache %s (%d rows)", self.name, entry, len(table))
            return table
        bad = BadRows(self.name, self.on_bad_row)
        cleaning = CleaningLog(self.name)
        table = self.build(bad, cleaning).reset_index(drop=True)
        R.validate_table(table, self.name)
        arrow = arrow_table(table, self.name)
        self._report = {
            "cleaning": cleaning.report(),
            "skipped_rows": bad.report(),
            "kept_oddities": self.oddities.report(table),
        }
        if REGION in table.columns:  # how many rows have a region, and why the others do not
            self._report["regions"] = region_counts(table)
            log_counts(self.name, self._report["regions"])
        if entry is not None:

            def write(tmp: Path) -> None:  # the report last: it marks a complete entry
                pq.write_table(arrow, tmp / _TABLE_FILE)
                (tmp / _REPORT_FILE).write_text(json.dumps(self._report, indent=2))

            build_once(entry, write, marker=_REPORT_FILE, what=f"{self.name} table cache")
        return table

    # -- helpers for `build` ------------------------------------------------------------------

    def field(
        self,
        row: Mapping[str, Any],
        key: str,
        where: str,
        bad: BadRows,
        allowed: Sequence[Any] | None = None,
        may_be_empty: bool = False,
    ) -> Any:
        """A required field of a native row; a missing or invalid one is a bad row (None).

        An empty string is missing unless `may_be_empty` (a release's real empty answers)."""
        empty = isinstance(row.get(key), str) and not row[key] and not may_be_empty
        if key not in row or row[key] is None or empty:
            bad("malformed", where, f"missing field {key!r}")
            return None
        value = row[key]
        if allowed is not None and value not in allowed:
            bad("malformed", where, f"field {key!r} is {value!r}; expected one of {list(allowed)}")
            return None
        return value

    def typed(self, row: Mapping[str, Any], where: str, bad: BadRows) -> bool:
        """True if each field of `field_types` the row holds has its type; else a bad row."""
        for key, kind in self.field_types.items():
            value = row.get(key)
            if is_missing(value) or kind(value):
                continue
            bad(
                "wrong_type",
                where,
                f"field {key!r} is {shown(value)} ({describe(value)}); expected {kind.expected}",
            )
            return False
        return True

    def valid_rows(
        self,
        rows: Iterable[Any],
        path: Path,
        bad: BadRows,
        required: Sequence[str],
        may_be_empty: Sequence[str] = (),
    ) -> Iterator[tuple[int, str, dict[str, Any]]]:
        """(index, where, row) for each row that is an object with every required field, each
        declared field (`field_types`) of its type.

        Other rows are reported once each as bad rows; `where` names the file and row number.
        Fields in `may_be_empty` may hold an empty string: the loader counts it as a kept
        oddity with `text_oddities`, naming the record.
        """
        for i, row in enumerate(rows):
            where = f"{path} row {i}"
            if not isinstance(row, dict):
                bad("malformed", where, f"expected an object, got {type(row).__name__}")
                continue
            if all(
                self.field(row, key, where, bad, may_be_empty=key in may_be_empty) is not None
                for key in required
            ) and self.typed(row, where, bad):
                yield i, where, row

    def text_oddities(
        self, row: Mapping[str, Any], fields: Sequence[str], where: str, record: str
    ) -> None:
        """Count how each text field of a kept row differs from clean text.

        Kinds: `non_string_<field>` (a JSON number), `empty_<field>`, `padded_<field>`
        (whitespace at either end, stripped by the loaders) and `inner_whitespace_<field>`
        (a tab or a double blank inside, kept as released).
        """
        for key in fields:
            value = row.get(key)
            if value is None:
                continue
            if not isinstance(value, str):
                self.oddities(f"non_string_{key}", where, record)
                continue
            if not value.strip():
                self.oddities(f"empty_{key}", where, record)
                continue
            if value != value.strip():
                self.oddities(f"padded_{key}", where, record)
            if _INNER_WHITESPACE.search(value.strip()):
                self.oddities(f"inner_whitespace_{key}", where, record)

    def split_file(self, split: str, names: Sequence[str], what: str) -> Path:
        """The one annotation file of `split`, under whichever of the `names` copies use.

        Releases and their copies name files differently (SLAKE's `validate.json` is
        `validation.json` on the Hugging Face Hub): exactly one of the names must exist.
        """
        found = [self.root / n for n in names if (self.root / n).is_file()]
        if len(found) > 1:
            raise DataError(
                f"{self.name}: both {found[0]} and {found[1]} hold the {split} split; keep "
                "one of them (they are copies of the same file under different names)."
            )
        if not found:
            raise DataError(
                f"{self.name}: {what} not found in {self.root} (looked for "
                f"{', '.join(names)}); point dataset.root at the dataset's folder in its "
                "native layout (see the dataset's config in conf/dataset/)."
            )
        return found[0]

    def split_files(self, files: Mapping[str, Sequence[str]], what: str) -> list[Path]:
        """The annotation file of each split (`split_file`) of a layout of one file per split,
        in the order of `files` (split -> the names its copies give it); `what` names the data
        set in the errors."""
        return [
            self.split_file(split, names, f"{what} {split} annotations")
            for split, names in files.items()
        ]

    def split_rows(
        self,
        splits: Iterable[str],
        bad: BadRows,
        required: Sequence[str],
        may_be_empty: Sequence[str] = (),
    ) -> Iterator[tuple[str, str, dict[str, Any]]]:
        """(split, where, row) of each valid row (`valid_rows`) of a layout of one JSON list per
        split, `splits` naming `annotation_files` in their order."""
        for split, path in zip(splits, self.annotation_files(), strict=True):
            rows = read_json_rows(path, self.name)
            for _, where, row in self.valid_rows(rows, path, bad, required, may_be_empty):
                yield split, where, row

    def image_ref(self, ref: str, where: str, bad: BadRows) -> str | None:
        """An image reference relative to the root, or None (bad row) if it escapes the root."""
        if not safe_relative(ref):
            bad(
                "path_escape",
                where,
                f"image path {ref!r} escapes the dataset root {self.root}",
            )
            return None
        return str(PurePosixPath(str(ref).replace("\\", "/")))


def check_images(
    source: VQASource, frames: Mapping[str, pd.DataFrame], on_bad_row: str
) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    """Before a model touches the data: every referenced image exists and PIL recognises it.

    Opening reads only the header, so this is cheap; rows whose image is missing or unreadable
    raise (naming file and record) or, with `skip`, are dropped and counted.
    """
    from PIL import UnidentifiedImageError

    bad = BadRows(source.name, on_bad_row)
    checked: dict[str, bool] = {}
    out = {}
    for split, frame in frames.items():
        keep = []
        for ref, rid in zip(frame[R.IMAGE], frame[R.ID], strict=True):
            if ref not in checked:
                ok = True
                try:
                    source.check_image(ref, rid)
                except DataError as err:
                    ok = False
                    kind = "path_escape" if "escapes" in str(err) else "missing_image"
                    bad(kind, f"{split} record {rid!r}", str(err).split(": ", 1)[-1])
                except (UnidentifiedImageError, OSError) as err:
                    ok = False
                    bad("unreadable_image", f"{split} record {rid!r}", f"cannot read {ref}: {err}")
                checked[ref] = ok
            keep.append(checked[ref])
        out[split] = frame.loc[keep].reset_index(drop=True)
    report = {"images_checked": len(checked), **bad.report()}
    return out, report


def unique_values(values: Iterable[Any]) -> list[Any]:
    """Values in first-seen order, without repeats (candidate lists)."""
    return list(dict.fromkeys(values))
