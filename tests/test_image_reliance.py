"""The `shuffled` image mode (issue: beyond accuracy, image reliance): each question is shown a
real image of another case from the same split, the same pairing in every run."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest
import torch

from medvqa.data import records as R
from medvqa.training.datamodule import VQADataset, shuffled_partners
from medvqa.views.reliance import QUADRANTS, add_reliance, reliance_metrics
from tests.conftest import compose, run_main


def _rows(cases: list[str]) -> pd.DataFrame:
    return pd.DataFrame(
        {R.ID: [f"q{i}" for i in range(len(cases))], R.CASE_ID: cases, R.IMAGE: cases}
    )


def test_partners_are_rows_of_other_cases_drawn_the_same_way_every_time() -> None:
    cases = ["a"] * 7 + ["b"] * 2 + ["c"] * 1 + ["d"] * 5  # one case holds most of the rows
    frame = _rows(cases)
    partners = shuffled_partners(frame)
    assert set(partners) == set(frame[R.ID])
    for rid, position in partners.items():
        own = frame.loc[frame[R.ID] == rid, R.CASE_ID].item()
        assert frame[R.CASE_ID].iloc[position] != own  # never the question's own case
    assert partners == shuffled_partners(frame.copy())  # seeded: the same pairing
    assert partners != shuffled_partners(frame, seed=1)
    # Row order does not decide the pairing of a row's case block: the same frame reordered
    # pairs every row with a row of another case again.
    shuffled = frame.sample(frac=1.0, random_state=3).reset_index(drop=True)
    again = shuffled_partners(shuffled)
    assert all(
        shuffled[R.CASE_ID].iloc[p] != shuffled.loc[shuffled[R.ID] == r, R.CASE_ID].item()
        for r, p in again.items()
    )


def test_every_other_case_can_be_drawn() -> None:
    frame = _rows(["a", "b", "c", "d"] * 50)
    partners = shuffled_partners(frame)
    for case in "abcd":  # a case's rows see each of the other three cases' images
        own = frame[R.ID][frame[R.CASE_ID] == case]
        seen = {frame[R.CASE_ID].iloc[partners[rid]] for rid in own}
        assert seen == set("abcd") - {case}


def test_a_split_of_one_case_has_no_partner_and_says_so() -> None:
    with pytest.raises(ValueError, match="at least two values"):
        shuffled_partners(_rows(["a", "a", "a"]))
    assert shuffled_partners(_rows([])) == {}


def test_a_shard_shows_the_image_its_row_gets_in_the_whole_split(cache_dir: Path) -> None:
    """Generation shards a split over ranks (and skips answered rows on resume): a row's
    partner comes from the whole split, so it is the same in every shard."""
    from hydra.utils import instantiate

    from medvqa.models.loading import load_vlm
    from tests.test_families import model_cfg

    source = instantiate(compose(["dataset.n_cases=60"], cache_dir).dataset)
    split = source.table().head(24)
    _, processor = load_vlm(model_cfg("llava_med", cache_dir))
    whole = VQADataset(split, source, processor, False, "shuffled")
    shard = VQADataset(split.iloc[1::3], source, processor, False, "shuffled", pool=split)
    sighted = VQADataset(split, source, processor, False, "image")
    for k, row in enumerate(shard.frame.itertuples()):
        i = split.index.get_loc(split.index[split[R.ID] == getattr(row, R.ID)][0])
        partner = whole.partners[getattr(row, R.ID)]
        assert split[R.CASE_ID].iloc[partner] != split[R.CASE_ID].iloc[i]
        got = shard[k]["pixel_values"]
        assert torch.equal(got, whole[i]["pixel_values"])
        assert torch.equal(got, sighted[partner]["pixel_values"])  # that row's own image
        assert torch.equal(shard[k]["input_ids"], sighted[i]["input_ids"])  # its own question


def test_mismatched_partners_differ_in_the_field() -> None:
    frame = _rows([f"c{i}" for i in range(12)]).assign(modality=["CT"] * 8 + ["MRI"] * 3 + ["X"])
    partners = shuffled_partners(frame, by="modality")
    for rid, position in partners.items():
        own = frame.loc[frame[R.ID] == rid, "modality"].item()
        assert frame["modality"].iloc[position] != own
    with pytest.raises(ValueError, match=r"data\.mismatch_field"):
        shuffled_partners(frame, by="organ")


def test_mismatched_needs_a_field_the_dataset_has(cache_dir: Path) -> None:
    from medvqa.config import check_config
    from medvqa.errors import ConfigError

    ok = compose(["data.extra_eval_images=[mismatched]"], cache_dir)
    check_config(ok)  # the synthetic dataset has a modality column
    bad = compose(["data.extra_eval_images=[mismatched]", "data.mismatch_field=organ"], cache_dir)
    with pytest.raises(ConfigError, match=r"data\.mismatch_field=organ"):
        check_config(bad)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["shuffled", "mismatched"])
def test_a_run_reports_the_delta_of_another_rows_image(
    mode: str, tmp_path: Path, cache_dir: Path, tiny_model_dir: Path
) -> None:
    """Both modes through a whole run. The demo's shift tests OoD on X-rays only: their
    mismatched (other-modality) images come from the i.i.d. split, since the partners are drawn
    from every test split of the job. Each run also carries other beyond-accuracy views (one
    whole run each, checked by `_check_*`)."""
    args = ["debug=smoke", "logger=csv", f"data.extra_eval_images=[{mode}]"]
    if mode == "shuffled":  # val answers too: the temperature is fitted on them
        args += [
            "metric=[traditional,calibration,subgroups]",
            "metric.calibration.min_rows=1",  # the smoke splits' few closed answers
            "task.eval_splits=[val,test_iid,test_ood]",
        ]
    else:
        args += ["dataset.paraphrases=true", "data.option_orders=1", "prompt=sure"]
    proc = run_main(args, tmp_path, cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((tmp_path / "results.json").read_text())["metrics"]
    for split in ("test_iid", "test_ood"):
        sighted, other = metrics[f"{split}/closed_acc"], metrics[f"{mode}/{split}/closed_acc"]
        assert metrics[f"delta_{mode}/{split}/closed_acc"] == pytest.approx(sighted - other)
    answers = pd.read_json(tmp_path / f"predictions_{mode}.jsonl", lines=True)
    assert len(answers) == sum(metrics.get(f"{s}/n", 0) for s in ("val", "test_iid", "test_ood"))
    # Row by row: the per-sample reliance columns in scores.parquet, and the split's figures
    # recomputed from them by hand.
    scored = pd.read_parquet(tmp_path / "scores.parquet")
    theirs = pd.read_parquet(tmp_path / f"scores_{mode}.parquet").set_index(["split", "id"])
    closed = scored[scored["answer_type"] == "closed"]
    expected = theirs.loc[list(zip(closed["split"], closed["id"], strict=True)), "closed_correct"]
    assert closed[f"reliance_{mode}_correct"].tolist() == expected.tolist()
    for split, rows in closed.groupby("split"):
        right = rows[rows["closed_correct"] == 1]
        survive = metrics[f"{split}/reliance_{mode}_closed_survive"]
        if len(right):
            assert survive == pytest.approx(right[f"reliance_{mode}_correct"].mean())
        quadrants = [metrics[f"{split}/reliance_{mode}_closed_{q}"] for q in QUADRANTS]
        assert sum(quadrants) == pytest.approx(1.0)
    # One modality in the OoD split: drawn within it, mismatched rows would have no partner.
    assert answers.loc[answers["split"] == "test_ood", "modality"].nunique() == 1
    if mode == "shuffled":
        _check_calibration_and_subgroups(tmp_path, metrics)
    else:
        _check_paraphrases_and_option_orders(tmp_path, metrics, scored)
    _check_rescoring_gives_the_views(tmp_path, args, mode, metrics)


VIEW_KEY = re.compile(r"reliance_|consistency_|_scaled|_temperature|^delta_")


def _check_rescoring_gives_the_views(run_dir: Path, args: list[str], mode: str, metrics: dict):
    """`medvqa-score` on the run's files, with its image-mode and reordered answers, reports
    the run's view figures: reliance and the deltas, paraphrase consistency and order flips
    (mismatched), calibration's temperature (shuffled)."""
    from medvqa.cli.score import score_file

    order = run_dir / "predictions_order1.jsonl"
    again = score_file(
        run_dir / "predictions.jsonl",
        run_dir / "rescored",
        overrides=[a for a in args if a.startswith(("debug=", "metric"))],
        image_modes={mode: run_dir / f"predictions_{mode}.jsonl"},
        orders={1: order} if order.exists() else {},
    )
    nan = float("nan")
    ours = {k: nan if v is None else v for k, v in metrics.items() if VIEW_KEY.search(k)}
    assert len(ours) > 10
    assert {k for k in again if VIEW_KEY.search(k)} == set(ours)
    assert {k: again[k] for k in ours} == pytest.approx(ours, nan_ok=True)
    rescored = pd.read_parquet(run_dir / "rescored" / "scores.parquet")
    assert f"reliance_{mode}_correct" in rescored


