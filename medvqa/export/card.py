"""The model card (`README.md`) of an export, written only from the run's record.

Hugging Face's YAML front matter (through `huggingface_hub`'s own `ModelCardData` and
`EvalResult`: `base_model`, `library_name`, `datasets`, `tags`, `pipeline_tag` and a
`model-index` with the i.i.d. and OoD headline scores and relative robustness, each with its
interval in the metric's `args`), then a body that states what the record holds: the data and
the shift, the splits (sizes and a digest of their row ids, from splits.json), the method and
its hyperparameters, the compute the run measured, the judge and its self-check, the code's
commit. A value the record lacks is written "not recorded"; nothing is looked up elsewhere.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from medvqa.data.shifts import SPLITS
from medvqa.models.prompting import VIRTUAL_TOKEN
from medvqa.models.saving import rows_digest

NOT_RECORDED = "not recorded"
IID, OOD = "test_iid", "test_ood"
# The task type of the model-index (Hugging Face's name for it).
TASK = "visual-question-answering"
# The config values the card lists for the method (beside the whole `peft` node).
TRAINING_KEYS = (
    "seed",
    "data.batch_size",
    "data.train_image",
    "trainer.max_epochs",
    "trainer.max_steps",
    "trainer.accumulate_grad_batches",
    "trainer.precision",
    "trainer.gradient_clip_val",
    "model.dtype",
)


@dataclass(frozen=True)
class ExportFacts:
    """What the export itself is (not the run): its format and what it needs to load."""

    name: str  # the folder's name: the model-index's
    merged: bool
    base: str  # the base model's hub id or path
    virtual_tokens: int  # prompt tuning's tokens before each question (0: none)


def _get(node: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _settings(value: Any) -> Any:
    """A config node without the keys that say which class builds it (how, not what)."""
    if isinstance(value, Mapping):
        return {k: _settings(v) for k, v in value.items() if not str(k).startswith("_")}
    if isinstance(value, list):
        return [_settings(v) for v in value]
    return value


def shown(value: Any) -> str:
    """A recorded value as the card writes it; "not recorded" for none."""
    value = _settings(value)
    if value is None or value == "" or value == {}:
        return NOT_RECORDED
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, Mapping | list):
        return f"`{json.dumps(value, default=str)}`"
    return str(value)


def _score(metrics: Mapping[str, Any], key: str) -> tuple[float | None, dict[str, float]]:
    """(value, its interval as `args`) of a recorded metric."""
    interval = {
        f"ci_{end}": v
        for end in ("lo", "hi")
        if (v := _number(metrics.get(f"{key}_ci_{end}"))) is not None
    }
    return _number(metrics.get(key)), interval


def headline(record: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(label, split or "robustness", metric key) of the scores the card reports: the primary
    closed and open scores on each test split, and their relative robustness."""
    config = record.get("config") or {}
    closed = _get(config, "evaluation.primary_closed") or "closed_acc"
    open_ = _get(config, "evaluation.primary_open") or "open_f1"
    out = []
    for kind, key in (("closed", closed), ("open", open_)):
        out += [
            (f"{key}, i.i.d.", IID, f"{IID}/{key}"),
            (f"{key}, OoD", OOD, f"{OOD}/{key}"),
            (f"RR {kind} ({key}, OoD / i.i.d.)", "robustness", f"robustness/rr_{kind}"),
        ]
    return out


def dataset_name(record: Mapping[str, Any]) -> str | None:
    """The dataset as the run named it (its provenance, else its config choice)."""
    return _get(record, "provenance.data.dataset") or _get(record, "choices.dataset")


def card_data(record: Mapping[str, Any], facts: ExportFacts) -> Any:
    """The YAML front matter (`huggingface_hub.ModelCardData`)."""
    from huggingface_hub import EvalResult, ModelCardData

    config = record.get("config") or {}
    metrics = record.get("metrics") or {}
    dataset = str(dataset_name(record) or "")
    shift = str(_get(config, "shift.name") or "")
    method = str(_get(config, "peft.name") or "")
    results = []
    for label, split, key in headline(record):
        value, interval = _score(metrics, key)
        if value is None:
            continue
        results.append(
            EvalResult(
                task_type=TASK,
                dataset_type=dataset or "unknown",
                dataset_name=f"{dataset} ({shift} shift)",
                dataset_split=split,
                metric_type=key.rsplit("/", 1)[-1],
                metric_name=label,
                metric_value=value,
                metric_args={**interval, "ci_level": _ci_level(config)} if interval else None,
            )
        )
    tags = ["medvqa", "medical-vqa", "vision-language", "robustness", method, f"shift-{shift}"]
    return ModelCardData(
        base_model=facts.base,
        library_name="transformers" if facts.merged else "peft",
        pipeline_tag="image-text-to-text",
        datasets=[dataset] if dataset else None,
        tags=[t for t in tags if t and not t.endswith("-")],
        model_name=facts.name,
        eval_results=results or None,
    )


