"""The measured rates `task=plan` builds its GPU-hours from: rows measured on a GPU and shipped
with the package (`measured_rates.jsonl`), each with the GPU, date, commit and file it comes from.

The shipped file is written by `benchmarks/measured_rates.py` from the raw rows under
`benchmarks/results/` (benchmarks/gpu.py's rows, `make gpu-check`'s whole jobs), through the
readers below (`train_row`, `generate_row`, `job_row`); a test rebuilds it from those files, so
a shipped rate is always a measured one. Where several rows share a setup, the plan uses the
newest (`newest`).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, fields
from functools import cache
from importlib import resources
from typing import Any

# The rows the package ships (written by benchmarks/measured_rates.py).
SHIPPED = "measured_rates.jsonl"
# LoRA's rank where a row predates recording it: peft=lora's default then (conf/peft/lora.yaml).
UNRECORDED_RANK = 16
# benchmarks/results/<kind>-<gpu>-<date>.jsonl: the date a file's rows were measured
_DATE = re.compile(r"(\d{4}-\d{2}-\d{2})")


@dataclass(frozen=True)
class Measured:
    """Where a rate was measured: the estimate's label (`phases.label`) names the GPU and date;
    `source` the file and line, `commit` the checkout (None: the row predates recording it)."""

    gpu: str
    date: str
    source: str
    commit: str | None = None

    @property
    def file(self) -> str:
        return self.source.rsplit(":", 1)[0]

    @property
    def cited(self) -> str:
        return f"{self.source} (commit {self.commit or 'not recorded'})"


@dataclass(frozen=True)
class TrainRow:
    """One measured training rate (`benchmarks/gpu.py`: steady state, bf16 autocast, random
    weights of the shipped architecture, batches shaped like `data`'s)."""

    preset: str  # conf/model/<preset>.yaml, as the benchmark composed it
    pretrained: str  # the architecture it built (a hub id with a shipped config)
    method: str  # conf/peft/<method>.yaml with its defaults (LoRA dropout 0.05)
    rank: int | None  # LoRA's rank (None: another method)
    data: str  # the dataset its batches were shaped like
    micro_batch: int
    checkpoint_every: int  # 0: off; n: every n-th decoder layer
    kernels: str  # "eager", "compiled" (model.compile_layers) or "liger" (model.liger_kernels)
    samples_per_s: float
    measured: Measured
    fp8: bool = False  # the frozen weights' GEMMs in FP8 (model.fp8)

    @property
    def setup(self) -> tuple[Any, ...]:
        return (self.pretrained, self.method, self.rank, self.data, self.micro_batch,
                self.checkpoint_every, self.kernels, self.fp8)  # fmt: skip

    @property
    def name(self) -> str:
        from medvqa.planning.memory import checkpointing_label

        kernels = "" if self.kernels == "eager" else f", {self.kernels}"
        kernels += ", FP8" * self.fp8
        rank = f" r{self.rank}" if self.rank is not None else ""
        return (
            f"{self.preset} {self.method}{rank}, {self.data}-shaped batches, micro-batch "
            f"{self.micro_batch}, checkpointing {checkpointing_label(self.checkpoint_every)}"
            f"{kernels}: {self.samples_per_s:.1f} samples/s"
        )


@dataclass(frozen=True)
class GenerateRow:
    """One measured generation rate: greedy, bf16 autocast, LoRA unmerged or merged into the
    weights (`model.merge_adapters`), at `batch` rows and up to `new_tokens` new tokens."""

    preset: str
    pretrained: str
    data: str
    merged: bool
    batch: int
    new_tokens: int
    rows_per_s: float
    measured: Measured

    @property
    def setup(self) -> tuple[Any, ...]:
        return self.pretrained, self.data, self.merged, self.batch, self.new_tokens

    @property
    def name(self) -> str:
        how = "merged" if self.merged else "unmerged"
        return (
            f"{self.preset} answers, {self.data}-shaped, LoRA {how}: {self.rows_per_s:.1f} rows/s"
        )


@dataclass(frozen=True)
class JobRow:
    """What a whole job (`make gpu-check`'s) spent beside its steady rates: the fit's first
    steps compiling the decoder layers and warming up (`compile_s`: the fit's seconds less its
    samples at the steady rate)."""

    preset: str
    pretrained: str
    kernels: str
    compile_s: float
    measured: Measured

    @property
    def setup(self) -> tuple[Any, ...]:
        return self.pretrained, self.kernels


Row = TrainRow | GenerateRow | JobRow
KINDS: dict[str, type[Row]] = {"train": TrainRow, "generate": GenerateRow, "job": JobRow}


# -- reading raw benchmark rows (benchmarks/measured_rates.py) ------------------------------------


def measured(raw: dict[str, Any], source: str, gpu: str) -> Measured:
    """Where a raw row was measured: its date (the row's, else its file name's) and commit
    (None where the row predates recording it); docs/measurements.md's captions read it too."""
    file = source.rsplit(":", 1)[0]
    date = raw.get("date") or _DATE.search(file)
    if date is None:
        raise ValueError(f"{source}: no date in the row or the file's name")
    commit = (raw.get("git") or {}).get("commit")
    return Measured(gpu, date if isinstance(date, str) else date.group(1), source, commit)


def _preset(raw_model: str, pretrained: str | None) -> tuple[str, str]:
    """benchmarks/gpu.py names a model `<preset>` or `<preset>@<hub id>`."""
    from omegaconf import OmegaConf

    from medvqa import CONF_DIR

    preset, _, hub = raw_model.partition("@")
    if not hub:
        hub = pretrained or str(OmegaConf.load(CONF_DIR / "model" / f"{preset}.yaml").pretrained)
    return preset, hub


def train_row(raw: dict[str, Any], source: str) -> TrainRow:
    """A training row of benchmarks/gpu.py (`samples_s`); refused where it failed."""
    if raw.get("error") or not raw.get("samples_s"):
        raise ValueError(f"{source}: not a measured training rate ({raw.get('error')})")
    fields_ = raw["setup_fields"]
    if fields_.get("lora_dropout") is not None:
        raise ValueError(f"{source}: LoRA dropout {fields_['lora_dropout']}, not the method's")
    preset, pretrained = _preset(raw["model"], raw.get("pretrained"))
    kernels = "compiled" if fields_["compile_layers"] else "eager"
    if raw.get("liger"):
        kernels = "liger"
    method = str(raw["method"])
    rank = raw.get("adapter_r", UNRECORDED_RANK) if method == "lora" else None
    return TrainRow(
        preset, pretrained, method, rank, _data(raw["data"]), int(fields_["micro_batch"]),
        int(fields_["checkpoint_every"]), kernels, float(raw["samples_s"]),
        measured(raw, source, str(raw["gpu"])), bool(fields_.get("fp8", False)),
    )  # fmt: skip


def generate_row(raw: dict[str, Any], source: str) -> GenerateRow:
    """A generation row of benchmarks/gpu.py (`gen_rows_s`)."""
    if raw.get("error") or not raw.get("gen_rows_s"):
        raise ValueError(f"{source}: not a measured generation rate ({raw.get('error')})")
    preset, pretrained = _preset(raw["model"], raw.get("pretrained"))
    merged = "merged" in str(raw["setup"])
    new_tokens = int(raw.get("new_tokens") or 16)  # the benchmark's default before recorded
    batch = int(raw.get("gen_batch") or 64)
    return GenerateRow(
        preset, pretrained, _data(raw["data"]), merged, batch, new_tokens,
        float(raw["gen_rows_s"]), measured(raw, source, str(raw["gpu"])),
    )  # fmt: skip


def job_row(raw: dict[str, Any], source: str) -> JobRow:
    """A whole job's record (`make gpu-check`'s rows: its perf/ metrics and overrides)."""
    m, overrides = raw["metrics"], raw.get("overrides") or {}
    steady, samples, seconds = (
        m.get("perf/fit/steady_samples_per_s"), m.get("perf/fit/samples"), m.get("perf/fit/seconds")
    )  # fmt: skip
    if raw.get("status") != "finished" or not steady or not samples or seconds is None:
        raise ValueError(f"{source}: the job did not finish a fit with a steady rate")
    preset, pretrained = _preset(str(overrides.get("model", "")), None)
    kernels = "compiled" if m.get("perf/fit/compiled_layers") else "eager"
    gpu = str(raw["device"]).removeprefix("cuda: ").rsplit(" x", 1)[0]
    compile_s = float(seconds) - float(samples) / float(steady)
    return JobRow(preset, pretrained, kernels, compile_s, measured(raw, source, gpu))


def _data(name: str) -> str:
    """benchmarks/gpu.py's short data names as the datasets name themselves."""
    return {"mimic": "mimic_cxr_vqa"}.get(name, name)


# -- the shipped table -----------------------------------------------------------------------------


def dumps(row: Row) -> str:
    """One line of the shipped file."""
    kind = next(k for k, cls in KINDS.items() if isinstance(row, cls))
    return json.dumps({"kind": kind, **asdict(row)}, sort_keys=True)


def loads(line: str) -> Row:
    record = json.loads(line)
    cls = KINDS[record.pop("kind")]
    record["measured"] = Measured(**record["measured"])
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in record.items() if k in names})