def _check_calibration_and_subgroups(run_dir: Path, metrics: dict) -> None:
    answers = pd.read_json(run_dir / "predictions.jsonl", lines=True)
    assert (answers[R.LOGPROB_MEAN] <= 0).all() and (answers[R.ANSWER_TOKENS] >= 1).all()
    for split in ("test_iid", "test_ood"):
        assert 0 <= metrics[f"{split}/calibration_closed_ece"] <= 1
        assert 0 <= metrics[f"{split}/calibration_closed_brier"] <= 1
        assert f"{split}/subgroups_tested" in metrics
        assert 0 <= metrics[f"{split}/calibration_closed_ece_scaled"] <= 1
    assert metrics["val/calibration_closed_temperature"] in R.TEMPERATURES
    scored = pd.read_parquet(run_dir / "scores.parquet")
    assert (
        scored.loc[scored["answer_type"] == "closed", "calibration_confidence_scaled"].notna().all()
    )


def _check_paraphrases_and_option_orders(run_dir: Path, metrics: dict, scored: pd.DataFrame):
    # Paraphrase pairs: those whose both rows were asked (the smoke run samples rows).
    sizes = scored.groupby("paraphrase_group")["id"].count()
    complete = int((sizes == 2).sum())
    assert complete and scored["consistency_paraphrase_agrees"].notna().sum() == 2 * complete
    n_pairs = sum(
        v for k, v in metrics.items() if re.search(r"consistency_paraphrase_\w+_n_pairs$", k)
    )
    assert n_pairs == complete
    # Reordered options: the same candidates in another order, the flips from the scores.
    main = pd.read_json(run_dir / "predictions.jsonl", lines=True)
    options = main.set_index(["split", "id"])["candidates"]
    reordered = pd.read_json(run_dir / "predictions_order1.jsonl", lines=True)
    closed = reordered[reordered["answer_type"] == "closed"].set_index(["split", "id"])
    assert len(closed)
    for key, other in closed["candidates"].items():
        assert sorted(other) == sorted(options[key]) and other != options[key]
    for split in ("test_iid", "test_ood"):
        rows = scored[(scored["split"] == split) & (scored["answer_type"] == "closed")]
        flips = metrics[f"{split}/consistency_order_closed_flip_rate"]
        assert flips == pytest.approx(rows["consistency_order_flips"].mean())
        assert f"order1/{split}/closed_acc" in metrics


