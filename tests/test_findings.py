"""SURE-VQA's findings re-tested (medvqa.analysis.findings) on planted studies: each finding
holds where the runs were planted so, is reversed where they were planted the other way, and
says which runs it needs where they are missing.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from medvqa.analysis.aggregate import collect
from medvqa.analysis.claims import family, study_sides
from medvqa.analysis.findings import FINDINGS, Findings, findings, shift_fields
from tests.planted import plant


def retest(root: Path) -> Findings:
    runs = collect([root])
    sides = study_sides(runs)
    return findings(sides, family(sides).frame, shift_fields(runs))


def verdicts(found: Findings, number: int) -> set[str]:
    return set(found.frame.loc[found.frame["finding"] == number, "verdict"])


# Two shifts: LoRA best i.i.d., full fine-tuning below the PEFT methods, the no-image baseline
# close to the methods, RR set by the shift (modality loses a third, question type nothing).
AS_THE_PAPER = {
    "synthetic_modality": {
        "full": (0.55, 0.37),
        "prompt_tuning": (0.65, 0.43),
        "lora": (0.85, 0.57),
        "ia3": (0.66, 0.44),
        "lora+no_image": (0.68, 0.45),
    },
    "synthetic_question_type": {
        "full": (0.55, 0.55),
        "prompt_tuning": (0.65, 0.65),
        "lora": (0.85, 0.85),
        "ia3": (0.66, 0.66),
        "lora+no_image": (0.68, 0.68),
    },
}
# The opposite: LoRA worst, full fine-tuning best, the no-image baseline far below, the same RR
# on both shifts but a different one per method, and (IA)³ the most robust on both.
REVERSED = {
    table: {
        "full": (0.9, 0.9 * rr["full"]),
        "prompt_tuning": (0.7, 0.7 * rr["prompt_tuning"]),
        "lora": (0.5, 0.5 * rr["lora"]),
        "ia3": (0.7, 0.7 * rr["ia3"]),
        "lora+no_image": (0.2, 0.15),
    }
    for table, rr in {
        "synthetic_modality": {"full": 0.95, "prompt_tuning": 0.7, "lora": 0.6, "ia3": 1.0},
        "synthetic_question_type": {"full": 0.95, "prompt_tuning": 0.7, "lora": 0.6, "ia3": 1.0},
    }.items()
}


@pytest.fixture(scope="module")
def as_the_paper(tmp_path_factory: pytest.TempPathFactory) -> Findings:
    return retest(plant(tmp_path_factory.mktemp("paper"), AS_THE_PAPER, cases=150))


@pytest.fixture(scope="module")
def reversed_(tmp_path_factory: pytest.TempPathFactory) -> Findings:
    return retest(plant(tmp_path_factory.mktemp("reversed"), REVERSED, cases=150))


@pytest.mark.heavy
@pytest.mark.parametrize("number", [1, 2, 4, 5])
def test_a_finding_holds_where_planted_and_is_reversed_where_planted_the_other_way(
    as_the_paper: Findings, reversed_: Findings, number: int
) -> None:
    assert verdicts(as_the_paper, number) == {"holds"}, as_the_paper.frame
    assert verdicts(reversed_, number) == {"reversed"}, reversed_.frame
    assert as_the_paper.overall[number] == "holds" and reversed_.overall[number] == "reversed"


@pytest.mark.heavy
def test_no_consistent_winner_is_reversed_by_one_method_most_robust_everywhere(
    as_the_paper: Findings, reversed_: Findings
) -> None:
    """Finding 3 is a "no": it holds where no PEFT method is above the others on every shift,
    and is reversed where (IA)³'s RR is above every other's on both."""
    assert verdicts(as_the_paper, 3) == {"holds"}
    assert verdicts(reversed_, 3) == {"reversed"}
    assert set(reversed_.frame.loc[reversed_.frame["finding"] == 3, "note"]) == {"(IA)³ on 2 of 2"}


@pytest.mark.heavy
def test_the_variance_decomposition_splits_rr_between_shift_and_method(
    as_the_paper: Findings, reversed_: Findings
) -> None:
    """Planted: RR depends only on the shift (paper) or only on the method (reversed); the
    shares are read from the note, each with its interval."""
    for found, big in ((as_the_paper, "shift"), (reversed_, "method")):
        row = found.frame[found.frame["finding"] == 5].iloc[0]
        share = float(row["note"].split(f"{big} ")[1].split("%")[0]) / 100
        assert share > 0.8, row["note"]
        assert row["ci_lo"] <= row["estimate"] <= row["ci_hi"]


@pytest.mark.heavy
def test_population_shifts_robust_or_not(tmp_path: Path) -> None:
    """Finding 6 takes the shifts of a patient attribute (the recorded shift field) only."""
    robust = {"synthetic_sex": {"lora": (0.75, 0.8), "ia3": (0.65, 0.7)}}
    fragile = {"synthetic_age": {"lora": (0.8, 0.4), "ia3": (0.7, 0.35)}}
    plant(tmp_path / "a", robust, fields={"synthetic_sex": "sex"}, cases=400)
    plant(tmp_path / "b", fragile, fields={"synthetic_age": "age"}, cases=150)
    assert verdicts(retest(tmp_path / "a"), 6) == {"holds"}
    assert verdicts(retest(tmp_path / "b"), 6) == {"reversed"}
    plant(tmp_path / "c", fragile, fields={"synthetic_age": "modality"})
    assert verdicts(retest(tmp_path / "c"), 6) == set()  # not a population shift


@pytest.mark.heavy
def test_a_finding_without_its_runs_says_which_runs_it_needs(tmp_path: Path) -> None:
    """One shift, LoRA and (IA)³ only: findings 1 and 3-6 are not testable and name their
    runs; finding 2 is tested."""
    plant(tmp_path, {"synthetic_modality": {"lora": (0.8, 0.6), "ia3": (0.6, 0.5)}}, seeds=(0,))
    summary = retest(tmp_path).summary().set_index("finding")
    for finding in FINDINGS:
        verdict = summary.loc[finding.number, "verdict"]
        if finding.number == 2:
            assert not verdict.startswith("not testable")
        else:
            assert verdict == f"not testable: needs {finding.needs}"
    assert isinstance(summary, pd.DataFrame) and len(summary) == 6
