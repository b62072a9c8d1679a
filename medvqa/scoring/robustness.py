"""Relative robustness (RR) of a score under distribution shift, as defined in SURE-VQA.

RR = 1 - (P_iid - P_OoD) / P_iid = P_OoD / P_iid: 1 means no degradation, < 1 a drop,
> 1 that the shifted split happens to be easier. It is a ratio, so it is only meaningful for
"higher is better" scores in [0, 1] (accuracies, token F1, BLEU), not for counts.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence

log = logging.getLogger(__name__)

__all__ = ["relative_robustness", "robustness_metrics"]


def relative_robustness(p_iid: float, p_ood: float) -> float:
    """RR = P_OoD / P_iid (SURE-VQA).

    NaN when P_iid is 0 (the relative drop from zero is undefined: every OoD score would be an
    "infinite" or 0/0 change) or when either score is NaN (a split without rows for this
    metric, see ``score_predictions``): an undefined RR must not masquerade as a number.
    """
    p_iid, p_ood = float(p_iid), float(p_ood)
    if math.isnan(p_iid) or math.isnan(p_ood) or p_iid == 0.0:
        return float("nan")
    return p_ood / p_iid


def robustness_metrics(
    iid: Mapping[str, float],
    ood: Mapping[str, float],
    keys: Sequence[str],
    primary: Mapping[str, str] | None = None,
) -> dict[str, float]:
    """``rr_<key>`` for each key present in both score dicts, plus headline aliases.

    Keys missing from either dict are skipped (e.g. a breakdown value that occurs only in one
    split). ``primary`` maps an alias to a metric key, e.g. ``{"closed": "closed_acc",
    "open": "open_f1"}`` adds ``rr_closed`` and ``rr_open``; a primary key missing from either
    dict raises ``KeyError``, because the headline numbers must always exist and a missing one
    means a misconfigured metric name rather than missing data.
    """
    out: dict[str, float] = {}
    for k in keys:
        if k in iid and k in ood:
            out[f"rr_{k}"] = relative_robustness(iid[k], ood[k])
        else:
            log.debug("skipping RR for %r: not in both score dicts", k)
    for alias, k in (primary or {}).items():
        missing = [name for name, d in (("iid", iid), ("ood", ood)) if k not in d]
        if missing:
            raise KeyError(
                f"primary metric {k!r} (alias {alias!r}) missing from {missing} scores; "
                f"available: {sorted(iid)}"
            )
        out[f"rr_{alias}"] = relative_robustness(iid[k], ood[k])
    return out
