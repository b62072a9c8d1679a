"""`task=train_eval`: fine-tune with the chosen method, generate, score, compute RR."""

from __future__ import annotations

import logging
from collections.abc import Callable, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import pandas as pd
import torch
from hydra.utils import get_class, instantiate
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig

from medvqa import measure
from medvqa.analysis.explorer import run_rows
from medvqa.analysis.methods import REFERENCES as AGGREGATED_REFERENCES
from medvqa.analysis.methods import method_name
from medvqa.cluster import GPU_ACCELERATORS
from medvqa.data import records as R
from medvqa.distributed import is_global_zero
from medvqa.generation.lengths import generation_length
from medvqa.generation.passes import (
    CHANCE,
    RECORD_KEY,
    EvalPass,
    Job,
    check_passes,
    generation_groups,
    job_passes,
    main_label,
    report_rows,
)
from medvqa.generation.predict import PassFiles, generate_passes, prediction_trainer
from medvqa.generation.served import ServedEndpoint, answer_pass
from medvqa.interrupts import stage
from medvqa.models.adapters import (
    apply_method,
    build_adapter_config,
    checkpoint_every,
    compiled_decoder_layers,
    compiles_layers,
    decoder_layers,
    enable_gradient_checkpointing,
)
from medvqa.models.flops import fit_rates
from medvqa.models.fp8 import fp8_frozen_weights
from medvqa.models.loading import load_vlm, roles
from medvqa.models.saving import (
    TRAINED_DIR,
    load_trainable,
    rows_digest,
    save_trainable,
    trained_before,
    verify_weights,
    weights_fingerprint,
)
from medvqa.planning.memory import Setup, checkpointing_label
from medvqa.planning.setup import eval_batch_size, uses_fp8
from medvqa.provenance import add_metrics, add_model, add_trained
from medvqa.record import config_fingerprint
from medvqa.scoring.baselines import chance_scores
from medvqa.scoring.pipeline import (
    Scoring,
    ci_columns,
    prefixed,
    scores_path,
    split_metrics,
    write_scores,
)
from medvqa.tasks.common import TRAIN, prepare_splits, report_run
from medvqa.tasks.from_run import check_unseen
from medvqa.tasks.generation import from_config as generation_settings
from medvqa.tasks.plan import check_fits
from medvqa.tracking import instantiate_group
from medvqa.training.checkpoints import AtomicCheckpointIO, set_aside_stale
from medvqa.training.datamodule import VQADataModule
from medvqa.training.hardware import check_precision, check_trainer
from medvqa.training.module import SampleCounter, VQAModule
from medvqa.training.progress import FitProgress
from medvqa.training.strategies import is_deepspeed, resident
from medvqa.views import score_job

log = logging.getLogger(__name__)

# The reference rows `task.references` adds, those the report places (analysis.methods);
# each is named as the report names it, by the label of the method it is (peft=none, random).
REFERENCES = tuple(prefix.rstrip("/") for prefix in AGGREGATED_REFERENCES)


def reference_label(name: str) -> str:
    """A reference row's name in summary.md, the same as in the report ("No Finetune")."""
    return method_name(AGGREGATED_REFERENCES[f"{name}/"])


# Under paths.cache_dir: answers of the untuned base, shared by the jobs of a sweep.
SHARED_PREDICTIONS = "predictions"


def check_model_for_data(cfg: DictConfig) -> None:
    """Refuse an offline toy model (one with a `builder`) on a real dataset, before anything is
    loaded: a random 0.5M-parameter LLaVA fine-tuned on SLAKE gives rows that look like results."""
    dataset = get_class(str(cfg.dataset._target_))
    if cfg.model.get("builder") is None or not getattr(dataset, "real", True):
        return
    if cfg.allow_toy_model:
        log.warning("model %s is an offline toy model; allowed on %s", cfg.model.name, dataset.name)
        return
    raise ValueError(
        f"model={cfg.model.name} is an offline toy model (built by {cfg.model.builder._target_}) "
        f"and dataset={dataset.name} is real data: its numbers would look like results. Pick a "
        "real model (e.g. model=llava_med, as sweep=sure_study does), or set allow_toy_model=true "
        "for a pipeline check (debug=smoke sets it)."
    )


