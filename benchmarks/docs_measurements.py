"""Write docs/measurements.md from the raw rows under benchmarks/results/: one table per benchmark
kind and file, each captioned with the file and lines it comes from, the machine, versions, date,
commit and the settings its rows carry. No figure in that file is typed by hand.

    python benchmarks/docs_measurements.py           # rewrite docs/measurements.md
    python benchmarks/docs_measurements.py --check   # exit 1 where it differs (a test runs this)

After a GPU session: commit the new rows under benchmarks/results/, run this, commit both. A row
of a kind this script does not know is refused, naming its file and line.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medvqa.planning import rates

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = ROOT / "benchmarks" / "results"
OUT = ROOT / "docs" / "measurements.md"
if str(HERE) not in sys.path:  # the job tables' cells come from the script beside this one
    sys.path.insert(0, str(HERE))

import gpu_check_table  # noqa: E402

DASH = "–"  # a figure the row does not have


@dataclass(frozen=True)
class Line:
    """One raw row and where it is: the file under benchmarks/results/ and its 1-based line."""

    file: str
    number: int
    raw: dict[str, Any]

    @property
    def source(self) -> str:
        return f"benchmarks/results/{self.file}:{self.number}"


def kind(line: Line) -> str:
    """Which benchmark wrote the row, from the fields it carries."""
    raw = line.raw
    if "run" in raw and "metrics" in raw:
        return "job"  # make gpu-check's record of a whole job
    if "benchmark" in raw and "results" in raw:
        return "results"  # a script's labelled results (benchmarks/shared_prefix.py)
    if "setup_fields" in raw:
        return "train"  # benchmarks/gpu.py
    if "gen_rows_s" in raw or "gen_batch" in raw:
        return "generate"  # benchmarks/gpu.py
    raise ValueError(
        f"{line.source}: not a row of a benchmark benchmarks/docs_measurements.py knows "
        f"(fields {sorted(raw)}); add its kind to KINDS there"
    )


def read(results: Path) -> list[Line]:
    lines = []
    for path in sorted(results.glob("*.jsonl")):
        for n, text in enumerate(path.read_text().splitlines(), 1):
            if not text.strip():
                continue
            try:
                raw = json.loads(text)
            except json.JSONDecodeError as err:
                raise ValueError(f"benchmarks/results/{path.name}:{n}: not JSON ({err})") from err
            lines.append(Line(path.name, n, raw))
    return lines


# -- formatting ------------------------------------------------------------------------------------


def number(value: Any, digits: int = 1, scale: float = 1.0, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return DASH
    return f"{float(value) * scale:,.{digits}f}{suffix}"


def ranges(numbers: Iterable[int]) -> str:
    """1, 2, 3, 5 -> "1–3, 5"."""
    out: list[str] = []
    for n in sorted(numbers):
        if out and out[-1][1] == n - 1:
            out[-1] = (out[-1][0], n)
        else:
            out.append((n, n))
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in out)


def distinct(values: Iterable[str]) -> str:
    return "; ".join(dict.fromkeys(values))


def markdown(columns: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    return [
        gpu_check_table.markdown_row(tuple(columns)),
        "|" + "---|" * len(columns),
        *(gpu_check_table.markdown_row(tuple(r)) for r in rows),
    ]


def failed(raw: dict[str, Any]) -> str:
    """The exception's class, not its traceback (paths of the machine that ran it)."""
    return f"failed: {str(raw['error']).split('(', 1)[0]}"


def model_name(raw: dict[str, Any]) -> str:
    preset, _, hub = str(raw["model"]).partition("@")
    return f"{preset} ({hub})" if hub else preset


def every(n: int) -> str:
    return {0: "off", 1: "every layer"}.get(n, f"every {n} layers")


def plan_use(line: Line) -> str:
    """Whether task=plan's shipped rates take this row (medvqa/planning/measured_rates.jsonl)."""
    shipped = {r.measured.source for r in rates.shipped()}
    used = {r.measured.source for r in rates.newest(rates.shipped())}
    return "used" if line.source in used else "superseded" if line.source in shipped else ""


# -- captions --------------------------------------------------------------------------------------


