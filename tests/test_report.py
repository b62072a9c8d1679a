"""medvqa-report: aggregation of run records into tables, figures and an HTML report.

Most tests write results.json records in the schema medvqa.record writes (status, seed,
choices, resolved config, flat metrics) with numbers drawn at random, and check the tables
against means/stds computed here from those numbers. One slow test aggregates a real multirun
with a diverged method and a failed job.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest

from medvqa.analysis.aggregate import collect
from medvqa.analysis.figures import methods_with_rr, palette
from medvqa.analysis.report import build_report, log_report
from medvqa.analysis.rows import record_rows
from medvqa.analysis.tables import long_table, write_tables
from medvqa.analysis.wandb_runs import collect_wandb, wandb_run_record
from medvqa.cli.report import main
from tests.conftest import CONF, run_main

PEFT_LABELS = {
    "none": "No Finetune",
    "full": "Full Finetune",
    "prompt_tuning": "Prompt",
    "lora": "LoRA",
    "ia3": "(IA)³",
}


def headline(rng: np.random.Generator, with_ci: bool = True) -> dict[str, float]:
    """Random headline numbers (RR consistent with the i.i.d./OoD scores) and CI half-widths."""
    m: dict[str, float] = {}
    for kind, score in (("closed", "closed_acc"), ("open", "open_f1")):
        iid, ood = rng.uniform(0.4, 0.9), rng.uniform(0.1, 0.6)
        m[f"test_iid/{score}"], m[f"test_ood/{score}"] = iid, ood
        m[f"robustness/rr_{kind}"] = ood / iid
        if with_ci:
            for key in (f"test_iid/{score}", f"test_ood/{score}", f"robustness/rr_{kind}"):
                m[f"{key}_ci_half"] = rng.uniform(0.01, 0.1)
    return m


def write_record(
    root: Path,
    peft: str = "lora",
    seed: int = 0,
    status: str = "finished",
    metrics: dict[str, Any] | None = None,
    shift: str = "modality",
    experiment: str | None = None,
    baseline: str | None = None,
    label: str | None = None,
    peft_label: str | None = None,
    extra: dict[str, Any] | None = None,
    extra_images: list[str] | None = None,
) -> Path:
    """A results.json as medvqa.record.RunRecord writes it (only the keys aggregation reads)."""
    choices = {
        "dataset": "synthetic",
        "shift": shift.split("_")[0],
        "peft": peft,
        "model": "tiny",
        "baseline": baseline,
        "task": "train_eval",
    }
    if experiment:
        choices["experiment"] = experiment
    record = {
        "status": status,
        "seed": seed,
        "choices": choices,
        "metrics": metrics or {},
        "started_at": f"2025-01-01T00:00:{seed:02d}",
        **(extra or {}),
        "config": {
            "shift": {"name": shift},
            "model": {"name": "tiny"},
            "peft": {"name": peft, "label": peft_label or PEFT_LABELS.get(peft, peft)},
            "evaluation": {"primary_closed": "closed_acc", "primary_open": "open_f1"},
            "data": {"extra_eval_images": extra_images or []},
            "label": label,
            "seed": seed,
        },
    }
    path = root / f"{shift}-{peft}-{baseline}-{label}-{status}" / f"seed={seed}" / "results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return path


def cell(long: pd.DataFrame, method: str, column: str, table: str = "synthetic_modality"):
    row = long[(long["table"] == table) & (long["method"] == method) & (long["column"] == column)]
    assert len(row) == 1, (method, column, long[["table", "method"]].drop_duplicates())
    return row.iloc[0]


def test_cells_are_mean_and_std_over_seeds(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    values = {s: headline(rng) for s in (123, 124, 125)}
    for seed, m in values.items():
        write_record(tmp_path, "lora", seed, metrics=m)
    long = long_table(collect([tmp_path]))
    for column, key in (
        ("closed i.i.d.", "test_iid/closed_acc"),
        ("open RR", "robustness/rr_open"),
    ):
        expected = np.array([m[key] for m in values.values()])
        got = cell(long, "LoRA", column)
        assert got["n"] == 3
        assert got["mean"] == pytest.approx(expected.mean())
        assert got["std"] == pytest.approx(expected.std(ddof=1))
        assert got["text"] == f"{expected.mean():.3f} ± {expected.std(ddof=1):.3f} (n=3)"


def test_single_seed_shows_its_ci_half_width(tmp_path: Path) -> None:
    m = headline(np.random.default_rng(1))
    write_record(tmp_path, "ia3", 0, metrics=m)
    got = cell(long_table(collect([tmp_path])), "(IA)³", "closed OoD")
    assert got["pm"] == "ci"
    assert (
        got["text"]
        == f"{m['test_ood/closed_acc']:.3f} ± {m['test_ood/closed_acc_ci_half']:.3f} (CI)"
    )
    write_record(tmp_path, "full", 0, metrics=headline(np.random.default_rng(2), with_ci=False))
    got = cell(long_table(collect([tmp_path])), "Full Finetune", "closed OoD")
    assert got["pm"] == "none" and got["text"].endswith("(n=1)")


@pytest.mark.heavy
def test_failed_diverged_and_missing_cells_are_marked(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    ok = {s: headline(rng) for s in (0, 1)}
    for seed, m in ok.items():
        write_record(tmp_path, "lora", seed, metrics=m)
    write_record(tmp_path, "lora", 2, status="failed", extra={"error": "RuntimeError: CUDA OOM"})
    write_record(
        tmp_path,
        "full",
        0,
        status="diverged",
        extra={"diverged_step": 7, "error": "loss became nan at optimiser step 7"},
    )
    write_record(tmp_path, "full", 1, status="failed", extra={"error": "ValueError: boom"})
    # A method run on another shift only: a "—" row here, not a silently missing one.
    write_record(tmp_path, "prompt_tuning", 0, metrics=headline(rng), shift="age")
    runs = collect([tmp_path])
    long = long_table(runs)
    lora = cell(long, "LoRA", "closed RR")
    expected = np.array([m["robustness/rr_closed"] for m in ok.values()])
    assert lora["n"] == 2 and lora["n_seeds"] == 3 and lora["n_failed"] == 1
    assert lora["mean"] == pytest.approx(expected.mean())
    assert lora["text"].endswith("; failed (1/3 seeds)")
    assert cell(long, "Full Finetune", "open i.i.d.")["text"] == (
        "failed (1/2 seeds), diverged (1/2 seeds)"
    )
    assert cell(long, "Prompt", "closed i.i.d.")["text"] == "—"
    assert cell(long, "LoRA", "closed i.i.d.", table="synthetic_age")["text"] == "—"

    report = build_report(runs, tmp_path / "out")
    issues = pd.read_csv(tmp_path / "out" / "issues.csv")
    assert sorted(issues["status"]) == ["diverged", "failed", "failed"]
    assert "RuntimeError: CUDA OOM" in set(issues["error"])
    assert issues.loc[issues["status"] == "diverged", "diverged_step"].item() == 7
    md = (tmp_path / "out" / "tables.md").read_text()
    assert "failed (1/2 seeds), diverged (1/2 seeds)" in md and "ValueError: boom" in md
    assert "CUDA OOM" in report.files["html"].read_text()


def test_a_text_column_without_values_shows_the_dash_not_none() -> None:
    """The issues table of failed runs only: `diverged_step` holds None in every row, a text
    column to pandas, which would print "None"."""
    from medvqa.analysis.report import _frame_html

    html = _frame_html(pd.DataFrame({"status": ["failed"], "diverged_step": [None]}))
    assert "None" not in html and "<td>—</td>" in html


@pytest.mark.heavy
def test_rows_in_paper_order_then_unknown_labels(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    write_record(tmp_path, "lora", 0, metrics=headline(rng), label="my method")
    for peft in ("ia3", "lora", "full", "none", "prompt_tuning"):
        write_record(tmp_path, peft, 0, metrics=headline(rng))
    write_record(
        tmp_path,
        "lora",
        0,
        metrics=headline(rng),
        baseline="most_frequent",
        label="Most Freq.",
    )
    tables = build_report(collect([tmp_path]), tmp_path / "out").tables
    assert list(tables["synthetic_modality"]["method"]) == [
        "No Finetune",
        "Full Finetune",
        "Prompt",
        "LoRA",
        "(IA)³",
        "Most Freq.",
        "my method",
    ]


def test_zero_shot_reference_is_the_no_finetune_row_unless_a_run_exists(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    zs = {s: headline(rng) for s in (0, 1)}
    for seed in (0, 1):
        own = headline(rng)
        for peft in ("lora", "full"):  # both runs of a seed score the same base model
            write_record(
                tmp_path,
                peft,
                seed,
                metrics={**own, **{f"zero_shot/{k}": v for k, v in zs[seed].items()}},
            )
    long = long_table(collect([tmp_path]))
    got = cell(long, "No Finetune", "closed OoD")
    expected = np.array([zs[s]["test_ood/closed_acc"] for s in (0, 1)])
    assert got["n"] == 2 and got["mean"] == pytest.approx(expected.mean())
    assert got["std"] == pytest.approx(expected.std(ddof=1))
    # The run's own numbers are not mixed with the reference ones.
    assert "zero_shot/test_iid/closed_acc" not in collect([tmp_path]).columns

    none_run = headline(rng)
    write_record(tmp_path, "none", 0, metrics=none_run)
    got = cell(long_table(collect([tmp_path])), "No Finetune", "closed OoD")
    assert got["n"] == 1 and got["mean"] == pytest.approx(none_run["test_ood/closed_acc"])


@pytest.mark.heavy
def test_an_incomplete_seed_leaves_its_missing_cells_without_a_number(tmp_path: Path) -> None:
    """A seed whose score is NaN because items could not be scored makes the cell say so
    instead of averaging the other seeds; its complete scores still count."""
    rng = np.random.default_rng(12)
    complete, partial = headline(rng), headline(rng)
    for key in ("test_ood/closed_acc", "robustness/rr_closed"):
        partial[key] = None
    write_record(tmp_path, "lora", 0, metrics=complete)
    write_record(
        tmp_path,
        "lora",
        1,
        status="incomplete",
        metrics=partial,
        extra={"error": "3 item(s) could not be scored", "failed_items": 3},
    )
    frame = collect([tmp_path])
    long = long_table(frame)
    ood = cell(long, "LoRA", "closed OoD")
    assert math.isnan(ood["mean"]) and ood["text"] == "incomplete (1/2 seeds)"
    iid = cell(long, "LoRA", "closed i.i.d.")
    expected = [complete["test_iid/closed_acc"], partial["test_iid/closed_acc"]]
    assert iid["n"] == 2 and iid["mean"] == pytest.approx(np.mean(expected))
    issues = build_report(frame, tmp_path / "out").issues
    assert list(issues["status"]) == ["incomplete"]
    assert "could not be scored" in issues["error"].iloc[0]


@pytest.mark.heavy
def test_provenance_is_listed_per_table_and_mixed_versions_warned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rng = np.random.default_rng(13)
    for seed, torch_version in ((0, "2.13.0"), (1, "2.14.0")):
        prov = {
            "git": {"commit": "a" * 40, "dirty": False},
            "versions": {"python": "3.11.9", "torch": torch_version},
            "data": {"fingerprint": "d1"},
            "model": {"weights_fingerprint": "w1"},
            "metrics": {
                "traditional": {},
                "judge": {"judge_id": "openai:m:generate", "rubrics": {"open": "r1"}},
            },
        }
        write_record(tmp_path, "lora", seed, metrics=headline(rng), extra={"provenance": prov})
    with caplog.at_level("WARNING"):
        report = build_report(collect([tmp_path]), tmp_path / "out")
    prov = report.provenance.set_index("field")
    assert prov.loc["versions", "n_values"] == 2
    assert prov.loc["code", "values"] == ["aaaaaaaaaaaa"]
    assert prov.loc["judge", "values"] == ["openai:m:generate [open=r1]"]
    assert prov.loc["data", "n_values"] == prov.loc["model_weights", "n_values"] == 1
    assert "mixes 2 versions values" in caplog.text
    assert (tmp_path / "out" / "provenance.csv").is_file()
    assert "Provenance" in report.files["html"].read_text()


def test_rows_are_joined_on_method_ids_not_display_labels(tmp_path: Path) -> None:
    """A label edited between sweeps keeps the seeds in one cell, named as the newest record
    names it; one baseline run with two methods is two rows, each with a name of its own."""
    rng = np.random.default_rng(11)
    write_record(tmp_path / "a", "lora", 0, metrics=headline(rng), peft_label="LoRA")
    write_record(tmp_path / "b", "lora", 1, metrics=headline(rng), peft_label="LoRA (r=16)")
    for peft in ("lora", "full"):
        write_record(tmp_path, peft, 0, metrics=headline(rng), baseline="no_image")
    long = long_table(collect([tmp_path]))
    assert cell(long, "LoRA (r=16)", "closed RR")["n"] == 2
    ids = long.drop_duplicates("method_id").set_index("method_id")["method"].to_dict()
    assert ids == {
        "lora": "LoRA (r=16)",
        "lora+no_image": "No Image (lora+no_image)",
        "full+no_image": "No Image (full+no_image)",
    }


def test_config_variants_are_separate_rows_not_seeds(tmp_path: Path) -> None:
    rng = np.random.default_rng(10)
    for lr in (1e-4, 1e-3):
        for seed in (0, 1):
            path = write_record(tmp_path / str(lr), "lora", seed, metrics=headline(rng))
            record = json.loads(path.read_text())
            record["config"]["peft"]["lr"] = lr
            record["config"]["dataset"] = {"seed": seed}  # seed-derived: not a variant
            record["config"]["logger"] = {"csv": {"save_dir": str(path.parent)}}
            path.write_text(json.dumps(record))
    long = long_table(collect([tmp_path]))
    methods = list(dict.fromkeys(long["method"]))
    assert methods == ["LoRA [peft.lr=0.0001]", "LoRA [peft.lr=0.001]"]
    assert set(long["n"]) == {2}


def resolved_config(overrides: list[str], tmp_path: Path) -> dict[str, Any]:
    """The config a run with these overrides records (resolved, as RunRecord writes it)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict

    from tests.conftest import compose

    cfg = compose(overrides, tmp_path / "cache")
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(tmp_path / "run")
    HydraConfig.instance().set_config(cfg)  # `${hydra:...}` resolves as in a run
    with open_dict(cfg):
        del cfg["hydra"]
    return OmegaConf.to_container(cfg, resolve=True)