def _scored(split_ids, answers, predictions, types, correct, cases) -> pd.DataFrame:
    """A scored table as the traditional family leaves it (closed_correct / open_exact_match)."""
    frame = pd.DataFrame(
        {
            R.SPLIT: [s for s, _ in split_ids],
            R.ID: [i for _, i in split_ids],
            R.ANSWER: answers,
            R.PREDICTION: predictions,
            R.ANSWER_TYPE: types,
            R.CASE_ID: cases,
        }
    )
    closed = frame[R.ANSWER_TYPE] == "closed"
    frame["closed_correct"] = [
        c if k else float("nan") for c, k in zip(correct, closed, strict=True)
    ]
    frame["open_exact_match"] = [
        float("nan") if k else c for c, k in zip(correct, closed, strict=True)
    ]
    return frame


def test_a_view_without_its_familys_columns_is_skipped_naming_them(caplog) -> None:
    """Image reliance reads the traditional family's right/wrong columns: scored without them
    (metric=[mcq], say) it names the columns and the family instead of giving NaN figures;
    missing only the open answers' column, it still gives the closed answers' figures."""
    import logging

    from medvqa.generation.passes import ImageMode
    from medvqa.views import JobRows, run_views

    blank = ImageMode.after("LoRA", image_mode="blank")
    ids = [("test_iid", "a"), ("test_iid", "b"), ("test_iid", "c")]
    full = _scored(ids, ["yes", "no", "lung"], ["yes", "yes", "lung"],
                   ["closed", "closed", "open"], [1.0, 0.0, 1.0], ["c1", "c2", "c3"])  # fmt: skip
    bare = full.drop(columns=["closed_correct", "open_exact_match"])
    with caplog.at_level(logging.WARNING):
        _, figures = run_views(JobRows(bare, others={"blank/": bare}, passes=[blank]))
    assert not any("reliance_" in k for k in figures)
    assert "['closed_correct', 'open_exact_match']" in caplog.text and "skipped" in caplog.text
    caplog.clear()
    closed_only = full.drop(columns=["open_exact_match"])
    with caplog.at_level(logging.WARNING):
        _, figures = run_views(JobRows(closed_only, others={"blank/": closed_only}, passes=[blank]))
    assert figures["test_iid/reliance_blank_closed_survive"] == 1.0
    assert "['open_exact_match']" in caplog.text and "NaN" in caplog.text


