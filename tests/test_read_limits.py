"""`medvqa-score`'s read limits hold for every format: rows, cells (rows x columns), one cell's
size and bytes, for CSV, TSV, JSON, JSONL, Parquet and workbooks alike, measured before the
parse where the format allows and refused in seconds with the limit and its option."""

from __future__ import annotations

import json
import time
import zipfile
from pathlib import Path

import pandas as pd
import pytest

from medvqa.cli.score import main
from medvqa.peers.prediction_files import ReadLimits
from medvqa.peers.readers import ScoreInputError, read

HEADER = ("question", "answer", "prediction")
ROW = ("Is it?", "yes", "no")
SHEET = "xl/worksheets/sheet1.xml"
MAIN_NS = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"


def _refused(path: Path, limits: ReadLimits | None = None, within: float = 10.0) -> str:
    start = time.perf_counter()
    with pytest.raises(ScoreInputError) as err:
        read(path, limits=limits)
    assert time.perf_counter() - start < within  # refused in seconds, not minutes
    return str(err.value)


def _rows(n: int) -> str:
    return ",".join(HEADER) + "\n" + (",".join(ROW) + "\n") * n


@pytest.mark.heavy
def test_a_two_million_row_csv_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    path = tmp_path / "preds.csv"
    path.write_text(_rows(2_000_000))
    message = _refused(path)  # 3 columns: past the cells at a third of the rows
    assert "its first 333,334 rows x 3 columns hold 1,000,002 cells" in message
    assert "(--max-cells)" in message
    message = _refused(path, ReadLimits(max_cells=10_000_000))
    assert f"more than {ReadLimits().max_rows:,} rows" in message and "(--max-rows)" in message


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".json", ".parquet", ".xlsx"])
def test_every_format_holds_to_rows_cells_and_a_cells_size(tmp_path: Path, suffix: str) -> None:
    """The same 50 rows in each format: refused at 49 rows, at 100 cells, at a cell of 5
    characters ("question" has 8); read within them."""
    frame = pd.DataFrame([dict(zip(HEADER, ROW, strict=True))] * 50)
    path = tmp_path / f"preds{suffix}"
    {
        ".csv": lambda: frame.to_csv(path, index=False),
        ".tsv": lambda: frame.to_csv(path, index=False, sep="\t"),
        ".jsonl": lambda: frame.to_json(path, orient="records", lines=True),
        ".json": lambda: frame.to_json(path, orient="records"),
        ".parquet": lambda: frame.to_parquet(path),
        ".xlsx": lambda: frame.to_excel(path, index=False),
    }[suffix]()
    assert "(--max-rows)" in _refused(path, ReadLimits(max_rows=49))
    assert "(--max-cells)" in _refused(path, ReadLimits(max_cells=100))
    assert "(--max-cell-chars)" in _refused(path, ReadLimits(max_cell_chars=5))
    frame, _ = read(path, limits=ReadLimits(max_rows=51, max_cells=200, max_cell_chars=10))
    assert len(frame) == 50


def _wide_workbook(path: Path, rows: int, columns: int, dimension: bool) -> Path:
    """A workbook of `rows` x `columns` numbers written as raw sheet XML: a few hundred kB that
    openpyxl would read for minutes (about 55,000 cells a second)."""
    plain = path.with_name("plain.xlsx")
    pd.DataFrame([dict(zip(HEADER, ROW, strict=True))]).to_excel(plain, index=False)
    last = ""
    n = columns
    while n:
        n, rest = divmod(n - 1, 26)
        last = chr(65 + rest) + last
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as dst:
        for member in src.infolist():
            if member.filename != SHEET:
                dst.writestr(member, src.read(member))
        with dst.open(SHEET, "w") as sheet:
            sheet.write(f'<worksheet xmlns="{MAIN_NS}">'.encode())
            if dimension:
                sheet.write(f'<dimension ref="A1:{last}{rows}"/>'.encode())
            sheet.write(b"<sheetData>")
            row = b"<row>" + b"<c><v>1</v></c>" * columns + b"</row>"
            for _ in range(rows):
                sheet.write(row)
            sheet.write(b"</sheetData></worksheet>")
    return path


@pytest.mark.parametrize("dimension", [True, False], ids=["declared", "counted"])
def test_a_wide_workbook_is_refused_by_its_cells_in_seconds(
    tmp_path: Path, dimension: bool
) -> None:
    """20,000 rows x 300 columns: under the row limit, far over the cell limit. Refused from
    the range the sheet declares, or (none declared) by counting its cells as they stream."""
    path = _wide_workbook(tmp_path / "wide.xlsx", 20_000, 300, dimension)
    assert path.stat().st_size < 2_000_000
    message = _refused(path)
    said = "declares the range A1:KN20000, 6,000,000 cells" if dimension else "cells or more"
    assert said in message and f"{ReadLimits().max_cells:,} (--max-cells)" in message


@pytest.mark.heavy
def test_one_huge_cell_is_refused_unread_in_every_container(tmp_path: Path) -> None:
    """A cell of 20 MB: in a workbook's shared strings (a few kB zipped), in a CSV, a JSONL."""
    huge = "y" * 20_000_000
    plain, book = tmp_path / "plain.xlsx", tmp_path / "huge.xlsx"
    pd.DataFrame([dict(zip(HEADER, ROW, strict=True))]).to_excel(plain, index=False)
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(book, "w", zipfile.ZIP_DEFLATED) as dst:
        for member in src.infolist():
            data = src.read(member)
            if member.filename == "xl/sharedStrings.xml":
                data = data.replace(b">no<", f">{huge}<".encode())
            dst.writestr(member, data)
    assert book.stat().st_size < 200_000
    assert "sharedStrings.xml holds a text of more than" in _refused(book)
    csv_path = tmp_path / "huge.csv"
    csv_path.write_text(",".join(HEADER) + f"\nIs it?,yes,{huge}\n")
    assert "row 2 has a cell of more than" in _refused(csv_path)
    jsonl = tmp_path / "huge.jsonl"
    jsonl.write_text(json.dumps(dict(zip(HEADER, ("Is it?", "yes", huge), strict=True))) + "\n")
    assert "column 'prediction', record 0 holds 20,000,000 characters" in _refused(jsonl)


def test_a_text_file_past_max_bytes_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "preds.jsonl"
    path.write_text(json.dumps(dict(zip(HEADER, ROW, strict=True))) + "\n")
    size = path.stat().st_size
    assert f"it holds {size:,} bytes, over the limit of 10 (--max-bytes)" in _refused(
        path, ReadLimits(max_bytes=10)
    )


@pytest.mark.heavy  # medvqa-score composes its config each time: seconds
def test_the_options_set_every_limit_and_a_refusal_exits_2(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "preds.csv"
    path.write_text(_rows(10))
    out = tmp_path / "out"
    for option, value in (("--max-rows", "5"), ("--max-cells", "9"), ("--max-cell-chars", "3")):
        caplog.clear()
        assert main([str(path), "--out", str(out), option, value]) == 2
        assert f"({option})" in caplog.text and "Traceback" not in caplog.text
        assert not out.exists()
    assert main([str(path), "--out", str(out), "--max-cells", "33"]) == 0
    limits = json.loads((out / "results.json").read_text())["config"]["read_limits"]
    assert limits == {**ReadLimits().__dict__, "max_cells": 33}