@pytest.mark.heavy
def test_variant_labels_name_only_the_settings_a_user_sets(tmp_path: Path) -> None:
    """A probe's two LoRA runs, one with `data.limit.train=32 metric=[traditional,judge]`: the
    rows are told apart by what the user set, never by Hydra's `_target_` nor by the judge
    metric's `cfg` (a copy of the `judge` node, `cfg: ${judge}`) that the user did not set."""
    rng = np.random.default_rng(17)
    runs = {
        "plain": ["peft=lora"],
        "probe": ["peft=lora", "data.limit.train=32", "metric=[traditional,judge]"],
    }
    for name, overrides in runs.items():
        path = write_record(tmp_path / "runs" / name, "lora", 0, metrics=headline(rng))
        record = json.loads(path.read_text())
        record["config"] = resolved_config(overrides, tmp_path)
        path.write_text(json.dumps(record))
    frame = collect([tmp_path / "runs"])
    shown = sorted(frame.loc[frame["kind"] == "run", "method"])
    assert shown == [
        "LoRA [data.limit.train=32, metric=[traditional,judge]]",
        "LoRA [data.limit.train=None, metric=[traditional]]",
    ]
    assert set(frame.loc[frame["kind"] == "run", "method_id"]) == {
        "lora [data.limit.train=32, metric=[traditional,judge]]",
        "lora [data.limit.train=None, metric=[traditional]]",
    }
    build_report(frame, tmp_path / "out")
    page = (tmp_path / "out" / "report.html").read_text().replace("<wbr>", "")  # wrap points
    assert "LoRA [data.limit.train=32, metric=[traditional,judge]]" in page
    for internal in ("_target_", "metric.judge.cfg", "api_key_env"):
        assert internal not in page


