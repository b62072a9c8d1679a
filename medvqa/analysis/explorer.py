"""The row explorer: every test question of each run, with the image the model saw, its answer
under every pass the job ran, each juror's verdict and its metadata, filterable in a browser.

`medvqa-report` writes `explorer.html` beside `report.html`, with `explorer/rows.js` (the rows,
as a JSON literal) and `explorer/thumbs/` (one PNG per distinct image seen, written once). The
page opens from disk without a server; it pages the rows, so 20,000 of them stay responsive.

What a run's rows hold comes from the run folder alone, never from names hard-coded per pass
kind: the passes its `results.json` lists (`generation.passes.recorded_passes`) whose scored
table is beside it are the passes shown (`scores.parquet` the main answers,
`scores_<key>.parquet` a pass's, `scoring.scores_path`), the judge's columns (`judge_score@<juror>`) are the jurors, and the metadata fields are those of the rows the
job generated from. A run folder is data from a stranger: every value is text to the page (the
script sets it with `textContent`, never as markup), the JSON literal has no `<`, and images are
read only through the record's dataset (the registered dataset plug-in its config names, built
with its plain options, never a class from the record) and re-encoded as thumbnails. The same rows, with the thumbnails as `wandb.Image`s, are each run's W&B
`predictions` table (`tracking.log_rows`).
"""

from __future__ import annotations

import hashlib
import html
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from PIL import Image

from medvqa import plugins
from medvqa.analysis.methods import REFERENCES, method_name
from medvqa.analysis.paired import scored_table
from medvqa.analysis.tables import USABLE
from medvqa.data import records as R
from medvqa.data.answers import normalize_answer
from medvqa.data.shifts import IMAGE_TRANSFORM, seen_image, seen_key
from medvqa.generation.files import MODEL
from medvqa.generation.passes import ZERO_SHOT, recorded_passes
from medvqa.record import read_record
from medvqa.scoring.metrics.judge import JUDGE_SCORE, juror_column, jurors_of
from medvqa.scoring.metrics.traditional import binary_correct
from medvqa.scoring.pipeline import SCORES_FILE, scores_path
from medvqa.untrusted import CALL_KEYS, CLASS_KEY, config_get, current_class

log = logging.getLogger(__name__)

HTML_FILE = "explorer.html"
ASSETS = "explorer"  # beside explorer.html: rows.js and thumbs/
ROWS_JS = "rows.js"
THUMBS = "thumbs"
# The longest side of a thumbnail, in pixels: enough to see a corruption, small enough that a
# study's distinct images (thousands) load in a page.
THUMB_PX = 160
# A field with more values than this (ids, free text, raw ages) is shown but not offered as a
# subgroup filter.
MAX_FILTER_VALUES = 50
# The W&B rows table carries the thumbnails of at most this many rows per split (the rest keep
# their row, without an image): a study's table stays a few megabytes.
WANDB_IMAGES_PER_SPLIT = 2000

# Columns the explorer adds to a run's main scored table.
CORRECT, SCORE, GROUP, DISAGREE = "correct", "score", "group", "jurors_disagree"
PASS_COLUMNS = ("prediction", "changed", "correct")  # `<prefix>/<column>` for each other pass
# The core columns shown among the metadata (the others are the row's own cells, or ids).
SHOWN_CORE = (R.ANSWER_TYPE, R.QUESTION_TYPE)
# Keys of a predictions row that are not metadata: what the job adds to the dataset's row, and
# the core columns the page shows as cells of their own.
NOT_METADATA = frozenset(R.CORE_COLUMNS) - frozenset(SHOWN_CORE) | frozenset(
    {
        R.SPLIT,
        R.PREDICTION,
        R.LOGPROB_MEAN,
        R.LOGPROB_MIN,
        R.ANSWER_TOKENS,
        R.LOGPROB_BY_TEMPERATURE,
        R.OPTION_LETTERS,
        MODEL,
        IMAGE_TRANSFORM,
    }
)
NO_RUNS = "no run has a readable scored table with its answers (scores.parquet beside its record)"
PREDICTIONS_HEAD = 1 << 20  # bytes read of predictions.jsonl to learn its fields (one line)


def pass_column(prefix: str, column: str) -> str:
    """The rows table's column of another pass (`blank/prediction`, `order1/changed`)."""
    return f"{prefix.rstrip('/')}/{column}"


