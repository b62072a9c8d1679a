"""`medvqa-score`: score a predictions file (medvqa, SURE-VQA, lmms-eval, VLMEvalKit, LLaVA's
answers with their question file, or a table; `medvqa.evaluation.readers`) with the selected
metric families, breakdowns and intervals, as a run would."""

from __future__ import annotations

import argparse
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, OmegaConf, open_dict

from medvqa import CONF_DIR
from medvqa.atomic import OutputDirError, staged_dir
from medvqa.config import ConfigError, check_config, check_judge_config
from medvqa.evaluation.generation import SPLIT
from medvqa.evaluation.readers import READERS, ScoreInputError, read
from medvqa.evaluation.scoring import SCORES_FILE, Scoring, failed_items
from medvqa.provenance import add_metrics, environment
from medvqa.record import RunRecord

log = logging.getLogger(__name__)

SUMMARY = "summary.md"


def compose(overrides: Sequence[str], out_dir: Path) -> DictConfig:
    """The run config with the given overrides, composed from conf/ as run.py does, with
    `out_dir` as the output directory (paths such as the judge cache resolve as in a run)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

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
) -> dict[str, float]:
    """Score a predictions file; write results.json, scores.parquet and summary.md to out_dir.
    `questions`: the question file a LLaVA answers file was made from (its ground truth)."""
    out_dir = Path(out_dir)
    cfg = compose(overrides, out_dir)
    check_judge_config(cfg)  # its settings are recorded even without the judge metric
    # Sizes and levels as a run checks them; the file, not a dataset, has the columns, so a
    # breakdown field it lacks is skipped below with a warning instead.
    check_config(cfg, fields=False)
    frame, fmt = read(Path(predictions), fmt, questions)
    # Built before anything is written: a bad metric option leaves no files behind. Written
    # into a hidden sibling and swapped in whole: a rescoring killed midway leaves the earlier
    # one as it was.
    with (
        Scoring.from_config(cfg.metric, cfg.evaluation) as scoring,
        staged_dir(out_dir, "medvqa-score") as staging,
    ):
        breakdown = [f for f in cfg.evaluation.breakdown if f in frame]
        skipped = [f for f in cfg.evaluation.breakdown if f not in frame]
        if skipped:
            log.warning("%s has no column(s) %s: no breakdown by them", predictions, skipped)
        settings = OmegaConf.create(
            {
                "seed": int(cfg.seed),
                "predictions": str(Path(predictions).resolve()),
                "questions": None if questions is None else str(Path(questions).resolve()),
                "format": fmt,
                **{
                    key: OmegaConf.to_container(cfg[key], resolve=True)
                    for key in ("metric", "evaluation", "judge")
                },
            }
        )
        record = RunRecord(staging, settings, choices={"format": fmt})
        record.provenance = environment()
        add_metrics(record.provenance, scoring.families)
        by_split = {str(split): rows for split, rows in frame.groupby(SPLIT, sort=False)}
        metrics, _ = scoring.score(by_split, staging / SCORES_FILE, breakdown)
        record.finish(metrics, failed_items(metrics))
        _summary(metrics, list(by_split), cfg, staging)
    return metrics


def _summary(metrics: dict[str, float], splits: list[str], cfg: DictConfig, out_dir: Path) -> None:
    """Per split: n and the primary closed and open scores (summary.md and the terminal)."""
    from rich.console import Console
    from rich.table import Table

    primary = (str(cfg.evaluation.primary_closed), str(cfg.evaluation.primary_open))
    rows = [
        {
            "split": split,
            "n": metrics.get(f"{split}/n", math.nan),
            **{key: metrics.get(f"{split}/{key}", math.nan) for key in primary},
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
    Console().print(view)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `medvqa-score`; exit status 2 for a file that cannot be scored or an
    override that cannot work."""
    from rich.logging import RichHandler

    logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=[RichHandler()])
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
    parser.add_argument("overrides", nargs="*", help="config overrides (metric=..., ...)")
    args = parser.parse_intermixed_args(argv)
    try:
        score_file(args.predictions, args.out, args.format, args.overrides, args.questions)
    except (ScoreInputError, ConfigError, OutputDirError) as err:
        log.error("%s", err)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