def commit(line: Line) -> str:
    git = line.raw.get("git") or {}
    if git.get("commit"):
        return str(git["commit"])[:12] + (" (uncommitted changes)" if git.get("dirty") else "")
    return str(line.raw.get("commit") or "not recorded")


def versions(line: Line) -> str:
    found = line.raw.get("versions") or {}
    return ", ".join(f"{k} {v}" for k, v in found.items() if v) or "not recorded"


def machine(line: Line) -> str:
    raw = line.raw
    name = raw.get("gpu") or raw.get("device") or raw.get("machine") or "not recorded"
    if "machine" in raw and "gpu" not in raw and "device" not in raw:
        return str(name)  # a CPU: no driver to name
    driver = raw.get("driver")
    return f"{name}, driver {driver}" if driver else f"{name}, driver not recorded"


def date(line: Line) -> str:
    return rates.measured(line.raw, line.source, "").date


def caption(title: str, lines: Sequence[Line], settings: Sequence[str]) -> list[str]:
    first = lines[0]
    return [
        f"{title}: `benchmarks/results/{first.file}` lines {ranges(x.number for x in lines)}.",
        f"Machine: {distinct(machine(x) for x in lines)}.",
        f"Versions: {distinct(versions(x) for x in lines)}.",
        f"Date: {distinct(date(x) for x in lines)}. Commit: {distinct(commit(x) for x in lines)}.",
        *(f"{s}." for s in settings),
    ]


def recorded(lines: Sequence[Line], key: str, what: str) -> str:
    values = [x.raw.get(key) for x in lines if not x.raw.get("error")]
    if all(v is None for v in values):
        return f"{what}: not recorded"
    return f"{what}: " + distinct(DASH if v is None else str(v) for v in values)


def argv(lines: Sequence[Line]) -> list[str]:
    found = [" ".join(x.raw["argv"]) for x in lines if x.raw.get("argv") is not None]
    return [f"Arguments: `{a or '(defaults)'}`" for a in dict.fromkeys(found)]


# -- one table per kind ----------------------------------------------------------------------------


def train_table(lines: Sequence[Line]) -> list[str]:
    fields = [x.raw["setup_fields"] for x in lines]
    shown = {"micro_batch", "checkpoint_every", "compile_layers", "fp8"}
    usual = {
        key: Counter(json.dumps(f.get(key)) for f in fields).most_common(1)[0][0]
        for key in {k for f in fields for k in f} - shown
    }

    def other(f: dict[str, Any]) -> str:
        return ", ".join(
            f"{k}={json.dumps(f.get(k))}" for k in sorted(usual) if json.dumps(f.get(k)) != usual[k]
        )

    def kernels(raw: dict[str, Any]) -> str:
        f = raw["setup_fields"]
        used = {"compiled": f.get("compile_layers"), "Liger": raw.get("liger"), "FP8": f.get("fp8")}
        return ", ".join(name for name, on in used.items() if on) or "eager"

    rows = []
    for x in lines:
        r, f = x.raw, x.raw["setup_fields"]
        rank = f" r{r['adapter_r']}" if r.get("adapter_r") else ""
        shape = f"{r['micro_batch']} × {r['accumulate']}" if "accumulate" in r else DASH
        figures = (
            [failed(r), *[""] * 7]
            if r.get("error")
            else [
                number(r.get("samples_s")),
                number(r.get("tokens_s"), 0),
                number(r.get("tflop_sample")),
                number(r.get("mfu"), 1, 100, " %"),
                number(r.get("hfu"), 1, 100, " %"),
                number(r.get("peak_gib")),
                number(r.get("layer_kib_token"), 0),
                plan_use(x),
            ]
        )
        rows.append(
            [
                str(x.number),
                model_name(r),
                f"{r['data']} ({number(r.get('tokens_per_sample'), 0)})",
                f"{r['method']}{rank}",
                f"`{r['setup']}`",
                shape,
                every(int(f["checkpoint_every"])),
                kernels(r),
                other(f),
                *figures,
            ]
        )
    columns = ("line", "model", "data (tokens/sample)", "method", "setup",
               "micro-batch × accumulation", "checkpointing", "kernels", "other", "samples/s",
               "tokens/s", "TFLOP/sample", "MFU", "HFU", "peak GiB", "KiB/token/layer",
               "task=plan")  # fmt: skip
    lora = [x for x in lines if x.raw["method"] == "lora"]
    per_step = {
        int(x.raw["micro_batch"]) * int(x.raw["accumulate"]) for x in lines if "accumulate" in x.raw
    }
    settings = [
        f"Samples per optimiser step: {', '.join(map(str, sorted(per_step))) or 'not recorded'}",
        recorded(lines, "timed_samples", "Timed samples per row"),
        recorded(lora, "adapter_r", "LoRA rank") if lora else "",
        *argv(lines),
    ]
    table = markdown(columns, rows)
    checks: dict[tuple[float, float], list[int]] = {}
    for x in lines:
        if x.raw.get("liger_loss") is not None:
            checks.setdefault((x.raw["liger_loss"], x.raw["liger_loss_eager"]), []).append(x.number)
    notes = [
        f"Liger's loss on one batch (no dropout, bf16 autocast; lines {ranges(numbers)}): "
        f"{liger:.4f} against the eager model's {eager:.4f}."
        for (liger, eager), numbers in checks.items()
    ]
    return [
        *caption("Training rows", lines, [s for s in settings if s]),
        "",
        *table,
        *(["", *notes] if notes else []),
    ]


