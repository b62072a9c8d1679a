"""`medvqa-report`: tables, figures and one HTML report from run and sweep directories (and W&B)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from medvqa.analysis.aggregate import collect, merge
from medvqa.analysis.claims import ADJUSTMENTS, DEFAULT_ADJUSTMENT
from medvqa.analysis.report import build_report, log_report
from medvqa.analysis.wandb_runs import collect_wandb
from medvqa.atomic import OutputDirError, restrict_umask
from medvqa.console import console as console_for_output


def _wandb_logger(out_dir: Path, project: str) -> Any:
    """A W&B logger for the report itself (offline unless WANDB_MODE=online)."""
    from medvqa.tracking import WandbRunLogger

    offline = os.environ.get("WANDB_MODE", "offline") != "online"
    return WandbRunLogger(
        project=project, save_dir=str(out_dir), job_type="report", offline=offline, name="report"
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="medvqa-report",
        description="Tables, figures and an HTML report from medvqa runs (results.json).",
    )
    parser.add_argument("dirs", nargs="*", type=Path, help="run or sweep directories")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument(
        "--wandb",
        action="append",
        default=[],
        metavar="ENTITY/PROJECT",
        help="also read runs from this W&B project (needs network and a W&B key)",
    )
    parser.add_argument(
        "--wandb-log",
        action="store_true",
        help="log the tables and figures to a W&B run (offline unless WANDB_MODE=online)",
    )
    parser.add_argument("--wandb-project", default="medvqa", help="project for --wandb-log")
    parser.add_argument(
        "--adjust",
        choices=sorted(ADJUSTMENTS),
        default=DEFAULT_ADJUSTMENT,
        help="multiplicity adjustment of the family of claims (claims.csv): holm (family-wise "
        "error, default) or bh (Benjamini-Hochberg false discovery rate)",
    )
    args = parser.parse_args(argv)
    if not args.dirs and not args.wandb:
        parser.error("give at least one run/sweep directory or --wandb ENTITY/PROJECT")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns 0, or exits with a message naming what to fix."""

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    restrict_umask()  # nothing it writes is group- or world-writable (docs/security.md)
    console = console_for_output()
    try:
        frames = [collect(args.dirs)] if args.dirs else []
        frames += [collect_wandb(path) for path in args.wandb]
    except (FileNotFoundError, RuntimeError, ValueError) as err:
        console.print(f"[red]medvqa-report: {err}[/red]")
        return 2
    runs = merge(frames)
    if runs.empty:
        where = ", ".join(map(str, args.dirs)) or ", ".join(args.wandb)
        console.print(f"[red]medvqa-report: no results.json records under {where}[/red]")
        return 2
    try:
        report = build_report(runs, args.out, args.adjust)
    except OutputDirError as err:
        console.print(f"[red]medvqa-report: {err}[/red]")
        return 2
    if args.wandb_log:
        from medvqa.tracking import finish

        loggers = [_wandb_logger(args.out, args.wandb_project)]
        try:
            log_report(report, loggers)
        finally:
            finish(loggers)
    n_bad = len(report.issues)
    console.print(
        f"[bold]medvqa-report[/bold]: {int((runs['kind'] == 'run').sum())} runs, "
        f"{len(report.tables)} table(s), {len(report.figures)} figure(s)"
        + (f", [red]{n_bad} run(s) did not finish[/red] (see issues.csv)" if n_bad else "")
        + f"\n  {report.files['html']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
