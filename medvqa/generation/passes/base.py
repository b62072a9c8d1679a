"""What a pass kind is: a plug-in (`EvalPass`, found like views and datasets, through
`MEDVQA_PLUGINS` too) whose instances are a job's evaluation passes.

A kind owns, in one class: its setting (the config key that asks for its passes, `of_job`),
its checks (`problems` at start, `check` before the model loads), how it changes a row (the
image mode it generates under, `rows`, and `transform_image` with the row at hand, for a
change that needs the row's own data such as a region to hide; `image_change` binds it to
the dataset where it reads the dataset's files), what it is called (`key`, the
metric prefix and file name; `label` in the summary; `report_rows`), which passes it is
generated with (`group`), whether it is the untuned base's (`base`) and what it costs the plan
(`planned`). A job's passes are one list (`job_passes`), recorded in results.json
(`provenance.passes`, `record`) and read back from there (`recorded_passes`): generation,
scoring, the views, the plan and the report walk that list, never file names.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pandas as pd
from PIL import Image

from medvqa import plugins
from medvqa.data.base import VQASource
from medvqa.training.spec import PARTNER_MODES, DataSchema
from medvqa.untrusted import config_get

log = logging.getLogger(__name__)

PREDICTIONS = "predictions"
# The chance row's metric prefix: scored beside the passes (`tasks.train_eval`), never generated.
CHANCE = "chance/"
# Where results.json lists the job's passes (`EvalPass.record` each), under its provenance.
RECORD_KEY = "passes"
# A pass's key names its files and metrics (`predictions_<key>.jsonl`, `<key>/...`).
_KEY = re.compile(r"[A-Za-z0-9_]+")

P = TypeVar("P", bound="EvalPass")


def prediction_path(out_dir: Path, prefix: str) -> Path:
    """The predictions file of a pass (`predictions.jsonl`, `predictions_<key>.jsonl`, ...);
    its scored table is `scoring.scores_path` of it."""
    stem = f"{PREDICTIONS}_{prefix.rstrip('/')}" if prefix else PREDICTIONS
    return Path(out_dir) / f"{stem}.jsonl"


def main_label(config: Any) -> str:
    """The main answers' label in the summary: the run's `label`, else its method's."""
    return str(
        config_get(config, "label")
        or config_get(config, "peft.label")
        or config_get(config, "peft.name")
    )


@dataclass(frozen=True)
class Job:
    """What the kinds read to make a job's passes: its config, the main answers' label, whether
    the weights it evaluates are tuned (fitted here, or another run's), and the untuned base's
    label (None: no zero-shot reference row)."""

    config: Any
    label: str
    tuned: bool
    base_label: str | None = None

    def setting(self, dotted: str) -> Any:
        return config_get(self.config, dotted)

    @property
    def eval_image(self) -> str:
        """The image mode the main answers are given under (`data.eval_image`)."""
        return str(self.setting("data.eval_image") or DataSchema.eval_image)


@dataclass(frozen=True)
class ReportRow:
    """A row of the report a pass's scores make: its `kind` (`extra image`, `delta`, ...), the
    method id `<run>@<key>`, its metrics' prefix, and its name `<run>, <suffix>` (or `whole`)."""

    kind: str
    key: str
    prefix: str
    suffix: str
    whole: str | None = None

    def name(self, run: str) -> str:
        return self.whole or f"{run}, {self.suffix}"


