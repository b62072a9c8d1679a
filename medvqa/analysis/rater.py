"""Human rater study (docs/rater_study.md): export a rating sheet, then correlate human scores with metrics.

``medvqa-rater export RUN_DIR --n 50 --seed 0 --out DIR`` samples N open questions whose
prediction is not an exact match (exact matches are trivially "perfect" for every metric and
would inflate every correlation) from a run's scored table (`scores.parquet`, which holds the
judge's scores when the run used the judge; a `predictions.jsonl` works too) and writes:

* ``DIR/rating_sheet.csv``: ``id, question, ground_truth, prediction, score`` with ``score``
  empty, for raters who prefer a spreadsheet;
* ``DIR/rating_sheet.html``: the same items as one self-contained page (inline CSS and JS, no
  network) with a 1–5 selector per item and a button that downloads the filled sheet as CSV;
* ``DIR/items.jsonl``: one JSON object per item, ``{"id", "split", "question", "answer",
  "prediction", "scores": {metric: value}}``. Raters never see the scores; ``analyze`` reads them.

``medvqa-rater analyze DIR --ratings r1.csv r2.csv ... --out OUT`` validates the filled sheets
(every id known and rated once, scores integers 1–5), then computes Kendall tau-b and Spearman
rho between the mean human score and each metric, between each rater and each metric, and
between each pair of raters (plus the mean over pairs), and writes ``OUT/correlations.csv``,
``OUT/correlations.md``, ``OUT/heatmap.png`` (metric x {tau-b, rho} for the mean human score),
``OUT/heatmap_raters.png`` (rater x metric tau-b) and ``OUT/scatter.png`` (human vs each metric).

Items are presented in a random (seeded) order so that file order, e.g. by question type, does
not bias the raters.
"""

from __future__ import annotations

import argparse
import csv
import html
import itertools
import json
import logging
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from medvqa.analysis.summary import markdown_table
from medvqa.data import records as R
from medvqa.evaluation.families import traditional as M
from medvqa.evaluation.families.judge import JUDGE_SCORE  # 1–5 open, 0/0.5/1 closed
from medvqa.evaluation.generation import SPLIT, read_predictions
from medvqa.evaluation.scoring import SCORES_FILE

log = logging.getLogger(__name__)

__all__ = [
    "RatingError",
    "Study",
    "analyze",
    "correlation_table",
    "export",
    "main",
    "read_items",
    "read_ratings",
]

ITEMS = "items.jsonl"
SHEET_CSV = "rating_sheet.csv"
SHEET_HTML = "rating_sheet.html"
SHEET_COLUMNS = ("id", "question", "ground_truth", "prediction", "score")
SCORE_RANGE = (1, 5)
#: Token metrics of the rater study (docs/rater_study.md) (``ref_word_precision`` is the paper's "EM").
TOKEN_METRICS: tuple[str, ...] = ("bleu1", "ref_word_precision", "f1", "precision", "recall")


class RatingError(ValueError):
    """A ratings file or items file that cannot be used as it is."""


# --------------------------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------------------------


def _judge_columns(preds: pd.DataFrame, explicit: Sequence[str] | None) -> list[str]:
    """Judge score fields: the ones named, else ``judge_score`` (medvqa.evaluation.judge) if present.

    Not every ``judge*`` field: ``judge_failed`` is numeric too but is not a score.
    """
    if explicit:
        missing = [c for c in explicit if c not in preds.columns]
        if missing:
            raise RatingError(
                f"--judge-column {missing} not in the predictions file; columns: "
                f"{sorted(preds.columns)}"
            )
        return list(explicit)
    return [c for c in (JUDGE_SCORE,) if c in preds.columns]


