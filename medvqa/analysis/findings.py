"""SURE-VQA's six findings, re-tested on the runs of a report (docs/metrics.md#sure-vqas-findings).

SURE-VQA (Kahl et al. 2024) states its conclusions in words. Each becomes a test on the runs
present, with its statistic, a bootstrap interval over cases and seeds (`claims.Sides`: the runs'
scored tables, their `evaluation.bootstrap`) and a verdict per table and score kind: `holds`,
`reversed` (the runs say the opposite, beyond their uncertainty) or `undecided`; a finding whose
runs are missing says which runs it needs.

1. **Sanity baselines without the image perform surprisingly well**: the no-image baseline's
   i.i.d. score as a share of the fine-tuned methods' mean (holds: the interval above
   `NO_IMAGE_SHARE`; reversed: below it), with its distance to them.
2. **LoRA is the best-performing PEFT method i.i.d.**: LoRA's i.i.d. score minus each other PEFT
   method's, from the report's family of claims (paired, adjusted): holds where every gap is
   positive after adjustment, reversed where another method is above LoRA after adjustment.
3. **No PEFT method consistently outperforms the others in robustness**: holds unless one PEFT
   method's RR is above every other PEFT method's (adjusted) on every shift. A "no" finding:
   with too few rows it holds by default; the power plan says what the runs could detect.
4. **Full fine-tuning is inferior to PEFT** (the paper: on SLAKE and OVQA): the PEFT methods'
   mean score minus full fine-tuning's, per split (holds: interval above 0; reversed: below).
5. **The type of shift matters more for robustness than the choice of method**: a two-way
   decomposition of the methods × shifts RR matrix (sums of squares of shift and method means
   over the total), the share of shift minus the share of method, bootstrapped over cases and
   seeds of every shift (holds: interval above 0; reversed: below).
6. **Models are generally robust to population shifts** (shifts of a patient attribute:
   `POPULATION_FIELDS`): the fine-tuned methods' mean RR per such shift (holds: interval above
   `ROBUST_RR`; reversed: below it). Effective robustness (medvqa.analysis.effective) says how
   much of that RR a weak i.i.d. score explains.

PEFT methods are the `peft` options prompt tuning, LoRA and (IA)³ (`PEFT`); fine-tuned methods
are every method but the untuned base (`none`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from medvqa.analysis.claims import RR, SPLITS, Estimate, Sides, estimate
from medvqa.analysis.tables import USABLE
from medvqa.data import records as R
from medvqa.record import read_record
from medvqa.statistics.power import ALPHA

PEFT = ("prompt_tuning", "lora", "ia3")
FULL = "full"
LORA = "lora"
NO_IMAGE = "no_image"  # the baseline trained and evaluated without images
UNTUNED = "none"
# Finding 1: "surprisingly well" read as at least this share of the fine-tuned methods' score.
NO_IMAGE_SHARE = 0.8
# Finding 6: "robust" read as an RR whose interval lies above this (at most a 5 % loss).
ROBUST_RR = 0.95
# Shift fields that are attributes of the patient (SURE-VQA's population shifts on MIMIC).
POPULATION_FIELDS = ("gender", "sex", "ethnicity", "race", "age")
VERDICTS = ("holds", "reversed", "undecided")
COLUMNS = [
    "finding",
    "table",
    "score",
    "statistic",
    "estimate",
    "ci_lo",
    "ci_hi",
    "verdict",
    "note",
]


@dataclass(frozen=True)
class Finding:
    """One of SURE-VQA's findings: its words, the test made of it and the runs it needs."""

    number: int
    claim: str
    test: str
    needs: str


FINDINGS = (
    Finding(
        1,
        "Sanity baselines without the image perform surprisingly well",
        f"no-image baseline's i.i.d. score ÷ the fine-tuned methods' mean; holds above "
        f"{NO_IMAGE_SHARE:.0%}",
        "a no-image baseline (baseline=no_image) and a fine-tuned method on the same shift",
    ),
    Finding(
        2,
        "LoRA is the best-performing PEFT method i.i.d.",
        "LoRA − each other PEFT method on the i.i.d. split (the family's adjusted p); the "
        "closest rival's gap shown",
        "LoRA and another PEFT method (prompt tuning, (IA)³) on the same shift",
    ),
    Finding(
        3,
        "No PEFT method consistently outperforms the others in robustness",
        "holds unless one PEFT method's RR is above every other's (adjusted) on every shift; "
        "the estimate: the most shifts on which one method is so",
        "two PEFT methods on two shifts",
    ),
    Finding(
        4,
        "Full fine-tuning is inferior to PEFT (the paper: on SLAKE and OVQA)",
        "the PEFT methods' mean score − full fine-tuning's, per split",
        "full fine-tuning (peft=full) and a PEFT method on the same shift",
    ),
    Finding(
        5,
        "The type of shift matters more for robustness than the choice of method",
        "share of the RR matrix's variance between shifts − share between methods",
        "two methods run on the same two shifts",
    ),
    Finding(
        6,
        "Models are generally robust to population shifts",
        f"the fine-tuned methods' mean RR per population shift; holds above {ROBUST_RR}",
        "a population shift (field gender/sex, ethnicity or age: +experiment=mimic_gender, "
        "synthetic_sex, ...) with a fine-tuned method",
    ),
)


