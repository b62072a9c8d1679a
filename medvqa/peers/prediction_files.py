"""The bytes of a predictions file for `medvqa-score`: which container it is, and its rows.

Kept apart from the format readers (`readers`, `peer_readers`), which decide what the rows
mean. A file is one of:
- text (CSV, TSV, JSON, JSONL; any other suffix is read as JSONL), which must be UTF-8: a reader's
  bare UnicodeDecodeError would name neither the place nor the fix;
- an Excel workbook (`.xlsx`, VLMEvalKit's default prediction file; its first sheet) or a Parquet
  file (`.parquet`), which are binary and skip the UTF-8 check;
- anything else binary (a PDF, a zip, a pickle, an old `.xls`, ...), refused up front as an
  unsupported format with the supported ones listed, instead of a misleading "not UTF-8".

Excel and CSV cells are read as the text they hold (see `load_table`). Every file is held to
`ReadLimits` (rows, cells, one cell's size, bytes), measured before it is parsed where the
format allows: a workbook's or Parquet file's metadata and a streaming count of its sheet, a
CSV's rows counted as they stream, a JSONL's lines. A few kilobytes of workbook can unpack to
millions of rows, which openpyxl would read for minutes before a MemoryError.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import posixpath
import re
import zipfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pandas as pd

from medvqa.generation.files import json_lines

log = logging.getLogger(__name__)


class ScoreInputError(ValueError):
    """A predictions file that cannot be scored; the message names the file, row and fix."""


TEXT_TABLES = {".csv": ",", ".tsv": "\t"}
BINARY_TABLES = (".xlsx", ".parquet")
TABLE_SUFFIXES = (*TEXT_TABLES, *BINARY_TABLES)
SUPPORTED = (
    "CSV (.csv), TSV (.tsv), JSON (.json, a list of records), JSONL (.jsonl or any other text "
    "suffix), Excel (.xlsx) and Parquet (.parquet)"
)
# Binary formats seen in the wild, by their first bytes: what the file is, and what to do.
MAGIC = (
    (b"%PDF", "a PDF document", "export the predictions table from the tool that made it"),
    (b"\xd0\xcf\x11\xe0", "an old Excel .xls (or other OLE2) file", "re-save it as .xlsx or CSV"),
    (b"\x1f\x8b", "a gzip archive", "decompress it (`gunzip FILE`) and pass the file inside"),
    (b"BZh", "a bzip2 archive", "decompress it (`bunzip2 FILE`) and pass the file inside"),
    (b"\xfd7zXZ\x00", "an xz archive", "decompress it (`unxz FILE`) and pass the file inside"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive", "extract it and pass the predictions file inside"),
    (b"\x93NUMPY", "a NumPy array", "save the predictions as a table (CSV, JSONL, Parquet)"),
    (b"\x89HDF", "an HDF5 file", "save the predictions as a table (CSV, JSONL, Parquet)"),
    (b"ARROW1", "an Arrow/Feather file", "save it as Parquet (`pd.read_feather(F).to_parquet`)"),
    (b"\x89PNG", "a PNG image", "pass the predictions file, not an image"),
    (b"\xff\xd8\xff", "a JPEG image", "pass the predictions file, not an image"),
)
PICKLE_FIX = (
    "it is not read, as unpickling a file runs code; VLMEvalKit falls back to .pkl when it "
    "cannot write its .xlsx/.tsv, so re-save the table from Python as .tsv, .xlsx or .parquet"
)
# Suffixes of binary formats refused even when their first bytes are not recognised.
UNSUPPORTED_SUFFIXES = {
    ".pkl": f"a Python pickle: {PICKLE_FIX}",
    ".pickle": f"a Python pickle: {PICKLE_FIX}",
    ".pdf": "a PDF document: export the predictions table from the tool that made it",
    ".xls": "an old Excel .xls file: re-save it as .xlsx or CSV",
    ".zip": "a zip archive: extract it and pass the predictions file inside",
    ".npy": "a NumPy array: save the predictions as a table (CSV, JSONL, Parquet)",
    ".npz": "a NumPy archive: save the predictions as a table (CSV, JSONL, Parquet)",
    ".pt": "a PyTorch file: save the predictions as a table (CSV, JSONL, Parquet)",
    ".pth": "a PyTorch file: save the predictions as a table (CSV, JSONL, Parquet)",
    ".feather": "a Feather file: save it as Parquet (`pd.read_feather(F).to_parquet(P)`)",
    ".arrow": "an Arrow file: save it as Parquet",
    ".h5": "an HDF5 file: save the predictions as a table (CSV, JSONL, Parquet)",
    ".docx": "a Word document: export the predictions table as CSV",
    ".ods": "an OpenDocument spreadsheet: re-save it as .xlsx or CSV",
}
SNIFFED = 1 << 16  # bytes looked at for NUL bytes (text never has them; UTF-16 has a BOM)

# Byte-order marks and the encoding they mark, as `iconv -f` names it (it reads the mark).
BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"),
        (b"\xff\xfe", "UTF-16"), (b"\xfe\xff", "UTF-16"))  # fmt: skip


@dataclass(frozen=True)
class ReadLimits:
    """How much of a predictions file is read, in every format (CSV, TSV, JSON, JSONL, Parquet,
    .xlsx); past any, the file is refused with the number found, the limit and its option
    (`medvqa-score --max-rows`, `--max-bytes`, `--max-cells`, `--max-cell-chars`):

    - rows: records (a CSV's, TSV's or sheet's header row included; a Parquet file's rows);
    - bytes: the file's size, or what it unpacks to (an .xlsx's zip members as declared, which
      is all zipfile will inflate them to; a Parquet file's column chunks);
    - cells: rows x columns (what a workbook's sheet declares, or the cells it holds);
    - one cell's characters (a workbook's as the XML text holding it).

    The defaults read in seconds: openpyxl reads about 55,000 workbook cells a second (a
    million: under 20 s), pandas a CSV's million cells in under one."""

    max_rows: int = 1_000_000
    max_bytes: int = 1 << 30
    max_cells: int = 1_000_000
    max_cell_chars: int = 1 << 20

    def __post_init__(self) -> None:
        for name in (f.name for f in fields(self)):
            if getattr(self, name) < 1:
                raise ScoreInputError(
                    f"{limit_option(name)} {getattr(self, name)}: give a positive number"
                )


