"""`medvqa-report`: the study's tables, figures and one HTML report from many runs.

    medvqa-report logs/multiruns/2025-01-01/12-00-00 [more dirs] --out report/
    medvqa-report --wandb my-team/medvqa --out report/          # read runs from W&B instead
    medvqa-report <dirs> --out report/ --wandb-log               # also log tables/figures to W&B

Runs are read from their records (results.json, or W&B config + summary), grouped by setting
(the `experiment` choice, else dataset + shift) × method label (and test condition, such as
another wording), over seeds; runs of one table and seed on the same questions are also paired
(`paired_differences.csv`). A failed or diverged job is part of the report, counted in its cell
and listed with its error: one bad job in a sweep never stops the rest from being aggregated.
A record that cannot be read or placed in a table (`null`, no config) is skipped with a warning
naming its file and listed with the reason among the issues, never shown as a table of its own.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import logging
import numbers
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from medvqa.analysis import figures as figs
from medvqa.analysis.card import GUIDELINE
from medvqa.analysis.claims import DEFAULT_ADJUSTMENT
from medvqa.analysis.conclusions import Conclusions, conclude
from medvqa.analysis.effective import scatter_figure
from medvqa.analysis.explorer import write_explorer
from medvqa.analysis.judges import JudgeSensitivity, judge_figure, judge_sensitivity
from medvqa.analysis.paired import paired_differences
from medvqa.analysis.rows import SKIPPED, rehearsals
from medvqa.analysis.tables import (
    FOOTNOTE,
    issues_table,
    long_table,
    perf_table,
    provenance_table,
    slug,
    to_latex,
    view_tables,
    wide_tables,
    write_tables,
)
from medvqa.atomic import staged_dir
from medvqa.record import REHEARSAL_NOTE
from medvqa.views import presented

log = logging.getLogger(__name__)


@dataclass
class Report:
    """Everything the report shows, and where it was written."""

    out_dir: Path
    runs: pd.DataFrame
    long: pd.DataFrame
    tables: dict[str, pd.DataFrame]
    issues: pd.DataFrame
    provenance: pd.DataFrame
    paired: pd.DataFrame
    ranks: pd.DataFrame
    variance: pd.DataFrame
    perf: pd.DataFrame = field(default_factory=pd.DataFrame)
    # Why rehearsal runs (random weights) are or are not in the tables ("" when there are none).
    rehearsal: str = ""
    views: dict[str, dict[str, pd.DataFrame]] = field(default_factory=dict)
    # RR, rankings and conclusions under each judge of a jury (medvqa.analysis.judges)
    judges: JudgeSensitivity = field(default_factory=JudgeSensitivity)
    # the family of claims, SURE-VQA's findings, effective robustness, the card
    conclusions: Conclusions = field(default_factory=Conclusions)
    figures: dict[str, Path] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    explorer_note: str = ""  # why there is no row explorer (none: explorer.html beside)
    files: dict[str, Path] = field(default_factory=dict)

    def moved(self, to: Path) -> Report:
        """The same report, its folder moved to `to` (the paths it lists follow)."""

        def follow(path: Path) -> Path:
            return to / Path(path).relative_to(self.out_dir)

        return dataclasses.replace(
            self,
            out_dir=to,
            figures={k: follow(v) for k, v in self.figures.items()},
            files={k: follow(v) for k, v in self.files.items()},
        )


# What `build_report` keeps of an earlier report's folder: W&B's offline runs of the uploads.
KEPT = ("wandb",)


def build_report(
    runs: pd.DataFrame, out_dir: Path | str, adjustment: str = DEFAULT_ADJUSTMENT
) -> Report:
    """`build` into a hidden sibling of `out_dir`, then swapped in whole (`staged_dir`): a
    report killed midway leaves the earlier one as it was, never new tables beside old figures."""
    out_dir = Path(out_dir)
    with staged_dir(out_dir, "medvqa-report", keep=KEPT, legacy="report.html") as staging:
        report = build(runs, staging, adjustment)
    return report.moved(out_dir)


def build(runs: pd.DataFrame, out_dir: Path | str, adjustment: str = DEFAULT_ADJUSTMENT) -> Report:
    """Tables, figures and report.html under `out_dir` from the tidy run table; the family of
    claims adjusted by `adjustment` (medvqa.analysis.claims: holm, bh).

    Skipped records (status `unreadable`) are listed among the issues only: their rows say
    nothing about a setting, so no table, cell or figure is made of them."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    usable = runs[runs["status"] != SKIPPED] if not runs.empty else runs
    placed, rehearsal = keep_apart(usable)
    # Tables of rehearsals only say so themselves, wherever they are copied to.
    note = REHEARSAL_NOTE if all_rehearsals(placed) else None
    long = long_table(placed)
    issues = issues_table(runs)
    files = write_tables(long, issues, out_dir, note)
    runs.to_csv(out_dir / "runs.csv", index=False)
    files["runs_csv"] = out_dir / "runs.csv"
    provenance = provenance_table(placed)
    provenance.to_csv(out_dir / "provenance.csv", index=False)
    files["provenance_csv"] = out_dir / "provenance.csv"
    paired = paired_differences(placed)
    paired.to_csv(out_dir / "paired_differences.csv", index=False)
    files["paired_csv"] = out_dir / "paired_differences.csv"
    judges = judge_sensitivity(placed)
    files.update(judges.write(out_dir))
    conclusions = conclude(placed, long, issues, judges, adjustment)
    files.update(conclusions.write(out_dir))
    perf = perf_table(usable)  # rehearsals too: their speed is what they are for
    perf.to_csv(out_dir / "perf.csv", index=False)
    files["perf_csv"] = out_dir / "perf.csv"
    report = Report(
        out_dir=out_dir,
        runs=runs,
        perf=perf,
        rehearsal=rehearsal,
        long=long,
        tables=wide_tables(long),
        issues=issues,
        provenance=provenance,
        paired=paired,
        judges=judges,
        conclusions=conclusions,
        ranks=figs.ranks(long) if not long.empty else pd.DataFrame(),
        variance=figs.variance_split(long) if not long.empty else pd.DataFrame(),
        files=files,
    )
    report.views = view_tables(placed) if not placed.empty else {}
    files.update(_write_view_tables(report.views, out_dir / "tables", note))
    report.ranks.to_csv(out_dir / "ranks.csv", index=False)
    report.variance.to_csv(out_dir / "std_shifts_vs_methods.csv", index=False)
    made = _draw_figures(report, placed, out_dir / "figures")
    for name, result in made.items():
        if isinstance(result, Path):
            report.figures[name] = result
        else:
            report.skipped[name] = result
    explorer = write_explorer(placed, out_dir)  # every row of each run, beside the report
    if isinstance(explorer, Path):
        files["explorer"] = explorer
    else:
        report.explorer_note = explorer
    files["html"] = write_html(report)
    return report