def _ci_level(config: Mapping[str, Any]) -> float | None:
    return _number(_get(config, "evaluation.bootstrap.level"))


def _table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += [
        "| " + " | ".join(shown(v) if not isinstance(v, str) else v for v in r) + " |" for r in rows
    ]
    return "\n".join(lines)


def _results(record: Mapping[str, Any]) -> str:
    metrics = record.get("metrics") or {}
    rows = []
    for label, _, key in headline(record):
        value, interval = _score(metrics, key)
        ci = (
            f"[{interval['ci_lo']:.4g}, {interval['ci_hi']:.4g}]"
            if {"ci_lo", "ci_hi"} <= set(interval)
            else NOT_RECORDED
        )
        rows.append((label, shown(value), ci))
    level = _ci_level(record.get("config") or {})
    note = f"{level:.0%} case-clustered bootstrap intervals" if level else "intervals"
    return _table(rows, ("score", "value", note))


def _splits(report: Mapping[str, Any] | None) -> str:
    """Each split's size (rows, open, closed) and a digest of its row ids, from splits.json."""
    if not report:
        return f"Splits: {NOT_RECORDED} (no readable splits.json in the run folder)."
    sizes = report.get("splits") if isinstance(report.get("splits"), Mapping) else {}
    rows_by_split = report.get("rows") if isinstance(report.get("rows"), Mapping) else {}
    rows = []
    for split in SPLITS:
        size = sizes.get(split) if isinstance(sizes.get(split), Mapping) else {}
        ids = rows_by_split.get(split)
        digest = None
        if isinstance(ids, list) and all(isinstance(i, str) for i in ids):
            digest = f"`{rows_digest(ids)['sha256'][:16]}`"
        rows.append(
            (
                split,
                *(_number(size.get(k)) for k in ("n", "open", "closed")),
                digest or NOT_RECORDED,
            )
        )
    table = _table(
        [
            (s, *(shown(int(v)) if v is not None else NOT_RECORDED for v in vs), d)
            for s, *vs, d in rows
        ],
        ("split", "rows", "open", "closed", "row-id digest (SHA-256 of the sorted ids)"),
    )
    return table


def _method(record: Mapping[str, Any]) -> str:
    config = record.get("config") or {}
    trained = _get(record, "provenance.trained") or {}
    lines = [
        f"- method: {shown(_get(config, 'peft.label'))} (`peft={shown(_get(config, 'peft.name'))}`)",
        f"- method config: {shown(_get(config, 'peft'))}",
        *(f"- `{key}`: {shown(_get(config, key))}" for key in TRAINING_KEYS),
        f"- optimiser steps: {shown(trained.get('global_step'))}",
        f"- trained parameters: {shown(trained.get('n_params'))} in "
        f"{shown(trained.get('n_tensors'))} tensors",
        f"- trained rows: {shown(_get(trained, 'trained_rows.n'))} (digest "
        f"{shown(_get(trained, 'trained_rows.sha256'))})",
        f"- prompt template: {shown(_get(config, 'prompt'))}",
        f"- generation: {shown(_get(record, 'provenance.generation'))}",
    ]
    return "\n".join(lines)


def _compute(record: Mapping[str, Any]) -> str:
    perf = record.get("perf") or {}
    lines = [
        f"- device: {shown(_get(record, 'provenance.device'))}",
        f"- trainer: accelerator {shown(_get(record, 'config.trainer.accelerator'))}, devices "
        f"{shown(_get(record, 'config.trainer.devices'))}, nodes "
        f"{shown(_get(record, 'config.trainer.num_nodes'))}",
        f"- whole job: {shown(record.get('duration_s'))} s",
    ]
    measured = sorted((k, v) for k, v in perf.items() if _number(v) is not None)
    lines += [f"- `{k}`: {shown(float(v))}" for k, v in measured] or [f"- phases: {NOT_RECORDED}"]
    return "\n".join(lines)


