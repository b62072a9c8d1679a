"""What a view beyond accuracy is: a plug-in (`View`, found like datasets and metric families,
through `MEDVQA_PLUGINS` too) that computes figures over all of a job's scored answers together
(`applies` / `apply`), and says how the report shows them (`presentation`), in one class."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import pandas as pd

from medvqa import plugins
from medvqa.data import records as R
from medvqa.generation.passes import EvalPass
from medvqa.scoring.metrics.traditional import BINARY_CORRECT
from medvqa.views.consistency import CHOICE

# The traditional family's per-sample columns the views read, by the answer type that needs
# them: whether an answer is right, and which candidate a closed answer chose.
NEEDED_FOR = {**{c: t for t, c in BINARY_CORRECT.items()}, CHOICE: "closed"}
CORRECT = tuple(BINARY_CORRECT.values())

# How a split (or a pair of splits, `test_iid~test_ood`) reads in a column or a figure.
SPLIT_LABELS = {
    R.TEST_IID: "i.i.d.",
    R.TEST_OOD: "OoD",
    f"{R.TEST_IID}~{R.TEST_OOD}": "i.i.d.~OoD",
}
_SPLITS = "|".join(re.escape(s) for s in sorted(SPLIT_LABELS, key=len, reverse=True))
P = TypeVar("P", bound=EvalPass)


@dataclass
class JobRows:
    """What the views read: the main answers' scored table (`main`, which the views' per-sample
    columns join), every other pass's scored table by its metric prefix (`<mode>/`,
    `order<k>/`), the job's passes (`generation.passes`: what each prefix is), the breakdown
    fields and the bootstrap's options (None: no intervals)."""

    main: pd.DataFrame
    others: Mapping[str, pd.DataFrame] = field(default_factory=dict)
    passes: Sequence[EvalPass] = ()
    breakdown: Sequence[str] = ()
    bootstrap: Mapping[str, Any] | None = None

    def of(self, kind: type[P]) -> list[P]:
        """The job's passes of `kind` (a pass kind's class) that have a scored table."""
        return [p for p in self.passes if isinstance(p, kind) and p.prefix in self.others]


@dataclasses.dataclass(frozen=True)
class Presentation:
    """How the report shows a view's recorded figures: which ones (a pattern with the groups
    split, what, stat; `SPLIT` stands for a split's name), how its columns read, and what the
    reader needs to know."""

    pattern: str
    stats: dict[str, str]  # stat group -> its label, in column order
    note: str

    def columns(self, frame: pd.DataFrame) -> dict[str, str]:
        """Recorded score -> column label, in column order (what, stat, split)."""
        found: dict[tuple[str, int, int], tuple[str, str]] = {}
        splits = list(SPLIT_LABELS)
        for column in frame.columns:
            match = re.match(self.pattern.replace("SPLIT", _SPLITS), str(column))
            if match:
                split, what, stat = match.group("split", "what", "stat")
                label = " ".join(p for p in (self.stats[stat], what, SPLIT_LABELS[split]) if p)
                found[(what, list(self.stats).index(stat), splits.index(split))] = (column, label)
        return dict(found[k] for k in sorted(found))


class View(plugins.Plugin):
    """A view beyond accuracy. `applies` says whether the job has its inputs (a view whose
    figures a metric family computes never applies: it only presents them); `columns` are the
    per-sample columns of `main` it reads (made by the metric family `family`); `apply` returns
    `main` with its own per-sample columns and its figures (`<split>/<name>`). `title` heads its
    section of the report, in `order`; `presentation` says what that section shows."""

    plugin_kind = "view"
    name: ClassVar[str]
    title: ClassVar[str]
    order: ClassVar[int] = 100
    columns: ClassVar[tuple[str, ...]] = ()
    family: ClassVar[str] = "traditional"
    presentation: ClassVar[Presentation | None] = None

    def applies(self, rows: JobRows) -> bool:
        return False

    def apply(self, rows: JobRows) -> tuple[pd.DataFrame, dict[str, float]]:
        raise NotImplementedError(f"view {self.name!r} applies but computes nothing")

    def needed(self, rows: JobRows) -> list[str]:
        """The columns it reads that the answer types of `main`'s rows need (a column the
        traditional family makes for one answer type only is needed where there are such rows;
        any other, always)."""
        types = set(rows.main[R.ANSWER_TYPE]) if R.ANSWER_TYPE in rows.main else set()
        return [c for c in self.columns if c not in NEEDED_FOR or NEEDED_FOR[c] in types]


def views() -> list[View]:
    """Every registered view (built-in, `MEDVQA_PLUGINS`, entry points), in their `order`."""
    found = plugins.registered("view").values()
    return [cls() for cls in sorted(found, key=lambda cls: (cls.order, cls.name))]


def presented() -> dict[str, Presentation]:
    """Each view's report section: its title -> what it shows, in order."""
    return {v.title: v.presentation for v in views() if v.presentation is not None}
