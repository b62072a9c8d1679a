"""A refusal reads like one, in every command: the message and a non-zero exit (2 for a refused
value), never a traceback, which goes to the run's log file (run.py) for those who want it;
and a job of a sweep that is refused before it starts is on the record like any other."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import run_main


def test_run_py_refuses_a_value_with_its_message_and_exit_2(
    tmp_path: Path, cache_dir: Path
) -> None:
    """A config check's ConfigError (FP8 on a CPU) was printed inside Hydra's "Error executing
    job" traceback: now its message alone, exit 2, and the traceback in run.log."""
    proc = run_main(["task=splits", "logger=csv", "model.fp8=true"], tmp_path, cache_dir)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "refused: " in proc.stderr and "model.fp8=true" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "Error executing job" not in proc.stderr
    log = (tmp_path / "run.log").read_text()
    assert "Traceback" in log and "ConfigError" in log
    assert not (tmp_path / "results.json").exists()  # a single run refused: no record


def test_a_refused_task_eval_in_a_sweep_is_recorded_and_reported(
    tmp_path: Path, cache_dir: Path
) -> None:
    """`adopt_run` refuses before the record is made: each refused job of a sweep still writes
    its `failed` record with the reason, and medvqa-report lists it in issues.csv."""
    from medvqa.analysis.aggregate import collect
    from medvqa.analysis.tables import issues_table

    crashed = tmp_path / "crashed"
    crashed.mkdir()
    (crashed / "results.json").write_text(
        json.dumps({"status": "failed", "metrics": {}, "config": {}})
    )
    sweep = tmp_path / "sweep"
    args = ["-m", "task=eval", f"eval.from_run={crashed}", "logger=csv", "seed=0,1",
            f"hydra.sweep.dir={sweep}"]  # fmt: skip
    proc = run_main(args, tmp_path / "unused", cache_dir)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "the job was refused" in proc.stderr and "Traceback" not in proc.stderr
    records = [json.loads(p.read_text()) for p in sorted(sweep.rglob("results.json"))]
    assert [r["status"] for r in records] == ["failed", "failed"]
    assert all("only a run that finished training" in r["error"] for r in records)
    issues = issues_table(collect([sweep]))  # the report's issues.csv
    assert list(issues["status"]) == ["failed", "failed"]
    assert issues["error"].str.contains("only a run that finished training").all()


def _score(tmp: Path) -> list[str]:
    return [str(tmp / "missing.csv"), "--out", str(tmp / "out")]


def _rater(tmp: Path) -> list[str]:
    return ["export", str(tmp / "missing.parquet"), "--out", str(tmp / "out")]


def _convert(tmp: Path) -> list[str]:
    return ["llava-med", str(tmp / "missing"), str(tmp / "dst")]


@pytest.mark.parametrize(
    "script, argv, said",
    [
        ("score", _score, "missing.csv: no such file"),
        ("report", lambda tmp: [str(tmp / "missing"), "--out", str(tmp / "out")], "missing"),
        ("select", lambda tmp: [str(tmp / "missing"), "--out", str(tmp / "out")], "missing"),
        ("rater", _rater, "missing.parquet"),
        ("convert", _convert, "missing"),
    ],
)
def test_each_console_script_refuses_with_its_message_and_exit_2(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture,
    script: str,
    argv: Callable[[Path], list[str]],
    said: str,
) -> None:
    import importlib

    main = importlib.import_module(f"medvqa.cli.{script}").main
    with caplog.at_level(logging.INFO):
        status = main(argv(tmp_path))
    shown = caplog.text + "".join(capsys.readouterr())
    assert status == 2 and said in shown, shown
    assert "Traceback" not in shown
