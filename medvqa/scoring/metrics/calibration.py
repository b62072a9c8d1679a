"""`metric=calibration`: does the model know when it is wrong, and does that survive the shift?

Generation records each answer's token log-probabilities (`medvqa.generation.logprobs`:
`answer_logprob_mean`, `answer_logprob_min`, `answer_tokens`). The family turns them into a
confidence in [0, 1] (option `confidence`: `sequence`, the probability of the whole answer
string greedy decoding produced, exp(sum); `mean`, the geometric mean of its tokens'
probabilities; `min`, its least likely token's) and scores it against right/wrong
(`traditional.binary_correct`: the chosen candidate of a closed question, exact equality for an
open one), per answer type:

- `ece`: expected calibration error over `bins` equal-mass bins (sorted by confidence, split
  into bins of equal row count; Σ_b |b|/N · |accuracy_b − mean confidence_b|), the adaptive
  binning of Nixon et al. 2019, which does not leave bins empty when confidences crowd near 1;
- `brier`: mean squared difference between confidence and right (1) / wrong (0) (Brier 1950);
- `aurc`: area under the risk–coverage curve, the mean over k = 1..N of the error rate of the k
  most confident answers (Geifman & El-Yaniv 2017; ties are taken in row order);
- `acc_at_<c>`: accuracy of the ⌈c·N⌉ most confident answers (selective prediction: answer
  only the part one is surest of), for each of `coverages`;
- `confidence` (mean confidence) and `accuracy`, whose gap is the over- or under-confidence,
  and `n`, the rows scored.

ECE, Brier and AURC are errors (lower is better; no relative robustness). A row that has a
right/wrong but no recorded confidence (answers generated before confidences were recorded,
a baseline that does not generate, a served model whose server returns no log-probabilities)
makes its split's figures NaN: never a calibration of
the rows that happen to have one.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from medvqa.data import records as R
from medvqa.errors import ConfigError
from medvqa.scoring.metrics.base import COUNT, MetricFamily, ScoreInfo
from medvqa.scoring.metrics.traditional import binary_correct, per_sample_scores

log = logging.getLogger(__name__)

CONFIDENCES = ("sequence", "mean", "min")
ERROR = ScoreInfo(performance=False, higher_is_better=False)


def adaptive_ece(confidence: np.ndarray, correct: np.ndarray, bins: int) -> float:
    """Expected calibration error over `bins` bins of (nearly) equal row count."""
    n = len(confidence)
    if n == 0:
        return math.nan
    order = np.argsort(confidence, kind="mergesort")
    total = 0.0
    for part in np.array_split(order, min(bins, n)):
        total += len(part) / n * abs(correct[part].mean() - confidence[part].mean())
    return float(total)


def risk_coverage(confidence: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """Error rate of the k most confident answers, for k = 1..N (ties in row order)."""
    order = np.argsort(-confidence, kind="mergesort")
    errors = np.cumsum(1.0 - correct[order])
    return errors / np.arange(1, len(order) + 1)


def accuracy_at_coverage(confidence: np.ndarray, correct: np.ndarray, coverage: float) -> float:
    """Accuracy of the ⌈coverage·N⌉ most confident answers."""
    n = len(confidence)
    if n == 0:
        return math.nan
    k = max(1, math.ceil(coverage * n - 1e-9))
    order = np.argsort(-confidence, kind="mergesort")
    return float(correct[order[:k]].mean())


def confidence_of(preds: pd.DataFrame, kind: str) -> pd.Series:
    """The answer's confidence in [0, 1] from its recorded log-probabilities (`sequence` and
    `mean` from the summed log-probability at temperature 1); NaN without."""
    if kind == "min":
        nan = pd.Series(np.nan, index=preds.index)
        return np.exp(pd.to_numeric(preds.get(R.LOGPROB_MIN, nan), errors="coerce"))
    return confidence_at(preds, kind, 1.0)


class CalibrationMetric(MetricFamily):
    """Confidence against right/wrong, per answer type (see the module doc)."""

    name = "calibration"
    not_performance: ClassVar[dict[str, ScoreInfo]] = {
        "ece": ERROR,
        "brier": ERROR,
        "aurc": ERROR,
        "confidence": ScoreInfo(performance=False),
        "n": COUNT,
    }

    def __init__(
        self,
        confidence: str = "sequence",
        bins: int = 10,
        coverages: Sequence[float] = (0.5, 0.8),
        min_rows: int = 10,
    ) -> None:
        if confidence not in CONFIDENCES:
            raise ConfigError(
                f"metric.calibration.confidence={confidence!r}: choose one of {CONFIDENCES}"
            )
        if int(bins) < 1:
            raise ConfigError(f"metric.calibration.bins={bins}: needs a whole number >= 1")
        if isinstance(min_rows, bool) or int(min_rows) != min_rows or min_rows < 1:
            raise ConfigError(
                f"metric.calibration.min_rows={min_rows}: needs a whole number >= 1 (10)"
            )
        bad = [c for c in coverages if not 0 < float(c) <= 1]
        if bad:
            raise ConfigError(
                f"metric.calibration.coverages={list(coverages)}: each must be in (0, 1], "
                "e.g. [0.5, 0.8]"
            )
        self.confidence = confidence
        self.bins = int(bins)
        self.coverages = [float(c) for c in coverages]
        # Fewer answers of a type than this: its figures are NaN (an ECE of one answer is its
        # distance from 0 or 1, not a calibration), as the subgroup family's `min_rows`.
        self.min_rows = int(min_rows)

    def too_few(self, n: int, what: str) -> bool:
        """Whether `n` answers are too few for calibration figures (a warning says so)."""
        if 0 < n < self.min_rows:
            log.warning(
                "calibration: %s has %d answers, fewer than metric.calibration.min_rows=%d: "
                "its figures are NaN",
                what,
                n,
                self.min_rows,
            )
        return n < self.min_rows

    def per_sample(self, preds: pd.DataFrame) -> pd.DataFrame:
        correct = binary_correct(per_sample_scores(preds, ["exact_match"]))
        confidence = confidence_of(preds, self.confidence)
        return pd.DataFrame(
            {
                self.column("confidence"): confidence,
                self.column("correct"): correct,
                self.column("sq_error"): (confidence - correct) ** 2,
            },
            index=preds.index,
        )

    def _names(self) -> list[str]:
        cov = [f"acc_at_{round(c * 100)}" for c in self.coverages]
        return ["ece", "brier", "aurc", *cov, "confidence", "accuracy", "n"]

    def aggregate(self, scored: pd.DataFrame) -> dict[str, float]:
        out: dict[str, float] = {}
        for answer_type in ("closed", "open"):
            rows = scored[scored[R.ANSWER_TYPE] == answer_type]
            correct = rows[self.column("correct")].to_numpy(float)
            confidence = rows[self.column("confidence")].to_numpy(float)
            keep = ~np.isnan(correct)
            correct, confidence = correct[keep], confidence[keep]
            names = [f"{answer_type}_{n}" for n in self._names()]
            if self.too_few(len(correct), f"{answer_type} questions") or np.isnan(confidence).any():
                if len(correct):
                    log.warning(
                        "calibration: %d of %d %s answers have no recorded confidence "
                        "(generated before confidences were recorded, or by a served model "
                        "whose server returns no logprobs): their figures are NaN",
                        int(np.isnan(confidence).sum()),
                        len(confidence),
                        answer_type,
                    )
                out.update({self.column(n): math.nan for n in names})
                out[self.column(f"{answer_type}_n")] = float(len(correct))
                continue
            values: list[Any] = [
                adaptive_ece(confidence, correct, self.bins),
                float(np.mean((confidence - correct) ** 2)),
                float(risk_coverage(confidence, correct).mean()),
                *[accuracy_at_coverage(confidence, correct, c) for c in self.coverages],
                float(confidence.mean()),
                float(correct.mean()),
                float(len(correct)),
            ]
            out.update({self.column(n): v for n, v in zip(names, values, strict=True)})
        return out

    def ci_columns(self) -> dict[str, tuple[str, str]]:
        """Brier is a per-sample mean: case-bootstrap intervals and paired deltas."""
        return {self.column(f"{t}_brier"): (self.column("sq_error"), t) for t in ("closed", "open")}

    def over_rows(self, scored: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, float]]:
        """Temperature scaling over the job's splits (`temperature_metrics`)."""
        return temperature_metrics(scored, self)


