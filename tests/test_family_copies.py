"""A copied metric family works beside its original after renaming only its class and name.

Issue #22: every column and score a family writes is `<prefix><base>`, its prefix derived
from its `name` (`MetricFamily.column`). For each built-in family that runs offline, its
module's source is copied into a throwaway module outside the repository with only the class
name and the `name = "..."` value changed, found through MEDVQA_PLUGINS, built from the same
config node as the original, and scored together with it by the scoring pipeline: no column
or score collides, every score of the original keeps its name and value, and the copy reports
the same values under its own prefix (`<newname>_...`), its counters under `<newname>/`.
"""

from __future__ import annotations

import inspect
import math
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from omegaconf import OmegaConf

from medvqa import plugins
from medvqa.provenance import add_metrics
from medvqa.scoring.metrics.base import MetricFamily
from medvqa.scoring.pipeline import COUNTS, Scoring, build_families, score_frame
from tests.conftest import compose, sampled
from tests.judge_server import JudgeServer

SPLITS = ("test_iid", "test_ood")
BREAKDOWN = ["modality"]
# (question, answer, prediction, answer_type, candidates, case, closed-set task, closed_kind,
#  question classes, modality): rows every family can score (open and closed, yes/no and a
#  three-label task, a letter reply, an invalid reply, aspects for the aspect judge).
YES_NO, SIDES = ["yes", "no"], ["left", "right", "both"]
ROWS = [
    ("Which organ is shown?", "left lung", "Left lung.", "open", None, "c1", None, None,
     ["organ"], "CT"),
    ("What is seen?", "fracture of the fifth metacarpal", "fracture of the first metacarpal",
     "open", None, "c1", None, None, ["finding", "location"], "MRI"),
    ("Which organ is enlarged?", "liver", "spleen", "open", None, "c2", None, None, ["organ"],
     "CT"),
    ("Is there a nodule?", "yes", "Yes", "closed", YES_NO, "c2", "q1", "yes_no", ["finding"],
     "CT"),
    ("Is it normal?", "no", "yes, there is", "closed", YES_NO, "c3", "q1", "yes_no", [], "MRI"),
    ("Is there edema?", "yes", "yes there is", "closed", YES_NO, "c3", "q1", "yes_no",
     ["finding"], "CT"),
    ("Any polyp?", "no", "maybe", "closed", YES_NO, "c4", "q1", "yes_no", None, "MRI"),
    ("Which side?", "left", "the right one", "closed", SIDES, "c4", "q2", "multilabel",
     ["location"], "MRI"),
    ("Which side?", "both", "both sides", "closed", SIDES, "c5", "q2", "multilabel",
     ["location"], "CT"),
    ("Which side?", "right", "B", "closed", SIDES, "c5", "q2", "multilabel", ["location"], "MRI"),
]  # fmt: skip
COLUMNS = [
    "question", "answer", "prediction", "answer_type", "candidates", "case_id", "question_id",
    "closed_kind", "question_class", "modality",
]  # fmt: skip


def predictions() -> dict[str, pd.DataFrame]:
    """Both test splits (RR needs both); the OoD one answers two questions differently."""
    iid = pd.DataFrame(ROWS, columns=COLUMNS)
    iid["id"] = [f"q{i}" for i in range(len(iid))]
    iid.index = [10 + i for i in range(len(iid))]  # not a RangeIndex: the index must be kept
    ood = iid.copy()
    ood.loc[12, "prediction"] = "the liver"
    ood.loc[13, "prediction"] = "No."
    ood["id"] = [f"o{i}" for i in range(len(ood))]
    return {"test_iid": iid, "test_ood": ood}


JUDGE = ["judge.backend=openai", "judge.model=scripted-judge", "judge.mode=generate",
         "judge.api_key_env=null", "judge.cache_dir=null", "judge.retries=0"]  # fmt: skip
# family -> its config overrides (the copy is built from the same node). closed_set's tasks
# are this table's; the judges talk to the scripted server without a cache (a shared cache
# would answer the copy's items, and its counters would differ from the original's).
FAMILIES: dict[str, list[str]] = {
    "traditional": [],
    "text": [],
    "embedding": [],
    "kvasir_official": ["metric.kvasir_official.n_samples=50"],
    "llava_med_eval": [],
    "closed_set": [
        "metric.closed_set.tasks=[q1,q2]",
        "metric.closed_set.primary=[q1,q2]",
        "evaluation.bootstrap.samples=200",
    ],
    "mcq": ["evaluation.bootstrap.samples=200"],
    "judge": JUDGE,
    "aspect_judge": JUDGE,
}