def _metric_scores(
    sample: pd.DataFrame, judge: Sequence[str], text: bool, embedding: bool
) -> pd.DataFrame:
    """Score columns of the sampled items (index as `sample`)."""
    scores = pd.DataFrame(index=sample.index)
    for name in TOKEN_METRICS:
        fn = M.OPEN_METRICS[name]
        scores[name] = [
            fn(p, a) for p, a in zip(sample[M.PREDICTION], sample[R.ANSWER], strict=True)
        ]
    if text:
        from medvqa.evaluation.families.text import TextMetric

        scores = scores.join(TextMetric().per_sample(sample))
    if embedding:
        from medvqa.evaluation.families.embedding import EmbeddingMetric

        scores = scores.join(EmbeddingMetric().per_sample(sample))
    for column in judge:
        scores[column] = pd.to_numeric(sample[column], errors="coerce")
    return scores


def read_scored(path: Path) -> pd.DataFrame:
    """A run's scored table: `scores.parquet` of a run directory, a `.parquet` file, or a
    predictions JSONL (raw predictions; judge scores only if the file has them)."""
    if path.is_dir():
        path = path / SCORES_FILE
    if path.suffix == ".parquet":
        if not path.is_file():
            raise RatingError(f"{path}: no such file; pass a run directory or its {SCORES_FILE}")
        return pd.read_parquet(path)
    return read_predictions(path)


def export(
    predictions: Path,
    out: Path,
    n: int = 50,
    seed: int = 0,
    split: str | None = None,
    judge_columns: Sequence[str] | None = None,
    text_metrics: bool = True,
    embedding: bool = False,
) -> pd.DataFrame:
    """Sample the items, write the sheet (CSV + HTML) and ``items.jsonl``; return the items.

    Candidates are the open rows (of `split`, if given) whose prediction is not an exact match
    after normalisation; they are sorted by id before the seeded draw, so the sample depends on
    the file's content, not on the order a resumed generation appended it in.
    """
    preds = read_scored(Path(predictions))
    if preds.empty:
        raise RatingError(f"{predictions}: no prediction records (missing or empty file)")
    required = [R.ID, R.QUESTION, R.ANSWER, R.ANSWER_TYPE, M.PREDICTION]
    missing = [c for c in required if c not in preds.columns]
    if missing:
        raise RatingError(
            f"{predictions}: records lack field(s) {missing}; expected the JSONL written by "
            "medvqa.evaluation.generation"
        )
    if SPLIT not in preds.columns:
        preds[SPLIT] = None
    if split is not None:
        available = sorted(str(s) for s in preds[SPLIT].dropna().unique())
        preds = preds.loc[preds[SPLIT] == split]
        if preds.empty:
            raise RatingError(f"{predictions}: no records of split {split!r}; splits: {available}")
    # A resumed run may hold the same record twice; the last one written is the current one.
    preds = preds.drop_duplicates(subset=[SPLIT, R.ID], keep="last")
    repeated = preds.loc[preds[R.ID].duplicated(), R.ID]
    if not repeated.empty:
        raise RatingError(
            f"{predictions}: id {repeated.iloc[0]!r} occurs in several splits "
            f"({sorted(preds[SPLIT].dropna().unique())}); pass --split to rate one of them"
        )
    open_rows = preds.loc[preds[R.ANSWER_TYPE] == "open"]
    exact = np.array(
        [
            M.exact_match(p, a)
            for p, a in zip(open_rows[M.PREDICTION], open_rows[R.ANSWER], strict=True)
        ],
        dtype=bool,
    )
    pool = open_rows.loc[~exact].sort_values(R.ID, kind="stable")
    log.info(
        "%s: %d open record(s), %d exact match(es) excluded, %d candidate(s)",
        predictions,
        len(open_rows),
        int(exact.sum()),
        len(pool),
    )
    if pool.empty:
        raise RatingError(f"{predictions}: no open question with a non-exact prediction to rate")
    if n < 1:
        raise RatingError(f"--n must be at least 1, got {n}")
    if n > len(pool):
        log.warning("only %d candidate(s) for --n %d: rating all of them", len(pool), n)
    rng = np.random.default_rng(seed)
    picked = rng.permutation(len(pool))[: min(n, len(pool))]
    sample = pool.iloc[picked].reset_index(drop=True)
    scores = _metric_scores(sample, _judge_columns(sample, judge_columns), text_metrics, embedding)

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    items = pd.DataFrame(
        {
            "id": sample[R.ID].astype(str),
            "split": sample[SPLIT],
            "question": sample[R.QUESTION].astype(str),
            "answer": sample[R.ANSWER].astype(str),
            "prediction": sample[M.PREDICTION].fillna("").astype(str),
        }
    )
    with (out / ITEMS).open("w") as fh:
        for i, item in enumerate(items.to_dict("records")):
            item["scores"] = {
                k: (None if pd.isna(v) else float(v)) for k, v in scores.iloc[i].items()
            }
            fh.write(json.dumps(item) + "\n")
    sheet = items.rename(columns={"answer": "ground_truth"})[list(SHEET_COLUMNS[:-1])]
    sheet.assign(score="").to_csv(out / SHEET_CSV, index=False)
    (out / SHEET_HTML).write_text(rating_page(sheet))
    log.info("wrote %d item(s) to %s", len(items), out)
    return items.join(scores)


