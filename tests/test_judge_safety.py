"""Issue #20, defects 8 and 9: a self-check item the judge could not answer is unknown, not
wrong; the API key goes only where it belongs and is never recorded; labels, metadata and
predictions cannot inject markup into the summary, the tables or the rater page."""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import DictConfig, OmegaConf

from medvqa.analysis.aggregate import collect
from medvqa.analysis.rater.page import rating_page
from medvqa.analysis.rater.study import SHEET_COLUMNS
from medvqa.analysis.summary import summary_table, write_summary
from medvqa.analysis.tables import issues_table, long_table, write_tables
from medvqa.cli.score import compose
from medvqa.cli.score import main as score_main
from medvqa.judge.backend_openai import OpenAIBackend
from medvqa.judge.errors import JudgeConfigError
from medvqa.judge.selfcheck import ITEMS
from tests.conftest import run_main
from tests.judge_server import JudgeServer
from tests.test_report import headline, write_record

# -- defect 8: the self-check ------------------------------------------------------------------

EXPECTED = {(q, a, p): v for _, q, a, p, v in ITEMS}
CLOSED = [(r, q, a, p, v) for r, q, a, p, v in ITEMS if r != "open"]
# The judge below gets these closed items wrong: 11 of the 16 closed and multilabel items right.
WRONG = {(q, a, p) for _, q, a, p, _ in CLOSED[1:6]}
# ... and, while its server is unwell, cannot answer two of those it gets right.
UNANSWERED = {(q, a, p) for _, q, a, p, _ in CLOSED[6:8]}
TRUE_CLOSED_ACC = 11 / 16  # 0.6875 (the old count of failures as wrong answers: 9/16)


def eleven_of_sixteen(system: str, item: dict[str, str]) -> str:
    """Every open grade right; the closed items in WRONG flipped."""
    key = (item["question"], item["ground_truth"], item["prediction"])
    value = EXPECTED[key]
    if key in WRONG:
        value = 1 - value if value in (0, 1) else 0
    return str(int(value * 2)) if '"score": <0, 1 or 2>' in system else str(int(value))


def unanswered(item: dict[str, str]) -> bool:
    return (item["question"], item["ground_truth"], item["prediction"]) in UNANSWERED


def judge_args(server: JudgeServer, cache_dir: Path, *extra: str) -> list[str]:
    return [
        "metric=[judge]",
        "judge.backend=openai",
        f"judge.base_url={server.base_url}",
        "judge.model=scripted",
        "judge.mode=generate",
        "judge.retries=0",
        f"judge.cache_dir={cache_dir}",
        *extra,
    ]


def shortcut_predictions(path: Path) -> Path:
    """One closed row answered by the exact-match shortcut: only the self-check calls."""
    pd.DataFrame([{"question": "Is there a nodule?", "answer": "yes", "prediction": "Yes"}]).assign(
        answer_type="closed"
    ).to_csv(path, index=False)
    return path


@pytest.mark.heavy
def test_an_unanswered_selfcheck_item_is_a_failure_and_is_retried(tmp_path: Path) -> None:
    preds = shortcut_predictions(tmp_path / "preds.csv")
    server = JudgeServer(score_fn=eleven_of_sixteen).start()
    try:
        server.fail_when = unanswered
        args = judge_args(server, tmp_path / "judgments")
        score_main([str(preds), "--out", str(tmp_path / "out"), *args])  # its status: below
        record = json.loads((tmp_path / "out" / "results.json").read_text())
        metrics = record["metrics"]
        # unknown, not wrong: no accuracy (null in JSON) rather than 9/16, and no verdict
        assert metrics["judge/selfcheck_closed_acc"] is None
        assert metrics["judge/selfcheck_reliable"] is None
        assert record["status"] == "incomplete" and record["failed_items"] == 2
        assert metrics["judge/selfcheck_failures"] == 2
        assert metrics["selfcheck/judge_failures"] == 2  # counted like any unscored item
        first = server.count
        assert first == len(ITEMS)

        server.fail_when = None  # the server is well again: a re-run asks only those two
        assert score_main([str(preds), "--out", str(tmp_path / "out"), *args]) == 0
        record = json.loads((tmp_path / "out" / "results.json").read_text())
        assert server.count - first == len(UNANSWERED)
        assert sorted(server.predictions()[first:]) == sorted(p for _, _, p in UNANSWERED)
        assert record["status"] == "finished"
        assert record["metrics"]["judge/selfcheck_closed_acc"] == pytest.approx(TRUE_CLOSED_ACC)
        assert record["metrics"]["selfcheck/judge_failures"] == 0
        assert record["metrics"]["judge/selfcheck_reliable"] == 0.0  # below the 0.8 floor
    finally:
        server.stop()