def test_reliance_figures_by_hand() -> None:
    """Six closed and two open questions; with the image blanked: which answers survive,
    which change, and the quadrants, each computed by hand."""
    ids = [("test_iid", f"q{i}") for i in range(8)]
    types = ["closed"] * 6 + ["open"] * 2
    cases = ["a", "a", "b", "b", "c", "c", "d", "d"]
    answers = ["yes", "no", "yes", "no", "yes", "no", "lung", "liver"]
    # real image: q0-q3 right, q4-q5 wrong; q6 right, q7 wrong
    real = _scored(ids, answers, ["Yes", "no", "yes", "no", "no", "yes", "lung", "heart"],
                   types, [1, 1, 1, 1, 0, 0, 1, 0], cases)  # fmt: skip
    # blank: q0 the same answer (capitalised: not a change), q1 flips to wrong, q2 the same,
    # q3 flips, q4 flips to right, q5 unchanged; q6 the same, q7 changes (still wrong)
    blank = _scored(ids, answers, ["yes", "yes", "yes", "yes", "yes", "yes", "lung", "kidney"],
                    types, [1, 0, 1, 0, 1, 0, 1, 0], cases)  # fmt: skip
    blank = blank.iloc[::-1].reset_index(drop=True)  # paired by split and id, not by position
    scored, modes = add_reliance(real, {"blank": blank, "image": real})
    assert modes == ["blank"]  # `image` is no counterfactual
    assert scored["reliance_blank_correct"].tolist() == [1, 0, 1, 0, 1, 0, 1, 0]
    assert scored["reliance_blank_changed"].tolist() == [0, 1, 0, 1, 1, 0, 0, 1]
    m = reliance_metrics(scored, modes)
    assert m["test_iid/reliance_blank_closed_survive"] == pytest.approx(2 / 4)
    assert m["test_iid/reliance_blank_closed_changed"] == pytest.approx(3 / 6)
    assert m["test_iid/reliance_blank_closed_n_correct"] == 4
    quadrants = {q: m[f"test_iid/reliance_blank_closed_{q}"] for q in QUADRANTS}
    assert quadrants == pytest.approx(
        {"correct_dependent": 2 / 6, "correct_independent": 2 / 6,
         "wrong_dependent": 1 / 6, "wrong_independent": 1 / 6}
    )  # fmt: skip
    assert m["test_iid/reliance_blank_open_survive"] == 1.0
    assert m["test_iid/reliance_blank_open_changed"] == 0.5
    with_ci = reliance_metrics(scored, modes, bootstrap={"B": 200, "seed": 0, "level": 0.95})
    lo, hi = (
        with_ci["test_iid/reliance_blank_closed_survive_ci_lo"],
        with_ci["test_iid/reliance_blank_closed_survive_ci_hi"],
    )
    assert 0 <= lo <= 0.5 <= hi <= 1


def test_a_missing_counterfactual_answer_makes_the_split_nan_not_a_share_of_the_rest() -> None:
    ids = [("test_iid", "q0"), ("test_iid", "q1"), ("test_ood", "q2")]
    real = _scored(ids, ["yes"] * 3, ["yes"] * 3, ["closed"] * 3, [1, 1, 1], ["a", "b", "c"])
    blank = real[real[R.ID] != "q1"]  # q1 was never answered blind
    scored, modes = add_reliance(real, {"blank": blank})
    m = reliance_metrics(scored, modes)
    assert math.isnan(m["test_iid/reliance_blank_closed_survive"])
    assert math.isnan(m["test_iid/reliance_blank_closed_correct_independent"])
    assert m["test_ood/reliance_blank_closed_survive"] == 1.0


