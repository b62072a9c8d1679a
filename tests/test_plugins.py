"""Plug-ins register themselves: a dataset or a metric family is one module plus one YAML.

The throwaway plug-ins below live in a temporary folder outside the repository and are found
through MEDVQA_PLUGINS (module) and hydra.searchpath (YAML): no file of medvqa is edited, which
is exactly what adding a dataset or a metric family must take.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra.errors import ConfigCompositionException
from hydra.utils import instantiate

from medvqa import plugins
from tests.conftest import CONF, SMALL_MODEL, compose, run_main

DATASET_MODULE = '''
"""A throwaway dataset: rows.json with one image per row (open and yes/no questions)."""

from pathlib import Path

import pandas as pd

from medvqa.data import records as R
from medvqa.data.annotated import AnnotatedSource, BadRows, read_json_rows
from medvqa.data.cleaning import CleaningLog


class Throwaway(AnnotatedSource):
    name = "throwaway"

    def __init__(
        self,
        root: str | Path,
        cache_dir: str | Path | None = None,
        on_bad_row: str = "error",
        rows_file: str = "rows.json",
    ) -> None:
        super().__init__(root, cache_dir, on_bad_row)
        self.rows_file = rows_file

    def annotation_files(self) -> list[Path]:
        return [self.root / self.rows_file]

    def build(self, bad: BadRows, cleaning: CleaningLog) -> pd.DataFrame:
        path = self.require(self.root / self.rows_file, "rows file")
        out = []
        for _, _, row in self.valid_rows(read_json_rows(path, self.name), path, bad, ["id"]):
            closed = row["answer"] in ("yes", "no")
            out.append({
                R.ID: row["id"], R.IMAGE: row["image"], R.QUESTION: row["question"],
                R.ANSWER: row["answer"], R.ANSWER_TYPE: "closed" if closed else "open",
                R.QUESTION_TYPE: "presence" if closed else "colour",
                R.CANDIDATES: ["yes", "no"] if closed else None,
                R.CASE_ID: row["image"], R.IMAGE_ID: row["image"],
                R.SOURCE_SPLIT: row["split"], "scanner": row["scanner"],
            })
        return pd.DataFrame(out)
'''

METRIC_MODULE = '''
"""A throwaway metric family: the length of the prediction in words."""

import pandas as pd

from medvqa.scoring.metrics.base import MetricFamily
from medvqa.statistics.bootstrap import mean_or_nan


class AnswerLength(MetricFamily):
    name = "answer_length"

    def __init__(self, unit: int = 1) -> None:
        self.unit = unit

    def per_sample(self, preds: pd.DataFrame) -> pd.DataFrame:
        words = preds["prediction"].map(lambda p: len(str(p).split()) / self.unit)
        return pd.DataFrame({"answer_words": words}, index=preds.index)

    def aggregate(self, scored: pd.DataFrame) -> dict[str, float]:
        return {"answer_words": mean_or_nan(scored["answer_words"])}
'''


def _write_plugins(tmp_path: Path) -> tuple[Path, Path]:
    """Modules in tmp/modules, YAML in tmp/conf (a search-path folder with config groups)."""
    modules, conf = tmp_path / "modules", tmp_path / "conf"
    modules.mkdir()
    (modules / "throwaway_dataset.py").write_text(DATASET_MODULE)
    (modules / "throwaway_metric.py").write_text(METRIC_MODULE)
    (conf / "dataset").mkdir(parents=True)
    (conf / "dataset" / "throwaway.yaml").write_text(
        "defaults:\n  - throwaway_schema\n  - _self_\n"
        "root: ${paths.data_dir}/throwaway\ncache_dir: ${paths.cache_dir}\n"
    )
    (conf / "metric").mkdir()
    (conf / "metric" / "answer_length.yaml").write_text(
        "# @package metric.answer_length\ndefaults:\n  - answer_length_schema\n  - _self_\n"
    )
    return modules, conf


def _write_data(root: Path) -> int:
    """rows.json and images: scanners A (i.i.d.) and B (OoD) in every source split."""
    from tests.native import write_image

    rows = []
    for split, n in (("train", 12), ("validate", 4), ("test", 6)):
        for i in range(n):
            image = f"img/{split}{i}.png"
            write_image(root / image, seed=len(rows))
            rows.append(
                {
                    "id": f"{split}-{i}",
                    "image": image,
                    "question": "is there a lesion?" if i % 2 else "what colour is it?",
                    "answer": ("yes" if i % 4 == 1 else "no") if i % 2 else "red",
                    "split": split,
                    "scanner": "B" if i % 3 == 0 else "A",
                }
            )
    (root / "rows.json").write_text(json.dumps(rows))
    return len(rows)


@pytest.fixture
def throwaway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    modules, conf = _write_plugins(tmp_path)
    monkeypatch.syspath_prepend(str(modules))
    monkeypatch.setenv(plugins.ENV_VAR, "throwaway_dataset,throwaway_metric")
    import medvqa.config

    medvqa.config.register()  # what `import medvqa.config` does in a fresh process
    yield {"modules": modules, "conf": conf, "data": tmp_path / "data"}
    for kind, name in (("dataset", "throwaway"), ("metric", "answer_length")):
        plugins._REGISTRY[kind].pop(name, None)
    for module in ("throwaway_dataset", "throwaway_metric"):
        sys.modules.pop(module, None)
        plugins._imported.discard(module)
    plugins._DISCOVERED.clear()  # the next test with the same $MEDVQA_PLUGINS imports them again


def _searchpath(conf: Path) -> str:
    return f"hydra.searchpath=[file://{conf}]"


def test_builtin_plugins_are_discovered() -> None:
    def builtin(kind: str) -> dict[str, type]:  # tests may register classes of their own
        return {
            n: c for n, c in plugins.registered(kind).items() if c.__module__.startswith("medvqa.")
        }

    datasets = builtin("dataset")
    assert {p.stem for p in (CONF / "dataset").glob("*.yaml")} == set(datasets)
    assert {p.stem for p in (CONF / "metric").glob("*.yaml")} == set(builtin("metric"))
    # The schema is the constructor: parameters and defaults come from the class, once.
    slake = plugins.schema(datasets["slake"])()
    assert slake._target_ == "medvqa.data.sources.slake.Slake"
    assert slake.languages == ["en"] and slake.clean_closed is True


def test_two_classes_cannot_share_a_name() -> None:
    class Impostor:  # stands in for a second class that claims a taken name
        name = "slake"

    with pytest.raises(plugins.PluginError, match="'slake' is taken by"):
        plugins.register("dataset", Impostor)


def test_throwaway_dataset_composes_and_checks_keys(throwaway: dict[str, Path]) -> None:
    n_rows = _write_data(throwaway["data"])
    args = [
        _searchpath(throwaway["conf"]),
        "dataset=throwaway",
        f"dataset.root={throwaway['data']}",
        "shift.field=scanner",
        "shift.ood_values=[B]",
    ]
    cfg = compose(args, throwaway["data"] / "cache")
    source = instantiate(cfg.dataset)
    assert type(source).__name__ == "Throwaway" and source.rows_file == "rows.json"
    assert len(source.table()) == n_rows
    # Its options are its cache key without being listed anywhere else.
    assert source.params() == {"rows_file": "rows.json"}
    with pytest.raises(ConfigCompositionException, match="rows_fil"):
        compose([*args, "dataset.rows_fil=x.json"])


def test_throwaway_dataset_runs_task_splits(
    throwaway: dict[str, Path], cache_dir: Path, tmp_path: Path
) -> None:
    _write_data(throwaway["data"])
    run_dir = tmp_path / "run"
    result = run_main(
        [
            _searchpath(throwaway["conf"]),
            "task=splits",
            "dataset=throwaway",
            f"dataset.root={throwaway['data']}",
            "shift.field=scanner",
            "shift.ood_values=[B]",
            "shift.merge_train_ood=false",
        ],
        run_dir,
        cache_dir,
        env={"PYTHONPATH": str(throwaway["modules"])},
        small=SMALL_MODEL,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((run_dir / "splits.json").read_text())
    # Scanner B is every third row (i % 3 == 0) of each source split.
    counts = {k: v["n"] for k, v in report["splits"].items()}
    assert counts == {"train": 8, "val": 2, "test_iid": 4, "test_ood": 2}


def test_throwaway_metric_family_scores(throwaway: dict[str, Path]) -> None:
    from medvqa.scoring.pipeline import build_families, score_frame

    cfg = compose(
        [_searchpath(throwaway["conf"]), "metric=[traditional,answer_length]"],
    )
    assert cfg.metric.answer_length.unit == 1
    families = build_families(cfg.metric)
    assert [f.name for f in families] == ["traditional", "answer_length"]
    preds = pd.DataFrame(
        {
            "id": ["a", "b"],
            "question": ["q", "q"],
            "answer": ["red", "yes"],
            "answer_type": ["open", "closed"],
            "candidates": [None, ["yes", "no"]],
            "question_type": ["colour", "presence"],
            "prediction": ["dark red", "yes"],
        }
    )
    scored, scores = score_frame(preds, families)
    assert scored["answer_words"].tolist() == [2.0, 1.0]
    assert scores["answer_words"] == 1.5
    with pytest.raises(ConfigCompositionException, match="unitz"):
        compose(
            [_searchpath(throwaway["conf"]), "metric=answer_length", "metric.answer_length.unitz=2"]
        )


def test_throwaway_metric_family_runs_a_baseline(
    throwaway: dict[str, Path], cache_dir: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    result = run_main(
        [
            _searchpath(throwaway["conf"]),
            "task=most_frequent",
            "metric=[traditional,answer_length]",
            "logger=csv",
        ],
        run_dir,
        cache_dir,
        env={"PYTHONPATH": str(throwaway["modules"])},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((run_dir / "results.json").read_text())["metrics"]
    # Most-frequent answers are one or two words (an empty one counts 0).
    assert all(0.5 < metrics[f"{split}/answer_words"] <= 2 for split in ("test_iid", "test_ood"))


def test_the_config_store_survives_pickling_into_a_fresh_process(tmp_path: Path) -> None:
    """The SLURM launcher sends Hydra's config store to the job, which composes the config
    there: the generated schemas must arrive as themselves (by reference), not as copies.
    Both sides are fresh processes, so no plug-in a test registered takes part."""
    import subprocess
    import sys

    pytest.importorskip("cloudpickle")
    blob = tmp_path / "repo.pkl"
    send = f"""
