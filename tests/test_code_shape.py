"""Short functions over the whole package: no def under medvqa/ runs over MAX_LINES lines (its
whole body, docstring included, as the AST measures it). A longer one does several things;
split it by what it does, a helper per step with a docstring that says why."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import medvqa

PACKAGE = Path(medvqa.__file__).resolve().parent
MAX_LINES = 80


def functions(tree: ast.AST, where: str = "") -> Iterator[tuple[str, ast.AST]]:
    """Every def under `tree` (methods and nested defs too), by its qualified name."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = f"{where}.{child.name}".lstrip(".")
            if not isinstance(child, ast.ClassDef):
                yield name, child
            yield from functions(child, name)
        else:
            yield from functions(child, where)


def long_functions(source: str, module: str, limit: int = MAX_LINES) -> list[str]:
    """`module:line name (n lines)` for each def in `source` longer than `limit` lines."""
    found = []
    for name, node in functions(ast.parse(source)):
        lines = node.end_lineno - node.lineno + 1  # type: ignore[attr-defined]
        if lines > limit:
            found.append(f"{module}:{node.lineno} {name} ({lines} lines)")  # type: ignore[attr-defined]
    return found


@pytest.mark.heavy
def test_no_function_in_the_package_is_over_80_lines() -> None:
    """Every module under medvqa/ (found on disk, not listed), every def in it."""
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 100  # the whole package, not an empty folder
    found = [
        f
        for path in modules
        for f in long_functions(
            path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent))
        )
    ]
    assert not found, f"functions over {MAX_LINES} lines (split them by step):\n" + "\n".join(found)


def test_the_measure_finds_a_planted_long_function() -> None:
    """A def of 81 lines is found (a method and a nested def too, by their qualified names);
    one of 80 lines is not."""
    body = "".join(f"    x{i} = {i}\n" for i in range(79))
    planted = (
        f"def fits():\n{body}\n"  # 80 lines: the def line and 79 statements
        f"def over():\n{body}    return 0\n\n"
        f"class Job:\n    def run(self):\n        def inner():\n"
        + "".join(f"            y{i} = {i}\n" for i in range(80))
        + "        return inner\n"
    )
    assert long_functions(planted, "planted") == [
        "planted:82 over (81 lines)",
        "planted:165 Job.run (83 lines)",
        "planted:166 Job.run.inner (81 lines)",
    ]