def test_reliance_per_breakdown_value_finds_the_subgroup_answered_without_the_image() -> None:
    """A modality whose questions are answered from their text (the same answer blind) and one
    whose answers need the image: the breakdown by modality tells them apart."""
    ids = [("test_iid", f"q{i}") for i in range(8)]
    modality = ["x-ray"] * 4 + ["ct"] * 4
    real = _scored(ids, ["yes"] * 8, ["yes"] * 8, ["closed"] * 8, [1] * 8, list("abcdefgh"))
    blank = _scored(ids, ["yes"] * 8, ["yes"] * 4 + ["no"] * 4, ["closed"] * 8,
                    [1] * 4 + [0] * 4, list("abcdefgh"))  # fmt: skip
    scored, modes = add_reliance(real.assign(modality=modality), {"blank": blank})
    m = reliance_metrics(scored, modes, breakdown=["modality"])
    assert m["test_iid/modality=x-ray/reliance_blank_closed_survive"] == 1.0
    assert m["test_iid/modality=ct/reliance_blank_closed_survive"] == 0.0
    assert m["test_iid/reliance_blank_closed_survive"] == 0.5


def test_the_synthetic_text_cue_modality_is_found_by_the_reliance_analysis(
    tmp_path: Path,
) -> None:
    """`dataset.text_cue_modality=ct`: exactly the CT questions carry their answer in their
    text. A reader that looks at the image when it can (right with the real image, guessing
    "yes" without it) but reads a stated answer first keeps every CT answer without the image
    and loses the MRI ones it guessed wrong: the breakdown by modality finds the CT subgroup."""
    from medvqa.data.sources.synthetic import SyntheticVQA
    from medvqa.data.sources.synthetic.dataset import text_cue

    plain = SyntheticVQA(tmp_path, n_cases=30, image_size=16, questions_per_image=3).table()
    cued = SyntheticVQA(
        tmp_path, n_cases=30, image_size=16, questions_per_image=3, text_cue_modality="ct"
    ).table()
    assert plain[R.QUESTION].str.contains("The report says").sum() == 0  # default unchanged
    is_ct = cued["modality"] == "ct"
    assert is_ct.any() and (~is_ct).any()
    expected = [text_cue(q, a) for q, a in zip(plain[R.QUESTION], plain[R.ANSWER], strict=True)]
    assert cued[R.QUESTION].tolist() == [
        e if ct else q for e, ct, q in zip(expected, is_ct, plain[R.QUESTION], strict=True)
    ]
    table = cued.assign(**{R.SPLIT: "test_iid"})

    def reader(sees_image: bool) -> pd.DataFrame:
        stated = table[R.QUESTION].str.extract(r"^The report says: (.*?)\. ", expand=False)
        guess = table[R.ANSWER] if sees_image else "yes"
        answer = stated.where(stated.notna(), guess)
        right = (answer == table[R.ANSWER]).astype(float)
        closed = table[R.ANSWER_TYPE] == "closed"
        return table.assign(
            **{
                R.PREDICTION: answer,
                "closed_correct": right.where(closed),
                "open_exact_match": right.where(~closed),
            }
        )

    scored, modes = add_reliance(reader(True), {"blank": reader(False)})
    m = reliance_metrics(scored, modes, breakdown=["modality"])
    assert m["test_iid/modality=ct/reliance_blank_closed_survive"] == 1.0
    assert m["test_iid/modality=ct/reliance_blank_closed_correct_dependent"] == 0.0
    mri = m["test_iid/modality=mri/reliance_blank_closed_survive"]
    assert mri < 0.8  # the guessed answers that were not "yes"
    closed_mri = table[(table["modality"] == "mri") & (table[R.ANSWER_TYPE] == "closed")]
    assert mri == pytest.approx((closed_mri[R.ANSWER] == "yes").mean())


@pytest.mark.slow
def test_a_split_without_partners_is_refused_before_training(
    tmp_path: Path, cache_dir: Path, tiny_model_dir: Path
) -> None:
    """`shuffled` on a split of one row (no other case to take an image from) used to fail
    after training and generation, naming no split; now before the model loads."""
    args = [
        "debug=smoke",
        "logger=csv",
        "data.extra_eval_images=[shuffled]",
        "data.limit.test_iid=1",
    ]
    proc = run_main(args, tmp_path, cache_dir)
    assert proc.returncode == 1
    assert "image mode 'shuffled' on test_iid (1 rows" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "trained").exists() and not (tmp_path / "predictions.jsonl").exists()
    from medvqa.training.datamodule import check_partners

    one = pd.DataFrame({R.ID: ["a", "b"], R.CASE_ID: ["c1", "c2"], "modality": ["CT", "CT"]})
    check_partners({"test_iid": one}, ["image", "shuffled"], "modality")  # two cases: fine
    with pytest.raises(ValueError, match=r"'mismatched' on the test splits together .*\['CT'\]"):
        check_partners({"test_iid": one, "test_ood": one}, ["mismatched"], "modality")
