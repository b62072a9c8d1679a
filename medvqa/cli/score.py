"""`medvqa-score`: score a predictions file (medvqa, SURE-VQA, lmms-eval, VLMEvalKit, LLaVA's
answers with their question file, or a table; `medvqa.peers.readers`) with the selected
metric families, breakdowns and intervals, as a run would."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf, open_dict

from medvqa import CONF_DIR
from medvqa.atomic import OutputDirError, restrict_umask, staged_dir
from medvqa.cli.refusal import refused
from medvqa.console import console as console_for_output
from medvqa.console import rich_logging
from medvqa.data.records import SPLIT
from medvqa.errors import ConfigError
from medvqa.generation.passes import RECORD_KEY, EvalPass, ImageMode, Main, OptionOrder
from medvqa.judge.errors import JudgeConfigError
from medvqa.peers.prediction_files import limit_option
from medvqa.peers.readers import READERS, ReadLimits, ScoreInputError, read
from medvqa.record import RunRecord
from medvqa.views.reliance import COUNTERFACTUAL_MODES

# The config (its plug-in discovery imports every dataset and metric module), scoring and the
# views are imported in `score_file`: `medvqa-score --help` and a refused argument answer at once.

log = logging.getLogger(__name__)

SUMMARY = "summary.md"
# The read limits (`ReadLimits`' fields), as each option's help names them.
LIMIT_HELP = {
    "max_rows": "rows (a CSV's, TSV's or sheet's header included)",
    "max_bytes": "bytes (the file's, or what a workbook or Parquet file unpacks to)",
    "max_cells": "cells (rows x columns)",
    "max_cell_chars": "characters in one cell",
}


def compose(overrides: Sequence[str], out_dir: Path) -> DictConfig:
    """The run config with the given overrides, composed from conf/ as run.py does, with
    `out_dir` as the output directory (paths such as the judge cache resolve as in a run)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    import medvqa.config  # noqa: F401  (its schemas and resolvers, before composing)

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose("config", overrides=list(overrides), return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(out_dir.resolve())
        cfg.hydra.runtime.cwd = os.getcwd()
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def score_file(
    predictions: Path,
    out_dir: Path,
    fmt: str = "auto",
    overrides: Sequence[str] = (),
    questions: Path | None = None,
    image_modes: Mapping[str, Path] | None = None,
    orders: Mapping[int, Path] | None = None,
    limits: ReadLimits | None = None,
) -> dict[str, float]:
    """Score a predictions file and run the views its answers allow (`evaluation.views`, as a
    run does); write results.json, scores.parquet and summary.md to out_dir. `questions`: the
    question file a LLaVA answers file was made from (its ground truth); `image_modes`: the same
    questions answered under a counterfactual image (mode -> file: image reliance and the
    deltas); `orders`: with the closed options reordered (k -> file: option-order flips); each
    is the pass a run would have made (`generation.passes`), recorded as a run records them;
    `limits`: how far an .xlsx or .parquet file may unpack before it is refused."""
    from medvqa.config import check_config, check_judge_config
    from medvqa.provenance import add_metrics, environment
    from medvqa.scoring.pipeline import Scoring, failed_items, scores_path, write_scores
    from medvqa.views import score_job

    out_dir = Path(out_dir)
    cfg = compose(overrides, out_dir)
    check_judge_config(cfg)  # its settings are recorded even without the judge metric
    # Sizes and levels as a run checks them; the file, not a dataset, has the columns, so a
    # breakdown field it lacks is skipped below with a warning instead.
    check_config(cfg, fields=False)
    limits = limits or ReadLimits()
    frame, fmt = read(Path(predictions), fmt, questions, limits)
    unknown = sorted(set(image_modes or {}) - set(COUNTERFACTUAL_MODES))
    if unknown:
        raise ScoreInputError(
            f"--image-mode {unknown}: not a counterfactual image mode; use one of "
            f"{list(COUNTERFACTUAL_MODES)} (the file's rows answered under that image)"
        )
    passes, files = _passes(Path(predictions), image_modes or {}, orders or {})
    others = {p.prefix: files[p] for p in passes if p.prefix}
    frames = {"": frame} | {
        p: read(Path(path), fmt, questions, limits)[0] for p, path in others.items()
    }
    # Built before anything is written: a bad metric option leaves no files behind. Written
    # into a hidden sibling and swapped in whole: a rescoring killed midway leaves the earlier
    # one as it was.
    with (
        Scoring.from_config(cfg.metric, cfg.evaluation) as scoring,
        staged_dir(out_dir, "medvqa-score") as staging,
    ):
        scoring.follow_selected_headline()  # before the record takes the config
        breakdown = [f for f in cfg.evaluation.breakdown if f in frame]
        skipped = [f for f in cfg.evaluation.breakdown if f not in frame]
        if skipped:
            log.warning("%s has no column(s) %s: no breakdown by them", predictions, skipped)
        settings = _settings(cfg, Path(predictions), questions, others, fmt, limits)
        record = RunRecord(staging, settings, choices={"format": fmt}, lands_in=out_dir)
        record.provenance = environment()
        record.provenance[RECORD_KEY] = [p.record() for p in passes]
        add_metrics(record.provenance, scoring.families)
        answers = {
            prefix: {str(split): rows for split, rows in table.groupby(SPLIT, sort=False)}
            for prefix, table in frames.items()
        }
        metrics, scored = score_job(scoring, answers, passes, breakdown=breakdown)
        for p in passes:  # scores.parquet, scores_<mode>.parquet, ...
            write_scores(scored[p.prefix], scores_path(p.path(staging)))
        record.finish(metrics, failed_items(metrics))
        _summary(metrics, list(answers[""]), scoring.headline_scores(), staging)
    return metrics


def _settings(
    cfg: DictConfig,
    predictions: Path,
    questions: Path | None,
    others: Mapping[str, Path],
    fmt: str,
    limits: ReadLimits,
) -> DictConfig:
    """The record's config: the files scored (each other pass's by its prefix), how they were
    read, and the scoring's own settings, so that a rescoring can be told apart and rerun."""
    return OmegaConf.create(
        {
            "seed": int(cfg.seed),
            "predictions": str(predictions.resolve()),
            "questions": None if questions is None else str(Path(questions).resolve()),
            "also": {p: str(Path(path).resolve()) for p, path in others.items()},
            "format": fmt,
            "read_limits": dataclasses.asdict(limits),
            **{
                key: OmegaConf.to_container(cfg[key], resolve=True)
                for key in ("metric", "evaluation", "judge")
            },
        }
    )


def _passes(
    predictions: Path, image_modes: Mapping[str, Path], orders: Mapping[int, Path]
) -> tuple[list[EvalPass], dict[EvalPass, Path]]:
    """The passes the files are (the main answers, an image mode's, an option order's, as a run
    makes them) and each one's file."""
    label = predictions.name
    files: dict[EvalPass, Path] = {Main(label=label, tuned=True): predictions}
    files |= {ImageMode.after(label, image_mode=m): path for m, path in image_modes.items()}
    files |= {OptionOrder.after(label, k=k): path for k, path in orders.items()}
    return list(files), files


def _summary(
    metrics: dict[str, float], splits: list[str], scores: Sequence[str], out_dir: Path
) -> None:
    """Per split: n and the headline `scores` (`Scoring.headline_scores`) that any split has
    (summary.md and the terminal)."""
    from rich.table import Table

    shown = [s for s in scores if any(f"{split}/{s}" in metrics for split in splits)]
    rows = [
        {
            "split": split,
            "n": int(metrics.get(f"{split}/n", 0)),
            **{key: metrics.get(f"{split}/{key}", math.nan) for key in shown},
        }
        for split in splits
    ]
    table = pd.DataFrame(rows)
    (out_dir / SUMMARY).write_text(table.to_markdown(index=False, floatfmt=".3f") + "\n")
    view = Table(title=f"medvqa-score: {SUMMARY}")
    for column in table.columns:
        view.add_column(str(column))
    for row in rows:
        view.add_row(*(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()))
    console_for_output().print(view)


def _pairs(values: Sequence[str], option: str, key: Callable[[str], Any]) -> dict[Any, Path]:
    """`KEY=FILE` arguments as {key: path}."""
    out: dict[Any, Path] = {}
    for value in values:
        name, _, path = value.partition("=")
        try:
            if not path:
                raise ValueError(value)
            out[key(name)] = Path(path)
        except ValueError as err:
            example = "blank" if key is str else "1"
            raise ScoreInputError(
                f"{option} {value!r}: write it as KEY=FILE, e.g. {option} "
                f"{example}=predictions_x.jsonl"
            ) from err
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `medvqa-score`; exit status 2 for a file that cannot be scored or an
    override that cannot work."""
    rich_logging()
    restrict_umask()  # nothing it writes is group- or world-writable (docs/security.md)
    parser = argparse.ArgumentParser(
        prog="medvqa-score",
        description="Score a predictions file with medvqa's metrics, judge, breakdowns and CIs.",
        epilog="Overrides are config overrides as for run.py, e.g. 'metric=[traditional,judge]' "
        "evaluation.breakdown=[modality] judge.backend=openai judge.base_url=URL judge.model=M",
    )
    parser.add_argument("predictions", type=Path, help="the predictions file")
    parser.add_argument("--out", type=Path, required=True, help="directory for the results")
    parser.add_argument("--format", default="auto", choices=["auto", *READERS])
    parser.add_argument(
        "--questions",
        type=Path,
        default=None,
        help="the question file a LLaVA/LLaVA-Med model_vqa.py answers file was made from "
        "(it holds the ground truth; joined on question_id)",
    )
    parser.add_argument(
        "--image-mode",
        action="append",
        default=[],
        metavar="MODE=FILE",
        help="the same questions answered under a counterfactual image (blank, none, shuffled, "
        "mismatched; a run's predictions_<mode>.jsonl): image reliance and the deltas",
    )
    parser.add_argument(
        "--order",
        action="append",
        default=[],
        metavar="K=FILE",
        help="the same questions with their closed options reordered (a run's "
        "predictions_order<k>.jsonl): option-order flips",
    )
    for name, what in LIMIT_HELP.items():
        parser.add_argument(
            limit_option(name),
            type=int,
            default=getattr(ReadLimits, name),
            help=f"refuse a file (any format) with more {what}, before it is parsed where its "
            "format allows (default %(default)s)",
        )
    parser.add_argument("overrides", nargs="*", help="config overrides (metric=..., ...)")
    args = parser.parse_intermixed_args(argv)
    try:
        score_file(
            args.predictions,
            args.out,
            args.format,
            args.overrides,
            args.questions,
            _pairs(args.image_mode, "--image-mode", str),
            _pairs(args.order, "--order", int),
            ReadLimits(**{name: getattr(args, name) for name in LIMIT_HELP}),
        )
    except (ScoreInputError, ConfigError, JudgeConfigError, OutputDirError) as err:
        return refused("medvqa-score", err)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
