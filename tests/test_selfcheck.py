"""The judge's self-check: known verdicts answered before a judge's scores are trusted."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from medvqa.analysis.aggregate import collect
from medvqa.analysis.summary import summary_table, write_summary
from medvqa.analysis.tables import long_table
from medvqa.judge.cache import JudgeCache
from medvqa.judge.rubrics import RUBRICS
from medvqa.judge.selfcheck import CLASS_ITEMS, ITEMS, selfcheck_items
from medvqa.scoring.metrics.aspect_judge import AspectJudgeMetric
from medvqa.scoring.metrics.judge import JudgeMetric
from medvqa.scoring.pipeline import unreliable
from tests.judge_server import JudgeServer
from tests.test_judge import MIXED, needs_smollm2, openai_backend
from tests.test_report import headline, write_record

EXPECTED = {(q, a, p): v for _, q, a, p, v in ITEMS}


def knows_the_verdicts(system: str, item: dict[str, str]) -> str:
    """A judge that agrees with every known verdict (multilabel in points: 0, 1, 2)."""
    value = EXPECTED[(item["question"], item["ground_truth"], item["prediction"])]
    return str(int(value * 2)) if '"score": <0, 1 or 2>' in system else str(int(value))


def says_correct(system: str, item: dict[str, str]) -> str:
    """The constant judge: every answer is right."""
    if '"score": <1, 2, 3, 4 or 5>' in system:
        return "5"
    return "2" if '"score": <0, 1 or 2>' in system else "1"


def metric(server: JudgeServer, cache_dir: Path | None) -> JudgeMetric:
    backend = openai_backend(
        mode="generate", model="m", base_url=server.base_url, api_key_env=None, retries=0
    )
    cache = JudgeCache(cache_dir) if cache_dir else None
    return JudgeMetric(backend, cache, selfcheck_floors=(0.8, 0.5))


def test_no_item_is_answered_by_the_shortcut() -> None:
    pairs = selfcheck_items(RUBRICS)
    assert not any(item.shortcut() for item, _ in pairs)
    assert {item.rubric.name for item, _ in pairs} == set(RUBRICS)


def test_a_judge_that_knows_the_verdicts_passes_and_is_asked_once(tmp_path: Path) -> None:
    server = JudgeServer(score_fn=knows_the_verdicts).start()
    try:
        m = metric(server, tmp_path)
        m.per_sample(MIXED.iloc[[3]])  # a shortcut row: only the self-check reaches the server
        counters = m.counters()
        assert counters["judge/selfcheck_closed_acc"] == 1.0
        assert counters["judge/selfcheck_open_tau"] == pytest.approx(1.0)
        assert counters["judge/selfcheck_false_correct"] == 0.0
        assert counters["judge/selfcheck_reliable"] == 1.0
        assert counters["judge/calls"] == 0  # the run's counters do not count the check
        assert server.count == len(ITEMS)
        m.close()
        again = metric(server, tmp_path)
        again.per_sample(MIXED.iloc[[3]])
        assert server.count == len(ITEMS)  # cached per judge
        assert again.counters()["judge/selfcheck_reliable"] == 1.0
    finally:
        server.stop()


def test_a_judge_that_calls_everything_correct_is_unreliable() -> None:
    server = JudgeServer(score_fn=says_correct).start()
    try:
        m = metric(server, None)
        m.per_sample(MIXED.iloc[[3]])
        counters = m.counters()
        assert counters["judge/selfcheck_false_correct"] == 1.0
        assert counters["judge/selfcheck_closed_acc"] < 0.8
        assert math.isnan(counters["judge/selfcheck_open_tau"])  # a constant has no ranking
        assert counters["judge/selfcheck_reliable"] == 0.0
    finally:
        server.stop()


def test_unreliable_judge_scores_are_marked_in_the_summary_and_the_report(
    tmp_path: Path,
) -> None:
    metrics = {
        "test_iid/judge_closed_acc": 0.9,
        "test_ood/judge_closed_acc": 0.8,
        "test_iid/open_f1": 0.5,
        "judge/selfcheck_reliable": 0.0,
    }
    table = summary_table(metrics, [("LoRA", "")], "judge_closed_acc", "open_f1")
    write_summary(table, tmp_path)
    md = (tmp_path / "summary.md").read_text()
    assert md.count("(unreliable judge)") == 2  # the two closed numbers; open_f1 is not judged
    assert "0.500 (unreliable" not in md

    m = headline(np.random.default_rng(14))
    m = {k.replace("closed_acc", "judge_closed_acc"): v for k, v in m.items()}
    path = write_record(tmp_path / "runs", "lora", 0, metrics={**m, **metrics})
    record = json.loads(path.read_text())
    record["config"]["evaluation"]["primary_closed"] = "judge_closed_acc"
    path.write_text(json.dumps(record))
    long = long_table(collect([tmp_path / "runs"]))
    cells = long.set_index("column")["text"]
    assert "judge failed its self-check (1/1)" in cells["closed i.i.d."]
    assert "self-check" not in cells["open i.i.d."]
    assert unreliable({"aspect_judge/selfcheck_reliable": 0.0}, "aspect_acc")  # aspect_ scores


@pytest.mark.slow  # about a minute: converts the GGUF and judges the 26 items on the CPU
@needs_smollm2
def test_the_embedded_smollm2_judge_is_flagged_unreliable(tmp_path: Path) -> None:
    m = JudgeMetric.from_config({"backend": "hf", "mode": "logits", "cache_dir": str(tmp_path)})
    result = m.check()
    assert result is not None and not result.reliable
    assert result.false_correct > 0.5  # it calls wrong closed answers correct


CLASS_EXPECTED = {(q, c, a, p): v for q, c, a, p, v in CLASS_ITEMS}


def test_the_aspect_judge_is_checked_on_its_own_items() -> None:
    def knows(system: str, item: dict[str, str]) -> str:
        key = (item["question"], item["aspect"], item["ground_truth"], item["prediction"])
        return str(int(CLASS_EXPECTED[key]))

    for score_fn, reliable in ((knows, 1.0), (says_correct, 0.0)):
        server = JudgeServer(score_fn=score_fn).start()
        try:
            backend = openai_backend(
                mode="generate", model="m", base_url=server.base_url, api_key_env=None
            )
            m = AspectJudgeMetric(backend, selfcheck_floors=(0.8, 0.5))
            assert m.check() is not None and math.isnan(m.selfcheck.open_tau)  # no open items
            assert m.counters()["aspect_judge/selfcheck_reliable"] == reliable
            assert server.count == len(CLASS_ITEMS)
        finally:
            server.stop()