import cloudpickle
from hydra.core.config_store import ConfigStore
import medvqa.config  # fills the store
open({str(blob)!r}, "wb").write(cloudpickle.dumps(ConfigStore.instance().repo))
"""
    receive = f"""
import pickle
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
repo = pickle.loads(open({str(blob)!r}, "rb").read())  # before medvqa.config is imported
ConfigStore.instance().repo = repo
with initialize_config_dir(config_dir={str(CONF)!r}, version_base="1.3"):
    cfg = compose("config", overrides=["paths.root_dir=/tmp", "paths.output_dir=/tmp"])
print(list(cfg.shift.exclude_values), cfg.shift.name)
"""
    for code in (send, receive):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[0] == "[]"


def test_a_plugin_is_listed_by_medvqa_list(throwaway: dict[str, Path]) -> None:
    """`medvqa-list` reads the registries: a plug-in from outside the repository is there,
    with what its module says it is, and no list was edited."""
    from medvqa.cli.catalog import catalog

    text = catalog(["datasets", "metric families"])
    assert "  throwaway " in text and "  answer_length " in text


VIEW_PLUGIN = '''"""Answer length: how many words the answers have, per split (a view from outside)."""

from medvqa.views import Presentation, View


class AnswerWords(View):
    name = "answer words"
    title = "Answer length"
    presentation = Presentation(
        r"^(?P<split>SPLIT)/answer_(?P<what>)(?P<stat>words_mean)$",
        {"words_mean": "mean words"},
        "Words per answer.",
    )

    def applies(self, rows):
        return True

    def apply(self, rows):
        words = rows.main["prediction"].astype(str).str.split().str.len()
        main = rows.main.assign(answer_words=words)
        split = main["split"]
        return main, {f"{s}/answer_words_mean": float(w.mean()) for s, w in words.groupby(split)}
'''


@pytest.fixture
def outside_view(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    (tmp_path / "answer_words_view.py").write_text(VIEW_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(plugins.ENV_VAR, "answer_words_view")
    yield
    plugins._REGISTRY["view"].pop("answer words", None)
    sys.modules.pop("answer_words_view", None)
    plugins._imported.discard("answer_words_view")
    plugins._DISCOVERED.clear()


@pytest.mark.heavy
def test_a_view_from_outside_is_run_by_medvqa_score_and_shown_by_the_report(
    outside_view: None, tmp_path: Path
) -> None:
    """A view is a plug-in like a dataset: a module named in MEDVQA_PLUGINS adds one, which
    `medvqa-score` runs (its figures and per-sample column) and `medvqa-report` shows (its
    section), with no list edited."""
    from medvqa.cli.catalog import catalog
    from medvqa.cli.report import main as report_main
    from medvqa.cli.score import main as score_main
    from tests.test_report import headline, write_record

    preds = tmp_path / "preds.csv"
    preds.write_text(
        "id,split,question,answer,prediction,answer_type\n"
        "q1,test_iid,What organ?,liver,the liver,open\n"
        "q2,test_iid,Is it normal?,yes,yes,closed\n"
        "q3,test_ood,What organ?,lung,a left lung,open\n"
        "q4,test_ood,Is it normal?,no,yes,closed\n"
    )
    scored, report = tmp_path / "scored", tmp_path / "report"
    assert score_main([str(preds), "--out", str(scored), "metric=[traditional]"]) == 0
    metrics = json.loads((scored / "results.json").read_text())["metrics"]
    assert metrics["test_iid/answer_words_mean"] == 1.5
    assert metrics["test_ood/answer_words_mean"] == 2.0
    assert "answer_words" in pd.read_parquet(scored / "scores.parquet").columns
    # the report places runs by their dataset, shift and method: a run's record with these
    runs = tmp_path / "runs"
    write_record(runs, metrics={**headline(np.random.default_rng(0)), **metrics})
    assert report_main([str(runs), "--out", str(report)]) == 0
    page = (report / "report.html").read_text()
    assert "Answer length" in page and "mean words" in page and "Words per answer." in page
    assert "  answer words " in catalog(["views"])