def _judge(record: Mapping[str, Any]) -> str:
    config = record.get("config") or {}
    families = _get(config, "metric") or {}
    judges = {
        name: entry
        for name, entry in (_get(record, "provenance.metrics") or {}).items()
        if isinstance(entry, Mapping) and entry.get("judge_id")
    }
    if not judges:
        names = ", ".join(sorted(families)) if isinstance(families, Mapping) else NOT_RECORDED
        return f"No LLM judge scored this run (metric families: {names})."
    metrics = record.get("metrics") or {}
    lines = []
    for name, entry in sorted(judges.items()):
        lines.append(
            f"- `{name}`: judge {shown(entry.get('judge_id'))}, rubrics {shown(entry.get('rubrics'))}"
        )
        checks = {k: v for k, v in metrics.items() if k.startswith(f"{name}/selfcheck_")}
        lines += [f"  - `{k}`: {shown(v)}" for k, v in sorted(checks.items())] or [
            f"  - self-check: {NOT_RECORDED}"
        ]
    return "\n".join(lines)


def _code(record: Mapping[str, Any]) -> str:
    git = _get(record, "provenance.git") or {}
    dirty = {True: " (with uncommitted changes)", False: ""}.get(git.get("dirty"), "")
    return "\n".join(
        [
            f"- commit: {shown(git.get('commit'))}{dirty}",
            f"- versions: {shown(_get(record, 'provenance.versions'))}",
            f"- data fingerprint: {shown(_get(record, 'provenance.data.fingerprint'))}",
            f"- base weights fingerprint: "
            f"{shown(_get(record, 'provenance.model.weights_fingerprint'))}",
            f"- run status: {shown(record.get('status'))}, started {shown(record.get('started_at'))}",
        ]
    )


def _usage(facts: ExportFacts) -> str:
    """How to load it with transformers (and peft) alone."""
    prefix = "".join(VIRTUAL_TOKEN.format(i) for i in range(facts.virtual_tokens))
    lines = ["```python", "from transformers import AutoModelForImageTextToText, AutoProcessor"]
    if facts.merged:
        lines += [
            'model = AutoModelForImageTextToText.from_pretrained("<this folder>")',
            'processor = AutoProcessor.from_pretrained("<this folder>")',
        ]
    else:
        lines += [
            "from peft import PeftModel",
            f'base = AutoModelForImageTextToText.from_pretrained("{facts.base}")',
            'processor = AutoProcessor.from_pretrained("<this folder>")',
        ]
        if facts.virtual_tokens:
            lines.append("base.resize_token_embeddings(len(processor.tokenizer))  # virtual tokens")
        lines.append('model = PeftModel.from_pretrained(base, "<this folder>")')
    question = f'"{prefix}" + question' if prefix else "question"
    lines += [
        'messages = [{"role": "user", "content": [{"type": "image"}, '
        f'{{"type": "text", "text": {question}}}]}}]',
        "text = processor.apply_chat_template(messages, add_generation_prompt=True)",
        'inputs = processor(text=[text], images=[image], return_tensors="pt")',
        "out = model.generate(**inputs)  # greedy, the run's answer length (generation_config)",
        "```",
    ]
    if prefix:
        lines.append(
            f"The method is prompt tuning: {facts.virtual_tokens} trained tokens "
            f"(`{VIRTUAL_TOKEN.format(0)}` ...) go right before each question, after the image."
        )
    return "\n".join(lines)


def model_card(
    record: Mapping[str, Any], splits: Mapping[str, Any] | None, facts: ExportFacts
) -> Any:
    """The card (`huggingface_hub.ModelCard`): front matter and body from `record` (a run's
    results.json) and `splits` (its splits.json, None where unreadable)."""
    from huggingface_hub import ModelCard

    config = record.get("config") or {}
    what = "merged checkpoint" if facts.merged else "peft adapter"
    title = (
        f"{shown(_get(config, 'peft.label'))} of `{facts.base}` on "
        f"{shown(dataset_name(record))} ({shown(_get(config, 'shift.name'))} shift)"
    )
    body = f"""# {title}

A {what} exported by `medvqa-export` from a medvqa run. Everything below is read from the run's
record (`results.json`, `splits.json`); "{NOT_RECORDED}" marks what it does not hold.

## Results

{_results(record)}

## Data and shift

- dataset: {shown(dataset_name(record))}, options {shown(_get(config, "dataset"))}
- shift: {shown(_get(config, "shift"))}
- splits (after `data.limit` and the image check):

{_splits(splits)}

## Method and hyperparameters

{_method(record)}

## Compute (measured by the run)

{_compute(record)}

## Judge and self-check

{_judge(record)}

## Code

{_code(record)}

## Loading

{_usage(facts)}
"""
    return ModelCard(f"---\n{card_data(record, facts).to_yaml()}\n---\n\n{body}")
