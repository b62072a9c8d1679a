"""What a report concludes, with its uncertainty: the family of pairwise claims adjusted for
multiplicity (medvqa.analysis.claims), SURE-VQA's findings re-tested (medvqa.analysis.findings),
effective robustness (medvqa.analysis.effective) and the robustness card (medvqa.analysis.card).
Computed once from the runs' scored tables, written as claims.csv, findings.csv,
findings_summary.csv, effective_robustness.csv and card.md."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from medvqa.analysis.card import Card, robustness_card
from medvqa.analysis.claims import DEFAULT_ADJUSTMENT, Family, family, study_sides
from medvqa.analysis.effective import Effective, effective_robustness
from medvqa.analysis.findings import Findings, findings, shift_fields
from medvqa.analysis.judges import JudgeSensitivity


@dataclass
class Conclusions:
    family: Family = field(default_factory=lambda: family({}))
    findings: Findings = field(default_factory=Findings)
    effective: Effective = field(default_factory=Effective)
    card: Card = field(default_factory=Card)

    def write(self, out_dir: Path) -> dict[str, Path]:
        out_dir = Path(out_dir)
        files = {
            "claims_csv": out_dir / "claims.csv",
            "effective_csv": out_dir / "effective_robustness.csv",
        }
        self.family.frame.to_csv(files["claims_csv"], index=False)
        self.effective.frame.to_csv(files["effective_csv"], index=False)
        files.update(self.findings.write(out_dir))
        files["card"] = self.card.write(out_dir)
        return files


def conclude(
    placed: pd.DataFrame,
    long: pd.DataFrame,
    issues: pd.DataFrame,
    judges: JudgeSensitivity,
    adjustment: str = DEFAULT_ADJUSTMENT,
) -> Conclusions:
    """The conclusions of the runs the report placed."""
    sides = study_sides(placed)
    claims = family(sides, adjustment)
    found = findings(sides, claims.frame, shift_fields(placed))
    effective = effective_robustness(placed)
    card = robustness_card(placed, long, issues, claims, found, effective, judges)
    return Conclusions(claims, found, effective, card)
