"""A model behind an OpenAI-compatible chat-completions endpoint, asked every pass of the
protocol (`model=served`: vLLM, SGLang, TGI, a hosted API).

The rows, passes (image modes, option orders, any pass kind's change of a row), paraphrases and
the prompt template are those a loaded model sees (`generation.data.GenerationDataset` picks
the image and writes the question); only the last step differs: the chat goes to the server as
the chat API carries it (the image as a `data:image/png;base64` URL, the template's system turn
and the question as text, in `prompting.build_messages`' order), and the server applies its
own chat template. Decoding is greedy (temperature 0, a fixed `seed` where the server takes one) with the
protocol's answer length (`evaluation.lengths.generation_length`).

Each answer is stored the moment it arrives, under a hash of (endpoint, model, messages,
settings), in a SQLite file (`ReplyCache`, the judge cache's kind of store): a killed run asks
only what it lacks, a re-run asks nothing. Requests run `concurrency` at a time; a timeout, a
dropped connection, HTTP 408/429/5xx or a reply that is not one are retried with backoff
(`judge.backend_openai.create_with_retries`, as the judge's); HTTP 401/403/404 stop
the run (asking again cannot help: the URL, model or key is wrong); any other refusal of one
request (HTTP 400: a prompt too long) leaves that item unanswered. An unanswered item is
recorded with no prediction and the reason (`SERVED_ERROR`); the scoring pipeline counts it
(`unanswered`), makes every aggregate over it NaN and the run `incomplete`; the next run asks
it again. The key comes from the environment variable `api_key_env` names, as the judge's
(`judge.keys`): never in a config, a record or a log.

Log-probabilities: with `logprobs`, the server's per-token log-probabilities of the answer give
its mean, min, token count and sum (at temperature 1 only: the other temperatures need the
whole distribution, which the API does not return); a server that returns none leaves them NaN,
and the calibration family says so.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd
from PIL import Image

from medvqa.atomic import write_file
from medvqa.data import records as R
from medvqa.data.base import VQASource
from medvqa.errors import ConfigError
from medvqa.generation.data import GenerationDataset, ImageChange, prediction_record
from medvqa.generation.files import ours, read_predictions
from medvqa.hashing import content_hash
from medvqa.interrupts import stage
from medvqa.judge.backend_openai import create_with_retries, openai_client
from medvqa.judge.cache import SqliteStore
from medvqa.judge.errors import JudgeConfigError
from medvqa.measure import measured
from medvqa.models.prompting import PromptTemplate, build_messages
from medvqa.training.spec import DataSchema

log = logging.getLogger(__name__)

# A predictions record's field: why the server gave this row no answer.
SERVED_ERROR = "served_error"
REPLIES_FILE = "served_replies.sqlite"
# HTTP statuses that say the endpoint, model or key is wrong: the run stops.
FATAL_STATUSES = (401, 403, 404)


class ServedError(ConfigError):
    """The endpoint refuses every request (a wrong URL, model name or key); the message says
    which setting to check."""


class Unanswerable(Exception):
    """The server refused one request for what it holds (HTTP 400: a prompt too long)."""


class BadReply(Exception):
    """A 200 reply that is not a chat completion with an answer (garbage, no choices)."""


class ReplyCache(SqliteStore):
    """The served answers, one row per request key, written as they arrive."""

    FILE, VERSION = REPLIES_FILE, 1
    SCHEMA = """
CREATE TABLE IF NOT EXISTS replies (
    key TEXT PRIMARY KEY,
    endpoint TEXT NOT NULL,
    reply TEXT NOT NULL,
    created REAL NOT NULL
);
"""
    WHAT, SETTING = "the served-answer cache", "model.served.cache_dir"

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._conn.execute("SELECT reply FROM replies WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def put(self, key: str, endpoint: str, reply: Mapping[str, Any]) -> None:
        with self._lock:
            self._conn.execute(
                "INSERT OR REPLACE INTO replies (key, endpoint, reply, created) VALUES (?, ?, ?, ?)",
                (key, endpoint, json.dumps(reply), time.time()),
            )

    def __len__(self) -> int:
        with self._lock:
            return int(self._conn.execute("SELECT COUNT(*) FROM replies").fetchone()[0])


@dataclass(frozen=True)
class Answer:
    """A served model's answer to one chat: the text (None: unanswered, `error` says why), the
    answer tokens' log-probabilities (None: the server returned none), the requests it took."""

    text: str | None
    logprobs: list[float] | None = None
    error: str | None = None
    attempts: int = 0

    def confidence(self) -> tuple[float, float, int, dict[str, float]]:
        """(mean, min, tokens, {"1.0": sum}) of its log-probabilities, as generation records
        them (`generation.logprobs`); NaN and no tokens without them."""
        if not self.logprobs:
            return math.nan, math.nan, 0, {}
        total = float(sum(self.logprobs))
        return (
            total / len(self.logprobs),
            float(min(self.logprobs)),
            len(self.logprobs),
            {"1.0": total},
        )


