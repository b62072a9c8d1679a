"""The record of a run: `results.json` in the run directory Hydra created.

Aggregation reads these records (status, seed, resolved config, flat metrics), never directory
names. The file is rewritten atomically at each status change, so a crash mid-write cannot
leave a truncated record. A record travels and is data from a stranger: `read_record` returns
it as plain values (`medvqa.untrusted`), the one way every command reads one.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from medvqa.atomic import write_file
from medvqa.hashing import Hasher
from medvqa.measure import split_perf
from medvqa.models.spec import random_weights_kind
from medvqa.redaction import redact_secrets
from medvqa.untrusted import plain_values, read_plain_json

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
_HOW_TO_RUN = ("force", "ckpt_path", "allow_toy_model", "progress")
# Nodes added after runs were recorded whose unset value (null) computes what their absence did:
# a run recorded before them is the same job.
_ABSENT_WHEN_NULL = ("passes",)
# Display names (how tables name a run, a baseline or a method), not what a run computes:
# editing one must not retrain anything nor split a table's runs.
DISPLAY_NAMES = ("label", "peft.label")
# A failed run's messages: text, never configuration (they may quote an interpolation).
FREE_TEXT = ("error", "traceback")


# How the summary and the report say it (medvqa.analysis).
REHEARSAL_NOTE = "REHEARSAL: random weights (model.random_weights); the scores mean nothing"


def is_rehearsal(config: Mapping[str, Any] | None) -> bool:
    """Whether a run's resolved config drew its model's weights at random
    (`model.random_weights`): its scores mean nothing, and reports keep it apart."""
    model = (config or {}).get("model")
    try:
        return (
            isinstance(model, Mapping)
            and random_weights_kind(model.get("random_weights")) is not None
        )
    except ValueError:  # a value the config check refused: the job drew no weights at all
        return False


def _json_number(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; null means "not measured"
    return value


class RunRecord:
    """Writes `results.json`: status, seed, resolved config and `split/metric` numbers."""

    def __init__(
        self,
        out_dir: Path,
        cfg: DictConfig,
        choices: Mapping[str, Any] | None = None,
        lands_in: Path | None = None,
    ) -> None:
        self.path = Path(out_dir) / RESULTS_FILE
        # Where the record ends up, for the log: `lands_in` where `out_dir` is a staging folder
        # swapped in whole at the end (medvqa-score), which the user never sees.
        self.shown = Path(lands_in or out_dir) / RESULTS_FILE
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
        # Compared as the reader returns the previous one: plain values (medvqa.untrusted).
        same = _what(previous.get("config", {})) == _what(plain_values(self.config).value)
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
            log.info("finished; record at %s", self.shown)
            return "finished"
        message = (
            f"{failed_items} item(s) could not be scored or had no answer (the *_failures and "
            "*/unanswered metrics); every "
            "aggregate over them is NaN. Run it again to retry only those items."
        )
        self.write("incomplete", metrics, failed_items=failed_items, error=message)
        log.error("incomplete: %s Record at %s", message, self.shown)
        return "incomplete"


def _what(config: Any) -> Any:
    if not isinstance(config, dict):
        return config
    what = {
        k: v
        for k, v in config.items()
        if k not in _HOW_TO_RUN
        and k not in DISPLAY_NAMES
        and not (k in _ABSENT_WHEN_NULL and v is None)
    }
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


def read_record(path: Path, remote_code: list[str] | None = None) -> dict[str, Any]:
    """Load a results.json as plain values (`medvqa.untrusted`: no `_target_`, interpolation or
    `trust_remote_code` survives; the keys of the last are appended to `remote_code`); anything
    that is not a record of the shape RunRecord writes is a ValueError naming the file and what
    is wrong, so callers may index what they get back (a `null` or a number there once crashed
    resuming and medvqa-report with a TypeError)."""

    def kind(value: Any) -> str:
        if value is None:
            return "null"
        if isinstance(value, bool):
            return "a boolean"
        if isinstance(value, int | float):
            return "a number"
        return {str: "a string", list: "a list", dict: "an object"}.get(type(value), "a value")

    fix = "not a medvqa run record; delete the file or run the job again to rewrite it"
    plain = read_plain_json(path, RESULTS_FILE, fix, config_key="config", text=FREE_TEXT)
    record = plain.value
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
    if remote_code is not None:
        remote_code += plain.remote_code
    return record
