"""RoboSurg-VQA's conditions end to end: a canonical run on the release-layout fixture, its
wording conditions from experiments/robosurg_vqa/conditions.sh (task=eval of its weights), the
answer-frequency baseline, and medvqa-report's paired sequence-bootstrap deltas between them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from medvqa.analysis.aggregate import collect
from medvqa.analysis.report import build_report
from medvqa.record import read_record
from tests.conftest import ROOT, SMALL_MODEL, run_main

HEADLINE = "cs_primary_macro_f1"
# Every test row (no debug cap on the test splits), so every primary task has rows.
RUN = ["debug=smoke", "logger=csv", "+experiment=robosurg_site"]
ALL_TEST_ROWS = ["data.limit.test_iid=null", "data.limit.test_ood=null"]


@pytest.fixture
def release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The release fixture with a second test sequence per site, so that the sequence
    bootstrap has more than one cluster to resample in each test split."""
    from tests.native import robosurg_vqa

    more = (("site1", "test", 10, "test", (9, 16, 3)), ("site2", "test", 4, "test", (8, 10, 3)))
    monkeypatch.setattr(robosurg_vqa, "SEQUENCES", (*robosurg_vqa.SEQUENCES, *more))
    return robosurg_vqa.write(tmp_path / "release").root


def _run(args: list[str], run_dir: Path, cache: Path) -> dict:
    proc = run_main(args, run_dir, cache, small=SMALL_MODEL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return read_record(run_dir / "results.json")


@pytest.mark.slow
def test_conditions_script_and_paired_deltas(
    release: Path, cache_dir: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    data = [f"dataset.root={release}", *ALL_TEST_ROWS]
    canonical = tmp_path / "study" / "lora"
    own = _run([*RUN, *data], canonical, cache_dir)
    assert own["config"]["dataset"]["test_wording"] == "canonical"

    env = {**os.environ, "PYTHON": sys.executable, "MEDVQA_CACHE": str(cache_dir),
           "WANDB_MODE": "offline"}  # fmt: skip
    script = ROOT / "experiments" / "robosurg_vqa" / "conditions.sh"
    proc = subprocess.run(
        ["bash", str(script), str(canonical)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"medvqa-report {canonical}" in proc.stdout
    records = {}
    for wording in ("heldout_paraphrase", "wrong_question"):
        record = read_record(canonical / wording / "results.json")
        assert record["status"] == "finished" and record["task"] == "eval"
        assert record["config"]["dataset"]["test_wording"] == wording
        # the run's overrides were repeated (data, limits) and its weights and seed adopted
        assert record["config"]["dataset"]["root"] == str(release)
        assert record["seed"] == own["seed"] and record["choices"]["peft"] == "lora"
        assert "train/global_step" not in record["metrics"]
        records[wording] = record

    # The answer-frequency baseline, and one that answered other questions (fewer i.i.d. rows).
    frequent = _run([*RUN, *data, "baseline=most_frequent"], tmp_path / "study" / "mf", cache_dir)
    _run(
        [*RUN, f"dataset.root={release}", "data.limit.test_ood=null", "baseline=most_frequent"],
        tmp_path / "study" / "mf_capped",
        cache_dir,
    )

    report = build_report(collect([tmp_path / "study"]), tmp_path / "report")
    paired = report.paired
    assert (tmp_path / "report" / "paired_differences.csv").is_file()
    methods = set(report.long["method"])
    assert {"LoRA", "LoRA [test_wording=heldout_paraphrase]"} <= methods
    assert "LoRA [test_wording=wrong_question]" in methods

    def row(pair: str, a: str, b: str, split: str):
        hit = paired[
            (paired["pair"] == pair)
            & (paired["method_a"] == a)
            & (paired["method_b"] == b)
            & (paired["split"] == split)
            & (paired["score"] == HEADLINE)
        ]
        return hit

    expected = {
        ("condition − default", "LoRA [test_wording=heldout_paraphrase]", "LoRA"): (
            records["heldout_paraphrase"],
            own,
        ),
        ("condition − default", "LoRA [test_wording=wrong_question]", "LoRA"): (
            records["wrong_question"],
            own,
        ),
    }
    baseline_names = set(paired.loc[paired["pair"] == "method − baseline", "method_b"])
    (full,) = [n for n in baseline_names if "None" in n or "null" in n]  # limit unset: all rows
    (capped,) = baseline_names - {full}
    expected[("method − baseline", "LoRA", full)] = (own, frequent)
    for split in ("test_iid", "test_ood"):
        for (pair, a, b), (rec_a, rec_b) in expected.items():
            hit = row(pair, a, b, split)
            assert len(hit) == 1, (pair, a, b, split, paired)
            got = hit.iloc[0]
            head_a = rec_a["metrics"][f"{split}/{HEADLINE}"]
            head_b = rec_b["metrics"][f"{split}/{HEADLINE}"]
            assert got["diff"] == pytest.approx(head_a - head_b)
            assert (got["value_a"], got["value_b"]) == pytest.approx((head_a, head_b))
            assert got["ci_lo"] <= got["diff"] <= got["ci_hi"], got
    # The baseline that answered fewer i.i.d. questions: a number for OoD only.
    assert row("method − baseline", "LoRA", capped, "test_iid").empty
    assert len(row("method − baseline", "LoRA", capped, "test_ood")) == 1
    # The most-frequent answer scores above zero on these frames: a real difference.
    assert frequent["metrics"][f"test_iid/{HEADLINE}"] > 0