def test_a_variant_is_named_by_the_key_a_user_overrides(tmp_path: Path) -> None:
    """Where an interpolated copy differs because its source does, the source is named
    (`judge.model`, `evaluation.bootstrap.samples`); a class by its node; and where only
    Hydra's own keys tell runs apart, those are shown rather than merging the runs."""
    rng = np.random.default_rng(18)

    def variant(name: str, **config: Any) -> None:
        path = write_record(tmp_path / name, "lora", 0, metrics=headline(rng))
        record = json.loads(path.read_text())
        record["config"].update(config)
        path.write_text(json.dumps(record))

    for model, samples in (("m1", 500), ("m2", 2000)):
        variant(
            model,
            judge={"model": model, "api_key_env": "KEY"},
            evaluation={"bootstrap": {"samples": samples}},
            metric={
                "judge": {"_target_": "J", "cfg": {"model": model, "api_key_env": "KEY"}},
                "closed_set": {"_target_": "C", "bootstrap": {"samples": samples}},
            },
        )
    for builder in ("medvqa.zoo.tiny.TinyLlavaBuilder", "medvqa.zoo.smollm2.SmolBuilder"):
        variant(
            builder,
            model={"name": "tiny", "builder": {"_target_": builder}},
            shift={"name": "builders"},
        )
    for partial in (True, False):
        variant(
            f"p{partial}", task={"_target_": "t", "_partial_": partial}, shift={"name": "partial"}
        )
    frame = collect([tmp_path])
    runs = frame[frame["kind"] == "run"]
    assert sorted(runs.loc[runs["shift"] == "modality", "method"]) == [
        "LoRA [evaluation.bootstrap.samples=2000, judge.model='m2']",
        "LoRA [evaluation.bootstrap.samples=500, judge.model='m1']",
    ]
    assert sorted(runs.loc[runs["shift"] == "builders", "method"]) == [
        "LoRA [model.builder=SmolBuilder]",
        "LoRA [model.builder=TinyLlavaBuilder]",
    ]
    assert sorted(runs.loc[runs["shift"] == "partial", "method"]) == [
        "LoRA [task._partial_=False]",
        "LoRA [task._partial_=True]",
    ]


