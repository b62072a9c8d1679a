"""`medvqa-select`: each grid's winning setting per dataset × method, from validation scores.

    medvqa-select logs/multiruns/<lora_grid dir> [more grid dirs] --out conf/hparams/sure_vqa

SURE-VQA's criterion: the judge's closed accuracy on the validation split
(`val/judge_closed_acc`), ties broken by the judge's open score (`val/judge_open_score`). Runs
without judge scores fall back to the configured headline scores (`evaluation.primary_closed`,
then `primary_open`, on `val/`); the file written says which criterion decided. Test-split
scores are never used: a grid that scored no validation split is refused.

Runs are read from their records (results.json: status, seed, Hydra's choices, the resolved
config, the metrics), never from directory names. The runs of one dataset (the `dataset`
choice) and method (the `peft` choice) are one grid; its settings are the config keys whose
values differ between those runs (e.g. `peft.lr`, `peft.adapter.r`). A setting's score is the
mean over its seeds; a setting with a run that diverged, failed or could not be scored has no
score (not a mean over the seeds that survived) and is never the winner; it is listed.

The winner is written as `<out>/<dataset>_<peft>.yaml`, the file `study=<name>` composes from
conf/hparams/<name>/, so `--out conf/hparams/sure_vqa` replaces the shipped paper settings.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from medvqa import CONF_DIR
from medvqa.analysis.aggregate import find_records
from medvqa.analysis.rows import as_number, run_identity
from medvqa.data import records as R
from medvqa.record import read_record
from medvqa.scoring.pipeline import unreliable
from medvqa.untrusted import config_get

log = logging.getLogger(__name__)

SPLIT = R.VAL
# The paper's criterion, and its tie-breaker (docs/judge.md: closed 0-1, open 1-5).
JUDGE = ("judge_closed_acc", "judge_open_score")
# Where a grid's settings may differ: the method, the trainer and the data loader. Runs that
# differ elsewhere (shift, dataset options, metrics) were not evaluated alike.
SETTING_PREFIXES = ("peft.", "trainer.", "data.")
# The task whose runs a grid is made of (`task=train_eval`, fine-tune then score).
GRID_TASK = "train_eval"


@dataclass
class Run:
    """One record of a grid, with the two criterion scores read from its metrics."""

    source: str
    seed: Any
    status: str
    error: str | None
    closed: float
    open: float


@dataclass
class Candidate:
    """One setting of a grid and its runs (one per seed)."""

    setting: dict[str, Any]
    runs: list[Run] = field(default_factory=list)

    @property
    def reason(self) -> str | None:
        """Why this setting cannot win (None: it can)."""
        bad = [r for r in self.runs if r.status != "finished"]
        if bad:
            parts = ", ".join(
                f"seed {r.seed} {r.status}{f' ({r.error})' if r.error else ''}" for r in bad
            )
            return f"{len(bad)} of {len(self.runs)} run(s) did not finish: {parts}"
        if any(math.isnan(r.closed) for r in self.runs):
            return "no criterion score in every run (null in results.json)"
        return None

    @property
    def score(self) -> tuple[float, float]:
        """Mean over seeds of (criterion, tie-breaker); NaN when any run has none."""
        if self.reason is not None:
            return (math.nan, math.nan)
        n = len(self.runs)
        return (sum(r.closed for r in self.runs) / n, sum(r.open for r in self.runs) / n)

    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.setting.items()) or "(the only setting)"


@dataclass
class Selection:
    """The outcome for one dataset × method."""

    dataset: str
    method: str
    criterion: tuple[
        str, str
    ]  # metric names, e.g. ("val/judge_closed_acc", "val/judge_open_score")
    basis: str  # "the LLM judge" or "the configured headline scores"
    candidates: list[Candidate]  # ranked: eligible best first, then the ineligible ones
    notes: list[str] = field(default_factory=list)
    code: list[str] = field(default_factory=list)  # the runs' commits (results.json provenance)

    @property
    def winner(self) -> Candidate | None:
        first = self.candidates[0] if self.candidates else None
        return first if first is not None and first.reason is None else None

    @property
    def name(self) -> str:
        """The file name `study=...` composes for this pair (conf/config.yaml's `hparams`)."""
        return f"{self.dataset}_{self.method}"

    def yaml(self, sources: Sequence[str]) -> str:
        """The winner as a Hydra config file, with a header saying where it came from."""
        winner = self.winner
        if winner is None:
            raise ValueError(f"{self.name}: no setting can win ({self.candidates[0].reason})")
        closed, open_ = self.criterion
        n_runs = sum(len(c.runs) for c in self.candidates)
        lines = [
            "# @package _global_",
            f"# {self.method} on {self.dataset}: chosen by medvqa-select from {len(self.candidates)}"
            f" setting(s), {n_runs} run(s), on the validation split.",
            f"# Criterion: {closed}, ties by {open_} ({self.basis}); mean over seeds.",
            f"# Runs: {', '.join(sources)}; code {', '.join(self.code) or 'not recorded'}",
            "# Ranking (criterion, tie-breaker, seeds):",
        ]
        for c in self.candidates:
            if c.reason is None:
                score, tie = c.score
                seeds = ", ".join(str(r.seed) for r in c.runs)
                lines.append(f"#   {c.label()}: {score:.4f}, {tie:.4f} (seeds {seeds})")
            else:
                lines.append(f"#   {c.label()}: not eligible, {c.reason}")
        lines += [f"# Note: {note}" for note in self.notes]
        body = yaml.safe_dump(_nested(winner.setting), sort_keys=False, default_flow_style=False)
        # Each header line stays a comment: a record's text (an error, a label) with a line
        # break would otherwise write YAML that a study composes.
        return "\n".join(_one_line(line) for line in lines) + "\n" + body


def _one_line(text: str) -> str:
    """`text` on one line: every line break YAML knows (CR, LF, NEL, LS, PS) as a space."""
    return "".join(" " if c in "\r\n\x85\u2028\u2029" else c for c in text)


def _nested(flat: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dotted, value in flat.items():
        node = out
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def _derived(method: str, key: str) -> bool:
    """Whether the method file computes `key` from another key (LoRA's alpha = 2r): it follows
    the chosen setting by itself and is not written."""
    path = CONF_DIR / "peft" / f"{method}.yaml"
    if not key.startswith("peft.") or not path.is_file():
        return False
    *parents, leaf = key[len("peft.") :].split(".")
    node = OmegaConf.load(path)
    for part in parents:
        node = node.get(part) if node is not None else None
    return node is not None and leaf in node and OmegaConf.is_interpolation(node, leaf)


def _criterion(records: Sequence[tuple[str, dict]], name: str) -> tuple[tuple[str, str], str]:
    """The judge's scores if the runs have them, else the configured headline scores."""
    for source, record in records:
        splits = config_get(record.get("config") or {}, "task.eval_splits")
        if splits is not None and (not isinstance(splits, list) or SPLIT not in splits):
            raise ValueError(
                f"{name}: {source} scored {splits}, not the validation split. Selection "
                "never uses test scores: run the grid with task.eval_splits=[val] (the "
                "sweep=*_grid files do)."
            )
    keys = set().union(*(r.get("metrics") or {} for _, r in records))
    if f"{SPLIT}/{JUDGE[0]}" in keys:
        return (f"{SPLIT}/{JUDGE[0]}", f"{SPLIT}/{JUDGE[1]}"), "the LLM judge"
    # A record written without an evaluation node was scored with the schema's headlines
    # (imported here: medvqa-select's --help loads no config schemas).
    from medvqa.config import EvaluationSchema

    headlines: set[tuple[str, str]] = set()
    for _, r in records:
        config = r.get("config") or {}
        headlines.add(
            (
                str(
                    config_get(config, "evaluation.primary_closed", EvaluationSchema.primary_closed)
                ),
                str(config_get(config, "evaluation.primary_open", EvaluationSchema.primary_open)),
            )
        )
    if len(headlines) > 1:
        raise ValueError(
            f"{name}: the runs' evaluation.primary_closed/primary_open differ {sorted(headlines)}; "
            "select from runs scored alike."
        )
    closed, open_ = headlines.pop()
    return (f"{SPLIT}/{closed}", f"{SPLIT}/{open_}"), "the configured headline scores (no judge)"


def select_grid(dataset: str, method: str, records: Sequence[tuple[str, dict]]) -> Selection:
    """Rank the settings of one grid (the records of one dataset × method)."""
    name = f"{dataset}_{method}"
    whats = [run_identity(r.get("config") or {}) for _, r in records]
    varying = sorted(k for k in set().union(*whats) if len({w.get(k) for w in whats}) > 1)
    foreign = [k for k in varying if not k.startswith(SETTING_PREFIXES)]
    if foreign:
        examples = {k: sorted({str(w.get(k)) for w in whats}) for k in foreign[:3]}
        raise ValueError(
            f"{name}: the runs differ outside the method, trainer and data settings, in "
            f"{examples}: they were not evaluated alike. Select from one grid (one experiment) "
            "per dataset and method at a time."
        )
    keys = [k for k in varying if not _derived(method, k)]
    criterion, basis = _criterion(records, name)
    candidates: dict[tuple, Candidate] = {}
    seen: dict[tuple, str] = {}
    notes: list[str] = []
    for source, record in records:
        config = record.get("config") or {}
        setting = {k: config_get(config, k) for k in keys}
        ident = tuple(repr(v) for v in setting.values())
        seed_key = (*ident, repr(record.get("seed")))
        if seed_key in seen:
            raise ValueError(
                f"{name}: two runs of the same setting and seed ({seen[seed_key]} and {source}); "
                "pass one copy of each run."
            )
        seen[seed_key] = source
        metrics = record.get("metrics") or {}
        error = record.get("error")
        candidates.setdefault(ident, Candidate(setting)).runs.append(
            Run(
                source=source,
                seed=record.get("seed"),
                status=str(record.get("status", "?")),
                error=str(error).strip().splitlines()[-1] if error else None,
                closed=as_number(metrics.get(criterion[0])),
                open=as_number(metrics.get(criterion[1])),
            )
        )
        if criterion[0].endswith(JUDGE[0]) and unreliable(metrics, JUDGE[0]):
            notes.append(f"the judge failed its self-check in {source}")
    if len({tuple(sorted(str(r.seed) for r in c.runs)) for c in candidates.values()}) > 1:
        notes.append("the settings were run with different seeds")
    if not keys:
        notes.append("every run has the same setting: nothing was chosen between settings")

    def rank(c: Candidate) -> tuple:
        closed, open_ = c.score
        eligible = c.reason is None
        # best first: eligible, higher criterion, higher tie-breaker (a missing one loses)
        return (not eligible, -closed if eligible else 0.0, -open_ if open_ == open_ else math.inf)

    code = set()
    for _, record in records:
        git = (record.get("provenance") or {}).get("git") or {}
        if git.get("commit"):
            code.add(f"{git['commit'][:12]}{' (dirty)' if git.get('dirty') else ''}")
    ranked = sorted(candidates.values(), key=rank)
    if len(ranked) > 1 and ranked[0].reason is None and ranked[0].score == ranked[1].score:
        notes.append(f"tied with {ranked[1].label()} on both scores; the first in the ranking won")
    return Selection(dataset, method, criterion, basis, ranked, notes, sorted(code))


def select(dirs: Sequence[Path | str]) -> list[Selection]:
    """Every grid (dataset × method) among the records under `dirs`, ranked."""
    grids: dict[tuple[str, str], list[tuple[str, dict]]] = defaultdict(list)
    for path in find_records(dirs):
        record = read_record(path)
        choices = record.get("choices") or {}
        if record.get("task") != GRID_TASK or choices.get("baseline"):
            log.info("%s: not a grid run (task %s), skipped", path, record.get("task"))
            continue
        dataset, method = choices.get("dataset"), choices.get("peft")
        if not dataset or not method:
            raise ValueError(
                f"{path}: the record has no `choices.dataset`/`choices.peft` (Hydra's choices), "
                "which name the file a study composes; select from runs launched with run.py."
            )
        grids[(str(dataset), str(method))].append((str(path), record))
    if not grids:
        raise ValueError(f"no {GRID_TASK} run records under {', '.join(map(str, dirs))}")
    return [select_grid(d, m, records) for (d, m), records in sorted(grids.items())]


def write(selections: Sequence[Selection], out: Path, sources: Sequence[str]) -> list[Path]:
    """`<out>/<dataset>_<peft>.yaml` for every grid with a winner."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for selection in selections:
        if selection.winner is not None:
            path = out / f"{selection.name}.yaml"
            path.write_text(selection.yaml(sources))
            written.append(path)
    return written