def gen_how(raw: dict[str, Any]) -> str:
    """What a generation row ran: its recorded case (`benchmarks/gpu.py`'s GenCase), else what
    the benchmark's names meant before rows recorded it."""
    case = raw.get("gen_case")
    if case:
        parts = [
            "LoRA merged" if case.get("merge") else "LoRA unmerged",
            f"{case.get('decode')} decode",
            "shared image prefixes" if case.get("share") else "every prompt in full",
            f"{case.get('per_image')} questions per image",
        ]
    else:
        name = str(raw["setup"])
        parts = ["LoRA merged" if "merged" in name else "LoRA unmerged"]
        parts += ["shared image prefixes"] if "shared" in name else []
    return ", ".join(parts + (["Liger"] if raw.get("liger") else []))


def generate_table(lines: Sequence[Line]) -> list[str]:
    timed = any("gen_step_ms" in x.raw for x in lines)
    rows = []
    for x in lines:
        r = x.raw
        figures = (
            [failed(r), "", *([""] * 2 * timed)]
            if r.get("error")
            else [
                number(r.get("gen_rows_s")),
                number(r.get("gen_peak_gib")),
                *([number(r.get("gen_step_ms")), number(r.get("gen_floor_ms"))] * timed),
            ]
        )
        rows.append(
            [
                str(x.number),
                model_name(r),
                str(r["data"]),
                f"`{r['setup']}`",
                gen_how(r),
                str(r.get("gen_batch") or DASH),
                str(r.get("gen_new_tokens") or DASH),
                *figures,
                plan_use(x),
            ]
        )
    columns = ["line", "model", "data", "setup", "how", "batch", "new tokens", "rows/s", "peak GiB"]
    columns += ["decode step ms", "step floor ms"] * timed + ["task=plan"]
    settings = [
        "Greedy, bf16 autocast; `batch` and `new tokens` are " + DASH + " where the row did not "
        "record them",
        *argv(lines),
    ]
    return [*caption("Generation rows", lines, settings), "", *markdown(columns, rows)]


def job_table(lines: Sequence[Line]) -> list[str]:
    def overrides(raw: dict[str, Any]) -> str:
        keys = ("experiment", "study", "model", "peft", "trainer", "hparams")
        found = raw.get("overrides") or {}
        return " ".join(f"{k}={found[k]}" for k in keys if found.get(k) not in (None, "None"))

    described = [
        f"- line {x.number}, `{x.raw['run']}`: {x.raw.get('what', '')}; {x.raw.get('status')}; "
        f"`{overrides(x.raw)}`; `train/global_step` "
        f"{number(x.raw['metrics'].get('train/global_step'), 0)}"
        for x in lines
    ]
    rows = []
    for x in lines:
        for i, cells in enumerate(gpu_check_table.phase_cells(x.raw["metrics"])):
            rows.append([str(x.number) if i == 0 else "", x.raw["run"] if i == 0 else "", *cells])
    warmups = []
    for x in lines:
        try:
            job = rates.job_row(x.raw, x.source)
        except ValueError:
            continue  # no steady window
        warmups.append(f"line {x.number} (`{x.raw['run']}`) {job.compile_s:.0f} s")
    notes = (
        [
            "The fit's seconds beyond its samples at the steady rate (compiling and warming up, "
            "`medvqa.planning.rates.job_row`, what `task=plan` charges a job for compiling): "
            + "; ".join(warmups)
            + "."
        ]
        if warmups
        else []
    )
    columns = ("line", "run", *gpu_check_table.HEADER)
    return [
        *caption("Whole jobs", lines, []),
        "",
        *described,
        "",
        *markdown(columns, rows),
        *(["", *notes] if notes else []),
    ]