@dataclass(frozen=True, kw_only=True)
class EvalPass(plugins.Plugin):
    """One generation pass over the job's evaluated splits: an instance of a pass kind (a
    subclass that sets `name`, in a module of this package or one named in `MEDVQA_PLUGINS`).
    Its fields are its settings (recorded; `label` is its row in summary.md); a kind with
    fields of its own is a `@dataclass(frozen=True, kw_only=True)` too."""

    plugin_kind = "pass"
    name: ClassVar[str]
    # The config key that asks for the kind's passes (None: every job has them).
    setting: ClassVar[str | None] = None
    # Where its passes come in the job's list: the untuned base's first (before the method
    # applies), then the main answers, then the others.
    sequence: ClassVar[int] = 100
    # The untuned base's answers: generated before the method applies, a reference row.
    base: ClassVar[bool] = False
    # Its scores also as `delta_<key>/`: main - it, with paired intervals (the image modes).
    paired_delta: ClassVar[bool] = False
    # The report's `kind` of its row.
    row_kind: ClassVar[str] = "extra pass"
    # Rows it generates per evaluated row (the plan's cost); at most, where it skips some.
    cost_factor: ClassVar[float] = 1
    # Whether `transform_image` changes the image (then the pass is generated alone).
    transforms_image: ClassVar[bool] = False

    label: str
    image_mode: str = DataSchema.eval_image  # data.eval_image, or another mode it shows

    def __post_init__(self) -> None:
        if self.key and not _KEY.fullmatch(self.key):
            raise ValueError(
                f"pass {type(self).__name__}: key {self.key!r} names its files and metrics; "
                "use letters, digits and underscores only"
            )

    # -- the job's passes of this kind -----------------------------------------------------------

    @classmethod
    def of_job(cls, job: Job) -> list[EvalPass]:
        """The passes of this kind that `job` asks for (by its `setting`), in order."""
        raise NotImplementedError(f"pass kind {cls.name!r} says not which passes a job has")

    @classmethod
    def after(cls: type[P], main: str, **settings: Any) -> P:
        """The pass with `settings`, labelled after the main answers' label `main`."""
        made = cls(label="", **settings)
        return dataclasses.replace(made, label=made.named(main))

    @classmethod
    def problems(cls, config: Any) -> list[str]:
        """What in a composed config this kind refuses at start, before any data or model work
        (each a message naming the key and the fix)."""
        return []

    @classmethod
    def check(
        cls, passes: Sequence[EvalPass], frames: Mapping[str, pd.DataFrame], job: Job
    ) -> None:
        """Refuse, before the model loads, what the job's passes of this kind cannot do on the
        evaluated splits `frames`: by default, an image mode that shows another row's image
        needs such a row for every row (`datamodule.check_partners`)."""
        from medvqa.training.datamodule import check_partners  # torch: only for a job

        field = str(job.setting("data.mismatch_field") or DataSchema.mismatch_field)
        check_partners(frames, [p.image_mode for p in passes], field)

    # -- how it changes a row ---------------------------------------------------------------------

    def rows(self, frame: pd.DataFrame) -> pd.DataFrame:
        """The rows of one split as this pass asks them (other candidates' order, another
        question text); the same rows by default."""
        return frame

    def transform_image(self, image: Image.Image | None, row: pd.Series) -> Image.Image | None:
        """The image `row` is shown (under `image_mode`), as this pass shows it; `row` holds the
        row's own data (a region, a mask's file). Only called where `transforms_image`."""
        return image

    def image_key(self, key: str, row: pd.Series) -> str:
        """Which pixels `row` is shown (`key`: under `image_mode`), after `transform_image`:
        rows with one key share one image read and prefix."""
        return key

    def image_change(self, source: VQASource) -> Any:
        """What generation calls to change each row's image (`transform_image` and `image_key`,
        `generation.data.ImageChange`) when the rows come from `source`; None: the image
        mode's image. By default the pass itself where `transforms_image`; a kind whose change
        reads the dataset's own files (a region's mask) gives itself bound to `source`."""
        return self if self.transforms_image else None

    # -- what it is called ------------------------------------------------------------------------

    @property
    def key(self) -> str:
        """Its name in files and metrics (`predictions_<key>.jsonl`, `<key>/...`)."""
        raise NotImplementedError(f"pass kind {type(self).__name__} has no key")

    @property
    def prefix(self) -> str:
        """Its metrics' prefix ("" for the main answers)."""
        return f"{self.key}/" if self.key else ""

    @property
    def suffix(self) -> str:
        """What its name adds to the main answers' (`LoRA, blank image`)."""
        return self.key

    def named(self, main: str) -> str:
        """Its name after the main answers' name `main`."""
        return f"{main}, {self.suffix}"

    def path(self, out_dir: Path) -> Path:
        """Its predictions file (`prediction_path`)."""
        return prediction_path(out_dir, self.prefix)

    def report_rows(self) -> list[ReportRow]:
        """The report's rows its scores make, beside the run's own."""
        return [ReportRow(self.row_kind, self.key, self.prefix, self.suffix)]

    # -- how it is generated and what it costs ----------------------------------------------------

    @property
    def shared(self) -> bool:
        """Whether its answers are cached under paths.cache_dir for a sweep's jobs."""
        return False

    def group(self) -> Hashable | None:
        """Passes with one group are generated together: they show the same images, whose
        prompt prefix they share. None: alone (answers shared with other jobs are keyed by
        their own batches; partner images are drawn per pass; a per-row image change)."""
        if self.shared or self.image_mode in PARTNER_MODES or self.transforms_image:
            return None
        return (self.base, self.image_mode)

    def planned(self, rows: int) -> tuple[str, float]:
        """The plan's generation phase of this pass over `rows` evaluated rows: its name and the
        rows it generates (`cost_factor` each)."""
        return self.label, rows * self.cost_factor

    # -- the record -------------------------------------------------------------------------------

    def settings(self) -> dict[str, Any]:
        """Its fields but the label, as plain values."""
        return {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "label"
        }

    def record(self) -> dict[str, Any]:
        """How results.json lists it (`from_record` reads it back)."""
        return {
            "kind": self.name,
            "prefix": self.prefix,
            "label": self.label,
            "settings": self.settings(),
        }


