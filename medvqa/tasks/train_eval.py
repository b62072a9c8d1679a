"""`task=train_eval`: fine-tune with the chosen method, generate, score, compute RR."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
from hydra.utils import instantiate
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig

from medvqa.data.datamodule import VQADataModule
from medvqa.evaluation.baselines import chance_scores
from medvqa.evaluation.evaluate import deltas, evaluate, prefixed, split_metrics
from medvqa.evaluation.scoring import build_metrics, paired_delta_intervals
from medvqa.models.adapters import apply_method, build_adapter_config
from medvqa.models.loading import load_vlm, roles
from medvqa.models.saving import save_trainable
from medvqa.provenance import add_metrics, add_model
from medvqa.tasks.common import prepare_splits, report_run
from medvqa.tracking import instantiate_group
from medvqa.training.hardware import check_trainer
from medvqa.training.module import VQAModule

log = logging.getLogger(__name__)

TRAINED_DIR = "trained"
REFERENCES = {"zero_shot": "zero-shot base", "chance": "chance (1/k)"}


def train_eval(
    cfg: DictConfig,
    out_dir: Path,
    loggers: Sequence[Logger] = (),
    eval_splits: Sequence[str] = ("test_iid", "test_ood"),
    references: Sequence[str] = ("zero_shot", "chance"),
    provenance: MutableMapping[str, Any] | None = None,
) -> dict[str, float]:
    """Splits -> (reference rows) -> method applied -> fit -> generate -> score -> report.

    `references` adds the untuned base (`zero_shot`) and `chance` rows so the run's numbers have context.
    """
    unknown = [r for r in references if r not in REFERENCES]
    if unknown:
        raise ValueError(f"task.references: unknown {unknown}; choose from {list(REFERENCES)}")
    if cfg.peft.fit:
        check_trainer(cfg.trainer)  # before any data or model is loaded
    L.seed_everything(int(cfg.seed), workers=True, verbose=False)
    roles_ = roles(cfg.model)
    build_adapter_config(cfg.peft.adapter, cfg.peft.adapter_scope, roles_)  # fail fast on typos

    scorers = build_metrics(cfg.metric)  # a bad metric option fails before any data or model
    add_metrics(provenance, scorers)
    source, splits = prepare_splits(cfg, out_dir, images=True, provenance=provenance)
    frames = {s: splits[s] for s in eval_splits}

    model, processor = load_vlm(cfg.model)
    add_model(provenance, model)
    run_eval = partial(
        evaluate,
        processor=processor,
        source=source,
        frames=frames,
        metrics=scorers,
        evaluation_cfg=cfg.evaluation,
        batch_size=int(cfg.data.eval_batch_size),
        max_new_tokens=int(cfg.model.max_new_tokens),
    )
    eval_image = str(cfg.data.eval_image)
    metrics: dict[str, float] = {}
    rows = [(cfg.label or cfg.peft.label or cfg.peft.name, "")]
    if "zero_shot" in references and cfg.peft.fit:
        zero_shot, _ = run_eval(
            model, out_path=out_dir / "predictions_zero_shot.jsonl", image_mode=eval_image
        )
        metrics.update(prefixed("zero_shot/", zero_shot))
        rows.append((REFERENCES["zero_shot"], "zero_shot/"))
    if "chance" in references:
        metrics.update(prefixed("chance/", split_metrics(chance_scores(frames), cfg.evaluation)))
        rows.append((REFERENCES["chance"], "chance/"))

    model = apply_method(model, cfg.peft, roles_, processor)
    if cfg.peft.fit:
        module = VQAModule(
            model,
            lr=cfg.peft.lr,
            weight_decay=cfg.peft.weight_decay,
            warmup_ratio=cfg.peft.warmup_ratio,
        )
        datamodule = VQADataModule(
            splits.frames,
            source,
            processor,
            batch_size=int(cfg.data.batch_size),
            eval_batch_size=int(cfg.data.eval_batch_size),
            num_workers=int(cfg.data.num_workers),
            seed=int(cfg.seed),
            image_mode=str(cfg.data.train_image),
        )
        trainer: L.Trainer = instantiate(
            cfg.trainer,
            logger=list(loggers) or False,
            callbacks=instantiate_group(cfg.callbacks),
            default_root_dir=str(out_dir),
        )
        trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.ckpt_path)
        metrics["train/global_step"] = float(trainer.global_step)
        save_trainable(model, out_dir / TRAINED_DIR, cfg.peft.name)

    results, predictions = run_eval(
        model, out_path=out_dir / "predictions.jsonl", image_mode=eval_image
    )
    metrics.update(results)
    for mode in cfg.data.extra_eval_images:  # e.g. the blind ablation: Δ = sighted − blank
        other, other_scored = run_eval(
            model, out_path=out_dir / f"predictions_{mode}.jsonl", image_mode=mode
        )
        metrics.update(prefixed(f"{mode}/", other))
        metrics.update(deltas(results, other, prefix=f"delta_{mode}/"))
        metrics.update(
            paired_delta_intervals(
                predictions, other_scored, scorers, cfg.evaluation, prefix=f"delta_{mode}/"
            )
        )
        rows.append((f"{rows[0][0]}, {mode} image", f"{mode}/"))

    report_run(cfg, out_dir, loggers, metrics, rows, predictions)
    return metrics
