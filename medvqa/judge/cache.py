"""The LLM judge's memory: one SQLite file of judgments, shared by runs and concurrent jobs.

A judgment is keyed by everything that decides it: the judge (backend, model, mode), the
rubric version (its hash) and the (question, ground truth, prediction) triple. A changed rubric
or another judge model therefore never reuses a stale score. Each judgment is written the moment
it is made, so a run killed halfway and restarted repeats no call. Failed judgments are stored
too (status ``failed`` with the error), so they are visible, and are retried on the next run.

WAL mode lets several jobs read while one writes; `busy_timeout` makes a writer wait for
another instead of failing.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medvqa.hashing import content_hash

__all__ = [
    "CACHE_FILE",
    "STATUSES",
    "CachedJudgment",
    "JudgeCache",
    "SqliteStore",
    "cache_from_config",
]

CACHE_FILE = "judgments.sqlite"
STATUSES = ("ok", "failed")
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS judgments (
    key TEXT PRIMARY KEY,
    judge_id TEXT NOT NULL,
    rubric_id TEXT NOT NULL,
    question TEXT NOT NULL,
    answer TEXT NOT NULL,
    prediction TEXT NOT NULL,
    score REAL,
    reason TEXT NOT NULL DEFAULT '',
    raw TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL CHECK (status IN ('ok', 'failed')),
    error TEXT NOT NULL DEFAULT '',
    attempts INTEGER NOT NULL DEFAULT 1,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS judgments_judge ON judgments (judge_id, rubric_id, status);
"""


@dataclass(frozen=True)
class CachedJudgment:
    """One stored judgment. `attempts` counts the runs that tried it (failures are retried)."""

    score: float | None
    reason: str
    raw: str
    status: str
    error: str
    attempts: int
    created: float


class SqliteStore:
    """One SQLite file of records written the moment they are made, shared by runs and
    concurrent jobs (WAL, a writer waits for another); use as a context manager or call
    `close()`. Subclasses give the file's name, its schema and the setting that moves it."""

    FILE: str
    SCHEMA: str
    VERSION: int
    WHAT: str  # what the store holds, for the error ("the judge cache")
    SETTING: str  # the config key that chooses its folder ("judge.cache_dir")

    def __init__(self, cache_dir: str | Path) -> None:
        self.path = Path(cache_dir).expanduser() / self.FILE
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(
                self.path, timeout=60.0, isolation_level=None, check_same_thread=False
            )
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute("PRAGMA busy_timeout=60000")
            self._conn.executescript(self.SCHEMA)
            self._conn.execute(f"PRAGMA user_version={self.VERSION}")
        except (OSError, sqlite3.Error) as err:
            raise OSError(
                f"cannot open {self.WHAT} {self.path}: {err}. Set {self.SETTING} (or "
                "paths.cache_dir / MEDVQA_CACHE) to a writable directory."
            ) from err
        # The callers may share the object between threads (a judge's or a served model's
        # concurrent requests); a lock keeps the single connection safe.
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> SqliteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class JudgeCache(SqliteStore):
    """A SQLite judgment store in `cache_dir`."""

    FILE, SCHEMA, VERSION = CACHE_FILE, _SCHEMA, SCHEMA_VERSION
    WHAT, SETTING = "the judge cache", "judge.cache_dir"

    @staticmethod
    def key(judge_id: str, rubric_id: str, question: str, answer: str, prediction: str) -> str:
        """A fixed-length key; JSON keeps fields apart ("a|b"+"c" vs "a"+"b|c")."""
        # A JSON list with non-ASCII kept as is (not canonical JSON), so that the keys of
        # judgments already stored stay what they were.
        blob = json.dumps([judge_id, rubric_id, question, answer, prediction], ensure_ascii=False)
        return content_hash(blob, length=None)

    def get_many(self, keys: Iterable[str]) -> dict[str, CachedJudgment]:
        """The stored judgments among `keys` (ok and failed alike)."""
        keys = list(dict.fromkeys(keys))
        found: dict[str, CachedJudgment] = {}
        step = 500  # below SQLite's host-parameter limit
        with self._lock:
            for i in range(0, len(keys), step):
                chunk = keys[i : i + step]
                rows = self._conn.execute(
                    "SELECT key, score, reason, raw, status, error, attempts, created "
                    f"FROM judgments WHERE key IN ({','.join('?' * len(chunk))})",
                    chunk,
                ).fetchall()
                for key, *rest in rows:
                    found[key] = CachedJudgment(*rest)
        return found

    def put(
        self,
        key: str,
        *,
        judge_id: str,
        rubric_id: str,
        question: str,
        answer: str,
        prediction: str,
        score: float | None,
        reason: str,
        raw: str,
        status: str,
        error: str = "",
    ) -> None:
        """Store one judgment now (autocommit); a retried failure keeps its attempt count."""
        if status not in STATUSES:
            raise ValueError(f"judgment status {status!r} is not one of {STATUSES}")
        with self._lock:
            self._conn.execute(
                "INSERT INTO judgments (key, judge_id, rubric_id, question, answer, prediction,"
                " score, reason, raw, status, error, attempts, created)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?)"
                " ON CONFLICT(key) DO UPDATE SET score=excluded.score, reason=excluded.reason,"
                " raw=excluded.raw, status=excluded.status, error=excluded.error,"
                " attempts=judgments.attempts + 1, created=excluded.created",
                (
                    key,
                    judge_id,
                    rubric_id,
                    question,
                    answer,
                    prediction,
                    score,
                    reason,
                    raw,
                    status,
                    error,
                    time.time(),
                ),
            )

    def counts(self) -> dict[str, int]:
        """Stored judgments per status (for logs and tests)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT status, COUNT(*) FROM judgments GROUP BY status"
            ).fetchall()
        return {status: 0 for status in STATUSES} | dict(rows)


def cache_from_config(cfg: Mapping[str, Any]) -> JudgeCache | None:
    """The cache a `judge` config group names in `cache_dir` (conf/judge/default.yaml), or
    None when it names none (every item is then judged afresh)."""
    cache_dir = cfg.get("cache_dir")
    return JudgeCache(cache_dir) if cache_dir else None
