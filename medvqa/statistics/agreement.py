"""Agreement between raters of the same items: LLM judges of a jury, or people (the rater
study). Chance-corrected, from maintained implementations (statsmodels, `krippendorff`), each
with a case-clustered bootstrap interval (`statistics.cluster_statistic_ci`):

* `kappa`: Cohen's kappa of two raters on nominal scores (closed verdicts 0 / 0.5 / 1);
* `wkappa`: Cohen's kappa with quadratic weights, two raters on ordinal scores (open 1-5): a
  1-versus-5 disagreement costs sixteen times a 1-versus-2 one;
* `fleiss_kappa`: Fleiss' kappa of several raters on nominal scores;
* `alpha`: Krippendorff's alpha, ordinal, of several raters on ordinal scores;
* `tau`: Kendall's tau-b, the rank correlation the rater study reports beside them.

Scores are rated on a scale of levels (`CLOSED_LEVELS`, `OPEN_LEVELS`); a score between levels
(an open score that is the expected value of a judge's label probabilities, `logits` mode) is
rated at the nearest level. A rater that failed an item (a NaN score) makes the coefficient of
any set holding that item NaN: agreement over the items every rater answered would describe
the survivors, as a mean over them would.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from medvqa.statistics.bootstrap import BootstrapCI, cluster_statistic_ci

__all__ = [
    "CLOSED_LEVELS",
    "OPEN_LEVELS",
    "PAIR_STATS",
    "RATERS_STATS",
    "agreement",
    "cohen_kappa",
    "fleiss_kappa",
    "kendall_tau",
    "krippendorff_alpha",
    "levels_for",
]

CLOSED_LEVELS = (0.0, 0.5, 1.0)  # closed 0/1 and closed multilabel 0 / 0.5 / 1 verdicts
OPEN_LEVELS = (1.0, 2.0, 3.0, 4.0, 5.0)  # the open rubric's grades


def levels_for(answer_type: str) -> tuple[float, ...]:
    """The scale a judge's scores of `answer_type` ("closed", "open") are rated on."""
    return OPEN_LEVELS if answer_type == "open" else CLOSED_LEVELS


def _codes(ratings: Any, levels: Sequence[float], missing: bool = False) -> np.ndarray | None:
    """Each score as the index of its nearest level (items x raters); None if any is NaN,
    unless `missing` (then a NaN score is -1: no level)."""
    values = np.asarray(ratings, dtype=float)
    nan = np.isnan(values)
    if nan.any() and not missing:
        return None
    grid = np.asarray(levels, dtype=float)
    codes = np.abs(np.where(nan, grid[0], values)[..., None] - grid).argmin(axis=-1)
    return np.where(nan, -1, codes)


def _weights(weights: np.ndarray | None, n: int) -> np.ndarray:
    return np.ones(n) if weights is None else np.asarray(weights, dtype=float)


def cohen_kappa(
    a: Any,
    b: Any,
    levels: Sequence[float],
    quadratic: bool = False,
    weights: np.ndarray | None = None,
) -> float:
    """Cohen's kappa of two raters' scores (quadratic weights with `quadratic`), each item
    counted `weights[i]` times; statsmodels' `cohens_kappa` on the table over every level (so
    the quadratic weights space the levels as the scale does). NaN when undefined (both raters
    always give one same level) or when a score is NaN."""
    from statsmodels.stats.inter_rater import cohens_kappa as sm_cohens_kappa

    codes = _codes(np.column_stack([np.ravel(a), np.ravel(b)]), levels)
    if codes is None or codes.shape[0] == 0:
        return math.nan
    k = len(levels)
    w = _weights(weights, codes.shape[0])
    table = np.bincount(codes[:, 0] * k + codes[:, 1], weights=w, minlength=k * k)
    with np.errstate(invalid="ignore", divide="ignore"):
        value = sm_cohens_kappa(
            table.reshape(k, k), wt="quadratic" if quadratic else None, return_results=False
        )
    return float(value)


def _category_counts(codes: np.ndarray, k: int, weights: np.ndarray | None) -> np.ndarray:
    """Items x levels: how many raters gave each level, each item repeated `weights[i]` times
    (a bootstrap replicate's multiplicities)."""
    counts = np.stack([(codes == j).sum(axis=1) for j in range(k)], axis=1)
    if weights is None:
        return counts
    return np.repeat(counts, np.asarray(weights, dtype=int), axis=0)