def data_url(image: Image.Image) -> str:
    """An image as the chat API carries it: a base64 PNG data URL (lossless)."""
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def chat_messages(question: str, image: str | None, system: str | None) -> list[dict[str, Any]]:
    """The chat of one row (`prompting.build_messages`, the order a loaded model sees), its
    image part (`image`: a data URL, None: no image) as the chat API's `image_url`."""
    turns = build_messages(question, image is not None, system)
    for turn in turns:
        turn["content"] = [
            {"type": "image_url", "image_url": {"url": image}} if part["type"] == "image" else part
            for part in turn["content"]
        ]
    return turns


@dataclass
class ServedEndpoint:
    """One served model and how it is asked (`model.served`, conf/model/served.yaml)."""

    base_url: str
    model: str
    api_key_env: str | None
    timeout: float
    retries: int
    backoff: float
    concurrency: int
    seed: int | None
    logprobs: bool
    cache_dir: str | None
    max_new_tokens: int

    @classmethod
    def from_config(cls, node: Mapping[str, Any], max_new_tokens: int) -> ServedEndpoint:
        fields = ("base_url", "model", "api_key_env", "timeout", "retries", "backoff")
        fields += ("concurrency", "seed", "logprobs", "cache_dir")
        return cls(**{k: node[k] for k in fields}, max_new_tokens=int(max_new_tokens))

    def settings(self) -> dict[str, Any]:
        """What decides an answer beside the messages: the request's decoding parameters."""
        out: dict[str, Any] = {"temperature": 0.0, "max_tokens": self.max_new_tokens}
        if self.seed is not None:
            out["seed"] = int(self.seed)
        if self.logprobs:
            out["logprobs"] = True
        return out

    def identity(self) -> str:
        """What answered: the endpoint, the model and the settings (the predictions' `model`)."""
        return content_hash([self.base_url, self.model, self.settings()])

    def record(self) -> dict[str, Any]:
        """The settings as results.json holds them (the key's variable name, never a key)."""
        return {
            "served": {"base_url": self.base_url, "model": self.model},
            **self.settings(),
            "api_key_env": self.api_key_env,
            "concurrency": self.concurrency,
            "timeout": self.timeout,
            "retries": self.retries,
        }

    def key(self, messages: Sequence[Mapping[str, Any]]) -> str:
        return content_hash([self.base_url, self.model, list(messages), self.settings()], None)

    @cached_property
    def client(self) -> Any:
        try:
            return openai_client(self.base_url, self.api_key_env, self.timeout, "served model")
        except JudgeConfigError as err:  # OpenAI's API without a key
            raise ServedError(f"model.served ({self.base_url}): {err}") from err

    def ask(self, messages: list[dict[str, Any]]) -> Answer:
        """One chat, retried as the module says; the answer or why there is none."""
        import openai

        def refused(err: Any) -> None:
            if err.status_code in FATAL_STATUSES:
                raise ServedError(
                    f"the served model's endpoint {self.base_url} answered HTTP {err.status_code}"
                    f" for model {self.model!r}: {err.message}. Check model.served.base_url, "
                    f"model.served.model and the key in ${self.api_key_env} "
                    "(model.served.api_key_env)."
                ) from err
            raise Unanswerable(f"HTTP {err.status_code}: {err.message}") from err

        def create() -> Any:
            response = self.client.chat.completions.create(
                model=self.model, messages=messages, **self.settings()
            )
            if not getattr(response, "choices", None):
                raise BadReply(f"not a chat completion: {str(response)[:200]!r}")
            if not isinstance(response.choices[0].message.content, str):
                raise BadReply("the reply holds no answer text")
            return response

        try:
            response, attempts, error = create_with_retries(
                create,
                retries=self.retries,
                backoff=self.backoff,
                timeout=self.timeout,
                refused=refused,
                transient=(BadReply, openai.APIResponseValidationError, ValueError),
            )
        except Unanswerable as err:
            return Answer(None, error=str(err), attempts=1)
        if response is None:
            return Answer(
                None, error=f"{error} (gave up after {attempts} attempts)", attempts=attempts
            )
        choice = response.choices[0]
        content = getattr(choice.logprobs, "content", None) if choice.logprobs else None
        logprobs = [float(t.logprob) for t in content] if content else None
        return Answer(choice.message.content.strip(), logprobs, attempts=attempts)

    def answer_all(self, chats: Sequence[list[dict[str, Any]]]) -> list[Answer]:
        """Every chat's answer: from the cache, else asked (`concurrency` at a time), each
        stored as it arrives; unanswered ones are not stored (the next run asks them)."""
        keys = [self.key(c) for c in chats]
        answers: dict[str, Answer] = {}
        cache = ReplyCache(self.cache_dir) if self.cache_dir else None
        try:
            for key in dict.fromkeys(keys):
                hit = cache.get(key) if cache is not None else None
                if hit is not None:
                    answers[key] = Answer(hit["text"], hit.get("logprobs"))
            todo = {k: c for k, c in zip(keys, chats, strict=True) if k not in answers}
            if todo:
                log.info(
                    "asking %s for %d answers (%d cached)", self.model, len(todo), len(answers)
                )
                answers |= self._ask_all(todo, cache)
        finally:
            if cache is not None:
                cache.close()
        return [answers[k] for k in keys]

    def _ask_all(
        self, todo: Mapping[str, list[dict[str, Any]]], cache: ReplyCache | None
    ) -> dict[str, Answer]:
        out: dict[str, Answer] = {}
        with ThreadPoolExecutor(max_workers=max(1, int(self.concurrency))) as pool:
            futures = {pool.submit(self.ask, chat): key for key, chat in todo.items()}
            for future in as_completed(futures):
                key, answer = futures[future], future.result()
                out[key] = answer
                if answer.text is not None and cache is not None:
                    cache.put(
                        key, self.base_url, {"text": answer.text, "logprobs": answer.logprobs}
                    )
        failed = sum(a.text is None for a in out.values())
        if failed:
            log.error(
                "%d of %d requests got no answer from %s (e.g. %s); they are counted as "
                "unanswered and asked again by the next run",
                failed,
                len(out),
                self.base_url,
                next(a.error for a in out.values() if a.text is None),
            )
        return out