@dataclass
class Findings:
    """Each finding's rows (one per table and score kind), and its verdict over them."""

    frame: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=COLUMNS))
    overall: dict[int, str] = field(default_factory=dict)

    def summary(self) -> pd.DataFrame:
        """One row per finding: the paper's words, the test, the verdict (or the runs needed)."""
        return pd.DataFrame(
            [
                {
                    "finding": f.number,
                    "SURE-VQA": f.claim,
                    "test": f.test,
                    "verdict": self.overall.get(f.number, f"not testable: needs {f.needs}"),
                }
                for f in FINDINGS
            ]
        )

    def write(self, out_dir: Path) -> dict[str, Path]:
        """findings.csv (every row) and findings_summary.csv (one per finding)."""
        rows, summary = Path(out_dir) / "findings.csv", Path(out_dir) / "findings_summary.csv"
        self.frame.to_csv(rows, index=False)
        self.summary().to_csv(summary, index=False)
        return {"findings_csv": rows, "findings_summary_csv": summary}


def _verdict(est: Any, threshold: float = 0.0) -> str:
    """Above `threshold` beyond the interval: holds; below: reversed; else undecided."""
    if math.isnan(est.lo):
        return "undecided"
    if est.lo > threshold:
        return "holds"
    return "reversed" if est.hi < threshold else "undecided"


def _overall(verdicts: Sequence[str]) -> str:
    """A finding's verdict over its tables and scores."""
    n = len(verdicts)
    holds, reversed_ = verdicts.count("holds"), verdicts.count("reversed")
    if holds == n:
        return "holds"
    if reversed_ == n:
        return "reversed"
    if holds and reversed_:
        return f"mixed: holds in {holds}, reversed in {reversed_} of {n}"
    if holds or reversed_:
        which = "holds" if holds else "reversed"
        return f"{which} in {holds or reversed_} of {n}, undecided elsewhere"
    return f"undecided ({n} test(s))"


def _sides_of(side: Sides, keep: Callable[[str, str], bool]) -> list[int]:
    """The sides whose (method id, role) `keep` accepts."""
    return [i for i, (m, r) in enumerate(zip(side.ids, side.roles, strict=True)) if keep(m, r)]


def _fine_tuned(method_id: str, role: str) -> bool:
    return role == "method" and method_id != UNTUNED


def _mean_of(side: Sides, which: Sequence[int], split: str) -> tuple[float, np.ndarray]:
    """The mean over sides `which` of their statistic on `split` (RR: their RR)."""
    parts = [side.statistic(i, split) for i in which]
    return float(np.mean([p for p, _ in parts])), np.mean([r for _, r in parts], axis=0)


def _row(
    number: int, side: Sides, score: str, statistic: str, est: Any, verdict: str, note: str = ""
) -> dict[str, Any]:
    return {
        "finding": number,
        "table": side.table,
        "score": score,
        "statistic": statistic,
        "estimate": est.point,
        "ci_lo": est.lo,
        "ci_hi": est.hi,
        "verdict": verdict,
        "note": note,
    }


def _no_image(sides: Mapping[tuple[str, str], Sides]) -> list[dict[str, Any]]:
    out = []
    for side in sides.values():
        base = _sides_of(side, lambda m, r: m.endswith(f"+{NO_IMAGE}") or m == NO_IMAGE)
        tuned = [i for i in _sides_of(side, _fine_tuned) if not side.missing(i, R.TEST_IID)]
        if not base or not tuned or not side.bootstrapped or side.missing(base[0], R.TEST_IID):
            continue
        point, reps = side.statistic(base[0], R.TEST_IID)
        mean, mean_reps = _mean_of(side, tuned, R.TEST_IID)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = estimate(point / mean if mean else math.nan, reps / mean_reps, side.level)
        gap = estimate(mean - point, mean_reps - reps, side.level)
        out.append(
            _row(
                1,
                side,
                side.score,
                f"{side.names[base[0]]} ÷ mean of {len(tuned)} fine-tuned method(s), i.i.d.",
                share,
                _verdict(share, NO_IMAGE_SHARE),
                f"distance {gap.point:.3f} [{gap.lo:.3f}, {gap.hi:.3f}]",
            )
        )
    return out


