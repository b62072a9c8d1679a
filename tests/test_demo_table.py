"""README.md's demo table: how it is read; tests/test_demo_slow.py compares it with what
`make demo` prints from an empty cache (`make test-slow`).

`make demo` runs under portable numerics (`MEDVQA_NUMERICS=portable`, medvqa/numerics.py):
kernels that do not depend on the CPU on one thread, so the fine-tuning trains the same
bits on any x86-64 CPU with AVX2, and its tiny model is the shipped build
(medvqa/models/builders/shipped.py) made under the same numerics. The table is compared exactly, cell for cell as printed, on whatever x86-64 CPU
runs the test: a comparison loose enough to pass with the CPU's own kernels (LoRA closed 0.798
on an Intel Xeon, 0.715 on an AMD EPYC, the same code) would not notice a real change.
"""

from __future__ import annotations

import math
import re

from tests.conftest import ROOT


def readme_table() -> dict[str, list[str]]:
    """The Quick start table's rows as printed text: method -> its six cells."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```\n(method +closed i\.i\.d\..*?)```", text, re.S)
    assert block, "README.md has no demo table (a ``` block starting with 'method  closed')"
    lines = block.group(1).strip().splitlines()
    rows = [re.split(r"\s{2,}", line.strip()) for line in lines[1:]]
    return {row[0]: row[1:] for row in rows}


def printed(value: float) -> str:
    """A cell as the demo prints it (medvqa.analysis.summary: three decimals, '—' for none)."""
    return "—" if value is None or math.isnan(value) else f"{value:.3f}"


def test_the_readme_table_parses() -> None:
    """Also guards the parser: three rows of six cells each."""
    table = readme_table()
    assert list(table) == ["LoRA", "No Finetune", "Random (1/k)"]
    assert all(len(cells) == 6 for cells in table.values()), table