def rating_page(sheet: pd.DataFrame, title: str = "medvqa rater study") -> str:
    """A self-contained HTML page: 1–5 per item and a button that downloads the filled CSV.

    The items travel as JSON inside the page (`script_json`) and are put into the DOM with
    ``textContent``, so model output containing markup is shown, never interpreted.
    """
    data = script_json(sheet[list(SHEET_COLUMNS[:-1])].to_dict("records"))
    return _PAGE.replace("__TITLE__", html.escape(title)).replace("__ITEMS__", data)


# Inside <script>, the HTML parser knows nothing of JSON: "</script" ends the element, and
# "<!--" followed by "<script" makes it skip the next "</script>" (the page's own script is
# then swallowed). With no "<", ">" or "&" left in the text, no model output can do either;
# the \u escapes read back as the same characters with JSON.parse and as a JS literal
# (U+2028/2029 too, which older JS engines reject raw in string literals).
_SCRIPT_ESCAPES = str.maketrans(
    {
        "<": "\\u003c",
        ">": "\\u003e",
        "&": "\\u0026",
        "\u2028": "\\u2028",
        "\u2029": "\\u2029",
    }
)


def script_json(value: Any) -> str:
    """`value` as JSON that is safe to place inside an HTML ``<script>`` element, whatever
    text it holds."""
    return json.dumps(value).translate(_SCRIPT_ESCAPES)


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}
.item{border:1px solid #ccc;border-radius:6px;padding:.8rem 1rem;margin:1rem 0}
.item.done{border-color:#3a7}
.label{font-weight:600;color:#555;display:inline-block;min-width:7.5rem}
.scale label{margin-right:1rem;cursor:pointer}
.bar{position:sticky;top:0;background:#fff;padding:.5rem 0;border-bottom:1px solid #ddd}
button{font-size:1rem;padding:.4rem 1rem}
</style></head><body>
<h1>__TITLE__</h1>
<p>Score how well each <b>prediction</b> answers the question, compared with the <b>ground
truth</b>: 1 incorrect, 2 partially correct, 3 mostly correct, 4 correct with minor deviations,
5 perfect match.</p>
<div class="bar">Rater: <input id="rater" placeholder="your name">
<button id="download">Download CSV</button> <span id="progress"></span></div>
<div id="items"></div>
<script type="application/json" id="data">__ITEMS__</script>
<script>
const items = JSON.parse(document.getElementById("data").textContent);
const scores = {};
const box = document.getElementById("items");
function row(label, text) {
  const p = document.createElement("div");
  const l = document.createElement("span"); l.className = "label"; l.textContent = label;
  const t = document.createElement("span"); t.textContent = text;
  p.append(l, t); return p;
}
function progress() {
  const n = Object.keys(scores).length;
  document.getElementById("progress").textContent = n + " of " + items.length + " rated";
}
items.forEach((it, i) => {
  const div = document.createElement("div"); div.className = "item";
  const h = document.createElement("div"); h.className = "label";
  h.textContent = "#" + (i + 1) + " (" + it.id + ")";
  div.append(h, row("Question", it.question), row("Ground truth", it.ground_truth),
             row("Prediction", it.prediction));
  const scale = document.createElement("div"); scale.className = "scale";
  scale.append(Object.assign(document.createElement("span"), {className: "label",
                                                                textContent: "Score"}));
  for (let s = 1; s <= 5; s++) {
    const lab = document.createElement("label");
    const r = document.createElement("input");
    r.type = "radio"; r.name = "s" + i; r.value = s;
    r.addEventListener("change", () => { scores[it.id] = s; div.classList.add("done"); progress(); });
    lab.append(r, " " + s); scale.append(lab);
  }
  div.append(scale); box.append(div);
});
progress();
function cell(v) { v = String(v); return /[",\\r\\n]/.test(v) ? '"' + v.replace(/"/g, '""') + '"' : v; }
document.getElementById("download").addEventListener("click", () => {
  const missing = items.length - Object.keys(scores).length;
  if (missing && !confirm(missing + " item(s) are not rated yet. Download anyway?")) return;
  const lines = ["id,question,ground_truth,prediction,score"];
  items.forEach(it => lines.push([it.id, it.question, it.ground_truth, it.prediction,
                                  scores[it.id] ?? ""].map(cell).join(",")));
  const blob = new Blob([lines.join("\\r\\n") + "\\r\\n"], {type: "text/csv"});
  const a = document.createElement("a");
  const who = document.getElementById("rater").value.trim().replace(/[^A-Za-z0-9_-]+/g, "_");
  a.href = URL.createObjectURL(blob); a.download = "ratings_" + (who || "rater") + ".csv";
  document.body.append(a); a.click(); a.remove();
});
</script></body></html>
"""


# --------------------------------------------------------------------------------------------
# Reading items and ratings
# --------------------------------------------------------------------------------------------


def read_items(directory: Path) -> pd.DataFrame:
    """``items.jsonl`` of an export as a table: id, ..., one column per metric score."""
    path = Path(directory) / ITEMS
    if not path.is_file():
        raise RatingError(f"{path} not found; run `medvqa-rater export` to create {directory}")
    rows = []
    with path.open() as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as err:
                raise RatingError(f"{path}:{line_no} is not valid JSON: {err}") from err
            if "id" not in item or not isinstance(item.get("scores"), dict):
                raise RatingError(f"{path}:{line_no} lacks 'id' or a 'scores' object")
            scores = item.pop("scores")
            rows.append(
                {**item, "id": str(item["id"]), **{f"metric:{k}": v for k, v in scores.items()}}
            )
    if not rows:
        raise RatingError(f"{path} holds no items")
    table = pd.DataFrame(rows)
    if table["id"].duplicated().any():
        raise RatingError(
            f"{path}: id {table.loc[table['id'].duplicated(), 'id'].iloc[0]!r} repeats"
        )
    return table.set_index("id")


def _parse_score(raw: str) -> int | None:
    """An integer score from a cell ("4", " 4 ", "4.0" as spreadsheets write it), else None."""
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    if not math.isfinite(value) or value != int(value):
        return None
    return int(value)


def read_ratings(path: Path, known_ids: Sequence[str]) -> pd.Series:
    """One rater's scores (index = item id), validated against the exported ids.

    Every known id must be rated exactly once with an integer in 1..5; anything else raises
    :class:`RatingError` naming the file, the data row (1 = first row after the header) and
    the fix.
    """
    path = Path(path)
    if not path.is_file():
        raise RatingError(f"ratings file {path} not found")
    with path.open(newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        if "id" not in header or "score" not in header:
            raise RatingError(
                f"{path}: header {header} lacks 'id' and/or 'score'; use the exported "
                f"{SHEET_CSV} (or the HTML page's download) and fill in 'score'"
            )
        known = set(known_ids)
        scores: dict[str, int] = {}
        lo, hi = SCORE_RANGE
        for row_no, row in enumerate(reader, 1):
            item = (row.get("id") or "").strip()
            if item not in known:
                raise RatingError(
                    f"{path}: row {row_no}: id {item!r} is not one of the exported items; "
                    "rate the sheet exported for this study"
                )
            if item in scores:
                raise RatingError(f"{path}: row {row_no}: id {item!r} is rated twice; keep one")
            raw = row.get("score") or ""
            value = _parse_score(raw)
            if value is None or not lo <= value <= hi:
                what = "no score" if not raw.strip() else f"score {raw!r}"
                raise RatingError(
                    f"{path}: row {row_no} (id {item!r}) has {what}; scores are integers {lo}–{hi}"
                )
            scores[item] = value
    unrated = [i for i in known_ids if i not in scores]
    if unrated:
        raise RatingError(
            f"{path}: {len(unrated)} item(s) not rated, e.g. {unrated[:3]}; every exported "
            "item needs a score"
        )
    return pd.Series(scores, dtype=float).reindex(list(known_ids))


# --------------------------------------------------------------------------------------------
# Correlations
# --------------------------------------------------------------------------------------------


def _correlate(x: pd.Series, y: pd.Series) -> dict[str, float]:
    """Kendall tau-b and Spearman rho with p-values over the rows where both are defined.

    A constant variable has no ranking, so its correlations are NaN (scipy's warning about it
    is silenced: the NaN in the table says it).
    """
    both = pd.concat([x, y], axis=1).dropna()
    n = len(both)
    nan = {"kendall_tau_b": math.nan, "kendall_p": math.nan}
    nan |= {"spearman_rho": math.nan, "spearman_p": math.nan, "n": float(n)}
    if n < 2 or both.iloc[:, 0].nunique() < 2 or both.iloc[:, 1].nunique() < 2:
        return nan
    a, b = both.iloc[:, 0].to_numpy(float), both.iloc[:, 1].to_numpy(float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tau = stats.kendalltau(a, b, variant="b")
        rho = stats.spearmanr(a, b)
    return {
        "kendall_tau_b": float(tau.statistic),
        "kendall_p": float(tau.pvalue),
        "spearman_rho": float(rho.statistic),
        "spearman_p": float(rho.pvalue),
        "n": float(n),
    }


@dataclass
class Study:
    """Items with their metric scores and the validated ratings (one column per rater)."""

    items: pd.DataFrame
    ratings: pd.DataFrame

    @property
    def metrics(self) -> list[str]:
        return [c.removeprefix("metric:") for c in self.items.columns if c.startswith("metric:")]

    def metric(self, name: str) -> pd.Series:
        return pd.to_numeric(self.items[f"metric:{name}"], errors="coerce")

    @property
    def human(self) -> pd.Series:
        """Mean score over raters per item."""
        return self.ratings.mean(axis=1)


def correlation_table(study: Study) -> pd.DataFrame:
    """Rows: mean human vs each metric, each rater vs each metric, each rater pair, pair mean."""
    rows = []
    for metric in study.metrics:
        rows.append(
            {"kind": "human_vs_metric", "a": "human_mean", "b": metric}
            | _correlate(study.human, study.metric(metric))
        )
    for rater in study.ratings.columns:
        for metric in study.metrics:
            rows.append(
                {"kind": "rater_vs_metric", "a": rater, "b": metric}
                | _correlate(study.ratings[rater], study.metric(metric))
            )
    pairs = []
    for r1, r2 in itertools.combinations(study.ratings.columns, 2):
        pairs.append(
            {"kind": "rater_vs_rater", "a": r1, "b": r2}
            | _correlate(study.ratings[r1], study.ratings[r2])
        )
    rows.extend(pairs)
    if pairs:
        frame = pd.DataFrame(pairs)
        rows.append(
            {
                "kind": "rater_pairs_mean",
                "a": "raters",
                "b": f"{len(pairs)} pair(s)",
                "kendall_tau_b": float(frame["kendall_tau_b"].mean()),
                "kendall_p": math.nan,
                "spearman_rho": float(frame["spearman_rho"].mean()),
                "spearman_p": math.nan,
                "n": float(frame["n"].mean()),
            }
        )
    return pd.DataFrame(
        rows,
        columns=["kind", "a", "b", "kendall_tau_b", "kendall_p", "spearman_rho", "spearman_p", "n"],
    )


def _figures(study: Study, table: pd.DataFrame, out: Path) -> list[Path]:
    """Heatmaps and scatter plots (Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    metrics = study.metrics
    human = table.loc[table["kind"] == "human_vs_metric"].set_index("b")
    grid = human.loc[metrics, ["kendall_tau_b", "spearman_rho"]].to_numpy(float)
    written.append(
        _heatmap(
            plt,
            grid,
            metrics,
            ["Kendall τ-b", "Spearman ρ"],
            "Mean human score vs metric",
            out / "heatmap.png",
        )
    )
    per_rater = table.loc[table["kind"] == "rater_vs_metric"]
    raters = list(study.ratings.columns)
    grid = np.array(
        [
            [
                per_rater.loc[(per_rater["a"] == r) & (per_rater["b"] == m), "kendall_tau_b"].iloc[
                    0
                ]
                for m in metrics
            ]
            for r in raters
        ]
        + [list(human.loc[metrics, "kendall_tau_b"])],
        dtype=float,
    )
    written.append(
        _heatmap(
            plt,
            grid,
            [*raters, "mean"],
            metrics,
            "Kendall τ-b: rater vs metric",
            out / "heatmap_raters.png",
        )
    )

    cols = min(3, len(metrics))
    rows = math.ceil(len(metrics) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.4 * rows), squeeze=False)
    for ax, metric in zip(axes.flat, metrics, strict=False):
        ax.scatter(study.metric(metric), study.human, alpha=0.6, s=18)
        stats_row = human.loc[metric]
        ax.set_title(
            f"{metric}\nτ-b {stats_row['kendall_tau_b']:.2f}, ρ {stats_row['spearman_rho']:.2f}",
            fontsize=9,
        )
        ax.set_xlabel(metric)
        ax.set_ylabel("mean human score")
        ax.set_ylim(SCORE_RANGE[0] - 0.3, SCORE_RANGE[1] + 0.3)
    for ax in list(axes.flat)[len(metrics) :]:
        ax.axis("off")
    fig.tight_layout()
    path = out / "scatter.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(path)
    return written


def _heatmap(
    plt: Any, grid: np.ndarray, rows: list[str], cols: list[str], title: str, path: Path
) -> Path:
    fig, ax = plt.subplots(
        figsize=(1.2 + 1.1 * len(cols), 1.0 + 0.45 * len(rows)), constrained_layout=True
    )
    image = ax.imshow(np.ma.masked_invalid(grid), cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
    ax.set_xticks(range(len(cols)), cols, rotation=45, ha="right")
    ax.set_yticks(range(len(rows)), rows)
    for (i, j), value in np.ndenumerate(grid):
        ax.text(j, i, "n/a" if np.isnan(value) else f"{value:.2f}", ha="center", va="center")
    ax.set_title(title)
    fig.colorbar(image, ax=ax)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def analyze(directory: Path, ratings: Sequence[Path], out: Path) -> pd.DataFrame:
    """Validate the ratings, write correlations (CSV, Markdown) and figures; return the table."""
    if not ratings:
        raise RatingError("no ratings file given; pass --ratings r1.csv [r2.csv ...]")
    items = read_items(Path(directory))
    if not any(c.startswith("metric:") for c in items.columns):
        raise RatingError(f"{Path(directory) / ITEMS}: items carry no metric scores")
    ids = list(items.index)
    stems = [Path(p).stem for p in ratings]
    names = stems if len(set(stems)) == len(stems) else [str(p) for p in ratings]
    if len(set(names)) != len(names):
        raise RatingError(f"a ratings file is given twice: {[str(p) for p in ratings]}")
    table = pd.DataFrame(
        {name: read_ratings(Path(p), ids) for name, p in zip(names, ratings, strict=True)}
    )
    study = Study(items=items, ratings=table)
    result = correlation_table(study)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result.to_csv(out / "correlations.csv", index=False)
    (out / "correlations.md").write_text(
        f"# Rater study: {len(ids)} items, {len(names)} rater(s)\n\n"
        + markdown_table(result, floatfmt=".3f")  # rater names are file names: data
        + "\n"
    )
    for path in _figures(study, result, out):
        log.info("wrote %s", path)
    return result


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="medvqa-rater", description="Human rater study: export a sheet, correlate ratings."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="sample open, non-exact predictions for rating")
    ex.add_argument(
        "predictions",
        type=Path,
        help=f"a run directory (its {SCORES_FILE}), a scores .parquet or a predictions JSONL",
    )
    ex.add_argument("--n", type=int, default=50, help="items to sample (default 50)")
    ex.add_argument("--seed", type=int, default=0)
    ex.add_argument("--split", default=None, help="only this split, e.g. test_iid")
    ex.add_argument("--out", type=Path, required=True, help="directory for the sheet and items")
    ex.add_argument(
        "--judge-column",
        action="append",
        default=None,
        help="predictions field holding a judge score (repeatable; default: judge_score if present)",
    )
    ex.add_argument(
        "--no-text-metrics", action="store_true", help="skip ROUGE/chrF++/BLEU-4/METEOR"
    )
    ex.add_argument(
        "--embedding", action="store_true", help="add the embedding cosine (loads MiniLM)"
    )
    an = sub.add_parser("analyze", help="correlate filled rating sheets with the metrics")
    an.add_argument("directory", type=Path, help="the export directory (holds items.jsonl)")
    an.add_argument("--ratings", type=Path, nargs="+", required=True, help="filled sheets (CSV)")
    an.add_argument("--out", type=Path, required=True, help="directory for tables and figures")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``medvqa-rater``; returns the exit status (2 for unusable input)."""
    from rich.console import Console
    from rich.logging import RichHandler
    from rich.table import Table

    logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=[RichHandler()])
    args = _parser().parse_args(argv)
    console = Console()
    try:
        if args.command == "export":
            items = export(
                args.predictions,
                args.out,
                n=args.n,
                seed=args.seed,
                split=args.split,
                judge_columns=args.judge_column,
                text_metrics=not args.no_text_metrics,
                embedding=args.embedding,
            )
            console.print(
                f"Exported {len(items)} item(s) to {args.out}: send raters {SHEET_HTML} "
                f"(or {SHEET_CSV}), then run `medvqa-rater analyze {args.out} --ratings ...`"
            )
        else:
            table = analyze(args.directory, args.ratings, args.out)
            shown = table.loc[table["kind"].isin(["human_vs_metric", "rater_pairs_mean"])]
            summary = Table(title=f"Human vs metric (details in {args.out})")
            for column in ("a", "b", "kendall_tau_b", "spearman_rho", "n"):
                summary.add_column(column)
            for row in shown.itertuples(index=False):
                summary.add_row(
                    row.a,
                    row.b,
                    f"{row.kendall_tau_b:.3f}",
                    f"{row.spearman_rho:.3f}",
                    f"{row.n:.0f}",
                )
            console.print(summary)
    except RatingError as err:
        log.error("%s", err)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