def limit_option(name: str) -> str:
    """The medvqa-score option that sets a `ReadLimits` field (`max_rows` -> `--max-rows`)."""
    return "--" + name.replace("_", "-")


def _over(path: Path, found: str, limit: int, option: str) -> ScoreInputError:
    return ScoreInputError(
        f"{path}: {found}, over the limit of {limit:,} ({option}); nothing was read. If the "
        f"file is genuine, pass a larger {option}; a small file that unpacks this far is more "
        "likely a zip bomb"
    )


def _unsupported(path: Path, what: str) -> ScoreInputError:
    return ScoreInputError(
        f"{path}: unsupported format: {what}. medvqa-score reads {SUPPORTED}; "
        "see docs/metrics.md#scoring-existing-predictions"
    )


def _is_workbook(path: Path) -> bool:
    """Whether a zip container is an Excel workbook (a .docx or a plain zip is not)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return "xl/workbook.xml" in archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return False


def _check_binary(path: Path, head: bytes) -> bool:
    """True for an .xlsx or .parquet file that is what its suffix says; refuse a binary file of
    any other format (by suffix or first bytes) before the UTF-8 check calls it bad text."""
    suffix = path.suffix.lower()
    if suffix == ".xlsx":
        if head.startswith(b"PK\x03\x04") and _is_workbook(path):
            return True
        raise ScoreInputError(
            f"{path}: named .xlsx but not an Excel workbook (it starts with {head[:8]!r}, an "
            ".xlsx is a zip holding xl/workbook.xml); if it is a CSV or TSV, name it .csv or "
            "'.tsv', else re-save it from Excel as .xlsx"
        )
    if suffix == ".parquet":
        if head.startswith(b"PAR1"):
            return True
        raise ScoreInputError(
            f"{path}: named .parquet but not a Parquet file (it starts with {head[:8]!r}, not "
            "b'PAR1'); name it after what it holds (.csv, .tsv, .jsonl) or re-save it as Parquet"
        )
    if any(head.startswith(bom) for bom, _ in BOMS):
        return False  # UTF-16/32 text: the UTF-8 check says how to convert it
    if head.startswith(b"PK\x03\x04"):
        if _is_workbook(path):
            raise _unsupported(path, "an Excel workbook without the .xlsx suffix: rename it")
        raise _unsupported(path, "a zip archive: extract it and pass the predictions file inside")
    if head.startswith(b"PAR1"):
        raise _unsupported(path, "a Parquet file without the .parquet suffix: rename it")
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        raise _unsupported(path, f"a Python pickle: {PICKLE_FIX}")
    for magic, what, fix in MAGIC:
        if head.startswith(magic):
            raise _unsupported(path, f"{what}: {fix}")
    if suffix in UNSUPPORTED_SUFFIXES:
        raise _unsupported(path, UNSUPPORTED_SUFFIXES[suffix])
    if b"\x00" in head:
        offset = head.index(b"\x00")
        raise _unsupported(
            path,
            f"a binary file (NUL byte at offset {offset}); if it is UTF-16 text without a "
            "byte-order mark, re-save it as UTF-8",
        )
    return False


def check_readable(path: Path, limits: ReadLimits | None = None) -> None:
    """Refuse an empty file, a binary file of an unsupported format, a file past `limits`
    (default `ReadLimits()`) as far as it can be measured before it is parsed (`check_frame`
    measures the rest after), and a text file that is not UTF-8 (the encoding every text
    reader assumes) with the place of the first bad byte."""
    limits = limits or ReadLimits()
    with path.open("rb") as fh:
        head = fh.read(SNIFFED)
    if not head.strip() and len(head) < SNIFFED:
        _empty(path, head)
    if _check_binary(path, head):
        if path.suffix.lower() == ".xlsx":
            _check_workbook(path, limits)
        else:
            _check_parquet(path, limits)
        return
    size = path.stat().st_size
    if size > limits.max_bytes:
        raise _over(path, f"it holds {size:,} bytes", limits.max_bytes, "--max-bytes")
    data = path.read_bytes()
    if not data.strip():
        _empty(path, data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise ScoreInputError(
            f"{path}: byte {err.start} (line {line}) is {data[err.start : err.start + 1]!r}, "
            f"not UTF-8; {_likely_encoding(data)}"
        ) from err
    suffix = path.suffix.lower()
    if suffix in TEXT_TABLES:
        _count_csv(path, text, TEXT_TABLES[suffix], limits)
    elif suffix != ".json":  # JSONL: one record per non-blank line
        lines = data.count(b"\n") + 1
        if lines > limits.max_rows:
            records = sum(1 for line in data.splitlines() if line.strip())
            if records > limits.max_rows:
                found = f"it holds {records:,} records (lines)"
                raise _over(path, found, limits.max_rows, "--max-rows")


def _empty(path: Path, data: bytes) -> None:
    raise ScoreInputError(
        f"{path}: the file is empty ({len(data)} bytes); write the predictions into it "
        "(a header and one row per question for CSV/TSV, one record per line for JSONL)"
    )


def _count_csv(path: Path, text: str, sep: str, limits: ReadLimits) -> None:
    """A CSV's or TSV's rows (header included), cells and longest cell, counted as the rows
    stream by and left as soon as one passes its limit: refused in seconds, unparsed."""
    before = csv.field_size_limit()
    csv.field_size_limit(limits.max_cell_chars)
    rows = columns = 0
    try:
        for rows, row in enumerate(
            csv.reader(io.StringIO(text.lstrip("\ufeff")), delimiter=sep), 1
        ):
            columns = max(columns, len(row))
            if rows > limits.max_rows:
                raise _over(path, f"it has more than {limits.max_rows:,} rows (header included)",
                            limits.max_rows, "--max-rows")  # fmt: skip
            if rows * columns > limits.max_cells:
                found = f"its first {rows:,} rows x {columns} columns hold {rows * columns:,} cells"
                raise _over(path, found, limits.max_cells, "--max-cells")
    except csv.Error as err:
        if "field limit" not in str(err):
            return  # malformed: pandas' own error names the line
        found = f"row {rows + 1} has a cell of more than {limits.max_cell_chars:,} characters"
        raise _over(path, found, limits.max_cell_chars, "--max-cell-chars") from err
    finally:
        csv.field_size_limit(before)


def check_frame(frame: pd.DataFrame, path: Path, limits: ReadLimits | None = None) -> None:
    """The limits a format lets be measured only once it is read (a JSON list's records, a
    JSONL's cells, a Parquet cell's size), on the rows a reader made of the file."""
    limits = limits or ReadLimits()
    rows, columns = frame.shape
    if rows > limits.max_rows:
        raise _over(path, f"it holds {rows:,} records", limits.max_rows, "--max-rows")
    if rows * columns > limits.max_cells:
        found = f"its {rows:,} records x {columns} fields hold {rows * columns:,} cells"
        raise _over(path, found, limits.max_cells, "--max-cells")
    for column in frame.columns:
        values = frame[column]
        if pd.api.types.is_numeric_dtype(values) or pd.api.types.is_datetime64_any_dtype(values):
            continue  # numbers and times: no cell of theirs is large
        sizes = values.map(_cell_chars)
        if len(sizes) and sizes.max() > limits.max_cell_chars:
            row = int(sizes.to_numpy().argmax())
            found = f"column {column!r}, record {row} holds {int(sizes.max()):,} characters"
            raise _over(path, found, limits.max_cell_chars, "--max-cell-chars")


def _cell_chars(value: Any) -> int:
    """A cell's size in characters: a string's length, a nested value's as JSON."""
    if isinstance(value, str | bytes | bytearray):
        return len(value)
    if isinstance(value, dict | list | tuple):
        return len(json.dumps(value, default=str))
    return 0