def run_rows(
    scored: Mapping[str, pd.DataFrame],
    headlines: Sequence[str],
    score_columns: Mapping[str, Sequence[str]] | None,
    group_field: str | None,
) -> pd.DataFrame:
    """The main scored table (`scored[""]`) with what the explorer adds to each row: `correct`
    (1/0 from the traditional family, NaN where it has no such column), `score` (the per-sample
    column of the run's headline score for the row's answer type, from `score_columns`:
    score -> [column, answer type]), `group` (the row's value of the shift's field, else its
    image transform), for every other pass `<prefix>/prediction`, `<prefix>/changed` (1/0: the
    normalised answer differs from the main one) and `<prefix>/correct`, matched by (split, id)
    (NaN where the pass has no answer for the row), and `jurors_disagree` where a jury judged."""
    main = scored[""].reset_index(drop=True)
    out = main.copy()
    out[CORRECT] = binary_correct(main).to_numpy(float)
    out[SCORE] = _headline_scores(main, headlines, score_columns or {})
    if group_field and group_field in main:
        out[GROUP] = main[group_field]
    elif IMAGE_TRANSFORM in main:
        out[GROUP] = main[IMAGE_TRANSFORM]
    ours = main[R.PREDICTION].map(_normalised).to_numpy(object)
    at_main = R.prediction_index(main)
    for prefix, other in scored.items():
        if not prefix or R.PREDICTION not in other:
            continue
        index = R.prediction_index(other)
        keep = ~index.duplicated()
        at = pd.Series(np.arange(len(other)), index=index)[keep].reindex(at_main).to_numpy()
        found = ~pd.isna(at)
        rows = at[found].astype(int)
        answers = np.full(len(main), None, dtype=object)
        answers[found] = other[R.PREDICTION].to_numpy(object)[rows]
        changed = np.full(len(main), np.nan)
        theirs = [_normalised(a) for a in answers[found]]
        changed[found] = [float(a != b) for a, b in zip(ours[found], theirs, strict=True)]
        correct = np.full(len(main), np.nan)
        correct[found] = binary_correct(other).to_numpy(float)[rows]
        out[pass_column(prefix, "prediction")] = answers
        out[pass_column(prefix, "changed")] = changed
        out[pass_column(prefix, "correct")] = correct
    jurors = jurors_of(main)
    if jurors:
        verdicts = main[[juror_column(JUDGE_SCORE, j) for j in jurors]].apply(
            pd.to_numeric, errors="coerce"
        )
        out[DISAGREE] = (verdicts.nunique(axis=1, dropna=True) > 1).astype(float)
    return out


def _normalised(answer: Any) -> str | None:
    return None if answer is None or _missing(answer) else normalize_answer(str(answer))


