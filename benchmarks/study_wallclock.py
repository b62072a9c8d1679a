"""Where the time of a study went: per-job durations from the runs' own records.

Not a test. `make bench-study` runs `experiments/synthetic_study/run.sh` and then this script;
it also reads any finished sweep: `python benchmarks/study_wallclock.py DIR... [--markdown]`.
Each job's `results.json` records `started_at` and `duration_s` (the job itself, from Hydra
handing it over to its record being written). The summary groups jobs by sweep, experiment and
method or baseline, and gives the sum of job times and the span from the first start to the
last end, which includes what runs between jobs (Hydra, imports, process start of a sweep).
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from medvqa.analysis.aggregate import find_records  # noqa: E402
from medvqa.record import read_record  # noqa: E402


def job_times(dirs: list[Path]) -> pd.DataFrame:
    """One row per job: sweep folder, experiment, method, seed, status, start, duration."""
    rows = []
    for path in find_records(dirs):
        record = read_record(path)
        choices = record.get("choices") or {}
        baseline = choices.get("baseline")
        sweep = next((d.name for d in dirs if path.is_relative_to(d)), str(path.parent))
        started = record.get("started_at")
        rows.append(
            {
                "sweep": sweep,
                "experiment": choices.get("experiment") or choices.get("shift"),
                "method": f"baseline={baseline}" if baseline else f"peft={choices.get('peft')}",
                "seed": record.get("seed"),
                "status": record.get("status"),
                "started_at": datetime.fromisoformat(started) if started else None,
                # A running job's record holds no duration yet.
                "duration_s": (
                    float("nan")
                    if record.get("status") == "running"
                    else float(record.get("duration_s") or 0.0)
                ),
            }
        )
    return pd.DataFrame(rows)


def summary(jobs: pd.DataFrame) -> pd.DataFrame:
    """Per sweep × experiment × method: jobs, total, mean, min and max seconds."""
    grouped = jobs.groupby(["sweep", "experiment", "method"], sort=False)["duration_s"]
    out = grouped.agg(jobs="size", total_s="sum", mean_s="mean", min_s="min", max_s="max")
    return out.reset_index().round(1)


def span_s(jobs: pd.DataFrame) -> float:
    """First start to last end, in seconds (NaN without start times)."""
    timed = jobs.dropna(subset=["started_at", "duration_s"])
    if timed.empty:
        return float("nan")
    ends = timed["started_at"] + timed["duration_s"].map(lambda s: timedelta(seconds=s))
    return (ends.max() - timed["started_at"].min()).total_seconds()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="sweep folders (hydra.sweep.dir)")
    parser.add_argument("--markdown", action="store_true", help="print Markdown, not a rich table")
    args = parser.parse_args(argv)
    dirs = [d.resolve() for d in args.dirs]
    jobs = job_times(dirs)
    if jobs.empty:
        raise SystemExit(f"no results.json under {', '.join(map(str, dirs))}")
    table = summary(jobs)
    unfinished = jobs[jobs["status"] != "finished"]
    totals = (
        f"{len(jobs)} jobs ({len(unfinished)} not finished); sum of job times "
        f"{jobs['duration_s'].sum():.0f} s; first start to last end {span_s(jobs):.0f} s"
    )
    if args.markdown:
        print(table.to_markdown(index=False))
        print(f"\n{totals}")
        return
    console = Console(width=max(Console().width, 120))
    rich_table = Table(title="Job wall-clock (s)")
    for column in table.columns:
        rich_table.add_column(
            column, justify="right" if table[column].dtype.kind in "if" else "left"
        )
    for row in table.itertuples(index=False):
        rich_table.add_row(*map(str, row))
    console.print(rich_table)
    console.print(totals)


if __name__ == "__main__":
    main()