# Where a worksheet's XML opens a row, a cell or a formula (`<row r="2">`, `<c r="B2">`, `<x:f>`);
# a tag holds no "<", and a cell's text holds none either (XML writes it `&lt;`).
_ROW_TAG = re.compile(rb"<(?:[A-Za-z_][\w.-]*:)?row[\s/>]")
_CELL_TAG = re.compile(rb"<(?:[A-Za-z_][\w.-]*:)?c[\s/>]")
_FORMULA_TAG = re.compile(rb"<(?:[A-Za-z_][\w.-]*:)?f[\s/>]")
# The range a sheet declares it spans (`<dimension ref="A1:KN20001"/>`), near its start.
_DIMENSION = re.compile(rb'<(?:[A-Za-z_][\w.-]*:)?dimension\s+ref="([A-Z]+)(\d+):([A-Z]+)(\d+)"')
SHARED_STRINGS = "xl/sharedStrings.xml"
_CHUNK = 1 << 20
_MAIN_NS = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
_REL_NS = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}"
SHOWN_CELLS = 10  # formula cells named in the warning


def _first_sheet(archive: zipfile.ZipFile) -> str:
    """The zip member of the workbook's first sheet, the one `pd.read_excel` reads (the
    workbook's first `<sheet>`, through its relationship); sheet1.xml where that is unclear."""
    from defusedxml import ElementTree

    try:
        book = ElementTree.fromstring(archive.read("xl/workbook.xml"))
        sheet = book.find(f"{_MAIN_NS}sheets/{_MAIN_NS}sheet")
        rels = ElementTree.fromstring(archive.read("xl/_rels/workbook.xml.rels"))
        rid = sheet.get(f"{_REL_NS}id") if sheet is not None else None
        target = next(r.get("Target") for r in rels if r.get("Id") == rid)
    except (KeyError, StopIteration, ElementTree.ParseError):
        return "xl/worksheets/sheet1.xml"
    return target.lstrip("/") if target.startswith("/") else posixpath.join("xl", target)


