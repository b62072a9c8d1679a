"""A job's evaluation passes are objects of a plug-in kind (medvqa.generation.passes): listed
once per job, recorded in results.json and read back from there, and a kind from outside the
repository is one module that a run generates, scores, costs and reports."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from medvqa import plugins
from medvqa.generation import passes as P
from tests.conftest import compose, run_main

# A pass kind from outside the repository: this module is all it takes (its setting goes on the
# command line: +passes.suffixed=[...]). It changes each row's question, and mirrors the image
# of each closed row (the row's own data decides), noting which rows it changed.
OUTSIDE_KIND = '''"""The main questions again with a word appended (a pass kind from outside)."""

import os
from dataclasses import dataclass

from PIL import ImageOps

from medvqa.generation.passes import EvalPass


@dataclass(frozen=True, kw_only=True)
class Suffixed(EvalPass):
    name = "suffixed"
    setting = "passes.suffixed"
    transforms_image = True

    k: int
    text: str

    @classmethod
    def of_job(cls, job):
        texts = job.setting(cls.setting) or []
        return [
            cls.after(job.label, image_mode=job.eval_image, k=k, text=str(t))
            for k, t in enumerate(texts, 1)
        ]

    @property
    def key(self):
        return f"suffix{self.k}"

    @property
    def suffix(self):
        return f"question + {self.text}"

    def rows(self, frame):
        return frame.assign(question=frame["question"] + " " + self.text)

    def transform_image(self, image, row):
        if row["answer_type"] != "closed":
            return image
        with open(os.environ["SUFFIXED_SEEN"], "a") as fh:
            fh.write(str(row["id"]) + "\\n")
        return ImageOps.mirror(image)

    def image_key(self, key, row):
        return f"{key}\\0mirrored" if row["answer_type"] == "closed" else key
'''


@pytest.fixture
def outside_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The kind's module in a folder of its own, found through MEDVQA_PLUGINS."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "suffixed_pass.py").write_text(OUTSIDE_KIND)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv(plugins.ENV_VAR, "suffixed_pass")
    yield folder
    plugins._REGISTRY["pass"].pop("suffixed", None)
    sys.modules.pop("suffixed_pass", None)
    plugins._imported.discard("suffixed_pass")
    plugins._DISCOVERED.clear()  # the next test with the same $MEDVQA_PLUGINS imports it again


def test_a_pass_kind_from_outside_is_generated_scored_costed_and_reported(
    outside_kind: Path, tmp_path: Path, cache_dir: Path
) -> None:
    """One module named in MEDVQA_PLUGINS: a run asks its passes (`+passes.suffixed=[...]`),
    generates them with its rows and images, scores and records them; medvqa-list lists the
    kind, the plan costs its rows and medvqa-report lists its row. No file of medvqa changed."""
    from medvqa.cli.catalog import catalog
    from medvqa.cli.report import main as report_main
    from medvqa.planning import cost, job_rates
    from tests.test_plan_cost import LORA_R16_EAGER, STUDY_JOB, TEST, planner, setup

    seen = tmp_path / "seen.txt"
    run_dir = tmp_path / "runs" / "run"
    args = ["debug=smoke", "peft=none", "task.references=[]", "logger=csv",
            "data.limit.test_iid=4", "data.limit.test_ood=4", "+passes.suffixed=[Briefly]"]  # fmt: skip
    env = {"PYTHONPATH": str(outside_kind), "SUFFIXED_SEEN": str(seen)}
    done = run_main(args, run_dir, cache_dir, env=env)
    assert done.returncode == 0, done.stderr[-3000:]

    record = json.loads((run_dir / "results.json").read_text())
    label = "No Finetune, question + Briefly"
    assert record["provenance"]["passes"][-1] == {
        "kind": "suffixed",
        "prefix": "suffix1/",
        "label": label,
        "settings": {"image_mode": "image", "k": 1, "text": "Briefly"},
    }
    asked = pd.read_json(run_dir / "predictions_suffix1.jsonl", lines=True)
    assert len(asked) == 8 and asked["question"].str.endswith(" Briefly").all()
    scored = pd.read_parquet(run_dir / "scores_suffix1.parquet")
    assert len(scored) == 8 and record["metrics"]["suffix1/test_iid/n"] == 4
    closed = set(asked.loc[asked["answer_type"] == "closed", "id"].astype(str))
    assert closed and set(seen.read_text().split()) == closed  # each closed row's image, once
    assert label in (run_dir / "summary.md").read_text()

    assert "  suffixed " in catalog(["passes"])
    cache = tmp_path / "cost-cache"
    composer = job_rates.memoized(lambda o: compose([*o, f"paths.cache_dir={cache}"]))
    job = composer([*STUDY_JOB, *LORA_R16_EAGER, "+passes.suffixed=[Briefly]"])
    estimate = cost.job_cost(job, planner(setup()), composer)
    (phase,) = [
        p for p in estimate.phases if p.name == "answers after training, question + Briefly"
    ]
    assert phase.kind == "generate" and phase.items == TEST

    out = tmp_path / "report"
    assert report_main([str(tmp_path / "runs"), "--out", str(out)]) == 0
    rows = pd.read_csv(out / "runs.csv").set_index("method")
    assert rows.loc[label, "kind"] == "extra pass"
    iid = record["metrics"]["suffix1/test_iid/closed_acc"]
    assert rows.loc[label, "closed i.i.d."] == pytest.approx(iid)


def _job(**data: object) -> P.Job:
    config = {"data": {"eval_image": "image", **data}, "peft": {"name": "lora", "label": "LoRA"}}
    return P.Job(config, P.main_label(config), tuned=True, base_label="No Finetune")


def test_a_record_lists_the_passes_and_they_read_back_as_they_ran(caplog) -> None:
    """`provenance.passes` is plain JSON that each kind rebuilds from its settings; an entry
    that is no pass (hostile, edited) is skipped naming it, and a kind this installation lacks
    keeps its recorded prefix and label."""
    passes = P.job_passes(_job(extra_eval_images=["blank"], option_orders=1))
    assert [p.prefix for p in passes] == ["zero_shot/", "", "blank/", "order1/"]
    entries = json.loads(json.dumps([p.record() for p in passes]))
    strange = {
        "kind": "someone_elses",
        "prefix": "theirs/",
        "label": "LoRA, theirs",
        "settings": {},
    }
    hostile = [
        "blank/",
        {**entries[2], "prefix": "order1/"},  # not the prefix its settings make
        {**entries[2], "settings": {"image_mode": "../../x"}},  # a key that is no file name
        {**entries[3], "settings": {"image_mode": "image", "k": {"_target_": "os.system"}}},
        {**entries[3], "settings": {"k": 1, "rm": "-rf"}},
    ]
    record = {"provenance": {"passes": [*entries, strange, *hostile]}}
    with caplog.at_level(logging.WARNING):
        read = P.recorded_passes(record, "No Finetune")
    assert read[:4] == passes
    assert (read[4].prefix, read[4].label, read[4].report_rows()[0].name("x")) == (
        "theirs/",
        "LoRA, theirs",
        "LoRA, theirs",
    )
    assert len(read) == 5 and caplog.text.count("a recorded pass is skipped") == len(hostile)


def test_an_older_record_gets_its_passes_from_its_config_in_one_place() -> None:
    """A record written before passes were recorded: the passes its config asked for, rebuilt
    by the kinds as its run made them (the untuned base's among them: its metrics say if it
    ran); a config no kind can read gives none."""
    config = {"data": {"eval_image": "image", "extra_eval_images": ["blank"]}, "label": "Mine"}
    rebuilt = P.recorded_passes({"config": config}, "No Finetune")
    assert [(p.prefix, p.label) for p in rebuilt] == [
        ("zero_shot/", "No Finetune"),
        ("", "Mine"),
        ("blank/", "Mine, blank image"),
    ]
    assert P.recorded_passes({"config": {"data": {"option_orders": "x"}}}, "none") == []


def test_two_passes_with_one_prefix_and_an_unknown_kind_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dataclasses import dataclass

    monkeypatch.setitem(plugins._REGISTRY, "pass", dict(P.kinds()))  # the kind below: dropped

    @dataclass(frozen=True, kw_only=True)
    class Clash(P.EvalPass):
        name = "clash"

        @classmethod
        def of_job(cls, job: P.Job) -> list[P.EvalPass]:
            return [cls.after(job.label)]

        @property
        def key(self) -> str:
            return "blank"

    with pytest.raises(ValueError, match="share the prefix 'blank/'"):
        P.job_passes(_job(extra_eval_images=["blank"]))
    problems = P.pass_problems({"passes": {"sufixed": [1]}})
    assert problems == [
        "passes.sufixed: no pass kind is called 'sufixed'; the kinds are ['clash', "
        "'image_mode', 'main', 'option_order', 'region_occlusion', 'zero_shot'] (medvqa-list "
        "passes), a plug-in's module goes in $MEDVQA_PLUGINS"
    ]


def test_a_pass_changes_each_rows_image_with_the_row_at_hand(tmp_path: Path) -> None:
    """`transform_image` sees the row (its metadata: a region to hide), and `image_key` tells
    rows that share an image but not its change apart: generation reads and prefixes each
    changed image once."""
    from medvqa.data import records as R
    from medvqa.generation.data import GenerationDataset
    from tests.native import write_image

    for name in ("a.png", "b.png"):
        write_image(tmp_path / name, seed=len(name))

    class Source:  # what the dataset reads of a source: an image by its name
        def load_image(self, image: str, rid: str) -> Image.Image:
            return Image.open(tmp_path / image).convert("RGB")

    class Hide:  # a pass's image change: a black box where the row's `box` says
        def transform_image(self, image: Image.Image, row: pd.Series) -> Image.Image:
            hidden = image.copy()
            hidden.paste((0, 0, 0), tuple(row["box"]))
            return hidden

        def image_key(self, key: str, row: pd.Series) -> str:
            return f"{key}\0{row['box']}"

    frame = pd.DataFrame(
        {
            R.ID: ["q1", "q2", "q3"],
            R.IMAGE: ["a.png", "a.png", "b.png"],
            R.QUESTION: ["?"] * 3,
            R.ANSWER: ["yes"] * 3,
            "box": [[0, 0, 4, 4], [4, 4, 8, 8], [0, 0, 4, 4]],
        }
    )
    plain = GenerationDataset(frame, Source(), None, with_answer=False, image_mode="image")
    hidden = GenerationDataset(
        frame, Source(), None, with_answer=False, image_mode="image", change=Hide()
    )
    assert plain.image_key(0) == plain.image_key(1) != hidden.image_key(0) != hidden.image_key(1)
    for i, (x, y) in enumerate([(0, 0), (5, 5), (0, 0)]):
        assert np.asarray(hidden.image(i))[y, x].tolist() == [0, 0, 0]
        assert np.asarray(plain.image(i))[y, x].tolist() != [0, 0, 0]