# Column labels of benchmarks/shared_prefix.py's results (`<questions>_per_image/<measure>`); the
# commit before it named two of them otherwise.
RESULT_LABELS = {
    "static": "static decode, shared",
    "dynamic": "growing cache, shared",
    "shared_rows_s": "shared (that commit's engine)",
    "unshared": "every prompt in full",
    "unshared_rows_s": "every prompt in full",
    "static_vs_dynamic": "static / growing",
    "shared_vs_unshared": "shared / in full",
    "ratio": "shared / in full",
    "same_answers": "same answers",
}


def results_table(lines: Sequence[Line]) -> list[str]:
    labels: dict[str, None] = dict.fromkeys(RESULT_LABELS.values())
    table: list[tuple[Line, str, dict[str, str]]] = []
    for x in lines:
        groups: dict[str, dict[str, str]] = {}
        for key, value in x.raw["results"].items():
            group, _, measure = key.rpartition("/")
            label = RESULT_LABELS.get(measure, measure)
            labels[label] = None
            if measure == "same_answers":
                cell = "yes" if value == 1 else "no"
            elif label.count("/"):
                cell = number(value, 2, suffix="×")
            else:
                cell = number(value, 2)
            groups.setdefault(group, {})[label] = cell
        table += [(x, group, cells) for group, cells in groups.items()]
    labels = {k: None for k in labels if any(k in c for _, _, c in table)}
    columns = ["line", "commit", "rows", *labels]
    rows = [
        [str(x.number), commit(x), group.replace("_", " "), *(c.get(k, DASH) for k in labels)]
        for x, group, c in table
    ]
    settings = [f"Settings: {distinct(str(x.raw.get('settings')) for x in lines)}"]
    unit = "Rates in rows/s; ratios between two engines' rates"
    return [*caption("Rows", lines, [*settings, unit]), "", *markdown(columns, rows)]


@dataclass(frozen=True)
class Kind:
    title: str  # the section's heading
    label: str  # each table's heading after its file's name (its anchor)
    intro: str  # what the benchmark measures, without a figure
    table: Callable[[Sequence[Line]], list[str]]


KINDS = {
    "train": Kind(
        "Training: `benchmarks/gpu.py`",
        "training",
        "The steady training rate of a real architecture with random bf16 weights through the "
        "project's training module, on synthetic batches shaped like the data "
        "([how it measures](gpus.md#speed-measured-on-an-h100)). MFU counts the FLOPs a step "
        "needs; HFU adds what the setup recomputes. `other`: the row's setup fields "
        "(`benchmarks/gpu.py`'s `Setup`) that differ from most rows of its table. `task=plan`: "
        "`used` where the plan's shipped rates take the row, `superseded` where a newer row of "
        "the same setup replaced it (`benchmarks/measured_rates.py` lists why the others are "
        "left out).",
        train_table,
    ),
    "generate": Kind(
        "Generation: `benchmarks/gpu.py`",
        "generation",
        "Generation of synthetic rows through the job's decoder, timed after a warm-up batch; "
        "random weights rarely end a row early, so every batch decodes its new tokens.",
        generate_table,
    ),
    "job": Kind(
        "Whole jobs: `make gpu-check`",
        "whole jobs",
        "Each job's record of itself (`perf/...` and the memory plan's `plan/...` in its "
        "`results.json`), per phase as `benchmarks/gpu_check_table.py` prints it "
        "([what the check runs](gpus.md#a-whole-job-on-one-gpu-make-gpu-check)). Peaks are this "
        "rank's allocated and reserved GPU memory within the phase; `plan GiB` the memory "
        "plan's estimate for it.",
        job_table,
    ),
    "results": Kind("", "results", "", results_table),
}