@dataclass
class _Scan:
    """What a streamed worksheet (or shared-strings part) holds, as far as it was read."""

    rows: int = 0
    cells: int = 0
    formulas: bool = False


def _scan_xml(
    archive: zipfile.ZipFile, member: str, limits: ReadLimits, path: Path, what: str
) -> _Scan:
    """Stream a workbook part, a chunk at a time, counting rows and cells and looking for a
    text (between a tag's `>` and the next tag) longer than a cell may be; refused as soon as
    one passes its limit (a bomb in seconds, unparsed)."""
    too_long = re.compile(rb">[^<>]{%d}" % (limits.max_cell_chars + 1))
    scan, carry = _Scan(), b""
    with archive.open(member) as part:
        while chunk := part.read(_CHUNK):
            text = carry + chunk  # carry: a cut tag, or a text still open (within the limit)
            if too_long.search(text):
                found = f"{what} holds a text of more than {limits.max_cell_chars:,} bytes"
                raise _over(path, found, limits.max_cell_chars, "--max-cell-chars")
            cut = text.rfind(b"<")  # a tag cut by the chunk's end is read with the next one
            cut = len(text) if cut < 0 else cut
            scan.rows += len(_ROW_TAG.findall(text, 0, cut))
            scan.cells += len(_CELL_TAG.findall(text, 0, cut))
            scan.formulas = scan.formulas or _FORMULA_TAG.search(text, 0, cut) is not None
            carry = text[cut:]
            if scan.rows > limits.max_rows:
                found = f"{what} has {scan.rows:,} rows or more (header included)"
                raise _over(path, found, limits.max_rows, "--max-rows")
            if scan.cells > limits.max_cells:
                found = f"{what} holds {scan.cells:,} cells or more"
                raise _over(path, found, limits.max_cells, "--max-cells")
    scan.rows += len(_ROW_TAG.findall(carry))
    scan.cells += len(_CELL_TAG.findall(carry))
    scan.formulas = scan.formulas or bool(_FORMULA_TAG.search(carry))
    return scan


