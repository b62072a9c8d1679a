"""Planted studies: run records and scored tables (results.json and scores.parquet, as a run
writes them) whose accuracies are chosen by the test, so a conclusion drawn from them is known
to hold or to be reversed. Rows cluster in cases (a case's own difficulty shifts all its rows);
each seed draws its own answers to the same questions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from tests.test_report import write_record

CI_COLUMNS = {"closed_acc": ["closed_correct", "closed"], "open_f1": ["open_f1", "open"]}


def _scores(
    rng: np.random.Generator, p: Mapping[str, float], cases: int, per_case: int
) -> pd.DataFrame:
    """A scored table of both test splits: `p[split]` the accuracy of closed and open rows."""
    frames = []
    for split, level in p.items():
        case = np.repeat(np.arange(cases), per_case)
        shift = rng.normal(0, 0.08, cases)[case]
        correct = (rng.random(case.size) < np.clip(level + shift, 0, 1)).astype(float)
        kind = np.where(np.arange(case.size) % 2 == 0, "closed", "open")
        frames.append(
            pd.DataFrame(
                {
                    "id": [f"{split}-{i}" for i in range(case.size)],
                    "split": split,
                    "case_id": [f"{split}-c{c}" for c in case],
                    "answer_type": kind,
                    "closed_correct": np.where(kind == "closed", correct, np.nan),
                    "open_f1": np.where(kind == "open", correct, np.nan),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def plant(
    root: Path,
    tables: Mapping[str, Mapping[str, tuple[float, float]]],
    seeds: Sequence[int] = (0, 1),
    cases: int = 120,
    per_case: int = 4,
    fields: Mapping[str, str] | None = None,
    samples: int = 400,
    seed: int = 0,
) -> Path:
    """Under `root`, one run per table (experiment), method and seed: `tables[table][method]` =
    (i.i.d., OoD) accuracy of its closed and open rows; a method is a peft name or
    `<peft>+<baseline>`. `fields`: the shift's field per table (default its name)."""
    rng = np.random.default_rng(seed)
    for table, methods in tables.items():
        for method, (iid, ood) in methods.items():
            peft, _, baseline = method.partition("+")
            for s in seeds:
                scored = _scores(rng, {"test_iid": iid, "test_ood": ood}, cases, per_case)
                metrics = {}
                for kind, score in (("closed", "closed_acc"), ("open", "open_f1")):
                    column = CI_COLUMNS[score][0]
                    means = scored.groupby("split")[column].mean()
                    metrics[f"test_iid/{score}"] = means["test_iid"]
                    metrics[f"test_ood/{score}"] = means["test_ood"]
                    metrics[f"robustness/rr_{kind}"] = means["test_ood"] / means["test_iid"]
                path = write_record(
                    root,
                    peft,
                    s,
                    metrics=metrics,
                    shift=table,
                    experiment=table,
                    baseline=baseline or None,
                    extra={"provenance": {"metrics": {"traditional": {"ci_columns": CI_COLUMNS}}}},
                )
                record = json.loads(path.read_text())
                record["config"]["shift"]["field"] = (fields or {}).get(table, table)
                record["config"]["evaluation"]["bootstrap"] = {
                    "samples": samples,
                    "seed": 7,
                    "level": 0.95,
                }
                path.write_text(json.dumps(record))
                scored.to_parquet(path.parent / "scores.parquet")
    return root