@dataclass(frozen=True, kw_only=True)
class Unregistered(EvalPass):
    """A recorded pass of a kind this installation does not have (a plug-in of the machine that
    ran it): its recorded kind, prefix and label, which the report lists its row under."""

    kind: str
    recorded_prefix: str

    @property
    def key(self) -> str:
        return self.recorded_prefix.rstrip("/")

    def report_rows(self) -> list[ReportRow]:
        return [ReportRow(self.row_kind, self.key, self.prefix, self.key, whole=self.label)]

    def record(self) -> dict[str, Any]:
        return {"kind": self.kind, "prefix": self.prefix, "label": self.label, "settings": {}}


def kinds() -> dict[str, type[EvalPass]]:
    """Every registered pass kind (built-in, `MEDVQA_PLUGINS`, entry points) by name."""
    return plugins.registered("pass")


def job_passes(job: Job) -> list[EvalPass]:
    """The job's passes, in the order they run: each kind's (`of_job`), kinds in their
    `sequence`. Two passes with one prefix would write one file: refused, naming both."""
    ordered = sorted(kinds().values(), key=lambda cls: (cls.sequence, cls.name))
    passes = [p for cls in ordered for p in cls.of_job(job)]
    seen: dict[str, EvalPass] = {}
    for p in passes:
        if p.prefix in seen:
            raise ValueError(
                f"passes {seen[p.prefix]!r} and {p!r} share the prefix {p.prefix!r} (one "
                "predictions file); give one of the kinds another key"
            )
        seen[p.prefix] = p
    return passes


def pass_problems(config: Any) -> list[str]:
    """What the pass kinds refuse in a composed config at start (`EvalPass.problems`), and
    `passes.<name>` keys that name no pass kind."""
    known = kinds()
    node = config_get(config, "passes") or {}
    problems = [
        f"passes.{name}: no pass kind is called {name!r}; the kinds are {sorted(known)} "
        "(medvqa-list passes), a plug-in's module goes in $MEDVQA_PLUGINS"
        for name in node
        if name not in known
    ]
    for cls in known.values():
        problems += cls.problems(config)
    return problems


def check_passes(passes: Sequence[EvalPass], frames: Mapping[str, pd.DataFrame], job: Job) -> None:
    """Each kind's `check` over the job's passes of that kind, before the model loads."""
    by_kind: dict[type[EvalPass], list[EvalPass]] = {}
    for p in passes:
        by_kind.setdefault(type(p), []).append(p)
    for cls, mine in by_kind.items():
        cls.check(mine, frames, job)


