"""docs/measurements.md is what benchmarks/docs_measurements.py makes of the raw rows under
benchmarks/results/: a figure edited by hand, or a raw row changed without rerunning the script,
fails here; and every link into the GPU pages lands on a heading that exists."""

from __future__ import annotations

import importlib
import json
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Where the repository links to a docs page's headings: the docs, the front pages, and the
# messages and comments of the code and configs.
LINKING = ["*.md", "docs/*.md", "launch/*.md", "experiments/**/*.md", "medvqa/**/*.py",
           "conf/**/*.yaml", "benchmarks/*.py"]  # fmt: skip
PAGES = ("gpus.md", "measurements.md", "offline.md")


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch):
    """benchmarks/docs_measurements.py as a module (the benchmarks are scripts, not a package)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("docs_measurements")


def test_the_committed_page_is_the_rows_rendered_again(script) -> None:
    assert script.main(["--check"]) == 0


def test_a_hand_edited_figure_fails_the_check(script, tmp_path: Path) -> None:
    text = script.OUT.read_text()
    edited = tmp_path / "measurements.md"
    edited.write_text(text.replace("| 22.9 |", "| 24.0 |", 1))
    assert edited.read_text() != text
    assert script.main(["--check", "--out", str(edited)]) == 1


def test_a_changed_row_changes_its_table_and_fails_the_check(script, tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(script.RESULTS, results)
    path = results / "gpu-h100-2026-11-28.jsonl"
    rows = path.read_text().splitlines()
    first = json.loads(rows[0]) | {"samples_s": 31.25}
    path.write_text("\n".join([json.dumps(first), *rows[1:]]) + "\n")
    assert script.main(["--check", "--results", str(results)]) == 1
    table = script.render(results).split("### gpu-h100-2026-11-28: training")[1]
    assert "| 31.2 |" in table.split("###")[0]


def test_every_table_names_its_source_lines_machine_versions_date_and_commit(script) -> None:
    sections = script.OUT.read_text().split("\n### ")[1:]
    assert len(sections) == 7
    for section in sections:
        for label in ("lines ", "Machine: ", "Versions: ", "Date: ", "Commit: "):
            assert label in section, (section.splitlines()[0], label)
    # a row that does not record its commit says so; one that does is named
    assert "Commit: not recorded." in script.OUT.read_text()
    assert "c6b9c03" in script.OUT.read_text()


def test_a_row_of_an_unknown_benchmark_is_refused_naming_its_line(script, tmp_path: Path) -> None:
    (tmp_path / "new-2026-12-01.jsonl").write_text('{"a": 1}\n{"speed": 2}\n')
    with pytest.raises(ValueError, match=r"new-2026-12-01\.jsonl:1: not a row"):
        script.render(tmp_path)


def _headings(page: Path, script) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {script.anchor(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def test_every_link_to_a_heading_of_the_gpu_pages_lands(script) -> None:
    anchors = {name: _headings(ROOT / "docs" / name, script) for name in PAGES}
    link = re.compile(r"(?:docs/|\(|/)(" + "|".join(map(re.escape, PAGES)) + r")#([\w-]+)")
    broken = []
    for pattern in LINKING:
        for path in ROOT.glob(pattern):
            for page, target in link.findall(path.read_text()):
                if target not in anchors[page]:
                    broken.append(f"{path.relative_to(ROOT)}: {page}#{target}")
    for page in PAGES:  # links within a page: (#anchor)
        for target in re.findall(r"\]\(#([\w-]+)\)", (ROOT / "docs" / page).read_text()):
            if target not in anchors[page]:
                broken.append(f"docs/{page}: #{target}")
    assert not broken
