"""The per-aspect (Kvasir question class) judge over real HTTP to the scripted judge server."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from medvqa.judge.cache import JudgeCache
from medvqa.judge.rubrics import CLASS_RUBRIC, RUBRICS, Rubric
from medvqa.scoring.metrics.aspect_judge import (
    CLASS_ACC,
    CLASS_FAILED,
    CLASS_SCORES,
    AspectJudgeMetric,
    aspects_of,
)
from medvqa.scoring.pipeline import build_families, counters, score_frame
from tests.conftest import compose
from tests.judge_server import JudgeServer
from tests.test_judge import openai_backend

# (question, answer, prediction, question_class, complexity)
ROWS = [
    # 0: normalised exact match: 1 on both aspects, no call
    ("Is there a polyp, and of which type?", "a paris is polyp", "A Paris IS polyp.",
     ["polyp_count", "polyp_type"], 2),
    # 1: right type, wrong instrument
    ("Which polyp type, and is an instrument visible?", "paris ip polyp, no instrument",
     "paris ip polyp next to a biopsy forceps", ["polyp_type", "instrument_presence"], 2),
    # 2: wrong location
    ("Where is the abnormality?", "upper-left", "in the centre", ["abnormality_location"], 1),
    # 3: same meaning, other words
    ("Is there text in the image?", "no text", "the image has no writing",
     ["text_presence"], 1),
    # 4: three aspects, one wrong
    ("Describe the polyp: type, size and number.", "one paris is polyp of 5-10mm",
     "a single paris is polyp larger than 20mm", ["polyp_type", "polyp_size", "polyp_count"], 3),
    # 5 and 6: no question classes -> NaN
    ("Anything else?", "no", "yes", [], 1),
    ("Anything more?", "no", "yes", None, 2),
    # 7: a duplicate of row 2 (judged once)
    ("Where is the abnormality?", "upper-left", "in the centre", ["abnormality_location"], 1),
]  # fmt: skip

# What the scripted judge answers per (prediction, aspect); anything else is a test bug.
VERDICTS = {
    ("paris ip polyp next to a biopsy forceps", "polyp_type"): "1",
    ("paris ip polyp next to a biopsy forceps", "instrument_presence"): "0",
    ("in the centre", "abnormality_location"): "0",
    ("the image has no writing", "text_presence"): "1",
    ("a single paris is polyp larger than 20mm", "polyp_type"): "1",
    ("a single paris is polyp larger than 20mm", "polyp_size"): "0",
    ("a single paris is polyp larger than 20mm", "polyp_count"): "1",
}
N_JUDGED = len(VERDICTS)  # distinct (item, aspect) pairs that need the judge
N_SHORTCUT = 2  # row 0's two aspects
EXPECTED_SCORES = [
    {"polyp_count": 1.0, "polyp_type": 1.0},
    {"polyp_type": 1.0, "instrument_presence": 0.0},
    {"abnormality_location": 0.0},
    {"text_presence": 1.0},
    {"polyp_type": 1.0, "polyp_size": 0.0, "polyp_count": 1.0},
    {},
    {},
    {"abnormality_location": 0.0},
]
EXPECTED_ROW_ACC = [1.0, 0.5, 0.0, 1.0, 2 / 3, math.nan, math.nan, 0.0]


def scripted(system: str, item: dict[str, str]) -> str:
    assert system == CLASS_RUBRIC.text
    return VERDICTS[(item["prediction"], item["aspect"])]


def table() -> pd.DataFrame:
    df = pd.DataFrame(
        ROWS, columns=["question", "answer", "prediction", "question_class", "complexity"]
    )
    df["answer_type"] = "open"
    df.index = [20 + i for i in range(len(df))]  # not a RangeIndex: the index must be kept
    return df


@pytest.fixture
def server() -> Iterator[JudgeServer]:
    srv = JudgeServer(score_fn=scripted).start()
    yield srv
    srv.stop()


def metric(server: JudgeServer, cache_dir: Path | None, **options: object) -> AspectJudgeMetric:
    backend = openai_backend(
        **{
            "model": "scripted-judge",
            "base_url": server.base_url,
            "api_key_env": None,
            "timeout": 5.0,
            "retries": 1,
            "backoff": 0.01,
            "concurrency": 2,
            **options,
        }
    )
    return AspectJudgeMetric(backend, JudgeCache(cache_dir) if cache_dir else None)


def assert_scores(got: list[dict[str, float]], expected: list[dict[str, float]]) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.keys() == e.keys()
        for k in e:
            assert (math.isnan(g[k]) and math.isnan(e[k])) or g[k] == e[k], (k, g, e)


def test_rubric_is_versioned_and_shows_the_aspect() -> None:
    rubric = CLASS_RUBRIC
    assert rubric.id.startswith("aspect-") and len(rubric.id) == len("aspect-") + 12
    assert rubric.id not in {r.id for r in RUBRICS.values()}
    assert (rubric.labels, rubric.values, rubric.reduce) == (("0", "1"), (0, 1), "argmax")
    assert rubric.input_keys == ("question", "aspect", "ground_truth", "prediction")
    edited = Rubric(
        "aspect", rubric.text + " Be strict.", rubric.labels, rubric.values, rubric.reduce,
        input_keys=rubric.input_keys,
    )  # fmt: skip
    assert edited.id != rubric.id
    assert '{"score": <0 or 1>, "reason": ' in rubric.text
    no_aspect = Rubric("aspect", rubric.text, rubric.labels, rubric.values, rubric.reduce)
    with pytest.raises(ValueError, match="aspect"):
        AspectJudgeMetric(
            openai_backend(model="m", base_url="http://127.0.0.1:9/v1"), None, no_aspect
        )


def test_aspects_of() -> None:
    import numpy as np

    assert aspects_of(["polyp_type", "polyp_type", " ", "instrument_presence"]) == [
        "polyp_type",
        "instrument_presence",
    ]
    assert aspects_of(np.array(["a", "b"], dtype=object)) == ["a", "b"]
    assert aspects_of("polyp_type") == ["polyp_type"]
    assert aspects_of(None) == aspects_of(float("nan")) == aspects_of([]) == []


def test_per_class_accuracy_shortcut_and_rescore(server: JudgeServer, tmp_path: Path) -> None:
    preds = table()
    m = metric(server, tmp_path)
    scored, scores = score_frame(preds, [m], breakdown=["complexity"])

    # One request per distinct (item, aspect); row 0 went through the shortcut, row 7 is a
    # duplicate of row 2, rows 5 and 6 have no aspects.
    assert server.count == N_JUDGED
    assert "A Paris IS polyp." not in server.predictions()
    user = json.loads(server.requests[0]["messages"][1]["content"])
    assert list(user) == ["question", "aspect", "ground_truth", "prediction"]
    assert server.requests[0]["messages"][0]["content"] == CLASS_RUBRIC.text
    assert m.counters() == {
        "aspect_judge/calls": N_JUDGED,
        "aspect_judge/retries": 0,
        "aspect_judge/cache_hits": 0,
        "aspect_judge/shortcut_hits": N_SHORTCUT,
        "aspect_judge/failures": 0,
    }
    assert counters([m])["aspect_judge/calls"] == N_JUDGED

    assert scored.index.tolist() == preds.index.tolist()
    assert_scores(scored[CLASS_SCORES].tolist(), EXPECTED_SCORES)
    assert scored[CLASS_ACC].tolist() == pytest.approx(EXPECTED_ROW_ACC, nan_ok=True)
    assert scored[CLASS_FAILED].tolist() == [0] * len(ROWS)
    assert scored.loc[20, "aspect_reasons"]["polyp_type"].startswith("normalised exact match")
    assert scored.loc[21, "aspect_reasons"]["instrument_presence"] == "scripted"

    # Pairs: row0 1,1; row1 1,0; row2 0; row3 1; row4 1,0,1; row7 0 -> 6 of 10.
    assert scores["aspect_acc"] == pytest.approx(0.6)
    per_class = {k: v for k, v in scores.items() if k.startswith("aspect_acc_")}
    assert per_class == {
        "aspect_acc_abnormality_location": 0.0,
        "aspect_acc_instrument_presence": 0.0,
        "aspect_acc_polyp_count": 1.0,
        "aspect_acc_polyp_size": 0.0,
        "aspect_acc_polyp_type": 1.0,
        "aspect_acc_text_presence": 1.0,
    }
    assert scores["aspect_failures"] == 0
    # Per complexity level, from the breakdown: 1 -> rows 2, 3, 7 (+5, no aspects);
    # 2 -> rows 0, 1 (+6); 3 -> row 4.
    assert scores["complexity=1/aspect_acc"] == pytest.approx(1 / 3)
    assert scores["complexity=2/aspect_acc"] == pytest.approx(3 / 4)
    assert scores["complexity=3/aspect_acc"] == pytest.approx(2 / 3)
    assert scores["complexity=3/aspect_acc_polyp_size"] == 0.0
    assert "complexity=3/aspect_acc_text_presence" not in scores
    # Rows without aspects only: NaN, not 0.
    assert math.isnan(m.aggregate(scored.loc[[25, 26]])["aspect_acc"])

    # A re-score (new metric, same cache) makes zero calls and gives the same table.
    m.close()
    again = metric(server, tmp_path)
    rescored, rescores = score_frame(preds, [again], breakdown=["complexity"])
    assert server.count == N_JUDGED
    assert again.counters()["aspect_judge/calls"] == 0
    assert again.counters()["aspect_judge/cache_hits"] == N_JUDGED
    assert_scores(rescored[CLASS_SCORES].tolist(), EXPECTED_SCORES)
    assert rescores == pytest.approx(scores, nan_ok=True)
    again.close()


def test_cache_key_holds_the_aspect(tmp_path: Path) -> None:
    m = AspectJudgeMetric(openai_backend(model="m", base_url="http://127.0.0.1:9/v1"))
    keys = {m.item_key("q", "a", "p", aspect) for aspect in ("polyp_type", "polyp_size")}
    assert len(keys) == 2
    assert m.item_key("q", "a", "p", "x") != JudgeCache.key(
        m.backend.judge_id, RUBRICS["closed"].id, "q", "a", "p"
    )


def test_failures_are_counted_and_retried(server: JudgeServer, tmp_path: Path) -> None:
    preds = table()
    server.behaviour = "garbage"
    m = metric(server, tmp_path)
    scored, scores = score_frame(preds, [m])
    # Each distinct pair: one request and one reminder, both unreadable.
    assert server.count == 2 * N_JUDGED
    assert m.counters()["aspect_judge/failures"] == N_JUDGED
    assert m.counters()["aspect_judge/retries"] == 0
    assert scored[CLASS_FAILED].tolist() == [0, 2, 1, 1, 3, 0, 0, 1]
    assert scores["aspect_failures"] == 8
    # Only the shortcut pairs were judged: no mean over them stands for the rest.
    for key in ("aspect_acc", "aspect_acc_polyp_type", "aspect_acc_polyp_size"):
        assert math.isnan(scores[key]), key
    assert math.isnan(scores["aspect_acc_text_presence"])
    assert scored[CLASS_ACC].tolist() == pytest.approx(
        [1.0] + [math.nan] * (len(ROWS) - 1), nan_ok=True
    )
    assert math.isnan(scored.loc[24, CLASS_SCORES]["polyp_size"])
    assert "unreadable judge reply" in scored.loc[24, "aspect_reasons"]["polyp_size"]
    m.close()

    # The next run retries the failures (they are cached as failed, not as scores).
    server.behaviour = "good"
    retry = metric(server, tmp_path)
    scored, scores = score_frame(preds, [retry])
    assert retry.counters()["aspect_judge/calls"] == N_JUDGED
    assert_scores(scored[CLASS_SCORES].tolist(), EXPECTED_SCORES)
    assert scores["aspect_failures"] == 0 and scores["aspect_acc"] == pytest.approx(0.6)
    retry.close()


def test_logits_mode(server: JudgeServer) -> None:
    server.label_probs = {"0": 0.3, "1": 0.6}
    m = metric(server, None, mode="logits")
    scored = m.per_sample(table())
    assert server.count == N_JUDGED
    assert all(body.get("logprobs") for body in server.requests)
    expected = [{k: 1.0 for k in row} for row in EXPECTED_SCORES]  # argmax over 0/1 -> 1
    assert_scores(scored[CLASS_SCORES].tolist(), expected)


def test_missing_question_class_is_a_clear_error() -> None:
    m = AspectJudgeMetric(openai_backend(model="m", base_url="http://127.0.0.1:9/v1"))
    with pytest.raises(ValueError, match="question_class"):
        m.per_sample(table().drop(columns="question_class"))


@pytest.mark.slow
@pytest.mark.heavy
def test_config_builds_the_metric(server: JudgeServer, tmp_path: Path) -> None:
    cfg = compose(
        [
            "metric=aspect_judge",
            "judge.backend=openai",
            "judge.model=scripted-judge",
            f"judge.base_url={server.base_url}",
            "judge.mode=generate",
        ],
        cache=tmp_path,
    )
    (built,) = build_families(cfg.metric)
    assert isinstance(built, AspectJudgeMetric)
    assert built.cache is not None and built.cache.path.parent == tmp_path / "judge"
    _, scores = score_frame(table(), [built])
    assert scores["aspect_acc"] == pytest.approx(0.6)
    built.close()
