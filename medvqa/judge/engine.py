"""The one judging engine behind every judge metric: shortcut, cache, batching, counters.

`JudgeEngine.judge(items)` returns one `Judgment` per item, in order:

* hybrid shortcut: a prediction equal to the ground truth after `normalize_answer` gets the
  rubric's maximum without a call;
* identical items (same rubric, extra inputs, question, ground truth, prediction) are judged
  once;
* everything else is looked up in the `JudgeCache`, and only misses reach the backend, in
  chunks of the backend's `batch_size` (items of one rubric and similar length together) on
  `concurrency`
  threads; each chunk is stored the moment it completes, so an interrupted run repeats no
  paid call;
* in `generate` mode an unreadable reply gets one stricter reminder; if that fails too the
  item is recorded as failed (cached with its error) and retried by the next run.

`counters` tallies `calls` (requests sent, retries included), `retries`, `cache_hits`,
`shortcut_hits` (per item) and `failures` since construction.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any, cast

from medvqa.data.answers import normalize_answer
from medvqa.judge.base import JudgeBackend, JudgeRequest, Reply
from medvqa.judge.cache import JudgeCache
from medvqa.judge.errors import JudgeConfigError
from medvqa.judge.replies import (
    Judgment,
    after_reminder,
    read_reply,
    reminder_messages,
)
from medvqa.judge.rubrics import INPUT_KEYS, Rubric, build_messages
from medvqa.progress import Ticker

log = logging.getLogger(__name__)

__all__ = ["COUNTERS", "SHORTCUT_REASON", "JudgeEngine", "JudgeItem", "as_text"]

SHORTCUT_REASON = "normalised exact match (scored without calling the judge)"
COUNTERS = ("calls", "retries", "cache_hits", "shortcut_hits", "failures")


def as_text(value: Any) -> str:
    """A table cell as judge input: missing values (None, NaN) are the empty string."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


@dataclass(frozen=True)
class JudgeItem:
    """One thing to judge: a rubric and what the judge model reads with it. `extra` holds
    inputs beyond the (question, ground truth, prediction) triple, e.g. the aspect."""

    rubric: Rubric
    question: str
    answer: str
    prediction: str
    extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def scope(self) -> str:
        """The rubric id, plus the extra inputs the rubric shows (as `id:value`): every
        input that decides the judgment besides the triple, for the cache key."""
        extras = [self.extra[k] for k in self.rubric.input_keys if k not in INPUT_KEYS]
        return ":".join([self.rubric.id, *extras])

    def shortcut(self) -> bool:
        """Whether the prediction equals a non-empty ground truth after normalisation."""
        norm = normalize_answer(self.answer)
        return bool(norm) and normalize_answer(self.prediction) == norm


@dataclass
class _Pending:
    """A distinct item with its cache key and the positions of `judge`'s input it answers."""

    key: str
    item: JudgeItem
    positions: list[int] = field(default_factory=list)


