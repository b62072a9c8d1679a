"""`medvqa-export <run dir> --out <dir> [--merged]`: a run's trained weights as a peft adapter
folder or a whole transformers checkpoint, with a model card (`medvqa.export`); the same as
`python run.py task=export eval.from_run=<run dir> task.out=<dir>`."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path

from medvqa.atomic import restrict_umask
from medvqa.cli.refusal import REFUSALS, refused
from medvqa.console import rich_logging

log = logging.getLogger(__name__)


def export_folder(
    run_dir: Path, out: Path, merged: bool = False, overrides: Sequence[str] = ()
) -> Path:
    """Compose the config as `task=export` would, adopt the run's model and method as task=eval
    does (`adopt_run`: its record, targets and weights checked), and export."""
    from medvqa.cli.score import compose
    from medvqa.export.job import export_run
    from medvqa.tasks.from_run import adopt_run

    asked = [
        "task=export",
        f"eval.from_run={Path(run_dir).resolve()}",
        f"task.out={Path(out).resolve()}",
        f"task.merged={str(bool(merged)).lower()}",
        *overrides,
    ]
    cfg = compose(asked, Path(out))
    cfg, _ = adopt_run(cfg, {}, list(overrides))
    return export_run(cfg, Path(run_dir), Path(out), merged=merged)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `medvqa-export`; exit status 2 for a run folder or an output folder that
    cannot be exported to (the message says why and what to do)."""
    rich_logging()
    restrict_umask()  # nothing it writes is group- or world-writable (docs/security.md)
    parser = argparse.ArgumentParser(
        prog="medvqa-export",
        description="Export a finished run's trained weights: a peft adapter folder (LoRA, "
        "(IA)3, prompt tuning) or, with --merged or for full fine-tuning, a whole transformers "
        "checkpoint; with a model card (README.md) written from the run's record.",
        epilog="Overrides are config overrides as for run.py, e.g. model.trust_remote_code=true "
        "(a run whose model runs its checkpoint's code) or paths.cache_dir=DIR.",
    )
    parser.add_argument("run_dir", type=Path, help="the run folder (its results.json, trained/)")
    parser.add_argument("--out", type=Path, required=True, help="the folder to write")
    parser.add_argument(
        "--merged",
        action="store_true",
        help="fold the adapter into the base: a checkpoint vLLM, SGLang or transformers loads",
    )
    parser.add_argument("overrides", nargs="*", help="config overrides")
    args = parser.parse_intermixed_args(argv)
    try:
        export_folder(args.run_dir, args.out, args.merged, args.overrides)
    except REFUSALS as err:
        return refused("medvqa-export", err)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
