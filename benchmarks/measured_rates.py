"""Write the measured rates `task=plan` uses (medvqa/planning/measured_rates.jsonl) from the raw
rows under benchmarks/results/: which rows, and why others are left out, is this file's list.

    python benchmarks/measured_rates.py           # rewrite the shipped file
    python benchmarks/measured_rates.py --check   # exit 1 where it differs (tests run this)

After a GPU session: add the new file's rows to `SELECTED` (benchmarks/gpu.py's rows carry their
date, commit and LoRA rank; `make gpu-check`'s job rows the fit's seconds and steady rate), run
this, and commit both. Where rows measure the same setup the plan takes the newest
(`medvqa.planning.rates.newest`), so older rows may stay listed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from medvqa.planning import rates

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "medvqa" / "planning" / rates.SHIPPED
Reader = Callable[[dict[str, Any], str], rates.Row]
TRAIN, GENERATE, JOB = rates.train_row, rates.generate_row, rates.job_row

# (file, 1-based lines, reader). Left out, by line:
# gpu-h100-2026-11-26.jsonl: 1 (the loss and checks before label_logits_only), 6, 23 and 28
# (LoRA dropout 0: another method), 8 (compiled micro-batch 4, superseded by 31 at 8), 18
# (compiled, its warm-up was timed), 19 and 22 (LLaVA-Med eager micro-batch 8 measured again
# later that day, 14.4 and 13.8: the time model, memory.MICRO_BATCH_COST, was fitted to the first
# session's rows), 21 (16 x every 2nd layer at 8.6, not explained), 29 and 30 (generation with
# Liger's kernels: the rows have no kernels field), 32 (failed).
# gpu-h100-2026-11-28.jsonl: 4 and 5 (shared image prefixes at 11 and 1 questions per image:
# the plan does not yet pick a generation rate by questions per image).
# gpu-check-h100-2026-11-28.jsonl: 2-6 (the ZeRO-2 dry runs and 2-step jobs: no steady window).
SELECTED: tuple[tuple[str, tuple[int, ...], Reader], ...] = (
    ("gpu-h100-2026-11-26.jsonl", (2, 3, 4, 5, 7, 31, 26, 27), TRAIN),
    ("gpu-h100-2026-11-26.jsonl", (10, 11, 12, 33, 14, 15, 16), TRAIN),
    ("gpu-h100-2026-11-26.jsonl", (9, 20, 24, 25, 13, 34, 35, 17), GENERATE),
    ("gpu-h100-2026-11-28.jsonl", (1,), TRAIN),
    ("gpu-h100-2026-11-28.jsonl", (2, 3), GENERATE),
    ("gpu-check-h100-2026-11-28.jsonl", (1,), JOB),
)


def build(results: Path = ROOT / "benchmarks" / "results") -> list[str]:
    """The shipped file's lines, read from the raw rows."""
    lines = []
    for name, numbers, reader in SELECTED:
        raw = (results / name).read_text().splitlines()
        for n in numbers:
            source = f"benchmarks/results/{name}:{n}"
            lines.append(rates.dumps(reader(json.loads(raw[n - 1]), source)))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    text = "\n".join(build()) + "\n"
    if args.check:
        same = OUT.exists() and OUT.read_text() == text
        if not same:
            sys.stderr.write(f"{OUT} differs from benchmarks/results: rerun this script\n")
        return 0 if same else 1
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