class _Counters:
    """Thread-safe tallies (worker threads count requests, the main thread the rest)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.values = dict.fromkeys(COUNTERS, 0)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.values[name] += n


class JudgeEngine:
    """Judges items with a backend, through an optional cache.

    `on_judgment(key, judgment)` is called after each judgment made in this run is stored; it
    exists for progress reporting (and lets tests interrupt a run). Judgments of items still
    in flight when a run is interrupted are stored before the exception propagates.
    """

    def __init__(
        self,
        backend: JudgeBackend,
        cache: JudgeCache | None = None,
        on_judgment: Callable[[str, Judgment], None] | None = None,
    ) -> None:
        self.backend = backend
        self.cache = cache
        self.on_judgment = on_judgment
        self._counters = _Counters()

    @property
    def counters(self) -> dict[str, int]:
        """`calls`, `retries`, `cache_hits`, `shortcut_hits`, `failures` since construction."""
        return dict(self._counters.values)

    def key(self, item: JudgeItem) -> str:
        """The cache key of an item's judgment under this engine's judge."""
        return JudgeCache.key(
            self.backend.judge_id, item.scope, item.question, item.answer, item.prediction
        )

    def judge(self, items: Sequence[JudgeItem]) -> list[Judgment]:
        """One judgment per item, in order (see the module docstring)."""
        out: list[Judgment | None] = [None] * len(items)
        distinct: dict[str, _Pending] = {}
        for i, item in enumerate(items):
            if item.shortcut():
                out[i] = Judgment(item.rubric.max_value, SHORTCUT_REASON, "", "ok")
                self._counters.add("shortcut_hits")
                continue
            key = self.key(item)
            distinct.setdefault(key, _Pending(key, item)).positions.append(i)
        judgments = self._lookup(distinct)
        pending = [p for key, p in distinct.items() if key not in judgments]
        if pending:
            judgments.update(self._judge_all(pending))
        for key, p in distinct.items():
            for i in p.positions:
                out[i] = judgments[key]
        return cast(list[Judgment], out)  # every position is filled above

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()

    # -- internals ----------------------------------------------------------------------------

    def _lookup(self, distinct: Mapping[str, _Pending]) -> dict[str, Judgment]:
        """Cached ok judgments; cached failures (and an `ok` row without a score, which only
        a damaged cache holds) are not returned: a failure is never an answer, it is retried."""
        if self.cache is None or not distinct:
            return {}
        found = {}
        for key, hit in self.cache.get_many(distinct).items():
            if hit.status == "ok" and hit.score is not None and math.isfinite(hit.score):
                found[key] = Judgment(hit.score, hit.reason, hit.raw, "ok")
        self._counters.add("cache_hits", len(found))
        return found

    def _judge_all(self, pending: Sequence[_Pending]) -> dict[str, Judgment]:
        """Judge `pending` in chunks of `batch_size` on `concurrency` threads, storing each
        chunk's judgments as it completes."""
        size = self.backend.batch_size
        # Items of one rubric and similar length share a batch: the rubric is a prompt start
        # the embedded judge runs once, and there is less padding (results keep their order).
        pending = sorted(
            pending, key=lambda p: (p.item.scope, len(p.item.question + p.item.prediction))
        )
        chunks = [list(pending[i : i + size]) for i in range(0, len(pending), size)]
        results: dict[str, Judgment] = {}
        stored: set[Future] = set()
        ticker = Ticker(f"judge {self.backend.judge_id}", len(pending), "items")
        with ThreadPoolExecutor(max_workers=self.backend.concurrency) as pool:
            futures = [pool.submit(self._judge_chunk, chunk) for chunk in chunks]
            try:
                for fut in as_completed(futures):
                    done = fut.result()
                    self._store(done, results)
                    stored.add(fut)
                    ticker.update(len(results))
                    if self.on_judgment is not None:
                        for p, judgment in done:
                            self.on_judgment(p.key, judgment)
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
        self, done: Sequence[tuple[_Pending, Judgment]], results: dict[str, Judgment]
    ) -> None:
        for p, judgment in done:
            results[p.key] = judgment
            if judgment.status == "failed":
                self._counters.add("failures")
            if self.cache is not None:
                self.cache.put(
                    p.key,
                    judge_id=self.backend.judge_id,
                    rubric_id=p.item.rubric.id,
                    question=p.item.question,
                    answer=p.item.answer,
                    prediction=p.item.prediction,
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

    def _judge_chunk(self, chunk: Sequence[_Pending]) -> list[tuple[_Pending, Judgment]]:
        """One chunk end to end (first request, reminder if needed), in a worker thread."""
        items = [p.item for p in chunk]
        messages = [
            build_messages(it.rubric, it.question, it.answer, it.prediction, it.extra)
            for it in items
        ]
        replies = self._complete(
            [JudgeRequest(m, it.rubric.labels) for m, it in zip(messages, items, strict=True)]
        )
        out: dict[int, Judgment] = {}
        again: list[int] = []
        for k, (item, reply) in enumerate(zip(items, replies, strict=True)):
            judgment = read_reply(reply, item.rubric)
            if judgment is None:
                again.append(k)
            else:
                out[k] = judgment
        if again:
            retry = [
                JudgeRequest(
                    reminder_messages(messages[k], replies[k], items[k].rubric),
                    items[k].rubric.labels,
                )
                for k in again
            ]
            for k, reply in zip(again, self._complete(retry), strict=True):
                out[k] = after_reminder(replies[k], reply, items[k].rubric)
        return [(p, out[k]) for k, p in enumerate(chunk)]
