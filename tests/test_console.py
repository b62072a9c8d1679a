"""medvqa.console: tables and log lines keep their width off a terminal."""

from __future__ import annotations

import logging

import pytest

from medvqa.console import WIDTH_OFF_TERMINAL, console, rich_logging


def test_off_a_terminal_the_console_is_wide_whatever_columns_and_force_color_say(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pytest captures stdout: not a terminal. pytest-xdist sets COLUMNS=80 and CI often
    FORCE_COLOR (which rich takes for a terminal); neither narrows a file's tables."""
    monkeypatch.delenv("COLUMNS", raising=False)
    assert console().width == WIDTH_OFF_TERMINAL
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert console().width == WIDTH_OFF_TERMINAL
    monkeypatch.setenv("COLUMNS", "300")
    assert console().width == 300


def test_a_long_log_line_is_not_wrapped_in_a_file(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    root.handlers = []
    try:
        rich_logging()
        message = "finished; record at " + "/very/long/path" * 8
        logging.getLogger("medvqa.test").info(message)
    finally:
        root.handlers, root.level = saved
    out = capsys.readouterr().out
    assert message in out.replace("\n", "") and any(message in line for line in out.splitlines())