# -- defect 9: where the API key goes ----------------------------------------------------------

OPENAI_SECRET = "sk-openai-secret-0123456789abcdefABCDEF"
VLLM_SECRET = "vllm-secret-value-42"


def backend(base_url: str | None, **kwargs: object) -> OpenAIBackend:
    from tests.test_judge import openai_backend

    return openai_backend(mode="generate", model="m", base_url=base_url, retries=0, **kwargs)


def ask(b: OpenAIBackend) -> None:
    from medvqa.scoring.metrics.judge import JudgeMetric
    from tests.test_judge import MIXED

    JudgeMetric(b).per_sample(MIXED.iloc[[4]])  # one row that needs a call


def test_openai_api_key_goes_only_to_api_openai_com(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_SECRET)
    monkeypatch.setenv("VLLM_KEY", VLLM_SECRET)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    server = JudgeServer().start()
    try:
        caplog.set_level(logging.INFO, logger="medvqa")
        ask(backend(server.base_url))  # the default api_key_env, a local server
        assert server.authorizations and all(
            OPENAI_SECRET not in (a or "") for a in server.authorizations
        )
        ask(backend(server.base_url, api_key_env="VLLM_KEY"))  # named explicitly: sent
        assert server.authorizations[-1] == f"Bearer {VLLM_SECRET}"
        assert "$VLLM_KEY" in caplog.text and "127.0.0.1" in caplog.text
        assert VLLM_SECRET not in caplog.text and OPENAI_SECRET not in caplog.text
    finally:
        server.stop()
    # A look-alike host is not OpenAI's (compared exactly, not as a substring) ...
    for url in ("https://api.openai.com.evil.example/v1", "https://evil.example/api.openai.com"):
        assert backend(url).client.api_key != OPENAI_SECRET
    # ... while OpenAI itself gets it, at its own address whatever OPENAI_BASE_URL says.
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    for url in (None, "https://api.openai.com/v1", "https://API.OpenAI.com/v1/"):
        client = backend(url).client
        assert client.api_key == OPENAI_SECRET and client.base_url.host == "api.openai.com"


CALLBACK = "medvqa.judge.keys.RefuseKeysInConfig"  # conf/hydra/default.yaml's
SECRETS = (
    "sk-abc123def456",
    "sk-proj-Abc123Def456Ghi789Jkl012Mno345",
    "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
    "ghp_0123456789abcdefABCDEF0123456789abcd",
    "Zx81kQp2LmN7vB4cR9tY3wE6",
)


@pytest.mark.slow
def test_a_key_pasted_as_api_key_env_is_refused_and_never_recorded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = SECRETS[1]
    preds = shortcut_predictions(tmp_path / "preds.csv")
    server = JudgeServer().start()
    try:
        args = judge_args(server, tmp_path / "judgments", f"judge.api_key_env={secret}")
        # medvqa-score: exit status 2 with the message, which never shows the key
        assert score_main([str(preds), "--out", str(tmp_path / "out"), *args]) == 2
        assert "judge.api_key_env" in caplog.text and secret not in caplog.text
        assert server.count == 0
    finally:
        server.stop()
    assert not (tmp_path / "out" / "results.json").exists()
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert not any(secret in p.read_text(errors="ignore") for p in written)

    from medvqa.config import check_judge_config
    from medvqa.judge.keys import check_api_key_env, redact_secrets

    cfg = compose(["metric=[judge]", f"judge.api_key_env={secret}"], tmp_path / "composed")
    with pytest.raises(JudgeConfigError, match=r"judge\.api_key_env"):
        check_judge_config(cfg)  # what run() calls before anything is written
    for name in ("OPENAI_API_KEY", "VLLM_KEY", "my_judge_token", None):
        check_api_key_env(name)  # variable names pass
    for value in (*SECRETS, "$VLLM_KEY", "VLLM KEY"):
        with pytest.raises(JudgeConfigError, match=r"judge\.api_key_env") as err:
            check_api_key_env(value)
        assert value not in str(err.value)  # the error (and so any log) never shows it

    # Hydra's own files: the callback stops a run or multirun before Hydra writes anything.
    from medvqa.judge.keys import RefuseKeysInConfig

    def hydra_config(override: str) -> DictConfig:
        return OmegaConf.create(
            {"judge": {"api_key_env": "VLLM_KEY"}, "hydra": {"overrides": {"task": [override]}}}
        )

    RefuseKeysInConfig().on_multirun_start(config=hydra_config("judge.api_key_env=A_KEY,B_KEY"))
    with pytest.raises(SystemExit) as stop:
        RefuseKeysInConfig().on_multirun_start(
            config=hydra_config(f"judge.api_key_env=VLLM_KEY,{secret}")
        )
    assert "judge.api_key_env" in str(stop.value) and secret not in str(stop.value)
    run_dir = tmp_path / "run"
    proc = run_main(
        [f"judge.api_key_env={secret}", f"+hydra.callbacks.keys._target_={CALLBACK}"],
        run_dir,
        tmp_path / "cache",
    )
    assert proc.returncode != 0 and "judge.api_key_env" in proc.stderr
    assert secret not in proc.stdout + proc.stderr and not run_dir.exists()

    # Whatever reaches the record writer anyway is redacted; names and other values stay.
    config = {
        "judge": {"api_key_env": secret, "model": "m"},
        "other": [{"api_key_env": "VLLM_KEY"}, {"token": SECRETS[2]}],
        "seed": 3,
    }
    clean = redact_secrets(config)
    assert secret not in json.dumps(clean) and SECRETS[2] not in json.dumps(clean)
    assert clean["judge"]["model"] == "m" and clean["other"][0]["api_key_env"] == "VLLM_KEY"
    assert clean["seed"] == 3 and config["judge"]["api_key_env"] == secret  # a copy