def _declared_cells(archive: zipfile.ZipFile, member: str) -> tuple[str, int] | None:
    """The range a sheet declares (`A1:KN20001`) and its cells, from its first kilobytes."""
    with archive.open(member) as part:
        found = _DIMENSION.search(part.read(1 << 14))
    if found is None:
        return None
    first_col, first_row, last_col, last_row = (g.decode() for g in found.groups())
    columns = _column_number(last_col) - _column_number(first_col) + 1
    rows = int(last_row) - int(first_row) + 1
    return f"{first_col}{first_row}:{last_col}{last_row}", max(rows, 0) * max(columns, 0)


def _column_number(letters: str) -> int:
    """A column's number from its letters (A: 1, Z: 26, AA: 27)."""
    number = 0
    for letter in letters:
        number = number * 26 + ord(letter) - ord("A") + 1
    return number


def _formulas_without_value(archive: zipfile.ZipFile, member: str) -> list[str]:
    """The references of a worksheet's formula cells that store no value: openpyxl reads them
    as empty (formulas are never evaluated here)."""
    from defusedxml.ElementTree import iterparse

    cells = []
    with archive.open(member) as sheet:
        for _, cell in iterparse(sheet, events=("end",)):
            if cell.tag.rsplit("}", 1)[-1] != "c":
                continue
            parts = {child.tag.rsplit("}", 1)[-1]: child for child in cell}
            value = parts.get("v", parts.get("is"))
            if "f" in parts and (value is None or not "".join(value.itertext())):
                cells.append(cell.get("r") or "?")
            cell.clear()
    return cells


def _check_workbook(path: Path, limits: ReadLimits) -> None:
    """Refuse a workbook past `limits` before it is parsed, and warn about formula cells
    without a stored value (which would otherwise be scored as empty without a word)."""
    from defusedxml import DefusedXmlException

    try:
        _measure_workbook(path, limits)
    except DefusedXmlException as err:  # entities or a DTD: what XML bombs are made of
        raise ScoreInputError(
            f"{path}: the workbook's XML declares entities or a DTD ({err}), which Excel never "
            "writes; it is not read. Re-save it from Excel or LibreOffice as .xlsx, or as CSV"
        ) from err


