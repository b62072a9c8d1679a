"""The record of a run: `results.json` in the run directory Hydra created.

Aggregation reads these records (status, seed, resolved config, flat metrics), never directory
names. The file is rewritten atomically at each status change, so a crash mid-write cannot
leave a truncated record.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from medvqa.atomic import write_file
from medvqa.hashing import Hasher
from medvqa.measure import split_perf
from medvqa.models.spec import random_weights_kind
from medvqa.redaction import redact_secrets

log = logging.getLogger(__name__)

RESULTS_FILE = "results.json"
# `incomplete`: the job ran to the end, but some items could not be scored (a judge that did
# not answer); the aggregates over them are NaN and a re-run retries only those items.
# `interrupted`: stopped by a signal or a scheduler (the record names it, the stage and step).
STATUSES = ("running", "finished", "incomplete", "diverged", "failed", "interrupted")
# Where a W&B run's summary holds the record's status and details (medvqa.tracking.log_status):
# `medvqa/status`, `medvqa/diverged_step`, `medvqa/failed_items`.
SUMMARY_PREFIX = "medvqa/"
# Keys that say how to run a job, not what it computes: they never make a finished job stale.
_HOW_TO_RUN = ("force", "ckpt_path", "allow_toy_model")
# Display names (how tables name a run, a baseline or a method), not what a run computes:
# editing one must not retrain anything nor split a table's runs.
DISPLAY_NAMES = ("label", "peft.label")


# How the summary and the report say it (medvqa.analysis).
REHEARSAL_NOTE = "REHEARSAL: random weights (model.random_weights); the scores mean nothing"


def is_rehearsal(config: Mapping[str, Any] | None) -> bool:
    """Whether a run's resolved config drew its model's weights at random
    (`model.random_weights`): its scores mean nothing, and reports keep it apart."""
    model = (config or {}).get("model")
    return (
        isinstance(model, Mapping) and random_weights_kind(model.get("random_weights")) is not None
    )


def _json_number(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; null means "not measured"
    return value


class RunRecord:
    """Writes `results.json`: status, seed, resolved config and `split/metric` numbers."""

    def __init__(
        self, out_dir: Path, cfg: DictConfig, choices: Mapping[str, Any] | None = None
    ) -> None:
        self.path = Path(out_dir) / RESULTS_FILE
        # Which option of each config group ran (peft=lora, shift=age, baseline=blind, ...):
        # what aggregation groups by, rather than parsing directory names.
        self.choices = {k: v for k, v in (choices or {}).items() if not k.startswith("hydra")}
        # A secret-looking value (a key pasted where a variable's name belongs) never lands here.
        self.config = redact_secrets(OmegaConf.to_container(cfg, resolve=True))
        self.seed = int(cfg.seed)
        self.task = str(cfg.task.get("name", "")) if cfg.get("task") is not None else ""
        self.started = time.time()
        # medvqa.provenance: code, versions, device, data, model, judge (filled as the run goes).
        self.provenance: dict[str, Any] = {}

    def finished_before(self) -> dict[str, Any] | None:
        """The existing record if it is `finished` for the same config (else None).

        Decided from the record's status and config, never from a file merely existing: a
        failed, diverged or half-written job, or one with another config, is run again.
        """
        if not self.path.is_file():
            return None
        try:
            previous = read_record(self.path)
        except ValueError as err:
            log.warning("%s; running the job again", err)
            return None
        same = _what(previous.get("config", {})) == _what(self.config)
        return previous if previous["status"] == "finished" and same else None

    def write(self, status: str, metrics: Mapping[str, float] | None = None, **extra: Any) -> Path:
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        scores, perf = split_perf(metrics or {})
        record = {
            "status": status,
            "task": self.task,
            "seed": self.seed,
            "choices": self.choices,
            "metrics": {k: _json_number(float(v)) for k, v in sorted(scores.items())},
            # what the run measured of itself (medvqa.measure): not a result, never the same twice
            **(
                {"perf": {k: _json_number(float(v)) for k, v in sorted(perf.items())}}
                if perf
                else {}
            ),
            # random weights (model.random_weights): the pipeline ran, the scores mean nothing
            "rehearsal": is_rehearsal(self.config),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.started)),
            "duration_s": round(time.time() - self.started, 2),
            **extra,
            "provenance": self.provenance,
            "config": self.config,
        }
        text = json.dumps(record, indent=2, default=str)
        try:
            return write_file(self.path, lambda tmp: tmp.write_text(text))
        except OSError as err:
            # A full disk has no room for a second copy; rewriting the record in place reuses
            # its own blocks (truncating frees them first), so `failed` still replaces `running`.
            log.error(
                "cannot write %s beside the old one (%s); rewriting it in place", self.path, err
            )
            self.path.write_text(text)
            return self.path

    def finish(self, metrics: Mapping[str, float], failed_items: int = 0) -> str:
        """Record a run that got to its end: `finished`, or `incomplete` when `failed_items`
        items could not be scored (their aggregates are NaN). Returns the status."""
        if not failed_items:
            self.write("finished", metrics)
            log.info("finished; record at %s", self.path)
            return "finished"
        message = (
            f"{failed_items} item(s) could not be scored (the *_failures metrics); every "
            "aggregate over them is NaN. Run it again to retry only those items."
        )
        self.write("incomplete", metrics, failed_items=failed_items, error=message)
        log.error("incomplete: %s Record at %s", message, self.path)
        return "incomplete"


def _what(config: Any) -> Any:
    if not isinstance(config, dict):
        return config
    what = {k: v for k, v in config.items() if k not in _HOW_TO_RUN and k not in DISPLAY_NAMES}
    for name in DISPLAY_NAMES:
        group, _, key = name.rpartition(".")
        if isinstance(what.get(group), dict):
            what[group] = {k: v for k, v in what[group].items() if k != key}
    return what


def config_fingerprint(cfg: DictConfig) -> str:
    """A hash of what a run computes (its resolved config, less how to run it): the weights a
    run trained are reused by a re-run of the same job only (`medvqa.models.saving`)."""
    plain = {  # a config composed with Hydra's own node (tests, scripts): not what it computes
        k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
        for k, v in cfg.items()
        if k != "hydra"
    }
    return Hasher().update(_what(plain)).hexdigest()


def read_record(path: Path) -> dict[str, Any]:
    """Load a results.json; anything that is not a record of the shape RunRecord writes is a
    ValueError naming the file and what is wrong, so callers may index what they get back
    (a `null` or a number there once crashed resuming and medvqa-report with a TypeError)."""

    def kind(value: Any) -> str:
        if value is None:
            return "null"
        if isinstance(value, bool):
            return "a boolean"
        if isinstance(value, int | float):
            return "a number"
        return {str: "a string", list: "a list", dict: "an object"}.get(type(value), "a value")

    fix = "not a medvqa run record; delete the file or run the job again to rewrite it"
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a readable results.json ({err})") from err
    if not isinstance(record, dict):
        raise ValueError(f"{path}: holds {kind(record)}, not a JSON object; {fix}")
    missing = [key for key in ("status", "metrics") if key not in record]
    if missing:
        raise ValueError(f"{path}: missing {', '.join(map(repr, missing))}; {fix}")
    # Required keys, then keys a record may lack or hold null in (readers use `or {}`).
    shapes = (("status", str, False), ("metrics", dict, False))
    shapes += tuple((key, dict, True) for key in ("choices", "config", "provenance"))
    for key, expected, may_be_null in shapes:
        value = record.get(key)
        if not isinstance(value, expected) and not (may_be_null and value is None):
            wanted = "a string" if expected is str else "an object"
            raise ValueError(f"{path}: {key!r} is {kind(value)}, expected {wanted}; {fix}")
    return record


# What `task=eval` takes from the run whose weights it evaluates: the weights need that model
# and method (and the method's trained parts depend on whether it was trained with images),
# the seed decides the splits (another seed would test on training rows), and the trainer's
# precision decides the numbers (a bf16 model cannot even run without autocast). Dotted keys
# take one value; the devices and strategy stay this machine's (generation never goes
# through DeepSpeed).
ADOPTED = ("model", "peft", "seed", "trainer.precision", "data.train_image")
# The config groups among them (`choices`: what reports group by).
ADOPTED_CHOICES = ("model", "peft")


def check_trained_weights(
    run_dir: Path, trained: DictConfig, provenance: Mapping[str, Any] | None = None
) -> None:
    """Before any data or model work: the run `eval.from_run` names trained weights, they are
    all there (weights and manifest), the manifest's method is the run's, and the manifest is
    the one the run recorded (`provenance["trained"]`: the same training, config fingerprint
    and step; records from before it was kept are not compared). A method that trains nothing
    (peft=none) needs none."""
    from medvqa.models.saving import (  # torch: only here
        META_FILE,
        TRAINED_DIR,
        WEIGHTS_FILE,
        read_manifest,
    )

    where = f"eval.from_run={run_dir}"
    task = OmegaConf.select(trained, "task.name", default=None)
    if task not in (None, "train_eval"):
        source = OmegaConf.select(trained, "eval.from_run", default=None)
        evaluated = f" (this one evaluated eval.from_run={source})" if source else ""
        raise ValueError(
            f"{where}: that is a task={task} run; it trained no weights{evaluated}. Give the "
            "directory of a task=train_eval run."
        )
    if not OmegaConf.select(trained, "peft.fit", default=True):
        return
    weights, manifest = run_dir / TRAINED_DIR / WEIGHTS_FILE, run_dir / TRAINED_DIR / META_FILE
    if not weights.is_file() or not manifest.is_file():
        raise FileNotFoundError(
            f"{where}: its trained weights are not there ({weights} and {manifest.name}); they "
            "were moved or deleted. Restore the run's trained/ folder, or train again "
            "(task=train_eval)."
        )
    meta = read_manifest(run_dir / TRAINED_DIR)
    if meta is None:
        raise ValueError(f"{where}: {manifest} cannot be read as a manifest; train again")
    method = OmegaConf.select(trained, "peft.name", default=None)
    if method is not None and meta.get("method") != method:
        raise ValueError(
            f"{where}: {weights} holds {meta.get('method')!r} weights, but the run's method is "
            f"{method!r}; the folder was overwritten. Train again (task=train_eval)."
        )
    recorded = (provenance or {}).get("trained")
    if isinstance(recorded, dict) and recorded != meta:
        differ = sorted(k for k in {*recorded, *meta} if recorded.get(k) != meta.get(k))
        raise ValueError(
            f"{where}: {manifest} is not the manifest the run recorded (they differ in "
            f"{differ}: recorded {[recorded.get(k) for k in differ]}, found "
            f"{[meta.get(k) for k in differ]}); the trained/ folder was replaced by another "
            "training. Evaluate the run that trained these weights, or train again."
        )


def adopt_run(cfg: DictConfig, choices: Mapping[str, Any]) -> tuple[DictConfig, dict[str, Any]]:
    """For `eval.from_run`: `cfg` and `choices` with the model, method and seed of that run."""
    from_run = OmegaConf.select(cfg, "eval.from_run")
    if not from_run:
        return cfg, dict(choices)
    path = Path(from_run) / RESULTS_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"eval.from_run={from_run}: no {RESULTS_FILE} there; give a run dir"
        )
    record = read_record(path)
    if record["status"] not in ("finished", "incomplete"):
        raise ValueError(
            f"eval.from_run={from_run}: the run is {record['status']!r}; only a run that "
            "finished training has weights to evaluate."
        )
    cfg = cfg.copy()
    if not isinstance(record.get("config"), dict):
        raise ValueError(
            f"eval.from_run={from_run}: {path} records no config, so the model and method its "
            "weights need are unknown; evaluate a run whose record has one."
        )
    trained = OmegaConf.create(record["config"])
    check_trained_weights(Path(from_run), trained, record.get("provenance"))
    with open_dict(cfg):
        for key in ADOPTED:
            value = OmegaConf.select(trained, key, default=None)
            if value is None:  # a record from before the key was adopted: keep the composed one
                continue
            if isinstance(value, DictConfig):  # a group: replaced, not merged
                schema = OmegaConf.get_type(cfg, key)
                value = OmegaConf.to_container(value)
                if schema not in (None, dict):
                    value = OmegaConf.merge(OmegaConf.structured(schema), value)
            OmegaConf.update(cfg, key, value, merge=False)
    log.info("evaluating the weights of %s: %s", from_run, record.get("choices", {}))
    adopted = {k: v for k, v in record.get("choices", {}).items() if k in ADOPTED_CHOICES}
    return cfg, {**choices, **adopted}
