"""Issue #48, item 4: `medvqa-report` recomputes RR and the method ranking under each juror of
a jury and under the jury's verdict, and flags each pairwise conclusion that does not survive
a change of judge. A planted flip: under juror `a` (and the jury, which agrees with it) LoRA
keeps its accuracy under the shift and full fine-tuning halves it; juror `b` sees the reverse."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from medvqa.analysis.aggregate import collect
from medvqa.analysis.judges import judge_sensitivity
from medvqa.analysis.report import build_report
from medvqa.statistics.bootstrap import paired_rr_diff
from tests.test_report import headline, write_record

N = 80  # closed questions per split, four per case
CASES = np.array([f"c{i // 4}" for i in range(N)], dtype=object)
HIGH = np.array([1, 1, 1, 1, 0] * (N // 5), dtype=float)  # 0.8
LOW = np.array([1, 1, 0, 0, 0] * (N // 5), dtype=float)  # 0.4


def scored(iid: dict[str, np.ndarray], ood: dict[str, np.ndarray]) -> pd.DataFrame:
    """A scored table of N closed questions per test split with the jury's and each juror's
    scores (`judge` -> scores of the i.i.d. and the OoD rows)."""
    frame = pd.DataFrame(
        {
            "id": [f"q{i}" for i in range(N)] * 2,
            "split": ["test_iid"] * N + ["test_ood"] * N,
            "case_id": list(CASES) * 2,
            "answer_type": "closed",
        }
    )
    for column in iid:
        frame[column] = np.concatenate([iid[column], ood[column]])
    return frame


def write_runs(root: Path, bootstrap: dict | None = None) -> dict[str, pd.DataFrame]:
    """LoRA: RR 1.0 under a and the jury, 0.5 under b; full fine-tuning the reverse."""
    rng = np.random.default_rng(0)
    tables = {
        "lora": scored(
            {"judge_score": HIGH, "judge_score@a": HIGH, "judge_score@b": HIGH},
            {"judge_score": HIGH, "judge_score@a": HIGH, "judge_score@b": LOW},
        ),
        "full": scored(
            {"judge_score": HIGH, "judge_score@a": HIGH, "judge_score@b": HIGH},
            {"judge_score": LOW, "judge_score@a": LOW, "judge_score@b": HIGH},
        ),
    }
    boot = bootstrap or {"samples": 300, "seed": 5, "level": 0.95}
    for peft, table in tables.items():
        path = write_record(root, peft, 0, metrics=headline(rng))
        record = json.loads(path.read_text())
        record["config"]["evaluation"]["bootstrap"] = boot
        path.write_text(json.dumps(record))
        table.to_parquet(path.parent / "scores.parquet")
    return tables


def test_a_planted_ranking_flip_is_flagged(tmp_path: Path) -> None:
    tables = write_runs(tmp_path / "runs")
    result = judge_sensitivity(collect([tmp_path / "runs"]))
    rr = result.ranks.set_index(["judge", "method"])["rr"]
    assert rr[("jury", "LoRA")] == rr[("a", "LoRA")] == pytest.approx(1.0)
    assert rr[("b", "LoRA")] == pytest.approx(0.5)
    assert rr[("b", "Full Finetune")] == pytest.approx(1.0)
    ranks = result.ranks.set_index(["judge", "method"])["rank"]
    assert ranks[("jury", "LoRA")] == 1 and ranks[("b", "LoRA")] == 2
    tau = result.tau.set_index(["judge_a", "judge_b"])["tau"]
    assert tau[("jury", "a")] == pytest.approx(1.0) and tau[("jury", "b")] == pytest.approx(-1.0)

    found = result.conclusions.set_index(["judge", "under"])
    jury_vs_b = found.loc[("jury", "b")]
    assert (jury_vs_b["higher"], jury_vs_b["lower"]) == ("LoRA", "Full Finetune")
    assert jury_vs_b["verdict"] == "flips"
    assert found.loc[("jury", "a"), "verdict"] == "holds"
    assert found.loc[("b", "jury"), "higher"] == "Full Finetune"
    assert found.loc[("b", "jury"), "verdict"] == "flips"
    assert set(result.flagged["verdict"]) == {"flips"}
    assert len(result.flagged) == 4  # jury->b, a->b, b->jury, b->a
    # the difference and its interval are the paired RR bootstrap's, from the run's settings
    # (rows in id order, so the cases are numbered, and drawn, as the report numbers them)
    lora, full = (tables[m].sort_values(["split", "id"], kind="stable") for m in ("lora", "full"))
    cases = lora["case_id"].to_numpy(object)
    expected = paired_rr_diff(
        full["judge_score"][:N],
        lora["judge_score"][:N],
        cases[:N],
        full["judge_score"][N:],
        lora["judge_score"][N:],
        cases[N:],
        B=300,
        seed=5,
        level=0.95,
    )
    # (the report compares A - B in the paper's order: Full Finetune first, so it is negative)
    assert jury_vs_b["diff"] == pytest.approx(-expected.point) == pytest.approx(0.5)
    assert (jury_vs_b["ci_lo"], jury_vs_b["ci_hi"]) == pytest.approx((-expected.hi, -expected.lo))
    assert jury_vs_b["ci_lo"] > 0  # significant under the jury


def test_a_conclusion_that_loses_significance_or_meets_an_unscored_item(tmp_path: Path) -> None:
    """Juror b sees the same direction, but on one case only, so its interval holds zero; then
    b fails an item: its RR and difference are unknown, never computed from the survivors."""
    tables = write_runs(tmp_path / "runs")
    weak = tables["full"].copy()
    ood = weak["split"] == "test_ood"
    weak.loc[ood, "judge_score@b"] = HIGH
    weak.loc[ood & (weak["case_id"] == "c0"), "judge_score@b"] = 0.0  # RR 0.85 vs 1.0
    lora = tables["lora"].copy()
    lora.loc[ood, "judge_score@b"] = HIGH
    for peft, table in (("full", weak), ("lora", lora)):
        path = next((tmp_path / "runs").rglob(f"modality-{peft}-*/seed=0/scores.parquet"))
        table.to_parquet(path)
    result = judge_sensitivity(collect([tmp_path / "runs"]))
    verdict = result.conclusions.set_index(["judge", "under"])["verdict"]
    assert verdict[("jury", "b")] == "loses significance"

    weak.loc[5, "judge_score@b"] = np.nan  # an item b could not score
    weak.to_parquet(next((tmp_path / "runs").rglob("modality-full-*/seed=0/scores.parquet")))
    result = judge_sensitivity(collect([tmp_path / "runs"]))
    verdict = result.conclusions.set_index(["judge", "under"])["verdict"]
    assert verdict[("jury", "b")] == "unknown"
    rr = result.ranks.set_index(["judge", "method"])["rr"]
    assert math.isnan(rr[("b", "Full Finetune")])


@pytest.mark.heavy
def test_the_report_shows_the_conclusions_under_each_judge(tmp_path: Path) -> None:
    write_runs(tmp_path / "runs")
    report = build_report(collect([tmp_path / "runs"]), tmp_path / "out")
    assert len(report.judges.flagged) == 4
    page = (tmp_path / "out" / "report.html").read_text()
    assert "Conclusions under each judge" in page and "flips" in page
    assert (tmp_path / "out" / "figures" / "rr_under_each_judge.png").is_file()
    for name in ("judge_rr", "judge_ranks", "judge_rank_tau", "judge_conclusions"):
        assert (tmp_path / "out" / f"{name}.csv").is_file()


@pytest.mark.heavy
def test_without_a_jury_there_is_no_section(tmp_path: Path) -> None:
    tables = write_runs(tmp_path / "runs")
    for peft, table in tables.items():
        path = next((tmp_path / "runs").rglob(f"modality-{peft}-*/seed=0/scores.parquet"))
        table.drop(columns=["judge_score@a", "judge_score@b"]).to_parquet(path)
    report = build_report(collect([tmp_path / "runs"]), tmp_path / "out")
    assert report.judges.empty
    assert "Conclusions under each judge" not in (tmp_path / "out" / "report.html").read_text()
    assert "rr_under_each_judge" not in {*report.figures, *report.skipped}
