"""``medvqa-rater``: the human rater study's command line (docs/rater_study.md): ``export`` a
rating sheet from a run, then ``analyze`` the filled sheets against the metrics. The work is
done in `medvqa.analysis.rater`; this module only parses arguments and prints a summary."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path

from medvqa.analysis.rater.analysis import analyze
from medvqa.analysis.rater.export import export
from medvqa.analysis.rater.study import SHEET_CSV, SHEET_HTML, RatingError
from medvqa.atomic import OutputDirError, restrict_umask
from medvqa.cli.refusal import REFUSALS, refused
from medvqa.console import console as console_for_output
from medvqa.console import rich_logging
from medvqa.scoring.pipeline import SCORES_FILE

log = logging.getLogger(__name__)

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="medvqa-rater", description="Human rater study: export a sheet, correlate ratings."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="sample open, non-exact predictions for rating")
    ex.add_argument(
        "predictions",
        type=Path,
        help=f"a run directory (its {SCORES_FILE}), a scores .parquet or a predictions JSONL",
    )
    ex.add_argument("--n", type=int, default=50, help="items to sample (default 50)")
    ex.add_argument("--seed", type=int, default=0)
    ex.add_argument("--split", default=None, help="only this split, e.g. test_iid")
    ex.add_argument("--out", type=Path, required=True, help="directory for the sheet and items")
    ex.add_argument(
        "--judge-column",
        action="append",
        default=None,
        help="predictions field holding a judge score (repeatable; default: judge_score if present)",
    )
    ex.add_argument(
        "--no-text-metrics", action="store_true", help="skip ROUGE/chrF++/BLEU-4/METEOR"
    )
    ex.add_argument(
        "--embedding", action="store_true", help="add the embedding cosine (loads MiniLM)"
    )
    an = sub.add_parser("analyze", help="correlate filled rating sheets with the metrics")
    an.add_argument("directory", type=Path, help="the export directory (holds items.jsonl)")
    an.add_argument("--ratings", type=Path, nargs="+", required=True, help="filled sheets (CSV)")
    an.add_argument("--out", type=Path, required=True, help="directory for tables and figures")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``medvqa-rater``; returns the exit status (2 for unusable input)."""
    from rich.table import Table

    rich_logging()
    restrict_umask()  # nothing it writes is group- or world-writable (docs/security.md)
    args = _parser().parse_args(argv)
    console = console_for_output()
    try:
        if args.command == "export":
            items = export(
                args.predictions,
                args.out,
                n=args.n,
                seed=args.seed,
                split=args.split,
                judge_columns=args.judge_column,
                text_metrics=not args.no_text_metrics,
                embedding=args.embedding,
            )
            console.print(
                f"Exported {len(items)} item(s) to {args.out}: send raters {SHEET_HTML} "
                f"(or {SHEET_CSV}), then run `medvqa-rater analyze {args.out} --ratings ...`"
            )
        else:
            table = analyze(args.directory, args.ratings, args.out)
            shown = table.loc[table["kind"].isin(["human_vs_metric", "rater_pairs_mean"])]
            summary = Table(title=f"Human vs metric (details in {args.out})")
            for column in ("a", "b", "kendall_tau_b", "spearman_rho", "n"):
                summary.add_column(column)
            for row in shown.itertuples(index=False):
                summary.add_row(
                    row.a,
                    row.b,
                    f"{row.kendall_tau_b:.3f}",
                    f"{row.spearman_rho:.3f}",
                    f"{row.n:.0f}",
                )
            console.print(summary)
    except (RatingError, OutputDirError, *REFUSALS) as err:
        return refused("medvqa-rater", err)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
