"""Methods in the report: each row's `method_id` (what it *is*), its display name, and the
paper's order of methods."""

from __future__ import annotations

import functools
from collections.abc import Mapping

import pandas as pd
import yaml

from medvqa import CONF_DIR
from medvqa.generation.passes import CHANCE, ZERO_SHOT

# Every row has a `method_id` that says what it *is*, stable when labels are edited: the peft
# method's name, a sanity baseline's name (`<peft>+<baseline>` for a baseline that trains a
# method), or the label the user gave the run; `@<image>` marks an evaluation with another image
# and `@delta_<image>` the paired difference; ` [<option>=<value>]` a test condition
# (`rows.CONDITION_OPTIONS`).
# Rows are grouped and joined on it; the `method` column is its display name, read from the
# record (`label`, `peft.label`: the `label:` of conf/peft/*.yaml and conf/baseline/*.yaml, the
# paper's row names), or from the shipped configs for a record that names none (`shipped_label`).
PEFT_METHODS = ("none", "full", "prompt_tuning", "lora", "ia3")
BASELINES = ("most_frequent", "no_image", "no_image_eval", "random", "image_only")
# The paper's row order; other methods come after these, in the order they were first seen.
METHOD_ORDER = (*PEFT_METHODS, *BASELINES)
# Metric-name prefixes of the reference rows a run scores (its evaluation passes), and the
# method each row is: the untuned base is the `none` method, chance is the random baseline.
REFERENCES = {ZERO_SHOT: "none", CHANCE: "random"}


@functools.cache
def shipped_label(group: str, option: str) -> str | None:
    """The `label:` of conf/<group>/<option>.yaml (a peft method or a baseline), where the name
    is declared once; None where the file or its label is absent."""
    path = CONF_DIR / group / f"{option}.yaml"
    if not path.is_file():
        return None
    label = (yaml.safe_load(path.read_text()) or {}).get("label")
    return str(label) if label else None


def method_name(method_id: str, label: str | None = None) -> str:
    """The display name of a method id: the label the run recorded (`label`, `peft.label`),
    else (a record without one, a reference row) the label the configs ship for the method or
    baseline, else the id; the variant suffix kept. A pass's row is named by its pass
    (`rows.record_rows`)."""
    head, bracket, variant = method_id.partition(" [")
    peft, _, baseline = head.partition("+")
    if baseline:
        method = shipped_label("peft", peft) or peft
        name = label or shipped_label("baseline", baseline) or f"{method} ({baseline} baseline)"
    else:
        name = label or shipped_label("peft", head) or shipped_label("baseline", head) or head
    return f"{name}{bracket}{variant}"


def method_sort_key(method_id: str, first_seen: Mapping[str, int] | None = None) -> tuple:
    """Known methods in the paper's order, derived rows right after theirs, then the rest."""
    head = method_id.split(" [")[0].split("@")[0]
    known = head.rpartition("+")[2]
    if known in METHOD_ORDER and (known == head or known in BASELINES):
        return (0, METHOD_ORDER.index(known), method_id != head, method_id)
    return (1, (first_seen or {}).get(method_id, 0), 0, method_id)


def newest_names(frame: pd.DataFrame) -> pd.DataFrame:
    """One display name per method id: records that name a method differently (a label edited
    between sweeps, an older record) show the newest run's name (reference rows, named from the
    configs, only where no run of the method names it)."""
    if frame.empty or "started_at" not in frame:
        return frame
    ranked = frame.assign(_run=frame["kind"] != "reference").sort_values(
        ["_run", "started_at"], kind="stable", na_position="first"
    )
    newest = ranked.drop_duplicates("method_id", keep="last").set_index("method_id")["method"]
    frame = frame.copy()
    frame["method"] = frame["method_id"].map(newest).fillna(frame["method"])
    return frame


def distinct_names(frame: pd.DataFrame) -> pd.DataFrame:
    """Two methods never share a display name (e.g. LoRA and full fine-tuning, both run as the
    no-image baseline): a name several ids map to gets the id appended."""
    ids_per_name = frame.groupby("method")["method_id"].nunique()
    shared = frame["method"].isin(ids_per_name[ids_per_name > 1].index)
    frame.loc[shared, "method"] = frame["method"] + " (" + frame["method_id"] + ")"
    return frame
