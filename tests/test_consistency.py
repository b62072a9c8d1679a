"""Paraphrase consistency (issue: beyond accuracy, consistency): pairs, flips and the synthetic
data's paraphrases."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from medvqa.data import records as R
from medvqa.generation.passes.option_order import check_reorderable, reordered
from medvqa.scoring.metrics.traditional import per_sample_scores
from medvqa.views.consistency import (
    AGREES,
    ORDER_FLIPS,
    add_agreement,
    consistency_metrics,
    order_flips,
    order_metrics,
    paraphrase_pairs,
)


def _scored(rows: list[tuple[str, str, str, str, str, str, str]]) -> pd.DataFrame:
    """(split, id, group, case, answer type, answer, prediction) -> scored as traditional does."""
    frame = pd.DataFrame(
        rows,
        columns=[R.SPLIT, R.ID, R.PARAPHRASE_GROUP, R.CASE_ID, R.ANSWER_TYPE, R.ANSWER,
                 R.PREDICTION],
    )  # fmt: skip
    frame[R.CANDIDATES] = [["yes", "no"] if t == "closed" else None for t in frame[R.ANSWER_TYPE]]
    return per_sample_scores(frame)


ROWS = [
    # a free-form question in test_iid and its paraphrase in test_ood (VQA-RAD's shift)
    ("test_iid", "q1", "g1", "c1", "closed", "yes", "Yes"),
    ("test_ood", "q1p", "g1", "c1", "closed", "yes", "yes."),  # the same choice: agrees
    ("test_iid", "q2", "g2", "c2", "closed", "no", "no"),
    ("test_ood", "q2p", "g2", "c2", "closed", "no", "yes"),  # flips
    ("test_iid", "q3", "g3", "c3", "open", "left lung", "Left lung"),
    ("test_ood", "q3p", "g3", "c3", "open", "left lung", "right lung"),  # flips
    # a group of three inside one split: three pairs
    ("test_iid", "q4", "g4", "c4", "closed", "yes", "yes"),
    ("test_iid", "q4p", "g4", "c4", "closed", "yes", "yes"),
    ("test_iid", "q4q", "g4", "c4", "closed", "yes", "no"),
    # no partner: no pair
    ("test_iid", "q5", None, "c5", "closed", "yes", "no"),
]


def test_pairs_flips_and_both_correct_by_hand() -> None:
    scored = _scored(ROWS)
    pairs = paraphrase_pairs(scored, ["test_iid", "test_ood"])
    assert len(pairs) == 3 + 3
    m = consistency_metrics(scored, ["test_iid", "test_ood"])
    assert m["test_iid~test_ood/consistency_paraphrase_closed_flip_rate"] == 0.5
    assert m["test_iid~test_ood/consistency_paraphrase_closed_both_correct"] == 0.5
    assert m["test_iid~test_ood/consistency_paraphrase_open_flip_rate"] == 1.0
    assert m["test_iid~test_ood/consistency_paraphrase_open_n_pairs"] == 1
    # g4: (q4, q4p) agree; (q4, q4q) and (q4p, q4q) flip
    assert m["test_iid/consistency_paraphrase_closed_flip_rate"] == pytest.approx(2 / 3)
    assert m["test_iid/consistency_paraphrase_closed_both_correct"] == pytest.approx(1 / 3)
    with_ci = consistency_metrics(
        scored, ["test_iid", "test_ood"], {"B": 200, "seed": 0, "level": 0.95}
    )
    assert 0 <= with_ci["test_iid~test_ood/consistency_paraphrase_closed_flip_rate_ci_lo"] <= 0.5
    per_row = add_agreement(scored).set_index(R.ID)[AGREES]
    assert per_row["q1"] == per_row["q1p"] == 1.0 and per_row["q2"] == 0.0
    assert per_row["q4"] == 0.5 and per_row["q4q"] == 0.0
    assert math.isnan(per_row["q5"])


def test_no_paraphrase_group_column_no_figures() -> None:
    scored = _scored(ROWS).drop(columns=[R.PARAPHRASE_GROUP])
    assert consistency_metrics(scored) == {}
    assert add_agreement(scored) is scored


def test_synthetic_paraphrases_reword_test_questions_only(tmp_path: Path) -> None:
    """`dataset.paraphrases=true`: each question of a test case also in another wording of its
    template (same image, answer and candidates); the other rows are those of the default data,
    whose cache and numbers stay as they were."""
    from medvqa.data.sources.synthetic import SyntheticVQA

    options = {"n_cases": 40, "image_size": 16, "questions_per_image": 3}
    plain = SyntheticVQA(tmp_path, **options).table()
    both = SyntheticVQA(tmp_path, paraphrases=True, **options).table()
    originals = both[both["phrasing"] == "original"].drop(columns=[R.PARAPHRASE_GROUP, "phrasing"])
    pd.testing.assert_frame_equal(originals.reset_index(drop=True), plain)
    reworded = both[both["phrasing"] == "paraphrase"]
    assert len(reworded) and set(reworded[R.SOURCE_SPLIT]) == {"test"}
    source = both.set_index(R.ID).loc[reworded[R.PARAPHRASE_GROUP]]
    for column in (R.ANSWER, R.IMAGE, R.CASE_ID, R.ANSWER_TYPE, "template"):
        assert reworded[column].tolist() == source[column].tolist()
    assert reworded[R.CANDIDATES].map(str).tolist() == source[R.CANDIDATES].map(str).tolist()
    assert (reworded[R.QUESTION].to_numpy() != source[R.QUESTION].to_numpy()).all()
    assert (reworded[R.ID] == reworded[R.PARAPHRASE_GROUP] + "_p").all()


def test_reordered_options_are_another_order_of_the_same_candidates_every_time() -> None:
    frame = pd.DataFrame(
        {
            R.ID: [f"q{i}" for i in range(50)] + ["open", "one"],
            R.CANDIDATES: [["a", "b", "c", "d"]] * 25 + [["yes", "no"]] * 25 + [None, ["x"]],
        }
    )
    first, again, second = reordered(frame, 1), reordered(frame, 1), reordered(frame, 2)
    assert first[R.CANDIDATES].tolist() == again[R.CANDIDATES].tolist()  # seeded
    for original, other in zip(frame[R.CANDIDATES][:50], first[R.CANDIDATES][:50], strict=True):
        assert sorted(other) == sorted(original) and other != original
    assert first[R.CANDIDATES][25] == ["no", "yes"]  # two options: swapped
    assert first[R.CANDIDATES].iloc[50] is None and first[R.CANDIDATES].iloc[51] == ["x"]
    assert first[R.CANDIDATES][:25].tolist() != second[R.CANDIDATES][:25].tolist()
    assert frame[R.CANDIDATES][0] == ["a", "b", "c", "d"]  # the input is left as it was


def test_order_flips_compare_the_chosen_candidates_not_their_positions_by_hand() -> None:
    rows = [
        ("test_iid", "q1", None, "c1", "closed", "yes", "yes"),
        ("test_iid", "q2", None, "c2", "closed", "no", "no"),
        ("test_iid", "q3", None, "c3", "open", "lung", "lung"),
        ("test_ood", "q4", None, "c4", "closed", "yes", "Yes"),
    ]
    main = _scored(rows)

    # reordered: q1 keeps its meaning ("Yes."), q2 flips to "yes", q4 answers off-list text
    def answered(predictions: list[str]) -> pd.DataFrame:
        return _scored([(*r[:6], p) for r, p in zip(rows, predictions, strict=True)])

    order1 = answered(["Yes.", "yes", "heart", "maybe"])
    order2 = answered(["no", "yes", "lung", "yes"])
    flagged, used = order_flips(main, {"order1/": order1, "order2/": order2})
    assert used == ["order1/", "order2/"]
    assert flagged[ORDER_FLIPS].tolist()[:2] == [0.5, 1.0] and math.isnan(flagged[ORDER_FLIPS][2])
    assert flagged[ORDER_FLIPS][3] == 0.5  # "maybe" chooses nothing: its text differs
    m = order_metrics(flagged)
    assert m["test_iid/consistency_order_closed_flip_rate"] == 0.75
    assert m["test_iid/consistency_order_closed_n"] == 2
    assert m["test_ood/consistency_order_closed_flip_rate"] == 0.5
    lost = order_flips(main, {"order1/": order1[order1[R.ID] != "q1"]})[0]  # q1 never answered
    assert math.isnan(order_metrics(lost)["test_iid/consistency_order_closed_flip_rate"])


def test_reordering_options_the_prompt_does_not_list_is_refused(cache_dir: Path) -> None:
    """The default prompt shows no options: reordering them could not change an answer, and a
    flip rate of 0 would look like a finding."""
    from medvqa.config import ConfigError, check_config
    from tests.conftest import compose

    with pytest.raises(ConfigError, match=r"data\.option_orders=1: the prompt lists no options"):
        check_config(compose(["data.option_orders=1"], cache_dir))
    check_config(compose(["data.option_orders=1", "prompt=sure"], cache_dir))


@pytest.mark.slow
def test_vqarad_paraphrase_run_reports_flips_between_the_free_form_and_the_paraphrase(
    tmp_path: Path, cache_dir: Path, tiny_model_dir: Path
) -> None:
    """`+experiment=vqarad_paraphrase` on VQA-RAD's native files (the fixture writer): the
    free-form question is i.i.d., its paraphrase OoD; each pair is one test_iid~test_ood pair,
    beside calibration and subgroups in the same whole run."""
    import json

    from tests.conftest import SMALL_MODEL, run_main
    from tests.native.vqa_rad import write as write_vqa_rad

    rad = write_vqa_rad(tmp_path / "vqa_rad")
    args = [
        "+experiment=vqarad_paraphrase", f"dataset.root={rad.root}", "debug=smoke",
        "logger=csv", "data.limit.test_iid=null", "data.limit.test_ood=null",
        "metric=[traditional,calibration,subgroups]",
    ]  # fmt: skip
    proc = run_main(args, tmp_path / "run", cache_dir, small=SMALL_MODEL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "results.json").read_text())["metrics"]
    scored = pd.read_parquet(tmp_path / "run" / "scores.parquet")
    sides = scored.groupby(R.PARAPHRASE_GROUP)[R.SPLIT].agg(set)
    across = int((sides == {"test_iid", "test_ood"}).sum())
    assert across
    pairs = sum(
        v for k, v in metrics.items()
        if k.startswith("test_iid~test_ood/consistency_paraphrase_") and k.endswith("_n_pairs")
    )  # fmt: skip
    assert pairs == across
    assert "test_ood/calibration_closed_ece" in metrics and "test_ood/subgroups_tested" in metrics


def test_option_orders_without_options_are_refused_before_the_model_loads() -> None:
    """A split whose questions all have fewer than two candidates has no order to change:
    refused naming the split, instead of generating the same answers again."""
    frames = {
        "test_iid": pd.DataFrame({R.ID: ["a", "b"], R.CANDIDATES: [["yes", "no"], None]}),
        "test_ood": pd.DataFrame({R.ID: ["c"], R.CANDIDATES: [["yes"]]}),
        "val": pd.DataFrame({R.ID: ["d"]}),
    }
    check_reorderable(frames, 0)
    check_reorderable({"test_iid": frames["test_iid"]}, 2)
    with pytest.raises(ValueError, match=r"split\(s\) \['test_ood', 'val'\].*option_orders=0"):
        check_reorderable(frames, 1)
