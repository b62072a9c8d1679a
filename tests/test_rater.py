"""Human rater study (medvqa.analysis.rater, CLI medvqa.cli.rater): export sampling, rating validation, correlations."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from medvqa.analysis.rater.analysis import analyze, read_items, read_ratings
from medvqa.analysis.rater.export import export
from medvqa.analysis.rater.study import SHEET_HTML, RatingError
from medvqa.cli.rater import main
from medvqa.scoring.metrics.traditional import bleu1, exact_match, ref_word_precision, token_f1

WORDS = [
    "liver",
    "lung",
    "kidney",
    "heart",
    "brain",
    "spleen",
    "left",
    "right",
    "upper",
    "lower",
    "lobe",
    "mass",
    "nodule",
]


def _predictions(path: Path, n: int = 80) -> pd.DataFrame:
    """A predictions JSONL like generation.py writes: every 5th open answer is an exact match."""
    rng = np.random.default_rng(3)
    rows = []
    for i in range(n):
        answer = " ".join(rng.choice(WORDS, 3, replace=False))
        if i % 5 == 0:
            pred = answer.upper() + "."  # exact match after normalisation
        else:
            pred = " ".join(rng.choice(WORDS, int(rng.integers(1, 5)), replace=False))
        rows.append(
            {
                "id": f"r{i:03d}",
                "split": "test_iid" if i < 60 else "test_ood",
                "model": "abc",
                "question": f"Where is finding {i}?",
                "answer": answer,
                "prediction": pred,
                "answer_type": "closed" if i % 4 == 0 else "open",
                "candidates": ["yes", "no"] if i % 4 == 0 else None,
                "judge_score": float(rng.integers(1, 6)),
            }
        )
    frame = pd.DataFrame(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return frame


@pytest.mark.heavy
def test_export_is_seeded_and_excludes_exact_matches(tmp_path: Path) -> None:
    preds = _predictions(tmp_path / "p.jsonl")
    a = export(tmp_path / "p.jsonl", tmp_path / "a", n=20, seed=0)
    b = export(tmp_path / "p.jsonl", tmp_path / "b", n=20, seed=0)
    c = export(tmp_path / "p.jsonl", tmp_path / "c", n=20, seed=1)
    assert list(a["id"]) == list(b["id"])
    assert list(a["id"]) != list(c["id"])
    assert (tmp_path / "a" / "items.jsonl").read_text() == (
        tmp_path / "b" / "items.jsonl"
    ).read_text()
    by_id = preds.set_index("id")
    assert len(set(a["id"])) == 20
    for rid in a["id"]:
        row = by_id.loc[rid]
        assert row["answer_type"] == "open"
        assert exact_match(row["prediction"], row["answer"]) == 0.0
    # the sample does not depend on the order the file was written in
    shuffled = preds.sample(frac=1.0, random_state=0)
    (tmp_path / "q.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in shuffled.to_dict("records"))
    )
    assert list(export(tmp_path / "q.jsonl", tmp_path / "d", n=20, seed=0)["id"]) == list(a["id"])


def test_export_writes_sheet_page_and_scored_items(tmp_path: Path) -> None:
    preds = _predictions(tmp_path / "p.jsonl").set_index("id")
    export(tmp_path / "p.jsonl", tmp_path / "s", n=10, seed=0, split="test_ood")
    sheet = pd.read_csv(tmp_path / "s" / "rating_sheet.csv", keep_default_na=False)
    assert list(sheet.columns) == ["id", "question", "ground_truth", "prediction", "score"]
    assert (sheet["score"] == "").all()
    items = read_items(tmp_path / "s")
    assert list(items.index) == list(sheet["id"])
    assert set(items["split"]) == {"test_ood"}
    # only 20 ood rows, 15 open, 3 of them exact -> 12 candidates, 10 drawn
    assert len(items) == 10
    for rid, item in items.iterrows():
        pred, ans = preds.loc[rid, "prediction"], preds.loc[rid, "answer"]
        assert item["metric:bleu1"] == pytest.approx(bleu1(pred, ans))
        assert item["metric:ref_word_precision"] == pytest.approx(ref_word_precision(pred, ans))
        assert item["metric:f1"] == pytest.approx(token_f1(pred, ans))
        assert item["metric:judge_score"] == preds.loc[rid, "judge_score"]
        assert "metric:rouge_l" in items.columns
    page = (tmp_path / "s" / "rating_sheet.html").read_text()
    assert "http://" not in page and "https://" not in page  # self-contained
    assert all(rid in page for rid in items.index)


def test_export_errors(tmp_path: Path) -> None:
    _predictions(tmp_path / "p.jsonl")
    with pytest.raises(RatingError, match="split 'val'"):
        export(tmp_path / "p.jsonl", tmp_path / "x", split="val")
    with pytest.raises(RatingError, match="no prediction records"):
        export(tmp_path / "missing.jsonl", tmp_path / "x")
    with pytest.raises(RatingError, match="--judge-column"):
        export(tmp_path / "p.jsonl", tmp_path / "x", judge_columns=["judge_nope"])


def test_export_takes_all_when_pool_is_small(tmp_path: Path, caplog) -> None:
    _predictions(tmp_path / "p.jsonl")
    items = export(tmp_path / "p.jsonl", tmp_path / "s", n=500, seed=0, text_metrics=False)
    assert len(items) == 80 * 3 // 4 - 12  # open rows minus the exact matches among them
    assert "rating all of them" in caplog.text


# --------------------------------------------------------------------------------------------
# analyze
# --------------------------------------------------------------------------------------------


def _study(directory: Path, metrics: dict[str, list[float]]) -> list[str]:
    """An export directory whose items carry the given metric scores."""
    directory.mkdir(parents=True, exist_ok=True)
    n = len(next(iter(metrics.values())))
    ids = [f"i{k}" for k in range(n)]
    with (directory / "items.jsonl").open("w") as fh:
        for k, rid in enumerate(ids):
            item = {"id": rid, "split": "test", "question": "q", "answer": "a", "prediction": "p"}
            item["scores"] = {m: v[k] for m, v in metrics.items()}
            fh.write(json.dumps(item) + "\n")
    return ids


def _ratings(path: Path, ids: list[str], scores: list[object]) -> Path:
    pd.DataFrame(
        {"id": ids, "question": "q", "ground_truth": "a", "prediction": "p", "score": scores}
    ).to_csv(path, index=False)
    return path


@pytest.mark.heavy
def test_monotone_ratings_give_perfect_correlations(tmp_path: Path) -> None:
    levels = [0.0, 0.25, 0.5, 0.75, 1.0] * 4
    ids = _study(
        tmp_path / "s",
        {"f1": levels, "reverse": [1 - v for v in levels], "flat": [0.3] * len(levels)},
    )
    human = [int(1 + 4 * v) for v in levels]  # a monotone transform of f1
    files = [_ratings(tmp_path / f"r{k}.csv", ids, human) for k in range(2)]
    table = analyze(tmp_path / "s", files, tmp_path / "out").set_index(["kind", "a", "b"])
    hm = table.loc["human_vs_metric"]
    assert hm.loc[("human_mean", "f1"), "kendall_tau_b"] == pytest.approx(1.0)
    assert hm.loc[("human_mean", "f1"), "spearman_rho"] == pytest.approx(1.0)
    assert hm.loc[("human_mean", "reverse"), "kendall_tau_b"] == pytest.approx(-1.0)
    assert np.isnan(hm.loc[("human_mean", "flat"), "kendall_tau_b"])  # constant: no ranking
    assert table.loc[("rater_vs_rater", "r0", "r1"), "kendall_tau_b"] == pytest.approx(1.0)
    for name in ("correlations.csv", "correlations.md", "heatmap.png", "heatmap_raters.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    png = (tmp_path / "out" / "scatter.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_known_partial_correlations_and_pair_mean(tmp_path: Path) -> None:
    # metric order 1<2<3<4, rater A ranks 1,3,2,4: 5 concordant, 1 discordant pair ->
    # tau-b = 4/6; Spearman 1 - 6*sum(d^2)/(n(n^2-1)) = 1 - 6*2/60 = 0.8.
    ids = _study(tmp_path / "s", {"m": [0.1, 0.2, 0.3, 0.4]})
    a = _ratings(tmp_path / "A.csv", ids, [1, 3, 2, 4])
    b = _ratings(tmp_path / "B.csv", ids, [1, 2, 3, 4])
    c = _ratings(tmp_path / "C.csv", ids, [4, 3, 2, 1])
    table = analyze(tmp_path / "s", [a, b, c], tmp_path / "out").set_index(["kind", "a", "b"])
    assert table.loc[("rater_vs_metric", "A", "m"), "kendall_tau_b"] == pytest.approx(4 / 6)
    assert table.loc[("rater_vs_metric", "A", "m"), "spearman_rho"] == pytest.approx(0.8)
    assert table.loc[("rater_vs_metric", "C", "m"), "kendall_tau_b"] == pytest.approx(-1.0)
    pairs = table.loc["rater_vs_rater"]
    assert pairs.loc[("A", "B"), "kendall_tau_b"] == pytest.approx(4 / 6)
    assert pairs.loc[("B", "C"), "spearman_rho"] == pytest.approx(-1.0)
    mean = table.loc["rater_pairs_mean"].iloc[0]
    assert mean["kendall_tau_b"] == pytest.approx(pairs["kendall_tau_b"].mean())
    assert mean["spearman_rho"] == pytest.approx(pairs["spearman_rho"].mean())
    # mean human score = (A + B + C) / 3 = [2, 8/3, 7/3, 3]: ranks 1,3,2,4 again vs m
    assert table.loc[("human_vs_metric", "human_mean", "m"), "kendall_tau_b"] == pytest.approx(
        4 / 6
    )
    md = (tmp_path / "out" / "correlations.md").read_text()
    assert "4 items, 3 rater(s)" in md


@pytest.mark.parametrize(
    ("scores", "edit", "message"),
    [
        ([1, 2, 3], None, r"r\.csv: row 3 \(id 'i2'\) has score '6'"),
        ([1, 2, 3], "unknown", r"r\.csv: row 2: id 'zz' is not one of the exported items"),
        ([1, 2, 3], "blank", r"r\.csv: row 1 \(id 'i0'\) has no score"),
        ([1, 2, 3], "text", r"r\.csv: row 2 \(id 'i1'\) has score 'good'"),
        ([1, 2, 3], "half", r"row 1 \(id 'i0'\) has score '2.5'"),
        ([1, 2, 3], "twice", r"row 3: id 'i0' is rated twice"),
        ([1, 2, 3], "short", r"r\.csv: 1 item\(s\) not rated"),
        ([1, 2, 3], "header", r"r\.csv: header .* lacks 'id' and/or 'score'"),
    ],
)
def test_bad_rating_files_name_file_and_row(
    tmp_path: Path, scores: list[object], edit: str | None, message: str
) -> None:
    ids = _study(tmp_path / "s", {"m": [0.1, 0.2, 0.3]})
    rows_ids, rows = list(ids), list(scores)
    if edit is None:
        rows[2] = 6
    elif edit == "unknown":
        rows_ids[1] = "zz"
    elif edit == "blank":
        rows[0] = ""
    elif edit == "text":
        rows[1] = "good"
    elif edit == "half":
        rows[0] = 2.5
    elif edit == "twice":
        rows_ids[2] = "i0"
    elif edit == "short":
        rows_ids, rows = rows_ids[:2], rows[:2]
    path = _ratings(tmp_path / "r.csv", rows_ids, rows)
    if edit == "header":
        pd.read_csv(path).rename(columns={"score": "rating"}).to_csv(path, index=False)
    with pytest.raises(RatingError, match=message):
        read_ratings(path, ids)


def test_spreadsheet_style_integers_are_accepted(tmp_path: Path) -> None:
    ids = _study(tmp_path / "s", {"m": [0.1, 0.2]})
    path = tmp_path / "r.csv"
    path.write_text(
        '\ufeffid,question,ground_truth,prediction,score\ni0,q,a,"p, q",4.0\ni1,q,a,p, 2 \n'
    )
    assert list(read_ratings(path, ids)) == [4.0, 2.0]


@pytest.mark.heavy
def test_cli_end_to_end_and_exit_status(tmp_path: Path) -> None:
    _predictions(tmp_path / "p.jsonl")
    study = tmp_path / "study"
    assert (
        main(["export", str(tmp_path / "p.jsonl"), "--n", "12", "--seed", "0", "--out", str(study)])
        == 0
    )
    sheet = pd.read_csv(study / "rating_sheet.csv", keep_default_na=False)
    items = read_items(study)
    files = []
    for k in range(3):  # raters who track F1, with rater-specific offsets
        filled = sheet.assign(
            score=[int(min(5, 1 + round(4 * f) + (k % 2))) for f in items["metric:f1"]]
        )
        files.append(tmp_path / f"rater{k}.csv")
        filled.to_csv(files[-1], index=False)
    out = tmp_path / "res"
    assert main(["analyze", str(study), "--ratings", *map(str, files), "--out", str(out)]) == 0
    table = pd.read_csv(out / "correlations.csv")
    assert set(table["kind"]) == {
        "human_vs_metric",
        "rater_vs_metric",
        "rater_vs_rater",
        "rater_pairs_mean",
    }
    assert {"judge_score", "ref_word_precision", "f1", "bleu1"} <= set(table["b"])
    bad = _ratings(tmp_path / "bad.csv", list(items.index), [9] * len(items))
    assert main(["analyze", str(study), "--ratings", str(bad), "--out", str(out)]) == 2


_HARNESS = r"""
// Minimal DOM stand-in: run the page's script, pick scores, capture the downloaded CSV.
const fs = require("fs");
const [page, picks] = [fs.readFileSync(process.argv[2], "utf8"), JSON.parse(process.argv[3])];
const data = page.match(/<script type="application\/json" id="data">([\s\S]*?)<\/script>/)[1];
const code = page.match(/<script>([\s\S]*?)<\/script>/)[1];
const all = [];
function el(tag) {
  const e = {tag, children: [], listeners: {}, textContent: "", value: "", className: "",
    classList: {add() {}}, append(...c) { this.children.push(...c); },
    addEventListener(t, f) { this.listeners[t] = f; },
    click() { (this.listeners.click || (() => {}))(); }, remove() {}};
  all.push(e); return e;
}
const byId = {data: Object.assign(el("script"), {textContent: data}), items: el("div"),
  progress: el("span"), rater: Object.assign(el("input"), {value: "Dr. X"}), download: el("button")};
