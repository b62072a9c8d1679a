"""What others serve can enter medvqa (issue #59): `model=served` asks a model behind an
OpenAI-compatible endpoint every pass of the protocol, and scores and records it as any other.

Against loopback servers only (tests/served_server.py): a scripted one for the client's
behaviour (the cache, retries, a server that stalls, fails, returns garbage or drops the
connection, a wrong endpoint, the key), and one wrapping the tiny model in this process, whose
answers a whole `run.py model=served` must give exactly as the same model generating in-process
(slow). Unanswered items are counted and make every aggregate over them NaN; never a mean over
the rest.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from medvqa.errors import ConfigError
from medvqa.generation.served import (
    REPLIES_FILE,
    SERVED_ERROR,
    ServedEndpoint,
    ServedError,
    chat_messages,
    data_url,
)
from tests.conftest import SMALL, compose, run_main
from tests.served_server import ServedServer, model_answerer, scripted

KEY_VAR = "MEDVQA_TEST_SERVED_KEY"
KEY = "sk-test-Zq8vR2mN4pL6xW0yT3uB5cD7eF9gH1jK"  # looks like a key: must go nowhere but the server


@pytest.fixture
def server() -> Iterator[ServedServer]:
    srv = ServedServer(scripted("yes")).start()
    yield srv
    srv.stop()


def endpoint(server: ServedServer, cache: Path | None, **over: Any) -> ServedEndpoint:
    node = {
        "base_url": server.base_url,
        "model": "scripted",
        "api_key_env": None,
        "timeout": 5.0,
        "retries": 2,
        "backoff": 0.01,
        "concurrency": 4,
        "seed": 0,
        "logprobs": True,
        "cache_dir": None if cache is None else str(cache),
    }
    return ServedEndpoint.from_config(node | over, max_new_tokens=8)


def chats(n: int) -> list[list[dict[str, Any]]]:
    return [chat_messages(f"question {i}?", None, None) for i in range(n)]


# -- the chat as the API carries it -------------------------------------------------------------


def test_a_row_becomes_the_chat_a_loaded_model_sees() -> None:
    from PIL import Image

    image = data_url(Image.new("RGB", (4, 4), (10, 20, 30)))
    assert image.startswith("data:image/png;base64,")
    system, user = chat_messages("Is it? Choose: [yes, no].", image, "Answer briefly.")
    assert system == {"role": "system", "content": [{"type": "text", "text": "Answer briefly."}]}
    assert user["content"] == [
        {"type": "image_url", "image_url": {"url": image}},
        {"type": "text", "text": "Is it? Choose: [yes, no]."},
    ]
    (blind,) = chat_messages("Is it?", None, None)  # the no-image mode: no image part
    assert blind["content"] == [{"type": "text", "text": "Is it?"}]


def test_greedy_with_the_protocols_length(server: ServedServer) -> None:
    (answer,) = endpoint(server, None).answer_all(chats(1))
    assert answer.text == "yes" and answer.logprobs == [-0.25]
    (body,) = server.requests
    assert body["temperature"] == 0.0 and body["max_tokens"] == 8 and body["seed"] == 0
    assert body["model"] == "scripted" and body["logprobs"] is True


# -- the cache: a killed run asks what it lacks, a re-run nothing --------------------------------


def test_a_rerun_asks_nothing_and_a_killed_run_only_what_it_lacks(
    server: ServedServer, tmp_path: Path
) -> None:
    first = endpoint(server, tmp_path).answer_all(chats(2))  # killed after two
    assert server.count == 2
    again = endpoint(server, tmp_path).answer_all(chats(5))
    assert server.count == 5
    assert [(a.text, a.logprobs) for a in again[:2]] == [(a.text, a.logprobs) for a in first]
    endpoint(server, tmp_path).answer_all(chats(5))
    assert server.count == 5  # nothing asked twice
    endpoint(server, tmp_path, seed=1).answer_all(chats(1))  # other settings: another answer
    assert server.count == 6
    assert (tmp_path / REPLIES_FILE).is_file()


# -- servers that misbehave ----------------------------------------------------------------------


def test_500s_are_retried_with_backoff(server: ServedServer, tmp_path: Path) -> None:
    server.fail_first = 2
    (answer,) = endpoint(server, tmp_path, retries=2).answer_all(chats(1))
    assert answer.text == "yes" and server.count == 3


@pytest.mark.parametrize(
    ("behaviour", "said"),
    [
        ("fail", "HTTP 500"),
        ("slow", "timed out"),
        ("garbage", ""),
        ("drop", "connection error"),
    ],
)
def test_an_item_never_answered_is_unanswered_and_asked_again(
    server: ServedServer, tmp_path: Path, behaviour: str, said: str, caplog
) -> None:
    if behaviour == "fail":
        server.fail_first = 100
    else:
        server.behaviour, server.delay = behaviour, 1.0
    ask = endpoint(server, tmp_path, retries=1, timeout=0.3)
    with caplog.at_level(logging.ERROR):
        (answer,) = ask.answer_all(chats(1))
    assert answer.text is None and said in answer.error and "gave up after 2" in answer.error
    assert "asked again by the next run" in caplog.text
    server.behaviour, server.fail_first = "good", 0
    (answer,) = endpoint(server, tmp_path).answer_all(chats(1))  # not cached: asked again
    assert answer.text == "yes"


def test_a_wrong_endpoint_stops_the_run(server: ServedServer) -> None:
    wrong = endpoint(server, None, base_url=server.base_url + "/nowhere")
    with pytest.raises(ServedError, match=r"HTTP 404.*model\.served\.base_url"):
        wrong.answer_all(chats(1))


def test_the_key_goes_to_the_server_and_nowhere_else(
    server: ServedServer, tmp_path: Path, monkeypatch, caplog
) -> None:
    monkeypatch.setenv(KEY_VAR, KEY)
    ask = endpoint(server, tmp_path, api_key_env=KEY_VAR)
    with caplog.at_level(logging.DEBUG):
        ask.answer_all(chats(2))
    assert server.authorizations == [f"Bearer {KEY}"] * 2
    assert KEY not in caplog.text and KEY not in json.dumps(ask.record())
    assert not any(KEY.encode() in p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())


# -- refused before any work ----------------------------------------------------------------------


def _checked(*overrides: str) -> None:
    from medvqa.config import check_config

    cfg = compose(["model=served", "logger=csv", *overrides])
    check_config(cfg)


@pytest.mark.heavy
def test_a_served_model_is_never_trained_and_needs_its_endpoint() -> None:
    where = ["model.served.base_url=http://127.0.0.1:9/v1", "model.served.model=m"]
    _checked("peft=none", *where)
    with pytest.raises(ConfigError, match=r"model=served with peft=lora.*add peft=none"):
        _checked("peft=lora", *where)
    with pytest.raises(ConfigError, match=r"model\.served\.base_url: not set"):
        _checked("peft=none", "model.served.model=m")
    with pytest.raises(ConfigError, match="looks like an API key") as refused:
        _checked("peft=none", *where, f"model.served.api_key_env={KEY}")
    assert KEY not in str(refused.value)


# -- unanswered items: counted, their aggregates NaN -------------------------------------------


def _answers(predictions: list[str | None]) -> pd.DataFrame:
    rows = []
    for i, prediction in enumerate(predictions):
        closed = i % 2 == 0
        rows.append({
            "id": f"q{i}", "question": "Is there a lesion?" if closed else "Which organ?",
            "answer": "yes" if closed else "liver", "prediction": prediction,
            "answer_type": "closed" if closed else "open",
            "candidates": ["yes", "no"] if closed else None, "case_id": f"c{i}",
            "question_type": "abnormality" if closed else "organ", "split": "test_iid",
        })  # fmt: skip
    return pd.DataFrame(rows)


def test_unanswered_items_make_every_aggregate_over_them_nan() -> None:
    from medvqa.scoring.pipeline import Scoring, failed_items
    from medvqa.views import score_job

    cfg = compose(["metric=[traditional]", "evaluation.breakdown=[question_type]"])
    answered = _answers(["yes", "liver", "no", "liver"])
    holes = _answers(["yes", "liver", None, "liver"])
    with Scoring.from_config(cfg.metric, cfg.evaluation) as scoring:
        whole, _ = score_job(scoring, {"": {"test_iid": answered, "test_ood": answered}})
        metrics, scored = score_job(scoring, {"": {"test_iid": holes, "test_ood": answered}})
    assert metrics["test_iid/unanswered"] == 1 and failed_items(metrics) == 1
    assert metrics["test_iid/n"] == 4  # counted, not dropped
    assert math.isnan(metrics["test_iid/closed_acc"])  # not 1/1 over the answered closed row
    assert math.isnan(metrics["test_iid/question_type=abnormality/closed_acc"])
    assert metrics["test_iid/question_type=organ/open_f1"] == whole["test_iid/open_f1"]
    assert math.isnan(metrics["robustness/rr_closed"])
    assert metrics["test_ood/closed_acc"] == whole["test_ood/closed_acc"]
    assert "test_ood/unanswered" not in metrics and "robustness/rr_unanswered" not in metrics
    iid = scored[""].loc[scored[""]["split"] == "test_iid"]
    assert iid["closed_correct"].isna().tolist() == [False, True, True, True]  # open, unanswered


def test_a_pass_the_server_could_not_answer_is_recorded_and_counted(
    server: ServedServer, cache_dir: Path, tmp_path: Path
) -> None:
    """`answer_pass` writes a pass's predictions file: the answered rows as a loaded model's
    are written, the unanswered ones with no prediction and the reason; scored, they are
    counted and every aggregate over them is NaN."""
    from medvqa.data.sources.synthetic import SyntheticVQA
    from medvqa.generation.served import answer_pass
    from medvqa.models.prompting import PLAIN
    from medvqa.scoring.pipeline import Scoring, failed_items
    from medvqa.views import score_job

    source = SyntheticVQA(cache_dir, n_cases=6, image_size=32, questions_per_image=2)
    frame = source.table().head(4)
    ask = endpoint(server, tmp_path / "cache", retries=0)
    answer_pass(ask, source, {"test_iid": frame.head(2)}, tmp_path / "p.jsonl", prompt=PLAIN)
    server.fail_first = 2  # the two rows not asked yet fail; the cached two are not asked
    out = answer_pass(ask, source, {"test_iid": frame}, tmp_path / "p.jsonl", prompt=PLAIN)
    rows = out["test_iid"]
    assert rows["prediction"].isna().tolist() == [False, False, True, True]
    assert rows["prediction"].iloc[0] == "yes"
    assert rows[SERVED_ERROR].iloc[2].startswith("HTTP 500")
    assert rows["model"].nunique() == 1 and rows["answer_logprob_mean"].iloc[0] == -0.25
    cfg = compose(["metric=[traditional]"])
    with Scoring.from_config(cfg.metric, cfg.evaluation) as scoring:
        metrics, _ = score_job(scoring, {"": out})
    assert metrics["test_iid/unanswered"] == 2 and failed_items(metrics) == 2
    assert math.isnan(metrics["test_iid/closed_acc"]) and math.isnan(metrics["test_iid/open_f1"])


def test_without_logprobs_calibration_says_why_it_has_no_figures(caplog) -> None:
    from medvqa.scoring.pipeline import Scoring
    from medvqa.views import score_job

    cfg = compose(["metric=[traditional,calibration]", "metric.calibration.min_rows=1"])
    frame = _answers(["yes", "liver", "no", "liver"])
    with (
        Scoring.from_config(cfg.metric, cfg.evaluation) as scoring,
        caplog.at_level(logging.WARNING),
    ):
        metrics, _ = score_job(scoring, {"": {"test_iid": frame, "test_ood": frame}})
    assert math.isnan(metrics["test_iid/calibration_closed_ece"])
    assert "a served model whose server returns no logprobs" in caplog.text


# -- the whole protocol against a loopback server wrapping the tiny model ------------------------

# Every pass: the counterfactual images, an option order, paraphrases, the validation split.
PROTOCOL = [
    "+experiment=synthetic_beyond_accuracy",
    "debug=smoke",
    "logger=csv",
    "data.extra_eval_images=[blank,shuffled,mismatched,none]",
]
PASSES = ["", "blank", "shuffled", "mismatched", "none", "order1"]
DATA = [o for o in SMALL if o.startswith("dataset.")]  # a served model has no builder


def _predictions(run: Path, prefix: str) -> pd.DataFrame:
    name = f"predictions_{prefix}.jsonl" if prefix else "predictions.jsonl"
    rows = [json.loads(line) for line in (run / name).read_text().splitlines()]
    return pd.DataFrame(rows).sort_values(["split", "id"]).reset_index(drop=True)


@pytest.fixture(scope="module")
def tiny(cache_dir: Path) -> Any:
    from medvqa.models.loading import load_vlm

    return load_vlm(compose(SMALL, cache_dir).model)


@pytest.mark.slow
def test_a_served_model_goes_through_the_whole_protocol_as_in_process(
    tiny: Any, cache_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    """Every pass's answers (and their log-probabilities) from a loopback server wrapping the
    tiny model are those the same model gives generating in-process; the record is a run's
    record; a re-run asks nothing; the key is in no file; the report lists it."""
    model, processor = tiny
    model.eval()
    local = run_main([*PROTOCOL, "peft=none"], tmp_path / "local", cache_dir)
    assert local.returncode == 0, local.stderr[-3000:]
    server = ServedServer(model_answerer(model, processor)).start()
    served_args = [
        *PROTOCOL,
        "model=served",
        "peft=none",
        f"model.served.base_url={server.base_url}",
        "model.served.model=tiny",
        f"model.served.api_key_env={KEY_VAR}",
    ]
    try:
        served = run_main(served_args, tmp_path / "served", cache_dir, env={KEY_VAR: KEY},
                          small=DATA)  # fmt: skip
        assert served.returncode == 0, served.stderr[-3000:]
        asked = server.count
        again = run_main([*served_args, "force=true"], tmp_path / "served", cache_dir,
                         env={KEY_VAR: KEY}, small=DATA)  # fmt: skip
        assert again.returncode == 0, again.stderr[-3000:]
        assert server.count == asked  # a re-run asks nothing
    finally:
        server.stop()
    assert set(server.authorizations) == {f"Bearer {KEY}"}

    record = json.loads((tmp_path / "served" / "results.json").read_text())
    mine = json.loads((tmp_path / "local" / "results.json").read_text())
    assert record["status"] == mine["status"] == "finished"
    assert record["config"]["model"]["name"] == "served:tiny"
    for prefix in PASSES:
        ours, theirs = (
            _predictions(tmp_path / "served", prefix),
            _predictions(tmp_path / "local", prefix),
        )
        assert list(ours["id"]) == list(theirs["id"]), prefix
        assert list(ours["prediction"]) == list(theirs["prediction"]), prefix
        for column in ("answer_logprob_mean", "answer_logprob_min", "answer_tokens"):
            assert ours[column].to_numpy() == pytest.approx(theirs[column].to_numpy(), abs=1e-5)
    for key, value in mine["metrics"].items():
        if "calibration" in key or key.startswith("zero_shot/") or value is None:
            continue  # the temperature fit needs every temperature's log-probabilities
        assert record["metrics"].get(key) == pytest.approx(value, abs=1e-9), key

    written = [p for d in (tmp_path / "served", cache_dir / "served") for p in d.rglob("*")]
    assert not any(KEY.encode() in p.read_bytes() for p in written if p.is_file())
    assert KEY not in served.stdout + served.stderr

    from medvqa.analysis.aggregate import collect

    runs = collect([tmp_path / "served", tmp_path / "local"])
    assert {"served:tiny", "tiny"} <= set(runs["model"])


@pytest.mark.slow
def test_a_run_the_server_left_unanswered_is_incomplete_and_finished_by_the_next(
    cache_dir: Path, tmp_path: Path
) -> None:
    """Five requests that fail: their items recorded, the run `incomplete` (exit status 3)
    with their aggregates NaN; the next run asks only what it lacks and finishes."""
    server = ServedServer(scripted("yes")).start()
    args = [
        *PROTOCOL,
        "model=served",
        "peft=none",
        f"model.served.base_url={server.base_url}",
        "model.served.model=scripted",
        "model.served.retries=0",
        f"model.served.cache_dir={tmp_path / 'answers'}",
    ]
    try:
        server.fail_first = 5
        first = run_main(args, tmp_path / "run", cache_dir, small=DATA)
        asked = server.count
        assert first.returncode == 3, first.stderr[-3000:]
        record = json.loads((tmp_path / "run" / "results.json").read_text())
        assert record["status"] == "incomplete" and record["failed_items"] == 5
        unanswered = {  # per split and pass (breakdown groups count them again)
            k: v for k, v in record["metrics"].items() if k.endswith("/unanswered") and "=" not in k
        }
        assert sum(unanswered.values()) == 5
        for key in unanswered:  # each split or pass that lacks answers has no score
            assert record["metrics"][key.replace("unanswered", "n")] > 0
            assert record["metrics"].get(key.replace("unanswered", "closed_acc")) is None
        second = run_main(args, tmp_path / "run", cache_dir, small=DATA)
    finally:
        server.stop()
    assert second.returncode == 0, second.stderr[-3000:]
    # Only what the first run lacked: at most the five (a later pass asking the same chat got
    # its answer in the first run already), and never an answer it had.
    assert 0 < server.count - asked <= 5
    record = json.loads((tmp_path / "run" / "results.json").read_text())
    assert record["status"] == "finished" and "failed_items" not in record