def _measure_workbook(path: Path, limits: ReadLimits) -> None:
    with zipfile.ZipFile(path) as archive:
        unpacked = sum(member.file_size for member in archive.infolist())
        if unpacked > limits.max_bytes:
            found = f"its zip members unpack to {unpacked:,} bytes (as declared)"
            raise _over(path, found, limits.max_bytes, "--max-bytes")
        sheet = _first_sheet(archive)
        if sheet not in archive.namelist():
            return  # not a sheet we can measure: openpyxl's own error says what is wrong
        what = f"its first sheet ({sheet})"
        declared = _declared_cells(archive, sheet)
        if declared is not None and declared[1] > limits.max_cells:
            found = f"{what} declares the range {declared[0]}, {declared[1]:,} cells"
            raise _over(path, found, limits.max_cells, "--max-cells")
        strings = archive.NameToInfo.get(SHARED_STRINGS)  # the texts the cells point to
        if strings is not None and strings.file_size > limits.max_cell_chars:
            _scan_xml(archive, SHARED_STRINGS, limits, path, f"its {SHARED_STRINGS}")
        formulas = _scan_xml(archive, sheet, limits, path, what).formulas
        empty = _formulas_without_value(archive, sheet) if formulas else []
    if empty:
        shown = ", ".join(empty[:SHOWN_CELLS]) + (", ..." if len(empty) > SHOWN_CELLS else "")
        log.warning(
            "%s: %d formula cell(s) store no value (%s) and are read as empty: formulas are "
            "never evaluated. Open the workbook in Excel or LibreOffice and save it (which "
            "stores each formula's value), or paste the values over the formulas",
            path,
            len(empty),
            shown,
        )


def _check_parquet(path: Path, limits: ReadLimits) -> None:
    """Refuse a Parquet file whose metadata declares more rows or unpacked bytes than
    `limits`, before any column is read."""
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path).metadata
    except Exception:  # damaged: load_table gives the full message
        return
    if meta.num_rows > limits.max_rows:
        found = f"its metadata declares {meta.num_rows:,} rows"
        raise _over(path, found, limits.max_rows, "--max-rows")
    cells = meta.num_rows * meta.num_columns
    if cells > limits.max_cells:
        found = f"its metadata declares {meta.num_rows:,} rows x {meta.num_columns} columns"
        raise _over(path, found, limits.max_cells, "--max-cells")
    unpacked = sum(
        meta.row_group(g).column(c).total_uncompressed_size
        for g in range(meta.num_row_groups)
        for c in range(meta.num_columns)
    )
    if unpacked > limits.max_bytes:
        found = f"its column chunks unpack to {unpacked:,} bytes (as declared)"
        raise _over(path, found, limits.max_bytes, "--max-bytes")


def _likely_encoding(data: bytes) -> str:
    """How to re-save a file that is not UTF-8: its byte-order mark names its encoding (Excel's
    'Unicode Text' and PowerShell write UTF-16); without one, most likely Latin-1/Windows-1252."""
    for bom, name in BOMS:
        if data.startswith(bom):
            return (
                f"it starts with a {name} byte-order mark, so it is {name} (Excel's 'Unicode "
                f"Text' and PowerShell write UTF-16). Re-save it as UTF-8 (Excel: 'CSV UTF-8'), "
                f"or `iconv -f {name} -t UTF-8 FILE > FILE.utf8`"
            )
    return (
        "re-save the file as UTF-8 (e.g. Excel's 'CSV UTF-8'), or, if it came from Windows "
        "or Excel, `iconv -f WINDOWS-1252 -t UTF-8 FILE > FILE.utf8`"
    )