def _oriented(
    claims: pd.DataFrame, table: str, score: str, split: str, a: str, b: str
) -> dict[str, Any] | None:
    """The family's claim a − b (stored either way round), as a − b."""
    part = claims[
        (claims["table"] == table) & (claims["score"] == score) & (claims["split"] == split)
    ]
    for sign, x, y in ((1.0, a, b), (-1.0, b, a)):
        hit = part[(part["id_a"] == x) & (part["id_b"] == y)]
        if not hit.empty:
            row = hit.iloc[0]
            lo, hi = (row["ci_lo"], row["ci_hi"]) if sign > 0 else (-row["ci_hi"], -row["ci_lo"])
            return {
                "estimate": sign * row["estimate"],
                "lo": lo,
                "hi": hi,
                "p_adjusted": row["p_adjusted"],
            }
    return None


def _significant(claim: Mapping[str, Any] | None, sign: float) -> bool:
    """Whether the claim's estimate has `sign` and its adjusted p is below α."""
    return (
        claim is not None
        and not math.isnan(claim["p_adjusted"])
        and claim["p_adjusted"] < ALPHA
        and np.sign(claim["estimate"]) == sign
    )


def _lora_best(
    sides: Mapping[tuple[str, str], Sides], claims: pd.DataFrame
) -> list[dict[str, Any]]:
    out = []
    for side in sides.values():
        if LORA not in side.ids:
            continue
        rivals = [m for m in side.ids if m in PEFT and m != LORA]
        found = {m: _oriented(claims, side.table, side.score, R.TEST_IID, LORA, m) for m in rivals}
        found = {m: c for m, c in found.items() if c is not None and not math.isnan(c["estimate"])}
        if not found:
            continue
        closest = min(found, key=lambda m: found[m]["estimate"])
        c = found[closest]
        if all(_significant(x, 1.0) for x in found.values()):
            verdict = "holds"
        elif any(_significant(x, -1.0) for x in found.values()):
            verdict = "reversed"
        else:
            verdict = "undecided"
        est = Estimate(c["estimate"], c["lo"], c["hi"], c["p_adjusted"])
        name = side.names[side.index(closest)]
        out.append(
            _row(
                2,
                side,
                side.score,
                f"LoRA − {name} (closest rival), i.i.d.",
                est,
                verdict,
                f"adjusted p {c['p_adjusted']:.3g}",
            )
        )
    return out


def _no_consistent_winner(
    sides: Mapping[tuple[str, str], Sides], claims: pd.DataFrame
) -> list[dict[str, Any]]:
    out = []
    for kind in ("closed", "open"):
        tables = [
            s for (t, k), s in sides.items() if k == kind and sum(m in PEFT for m in s.ids) >= 2
        ]
        if len(tables) < 2:
            continue
        best: dict[str, int] = {}
        for side in tables:
            peft = [m for m in side.ids if m in PEFT]
            for m in peft:
                wins = [
                    _oriented(claims, side.table, f"{kind} RR", RR, m, x) for x in peft if x != m
                ]
                if wins and all(_significant(w, 1.0) for w in wins):
                    best[m] = best.get(m, 0) + 1
        top = max(best, key=best.get) if best else None
        most = best.get(top, 0) if top else 0
        names = {m: s.names[s.index(m)] for s in tables for m in s.ids}
        verdict = "reversed" if most == len(tables) else "holds"
        out.append(
            {
                "finding": 3,
                "table": f"{len(tables)} shifts",
                "score": f"{kind} RR",
                "statistic": "shifts on which one PEFT method's RR is above every other's "
                "(adjusted)",
                "estimate": float(most),
                "ci_lo": math.nan,
                "ci_hi": math.nan,
                "verdict": verdict,
                "note": f"{names[top]} on {most} of {len(tables)}"
                if top
                else "no method on any shift",
            }
        )
    return out


def _full_inferior(sides: Mapping[tuple[str, str], Sides]) -> list[dict[str, Any]]:
    out = []
    for side in sides.values():
        if FULL not in side.ids or not side.bootstrapped:
            continue
        peft = [i for i, m in enumerate(side.ids) if m in PEFT]
        full = side.index(FULL)
        for split in SPLITS:
            usable = [i for i in peft if not side.missing(i, split)]
            if not usable or side.missing(full, split):
                continue
            mean, mean_reps = _mean_of(side, usable, split)
            point, reps = side.statistic(full, split)
            est = estimate(mean - point, mean_reps - reps, side.level)
            out.append(
                _row(
                    4,
                    side,
                    f"{side.score} ({split})",
                    f"mean of {len(usable)} PEFT method(s) − {side.names[full]}",
                    est,
                    _verdict(est),
                )
            )
    return out


