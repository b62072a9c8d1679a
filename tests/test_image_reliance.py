"""The `shuffled` image mode (issue: beyond accuracy, image reliance): each question is shown a
real image of another case from the same split, the same pairing in every run."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from medvqa.data import records as R
from medvqa.training.datamodule import VQADataset, shuffled_partners
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


@pytest.mark.parametrize("mode", ["shuffled", "mismatched"])
def test_a_run_reports_the_delta_of_another_rows_image(
    mode: str, tmp_path: Path, cache_dir: Path, tiny_model_dir: Path
) -> None:
    """Both modes through a whole run. The demo's shift tests OoD on X-rays only: their
    mismatched (other-modality) images come from the i.i.d. split, since the partners are drawn
    from every test split of the job."""
    args = ["debug=smoke", "logger=csv", f"data.extra_eval_images=[{mode}]"]
    proc = run_main(args, tmp_path, cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((tmp_path / "results.json").read_text())["metrics"]
    for split in ("test_iid", "test_ood"):
        sighted, other = metrics[f"{split}/closed_acc"], metrics[f"{mode}/{split}/closed_acc"]
        assert metrics[f"delta_{mode}/{split}/closed_acc"] == pytest.approx(sighted - other)
    answers = pd.read_json(tmp_path / f"predictions_{mode}.jsonl", lines=True)
    assert len(answers) == metrics["test_iid/n"] + metrics["test_ood/n"]
    # One modality in the OoD split: drawn within it, mismatched rows would have no partner.
    assert answers.loc[answers["split"] == "test_ood", "modality"].nunique() == 1
