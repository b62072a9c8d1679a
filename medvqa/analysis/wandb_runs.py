"""W&B as a source of run records: a W&B run read as a results.json-shaped record, and a
project's runs as the tidy table (`collect_wandb`)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from medvqa.analysis.aggregate import records_frame
from medvqa.analysis.rows import placed_rows, skipped_row
from medvqa.measure import split_perf
from medvqa.record import SUMMARY_PREFIX
from medvqa.untrusted import check_plain, plain_values

_WANDB_STATES = {
    "finished": "finished",
    "failed": "failed",
    "crashed": "failed",
    "killed": "failed",
    "running": "running",
}


def wandb_run_record(run: Any) -> dict[str, Any]:
    """A W&B run (from `wandb.Api().runs`) as a results.json-shaped record.

    W&B keeps the resolved config and the last value of each metric, but not Hydra's choices,
    so the setting falls back to the config (dataset/shift names). A diverged or incomplete
    run ends cleanly (W&B: `finished`); the status medvqa logged to the summary
    (`medvqa/status`, with `medvqa/diverged_step`, `medvqa/failed_items`) is used instead.
    """
    config = {k: v for k, v in dict(run.config).items() if not str(k).startswith("_")}
    # A W&B run is a record too: plain values only (medvqa.untrusted), as results.json is read.
    config = check_plain(plain_values(config, "config"), f"W&B run {getattr(run, 'id', '?')}")
    summary = dict(getattr(run.summary, "_json_dict", None) or run.summary)
    numbers = {
        str(k): v
        for k, v in summary.items()
        if not str(k).startswith(("_", SUMMARY_PREFIX))
        and isinstance(v, int | float)
        and not isinstance(v, bool)
    }
    metrics, perf = split_perf(numbers)  # as results.json keeps them
    state = str(getattr(run, "state", "finished"))
    # The run's own status (diverged, incomplete) where it logged one; W&B's state otherwise.
    status = str(summary.get(f"{SUMMARY_PREFIX}status") or _WANDB_STATES.get(state, state))
    return {
        "status": status,
        "seed": config.get("seed"),
        "choices": {},
        "config": config,
        "metrics": metrics,
        "perf": perf,
        "error": None if status == "finished" else f"{status} (W&B state {state!r})",
        "diverged_step": summary.get(f"{SUMMARY_PREFIX}diverged_step"),
        "failed_items": summary.get(f"{SUMMARY_PREFIX}failed_items"),
        "started_at": getattr(run, "created_at", None),
    }


def collect_wandb(path: str, api: Any = None) -> pd.DataFrame:
    """Tidy table of the runs of a W&B project `ENTITY/PROJECT` (needs network and a key)."""
    if path.count("/") != 1:
        raise ValueError(f"--wandb {path!r}: expected ENTITY/PROJECT, e.g. my-team/medvqa")
    try:
        if api is None:
            import wandb

            api = wandb.Api(timeout=30)
        runs = list(api.runs(path))
    except Exception as err:
        raise RuntimeError(
            f"could not read W&B runs of {path!r} ({type(err).__name__}: {err}). W&B needs "
            "network access and a key (`wandb login` or WANDB_API_KEY); offline, aggregate the "
            "local results.json records instead: medvqa-report <sweep dir> --out <dir>"
        ) from err
    rows: list[dict[str, Any]] = []
    for run in runs:
        source = f"wandb:{path}/{run.id}"
        try:
            record = wandb_run_record(run)
        except ValueError as err:  # a config naming code (medvqa.untrusted): listed, not read
            rows.append(skipped_row(source, str(err)))
            continue
        rows.extend(placed_rows(record, source))
    return records_frame(rows)