def _missing(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _headline_scores(
    main: pd.DataFrame, headlines: Sequence[str], score_columns: Mapping[str, Sequence[str]]
) -> np.ndarray:
    """Each row's per-sample value of the headline score of its answer type (NaN: none)."""
    out = np.full(len(main), np.nan)
    for score in headlines:
        spec = score_columns.get(score)
        if not isinstance(spec, list | tuple) or len(spec) != 2 or spec[0] not in main:
            continue
        column, answer_type = spec
        rows = (main[R.ANSWER_TYPE] == answer_type).to_numpy() & np.isnan(out)
        out[rows] = pd.to_numeric(main.loc[rows, column], errors="coerce").to_numpy(float)
    return out


def thumbnail(image: Image.Image, px: int = THUMB_PX) -> Image.Image:
    """`image` re-encoded at most `px` on its longest side (RGB): nothing of the file travels."""
    small = image.convert("RGB")
    small.thumbnail((px, px), Image.Resampling.LANCZOS)
    return small


class Thumbnails:
    """The images rows were seen with, each written once into `folder` as a PNG thumbnail named
    by its key (`shifts.seen_key` and the dataset's root): only the files stay, never the
    pixels in memory. None for a row whose image cannot be read (counted in `failed`, the first
    error kept in `error`)."""

    def __init__(self, folder: Path, px: int = THUMB_PX) -> None:
        self.folder = Path(folder)
        self.px = px
        self._done: dict[str, Path | None] = {}
        self.failed = 0
        self.error: str | None = None

    @staticmethod
    def key(source: Any, row: Mapping[str, Any]) -> str:
        name = f"{getattr(source, 'name', '?')}\0{getattr(source, 'root', '')}\0{seen_key(row)}"
        return hashlib.sha256(name.encode("utf-8", "replace")).hexdigest()[:20]

    @property
    def written(self) -> int:
        return sum(path is not None for path in self._done.values())

    def path(self, source: Any, row: Mapping[str, Any]) -> Path | None:
        """The thumbnail file of `row`'s image, written the first time it is asked for."""
        key = self.key(source, row)
        if key in self._done:
            return self._done[key]
        try:
            image = thumbnail(seen_image(source, row), self.px)
        except Exception as err:  # a stranger's row: a missing, hostile or odd image
            self._done[key] = None
            self.failed += 1
            self.error = self.error or f"{type(err).__name__}: {err}"
            return None
        self.folder.mkdir(parents=True, exist_ok=True)
        image.save(self.folder / f"{key}.png", optimize=True)
        self._done[key] = self.folder / f"{key}.png"
        return self._done[key]

    def warn(self, what: str) -> None:
        if self.failed:
            log.warning(
                "%s: %d image(s) could not be read (%s); their rows have none",
                what,
                self.failed,
                self.error,
            )


def wandb_images(
    rows: pd.DataFrame, source: Any, folder: Path, cap: int = WANDB_IMAGES_PER_SPLIT
) -> list[Path | None]:
    """The thumbnail file (in `folder`) of each row's image for the W&B rows table, for the
    first `cap` rows of each split (None for the rest and for rows whose image cannot be
    read); rows that share an image share one file, so W&B stores it once."""
    thumbs, out = Thumbnails(folder), []
    per_split: dict[Any, int] = {}
    for row in rows.to_dict("records"):
        split = row.get(R.SPLIT)
        per_split[split] = per_split.get(split, 0) + 1
        out.append(thumbs.path(source, row) if per_split[split] <= cap else None)
    thumbs.warn("the W&B rows table")
    return out


def metadata_fields(rows: pd.DataFrame, recorded: Sequence[str]) -> list[str]:
    """The metadata fields among `recorded` (a dataset row's keys, in order) that `rows` has."""
    return [f for f in recorded if f in rows and f not in NOT_METADATA]


# --- reading a run folder ---------------------------------------------------------------------


@dataclass
class RunView:
    """One run's rows as the explorer shows them, and what the run folder told about them."""

    name: str
    table: str
    seed: Any
    folder: str
    rows: pd.DataFrame
    passes: dict[str, str]  # pass key (its prefix, no slash) -> label, in the record's order
    jurors: list[str]
    fields: list[str]
    group_field: str | None
    image_mode: str
    notes: list[str] = field(default_factory=list)


def scored_passes(results: Path, record: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """{scores file name: (pass key, label)} of every pass the record lists whose scored table
    is beside its results.json (`scoring.scores_path` of the pass's predictions file), the main
    answers' `scores.parquet` ("") first. Links are skipped: a run folder's files are its
    own."""
    found = {SCORES_FILE: ("", "")}
    for p in recorded_passes(record, method_name(REFERENCES[ZERO_SHOT])):
        path = scores_path(p.path(results.parent))
        if p.prefix and not path.is_symlink() and path.is_file():
            found[path.name] = (p.key, p.label)
    return found


def recorded_fields(folder: Path) -> list[str]:
    """The keys of the first row of the run's predictions.jsonl (the dataset's row as the job
    generated from it), read from its first megabyte; [] where there is none."""
    path = folder / "predictions.jsonl"
    if path.is_symlink() or not path.is_file():
        return []
    try:
        with path.open("rb") as fh:
            first = json.loads(fh.readline(PREDICTIONS_HEAD).decode("utf-8"))
    except (OSError, ValueError):
        return []
    return [str(k) for k in first] if isinstance(first, dict) else []


class Sources:
    """The datasets runs name, each built once: the registered dataset plug-in (`plugins`) the
    record's `config.dataset` names, with the record's plain options (the class is looked up by
    name, never imported from the record); None, with the reason, for one that is not
    registered, refuses its options, or whose images are not on this machine."""

    def __init__(self) -> None:
        self._built: dict[str, tuple[Any, str | None]] = {}

    def get(self, record: Mapping[str, Any]) -> tuple[Any, str | None]:
        node = config_get(record, "config.dataset")
        if not isinstance(node, Mapping):
            return None, "the record names no dataset"
        key = json.dumps(node, sort_keys=True, default=str)
        if key not in self._built:
            self._built[key] = self._build(node)
        return self._built[key]

    @staticmethod
    def _build(node: Mapping[str, Any]) -> tuple[Any, str | None]:
        named = str(node.get(CLASS_KEY, ""))
        cls = plugins.registered_class("dataset", current_class(named))
        if cls is None:
            return None, f"its dataset {named!r} is not a registered dataset plug-in"
        options = {k: v for k, v in node.items() if k != CLASS_KEY and k not in CALL_KEYS}
        unknown = sorted(set(options) - set(plugins.parameters(cls)))
        if unknown:
            return None, f"options {unknown} are not those of {plugins.target_of(cls)}"
        try:
            source = plugins.constructor(cls)(**options)
        except Exception as err:  # the record's options, refused by the class
            return None, f"its dataset cannot be built here ({type(err).__name__}: {err})"
        root = Path(getattr(source, "root", ""))
        if not root.is_dir():  # never made here: a stranger's generated cache is not rebuilt
            return None, f"its dataset's images are not on this machine ({root})"
        return source, None


# What a scored table needs to be shown: whose answer, to which question, of which kind.
ANSWER_COLUMNS = (R.ID, R.PREDICTION, R.ANSWER_TYPE)


def _answers(table: pd.DataFrame) -> bool:
    return all(c in table for c in ANSWER_COLUMNS)


def read_run(run: Mapping[str, Any]) -> tuple[RunView, dict[str, Any]] | None:
    """A run of the runs table (`aggregate.collect`) as explorer rows, with its record; None
    for a run without a local record or scored table (a W&B run, a failed job)."""
    results = Path(str(run.get("source", "")))
    main = results.parent / SCORES_FILE
    if results.name != "results.json" or not results.is_file():
        return None
    if main.is_symlink() or not main.is_file():  # a run folder's files are its own
        return None
    try:  # a stranger's files: a damaged or odd one names itself, the other runs go on
        record = read_record(results)
        files = scored_passes(results, record)
        scored = {key: scored_table(str(results), name) for name, (key, _) in files.items()}
        tables = {p: t for p, t in scored.items() if t is not None and _answers(t)}
        if "" not in tables:
            raise ValueError(f"its {SCORES_FILE} lacks one of {list(ANSWER_COLUMNS)}")
        group_field = config_get(record, "config.shift.field")
        group_field = group_field if isinstance(group_field, str) else None
        headlines = [str(run.get("primary_closed", "")), str(run.get("primary_open", ""))]
        columns = run.get("score_columns")
        columns = columns if isinstance(columns, Mapping) else {}
        rows = run_rows(tables, headlines, columns, group_field)
    except Exception as err:
        log.warning("%s: not in the row explorer (%s: %s)", results, type(err).__name__, err)
        return None
    recorded = recorded_fields(results.parent) or ([group_field] if group_field else [])
    fields = metadata_fields(rows, recorded)
    notes = [f"{name}: no usable table" for name, (key, _) in files.items() if key not in tables]
    image_mode = config_get(record, "config.data.eval_image")
    return RunView(
        name=str(run.get("method", "?")),
        table=str(run.get("table", "?")),
        seed=run.get("seed"),
        folder=str(results.parent),
        rows=rows,
        passes={key: label for key, label in files.values() if key and key in tables},
        jurors=jurors_of(tables[""]),
        fields=fields,
        group_field=group_field,
        image_mode=image_mode if isinstance(image_mode, str) else "image",
        notes=notes,
    ), record


# --- the page -----------------------------------------------------------------------------------


def _json_value(value: Any) -> Any:
    """A cell as JSON: text as text, numbers as numbers (3 decimals), missing as null."""
    if value is None or (pd.api.types.is_scalar(value) and pd.isna(value)):
        return None
    if isinstance(value, bool | np.bool_):
        return int(value)
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        return round(float(value), 3) if math.isfinite(float(value)) else None
    if isinstance(value, list | tuple | np.ndarray):
        return ", ".join(str(v) for v in value)
    return str(value)


def _row_json(row: Mapping[str, Any], run: int, view: RunView, image: str | None) -> dict[str, Any]:
    return {
        "r": run,
        "s": _json_value(row.get(R.SPLIT)),
        "id": _json_value(row.get(R.ID)),
        "q": _json_value(row.get(R.QUESTION)),
        "ref": _json_value(row.get(R.ANSWER)),
        "a": _json_value(row.get(R.PREDICTION)),
        "t": _json_value(row.get(R.ANSWER_TYPE)),
        "c": _json_value(row.get(CORRECT)),
        "sc": _json_value(row.get(SCORE)),
        "g": _json_value(row.get(GROUP)),
        "img": image,
        "m": [_json_value(row.get(f)) for f in view.fields],
        "p": [[_json_value(row.get(pass_column(p, c))) for c in PASS_COLUMNS] for p in view.passes],
        "j": [_json_value(row.get(juror_column(JUDGE_SCORE, j))) for j in view.jurors],
        "jv": _json_value(row.get(JUDGE_SCORE)),
        "jd": _json_value(row.get(DISAGREE)),
    }


def explorer_data(
    views: Sequence[tuple[RunView, Any, str | None]],
    image_for: Callable[[Any, Mapping[str, Any]], str | None],
) -> dict[str, Any]:
    """The page's data: one entry per run (what its columns are) and one per row.
    `views`: (run, its dataset source or None, why there is no source); `image_for(source,
    row)`: the thumbnail's path relative to the page, or None."""
    runs, rows = [], []
    for i, (view, source, why) in enumerate(views):
        runs.append(
            {
                "name": view.name,
                "table": view.table,
                "seed": _json_value(view.seed),
                "folder": view.folder,
                "passes": [{"key": p, "label": label} for p, label in view.passes.items()],
                "jurors": view.jurors,
                "fields": view.fields,
                "group": view.group_field or (GROUP if GROUP in view.rows else None),
                "imageMode": view.image_mode,
                "notes": [*view.notes, *([f"no images: {why}"] if why else [])],
            }
        )
        for row in view.rows.to_dict("records"):
            image = image_for(source, row) if source is not None else None
            rows.append(_row_json(row, i, view, image))
    return {"runs": runs, "rows": rows, "maxFilterValues": MAX_FILTER_VALUES}


def rows_script(data: Mapping[str, Any]) -> str:
    """The data as a script that only assigns a JSON literal: every non-ASCII character and
    every `<`, `>`, `&` escaped, so no value can end the script or become markup."""
    text = json.dumps(data, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    for char in "<>&":
        text = text.replace(char, f"\\u{ord(char):04x}")
    return f"window.MEDVQA_EXPLORER = {text};\n"


def _asset(name: str) -> str:
    return files("medvqa.analysis").joinpath("explorer_static", name).read_text("utf-8")


def page_html(title: str) -> str:
    """explorer.html: the controls and the script; the rows come from `explorer/rows.js`."""
    return (
        _asset("explorer.html")
        .replace("{{title}}", html.escape(title))
        .replace("{{css}}", _asset("explorer.css"))
        .replace("{{rows}}", f"{ASSETS}/{ROWS_JS}")
        .replace("{{script}}", _asset("explorer.js"))
    )


def write_explorer(runs: pd.DataFrame, out_dir: Path) -> Path | str:
    """explorer.html, explorer/rows.js and explorer/thumbs/ under `out_dir` for the finished
    runs of the runs table that have a local scored table; the reason instead where none has."""
    if runs.empty or "source" not in runs:
        return NO_RUNS
    chosen = runs[(runs["kind"] == "run") & runs["status"].isin(USABLE)]
    sources, thumbs = Sources(), Thumbnails(out_dir / ASSETS / THUMBS)
    views: list[tuple[RunView, Any, str | None]] = []
    for run in chosen.to_dict("records"):
        got = read_run(run)
        if got is None:
            continue
        view, record = got
        source, why = sources.get(record)
        views.append((view, source, why))
    if not views:
        return NO_RUNS

    def image_for(source: Any, row: Mapping[str, Any]) -> str | None:
        path = thumbs.path(source, row)
        return None if path is None else f"{ASSETS}/{THUMBS}/{path.name}"

    data = explorer_data(views, image_for)
    thumbs.warn("row explorer")
    (out_dir / ASSETS).mkdir(parents=True, exist_ok=True)
    (out_dir / ASSETS / ROWS_JS).write_text(rows_script(data), encoding="utf-8")
    path = out_dir / HTML_FILE
    path.write_text(page_html("medvqa row explorer"), encoding="utf-8")
    n_rows, n_runs = len(data["rows"]), len(views)
    log.info("row explorer: %d rows of %d run(s), %d images", n_rows, n_runs, thumbs.written)
    return path