def _write_view_tables(
    views: dict[str, dict[str, pd.DataFrame]], out_dir: Path, note: str | None
) -> dict[str, Path]:
    """Each view's tables as CSV and LaTeX under `out_dir`, the LaTeX caption carrying the
    view's own note (and the rehearsal note) so that a copied table still says how to read it;
    the CSVs by name."""
    files = {}
    for view, tables in views.items():
        for name, table in tables.items():
            stem = out_dir / f"{slug(view)}_{slug(name)}"
            table.to_csv(stem.with_suffix(".csv"), index=False)
            caption = f"{note + '. ' if note else ''}{name}. {presented()[view].note}"
            stem.with_suffix(".tex").write_text(to_latex(table, caption))
            files[stem.name] = stem.with_suffix(".csv")
    return files


def _draw_figures(report: Report, placed: pd.DataFrame, fig_dir: Path) -> dict[str, Path | str]:
    """Every figure of the report under `fig_dir`: name -> its file, or why it was not drawn
    (without a placed record there is nothing to draw)."""
    long = report.long
    if long.empty:
        return {"all figures": "no record could be placed in a table (see the issues)"}
    return {
        "rr_per_method_and_shift": figs.rr_bars(long, fig_dir),
        "method_rank_by_rr": figs.rank_figure(report.ranks, fig_dir),
        "std_shifts_vs_methods": figs.variance_figure(report.variance, fig_dir),
        "corruption_vs_realistic": figs.corruption_vs_realistic(long, fig_dir),
        **figs.breakdown_heatmaps(placed, fig_dir),
        **figs.reliance_quadrants(placed, fig_dir),
        **figs.region_occlusion(placed, fig_dir),
        **figs.subgroup_forest(placed, fig_dir),
        **figs.calibration_curves(placed, fig_dir),
        **judge_figure(report.judges, fig_dir),
        **scatter_figure(report.conclusions.effective, fig_dir),
    }


