"""What a report concludes (medvqa.analysis.conclusions): claims.csv adjusted as asked, the
findings and effective-robustness sections, the note beside a ranking a weak model wins, and
card.md with every entry read from the records ("not recorded" where none holds it). One
report over a planted study (records and scored tables written here); the effective-robustness
line is checked against a fit made here.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from statsmodels.stats.multitest import multipletests

from medvqa.analysis.aggregate import collect
from medvqa.analysis.effective import effective_robustness
from medvqa.cli.report import main
from tests.planted import plant

# The demo's pattern: the untuned base is the weakest i.i.d. and, by RR, the most robust.
STUDY = {
    "synthetic_modality": {
        "none": (0.27, 0.26),
        "lora": (0.85, 0.6),
        "ia3": (0.75, 0.5),
        "lora+no_image": (0.6, 0.4),
    },
    "synthetic_question_type": {
        "none": (0.3, 0.28),
        "lora": (0.8, 0.7),
        "ia3": (0.7, 0.6),
        "lora+no_image": (0.6, 0.5),
    },
}


@pytest.mark.heavy
def test_the_report_writes_its_claims_findings_and_card(tmp_path: Path) -> None:
    plant(tmp_path / "runs", STUDY, cases=80)
    hostile = next((tmp_path / "runs").rglob("results.json")).parent / "splits.json"
    hostile.write_text("[1, 2]")  # a stranger's file that is no splits report
    assert main([str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--adjust", "bh"]) == 0
    out = tmp_path / "out"

    claims = pd.read_csv(out / "claims.csv")
    assert len(claims) == 2 * 3 * 2 * 3  # shifts x pairs of methods x score kinds x splits+RR
    _, bh, _, _ = multipletests(claims["p"].fillna(1.0), alpha=0.05, method="fdr_bh")
    assert claims["p_adjusted"].to_numpy() == pytest.approx(bh)
    assert "holds" in set(claims["verdict"])

    summary = pd.read_csv(out / "findings_summary.csv").set_index("finding")
    assert summary.loc[6, "verdict"].startswith("not testable: needs a population shift")
    assert not summary.loc[2, "verdict"].startswith("not testable")

    html = (out / "report.html").read_text()
    for section in (
        "The family of claims",
        "SURE-VQA's findings on these runs",
        "Effective robustness",
        "Robustness card",
    ):
        assert f"<h2>{section}</h2>" in html
    assert "Benjamini-Hochberg" in html
    note = "No Finetune ranks most robust by closed RR"
    assert note in html and (out / "figures" / "iid_vs_ood.png").is_file()

    card = (out / "card.md").read_text()
    for heading in ("Models and methods", "Data, shifts and splits", "Missing data", "limitations"):
        assert heading in card
    assert "split sizes and leakage audit not recorded" in card  # no splits.json was written
    assert "judge: not recorded" in card and "model(s): tiny" in card
    assert "finding 6 (Models are generally robust to population shifts): not testable" in card


@pytest.mark.heavy
def test_effective_robustness_is_the_distance_to_the_logit_line(tmp_path: Path) -> None:
    """The line is OLS of logit(OoD) on logit(i.i.d.) over every run's point; a method's
    effective robustness is its OoD minus the line at its i.i.d., inside the line's band."""
    plant(tmp_path, STUDY, seeds=(0,), cases=40)
    result = effective_robustness(collect([tmp_path]))
    closed = result.frame[
        (result.frame["table"].str.startswith("synthetic_modality"))
        & (result.frame["score"] == "closed OoD")
    ].set_index("method")

    def logit(p: np.ndarray) -> np.ndarray:
        return np.log(p / (1 - p))

    slope, intercept = np.polyfit(
        logit(closed["iid"].to_numpy()), logit(closed["ood"].to_numpy()), 1
    )
    line = 1 / (1 + np.exp(-(intercept + slope * logit(closed["iid"].to_numpy()))))
    assert closed["line_ood"].to_numpy() == pytest.approx(line)
    assert closed["effective_robustness"].to_numpy() == pytest.approx(closed["ood"] - line)
    assert (closed["er_lo"] <= closed["effective_robustness"]).all()
    assert (closed["effective_robustness"] <= closed["er_hi"]).all()
    assert set(closed["axes"]) == {"logit"} and not math.isnan(closed.loc["LoRA", "er_lo"])
    assert any("No Finetune ranks most robust" in n for n in result.notes)