# --- temperature scaling -----------------------------------------------------------------------

SCALED = "confidence_scaled"  # the per-sample column, after the family's prefix


def _grid(cell: Any) -> dict[float, float]:
    """A recorded {temperature: summed log-prob} cell (a dict, or its JSON text once written
    to Parquet); empty where none was recorded."""
    if isinstance(cell, str):
        cell = json.loads(cell)
    if not isinstance(cell, dict):
        return {}
    return {float(t): float(v) for t, v in cell.items() if v is not None}


def confidence_at(preds: pd.DataFrame, kind: str, temperature: float) -> pd.Series:
    """The confidence of `confidence_of` with the logits divided by `temperature`, from the
    recorded grid (`R.LOGPROB_BY_TEMPERATURE`): `sequence` exp(sum), `mean` exp(sum / tokens);
    NaN for `min` (not recorded per temperature) and rows without the grid."""
    if kind == "min" or R.LOGPROB_BY_TEMPERATURE not in preds:
        return pd.Series(np.nan, index=preds.index)
    sums = preds[R.LOGPROB_BY_TEMPERATURE].map(lambda c: _grid(c).get(temperature, np.nan))
    sums = sums.astype(float)
    if kind == "mean":
        sums = sums / pd.to_numeric(preds[R.ANSWER_TOKENS], errors="coerce")
    return np.exp(sums)


