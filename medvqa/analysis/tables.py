"""SURE-VQA-style tables from the tidy run table: one table per shift, methods × headline scores.

Each cell is the mean ± std (ddof 1) over seeds, with the number of seeds. A cell with a single
seed shows its value ± the bootstrap CI half-width the run recorded, marked "(CI)", because a
std over one seed does not exist and the two kinds of ± must not be confused. Cells are never
dropped: failed and diverged seeds are counted in the cell ("failed (2/3 seeds)"), a missing
cell is "—", and a number the runs recorded as not measurable (e.g. RR with a zero i.i.d.
score) is "n/a".
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from medvqa.analysis.methods import BASELINES, method_sort_key
from medvqa.analysis.rows import PROVENANCE_COLUMNS
from medvqa.analysis.summary import COLUMNS, markdown_table, markdown_text
from medvqa.views import presented

log = logging.getLogger(__name__)

FOOTNOTE = (
    "Cells: mean ± std over seeds (ddof 1), n = seeds with a value. “(CI)”: a single seed, "
    "± is its bootstrap CI half-width (resampling cases). failed / diverged (k/n seeds): k of "
    "the cell's n seeds ended so; —: no run; n/a: recorded as not measurable (e.g. RR with a "
    "zero i.i.d. score). “Δ sighted − blank”: the per-seed paired difference between the "
    "run's score with its images and with black images (the blind ablation)."
)
BAD = ("failed", "diverged", "running", "unreadable", "incomplete", "interrupted")
# Runs whose numbers a cell uses: an incomplete run's aggregates are complete where they are
# numbers (its NaN ones are the aggregates over items that could not be scored).
USABLE = ("finished", "incomplete")


def select_rows(frame: pd.DataFrame, warn: bool = True) -> pd.DataFrame:
    """The rows the tables show: runs and extra-image rows, plus the reference rows (zero-shot,
    chance) of a table only where no run of that method exists, one per seed.

    Duplicates (the same table, method and seed from two sweeps) keep a finished one over a
    failed one, then the latest, with a warning naming both files.
    """
    if frame.empty:
        return frame
    runs = frame[frame["kind"] != "reference"]
    refs = frame[frame["kind"] == "reference"]
    have = set(zip(runs["table"], runs["method_id"], strict=True))
    keep = [(t, m) not in have for t, m in zip(refs["table"], refs["method_id"], strict=True)]
    refs = refs.loc[np.array(keep, dtype=bool)]
    # The zero-shot base is scored in every fine-tuning run of a seed: one copy per seed.
    refs = refs.sort_values("source").drop_duplicates(["table", "method_id", "seed"])
    rows = pd.concat([runs, refs], ignore_index=True)
    rank = rows["status"].map(lambda s: 0 if s == "finished" else 1)
    rows = rows.assign(_rank=rank).sort_values(
        ["_rank", "started_at"], ascending=[True, False], na_position="last"
    )
    dup = rows.duplicated(["table", "method_id", "seed"], keep=False)
    for (table, method, seed), group in rows[dup & warn].groupby(["table", "method", "seed"]):
        log.warning(
            "%s / %s / seed %s recorded %d times; keeping %s (also: %s)",
            table,
            method,
            seed,
            len(group),
            group["source"].iloc[0],
            ", ".join(map(str, group["source"].iloc[1:])),
        )
    rows = rows.drop_duplicates(["table", "method_id", "seed"]).drop(columns="_rank")
    return rows.reset_index(drop=True)


def _cell(group: pd.DataFrame, column: str) -> dict[str, object]:
    statuses = group["status"].tolist()
    n_seeds = len(statuses)
    usable = group[group["status"].isin(USABLE)]
    values = pd.to_numeric(usable[column], errors="coerce").to_numpy(dtype=float)
    valid = ~np.isnan(values)
    incomplete = (usable["status"] == "incomplete").to_numpy() & ~valid
    # A seed whose number is missing because items failed leaves the cell without a number:
    # a mean over the other seeds would be a mean over the survivors.
    ok = values[:0] if incomplete.any() else values[valid]
    n = int(ok.size)
    mean = float(ok.mean()) if n else math.nan
    std = float(ok.std(ddof=1)) if n > 1 else math.nan
    ci_col = f"{column} ci_half"
    ci = math.nan
    if n == 1 and ci_col in usable:
        cis = pd.to_numeric(usable[ci_col], errors="coerce").to_numpy(dtype=float)
        cis = cis[valid]
        ci = float(cis[0]) if cis.size else math.nan
    counts = {s: statuses.count(s) for s in BAD if s != "incomplete"}
    counts["incomplete"] = int(incomplete.sum())
    flags = usable.get(f"{column} unreliable", pd.Series(dtype=object))
    n_unreliable = int(sum(v is True or v == 1 for v in flags))
    return {
        "mean": mean,
        "std": std,
        "n": n,
        "n_seeds": n_seeds,
        "ci_half": ci,
        "pm": "std" if n > 1 else ("ci" if not math.isnan(ci) else "none"),
        "n_na": int((~valid & ~incomplete).sum()),
        "n_unreliable": n_unreliable,
        **{f"n_{s}": c for s, c in counts.items()},
        "seeds": ",".join(str(s) for s in sorted(group["seed"].dropna().tolist())),
    }


def role(row: pd.Series) -> str:
    """`method` for a fine-tuning method (or none), `baseline` for a sanity baseline,
    `condition` for a method asked other test questions (another wording): rankings and the
    variance comparison are about methods, so the other two are left out of them."""
    baseline = row.get("baseline")
    is_baseline = isinstance(baseline, str) and baseline != "zero_shot"
    if isinstance(row.get("condition"), str) and not is_baseline:
        return "condition"
    kind = row.get("kind")  # a pass's row (`extra image`, `delta`, ...): not the method itself
    derived = isinstance(kind, str) and kind not in ("run", "reference")
    if is_baseline or derived or row.get("method_id") in BASELINES:
        return "baseline"
    return "method"


def with_role(runs: pd.DataFrame, *roles: str) -> pd.DataFrame:
    """The rows of `runs` whose `role` is one of `roles` (an empty frame keeps its columns)."""
    keep = [role(r) in roles for _, r in runs.iterrows()]
    return runs[pd.Series(keep, index=runs.index, dtype=bool)]


def cell_text(cell: dict[str, object]) -> str:
    """How a cell reads in every table format (CSV wide, Markdown, LaTeX, HTML)."""
    n, n_seeds = int(cell["n"]), int(cell["n_seeds"])
    problems = [
        f"{s} ({cell[f'n_{s}']}/{n_seeds} seed{'s' if n_seeds > 1 else ''})"
        for s in BAD
        if cell.get(f"n_{s}")
    ]
    if n == 0:
        if problems:
            return ", ".join(problems)
        return "n/a" if cell.get("n_na") else "—"
    mean = float(cell["mean"])
    if n > 1:
        text = f"{mean:.3f} ± {float(cell['std']):.3f} (n={n})"
    elif cell["pm"] == "ci":
        text = f"{mean:.3f} ± {float(cell['ci_half']):.3f} (CI)"
    else:
        text = f"{mean:.3f} (n=1)"
    if cell.get("n_na"):
        problems.append(f"n/a ({cell['n_na']}/{n_seeds})")
    if cell.get("n_unreliable"):
        problems.append(f"judge failed its self-check ({cell['n_unreliable']}/{n_seeds})")
    return f"{text}; {', '.join(problems)}" if problems else text


def long_table(frame: pd.DataFrame, columns: Sequence[str] = COLUMNS) -> pd.DataFrame:
    """One row per (table, method, column): mean, std, n, CI half-width, status counts, text."""
    rows = select_rows(frame)
    out = []
    if rows.empty:
        return pd.DataFrame(
            columns=["table", "method", "method_id", "column", "mean", "std", "n", "text"]
        )
    first = {m: i for i, m in enumerate(dict.fromkeys(rows["method_id"]))}
    for (table, method_id), group in rows.groupby(["table", "method_id"], sort=False):
        meta = group.iloc[0]
        for column in columns:
            cell = _cell(group, column)
            out.append(
                {
                    "table": table,
                    "setting": meta["setting"],
                    "shift": meta["shift"],
                    "shift_kind": meta["shift_kind"],
                    "model": meta["model"],
                    "method": meta["method"],
                    "method_id": method_id,
                    "kind": meta["kind"],
                    "role": role(meta),
                    "column": column,
                    **cell,
                    "text": cell_text(cell),
                    "_order": method_sort_key(method_id, first),
                }
            )
    long = _fill_missing(pd.DataFrame(out))
    long = long.sort_values(["table", "_order"], kind="stable").drop(columns="_order")
    return long.reset_index(drop=True)


def _fill_missing(long: pd.DataFrame) -> pd.DataFrame:
    """A method run in some tables gets a "—" row in the others (of the same model), so a
    missing cell reads as missing instead of the row silently not being there."""
    filler = []
    for (model, _), group in long.groupby(["model", "method_id"], sort=False):
        meta = group.iloc[0]
        for table, tgroup in long[long["model"] == model].groupby("table", sort=False):
            if table in set(group["table"]):
                continue
            t = tgroup.iloc[0]
            for column in dict.fromkeys(long["column"]):
                filler.append(
                    {
                        **{k: t[k] for k in ("table", "setting", "shift", "shift_kind", "model")},
                        **{k: meta[k] for k in ("method", "method_id", "kind")},
                        "role": meta["role"],
                        "column": column,
                        "mean": math.nan,
                        "std": math.nan,
                        "n": 0,
                        "n_seeds": 0,
                        "ci_half": math.nan,
                        "pm": "none",
                        "n_na": 0,
                        **{f"n_{s}": 0 for s in BAD},
                        "seeds": "",
                        "text": "—",
                        "_order": meta["_order"],
                    }
                )
    return pd.concat([long, pd.DataFrame(filler)], ignore_index=True) if filler else long


def wide_tables(long: pd.DataFrame, columns: Sequence[str] = COLUMNS) -> dict[str, pd.DataFrame]:
    """Per table: methods (paper order) × `columns` (the six headline ones), cells as text."""
    tables: dict[str, pd.DataFrame] = {}
    for table, group in long.groupby("table", sort=True):
        wide = group.pivot(index="method", columns="column", values="text")
        order = list(dict.fromkeys(group["method"]))
        cols = [c for c in columns if c in wide.columns]
        tables[str(table)] = wide.loc[order, cols].reset_index()
    return tables


def view_tables(frame: pd.DataFrame) -> dict[str, dict[str, pd.DataFrame]]:
    """Per beyond-accuracy view that some run recorded: per table, methods × the view's
    columns (cells as in the main tables: mean ± std over seeds, or one seed's CI)."""
    out: dict[str, dict[str, pd.DataFrame]] = {}
    for name, view in presented().items():
        labels = view.columns(frame)
        if not labels:
            continue
        # The methods' runs (failed ones too: their cells say so) and the references that
        # have the view's figures (the zero-shot base); not the extra evaluations and deltas.
        has_values = frame[list(labels)].apply(pd.to_numeric, errors="coerce").notna().any(axis=1)
        shown = frame[(frame["kind"] == "run") | ((frame["kind"] == "reference") & has_values)]
        renamed = shown.rename(
            columns={**labels, **{f"{c}_ci_half": f"{lab} ci_half" for c, lab in labels.items()}}
        )
        order = list(labels.values())
        out[name] = wide_tables(long_table(renamed, order), order)
    return out


def provenance_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per table and provenance field (code, versions, data, base weights, judge): the
    distinct values its runs recorded. A table whose runs differ in one is warned about: its
    cells may compare numbers from different code, packages, data or judges."""
    columns = ["table", "field", "n_values", "values"]
    runs = frame[frame["kind"] == "run"] if not frame.empty else frame
    if runs.empty:
        return pd.DataFrame(columns=columns)
    out = []
    for table, group in runs.groupby("table", sort=True):
        for field in PROVENANCE_COLUMNS:
            values = sorted({str(v) for v in group.get(field, pd.Series()).dropna()})
            out.append({"table": table, "field": field, "n_values": len(values), "values": values})
            if len(values) > 1:
                log.warning("table %s mixes %d %s values: %s", table, len(values), field, values)
    return pd.DataFrame(out, columns=columns)


def issues_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Every run that did not finish: where, what, and the error it recorded."""
    cols = ["table", "method", "seed", "status", "diverged_step", "error", "source"]
    if frame.empty:
        return pd.DataFrame(columns=cols)
    bad = frame[(frame["kind"] == "run") & frame["status"].isin(BAD)]
    return bad[cols].sort_values(["table", "method", "seed"]).reset_index(drop=True)


# The speed table's columns: (header, the record's perf/ or metrics key). Generation sums the
# job's passes (zero-shot, after training, extra images): rows over seconds.
PERF_COLUMNS = (
    ("fit s", "perf/fit/seconds"),
    ("samples/s", "perf/fit/samples_per_s"),
    ("steady samples/s", "perf/fit/steady_samples_per_s"),
    ("MFU", "perf/fit/steady_mfu"),
    ("fit peak GiB", "perf/fit/peak_allocated_gib"),
    ("plan GiB", "plan/train_gib"),
)
GENERATION = "perf/generate/"
PLAN_WALL_HOURS = "plan/wall_hours"  # planning.cost.cost_metrics


def perf_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per job: what it measured of itself (results.json `perf`), with the device it
    ran on and the plan's memory and time estimates, so slow or memory-hungry jobs stand out. A
    figure a job did not record (no GPU: no peak; no known peak FLOPs: no MFU) is NaN."""
    cols = ["table", "method", "seed", "device", "rehearsal"]
    heads = [head for head, _ in PERF_COLUMNS]
    runs = frame[frame["kind"] == "run"] if not frame.empty else frame
    extra = ["generated rows/s", "job s", "plan job s", "job / plan"]
    if runs.empty or not any(str(c).startswith("perf/") for c in runs.columns):
        return pd.DataFrame(columns=[*cols, *heads, *extra])
    out = runs[cols].copy()
    for head, key in PERF_COLUMNS:
        out[head] = runs.get(key, math.nan)
    passes = runs.filter(regex=f"^{re.escape(GENERATION)}.*/rows$").columns
    rows = runs[passes].sum(axis=1, min_count=1)
    taken = runs[[c.removesuffix("rows") + "seconds" for c in passes]].sum(axis=1, min_count=1)
    out["generated rows/s"] = rows / taken
    out["job s"] = runs.get("duration_s", math.nan)
    # The plan's estimate of the job's GPU time on its GPUs (task=plan, recorded at the
    # pre-flight check: CUDA fits only), and how far the job was from it.
    out["plan job s"] = runs.get(PLAN_WALL_HOURS, math.nan) * 3600
    out["job / plan"] = out["job s"] / out["plan job s"]
    return out.sort_values(["table", "method", "seed"]).reset_index(drop=True)


# --- writers -----------------------------------------------------------------------------

_LATEX_ESCAPES = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}
_LATEX_SYMBOLS = {
    "±": r"$\pm$",
    "³": r"\textsuperscript{3}",
    "—": "---",
    "·": r"$\cdot$",
    "Δ": r"$\Delta$",
    "−": r"$-$",
    "“": "``",
    "”": "''",
    "∅": r"$\emptyset$",
}


def latex_escape(text: str) -> str:
    out = "".join(_LATEX_ESCAPES.get(ch, ch) for ch in str(text))
    for symbol, tex in _LATEX_SYMBOLS.items():
        out = out.replace(symbol, tex)
    return out


def to_latex(table: pd.DataFrame, caption: str) -> str:
    """A booktabs table: closed and open column groups, each i.i.d. / OoD / RR."""
    head = r"\multicolumn{3}{c}{closed} & \multicolumn{3}{c}{open}"
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        r"\small",
        rf"\caption{{{latex_escape(caption)}}}",
        r"\begin{tabular}{l" + "r" * (table.shape[1] - 1) + "}",
        r"\toprule",
        rf" & {head} \\",
        r"\cmidrule(lr){2-4} \cmidrule(lr){5-7}",
        r"method & i.i.d. & OoD & RR & i.i.d. & OoD & RR \\",
        r"\midrule",
    ]
    for _, row in table.iterrows():
        lines.append(" & ".join(latex_escape(v) for v in row.tolist()) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}", ""]
    return "\n".join(lines)


def slug(name: str) -> str:
    keep = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)
    return keep.strip("_") or "table"


def write_tables(
    long: pd.DataFrame, issues: pd.DataFrame, out_dir: Path, note: str | None = None
) -> dict[str, Path]:
    """tables_long.csv (numbers), tables_wide.csv and tables.md / tables.tex (all shifts), plus
    one .md/.tex per shift under tables/, and issues.csv (failed/diverged runs). `note` (a
    report of rehearsals only: REHEARSAL_NOTE) heads every table and caption: a table copied
    into a paper takes it along."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tables").mkdir(exist_ok=True)
    paths = {
        "long_csv": out_dir / "tables_long.csv",
        "wide_csv": out_dir / "tables_wide.csv",
        "markdown": out_dir / "tables.md",
        "latex": out_dir / "tables.tex",
        "issues_csv": out_dir / "issues.csv",
    }
    long.to_csv(paths["long_csv"], index=False)
    tables = wide_tables(long)
    wide_all = (
        pd.concat(
            [t.assign(table=name)[["table", *t.columns]] for name, t in tables.items()],
            ignore_index=True,
        )
        if tables
        else pd.DataFrame(columns=["table", "method", *COLUMNS])
    )
    wide_all.to_csv(paths["wide_csv"], index=False)
    md = ["# Results per shift", ""]
    tex = [r"% needs \usepackage{booktabs}", ""]
    lead = f"**{markdown_text(note)}**\n\n" if note else ""
    for name, table in tables.items():
        part_md = f"## {markdown_text(name)}\n\n{lead}{markdown_table(table)}\n\n{FOOTNOTE}\n"
        part_tex = to_latex(table, f"{note + '. ' if note else ''}{name}. {FOOTNOTE}")
        (out_dir / "tables" / f"{slug(name)}.md").write_text(part_md)
        (out_dir / "tables" / f"{slug(name)}.tex").write_text(part_tex)
        md.append(part_md)
        tex.append(part_tex)
    md += ["## Runs that did not finish", ""]
    md.append(markdown_table(issues) if not issues.empty else "None: every run finished.")
    paths["markdown"].write_text("\n".join(md) + "\n")
    paths["latex"].write_text("\n".join(tex))
    issues.to_csv(paths["issues_csv"], index=False)
    return paths