def answer_pass(
    endpoint: ServedEndpoint,
    source: VQASource,
    frames: Mapping[str, pd.DataFrame],
    out_path: Path,
    *,
    image_mode: str = DataSchema.eval_image,
    prompt: PromptTemplate,
    mismatch_field: str = DataSchema.mismatch_field,
    image_change: ImageChange | None = None,
) -> dict[str, pd.DataFrame]:
    """One pass's answers to every split of `frames` from the served model, written to its
    predictions file (`out_path`, whole) and returned by split, as `predict.generate_passes`
    returns a loaded model's (`image_change`: the pass's change of each row's image)."""
    pool = pd.concat(list(frames.values())) if image_mode == "mismatched" else None
    model_id = endpoint.identity()
    records = []
    with (
        stage(f"ask {endpoint.model} -> {out_path.stem}"),
        measured(f"generate/{out_path.stem}", "rows") as phase,
    ):
        for split, frame in frames.items():
            rows = GenerationDataset(
                frame,
                source,
                processor=None,
                with_answer=False,
                image_mode=image_mode,
                prompt=prompt,
                pool=frame if pool is None else pool,
                mismatch_field=mismatch_field,
                change=image_change,
            )
            images: dict[str, str | None] = {}
            chats = []
            for i in range(len(rows)):
                key = rows.image_key(i)
                if key not in images:
                    image = rows.image(i)
                    images[key] = None if image is None else data_url(image)
                chats.append(chat_messages(rows.question(i), images[key], prompt.system))
            for (_, row), answer in zip(
                rows.frame.iterrows(), endpoint.answer_all(chats), strict=True
            ):
                record = prediction_record(
                    row, str(row[R.ID]), split, model_id, answer.text, *answer.confidence()
                )
                if answer.text is None:
                    record[SERVED_ERROR] = answer.error
                records.append(record)
        phase.items = len(records)
    text = "".join(json.dumps(r) + "\n" for r in records)
    write_file(out_path, lambda tmp: tmp.write_text(text))
    preds = read_predictions(out_path)
    return {split: ours(preds, split, model_id).reset_index(drop=True) for split in frames}


__all__ = [
    "SERVED_ERROR",
    "Answer",
    "ReplyCache",
    "ServedEndpoint",
    "ServedError",
    "answer_pass",
    "chat_messages",
    "data_url",
]