def _shift_over_method(sides: Mapping[tuple[str, str], Sides]) -> list[dict[str, Any]]:
    out = []
    for kind in ("closed", "open"):
        tables = [s for (t, k), s in sides.items() if k == kind and s.bootstrapped]
        methods = [
            m
            for m in dict.fromkeys(m for s in tables for m in s.ids)
            if all(
                m in s.ids and s.roles[s.index(m)] == "method" and not s.missing(s.index(m), RR)
                for s in tables
            )
        ]
        if len(tables) < 2 or len(methods) < 2:
            continue
        points = np.array([[s.rr(s.index(m))[0] for s in tables] for m in methods])
        reps = np.stack(
            [np.stack([s.rr(s.index(m))[1] for s in tables], axis=-1) for m in methods], axis=-2
        )
        shift, method = _shares(points[None])
        shift_r, method_r = _shares(reps)
        est = estimate(float(shift[0] - method[0]), shift_r - method_r, tables[0].level)
        parts = {
            "shift": estimate(float(shift[0]), shift_r, tables[0].level),
            "method": estimate(float(method[0]), method_r, tables[0].level),
        }
        note = "; ".join(f"{k} {v.point:.0%} [{v.lo:.0%}, {v.hi:.0%}]" for k, v in parts.items())
        out.append(
            {
                "finding": 5,
                "table": f"{len(tables)} shifts × {len(methods)} methods",
                "score": f"{kind} RR",
                "statistic": "share of RR variance: between shifts − between methods",
                "estimate": est.point,
                "ci_lo": est.lo,
                "ci_hi": est.hi,
                "verdict": _verdict(est),
                "note": f"{note}; the rest is their interaction",
            }
        )
    return out


def _shares(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per replicate (matrix: replicates × methods × shifts), the shares of the total sum of
    squares that the shift means and the method means explain (NaN where a cell is)."""
    grand = matrix.mean(axis=(1, 2), keepdims=True)
    total = ((matrix - grand) ** 2).sum(axis=(1, 2))
    n_methods, n_shifts = matrix.shape[1:]
    shift = n_methods * ((matrix.mean(axis=1, keepdims=True) - grand) ** 2).sum(axis=(1, 2))
    method = n_shifts * ((matrix.mean(axis=2, keepdims=True) - grand) ** 2).sum(axis=(1, 2))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total > 0, shift / total, np.nan), np.where(
            total > 0, method / total, np.nan
        )


def _population(
    sides: Mapping[tuple[str, str], Sides], fields: Mapping[str, str]
) -> list[dict[str, Any]]:
    out = []
    for side in sides.values():
        field_ = fields.get(side.table, "")
        if field_ not in POPULATION_FIELDS or not side.bootstrapped:
            continue
        tuned = [i for i in _sides_of(side, _fine_tuned) if not side.missing(i, RR)]
        if not tuned:
            continue
        est = estimate(*_mean_of(side, tuned, RR), side.level)
        out.append(
            _row(
                6,
                side,
                f"{side.kind} RR",
                f"mean RR of {len(tuned)} fine-tuned method(s) under a shift of {field_}",
                est,
                _verdict(est, ROBUST_RR),
            )
        )
    return out


def shift_fields(placed: pd.DataFrame) -> dict[str, str]:
    """table -> the field its shift splits on (the runs' recorded `shift.field`; a shift of
    several fields or a transform: "")."""
    out: dict[str, str] = {}
    if placed.empty:
        return out
    runs = placed[(placed["kind"] == "run") & placed["status"].isin(USABLE)]
    for table, group in runs.groupby("table", sort=True):
        for source in group["source"]:
            path = Path(str(source))
            if not path.is_file():
                continue
            try:
                config = read_record(path).get("config") or {}
            except ValueError:
                continue
            value = (config.get("shift") or {}).get("field")
            out[str(table)] = str(value).lower() if isinstance(value, str) else ""
            break
    return out


def findings(
    sides: Mapping[tuple[str, str], Sides], claims: pd.DataFrame, fields: Mapping[str, str]
) -> Findings:
    """The six findings tested on the report's runs (see the module docstring)."""
    rows = [
        *_no_image(sides),
        *_lora_best(sides, claims),
        *_no_consistent_winner(sides, claims),
        *_full_inferior(sides),
        *_shift_over_method(sides),
        *_population(sides, fields),
    ]
    frame = pd.DataFrame(rows, columns=COLUMNS)
    overall = {
        int(n): _overall(list(part["verdict"])) for n, part in frame.groupby("finding", sort=True)
    }
    return Findings(frame, overall)
