"""The per-phase table of a whole job from its results.json: wall time, items and rate, the
steady rate (second half of the fit's steps), this rank's peak GPU memory against the memory
plan's estimate. Used by `make gpu-check`; works on any run's record.

    python benchmarks/gpu_check_table.py /tmp/gpu-check/job7b/results.json [more.json ...]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

# a job's phases in the order it runs them; others after
ORDER = [
    "plan",
    "data",
    "load",
    "generate/predictions_zero_shot",
    "fit",
    "generate/predictions",
    "score",
]
# what a phase counts (medvqa.measure: the fit's samples, a generation's rows)
UNITS = ("samples", "rows")
# phase -> the plan's estimate of its per-GPU peak (task=plan's rows)
PLANNED = {"fit": "plan/train_gib", "generate": "plan/generation_gib"}


def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:,.{digits}f}"


def _percent(whole: float | None, steady: float | None) -> str:
    if whole is None:
        return ""
    return f"{_fmt(100 * whole)} %, {_fmt(100 * steady) if steady is not None else '–'} %"


HEADER = (
    "phase", "s", "items", "per s", "steady per s", "MFU, steady", "peak allocated GiB",
    "peak reserved GiB", "plan GiB",
)  # fmt: skip


def phase_cells(metrics: dict[str, float | None]) -> list[list[str]]:
    """One row of cells per phase a job measured (its `perf/<phase>/...` metrics), in the order
    the job runs them; docs/measurements.md's job tables use it too."""
    m = {k: (float("nan") if v is None else v) for k, v in metrics.items()}
    phases = sorted(
        {
            k.split("/")[1] if k.count("/") == 2 else "/".join(k.split("/")[1:3])
            for k in m
            if k.startswith("perf/")
        },
        key=lambda p: (ORDER.index(p) if p in ORDER else len(ORDER), p),
    )
    rows = []
    for phase in phases:
        key = f"perf/{phase}"
        unit = next((u for u in UNITS if f"{key}/{u}" in m), None)
        plan = PLANNED.get(phase.split("/")[0])
        rows.append(
            [
                phase,
                _fmt(m.get(f"{key}/seconds")),
                f"{int(m[f'{key}/{unit}'])} {unit}" if unit else "",
                _fmt(m.get(f"{key}/{unit}_per_s"), 2) if unit else "",
                _fmt(m.get(f"{key}/steady_{unit}_per_s"), 2) if unit else "",
                _percent(m.get(f"{key}/mfu"), m.get(f"{key}/steady_mfu")),
                _fmt(m.get(f"{key}/peak_allocated_gib")),
                _fmt(m.get(f"{key}/peak_reserved_gib")),
                _fmt(m.get(plan)) if plan else "",
            ]
        )
    return rows


def markdown_row(cells: list[str] | tuple[str, ...]) -> str:
    return "| " + " | ".join(cells) + " |"


def table(path: Path) -> str:
    record = json.loads(path.read_text())
    both = {**record.get("metrics", {}), **record.get("perf", {})}  # the scores, the perf/ timings
    lines = [
        f"{path} ({record.get('status')}, {record.get('provenance', {}).get('device', '?')}, "
        f"allocator {record.get('provenance', {}).get('cuda_alloc_conf')})",
        "",
        markdown_row(HEADER),
        "|" + "---|" * len(HEADER),
    ]
    lines += [markdown_row(cells) for cells in phase_cells(both)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", nargs="+", type=Path)
    for path in parser.parse_args().records:
        print(table(path), end="\n\n")


if __name__ == "__main__":
    main()