def test_extra_image_rows_come_from_their_prefix(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    sighted, blank = headline(rng), headline(rng)
    write_record(
        tmp_path,
        "lora",
        0,
        baseline="blind",
        extra_images=["blank"],
        metrics={
            **sighted,
            **{f"blank/{k}": v for k, v in blank.items()},
            **{f"delta_blank/{k}": sighted[k] - blank[k] for k in sighted if k.startswith("test_")},
        },
    )
    long = long_table(collect([tmp_path]))
    assert cell(long, "LoRA (blind baseline)", "closed i.i.d.")["mean"] == pytest.approx(
        sighted["test_iid/closed_acc"]
    )
    assert cell(long, "LoRA (blind baseline), blank image", "closed i.i.d.")["mean"] == (
        pytest.approx(blank["test_iid/closed_acc"])
    )
    delta = "LoRA (blind baseline), Δ sighted − blank"
    assert cell(long, delta, "open OoD")["mean"] == pytest.approx(
        sighted["test_ood/open_f1"] - blank["test_ood/open_f1"]
    )
    # A difference has no RR of its own, and none of these rows is a method to rank.
    assert cell(long, delta, "closed RR")["text"] == "n/a"
    assert set(long.loc[long["method"].str.contains("blank"), "role"]) == {"baseline"}
    # The RR figure draws no bar (and no legend entry) for a row that has no RR.
    assert delta not in methods_with_rr(long)
    assert "LoRA (blind baseline), blank image" in methods_with_rr(long)
    # pdflatex without unicode packages: every symbol the rows and footnote use is escaped.
    tex = write_tables(long, pd.DataFrame(), tmp_path / "out")["latex"].read_text()
    assert tex.isascii() and r"$\Delta$ sighted $-$ blank" in tex


@pytest.mark.parametrize("n", [3, 11, 25])
def test_palette_never_repeats_a_colour(n: int) -> None:
    assert len(set(palette(n))) == n


@pytest.mark.heavy
def test_files_figures_and_self_contained_html(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    shifts = ("modality", "age", "corruption_low", "corruption_high")
    for shift in shifts:
        for peft in ("lora", "full", "ia3"):
            for seed in (0, 1):
                m = headline(rng)
                m["test_ood/question_type=organ/closed_acc"] = rng.uniform()
                m["test_iid/question_type=organ/closed_acc"] = rng.uniform(0.5, 1)
                m["test_ood/question_type=size/closed_acc"] = rng.uniform()
                write_record(tmp_path, peft, seed, metrics=m, shift=shift)
    runs = collect([tmp_path])
    report = build_report(runs, tmp_path / "out")
    out = tmp_path / "out"
    for name in (
        "rr_per_method_and_shift",
        "method_rank_by_rr",
        "std_shifts_vs_methods",
        "corruption_vs_realistic",
        "breakdown_synthetic_age_question_type",
    ):
        assert (out / "figures" / f"{name}.png").stat().st_size > 1000, name
        assert (out / "figures" / f"{name}.pdf").is_file()
    assert not report.skipped
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == len(report.figures)
    assert not re.search(r"src=\"(?!data:)", page)  # nothing linked from outside the file
    assert "synthetic_corruption_high" in page and "closed RR" in page

    # std between shifts (per method) and between methods (per shift), from the records.
    rr = runs[runs["kind"] == "run"].groupby(["method", "table"])["closed RR"].mean().unstack()
    var = report.variance[report.variance["score"] == "closed"].set_index("over")["std"]
    for method, std in rr.std(axis=1, ddof=1).items():
        assert var[method] == pytest.approx(std)
    for table, std in rr.std(axis=0, ddof=1).items():
        assert var[table] == pytest.approx(std)
    ranks = report.ranks[report.ranks["score"] == "closed"].set_index("method")
    expected_rank = rr.rank(axis=0, ascending=False)
    assert ranks.loc[expected_rank.index, expected_rank.columns].to_numpy() == pytest.approx(
        expected_rank.to_numpy()
    )
    assert ranks["mean rank"].to_numpy() == pytest.approx(
        ranks[list(rr.columns)].mean(axis=1).to_numpy()
    )

    tex = (out / "tables.tex").read_text()
    assert r"\toprule" in tex and r"\midrule" in tex and r"\bottomrule" in tex
    assert r"(IA)\textsuperscript{3}" in tex and r"$\pm$" in tex and "synthetic\\_age" in tex
    wide = pd.read_csv(out / "tables_wide.csv")
    assert set(wide["table"]) == {f"synthetic_{s}" for s in shifts}
    long = pd.read_csv(out / "tables_long.csv")
    assert {"mean", "std", "n", "ci_half", "n_failed", "n_diverged", "text"} <= set(long.columns)


def test_breakdown_rr_is_per_seed_ratio_then_mean(tmp_path: Path) -> None:
    from medvqa.analysis.figures import breakdown_cells

    pairs = {0: (0.8, 0.4), 1: (0.5, 0.45)}
    for seed, (iid, ood) in pairs.items():
        write_record(
            tmp_path,
            "lora",
            seed,
            metrics={
                **headline(np.random.default_rng(seed)),
                "test_iid/question_type=organ/closed_acc": iid,
                "test_ood/question_type=organ/closed_acc": ood,
            },
        )
    cells = breakdown_cells(collect([tmp_path])).set_index(["value", "score", "method"])
    got = cells.loc[("organ", "closed", "LoRA")]
    assert got["ood"] == pytest.approx(np.mean([o for _, o in pairs.values()]))
    assert got["rr"] == pytest.approx(np.mean([o / i for i, o in pairs.values()]))


def test_wandb_run_becomes_a_record() -> None:
    m = headline(np.random.default_rng(8))
    run = SimpleNamespace(
        id="abc123",
        state="crashed",
        created_at="2025-01-01T00:00:00",
        config={
            "seed": 3,
            "label": None,
            "_wandb": {"x": 1},
            "peft": {"name": "lora", "label": "LoRA"},
            "shift": {"name": "age"},
            "dataset": {"_target_": "medvqa.data.sources.synthetic.SyntheticVQA"},
            "model": {"name": "tiny"},
        },
        summary={**m, "_step": 4, "_runtime": 9.0, "report/table": {"_type": "table-file"}},
    )
    record = wandb_run_record(run)
    assert record["status"] == "failed" and record["seed"] == 3
    assert "_step" not in record["metrics"] and "report/table" not in record["metrics"]
    (row,) = record_rows(record, "wandb:team/proj/abc123")
    assert row["setting"] == "synthetic_age" and row["method"] == "LoRA"
    assert row["closed RR"] == pytest.approx(m["robustness/rr_closed"])

    api = SimpleNamespace(runs=lambda path: [run])
    assert collect_wandb("team/proj", api=api)["source"].tolist() == ["wandb:team/proj/abc123"]

    # A diverged run ends cleanly (W&B: finished); the status it logged is what counts.
    run.state = "finished"
    run.summary = {**m, "medvqa/status": "diverged", "medvqa/diverged_step": 7}
    record = wandb_run_record(run)
    assert record["status"] == "diverged" and record["diverged_step"] == 7
    assert not any(k.startswith("medvqa/") for k in record["metrics"])


def test_wandb_source_offline_fails_with_the_fix(tmp_path: Path) -> None:
    def runs(path: str) -> list:
        raise ConnectionError("no network")

    with pytest.raises(RuntimeError, match=r"WANDB_API_KEY.*results\.json"):
        collect_wandb("team/proj", api=SimpleNamespace(runs=runs))
    with pytest.raises(ValueError, match="ENTITY/PROJECT"):
        collect_wandb("just-a-project", api=SimpleNamespace(runs=runs))


@pytest.mark.heavy
def test_log_report_to_csv_and_offline_wandb(tmp_path: Path, monkeypatch) -> None:
    from lightning.pytorch.loggers import CSVLogger, WandbLogger

    for seed in (0, 1):
        write_record(tmp_path / "runs", "lora", seed, metrics=headline(np.random.default_rng(seed)))
    write_record(tmp_path / "runs", "full", 0, status="failed", extra={"error": "boom"})
    report = build_report(collect([tmp_path / "runs"]), tmp_path / "out")
    csv = CSVLogger(save_dir=str(tmp_path / "csv"), name="r", version="")
    assert log_report(report, [csv]) == 1 + 1 + len(report.figures)
    logged = pd.read_csv(Path(csv.log_dir) / "report" / "synthetic_modality.csv")
    assert list(logged["method"]) == ["Full Finetune", "LoRA"]

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    wb = WandbLogger(project="medvqa-test", save_dir=str(tmp_path / "wb"), offline=True)
    try:
        assert log_report(report, [wb]) == 1 + 1 + len(report.figures)
    finally:
        from medvqa.tracking import finish

        finish([wb])
    assert list((tmp_path / "wb" / "wandb").glob("offline-run-*"))


@pytest.mark.heavy
def test_cli(tmp_path: Path, capsys) -> None:
    write_record(tmp_path / "runs", "lora", 0, metrics=headline(np.random.default_rng(9)))
    (tmp_path / "runs" / "broken").mkdir()
    (tmp_path / "runs" / "broken" / "results.json").write_text("{not json")
    assert main([str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0
    issues = pd.read_csv(tmp_path / "out" / "issues.csv")
    assert issues["status"].tolist() == ["unreadable"] and "broken" in issues["source"].item()
    assert main([str(tmp_path / "nope"), "--out", str(tmp_path / "o2")]) == 2
    assert "no such directory" in " ".join(capsys.readouterr().out.split())  # rich wraps lines
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([str(empty), "--out", str(tmp_path / "o3")]) == 2


@pytest.mark.slow
def test_real_multirun_with_a_diverged_method_and_a_failed_job(
    tmp_path: Path, cache_dir: Path, tiny_model_dir: Path
) -> None:
    sweep = tmp_path / "sweep"
    proc = run_main(
        [
            "-m",
            "debug=smoke",
            "logger=csv",
            "task.references=[]",
            "peft=full,none",
            "peft.lr=1e12",
            "seed=0,1",
            f"hydra.sweep.dir={sweep}",
        ],
        tmp_path / "unused",
        cache_dir,
    )
    # The sweep runs every job and exits 1, naming a job that did not finish (the diverged
    # ones: docs/configuration.md#statuses-and-exit-codes).
    assert proc.returncode == 1 and "the job is diverged" in proc.stderr, proc.stderr[-3000:]
    # A third seed of No Finetune fails (an OoD value the data lacks): a single run re-raises.
    failed = run_main(
        [
            "debug=smoke",
            "logger=csv",
            "task.references=[]",
            "peft=none",
            "seed=2",
            "shift.ood_values=[pet]",
        ],
        tmp_path / "failed",
        cache_dir,
    )
    assert failed.returncode != 0

    assert main([str(sweep), str(tmp_path / "failed"), "--out", str(tmp_path / "out")]) == 0
    records = [json.loads(p.read_text()) for p in tmp_path.rglob("results.json")]
    done = [r for r in records if r["status"] == "finished"]
    assert sorted(r["config"]["peft"]["name"] for r in done) == ["none", "none"]
    long = pd.read_csv(tmp_path / "out" / "tables_long.csv")
    for column, key in (("closed i.i.d.", "test_iid/closed_acc"), ("open OoD", "test_ood/open_f1")):
        values = np.array([r["metrics"][key] for r in done], dtype=float)
        got = cell(long, "No Finetune", column)
        assert got["mean"] == pytest.approx(values.mean())
        assert got["std"] == pytest.approx(values.std(ddof=1), nan_ok=True)
        assert got["n_failed"] == 1 and "failed (1/3 seeds)" in got["text"]
    assert cell(long, "Full Finetune", "closed RR")["text"] == "diverged (2/2 seeds)"
    issues = pd.read_csv(tmp_path / "out" / "issues.csv")
    assert sorted(issues["status"]) == ["diverged", "diverged", "failed"]
    assert "pet" in issues.loc[issues["status"] == "failed", "error"].item()


@pytest.mark.heavy
def test_a_runs_status_goes_to_the_wandb_summary(tmp_path: Path) -> None:
    """W&B only knows whether the process ended cleanly; the record's status is in the summary,
    where the W&B source of the report reads it."""
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    from medvqa.tracking import finish, log_status

    logger = WandbLogger(offline=True, save_dir=str(tmp_path), project="t")
    try:
        log_status([logger], "incomplete", failed_items=3)
        summary = logger.experiment.summary
        assert summary["medvqa/status"] == "incomplete" and summary["medvqa/failed_items"] == 3
    finally:
        finish([logger])
    assert wandb.run is None


@pytest.mark.heavy
def test_paired_method_differences_come_from_the_scored_tables(tmp_path: Path) -> None:
    """Two methods on the same questions: A − B per split with a paired case-bootstrap CI,
    from the scored tables next to the records; a side with a failed item gets no number."""
    rng = np.random.default_rng(15)
    ids = [f"q{i}" for i in range(40)]
    columns = {"traditional": {"ci_columns": {"closed_acc": ["closed_correct", "closed"]}}}
    correct = {}
    for peft, p in (("lora", 0.8), ("full", 0.5)):
        path = write_record(
            tmp_path, peft, 0, metrics=headline(rng), extra={"provenance": {"metrics": columns}}
        )
        correct[peft] = (rng.random(80) < p).astype(float)
        pd.DataFrame(
            {
                "id": ids * 2,
                "split": ["test_iid"] * 40 + ["test_ood"] * 40,
                "case_id": [f"c{i // 4}" for i in range(40)] * 2,
                "answer_type": "closed",
                "closed_correct": correct[peft],
            }
        ).to_parquet(path.parent / "scores.parquet")
    paired = build_report(collect([tmp_path]), tmp_path / "out").paired
    assert set(paired["split"]) == {"test_iid", "test_ood"} and set(paired["score"]) == {
        "closed_acc"
    }
    iid = paired[paired["split"] == "test_iid"].iloc[0]
    assert (iid["method_a"], iid["method_b"], iid["n"]) == ("Full Finetune", "LoRA", 40)
    assert iid["diff"] == pytest.approx(correct["full"][:40].mean() - correct["lora"][:40].mean())
    assert iid["ci_lo"] <= iid["diff"] <= iid["ci_hi"]
    assert (tmp_path / "out" / "paired_differences.csv").is_file()

    lora = next(tmp_path.rglob("modality-lora-*/seed=0/scores.parquet"))
    table = pd.read_parquet(lora)
    table.loc[3, "closed_correct"] = np.nan  # an item the judge could not score
    table.to_parquet(lora)
    paired = build_report(collect([tmp_path]), tmp_path / "out").paired
    assert list(paired["split"]) == ["test_ood"]  # the i.i.d. pair has no number

    # The interval follows the run's evaluation.bootstrap; 0 samples turns it off.
    from medvqa.statistics.bootstrap import paired_bootstrap_diff

    def set_bootstrap(boot: dict[str, Any]) -> None:
        for path in tmp_path.rglob("results.json"):
            data = json.loads(path.read_text())
            data["config"]["evaluation"]["bootstrap"] = boot
            path.write_text(json.dumps(data))

    set_bootstrap({"samples": 300, "seed": 7, "level": 0.9})
    ood = build_report(collect([tmp_path]), tmp_path / "out").paired.iloc[0]
    cases = np.array([f"c{i // 4}" for i in range(40)], dtype=object)
    expected = paired_bootstrap_diff(
        correct["full"][40:],
        cases,
        correct["lora"][40:],
        cases,
        paired=True,
        B=300,
        seed=7,
        level=0.9,
    )
    assert (ood["ci_lo"], ood["ci_hi"]) == pytest.approx((expected.lo, expected.hi))
    set_bootstrap({"samples": 0})
    assert build_report(collect([tmp_path]), tmp_path / "out").paired.empty


def _closed_set_run(root: Path, name: str, predictions: list[str], **record: Any) -> Path:
    """A RoboSurg-VQA-like run scored by the closed-set family: one task q6 (labels no/yes),
    eight test questions on four sequences, the truth yes,no | no,no | yes,no | no,no."""
    truth = ["yes", "no", "no", "no", "yes", "no", "no", "no"]
    wording = record.pop("test_wording", "canonical")
    limit = record.pop("limit", None)
    path = write_record(root / name, **record)
    data = json.loads(path.read_text())
    data["config"]["dataset"] = {
        "_target_": "medvqa.data.sources.robosurg_vqa.RoboSurgVqa",
        "test_wording": wording,
    }
    data["config"]["data"]["limit"] = {"test_iid": limit}
    data["config"]["evaluation"]["primary_closed"] = "cs_primary_macro_f1"
    data["config"]["metric"] = {
        "closed_set": {
            "_target_": "medvqa.scoring.metrics.closed_set.ClosedSetMetric",
            "tasks": ["q6"],
            "primary": ["q6"],
        }
    }
    data["provenance"] = {"metrics": {"closed_set": {}}}
    path.write_text(json.dumps(data))
    n = limit or len(truth)
    pd.DataFrame(
        {
            "id": [f"f{i}|q6" for i in range(n)],
            "split": "test_iid",
            "case_id": [f"test|site1/video{i // 2}" for i in range(n)],
            "answer_type": "closed",
            "answer": truth[:n],
            "candidates": [["no", "yes"]] * n,
            "question_id": "q6",
            "cs_choice": predictions[:n],
            "cs_correct": [float(p == t) for p, t in zip(predictions, truth[:n], strict=False)],
            "cs_invalid": 0.0,
        }
    ).to_parquet(path.parent / "scores.parquet")
    return path


def test_conditions_and_baselines_get_the_closed_set_familys_paired_delta(tmp_path: Path) -> None:
    """A macro-F1 headline is not a per-row mean: the closed-set family recomputes it on each
    resample of sequences. Known answers (F1 = 2tp / (2tp + fp + fn), mean over no/yes):
    the truth itself 1; all "no" (yes: 0; no: 12/14) 3/7; "yes" on the second row, else "no"
    (yes: 0/(0+1+2) = 0; no: 10/13) 5/13."""
    truth = ["yes", "no", "no", "no", "yes", "no", "no", "no"]
    all_no = ["no"] * 8
    one_yes = ["no", "yes", *["no"] * 6]
    heads = {"canonical": 1.0, "heldout": 3 / 7, "frequent": 5 / 13}
    runs = {
        "canonical": (truth, {}),
        "heldout": (all_no, {"test_wording": "heldout_paraphrase"}),
        "frequent": (one_yes, {"baseline": "most_frequent"}),
        "capped": (one_yes, {"baseline": "most_frequent", "limit": 6}),
    }
    for name, (predictions, options) in runs.items():
        metrics = {"test_iid/cs_primary_macro_f1": heads.get(name, 0.5)}
        _closed_set_run(tmp_path, name, predictions, metrics=metrics, **options)
    frame = collect([tmp_path])
    names = dict(zip(frame["method_id"], frame["method"], strict=True))
    assert names["lora [test_wording=heldout_paraphrase]"] == (
        "LoRA [test_wording=heldout_paraphrase]"
    )
    assert frame.loc[frame["method_id"] == "lora", "condition"].isna().all()  # the default

    paired = build_report(frame, tmp_path / "out").paired.set_index(["pair", "method_b"])
    cond = paired.loc[("condition − default", "LoRA")]
    assert cond["method_a"] == "LoRA [test_wording=heldout_paraphrase]" and cond["n"] == 8
    assert cond["diff"] == pytest.approx(3 / 7 - 1)
    assert (cond["value_a"], cond["value_b"]) == pytest.approx((3 / 7, 1.0))
    # Every resample's delta is <= 0 (the truth scores at least as well as "no" everywhere),
    # and it is 0 on the 1/16 of draws without sequences 0 and 2 (no "yes": both score
    # (0 + 1) / 2), more than the 2.5% above the upper bound: the bound is exactly 0.
    assert cond["ci_lo"] <= cond["diff"] and cond["ci_hi"] == 0.0
    baselines = paired.loc["method − baseline"]
    assert len(baselines) == 1  # the capped baseline answered other questions: no number
    base = baselines.iloc[0]
    assert base["method_a"] == "LoRA" and "limit" in baselines.index[0]
    assert base["diff"] == pytest.approx(1 - 5 / 13)
    assert base["ci_lo"] == 0.0 and base["diff"] <= base["ci_hi"] <= 1  # the same 1/16 of draws


def test_a_condition_is_named_from_the_recorded_config_and_eval_runs_are_no_variants(
    tmp_path: Path,
) -> None:
    """The wording is a condition when it is not the dataset class's default ("canonical");
    `task=eval` of a run's weights with nothing else changed is that run, not a variant."""
    rng = np.random.default_rng(16)
    dataset = {"_target_": "medvqa.data.sources.robosurg_vqa.RoboSurgVqa"}
    for name, wording, task in (
        ("train", "canonical", None),
        ("again", "canonical", {"name": "eval", "from_run": "somewhere"}),
        ("wrong", "wrong_question", {"name": "eval", "from_run": "somewhere"}),
    ):
        path = write_record(tmp_path / name, "lora", 0, metrics=headline(rng))
        record = json.loads(path.read_text())
        record["config"]["dataset"] = {**dataset, "test_wording": wording}
        record["config"]["task"] = task or {"name": "train_eval"}
        record["config"]["eval"] = {"from_run": "somewhere"} if task else None
        path.write_text(json.dumps(record))
    frame = collect([tmp_path])
    assert sorted(frame.loc[frame["kind"] == "run", "method"]) == [
        "LoRA",
        "LoRA",
        "LoRA [test_wording=wrong_question]",
    ]
    long = long_table(frame)
    assert set(long.loc[long["method"] == "LoRA [test_wording=wrong_question]", "role"]) == {
        "condition"
    }
    # A record from code whose dataset class cannot be imported: every wording is named.
    path = next(tmp_path.rglob("train/**/results.json"))
    record = json.loads(path.read_text())
    record["config"]["dataset"]["_target_"] = "elsewhere.Gone"
    assert record_rows(record, str(path))[0]["method_id"] == "lora [test_wording=canonical]"


@pytest.mark.parametrize("group", ["peft", "baseline"])
def test_table_names_are_the_labels_the_configs_ship(tmp_path: Path, group: str) -> None:
    """A method's or baseline's display name is written once, as `label:` in its YAML: a record
    carrying it shows it, and a record without one (an older run) gets the same name."""
    import yaml

    from medvqa.analysis.methods import method_name

    for path in sorted((CONF / group).glob("*.yaml")):
        label = (yaml.safe_load(path.read_text()) or {}).get("label")
        if not label:
            continue
        method_id = path.stem if group == "peft" else f"lora+{path.stem}"
        assert method_name(method_id, label) == label
        assert method_name(method_id) == label, f"{path}: the report names it otherwise"


def test_a_family_node_recorded_before_the_one_bootstrap_setting_keeps_its_resamples() -> None:
    """Records from before the families took `${evaluation.bootstrap}` name `B`, `seed`,
    `level` in the family's node: those still decide its resamples when the report rebuilds
    it; a newer node takes the run's setting; a family without one is left as it is."""
    from medvqa.analysis.paired import _with_bootstrap
    from medvqa.scoring.metrics.closed_set import ClosedSetMetric
    from medvqa.scoring.metrics.traditional import TraditionalMetric

    run = {"samples": 300, "seed": 7, "level": 0.9}
    old = _with_bootstrap(ClosedSetMetric, {"B": 500, "seed": 1}, run)
    assert old == {"bootstrap": {"samples": 500, "seed": 1, "level": 0.9}}
    new = _with_bootstrap(ClosedSetMetric, {}, run)
    assert new["bootstrap"] == run
    plain = {"open_metrics": None}
    assert _with_bootstrap(TraditionalMetric, plain, run) == plain


def test_runs_before_and_after_the_builders_moved_are_one_run() -> None:
    """The builders' `_target_` is part of a run's identity: a record naming the old module
    (`medvqa.models.builders.tiny`) is the same run as one naming `medvqa.zoo.tiny`."""
    from medvqa.analysis.rows import run_identity
    from medvqa.untrusted import CLASS_KEY, plain_values

    def config(target: str) -> dict:  # as the record reader returns it
        return plain_values({"model": {"name": "tiny", "builder": {"_target_": target}}}).value

    old = run_identity(config("medvqa.models.builders.tiny.TinyLlavaBuilder"))
    assert old == run_identity(config("medvqa.zoo.tiny.TinyLlavaBuilder"))
    assert old[f"model.builder.{CLASS_KEY}"] == repr("medvqa.zoo.tiny.TinyLlavaBuilder")
    # A builder that did not move keeps its name (smollm2_causal is not smollm2).
    causal = "medvqa.models.builders.smollm2_causal.SmolLM2CausalBuilder"
    assert run_identity(config(causal))[f"model.builder.{CLASS_KEY}"] == repr(causal)


@pytest.mark.heavy
def test_the_report_puts_the_beyond_accuracy_views_beside_each_method(tmp_path: Path) -> None:
    """Image reliance, paraphrase consistency, option order, calibration and worst subgroups:
    per view a table of methods x its figures per split (mean ± std over seeds), in report.html,
    its own CSV/LaTeX and the loggers; the zero-shot base's row beside the method's (did
    fine-tuning widen a gap?); the figures."""
    from lightning.pytorch.loggers import CSVLogger

    rng = np.random.default_rng(9)
    survive, gaps = {}, {}
    for seed in (0, 1):
        m = headline(rng)
        for split in ("test_iid", "test_ood"):
            value = rng.uniform(0.2, 0.9)
            survive[(seed, split)] = value
            m[f"{split}/reliance_blank_closed_survive"] = value
            m[f"{split}/reliance_blank_closed_correct_independent"] = value / 2
            m[f"{split}/reliance_blank_closed_correct_dependent"] = 0.5 - value / 2
            m[f"{split}/reliance_blank_closed_wrong_dependent"] = 0.25
            m[f"{split}/reliance_blank_closed_wrong_independent"] = 0.25
            m[f"{split}/reliance_blank_open_survive"] = 0.123  # open: not in the table
            m[f"{split}/calibration_closed_ece"] = 0.1 + seed
            gaps[(seed, split)] = -rng.uniform(0, 0.5)
            m[f"{split}/subgroups_modality_worst_gap"] = gaps[(seed, split)]
            m[f"zero_shot/{split}/subgroups_modality_worst_gap"] = -0.05
            for value in ("ct", "mri"):
                m[f"{split}/subgroups_modality={value}_score"] = rng.uniform(0.3, 0.9)
                m[f"{split}/subgroups_modality={value}_score_ci_half"] = 0.05
                m[f"zero_shot/{split}/subgroups_modality={value}_score"] = 0.5
            m[f"zero_shot/{split}/closed_acc"] = 0.5
        m["test_iid~test_ood/consistency_paraphrase_closed_flip_rate"] = 0.25
        m["test_ood/consistency_order_closed_flip_rate"] = 0.1
        path = write_record(tmp_path, "lora", seed, metrics=m, extra_images=["blank"])
        n = 40  # the scored table beside it, with calibration's per-sample columns
        pd.DataFrame(
            {
                "split": ["test_iid", "test_ood"] * (n // 2),
                "id": [f"q{i}" for i in range(n)],
                "answer_type": "closed",
                "calibration_confidence": rng.uniform(0.5, 1, n),
                "calibration_correct": rng.integers(0, 2, n).astype(float),
            }
        ).to_parquet(path.parent / "scores.parquet")
    write_record(tmp_path, "ia3", 0, metrics=headline(rng))  # none of these views
    report = build_report(collect([tmp_path]), tmp_path / "out")
    assert list(report.views) == [
        "Image reliance", "Paraphrase consistency", "Option-order invariance", "Calibration",
        "Worst subgroups",
    ]  # fmt: skip
    (orders,) = report.views["Option-order invariance"].values()
    assert orders.set_index("method").loc["LoRA", "flips closed OoD"].startswith("0.100 ±")
    (table,) = report.views["Image reliance"].values()
    lora = table.set_index("method").loc["LoRA"]
    iid = np.array([survive[(s, "test_iid")] for s in (0, 1)])
    assert lora["survive blank i.i.d."] == f"{iid.mean():.3f} ± {iid.std(ddof=1):.3f} (n=2)"
    assert list(table.columns) == [
        "method", "survive blank i.i.d.", "survive blank OoD",
        "right w/o image blank i.i.d.", "right w/o image blank OoD",
    ]  # fmt: skip
    assert table.set_index("method").loc["(IA)³", "survive blank i.i.d."] in ("—", "n/a")
    (flips,) = report.views["Paraphrase consistency"].values()
    assert flips.set_index("method").loc["LoRA", "flips closed i.i.d.~OoD"].startswith("0.250 ±")
    (calibration,) = report.views["Calibration"].values()
    assert calibration.set_index("method").loc["LoRA", "ECE i.i.d."].startswith("0.600 ±")
    (worst,) = report.views["Worst subgroups"].values()
    rows = worst.set_index("method")
    ood = np.array([gaps[(s, "test_ood")] for s in (0, 1)])
    assert rows.loc["LoRA", "worst gap modality OoD"].startswith(f"{ood.mean():.3f} ±")
    assert rows.loc["No Finetune", "worst gap modality OoD"].startswith("-0.050")
    page = report.files["html"].read_text()
    for view in report.views:
        assert f"<h2>{view}</h2>" in page
    assert "reliance_synthetic_modality_blank" in report.figures  # the quadrant bars
    assert "reliance_synthetic_modality_blank" in page
    assert "calibration_synthetic_modality" in report.figures  # reliability, risk-coverage
    assert {
        "subgroups_synthetic_modality_test_iid",
        "subgroups_synthetic_modality_test_ood",
    } <= set(report.figures)
    logger = CSVLogger(save_dir=str(tmp_path / "csv"), name="r", version="")
    assert log_report(report, [logger]) == 1 + 5 + len(report.figures)  # main, 5 views
    assert (
        Path(logger.log_dir) / "report" / "Worst_subgroups" / "synthetic_modality.csv"
    ).is_file()
    csv = tmp_path / "out" / "tables" / "Image_reliance_synthetic_modality.csv"
    assert (
        pd.read_csv(csv).set_index("method").loc["LoRA", "survive blank OoD"]
        == lora["survive blank OoD"]
    )


@pytest.mark.heavy
def test_a_report_killed_midway_leaves_the_earlier_one_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report is built in a hidden sibling folder and swapped in whole: killed while
    writing, the earlier report stays as it was (never new tables beside old figures), and the
    half-built folder is gone; W&B's offline folder survives a rebuild."""
    from medvqa.analysis import report as report_module

    runs_dir, out = tmp_path / "runs", tmp_path / "out"
    write_record(runs_dir, "lora", 0)
    first = build_report(collect([runs_dir]), out)
    assert first.files["html"] == out / "report.html" and first.files["html"].is_file()
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    (out / "wandb").mkdir()
    (out / "wandb" / "run.log").write_text("an upload")
    write_record(runs_dir, "full", 0)

    def killed(report: Any) -> Path:
        raise KeyboardInterrupt("killed while writing the report")

    monkeypatch.setattr(report_module, "write_html", killed)
    with pytest.raises(KeyboardInterrupt):
        build_report(collect([runs_dir]), out)
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert {k: v for k, v in after.items() if k.parts[0] != "wandb"} == before
    assert not list(tmp_path.glob(".out.building-*"))
    monkeypatch.undo()
    second = build_report(collect([runs_dir]), out)
    assert "Full Finetune" in (out / "tables.md").read_text()
    assert (out / "wandb" / "run.log").read_text() == "an upload"
    assert all(p.is_file() and out in p.parents for p in second.files.values())


# -- rehearsals (random weights: model.random_weights) in a report ----------------------------


def _random_weights(path: Path, value: Any) -> Path:
    """The record at `path`, its run's `model.random_weights` set to `value` (True: a
    rehearsal, as medvqa.record.is_rehearsal reads it)."""
    record = json.loads(path.read_text())
    record["config"]["model"]["random_weights"] = value
    path.write_text(json.dumps(record))
    return path


@pytest.mark.heavy
def test_a_real_runs_label_never_names_the_rehearsal_left_out(tmp_path: Path) -> None:
    """A real run and a rehearsal of the same method and seed differ in `model.random_weights`
    only: they were told apart as variants, and the real run's row, alone in the tables once
    the rehearsal is left out, read "LoRA [model.random_weights=False]"."""
    rng = np.random.default_rng(0)
    runs = tmp_path / "runs"
    real = _random_weights(write_record(runs / "real", seed=1, metrics=headline(rng)), False)
    _random_weights(write_record(runs / "mock", seed=1, metrics=headline(rng)), True)
    report = build_report(collect([runs]), tmp_path / "out")
    assert "1 rehearsal run(s)" in report.rehearsal
    assert set(report.long["method"]) == {"LoRA"}
    assert "random_weights" not in (tmp_path / "out" / "tables.md").read_text()
    alone = build_report(collect([real.parent]), tmp_path / "alone")
    pd.testing.assert_frame_equal(report.long, alone.long)


@pytest.mark.heavy
def test_the_tables_of_a_report_of_rehearsals_only_say_so(tmp_path: Path) -> None:
    """tables.md / tables.tex (and each table's own files) are what gets copied into a paper:
    built from rehearsals only, they carry the note that their scores mean nothing, as
    report.html and a rehearsal's summary.md do."""
    from medvqa.record import REHEARSAL_NOTE

    rng = np.random.default_rng(1)
    for peft in ("lora", "ia3"):
        _random_weights(write_record(tmp_path / "runs", peft, metrics=headline(rng)), "shrunk")
    out = tmp_path / "out"
    build_report(collect([tmp_path / "runs"]), out)
    markdown = (out / "tables.md").read_text()
    assert markdown.count(REHEARSAL_NOTE) == 1  # one table (one shift), one note
    latex = (out / "tables.tex").read_text()
    assert r"\caption{REHEARSAL: random weights (model.random\_weights)" in latex
    assert REHEARSAL_NOTE in (out / "tables" / "synthetic_modality.md").read_text()
    # a real run's report says nothing of the kind
    write_record(tmp_path / "real", metrics=headline(rng))
    build_report(collect([tmp_path / "real"]), tmp_path / "real_out")
    assert "REHEARSAL" not in (tmp_path / "real_out" / "tables.md").read_text()
    assert "REHEARSAL" not in (tmp_path / "real_out" / "tables.tex").read_text()
