"""The robustness card of a report: `card.md`, and the report's section of the same entries
(docs/metrics.md#the-robustness-card).

The items are those of the TRIPOD-LLM reporting guideline (Gallifant et al., Nature Medicine
2025) that apply to an evaluation of fine-tuned models under data shift: the models and how
they were adapted and prompted, the data and its splits (with the leakage audit), the outcome
measures and the judge that scored them (with its agreement), the baselines, the results with
their uncertainty, the compute, missing data (rows dropped and why, runs that did not finish,
items without a score) and the limitations: what the runs do not show. Every entry is read from
the records (results.json, the splits.json beside it) and the report's own tables; an entry no
record holds says "not recorded", never a default.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from medvqa.analysis.claims import Family
from medvqa.analysis.effective import Effective
from medvqa.analysis.findings import Findings
from medvqa.analysis.judges import JudgeSensitivity
from medvqa.analysis.summary import markdown_table, markdown_text
from medvqa.analysis.tables import FOOTNOTE, USABLE, wide_tables, with_role
from medvqa.data.shifts import SPLITS_FILE
from medvqa.record import RESULTS_FILE, read_record
from medvqa.untrusted import config_get, read_plain_json

NOT_RECORDED = "not recorded"
CARD_FILE = "card.md"
GUIDELINE = (
    "Items follow the TRIPOD-LLM reporting guideline (Gallifant et al., Nature Medicine 2025) "
    "where they apply to an evaluation; each entry is read from the run records "
    f"({RESULTS_FILE}, {SPLITS_FILE}) and the report's tables, “{NOT_RECORDED}” where no "
    "record holds it."
)


@dataclass
class Section:
    """One item of the card: a heading, then lines and tables in order."""

    title: str
    parts: list[str | pd.DataFrame] = field(default_factory=list)


@dataclass
class Card:
    sections: list[Section] = field(default_factory=list)

    def markdown(self) -> str:
        out = ["# Robustness card", "", GUIDELINE, ""]
        for section in self.sections:
            out += [f"## {markdown_text(section.title)}", ""]
            for part in section.parts:
                if isinstance(part, pd.DataFrame):
                    out += [markdown_table(part), ""]
                else:
                    out.append(f"- {markdown_text(part)}")
            out.append("")
        return "\n".join(out)

    def write(self, out_dir: Path) -> Path:
        path = Path(out_dir) / CARD_FILE
        path.write_text(self.markdown(), encoding="utf-8")
        return path


def _records(runs: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """source -> record, for the runs read from local files (W&B runs have none)."""
    out = {}
    for source in runs["source"].dropna().unique():
        path = Path(str(source))
        if path.is_file():
            try:
                out[str(source)] = read_record(path)
            except ValueError:
                continue
    return out


def _splits(source: str) -> dict[str, Any] | None:
    path = Path(source).parent / SPLITS_FILE
    try:  # a stranger's folder: plain values, a file naming code refused (medvqa.untrusted)
        report = read_plain_json(path, SPLITS_FILE, "").value if path.is_file() else None
    except ValueError:
        return None
    return report if isinstance(report, dict) else None


def _values(series: pd.Series) -> str:
    """The distinct recorded values, or NOT_RECORDED."""
    values = sorted({str(v) for v in series.dropna() if str(v) not in ("", "None", "nan")})
    return "; ".join(values) if values else NOT_RECORDED


def _models(runs: pd.DataFrame, records: Mapping[str, Mapping[str, Any]]) -> Section:
    section = Section("Models and methods (LLM, version, adaptation, prompting)")
    section.parts.append(f"model(s): {_values(runs['model'])}")
    section.parts.append(
        f"base weights (fingerprint): {_values(runs.get('model_weights', pd.Series()))}"
    )
    for what in ("method", "baseline"):
        rows = with_role(runs, what)
        listed = [
            f"{name} ({group['seed'].nunique()} seed(s))"
            for name, group in rows.groupby("method", sort=False)
        ]
        section.parts.append(f"{what}s: {', '.join(listed) or 'none run'}")
    prompts = pd.Series(
        [(r.get("choices") or {}).get("prompt") for r in records.values()], dtype=object
    )
    section.parts.append(f"prompt template (conf/prompt): {_values(prompts)}")
    section.parts.append(f"code: {_values(runs.get('code', pd.Series()))}")
    section.parts.append(f"packages: {_values(runs.get('versions', pd.Series()))}")
    return section


def _shift_text(config: Mapping[str, Any]) -> str:
    shift = config.get("shift") if isinstance(config.get("shift"), Mapping) else {}
    if not shift:
        return NOT_RECORDED
    how = [
        f"{k}={shift[k]}"
        for k in (
            "field",
            "ood_values",
            "iid_values",
            "iid_min",
            "ood_max",
            "transform",
            "any_of",
            "merge_train_ood",
        )
        if shift.get(k) not in (None, [], "")
    ]
    return f"{shift.get('name', '?')}: {', '.join(how) or 'as configured'}"


def _leakage(report: Mapping[str, Any]) -> str:
    audit = report.get("leakage")
    if not isinstance(audit, Mapping):
        return NOT_RECORDED
    shared = [
        f"{pair.replace('~', ' shares with ')}: {info.get('shared')} of {info.get('of')} "
        f"{kind} ({info.get('rows')} rows)"
        for pair, entry in audit.items()
        if isinstance(entry, Mapping)
        for kind, info in entry.items()
        if isinstance(info, Mapping) and info.get("shared")
    ]
    return "; ".join(shared) if shared else "no image, case or paraphrase group shared"


def _data(runs: pd.DataFrame, records: Mapping[str, Mapping[str, Any]]) -> Section:
    section = Section("Data, shifts and splits (sources, leakage audit)")
    for table, group in runs.groupby("table", sort=True):
        source = next((s for s in group["source"] if s in records), None)
        record = records.get(source, {}) if source else {}
        report = _splits(source) if source else None
        config = record.get("config") or {}
        section.parts.append(
            f"{table}: dataset {_values(group['dataset'])} (data fingerprint "
            f"{_values(group.get('data', pd.Series()))}); shift {_shift_text(config)}"
        )
        if report is None:
            section.parts.append(f"{table}: split sizes and leakage audit {NOT_RECORDED}")
            continue
        splits = report.get("splits") if isinstance(report.get("splits"), Mapping) else {}
        sizes = ", ".join(
            f"{name} {v.get('n')} ({v.get('closed')} closed / {v.get('open')} open)"
            for name, v in splits.items()
            if isinstance(v, Mapping)
        )
        section.parts.append(f"{table}: splits {sizes or NOT_RECORDED}")
        section.parts.append(f"{table}: leakage audit: {_leakage(report)}")
    return section


def _evaluation(
    runs: pd.DataFrame, records: Mapping[str, Mapping[str, Any]], judges: JudgeSensitivity
) -> Section:
    section = Section("Outcome measures and the judge")
    section.parts.append(
        f"headline scores: closed {_values(runs['primary_closed'])}, open "
        f"{_values(runs['primary_open'])}; RR = OoD / i.i.d."
    )
    boots = pd.Series(
        [
            json.dumps(config_get(r.get("config") or {}, "evaluation.bootstrap"), sort_keys=True)
            for r in records.values()
            if config_get(r.get("config") or {}, "evaluation.bootstrap")
        ],
        dtype=object,
    )
    section.parts.append(
        f"intervals: case-clustered bootstrap, evaluation.bootstrap {_values(boots)}"
    )
    section.parts.append(f"judge: {_values(runs.get('judge', pd.Series()))}")
    flags = [c for c in runs.columns if str(c).endswith(" unreliable")]
    failed = int(sum(bool(v is True or v == 1) for c in flags for v in runs[c]))
    section.parts.append(f"judge self-check failures among the headline cells: {failed}")
    agreement = [
        c
        for c in runs.columns
        if str(c).startswith("judge/agreement/")
        and "=" not in str(c)
        and not str(c).endswith(("_ci_lo", "_ci_hi", "_ci_half"))
    ]
    if agreement:
        values = runs[agreement].apply(pd.to_numeric, errors="coerce").mean()
        section.parts.append(
            "judge agreement (mean over runs): "
            + "; ".join(
                f"{c.removeprefix('judge/agreement/')} {v:.2f}"
                for c, v in values.items()
                if not math.isnan(v)
            )
        )
    else:
        section.parts.append(f"judge agreement: {NOT_RECORDED} (no jury)")
    if not judges.empty:
        section.parts.append(
            f"conclusions under each judge: {len(judges.flagged)} that do not hold under "
            "another judge"
        )
    return section


def _results(long: pd.DataFrame, family: Family, found: Findings, effective: Effective) -> Section:
    section = Section("Results with their uncertainty")
    for table, frame in wide_tables(long).items():
        section.parts.append(f"{table}:")
        section.parts.append(frame)
    section.parts.append(FOOTNOTE)
    section.parts.append(f"claims: {family.summary} (claims.csv)")
    holds = family.frame[family.frame["verdict"] == "holds"]
    for row in holds.itertuples():
        section.parts.append(
            f"holds: {row.table}, {row.score} ({row.split}): {row.method_a} − {row.method_b} "
            f"= {row.estimate:.3f} [{row.ci_lo:.3f}, {row.ci_hi:.3f}], adjusted p "
            f"{row.p_adjusted:.2g}"
        )
    section.parts.append(found.summary()[["finding", "SURE-VQA", "verdict"]])
    for note in effective.notes:
        section.parts.append(note)
    return section


def _compute(runs: pd.DataFrame) -> Section:
    section = Section("Compute (measured)")
    jobs = runs[runs["kind"] == "run"]
    seconds = pd.to_numeric(jobs.get("duration_s", pd.Series(dtype=float)), errors="coerce")
    section.parts.append(f"devices: {_values(jobs.get('device', pd.Series()))}")
    if seconds.notna().any():
        section.parts.append(
            f"{len(jobs)} job(s), {seconds.sum() / 3600:.2f} h in all as each job measured itself "
            f"({int(seconds.isna().sum())} without a duration)"
        )
    else:
        section.parts.append(f"job durations: {NOT_RECORDED}")
    return section


def _counts(counts: Any) -> str:
    """`{"train": 4296, ...}` as "train 4296, ..."; NOT_RECORDED where it is no mapping."""
    if not isinstance(counts, Mapping) or not counts:
        return NOT_RECORDED
    return ", ".join(f"{k} {v}" for k, v in counts.items())


def _missing(
    runs: pd.DataFrame, issues: pd.DataFrame, records: Mapping[str, Mapping[str, Any]]
) -> Section:
    section = Section("Missing data (rows dropped, runs that did not finish, unscored items)")
    seen = set()
    for table, group in runs.groupby("table", sort=True):
        source = next((s for s in group["source"] if s in records), None)
        report = _splits(source) if source else None
        if report is None:
            section.parts.append(f"{table}: rows dropped {NOT_RECORDED}")
            continue
        dropped = report.get("dropped") if isinstance(report.get("dropped"), Mapping) else {}
        key = json.dumps(dropped, sort_keys=True, default=str)
        if (table, key) in seen:
            continue
        seen.add((table, key))
        dropped_text = _counts(dropped) if dropped else "none"
        checked = report.get("image_check") or {}
        bad = (checked.get("counts") or {}) if isinstance(checked, Mapping) else {}
        section.parts.append(
            f"{table}: rows dropped by the shift: {dropped_text}; bad images skipped: "
            f"{', '.join(f'{k} {v}' for k, v in bad.items()) or 'none'}; source rows after "
            f"cleaning: {_counts(report.get('source'))}"
        )
    unscored = sum(int(r.get("failed_items") or 0) for r in records.values())
    section.parts.append(f"items without a score (a judge that could not score them): {unscored}")
    if issues.empty:
        section.parts.append("runs that did not finish: none")
    else:
        counts = issues["status"].value_counts().to_dict()
        section.parts.append(
            "runs that did not finish: "
            + ", ".join(f"{v} {k}" for k, v in counts.items())
            + " (issues.csv)"
        )
    return section


def _limits(runs: pd.DataFrame, family: Family, found: Findings) -> Section:
    section = Section("What the runs do not show (limitations)")
    methods = with_role(runs, "method")
    seeds = methods.groupby(["table", "method"])["seed"].nunique()
    if not seeds.empty and seeds.min() < 2:
        section.parts.append(
            f"{int((seeds < 2).sum())} method × shift cell(s) have one seed: training noise is "
            "not measured there"
        )
    if "dataset" in runs and set(runs["dataset"]) <= {"synthetic"}:
        section.parts.append(
            "synthetic data only: the mechanics carry over to real data, not the numbers"
        )
    if "rehearsal" in runs and runs["rehearsal"].fillna(False).astype(bool).any():
        section.parts.append("rehearsal runs (random weights): their scores mean nothing")
    judges = _values(runs.get("judge", pd.Series()))
    if judges == NOT_RECORDED:
        section.parts.append("no LLM judge: the open answers are scored by token overlap only")
    undecided = family.frame[family.frame["verdict"] != "holds"]
    if len(undecided):
        section.parts.append(
            f"{len(undecided)} of {len(family.frame)} pairwise comparison(s) do not hold after "
            "adjustment: their order is not shown by these runs (task=plan says what a study "
            "can detect)"
        )
    for _, row in found.summary().iterrows():
        if str(row["verdict"]).startswith("not testable"):
            section.parts.append(f"finding {row['finding']} ({row['SURE-VQA']}): {row['verdict']}")
    section.parts.append(
        "the shifts studied are the ones listed above; robustness to other shifts, other "
        "datasets or clinical use is not shown"
    )
    return section


def robustness_card(
    placed: pd.DataFrame,
    long: pd.DataFrame,
    issues: pd.DataFrame,
    family: Family,
    found: Findings,
    effective: Effective,
    judges: JudgeSensitivity,
) -> Card:
    """The card of the runs the report placed (see the module docstring)."""
    runs = placed[placed["kind"] == "run"] if not placed.empty else placed
    if runs.empty:
        return Card(
            [Section("Runs", [f"no run could be placed in a table: every item {NOT_RECORDED}"])]
        )
    usable = runs[runs["status"].isin(USABLE)]
    records = _records(runs)
    return Card(
        [
            _models(runs, records),
            _data(usable if not usable.empty else runs, records),
            _evaluation(runs, records, judges),
            _results(long, family, found, effective),
            _compute(runs),
            _missing(runs, issues, records),
            _limits(runs, family, found),
        ]
    )