# What a reader must know to compare a table's rows, said once per (file, kind); no figures:
# those are the rows'.
NOTES = {
    ("gpu-h100-2026-11-26.jsonl", "train"): "Lines 1–17 and 18–35 are two sessions of that "
    "day; the second ran the code that finds label positions on the host and builds no KV "
    "cache in training. Line 18 compiled its layers inside the timed window (too few warm-up "
    "steps); line 21, the first row of its process, is not explained.",
    ("gpu-h100-2026-11-26.jsonl", "generate"): "These rows predate the log-probability "
    "recorder (`ChosenLogProbs`) generation runs now.",
    ("gpu-check-h200-2026-11-27.jsonl", "job"): "These jobs read a random checkpoint directory "
    "written beforehand, where `make gpu-check` now draws the weights on the GPU "
    "(`model.random_weights`), and trained in the layout of their day (checkpointing chosen by "
    "`auto`, the whole step in one micro-batch, eager layers) but for line 5, which says its "
    "own; their ZeRO-2 model was wider than the check's shrunk one.",
    ("gpu-check-h100-2026-11-28.jsonl", "job"): "Lines 4–6 trained the same job briefly, with "
    "eager or compiled layers, so that merged and unmerged generation answer from the same "
    "trained weights.",
}


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading (lower case, punctuation dropped, spaces to '-')."""
    kept = "".join(c for c in heading.lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def benchmark_intro(script: str) -> str:
    """The first sentence of a benchmark script's docstring."""
    path = ROOT / script
    doc = ast.get_docstring(ast.parse(path.read_text())) if path.exists() else None
    return (doc or script).split("\n\n")[0].replace("\n", " ")


def render(results: Path = RESULTS) -> str:
    lines = read(results)
    by_kind: dict[str, list[Line]] = {k: [] for k in KINDS}
    for x in lines:
        by_kind[kind(x)].append(x)
    sections: list[tuple[str, str, list[tuple[str, list[Line]]]]] = []
    for name, k in KINDS.items():
        if name == "results":
            scripts = dict.fromkeys(str(x.raw["benchmark"]) for x in by_kind[name])
            for script in scripts:
                rows = [x for x in by_kind[name] if x.raw["benchmark"] == script]
                sections.append((f"`{script}`", benchmark_intro(script), _by_file(rows)))
        elif by_kind[name]:
            sections.append((k.title, k.intro, _by_file(by_kind[name])))
    out = [
        "# Measurements",
        "",
        "Generated by `python benchmarks/docs_measurements.py` from the raw rows under "
        "`benchmarks/results/`: do not edit it by hand (`--check`, which the tests run, fails "
        "where this file and the rows disagree). Each table names the file and lines its "
        "figures come from, and the machine, versions, date, commit and settings the rows "
        'record ("not recorded" where they do not). What the figures mean, and how to measure '
        "again: [gpus.md](gpus.md) and [offline.md](offline.md#measured-on-a-2-core-cpu).",
        "",
    ]
    body: list[str] = []
    for title, intro, files in sections:
        body += [f"## {title}", "", intro, ""]
        for file, rows in files:
            name = kind(rows[0])
            heading = f"{Path(file).stem}: {KINDS[name].label}"
            out.append(f"- [{heading}](#{anchor(heading)})")
            body += [f"### {heading}", "", *KINDS[name].table(rows), ""]
            if (file, name) in NOTES:
                body += [NOTES[file, name], ""]
    return "\n".join([*out, "", *body]).rstrip("\n") + "\n"


def _by_file(rows: list[Line]) -> list[tuple[str, list[Line]]]:
    files = sorted(dict.fromkeys(x.file for x in rows), key=lambda f: (date(_first(rows, f)), f))
    return [(f, [x for x in rows if x.file == f]) for f in files]


def _first(rows: list[Line], file: str) -> Line:
    return next(x for x in rows if x.file == file)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the raw rows' folder")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    text = render(args.results)
    if args.check:
        same = args.out.exists() and args.out.read_text() == text
        if not same:
            sys.stderr.write(
                f"{args.out} differs from what {args.results} gives: "
                "rerun python benchmarks/docs_measurements.py (never edit the figures by hand)\n"
            )
        return 0 if same else 1
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
