"""`medvqa-select`: the best setting of each grid sweep, written as configs to run the study with."""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from medvqa.analysis.select import select, write
from medvqa.atomic import restrict_umask
from medvqa.cli.refusal import REFUSALS, refused
from medvqa.console import console as console_for_output


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="medvqa-select",
        description="Pick each grid's best setting on the validation split and write it as the "
        "Hydra config a study composes (conf/hparams/<study>/<dataset>_<peft>.yaml).",
    )
    parser.add_argument("dirs", nargs="+", type=Path, help="grid sweep (or run) directories")
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="where the files go, e.g. conf/hparams/sure_vqa to replace the shipped settings",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point: 0 when every grid has a winner, 1 when some has none, 2 on bad input."""
    from rich.markup import escape
    from rich.table import Table

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    restrict_umask()  # nothing it writes is group- or world-writable (docs/security.md)
    console = console_for_output()
    try:
        selections = select(args.dirs)
        written = write(selections, args.out, [str(d) for d in args.dirs])
    except REFUSALS as err:
        return refused("medvqa-select", err)
    table = Table(title="medvqa-select (validation split)")
    for column in ("grid", "winner", "criterion", "score", "tie-breaker", "not eligible"):
        table.add_column(column)
    for s in selections:
        winner = s.winner
        score, tie = winner.score if winner else (math.nan, math.nan)
        table.add_row(
            s.name,
            escape(winner.label()) if winner else "[red]none[/red]",
            s.criterion[0],
            f"{score:.4f}",
            f"{tie:.4f}",
            str(sum(c.reason is not None for c in s.candidates)),
        )
    console.print(table)
    for path in written:
        console.print(f"  {path}")
    missing = [s.name for s in selections if s.winner is None]
    if missing:
        console.print(f"[red]no setting could win in {', '.join(missing)}: nothing written[/red]")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