# -- defect 9: markup in labels, metadata and predictions --------------------------------------

EVIL = "<script>alert(1)</script> | a\nb & <b>"


def markdown_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def assert_safe_table(text: str) -> None:
    """No raw markup, and every row of each table has as many cells as its header."""
    assert "<script" not in text and "<b>" not in text and "&lt;script&gt;" in text
    rows = markdown_rows(text)
    assert rows
    widths = {len(re.findall(r"(?<!\\)\|", line)) for line in rows}
    assert len(widths) <= 2  # tables.md holds the results table and the issues table


def test_labels_and_metadata_are_escaped_in_summary_and_tables(tmp_path: Path) -> None:
    metrics = {"test_iid/closed_acc": 0.5, "test_ood/closed_acc": 0.4, "test_iid/open_f1": 0.3}
    write_summary(summary_table(metrics, [(EVIL, "")], "closed_acc", "open_f1"), tmp_path)
    summary = (tmp_path / "summary.md").read_text()
    assert_safe_table(summary)
    assert len({line.count("|") for line in markdown_rows(summary)}) == 1

    runs = tmp_path / "runs"
    write_record(runs, "lora", 0, metrics=headline(np.random.default_rng(1)))
    write_record(runs, "lora", 1, status="failed", extra={"error": EVIL}, label=EVIL)
    write_record(runs, "ia3", 0, metrics={"test_iid/closed_acc": 0.5}, label=EVIL)
    frame = collect([runs])
    paths = write_tables(long_table(frame), issues_table(frame), tmp_path / "report")
    for path in [paths["markdown"], *(tmp_path / "report" / "tables").glob("*.md")]:
        assert_safe_table(path.read_text())


PREDICTION = 'x <!--<script> y </script><script>alert(1)</script> \u2028 & "z"'


def data_block(page: str) -> str:
    start = page.index('<script type="application/json" id="data">')
    body = page[page.index(">", start) + 1 :]
    return body[: body.lower().index("</script")]


def test_the_rater_page_keeps_its_data_block_intact() -> None:
    sheet = pd.DataFrame(
        [{"id": "1", "question": "q?", "ground_truth": "<b>gt</b>", "prediction": PREDICTION}]
    )
    page = rating_page(sheet)
    data = data_block(page)
    assert "<" not in data and ">" not in data and "\u2028" not in data
    assert json.loads(data)[0]["prediction"] == PREDICTION
    assert page.count("</script>") == 2  # the data block's end and the page script's end
    node = shutil.which("node")
    if node is None:
        return
    # The page script reads the block with JSON.parse; a JS literal reads the same text.
    script = (
        "const d = require('fs').readFileSync(0, 'utf8');"
        "const a = JSON.parse(d), b = eval('(' + d + ')');"
        "process.stdout.write(JSON.stringify([a[0].prediction, b[0].prediction]));"
    )
    out = subprocess.run([node, "-e", script], input=data, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [PREDICTION, PREDICTION]
    assert list(SHEET_COLUMNS[:-1]) == list(json.loads(data)[0])