def json_rows(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON list or a JSONL file, with an error naming the bad line."""
    text = path.read_text(encoding="utf-8-sig")
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ScoreInputError(f"{path}: not valid JSON ({err})") from err
        if not isinstance(data, list):
            raise ScoreInputError(f"{path}: expected a JSON list of records, got {type(data)}")
        return data

    def bad_line(number: int, err: json.JSONDecodeError) -> None:
        raise ScoreInputError(f"{path}: line {number} is not JSON ({err})") from err

    return [row for _, row in json_lines(text.splitlines(), bad_line)]


def is_table(path: Path) -> bool:
    """Whether the file is a table by its suffix (CSV, TSV, Excel, Parquet), not JSON records."""
    return path.suffix.lower() in TABLE_SUFFIXES


def load_table(path: Path) -> pd.DataFrame:
    """The rows of a CSV/TSV/Excel/Parquet file, or of JSON(L) records.

    A CSV or Excel cell is read as the text it holds: type inference would turn an all-numeric
    column's "007" into 7 and, next to "3.0", "05" into 5.0 (so "007" no longer equals another
    column's "007"), and NA parsing would turn the answers "NA" and "None" into missing values.
    An empty cell is therefore the empty string, which as a prediction is a valid empty answer,
    as "" is in the JSON formats. Parquet columns keep their types (they were never text).
    """
    suffix = path.suffix.lower()
    if suffix in TEXT_TABLES:
        return pd.read_csv(
            path,
            sep=TEXT_TABLES[suffix],
            dtype=str,
            encoding="utf-8-sig",  # Excel's "CSV UTF-8" starts with a byte-order mark
            keep_default_na=False,
            na_filter=False,
        )
    if suffix == ".xlsx":
        return _read_excel(path)
    if suffix == ".parquet":
        try:
            frame = pd.read_parquet(path)
        except Exception as err:  # a truncated or damaged file: pyarrow raises many kinds
            raise ScoreInputError(
                f"{path}: the Parquet file cannot be read ({type(err).__name__}: {err}); "
                "write it again (e.g. `frame.to_parquet(PATH)`)"
            ) from err
        return _decoded_binary(path, frame)
    return pd.DataFrame(json_rows(path))


def _decoded_binary(path: Path, frame: pd.DataFrame) -> pd.DataFrame:
    """A Parquet table's binary cells as the UTF-8 text they hold: scored as bytes, b"Yes" would
    be the text "b'Yes'". A cell that is not UTF-8 is refused, naming the column and row."""
    for column in frame.columns:
        values = frame[column]
        if values.map(lambda v: isinstance(v, bytes | bytearray)).any():
            frame[column] = [_utf8(path, column, i, v) for i, v in enumerate(values)]
    return frame


def _utf8(path: Path, column: Any, row: int, value: Any) -> Any:
    """`value` decoded where it is bytes (`_decoded_binary`), else as it is."""
    if not isinstance(value, bytes | bytearray):
        return value
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as err:
        raise ScoreInputError(
            f"{path}: column {column!r}, row {row}: binary data that is not UTF-8 text "
            f"({bytes(value)[:16]!r}...); write that column as text (strings), e.g. "
            "`frame[COL] = frame[COL].str.decode(ENCODING)` before `to_parquet`"
        ) from err


def _read_excel(path: Path, nrows: int | None = None) -> pd.DataFrame:
    """The first sheet, every cell as the text it holds (`nrows=0`: the header only)."""
    try:
        return pd.read_excel(path, dtype=str, keep_default_na=False, na_filter=False, nrows=nrows)
    except Exception as err:  # a damaged workbook: openpyxl raises many kinds
        raise ScoreInputError(
            f"{path}: the Excel workbook cannot be read ({type(err).__name__}: {err}); "
            "re-save it from Excel as .xlsx or as CSV"
        ) from err


def table_columns(path: Path) -> list[str]:
    """A table's column names, without reading all its rows (format detection)."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return list(pq.read_schema(path).names)
        except Exception as err:  # damaged: let load_table give the full message
            raise ScoreInputError(f"{path}: the Parquet file cannot be read ({err})") from err
    if suffix in TEXT_TABLES:
        return [
            str(c)
            for c in pd.read_csv(
                path, sep=TEXT_TABLES[suffix], dtype=str, nrows=0, encoding="utf-8-sig"
            ).columns
        ]
    if suffix == ".xlsx":
        return [str(c) for c in _read_excel(path, nrows=0).columns]
    return [str(c) for c in load_table(path).columns]


def default_typed(path: Path, columns: list[str]) -> pd.DataFrame:
    """The cells of `columns` as pandas' default reading types them, as VLMEvalKit's `load`
    reads its files (`pd.read_excel(f)`, `pd.read_csv(f, sep="\\t")`): empty cells and pandas'
    NA words ("None", "NA", "N/A", "null", "nan", ...) missing, numbers typed (a column of
    numbers with a missing cell is float: 3 is 3.0), where `load_table` keeps every cell's
    text. JSON and Parquet have no NA words and keep their own types."""
    suffix = path.suffix.lower()
    if suffix == ".xlsx":
        return pd.read_excel(path, usecols=columns)[columns]
    if suffix in TEXT_TABLES:
        return pd.read_csv(path, sep=TEXT_TABLES[suffix], usecols=columns, encoding="utf-8-sig")[
            columns
        ]
    return load_table(path)[columns]


def text_or_none(value: Any) -> str | None:
    """A cell as text; None for a missing one (None, NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value)