def train_eval(
    cfg: DictConfig,
    out_dir: Path,
    loggers: Sequence[Logger] = (),
    provenance: MutableMapping[str, Any] | None = None,
    *,
    eval_splits: Sequence[str],
    references: Sequence[str],
    check_memory: bool,
    from_run: str | None = None,
    allow_seen_rows: bool = False,
) -> dict[str, float]:
    """Splits -> (reference rows) -> method applied -> fit -> generate -> score -> report.

    `references` adds the untuned base (`zero_shot`) and `chance` rows so the run's numbers have
    context. With `from_run` (a finished run's directory: `task=eval`) the weights that run
    trained are loaded instead of fitted, on the run's own splits or on splits none of whose
    test rows they trained on (`from_run.check_unseen`; `allow_seen_rows` evaluates them
    anyway). Every rank fits and generates its shard; global rank 0 scores, writes and reports
    (the other ranks return no metrics).
    """
    trained = None if from_run is None else Path(from_run) / TRAINED_DIR
    fit = bool(cfg.peft.fit) and trained is None
    tuned = fit or trained is not None
    measure.reset()  # this job's phases (a local multirun runs its jobs in one process)
    planned, plan_metrics = _checks(cfg, references, fit, tuned, check_memory)
    reused = _reusable_weights(cfg, out_dir, fit)  # checked before any data or model work
    L.seed_everything(int(cfg.seed), workers=True, verbose=False)
    roles_ = roles(cfg.model)
    build_adapter_config(cfg.peft.adapter, cfg.peft.adapter_scope, roles_)  # fail fast on typos
    prompt = instantiate(cfg.prompt)  # one template for training and generation
    callbacks = instantiate_group(cfg.callbacks) if fit else []
    base_label = reference_label("zero_shot") if "zero_shot" in references else None
    job = Job(cfg, main_label(cfg), tuned, base_label)
    passes = job_passes(job)
    if provenance is not None:  # what the job generates, as the report reads it back
        provenance[RECORD_KEY] = [p.record() for p in passes]

    # Built first: a bad metric option fails before any data or model is loaded.
    with Scoring.from_config(cfg.metric, cfg.evaluation) as scoring:
        add_metrics(provenance, scoring.families)
        source, splits, frames = _evaluated_splits(cfg, out_dir, eval_splits, provenance)
        check_passes(passes, frames, job)  # what they need of the rows, before the model loads
        if from_run is not None:  # before the model: rows the weights trained on are refused
            check_unseen(
                cfg, from_run, source.name, splits.frames, eval_splits, allow_seen_rows, provenance
            )
        if cfg.model.get("served") is not None:  # behind an endpoint: asked, never loaded
            answers = _served(cfg, source, frames, prompt, out_dir, provenance)(passes)
            global_step = None
        else:
            model, processor, generate = _loaded(
                cfg, source, frames, prompt, planned, out_dir, provenance
            )
            answers = generate(model, [p for p in passes if p.base])  # the untuned base
            model = _with_method(cfg, model, roles_, processor)
            global_step = _weights(
                cfg, model, roles_, processor, splits, source, prompt, out_dir, loggers,
                callbacks, planned, fit, trained, reused, provenance,
            )  # fmt: skip
            answers |= generate(model, [p for p in passes if not p.base])
        if not is_global_zero():
            return {}  # rank 0 scores and reports

        metrics: dict[str, float] = dict(plan_metrics)
        if global_step is not None:
            metrics["train/global_step"] = float(global_step)
        with measure.measured("score"):
            scored = _score(cfg, scoring, passes, answers, frames, references, out_dir, metrics)
        metrics.update(measure.metrics())
        rows = report_rows(passes, reference_label("chance") if "chance" in references else None)
        headlines = (cfg.evaluation.primary_closed, cfg.evaluation.primary_open)
        table = run_rows(scored, headlines, ci_columns(scoring.families), cfg.shift.get("field"))
        report_run(cfg, out_dir, loggers, metrics, rows, table, source)
        return metrics