def generation_groups(passes: Sequence[EvalPass]) -> list[list[EvalPass]]:
    """`passes` (of one model) in the groups generated together (`EvalPass.group`), in order
    of first appearance: the passes under one image mode (the main answers and their option
    orders) share each image's prompt prefix across passes."""
    groups: dict[Any, list[EvalPass]] = {}
    for i, p in enumerate(passes):
        key = p.group()
        groups.setdefault(("alone", i) if key is None else key, []).append(p)
    return list(groups.values())


def report_rows(passes: Sequence[EvalPass], chance_label: str | None) -> list[tuple[str, str]]:
    """(label, metric prefix) of the summary's rows: the main answers, the references (the
    untuned base's, chance's where it has a label), then the other passes."""
    main = [p for p in passes if not p.prefix]
    references = [p for p in passes if p.base]
    rows = [(p.label, p.prefix) for p in (*main, *references)]
    if chance_label is not None:
        rows.append((chance_label, CHANCE))
    return rows + [(p.label, p.prefix) for p in passes if p.prefix and not p.base]


# -- a record's passes, read back -----------------------------------------------------------------


def from_record(entry: Any) -> EvalPass:
    """A pass as results.json lists it (`EvalPass.record`), rebuilt by its registered kind from
    its recorded settings (plain values; its prefix must come out as recorded), or kept as
    recorded (`Unregistered`) where this installation lacks the kind. ValueError for an entry
    that is no pass."""
    if not isinstance(entry, Mapping):
        raise ValueError(f"{entry!r} is no pass (an object of kind, prefix, label and settings)")
    kind, prefix, label, values = (entry.get(k) for k in ("kind", "prefix", "label", "settings"))
    if not (all(isinstance(v, str) for v in (kind, prefix, label)) and isinstance(values, Mapping)):
        raise ValueError(f"{entry!r}: a pass needs a kind, prefix and label (strings) and settings")
    if not all(isinstance(v, str | int | float | bool | None) for v in values.values()):
        raise ValueError(f"{entry!r}: a pass's settings are plain values")
    cls = kinds().get(kind)
    if cls is None:
        return Unregistered(label=label, kind=kind, recorded_prefix=prefix)
    try:
        made = cls(label=label, **values)
    except TypeError as err:
        raise ValueError(f"{entry!r}: not the settings of pass kind {kind!r} ({err})") from err
    if made.prefix != prefix:
        raise ValueError(f"{entry!r}: pass kind {kind!r} makes prefix {made.prefix!r} of these")
    return made


def recorded_passes(record: Mapping[str, Any], base_label: str) -> list[EvalPass]:
    """The passes a run record lists (`provenance.passes`), each `from_record` (an entry that
    is no pass is skipped, with a warning); for a record that lists none, `_passes_from_config`
    (`base_label`: the untuned base's name there). Callers keep the passes whose results the
    record holds."""
    provenance = record.get("provenance")
    entries = provenance.get(RECORD_KEY) if isinstance(provenance, Mapping) else None
    if entries is None:
        return _passes_from_config(record.get("config") or {}, base_label)
    if not isinstance(entries, list):
        log.warning("the record's provenance.passes is no list: no pass of it is shown")
        return []
    passes = []
    for entry in entries:
        try:
            passes.append(from_record(entry))
        except ValueError as err:
            log.warning("a recorded pass is skipped: %s", err)
    return passes


def _passes_from_config(config: Mapping[str, Any], base_label: str) -> list[EvalPass]:
    """FALLBACK for records written before the passes were recorded (no `provenance.passes`):
    the passes their config asks for, made by the kinds as the run made them, the untuned base's
    included (whether it ran, the record's metrics or files say). The one place a pass list is
    rebuilt from a config after the run; a config no kind can read gives none."""
    try:
        return job_passes(Job(config, main_label(config), tuned=True, base_label=base_label))
    except (TypeError, ValueError) as err:
        log.warning("the record's config names no passes that can be rebuilt (%s)", err)
        return []