def binary_nll(confidence: np.ndarray, correct: np.ndarray) -> float:
    """Mean negative log-likelihood of right/wrong under the confidence (clipped to 1e-6)."""
    c = np.clip(confidence, 1e-6, 1 - 1e-6)
    return float(-np.mean(correct * np.log(c) + (1 - correct) * np.log(1 - c)))


def fit_temperature(preds: pd.DataFrame, correct: np.ndarray, kind: str) -> float:
    """The temperature of the recorded grid whose confidences fit right/wrong best (least
    `binary_nll`; ties to the one nearest 1); NaN without rows or with a row lacking the grid."""
    best, best_nll = math.nan, math.inf
    for t in sorted(R.TEMPERATURES, key=lambda t: abs(math.log(t))):
        confidence = confidence_at(preds, kind, t).to_numpy(float)
        if not len(confidence) or np.isnan(confidence).any():
            return math.nan
        nll = binary_nll(confidence, correct)
        if nll < best_nll - 1e-12:
            best, best_nll = t, nll
    return best


def temperature_metrics(
    scored: pd.DataFrame, family: CalibrationMetric, fit_split: str = R.VAL
) -> tuple[pd.DataFrame, dict[str, float]]:
    """Temperature scaling: per answer type, the temperature fitted on `fit_split`'s answers
    (the i.i.d. validation split, `task.eval_splits` must include it) applied to every split,
    and the calibration figures again with it: `<fit_split>/calibration_<type>_temperature`,
    `<split>/calibration_<type>_{ece,brier,aurc}_scaled`. Does calibration fitted i.i.d.
    transfer OoD? The per-sample `calibration_confidence_scaled` joins the table. Nothing
    without `fit_split` rows."""
    out: dict[str, float] = {}
    column = family.column(SCALED)
    if R.SPLIT not in scored or not (scored[R.SPLIT] == fit_split).any():
        return scored, out
    scaled = pd.Series(np.nan, index=scored.index)
    correct_all = scored[family.column("correct")].to_numpy(float)
    for answer_type in ("closed", "open"):
        of_type = (scored[R.ANSWER_TYPE] == answer_type).to_numpy() & ~np.isnan(correct_all)
        fit = of_type & (scored[R.SPLIT] == fit_split).to_numpy()
        if not fit.any():
            continue
        t = math.nan
        if not family.too_few(int(fit.sum()), f"the temperature fit on {fit_split} {answer_type}"):
            t = fit_temperature(scored[fit], correct_all[fit], family.confidence)
        out[f"{fit_split}/{family.column(f'{answer_type}_temperature')}"] = t
        if math.isnan(t):
            continue
        scaled[of_type] = confidence_at(scored[of_type], family.confidence, t)
        for split in dict.fromkeys(scored.loc[of_type, R.SPLIT]):
            rows = of_type & (scored[R.SPLIT] == split).to_numpy()
            c, y = scaled[rows].to_numpy(float), correct_all[rows]
            name = f"{split}/{family.column(answer_type)}"
            nan = np.isnan(c).any() or family.too_few(len(c), f"{split} {answer_type}")
            out[f"{name}_ece_scaled"] = math.nan if nan else adaptive_ece(c, y, family.bins)
            out[f"{name}_brier_scaled"] = math.nan if nan else float(np.mean((c - y) ** 2))
            out[f"{name}_aurc_scaled"] = math.nan if nan else float(risk_coverage(c, y).mean())
    return scored.assign(**{column: scaled}), out