def _loaded(
    cfg: DictConfig,
    source: Any,
    frames: dict[str, pd.DataFrame],
    prompt: Any,
    planned: Setup | None,
    out_dir: Path,
    provenance: MutableMapping[str, Any] | None,
) -> tuple[torch.nn.Module, Any, Callable[[torch.nn.Module, Sequence[EvalPass]], dict[str, Any]]]:
    """The model and processor, loaded once (timed, and recorded in the provenance), and the
    job's generation (`_generator`): the untuned base answers before the method is applied,
    the tuned model after, with the same settings."""
    with measure.measured("load"):
        model, processor = load_vlm(cfg.model)
    add_model(provenance, model)
    generate = _generator(
        cfg, model, processor, source, frames, prompt, planned, out_dir, provenance
    )
    return model, processor, generate


def _with_method(
    cfg: DictConfig, model: torch.nn.Module, roles_: Any, processor: Any
) -> torch.nn.Module:
    """`model` with the job's method applied (`apply_method`), trained on images where the
    training rows show them; its trainable weights in float32, but in the base's dtype under
    DeepSpeed, whose optimizer keeps its own float32 copy."""
    return apply_method(
        model,
        cfg.peft,
        roles_,
        processor,
        images=str(cfg.data.train_image) != "none",
        trainable_dtype=None if is_deepspeed(cfg.trainer.strategy) else torch.float32,
    )


def _checks(
    cfg: DictConfig, references: Sequence[str], fit: bool, tuned: bool, check_memory: bool
) -> tuple[Setup | None, dict[str, float]]:
    """What can be refused before any data or model is loaded; the memory plan's setup where it
    ran (a fit on CUDA GPUs with `check_memory`: the layout `auto` picks, whether generation
    merges) and its estimates, recorded beside the measured peaks."""
    unknown = [r for r in references if r not in REFERENCES]
    if unknown:
        raise ValueError(f"task.references: unknown {unknown}; choose from {list(REFERENCES)}")
    check_model_for_data(cfg)
    if tuned:
        check_trainer(cfg.trainer)
        check_precision(cfg.trainer, cfg.model)
    if not (fit and check_memory and str(cfg.trainer.accelerator) in GPU_ACCELERATORS):
        return None, {}
    with measure.measured("plan"):  # the memory plan (task=plan) says it fits these GPUs
        return check_fits(cfg)


def _evaluated_splits(
    cfg: DictConfig,
    out_dir: Path,
    eval_splits: Sequence[str],
    provenance: MutableMapping[str, Any] | None,
) -> tuple[Any, Any, dict[str, pd.DataFrame]]:
    """The source, the job's splits and the evaluated ones."""
    with measure.measured("data"):  # the table, the shift, every image checked
        source, splits = prepare_splits(cfg, out_dir, images=True, provenance=provenance)
    return source, splits, {s: splits[s] for s in eval_splits}


def _generator(
    cfg: DictConfig,
    model: torch.nn.Module,
    processor: Any,
    source: Any,
    frames: dict[str, pd.DataFrame],
    prompt: Any,
    planned: Setup | None,
    out_dir: Path,
    provenance: MutableMapping[str, Any] | None,
) -> Callable[[torch.nn.Module, Sequence[EvalPass]], dict[str, Any]]:
    """Generation of evaluation passes with the job's settings (resolved here, once, and
    recorded), one predict Trainer for all: passes that show the same images are generated
    together (`passes.generation_groups`); their answers by metric prefix (None on ranks other
    than 0)."""
    settings = generation_settings(cfg, model, processor, source, planned)
    if provenance is not None:
        provenance["generation"] = settings.record()
    trainer = prediction_trainer(cfg.trainer)
    shared = Path(cfg.paths.cache_dir) / SHARED_PREDICTIONS

    def files(p: EvalPass) -> PassFiles:
        return _pass_files(p, frames, out_dir, shared)

    def run(model: torch.nn.Module, passes: Sequence[EvalPass]) -> dict[str, Any]:
        answers: dict[str, Any] = {}
        model_id = weights_fingerprint(model)  # once for every group: it reads every tensor
        for group in generation_groups(passes):
            out = generate_passes(
                model,
                processor,
                source,
                [files(p) for p in group],
                settings,
                trainer=trainer,
                trainer_cfg=cfg.trainer,
                image_mode=group[0].image_mode,
                num_workers=cfg.data.num_workers,
                prompt=prompt,
                mismatch_field=str(cfg.data.mismatch_field),
                model_id=model_id,
                image_change=group[0].image_change(source),
            )
            answers |= {p.prefix: None if out is None else out[i] for i, p in enumerate(group)}
        return answers

    return run