def all_rehearsals(placed: pd.DataFrame) -> bool:
    """Whether every row is a rehearsal's (an empty table is no rehearsal)."""
    return not placed.empty and bool(rehearsals(placed).all())


def keep_apart(placed: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """(the rows the tables are made of, a note on rehearsals): rehearsal runs (random
    weights) never share a table with real runs; where both were given, the rehearsals are
    left out (listed in the speed table only), and a report of rehearsals only says so."""
    if placed.empty:
        return placed, ""
    mock = rehearsals(placed)
    if not mock.any():
        return placed, ""
    if mock.all():
        return placed, f"{REHEARSAL_NOTE}: every run of this report is a rehearsal."
    n = int((mock & (placed["kind"] == "run")).sum())
    log.warning("%d rehearsal run(s) (random weights) left out of the tables", n)
    note = (
        f"{n} rehearsal run(s) (random weights: model.random_weights) left out of the tables "
        "and figures; they are in the speed table and runs.csv."
    )
    return placed[~mock], note


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


# A run of this many non-space characters (a path, a run's overrides, an error's file name)
# would set a table column's narrowest width; it may wrap after its separators instead.
_LONG_TOKEN = re.compile(r"\S{24,}")
_BREAK_AFTER = re.compile(r"(?<=[/\\_,;=:&|])")


def _breakable(text: str) -> str:
    """`text` as HTML, with a line-break opportunity (``<wbr>``) after each separator of a long
    unbroken token: a column of paths or overrides wraps there, so its table fits the page."""
    out, last = [], 0
    for match in _LONG_TOKEN.finditer(text):
        out.append(html.escape(text[last : match.start()]))
        out.append("<wbr>".join(html.escape(p) for p in _BREAK_AFTER.split(match.group())))
        last = match.end()
    out.append(html.escape(text[last:]))
    return "".join(out)


def _cell(value: Any) -> Any:
    """A table cell as HTML (`_breakable` text); numbers as they are, a missing value as the
    tables' "—" (in a text column pandas would print None)."""
    if pd.api.types.is_scalar(value) and pd.isna(value):
        return "—"
    if isinstance(value, numbers.Number):
        return value
    return _breakable(str(value))


def _frame_html(frame: pd.DataFrame, float_format: str = "{:.3f}") -> str:
    """A table in its own horizontally scrollable box: wrapped to the page where it can be,
    scrolled (never the whole page) where a cell cannot be wrapped."""
    shown = frame.rename_axis(columns=None)  # pandas would add an empty cell to every row
    shown = shown.set_axis([_breakable(str(c)) for c in shown.columns], axis=1)
    for i, dtype in enumerate(shown.dtypes):
        if not pd.api.types.is_numeric_dtype(dtype):  # text (object or str), maybe mixed
            shown.isetitem(i, shown.iloc[:, i].map(_cell))
    table = shown.to_html(
        index=False,
        border=0,
        classes="t",
        na_rep="—",
        float_format=float_format.format,
        escape=False,
    )
    return f"<div class='scroll'>{table}</div>"


# Tables wrap long labels and paths (`_breakable`) to fit a laptop's width (1280 px: the
# tests check it in Chromium); a cell that cannot wrap scrolls its own table, not the page.
_CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;padding:0 1em;max-width:1200px;color:#222}
.scroll{overflow-x:auto;max-width:100%}
table.t{border-collapse:collapse;margin:.5em 0 1em;font-size:13px}
table.t th,table.t td{padding:3px 8px;border-bottom:1px solid #ddd;text-align:right;
vertical-align:top}
table.t th{vertical-align:bottom}
table.t td:first-child,table.t th:first-child{text-align:left}
img{max-width:100%;margin:.5em 0}.note{color:#555;font-size:12px}.bad{color:#b00}
"""


def write_html(report: Report) -> Path:
    """One self-contained file: tables as HTML, figures embedded as base64 PNG."""
    parts = [
        *_header_html(report),
        *_results_html(report),
        *_unfinished_html(report),
        *_perf_html(report),
        *_paired_html(report),
        *_judges_html(report.judges),
        *_conclusions_html(report.conclusions),
        *_provenance_html(report),
        *_figures_html(report),
        "</body></html>",
    ]
    path = report.out_dir / "report.html"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def _header_html(report: Report) -> list[str]:
    """The page's head and its first lines: how many runs ended how, where the row explorer
    is (or why there is none), and the rehearsal note a reader must see before any number."""
    runs = report.runs
    n_runs = int((runs["kind"] == "run").sum()) if not runs.empty else 0
    status = runs.loc[runs["kind"] == "run", "status"].value_counts().to_dict() if n_runs else {}
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>medvqa report</title>",
        f"<style>{_CSS}</style></head><body><h1>medvqa report</h1>",
        f"<p>{n_runs} runs ("
        + ", ".join(f"{v} {html.escape(str(k))}" for k, v in sorted(status.items()))
        + f"), {len(report.tables)} shift table(s).</p>",
    ]
    if "explorer" in report.files:
        parts.append(
            f"<p><a id='explorer' href='{report.files['explorer'].name}'>Row explorer</a>: every "
            "test question of each run with the image it saw, its answers under every pass, "
            "each juror's verdict and its metadata; filter, search and compare two runs.</p>"
        )
    elif report.explorer_note:
        parts.append(f"<p class='note'>No row explorer: {html.escape(report.explorer_note)}.</p>")
    if report.rehearsal:
        parts.append(f"<p class='bad'><b>{html.escape(report.rehearsal)}</b></p>")
    return parts


def _results_html(report: Report) -> list[str]:
    """The tables per shift, then each view's tables with the view's own note on reading it."""
    parts = ["<h2>Results per shift</h2>"]
    for name, table in report.tables.items():
        parts += [f"<h3>{html.escape(name)}</h3>", _frame_html(table)]
    parts.append(f"<p class='note'>{html.escape(FOOTNOTE)}</p>")
    for view, tables in report.views.items():
        parts.append(f"<h2>{html.escape(view)}</h2>")
        parts.append(f"<p class='note'>{html.escape(presented()[view].note)}</p>")
        for name, table in tables.items():
            parts += [f"<h3>{html.escape(name)}</h3>", _frame_html(table)]
    return parts


def _unfinished_html(report: Report) -> list[str]:
    """The runs that failed or diverged: part of the report, never dropped silently."""
    parts = ["<h2>Runs that did not finish</h2>"]
    if report.issues.empty:
        parts.append("<p>None: every run finished.</p>")
    else:
        parts.append(f"<div class='bad'>{_frame_html(report.issues)}</div>")
    return parts


def _perf_html(report: Report) -> list[str]:
    """What each job measured of its own speed and memory (the records' `perf`)."""
    parts = ["<h2>Speed and memory per job</h2>"]
    if report.perf.empty:
        parts.append("<p>No run recorded its speed (records from before medvqa.measure).</p>")
        return parts
    parts.append(
        "<p class='note'>What each job measured of itself (results.json <code>perf</code>): "
        "the fit's samples/s over the whole fit and its second half (steady, after "
        "compilation and warm-up), model-FLOPs utilisation over the second half, this "
        "rank's peak GPU memory against the memory plan's estimate, and the generation "
        "passes' rows/s; compare with docs/measurements.md (perf.csv).</p>"
    )
    parts.append(_frame_html(report.perf, "{:.3g}"))
    return parts


def _paired_html(report: Report) -> list[str]:
    """The paired differences on the same questions (paired_differences.csv)."""
    parts = ["<h2>Paired differences on the same questions</h2>"]
    if report.paired.empty:
        parts.append(
            "<p>None: no table has two runs with scored tables of the same questions for one "
            "seed.</p>"
        )
        return parts
    parts.append(
        "<p class='note'>A − B on the same questions, per seed and split: method − method, "
        "another test wording − the default one (condition − default), method − baseline; "
        "with a paired case-bootstrap 95% CI, the score recomputed on each resample where it "
        "is not a per-row mean (paired_differences.csv).</p>"
    )
    parts.append(_frame_html(report.paired))
    return parts


def _provenance_html(report: Report) -> list[str]:
    """What each table's runs were computed with; a field that mixes values is marked, since a
    table over mixed code or data versions may not compare like with like."""
    parts = ["<h2>Provenance</h2>"]
    if report.provenance.empty:
        parts.append("<p>No run recorded its provenance.</p>")
        return parts
    shown = report.provenance.assign(
        table=report.provenance["table"].map(_breakable),
        values=report.provenance["values"].map(lambda vs: "<br>".join(map(_breakable, vs))),
    )
    mixed = shown["n_values"] > 1
    parts.append(
        "<p class='note'>What each table's runs were computed with; "
        f"{int(mixed.sum())} field(s) mix several values (marked).</p>"
    )
    table = shown.assign(
        n_values=shown["n_values"].map(lambda n: f"{n} ⚠" if n > 1 else n)
    ).to_html(index=False, border=0, classes="t", escape=False)
    parts.append(f"<div class='scroll'>{table}</div>")
    return parts


def _figures_html(report: Report) -> list[str]:
    """The figures, embedded, each with the table it was drawn from where a reader needs the
    numbers (ranks, the spread over shifts and methods); then the figures not drawn and why."""
    parts = ["<h2>Figures</h2>"]
    for name, png in report.figures.items():
        parts += [f"<h3>{html.escape(name)}</h3>", _img(png)]
        if name == "method_rank_by_rr" and not report.ranks.empty:
            parts.append(_frame_html(report.ranks, "{:.2f}"))
            parts += _notes_html(report.conclusions.effective.notes)
        if name == "std_shifts_vs_methods" and not report.variance.empty:
            summary = report.variance.groupby(["score", "std of"], as_index=False)["std"].mean()
            parts.append(_frame_html(summary.rename(columns={"std": "mean std"})))
    if report.skipped:
        parts.append("<h3>Figures not drawn</h3><ul>")
        parts += [f"<li>{html.escape(k)}: {html.escape(v)}</li>" for k, v in report.skipped.items()]
        parts.append("</ul>")
    return parts


def _judges_html(judges: JudgeSensitivity) -> list[str]:
    """The section on the conclusions under each judge of a jury (none without a jury)."""
    if judges.empty:
        return []
    flagged = judges.flagged
    n = len(judges.conclusions.drop_duplicates(["table", "seed", "score", "higher", "lower"]))
    parts = [
        "<h2>Conclusions under each judge</h2>",
        "<p class='note'>The runs were graded by a jury (judge.jury). Each conclusion "
        "“A's RR is above B's” that a judge supports with a paired case-bootstrap interval "
        "excluding zero, and what becomes of it under every other judge: it holds, loses "
        "significance (interval holding zero), flips (the other sign) or is unknown (an item "
        "that judge could not score). Rankings by RR under each judge and Kendall's τ between "
        "them: judge_ranks.csv, judge_rank_tau.csv; every comparison: judge_conclusions.csv; "
        "the figure rr_under_each_judge.</p>",
    ]
    if flagged.empty:
        parts.append(f"<p>All {n} significant pairwise conclusion(s) hold under every judge.</p>")
    else:
        parts.append(
            f"<p class='bad'>{len(flagged)} case(s) of a conclusion that does not hold under "
            f"another judge ({n} significant pairwise conclusion(s) in all):</p>"
        )
        parts.append(_frame_html(flagged))
    if not judges.tau.empty:
        parts.append(_frame_html(judges.tau, "{:.2f}"))
    return parts


def _notes_html(notes: Sequence[str]) -> list[str]:
    """Notes beside a ranking by RR that a weak model wins (medvqa.analysis.effective)."""
    return [f"<p class='bad'>{html.escape(note)}.</p>" for note in notes]


def _effective_shown(frame: pd.DataFrame) -> pd.DataFrame:
    """effective_robustness.csv's table narrow enough for a laptop: the line's OoD and its
    band in one cell."""

    def line(row: pd.Series) -> str:
        if pd.isna(row["line_ood"]):
            return "—"
        return f"{row['line_ood']:.3g} [{row['line_lo']:.3g}, {row['line_hi']:.3g}]"

    shown = frame.drop(columns=["line_ood", "line_lo", "line_hi"])
    shown.insert(shown.columns.get_loc("rr") + 1, "line's OoD [95%]", frame.apply(line, axis=1))
    return shown.rename(columns={"effective_robustness": "effective robustness"})


def _conclusions_html(conclusions: Conclusions) -> list[str]:
    """The family of claims, SURE-VQA's findings, effective robustness and the card."""
    family, found, effective = conclusions.family, conclusions.findings, conclusions.effective
    parts = [
        "<h2>The family of claims</h2>",
        "<p class='note'>Every pairwise comparison of two fine-tuning methods per shift, score "
        "and split (and RR), pooled over seeds, with a bootstrap over cases and seeds (95% CI; "
        "p from the bootstrap standard error), adjusted together for multiplicity (claims.csv). "
        "A verdict: holds (adjusted p &lt; 0.05), not after adjustment, not significant, no "
        f"number (why given). {html.escape(family.summary)}.</p>",
    ]
    if not family.frame.empty:
        shown = family.frame.drop(columns=["id_a", "id_b"])
        parts.append(_frame_html(shown, "{:.3g}"))
    parts += [
        "<h2>SURE-VQA's findings on these runs</h2>",
        "<p class='note'>Each finding of the paper as a test on the runs present, with its "
        "statistic, 95% interval over cases and seeds, and a verdict: holds, reversed (the "
        "opposite beyond the uncertainty) or undecided (findings.csv, findings_summary.csv).</p>",
        _frame_html(found.summary()),
    ]
    if not found.frame.empty:
        parts.append(_frame_html(found.frame, "{:.3g}"))
    parts += [
        "<h2>Effective robustness</h2>",
        "<p class='note'>OoD score against the line fitted through every run's (i.i.d., OoD) "
        "point of the shift (logit axes for scores in [0, 1]; Taori et al. 2020, Miller et al. "
        "2021): a method above the line is more robust than its i.i.d. score predicts; the "
        "interval is the line's 95% band (effective_robustness.csv, figure iid_vs_ood).</p>",
    ]
    parts += _notes_html(effective.notes)
    if effective.frame.empty:
        parts.append("<p>No shift has three runs with i.i.d. and OoD scores to fit a line.</p>")
    else:
        parts.append(_frame_html(_effective_shown(effective.frame), "{:.3g}"))
    parts.append("<h2>Robustness card</h2>")
    parts.append(f"<p class='note'>{html.escape(GUIDELINE)} (card.md)</p>")
    for section in conclusions.card.sections:
        parts.append(f"<h3>{html.escape(section.title)}</h3><ul>")
        for part in section.parts:
            if isinstance(part, pd.DataFrame):
                parts.append(f"</ul>{_frame_html(part)}<ul>")
            else:
                parts.append(f"<li>{_breakable(part)}</li>")
        parts.append("</ul>")
    return parts


def log_report(report: Report, loggers: Sequence[Any]) -> int:
    """Log the tables (W&B tables / CSVs) and figures (W&B images) to the given Lightning
    loggers; returns how many items were logged. Loggers without table or image support are
    skipped, so the same call works offline with a CSV logger."""
    from lightning.pytorch.loggers import WandbLogger

    from medvqa.tracking import log_table

    n = 0
    for name, table in report.tables.items():
        log_table(loggers, f"report/{figs.slug(name)}", table)
        n += 1
    for view, tables in report.views.items():  # the beyond-accuracy views
        for name, table in tables.items():
            log_table(loggers, f"report/{figs.slug(view)}/{figs.slug(name)}", table)
            n += 1
    if not report.issues.empty:
        log_table(loggers, "report/issues", report.issues.astype(str))
        n += 1
    for name, png in report.figures.items():
        for lg in loggers:
            if isinstance(lg, WandbLogger):
                lg.log_image(key=f"report/{name}", images=[str(png)])
        n += 1
    return n
