"""medvqa-score on binary tables built to hurt: an .xlsx or .parquet file that unpacks to far
more rows or bytes than it weighs (refused in seconds, unread, with the numbers and the option
to raise), and a workbook whose formulas store no value (warned about, never evaluated)."""

from __future__ import annotations

import json
import re
import time
import zipfile
from pathlib import Path

import pandas as pd
import pytest

from medvqa.cli.score import main
from medvqa.peers.prediction_files import ReadLimits
from medvqa.peers.readers import ScoreInputError, read

SHEET = "xl/worksheets/sheet1.xml"
HEADER = ("question", "answer", "prediction")


def _refused(path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, *args: str) -> str:
    """The one error line of a refused file; nothing is written to --out."""
    caplog.clear()
    out = tmp_path / "refused"
    assert main([str(path), "--out", str(out), *args]) == 2
    assert not out.exists() and "Traceback" not in caplog.text
    return caplog.text


def _bomb(tmp_path: Path, rows: int) -> Path:
    """A real workbook (pandas') whose first sheet is replaced by a header and `rows` tiny
    rows: a few hundred kilobytes that unpack to tens of megabytes of sheet XML."""
    plain = tmp_path / "plain.xlsx"
    pd.DataFrame([dict(zip(HEADER, ("Is it?", "yes", "yes"), strict=True))]).to_excel(
        plain, index=False
    )
    head = "".join(
        f'<c r="{col}1" t="inlineStr"><is><t>{name}</t></is></c>'
        for col, name in zip("ABC", HEADER, strict=True)
    )
    path = tmp_path / "bomb.xlsx"
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as dst:
        for member in src.infolist():
            if member.filename != SHEET:
                dst.writestr(member, src.read(member))
        with dst.open(SHEET, "w") as sheet:
            sheet.write(
                b'<worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main">'
                + f'<sheetData><row r="1">{head}</row>'.encode()
            )
            # Rows without `r` (it is optional), all alike: they compress a thousandfold.
            block = b"<row><c><v>1</v></c><c><v>1</v></c><c><v>1</v></c></row>" * 100
            for _ in range(rows // 100):
                sheet.write(block)
            sheet.write(b"</sheetData></worksheet>")
    return path


@pytest.mark.heavy
def test_an_xlsx_bomb_is_refused_in_seconds_unread(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _bomb(tmp_path, 1_200_000)
    with zipfile.ZipFile(path) as archive:
        unpacked = sum(member.file_size for member in archive.infolist())
    assert path.stat().st_size < 500_000 < 50_000_000 < unpacked  # small, unpacks far
    start = time.perf_counter()
    with pytest.raises(ScoreInputError):
        read(path)  # the default limits
    assert time.perf_counter() - start < 10  # openpyxl would run for minutes
    assert "(--max-cells)" in _refused(path, tmp_path, caplog)  # 3 columns: the cells first
    text = _refused(path, tmp_path, caplog, "--max-cells", "10000000")
    limit = ReadLimits().max_rows
    found = re.search(rf"{path}: its first sheet \({SHEET}\) has ([\d,]+) rows or more", text)
    assert found is not None and limit < int(found.group(1).replace(",", "")) <= 1_200_001
    assert f"over the limit of {limit:,} (--max-rows); nothing was read" in text
    with pytest.raises(ScoreInputError) as refusal:
        read(path, limits=ReadLimits(max_rows=2_000_000, max_bytes=1_000_000))
    assert str(refusal.value).startswith(
        f"{path}: its zip members unpack to {unpacked:,} bytes (as declared), over the limit "
        "of 1,000,000 (--max-bytes); nothing was read"
    )


@pytest.mark.heavy
def test_the_limits_let_a_file_within_them_through(tmp_path: Path) -> None:
    path = _bomb(tmp_path, 10_000)  # the header and 10,000 rows
    with pytest.raises(ScoreInputError, match=r"10,001 rows or more .* limit of 10,000 \(--max-"):
        read(path, limits=ReadLimits(max_rows=10_000))
    frame, fmt = read(path, limits=ReadLimits(max_rows=10_001))
    assert fmt == "table" and len(frame) == 10_000


@pytest.mark.heavy
def test_a_parquet_past_the_limits_is_refused_from_its_metadata(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "preds.parquet"
    pd.DataFrame(
        {"question": ["Is it?"] * 50, "answer": ["yes"] * 50, "prediction": ["no " * 100] * 50}
    ).to_parquet(path)
    text = _refused(path, tmp_path, caplog, "--max-rows", "49")
    assert f"{path}: its metadata declares 50 rows, over the limit of 49 (--max-rows)" in text
    text = _refused(path, tmp_path, caplog, "--max-bytes", "1000")
    assert "its column chunks unpack to" in text and "limit of 1,000 (--max-bytes)" in text
    assert main([str(path), "--out", str(tmp_path / "ok"), "--max-rows", "50"]) == 0
    config = json.loads((tmp_path / "ok" / "results.json").read_text())["config"]
    assert config["read_limits"] == {**ReadLimits().__dict__, "max_rows": 50}


def test_a_limit_below_one_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "preds.jsonl"
    path.write_text(json.dumps({"question": "q", "answer": "yes", "prediction": "yes"}) + "\n")
    assert "--max-rows 0: give a positive number" in _refused(
        path, tmp_path, caplog, "--max-rows", "0"
    )


@pytest.mark.heavy
def test_formula_cells_without_a_value_are_named_and_never_evaluated(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """openpyxl writes formulas without their values (as a script that builds a sheet does):
    each is read as empty, and a warning gives their count and cells."""
    from openpyxl import Workbook

    book = Workbook()
    sheet = book.active
    sheet.append([*HEADER, "reply"])
    for i, (answer, reply) in enumerate([("yes", "yes"), ("no", "no"), ("yes", "no")], start=2):
        sheet.append(["Is it?", answer, f"=D{i}" if i != 3 else reply, reply])
    sheet["B4"] = '=IF(1=1,"yes","no")'
    path = tmp_path / "formulas.xlsx"
    book.save(path)
    caplog.clear()
    frame, _ = read(path)
    assert frame["prediction"].tolist() == ["", "no", ""]  # not "yes", not "no": not evaluated
    assert frame["answer"].tolist() == ["yes", "no", ""]
    warning = f"{path}: 3 formula cell(s) store no value (C2, B4, C4) and are read as empty"
    assert warning in caplog.text


def test_a_formula_with_a_stored_value_is_read_as_that_value(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Excel stores a formula's value beside it (xlsxwriter does when given one): that value
    is the cell, as Excel shows it, and nothing is warned about."""
    xlsxwriter = pytest.importorskip("xlsxwriter")
    path = tmp_path / "stored.xlsx"
    book = xlsxwriter.Workbook(str(path))
    sheet = book.add_worksheet()
    sheet.write_row(0, 0, HEADER)
    sheet.write_row(1, 0, ["Is it?", "yes"])
    sheet.write_formula(1, 2, '=IF(1=1,"no","yes")', None, "yes")  # stored: "yes"
    book.close()
    caplog.clear()
    assert read(path)[0]["prediction"].tolist() == ["yes"]
    assert "formula cell" not in caplog.text


def test_a_workbook_declaring_entities_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An XML entity (the stuff of billion-laughs bombs) in the workbook: refused, unread."""
    plain, path = tmp_path / "plain.xlsx", tmp_path / "entities.xlsx"
    pd.DataFrame([dict(zip(HEADER, ("Is it?", "yes", "yes"), strict=True))]).to_excel(
        plain, index=False
    )
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(path, "w") as dst:
        for member in src.infolist():
            data = src.read(member)
            if member.filename == "xl/workbook.xml":
                head, _, body = data.partition(b"?>")
                data = head + b'?><!DOCTYPE w [<!ENTITY lol "lol">]>' + body
            dst.writestr(member, data)
    text = _refused(path, tmp_path, caplog)
    assert f"{path}: the workbook's XML declares entities or a DTD" in text