def _pass_files(
    p: EvalPass, frames: dict[str, pd.DataFrame], out_dir: Path, shared: Path | None
) -> PassFiles:
    """A pass's rows (as it asks them: other candidates' order, ...) and files."""
    rows = {s: p.rows(f) for s, f in frames.items()}
    return PassFiles(rows, p.path(out_dir), shared if p.shared else None)


def _served(
    cfg: DictConfig,
    source: Any,
    frames: dict[str, pd.DataFrame],
    prompt: Any,
    out_dir: Path,
    provenance: MutableMapping[str, Any] | None,
) -> Callable[[Sequence[EvalPass]], dict[str, Any]]:
    """`model=served`: every pass asked of the endpoint (`generation.served`), with the
    protocol's answer length; its settings recorded where a loaded model's are."""
    endpoint = ServedEndpoint.from_config(cfg.model.served, generation_length(cfg.model, source))
    if provenance is not None:
        provenance["generation"] = endpoint.record()
        provenance["model"] = {"served": endpoint.record()["served"]}
        provenance["model"]["weights_fingerprint"] = endpoint.identity()

    def run(passes: Sequence[EvalPass]) -> dict[str, Any]:
        answers = {}
        for p in passes:
            files = _pass_files(p, frames, out_dir, None)
            answers[p.prefix] = answer_pass(
                endpoint,
                source,
                files.frames,
                files.out_path,
                image_mode=p.image_mode,
                prompt=prompt,
                mismatch_field=str(cfg.data.mismatch_field),
                image_change=p.image_change(source),
            )
        return answers

    return run


def _weights(
    cfg: DictConfig,
    model: torch.nn.Module,
    roles_: Any,
    processor: Any,
    splits: Any,
    source: Any,
    prompt: Any,
    out_dir: Path,
    loggers: Sequence[Logger],
    callbacks: list[L.Callback],
    planned: Setup | None,
    fit: bool,
    trained: Path | None,
    previous: dict[str, Any] | None,
    provenance: MutableMapping[str, Any] | None,
) -> int | None:
    """The method's weights into `model`: this run directory's own from an attempt that trained
    to the end (`previous`, its manifest: the record is `incomplete`, or the job died while
    generating or scoring: reused, not trained again), another run's (`trained`: task=eval), or
    a fit; the optimiser steps, None where nothing was fitted (a method without training,
    task=eval)."""
    global_step, manifest = None, previous
    if previous is not None:
        log.info(
            "reusing the weights this run trained before (%s, step %d); force=true trains again",
            out_dir / TRAINED_DIR,
            previous["global_step"],
        )
        load_trainable(model, out_dir / TRAINED_DIR, cfg.peft.name)
        global_step = int(previous["global_step"])
    elif fit:
        global_step = _fit(
            cfg, model, roles_, processor, splits.frames, source, prompt, out_dir, loggers,
            callbacks, planned,
        )  # fmt: skip
        if is_global_zero():
            manifest = save_trainable(
                model,
                out_dir / TRAINED_DIR,
                cfg.peft.name,
                config_fingerprint(cfg),
                global_step,
                rows_digest(splits.frames[TRAIN][R.ID]),
            )
    elif trained is not None:
        load_trainable(model, trained, cfg.peft.name)
    add_trained(provenance, manifest)
    return global_step


def _reusable_weights(cfg: DictConfig, out_dir: Path, fit: bool) -> dict[str, Any] | None:
    """The manifest of weights this run directory trained to the end for this config, checked
    against their size and SHA-256 (a damaged file is refused, naming it), else None."""
    if not fit or cfg.force:
        return None
    previous = trained_before(out_dir / TRAINED_DIR, config_fingerprint(cfg))
    if previous is not None:
        verify_weights(
            out_dir / TRAINED_DIR,
            previous,
            f"reusing the weights {out_dir} trained before",
            "Restore them, or train again with force=true.",
        )
    return previous