@pytest.fixture(scope="module")
def server() -> Iterator[JudgeServer]:
    srv = JudgeServer().start()
    yield srv
    srv.stop()


def copy_family(
    original: type[MetricFamily], new_name: str, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> type[MetricFamily]:
    """The original's module copied as a plug-in module in `folder`, with only the class name
    and the `name = "..."` value changed, found by discovery through MEDVQA_PLUGINS."""
    source = inspect.getsource(sys.modules[original.__module__])
    declaration = f'    name = "{original.name}"\n'
    assert source.count(declaration) == 1, f"{original.__module__}: no single `name = ...`"
    new_class = f"Copied{original.__name__}"
    source = source.replace(declaration, f'    name = "{new_name}"\n')
    source = source.replace(original.__name__, new_class)
    module = f"copied_{new_name}"
    (folder / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv(plugins.ENV_VAR, module)
    copy = plugins.get("metric", new_name)
    assert copy.__name__ == new_class and copy.__module__ == module
    return copy


@pytest.fixture
def forget_copies() -> Iterator[list[str]]:
    """Names of copies a test registers; unregistered and unimported after it."""
    names: list[str] = []
    yield names
    for name in names:
        plugins._REGISTRY["metric"].pop(name, None)
        sys.modules.pop(f"copied_{name}", None)
        plugins._imported.discard(f"copied_{name}")


def same(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN (both families compute the same thing the same way)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


class Renamer:
    """The copy's name of each of the original's score, column and counter names."""

    def __init__(self, original: MetricFamily, copy: MetricFamily, scores: set[str]) -> None:
        self.original, self.copy, self.scores = original, copy, scores

    def score(self, score: str) -> str:
        assert score.startswith(self.original.prefix), score
        return self.copy.prefix + score.removeprefix(self.original.prefix)

    def key(self, key: str) -> str | None:
        """A results key of the original's (`<split>/[<field>=<v>/]<score>`,
        `robustness/rr_<score>`, `<name>/<counter>`, `selfcheck/<failures_key>`) as the
        copy's; None for a key that is not the family's (a row count, a headline alias)."""
        *head, last = key.split("/")
        if head == [self.original.name]:
            return f"{self.copy.name}/{last}"
        if head == ["selfcheck"] and last == self.original.failures_key:
            return f"selfcheck/{self.copy.failures_key}"
        if head == ["robustness"] and last.startswith("rr_"):
            score = last.removeprefix("rr_")
            return f"robustness/rr_{self.score(score)}" if score in self.scores else None
        if head and head[0] in SPLITS and last in self.scores:
            return "/".join([*head, self.score(last)])
        return None


def build(name: str, overrides: list[str], server: JudgeServer, cache: Path):
    """The original's config node as `metric=[<name>]` composes it, and `evaluation`."""
    judge = [f"judge.base_url={server.base_url}"] if name.endswith("judge") else []
    cfg = compose(
        [
            f"metric=[{name}]",
            *overrides,
            *judge,
            f"evaluation.breakdown=[{BREAKDOWN[0]}]",
            "evaluation.bootstrap.samples=200",
        ],
        cache,
    )
    node = OmegaConf.to_container(cfg.metric[name], resolve=True)
    return node, cfg.evaluation


@pytest.mark.parametrize("name", sampled(list(FAMILIES), keep=1))
@pytest.mark.heavy
def test_copied_family_scores_beside_its_original(
    name: str,
    server: JudgeServer,
    tmp_path: Path,
    cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    forget_copies: list[str],
) -> None:
    original_cls = plugins.get("metric", name)
    new_name = f"{name}2"
    forget_copies.append(new_name)
    copy_cls = copy_family(original_cls, new_name, tmp_path, monkeypatch)
    assert copy_cls.prefix == f"{new_name}_" != original_cls.prefix
    assert copy_cls.failures_key == (f"{new_name}_failures" if original_cls.can_fail else None)

    node, evaluation = build(name, FAMILIES[name], server, cache_dir)
    copy_node = {**node, "_target_": plugins.target_of(copy_cls)}
    preds = predictions()

    # The original alone: the names and values the copy must not change.
    with Scoring(build_families({name: node}), evaluation) as alone:
        (original_alone,) = alone.families
        expected, scored_alone = alone.score(preds)
    # Both at once, through the same pipeline (no collision error).
    with Scoring(build_families({name: node, new_name: copy_node}), evaluation) as both:
        original, copy = both.families
        assert type(copy) is copy_cls and copy.name == new_name
        results, scored = both.score(preds)

    # Every score of the original keeps its name and value.
    missing = sorted(set(expected) - set(results))
    assert not missing, f"{name}: scores lost beside the copy: {missing[:10]}"
    changed = [k for k in expected if not same(results[k], expected[k])]
    assert not changed, f"{name}: scores changed beside the copy: {changed[:10]}"

    # The copy has each of them under its own prefix, with the same value.
    split_scores = {
        k for k in score_frame(preds["test_iid"], [original_alone], BREAKDOWN)[1] if "/" not in k
    } - set(COUNTS)
    assert split_scores, f"{name}: the original scores nothing"
    rename = Renamer(original, copy, split_scores)
    renamed = {k: rename.key(k) for k in expected if rename.key(k) is not None}
    assert not set(renamed.values()) & set(expected), f"{name}: a copy's name is the original's"
    for key, copy_key in renamed.items():
        assert copy_key in results, f"{name}: the copy lacks {copy_key} (for {key})"
        assert same(results[copy_key], expected[key]), (key, copy_key)
    assert set(results) == set(expected) | set(renamed.values())
    # Whatever the original scores per split, the copy scores under `<newname>_`.
    for score in split_scores:
        assert f"test_iid/{rename.score(score)}" in results
        assert rename.score(score).startswith(f"{new_name}_")
    if original.can_fail:
        assert f"test_iid/{copy.failures_key}" in results
    counters = {k for k in expected if k.startswith(f"{name}/")}
    assert {rename.key(k) for k in counters} == {k for k in results if k.startswith(new_name)}

    # Per-sample columns: the original's unchanged, the copy's the same under its prefix.
    columns = [c for c in scored_alone.columns if c not in preds["test_iid"].columns]
    assert columns
    for column in columns:
        if column == "split":
            continue
        copy_column = rename.score(column)
        assert copy_column in scored.columns and column in scored.columns
        pd.testing.assert_series_equal(scored[column], scored_alone[column])
        pd.testing.assert_series_equal(scored[copy_column], scored_alone[column], check_names=False)

    # Bootstrap columns and provenance follow the prefix; provenance is keyed by name.
    assert copy.ci_columns() == {
        rename.score(score): (rename.score(column), kind)
        for score, (column, kind) in original.ci_columns().items()
    }
    provenance: dict[str, Any] = {}
    add_metrics(provenance, [original, copy])
    assert set(provenance["metrics"]) == {name, new_name}
    for key, value in provenance["metrics"][name].items():
        if key != "ci_columns":
            assert provenance["metrics"][new_name][key] == value


@pytest.mark.heavy
def test_builtin_names_are_unchanged(server: JudgeServer, cache_dir: Path) -> None:
    """The built-in families keep the names their scores were always recorded under
    (SURE-VQA's `closed_acc`/`open_bleu1`, `judge_closed_acc`, `cs_primary_macro_f1`...)."""
    expected: Mapping[str, set[str]] = {
        "traditional": {"closed_acc", "closed_invalid_rate", "open_bleu1", "open_f1",
                        "open_empty_ref_n", "closed_correct", "closed_choice"},
        "text": {"rouge1", "rouge_l", "bleu4", "chrf_pp", "text_empty_ref_n"},
        "embedding": {"embedding_cosine", "embedding_cosine_all", "embedding_empty_ref_n"},
        "kvasir_official": {"kvasir_bleu", "kvasir_rouge1", "kvasir_rougeL_mean",
                            "kvasir_failures", "kvasir_failed", "kvasir_empty_ref_n"},
        "llava_med_eval": {"llava_med_eval_closed_acc", "llava_med_eval_open_recall",
                           "llava_med_eval_open_bleu_1", "llava_med_eval_closed_hit"},
        "closed_set": {"cs_primary_macro_f1", "cs_primary_macro_f1_ci_half", "cs_q1_macro_f1",
                       "cs_q2_balanced_acc", "cs_invalid_rate", "cs_n", "cs_choice"},
        "mcq": {"mcq_acc", "mcq_acc_ci_half", "mcq_acc_strict", "mcq_random_baseline",
                "mcq_n_valid", "mcq_choice", "mcq_correct"},
        "judge": {"judge_closed_acc", "judge_open_score", "judge_open_score_norm",
                  "judge_failures", "judge_score", "judge_reason", "judge/calls"},
        "aspect_judge": {"aspect_acc", "aspect_acc_location", "aspect_failures",
                         "aspect_scores", "aspect_judge/calls"},
    }  # fmt: skip
    for name, overrides in FAMILIES.items():
        node, _ = build(name, overrides, server, cache_dir)
        (family,) = build_families({name: node})
        scored, scores = score_frame(predictions()["test_iid"], [family])
        names = set(scores) | set(scored.columns) | set(family.counters())
        assert expected[name] <= names, (name, sorted(expected[name] - names))
        family.close()
