"""LLM-as-a-judge scoring (SURE-VQA's "Mistral score" / "Mistral accuracy").

Token-overlap metrics punish a correct answer phrased differently ("left lung" vs "the lung on
the left side"); a judge model reads question, ground truth and prediction and grades meaning.
Three rubrics, written for this project:

* ``open``: 1-5 (1 incorrect, 2 partially correct, 3 mostly correct, 4 correct with minor
  deviations, 5 perfect match);
* ``closed``: 0/1;
* ``closed_multilabel`` (questions answered by A, B, both or none): 0 / 0.5 / 1. The model
  writes 0, 1 or 2 points (single tokens, so `logits` mode can read them) and the score is
  points / 2.

Each rubric's id is its name plus a short sha256 of everything the model reads apart from the
item (system text, input layout, reminder, labels), so editing a rubric never reuses cached
scores made under the old text.

Hybrid shortcut: a prediction equal to the ground truth after `normalize_answer` gets the
rubric's maximum without a call. Everything else is looked up in the `JudgeCache`, and only
misses reach the backend. In `generate` mode an unreadable reply gets one stricter reminder; if
that fails too the item is recorded as failed (cached with its error, `judge_failed = 1`,
counted in `judge_failures` and in the `judge/failures` counter) and retried by the next run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from medvqa.data.records import ANSWER, ANSWER_TYPE, QUESTION
from medvqa.evaluation.families.base import MetricFamily
from medvqa.evaluation.families.traditional import normalize_answer
from medvqa.evaluation.judge_backends import (
    JudgeBackend,
    JudgeConfigError,
    JudgeRequest,
    Reply,
    build_backend,
)
from medvqa.evaluation.judge_cache import JudgeCache

log = logging.getLogger(__name__)

__all__ = [
    "CLOSED_KIND",
    "JUDGE_FAILED",
    "JUDGE_REASON",
    "JUDGE_RUBRIC",
    "JUDGE_SCORE",
    "RUBRICS",
    "JudgeMetric",
    "Judgment",
    "Rubric",
    "build_messages",
    "parse_judgment",
    "select_rubric",
]

PREDICTION = "prediction"
CLOSED_KIND = "closed_kind"
JUDGE_SCORE = "judge_score"
JUDGE_RUBRIC = "judge_rubric"
JUDGE_FAILED = "judge_failed"
JUDGE_REASON = "judge_reason"
SHORTCUT_REASON = "normalised exact match (scored without calling the judge)"

# --------------------------------------------------------------------------------------------
# Rubrics
# --------------------------------------------------------------------------------------------

_PREAMBLE = (
    "You grade the answers of a medical visual question answering system. The user message is "
    'a JSON object with the "question", the "ground_truth" answer and the system\'s '
    '"prediction". You do not see the image: decide only whether the prediction says the same '
    "thing as the ground truth. Wording, synonyms, abbreviations, letter case and extra "
    "courtesy do not matter; a wrong or missing finding, organ, side, location, count, size or "
    "modality does.\n\n"
)

OPEN_TEXT = _PREAMBLE + (
    "Give a score from 1 to 5:\n"
    "1 = incorrect: the prediction contradicts the ground truth or has none of its content.\n"
    "2 = partially correct: some content matches, but important parts are wrong or missing.\n"
    "3 = mostly correct: the main point matches; a secondary detail is wrong or missing.\n"
    "4 = correct with minor deviations: the same content, with an imprecision or an extra "
    "detail that does not change the meaning.\n"
    "5 = perfect match: exactly the content of the ground truth.\n\n"
    'Reply with only a JSON object: {"score": <1, 2, 3, 4 or 5>, "reason": "<one short '
    'sentence>"}'
)

CLOSED_TEXT = _PREAMBLE + (
    "The question has a fixed set of allowed answers (for example yes/no). Give a score:\n"
    "1 = the prediction gives the same answer as the ground truth.\n"
    "0 = the prediction gives another answer, several answers, or no answer.\n\n"
    'Reply with only a JSON object: {"score": <0 or 1>, "reason": "<one short sentence>"}'
)

MULTILABEL_TEXT = _PREAMBLE + (
    "The question asks which of two options applies, and the allowed answers are the first "
    'option (A), the second option (B), "both" or "none" (for example left lung, right '
    "lung, both, none). Give points:\n"
    "2 = the prediction gives exactly the ground-truth answer.\n"
    "1 = partially correct: prediction and ground truth share one option but are not equal "
    '(ground truth "both", prediction A; or ground truth A, prediction "both").\n'
    '0 = incorrect: nothing in common (A instead of B, or "none" against an option), or no '
    "answer.\n\n"
    'Reply with only a JSON object: {"score": <0, 1 or 2>, "reason": "<one short sentence>"}'
)

REMINDER = (
    "Your reply could not be read. Answer again with only a JSON object of the form "
    '{{"score": <{labels}>, "reason": "<one short sentence>"}} and nothing before or after it.'
)
# The user message: the item as JSON (keys in this order), the same in every mode.
INPUT_KEYS = ("question", "ground_truth", "prediction")


@dataclass(frozen=True)
class Rubric:
    """A scoring rubric: the system text, the labels the judge may write and their scores.

    `reduce` says how a label distribution (`logits` mode) becomes a score: ``expected``
    (sum p_i * value_i over the renormalised labels: an ordinal scale) or ``argmax``
    (a category). `input_keys` are the user message's keys in order: the item's question,
    ground_truth and prediction plus any extra fields a caller supplies (e.g. an aspect).
    """

    name: str
    text: str
    labels: tuple[str, ...]
    values: tuple[float, ...]
    reduce: str
    input_keys: tuple[str, ...] = INPUT_KEYS

    def __post_init__(self) -> None:
        if len(self.labels) != len(self.values) or not self.labels:
            raise ValueError(f"rubric {self.name!r}: labels and values must pair up")
        if self.reduce not in ("expected", "argmax"):
            raise ValueError(f"rubric {self.name!r}: reduce {self.reduce!r} is not expected|argmax")

    @cached_property
    def id(self) -> str:
        """`name-<12 hex>`: changes whenever anything the judge reads (besides the item) or
        the label-to-score map changes."""
        blob = json.dumps(
            {
                "text": self.text,
                "reminder": REMINDER,
                "input": self.input_keys,
                "labels": self.labels,
                "values": self.values,
                "reduce": self.reduce,
            }
        )
        return f"{self.name}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"

    @property
    def max_value(self) -> float:
        return max(self.values)

    @property
    def min_value(self) -> float:
        return min(self.values)

    def value_of(self, label: str) -> float:
        return self.values[self.labels.index(label)]

    def from_probs(self, probs: Mapping[str, float]) -> float:
        """The score of a label distribution (already renormalised over the labels)."""
        if self.reduce == "expected":
            return float(sum(p * self.value_of(label) for label, p in probs.items()))
        best = max(self.labels, key=lambda label: probs.get(label, 0.0))
        return self.value_of(best)

    def reminder(self) -> str:
        return REMINDER.format(labels=", ".join(self.labels))


RUBRICS: dict[str, Rubric] = {
    "open": Rubric("open", OPEN_TEXT, ("1", "2", "3", "4", "5"), (1, 2, 3, 4, 5), "expected"),
    "closed": Rubric("closed", CLOSED_TEXT, ("0", "1"), (0, 1), "argmax"),
    "closed_multilabel": Rubric(
        "closed_multilabel", MULTILABEL_TEXT, ("0", "1", "2"), (0, 0.5, 1), "argmax"
    ),
}


def select_rubric(answer_type: str, closed_kind: Any, row: Any = None) -> str:
    """Rubric name for a row: open -> open; closed with closed_kind "multilabel" ->
    closed_multilabel; any other closed row -> closed."""
    if answer_type == "open":
        return "open"
    if answer_type == "closed":
        # isinstance first: `pd.NA == "multilabel"` is NA, whose truth value raises.
        multilabel = isinstance(closed_kind, str) and closed_kind == "multilabel"
        return "closed_multilabel" if multilabel else "closed"
    raise ValueError(f"row {row!r}: answer_type {answer_type!r} is neither 'open' nor 'closed'")


def build_messages(
    rubric: Rubric,
    question: str,
    answer: str,
    prediction: str,
    extra: Mapping[str, str] | None = None,
) -> list[dict]:
    """System = rubric text; user = the item as JSON (so quotes and newlines in a prediction
    cannot be mistaken for instructions or break the layout), keys in `rubric.input_keys`
    order; `extra` supplies the keys beyond question, ground_truth and prediction."""
    fields = dict(zip(INPUT_KEYS, (question, answer, prediction), strict=True)) | dict(extra or {})
    item = {k: fields[k] for k in rubric.input_keys}
    return [
        {"role": "system", "content": rubric.text},
        {"role": "user", "content": json.dumps(item, ensure_ascii=False)},
    ]


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------

_NUMBER = r"\d+(?:\.\d+)?"
_KEY_VALUE = re.compile(rf"""score["']?\s*[:=]\s*["']?({_NUMBER})""", re.IGNORECASE)
# A reply that opens with the score, after optional quotes, brackets or markdown emphasis.
_LEADING = re.compile(rf"""^[\s"'`*(\[]*({_NUMBER})(?![\d])""")


def _label(value: Any, rubric: Rubric) -> str | None:
    """`value` as one of the rubric's labels ("4", 4, 4.0, " 4 " -> "4"), or None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        if not math.isfinite(value):
            return None
        text = str(int(value)) if float(value).is_integer() else str(value)
    else:
        text = str(value).strip().strip("\"'").strip()
        try:
            number = float(text)
        except ValueError:
            pass
        else:
            if math.isfinite(number) and number.is_integer():
                text = str(int(number))
    return text if text in rubric.labels else None


def _json_objects(text: str) -> list[dict]:
    """Every JSON object that starts somewhere in `text` (models wrap them in prose or
    code fences)."""
    decoder = json.JSONDecoder()
    found = []
    for start in (i for i, ch in enumerate(text) if ch == "{"):
        try:
            obj, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            found.append(obj)
    return found


def parse_judgment(text: str, rubric: Rubric) -> tuple[float, str] | None:
    """(score, reason) from a judge reply, or None if it holds no allowed score.

    Tolerant, in order: a JSON object anywhere in the text with a "score" key; a
    `score: 4`-style pair; a reply that starts with a bare label ("4", "4 - correct"). A
    score outside the rubric's labels (e.g. 7 on the 1-5 scale) is unreadable, not clipped.
    """
    for obj in _json_objects(text):
        lowered = {str(k).lower(): v for k, v in obj.items()}
        if "score" in lowered:
            label = _label(lowered["score"], rubric)
            if label is not None:
                return rubric.value_of(label), str(lowered.get("reason", "") or "")
    for pattern in (_KEY_VALUE, _LEADING):
        match = pattern.search(text)
        if match:
            label = _label(match.group(1), rubric)
            if label is not None:
                return rubric.value_of(label), ""
    return None


# --------------------------------------------------------------------------------------------
# The metric
# --------------------------------------------------------------------------------------------


@dataclass
class Judgment:
    """The outcome for one distinct (rubric, question, ground truth, prediction) item."""

    score: float | None
    reason: str
    raw: str
    status: str  # ok | failed
    error: str = ""


@dataclass
class JudgeItem:
    key: str
    rubric: Rubric
    question: str
    answer: str
    prediction: str
    rows: list[int] = field(default_factory=list)
    extra: dict[str, str] = field(default_factory=dict)  # inputs beyond the triple


COUNTERS = ("calls", "retries", "cache_hits", "shortcut_hits", "failures")


class _Counters:
    """Thread-safe tallies (worker threads count requests, the main thread the rest)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.values = dict.fromkeys(COUNTERS, 0)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.values[name] += n


def as_text(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


class JudgeMetric(MetricFamily):
    """The LLM judge as a metric family (`per_sample` / `aggregate` / `counters`).

    `on_judgment(item_key, judgment)` is called after each judgment made in this run is
    stored; it exists for progress reporting (and lets tests interrupt a run). Judgments of
    items still in flight when a run is interrupted are stored before the exception propagates.
    """

    name = "judge"
    config_factory = "from_config"

    def __init__(
        self,
        backend: JudgeBackend,
        cache: JudgeCache | None = None,
        rubrics: Mapping[str, Rubric] | None = None,
        on_judgment: Callable[[str, Judgment], None] | None = None,
    ) -> None:
        self.backend = backend
        self.cache = cache
        self.rubrics = dict(RUBRICS if rubrics is None else rubrics)
        missing = [n for n in RUBRICS if n not in self.rubrics]
        if missing:
            raise ValueError(f"judge rubrics lack {missing}; need {list(RUBRICS)}")
        self.on_judgment = on_judgment
        self._counters = _Counters()

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> JudgeMetric:
        """Backend and cache from a `judge` config group (conf/judge/default.yaml)."""
        cache_dir = cfg.get("cache_dir")
        cache = JudgeCache(cache_dir) if cache_dir else None
        return cls(build_backend(cfg), cache)

    # -- counters -----------------------------------------------------------------------------

    def counters(self) -> dict[str, int]:
        """`judge/calls` (requests sent to the judge, retries included), `judge/retries`,
        `judge/cache_hits`, `judge/shortcut_hits`, `judge/failures`, since construction (the
        prefix is the family's `name`)."""
        return {f"{self.name}/{k}": v for k, v in self._counters.values.items()}

    # -- per-sample ----------------------------------------------------------------------------

    def per_sample(self, preds: pd.DataFrame) -> pd.DataFrame:
        """`judge_score`, `judge_rubric`, `judge_failed` (0/1) and `judge_reason` per row.

        Same index as `preds`. Failed rows have `judge_score` NaN and `judge_failed` 1.
        Identical items (same rubric, question, ground truth, prediction) are judged once.
        """
        missing = [c for c in (QUESTION, ANSWER, PREDICTION, ANSWER_TYPE) if c not in preds]
        if missing:
            raise ValueError(
                f"the judge needs column(s) {missing} in the predictions table "
                f"(has {list(preds.columns)})"
            )
        n = len(preds)
        score = np.full(n, np.nan)
        failed = np.zeros(n)
        rubric_ids = [""] * n
        reasons = [""] * n
        kinds = preds[CLOSED_KIND].tolist() if CLOSED_KIND in preds else [None] * n
        items: dict[str, JudgeItem] = {}
        for i, (idx, q, a, p, t) in enumerate(
            zip(
                preds.index,
                preds[QUESTION],
                preds[ANSWER],
                preds[PREDICTION],
                preds[ANSWER_TYPE],
                strict=True,
            )
        ):
            rubric = self.rubrics[select_rubric(t, kinds[i], idx)]
            rubric_ids[i] = rubric.id
            q, a, p = as_text(q), as_text(a), as_text(p)
            norm = normalize_answer(a)
            if norm and normalize_answer(p) == norm:
                score[i] = rubric.max_value
                reasons[i] = SHORTCUT_REASON
                self._counters.add("shortcut_hits")
                continue
            key = JudgeCache.key(self.backend.judge_id, rubric.id, q, a, p)
            items.setdefault(key, JudgeItem(key, rubric, q, a, p)).rows.append(i)

        judgments = self._lookup(items)
        pending = [item for key, item in items.items() if key not in judgments]
        if pending:
            judgments.update(self._judge_all(pending))
        for key, item in items.items():
            j = judgments[key]
            for i in item.rows:
                reasons[i] = j.reason if j.status == "ok" else j.error
                if j.status == "ok":
                    score[i] = j.score
                else:
                    failed[i] = 1.0
        n_failed = int(failed.sum())
        if n_failed:
            first = next(j for j in judgments.values() if j.status == "failed")
            log.warning(
                "judge: %d of %d row(s) could not be judged (recorded as judge_failed; retried "
                "on the next run). First error: %s",
                n_failed,
                n,
                first.error,
            )
        log.info("judge %s: %s", self.backend.judge_id, self.counters())
        return pd.DataFrame(
            {
                JUDGE_SCORE: score,
                JUDGE_RUBRIC: rubric_ids,
                JUDGE_FAILED: failed,
                JUDGE_REASON: reasons,
            },
            index=preds.index,
        )

    def _lookup(self, items: Mapping[str, JudgeItem]) -> dict[str, Judgment]:
        """Cached ok judgments; cached failures are not returned, so they are retried."""
        if self.cache is None or not items:
            return {}
        found = {}
        for key, hit in self.cache.get_many(items).items():
            if hit.status == "ok":
                found[key] = Judgment(hit.score, hit.reason, hit.raw, "ok")
        self._counters.add("cache_hits", len(found))
        return found

    def _judge_all(self, pending: Sequence[JudgeItem]) -> dict[str, Judgment]:
        """Judge `pending` in chunks of `batch_size` on `concurrency` threads, storing each
        chunk's judgments as it completes."""
        size = self.backend.batch_size
        chunks = [list(pending[i : i + size]) for i in range(0, len(pending), size)]
        results: dict[str, Judgment] = {}
        stored: set[Future] = set()
        with ThreadPoolExecutor(max_workers=self.backend.concurrency) as pool:
            futures = [pool.submit(self._judge_chunk, chunk) for chunk in chunks]
            try:
                for fut in as_completed(futures):
                    done = fut.result()
                    self._store(done, results)
                    stored.add(fut)
                    if self.on_judgment is not None:
                        for item, judgment in done:
                            self.on_judgment(item.key, judgment)
            except BaseException:
                # Keep what is already paid for: cancel what has not started, store what
                # finishes, then let the error through.
                for fut in futures:
                    fut.cancel()
                for fut in futures:
                    if fut in stored or fut.cancelled():
                        continue
                    try:
                        self._store(fut.result(), results)
                    except Exception:
                        log.debug("judge chunk failed during shutdown", exc_info=True)
                raise
        return results

    def _store(
        self, done: Sequence[tuple[JudgeItem, Judgment]], results: dict[str, Judgment]
    ) -> None:
        for item, judgment in done:
            results[item.key] = judgment
            if judgment.status == "failed":
                self._counters.add("failures")
            if self.cache is not None:
                self.cache.put(
                    item.key,
                    judge_id=self.backend.judge_id,
                    rubric_id=item.rubric.id,
                    question=item.question,
                    answer=item.answer,
                    prediction=item.prediction,
                    score=judgment.score,
                    reason=judgment.reason,
                    raw=judgment.raw,
                    status=judgment.status,
                    error=judgment.error,
                )

    def _complete(self, requests: Sequence[JudgeRequest]) -> list[Reply]:
        replies = self.backend.complete(requests)
        if len(replies) != len(requests):
            raise JudgeConfigError(
                f"judge backend {self.backend.judge_id} returned {len(replies)} replies for "
                f"{len(requests)} requests"
            )
        for reply in replies:
            self._counters.add("calls", reply.attempts)
            self._counters.add("retries", reply.attempts - 1)
        return replies

    def _judge_chunk(self, chunk: Sequence[JudgeItem]) -> list[tuple[JudgeItem, Judgment]]:
        """One chunk end to end (first request, reminder if needed), in a worker thread."""
        messages = [
            build_messages(it.rubric, it.question, it.answer, it.prediction, it.extra)
            for it in chunk
        ]
        replies = self._complete(
            [JudgeRequest(m, it.rubric.labels) for m, it in zip(messages, chunk, strict=True)]
        )
        out: dict[int, Judgment] = {}
        again: list[int] = []
        for k, (item, reply) in enumerate(zip(chunk, replies, strict=True)):
            if reply.error is not None:
                out[k] = Judgment(None, "", reply.text, "failed", reply.error)
            elif reply.label_probs is not None:
                score = item.rubric.from_probs(reply.label_probs)
                out[k] = Judgment(score, "", reply.text, "ok")
            else:
                parsed = parse_judgment(reply.text, item.rubric)
                if parsed is None:
                    again.append(k)
                else:
                    out[k] = Judgment(parsed[0], parsed[1], reply.text, "ok")
        if again:
            retry = [
                JudgeRequest(
                    [
                        *messages[k],
                        {"role": "assistant", "content": replies[k].text},
                        {"role": "user", "content": chunk[k].rubric.reminder()},
                    ],
                    chunk[k].rubric.labels,
                )
                for k in again
            ]
            for k, reply in zip(again, self._complete(retry), strict=True):
                raw = f"{replies[k].text}\n--- after reminder ---\n{reply.text}"
                parsed = None if reply.error else parse_judgment(reply.text, chunk[k].rubric)
                if parsed is None:
                    error = reply.error or (
                        f"unreadable judge reply, also after a reminder: {reply.text[:200]!r}"
                    )
                    out[k] = Judgment(None, "", raw, "failed", error)
                else:
                    out[k] = Judgment(parsed[0], parsed[1], raw, "ok")
        return [(item, out[k]) for k, item in enumerate(chunk)]

    # -- aggregate -----------------------------------------------------------------------------

    def aggregate(self, scored: pd.DataFrame) -> dict[str, float]:
        """`judge_closed_acc` (mean closed score), `judge_open_score` (mean 1-5),
        `judge_open_score_norm` (mean of (s-1)/4, on the 0-1 scale RR and tables use) over
        rows that were judged, and `judge_failures` (rows that could not be). Means over no
        rows are NaN, not 0."""
        ok = scored[JUDGE_FAILED] == 0
        closed = (scored[ANSWER_TYPE] == "closed") & ok
        open_ = (scored[ANSWER_TYPE] == "open") & ok
        open_scores = scored.loc[open_, JUDGE_SCORE]
        return {
            "judge_closed_acc": _mean(scored.loc[closed, JUDGE_SCORE]),
            "judge_open_score": _mean(open_scores),
            "judge_open_score_norm": _mean((open_scores - 1.0) / 4.0),
            "judge_failures": float(scored[JUDGE_FAILED].sum()),
        }

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()


def _mean(values: pd.Series) -> float:
    return float(values.mean()) if len(values) else float("nan")