def _score(
    cfg: DictConfig,
    scoring: Scoring,
    passes: Sequence[EvalPass],
    answers: dict[str, Any],
    frames: dict[str, pd.DataFrame],
    references: Sequence[str],
    out_dir: Path,
    metrics: dict[str, float],
) -> dict[str, pd.DataFrame]:
    """Score every pass and run the views (`views.score_job`, as `medvqa-score` does), the
    chance row where asked; each scored table written once. Adds to `metrics`; returns the
    scored tables by metric prefix."""
    figures, scored = score_job(scoring, {p.prefix: answers[p.prefix] for p in passes}, passes)
    metrics.update(figures)
    if "chance" in references:
        metrics.update(prefixed(CHANCE, split_metrics(chance_scores(frames), cfg.evaluation)))
    for p in passes:  # the views' per-sample columns are in the main table
        write_scores(scored[p.prefix], scores_path(p.path(out_dir)))
    return scored


def _fit(
    cfg: DictConfig,
    model: torch.nn.Module,
    roles_: Any,
    processor: Any,
    frames: Any,
    source: Any,
    prompt: Any,
    out_dir: Path,
    loggers: Sequence[Logger],
    callbacks: list[L.Callback],
    planned: Setup | None = None,
) -> int:
    """Fine-tune `model` in place (resuming from `cfg.ckpt_path`); returns the optimiser steps.
    `callbacks`: `cfg.callbacks`, built before any data or model work (a bad one fails first).
    `planned`: the setup the memory plan chose (None: it did not run)."""
    every = checkpoint_every(cfg.model.gradient_checkpointing)
    batch_size, accumulate = int(cfg.data.batch_size), int(cfg.trainer.accumulate_grad_batches)
    if every is None:  # auto: the plan's layout, or every layer where no plan ran
        every = 1 if planned is None else planned.checkpoint_every
        if planned is not None:
            batch_size, accumulate = planned.micro_batch, planned.accumulate
        log.info(
            "auto layout: micro-batch %d x %d accumulation per GPU (data.batch_size x "
            "trainer.accumulate_grad_batches = %d x %d), checkpointing %s",
            batch_size,
            accumulate,
            cfg.data.batch_size,
            cfg.trainer.accumulate_grad_batches,
            checkpointing_label(every),
        )
    if every:
        enable_gradient_checkpointing(model, every_n_layers=every)
    module = VQAModule.for_method(model, cfg.peft, roles_["projector"])
    datamodule = VQADataModule(
        frames,
        source,
        processor,
        batch_size=batch_size,
        # Validation runs inside the fit, beside the optimiser's state: not at the batch the plan
        # sized for generation after it (auto: `AUTO_EVAL_BATCH`).
        eval_batch_size=eval_batch_size(cfg.data, None),
        num_workers=cfg.data.num_workers,
        seed=int(cfg.seed),
        image_mode=str(cfg.data.train_image),
        prompt=prompt,
        mismatch_field=str(cfg.data.mismatch_field),
    )
    if is_global_zero():
        set_aside_stale(callbacks, cfg.ckpt_path)
    trainer: L.Trainer = instantiate(
        cfg.trainer,
        strategy=resident(
            cfg.trainer.strategy,
            cfg.trainer.accelerator,
            cfg.trainer.devices,
            cfg.trainer.num_nodes,
        ),
        accumulate_grad_batches=accumulate,
        logger=list(loggers) or False,
        callbacks=callbacks,
        default_root_dir=str(out_dir),
        plugins=[AtomicCheckpointIO()],  # DeepSpeed writes its own (atomically: strategies.py)
    )
    compiled = compiles_layers(cfg.model, cfg.trainer.accelerator)
    fp8 = uses_fp8(cfg.model, cfg.trainer.accelerator)
    with (
        stage("fit", trainer),
        measure.measured("fit", "samples") as phase,
        fp8_frozen_weights(model, fp8, roots=list(decoder_layers(model))) as fp8_layers,
        compiled_decoder_layers(model, compiled, fallback=cfg.model.compile_layers == "auto"),
    ):
        trainer.callbacks += [SampleCounter(phase), FitProgress()]
        trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.ckpt_path)
    rates = fit_rates(model, roles_, phase, trainer.world_size)
    measure.note("fit", {**rates, "compiled_layers": compiled, "fp8_layers": fp8_layers})
    return int(trainer.global_step)