def fleiss_kappa(ratings: Any, levels: Sequence[float], weights: np.ndarray | None = None) -> float:
    """Fleiss' kappa of items x raters nominal scores (statsmodels' `fleiss_kappa`)."""
    from statsmodels.stats.inter_rater import fleiss_kappa as sm_fleiss_kappa

    codes = _codes(ratings, levels)
    if codes is None or codes.shape[0] == 0:
        return math.nan
    with np.errstate(invalid="ignore", divide="ignore"):
        return float(sm_fleiss_kappa(_category_counts(codes, len(levels), weights)))


def krippendorff_alpha(
    ratings: Any,
    levels: Sequence[float],
    measurement: str = "ordinal",
    weights: np.ndarray | None = None,
    missing: bool = False,
) -> float:
    """Krippendorff's alpha of items x raters scores at the `measurement` level ("nominal",
    "ordinal", "interval"), from the `krippendorff` package; NaN when undefined (a single
    level throughout) or when a score is NaN. `missing=True` reads a NaN as a rating not made,
    as alpha's own definition allows (a design where not every rater rates every item); a
    judge's failed item is not that, so the judges' agreement never passes it."""
    import krippendorff

    codes = _codes(ratings, levels, missing)
    if codes is None or codes.shape[0] == 0:
        return math.nan
    counts = _category_counts(codes, len(levels), weights)
    if (counts.sum(axis=0) > 0).sum() < 2:
        return math.nan  # one level only: no disagreement to expect, alpha is 0/0
    with np.errstate(invalid="ignore", divide="ignore"):
        return float(
            krippendorff.alpha(
                value_counts=counts, value_domain=list(levels), level_of_measurement=measurement
            )
        )


def kendall_tau(a: Any, b: Any, weights: np.ndarray | None = None) -> float:
    """Kendall's tau-b of two raters' scores (scipy); NaN if a score is NaN or either side is
    constant. With `weights`, each item counted that many times."""
    from scipy import stats

    x, y = np.ravel(np.asarray(a, dtype=float)), np.ravel(np.asarray(b, dtype=float))
    if np.isnan(x).any() or np.isnan(y).any() or x.size < 2:
        return math.nan
    if weights is not None:
        times = np.asarray(weights, dtype=int)
        x, y = np.repeat(x, times), np.repeat(y, times)
    if np.unique(x).size < 2 or np.unique(y).size < 2:
        return math.nan
    return float(stats.kendalltau(x, y).statistic)


# stat -> f(items x 2 ratings, levels, weights): coefficients of a pair of raters
PAIR_STATS: Mapping[str, Callable[..., float]] = {
    "kappa": lambda r, levels, w=None: cohen_kappa(r[:, 0], r[:, 1], levels, weights=w),
    "wkappa": lambda r, levels, w=None: cohen_kappa(r[:, 0], r[:, 1], levels, True, w),
    "tau": lambda r, levels, w=None: kendall_tau(r[:, 0], r[:, 1], w),
}
# stat -> f(items x raters ratings, levels, weights): coefficients of any number of raters
RATERS_STATS: Mapping[str, Callable[..., float]] = {
    "fleiss_kappa": lambda r, levels, w=None: fleiss_kappa(r, levels, w),
    "alpha": lambda r, levels, w=None: krippendorff_alpha(r, levels, "ordinal", w),
    "alpha_nominal": lambda r, levels, w=None: krippendorff_alpha(r, levels, "nominal", w),
}


def agreement(
    stat: str,
    ratings: Any,
    clusters: Any,
    levels: Sequence[float],
    bootstrap: Mapping[str, Any] | None = None,
) -> BootstrapCI:
    """`stat` (a key of `PAIR_STATS` or `RATERS_STATS`) of items x raters `ratings`, with a
    case-clustered bootstrap interval (`bootstrap`: B, seed, level; None: the point only)."""
    table = {**PAIR_STATS, **RATERS_STATS}
    if stat not in table:
        raise ValueError(f"agreement statistic {stat!r} is not one of {sorted(table)}")
    values = np.asarray(ratings, dtype=float)
    if values.ndim != 2 or (stat in PAIR_STATS and values.shape[1] != 2):
        raise ValueError(
            f"{stat}: ratings must be items x raters (2 for a pair), got {values.shape}"
        )
    fn = table[stat]
    if bootstrap is None:
        point = fn(values, levels)
        return BootstrapCI(point, math.nan, math.nan, math.nan)
    return cluster_statistic_ci(
        lambda w: fn(values, levels, w), clusters, **bootstrap, what=f"agreement {stat}"
    )