let saved = null;
global.document = {getElementById: id => byId[id], createElement: el, body: el("body")};
global.Blob = class { constructor(parts) { saved = parts.join(""); } };
global.URL = {createObjectURL: () => "blob:x"};
global.confirm = () => true;
eval(code);
for (const [i, s] of Object.entries(picks)) {
  all.find(e => e.name === "s" + i && String(e.value) === String(s)).listeners.change();
}
byId.download.click();
process.stdout.write(JSON.stringify({csv: saved, file: all.find(e => e.download).download}));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_html_page_downloads_a_valid_ratings_file(tmp_path: Path) -> None:
    preds = _predictions(tmp_path / "p.jsonl")
    # markup and CSV specials in a prediction must survive the page and the download
    preds.loc[1, "prediction"] = 'left "lobe", </script><b>x</b>'
    (tmp_path / "p.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in preds.to_dict("records"))
    )
    study = tmp_path / "study"
    export(tmp_path / "p.jsonl", study, n=60, seed=0, text_metrics=False)
    ids = list(read_items(study).index)
    (tmp_path / "h.js").write_text(_HARNESS)
    picks = {str(i): 1 + i % 5 for i in range(len(ids))}
    out = subprocess.run(
        ["node", str(tmp_path / "h.js"), str(study / SHEET_HTML), json.dumps(picks)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    result = json.loads(out.stdout)
    assert result["file"] == "ratings_Dr_X.csv"
    (tmp_path / "filled.csv").write_text(result["csv"])
    scores = read_ratings(tmp_path / "filled.csv", ids)
    assert list(scores) == [1 + i % 5 for i in range(len(ids))]
    filled = pd.read_csv(tmp_path / "filled.csv")
    assert 'left "lobe", </script><b>x</b>' in set(filled["prediction"])


def test_an_export_killed_midway_leaves_the_earlier_sheet_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sheet, its page and items.jsonl are swapped in together: a sheet sent to raters
    always matches the items it is analysed against. The export folder is never analyze's
    --out (that would delete the items)."""
    from medvqa.analysis.rater import export as export_module

    _predictions(tmp_path / "p.jsonl")
    study = tmp_path / "study"
    export(tmp_path / "p.jsonl", study, n=10, seed=0, text_metrics=False)
    before = {p.name: p.read_bytes() for p in study.iterdir()}

    def killed(sheet: pd.DataFrame) -> str:
        raise KeyboardInterrupt("killed while writing the page")

    monkeypatch.setattr(export_module, "rating_page", killed)
    with pytest.raises(KeyboardInterrupt):
        export(tmp_path / "p.jsonl", study, n=10, seed=1, text_metrics=False)
    assert {p.name: p.read_bytes() for p in study.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl", "study"]
    ratings = _ratings(tmp_path / "r.csv", list(read_items(study).index), [3] * 10)
    assert main(["analyze", str(study), "--ratings", str(ratings), "--out", str(study)]) == 2
    assert {p.name: p.read_bytes() for p in study.iterdir()} == before