@cache
def shipped() -> tuple[Row, ...]:
    """Every row the package ships, in the file's order."""
    text = resources.files(__package__).joinpath(SHIPPED).read_text()
    return tuple(loads(line) for line in text.splitlines() if line.strip())


def newest(rows: tuple[Row, ...]) -> tuple[Row, ...]:
    """Of rows measuring the same setup, the newest (by date, then the later in the file)."""
    latest: dict[tuple[Any, ...], Row] = {}
    for row in sorted(enumerate(rows), key=lambda r: (r[1].measured.date, r[0])):
        latest[(type(row[1]), row[1].setup)] = row[1]
    return tuple(r for r in rows if latest[(type(r), r.setup)] is r)


def rows(kind: type[Row]) -> tuple[Any, ...]:
    """The newest shipped rows of one kind."""
    return tuple(r for r in newest(shipped()) if isinstance(r, kind))


def fp8_faster(gpu: str) -> bool:
    """Whether a shipped row measured FP8 training faster than the same setup without it on
    `gpu` (torch.cuda.get_device_name): what `model.fp8=auto` asks."""
    train = [r for r in rows(TrainRow) if r.measured.gpu == gpu]
    plain = {r.setup[:-1]: r.samples_per_s for r in train if not r.fp8}
    return any(r.samples_per_s > plain.get(r.setup[:-1], math.inf) for r in train if r.fp8)
