"""Region occlusion (issue: see why a model fails under shift): the rows whose question concerns
a region get it from their dataset (the synthetic findings' exact masks, RoboSurg-VQA's frame
masks, SLAKE's organ boxes and masks), the pass answers them again with the region hidden and
with an equal area elsewhere hidden, and the view tells a model that reads the region from one
that ignores the image."""

from __future__ import annotations

import functools
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from medvqa.data import records as R
from medvqa.data.regions import (
    LABEL_UNMATCHED,
    NAMES_NO_REGION,
    NO_REGION_FILE,
    REGION,
    REGION_MISSING,
    Region,
    elsewhere,
    has_region,
    occlude,
    region_mask,
)
from medvqa.data.sources.robosurg_vqa import RoboSurgVqa
from medvqa.data.sources.slake import Slake
from medvqa.data.sources.synthetic import SyntheticVQA
from medvqa.data.sources.synthetic.cases import RENDER_STREAM, sample_case
from medvqa.data.sources.synthetic.questions import REGION_TEMPLATES
from medvqa.data.sources.synthetic.render import render_image, to_png_image
from medvqa.data.transforms import rng_for
from medvqa.errors import DataError
from medvqa.generation import passes as P
from medvqa.generation.passes import RegionOcclusion
from medvqa.views import JobRows, run_views
from tests.conftest import compose, run_main
from tests.native import robosurg_vqa as robosurg_native
from tests.native import slake as slake_native

BOOTSTRAP = {"B": 200, "seed": 0, "level": 0.95}
CASES = 16


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> SyntheticVQA:
    """A small synthetic dataset with its findings' masks (`dataset.regions=true`)."""
    cache = tmp_path_factory.mktemp("regions")
    return SyntheticVQA(cache, n_cases=CASES, image_size=32, regions=True)


def _gray(pixels: np.ndarray) -> np.ndarray:
    return np.asarray(to_png_image(pixels))[..., 0]


# -- where the regions come from ------------------------------------------------------------------


def test_synthetic_masks_cover_exactly_what_the_findings_change(
    synthetic: SyntheticVQA, tmp_path: Path
) -> None:
    """`dataset.regions=true` adds masks and two columns, nothing else: the same images and
    rows. Each mask labels every finding of its image, and outside it the image is, pixel for
    pixel, the one the same seed renders without the findings. The questions about the
    findings get their image's mask; the others say why they have none."""
    table = synthetic.table()
    plain = SyntheticVQA(tmp_path, n_cases=CASES, image_size=32)
    assert table.drop(columns=[REGION, REGION_MISSING]).equals(plain.table())
    about = table["template"].isin(REGION_TEMPLATES)
    assert (has_region(table) == (about & (table["lesion"] == "yes"))).all()
    assert set(table.loc[~about, REGION_MISSING]) == {NAMES_NO_REGION}
    assert set(table.loc[about & (table["lesion"] == "no"), REGION_MISSING]) == {NO_REGION_FILE}
    assert synthetic.report()["regions"] == {
        "with_region": int(has_region(table).sum()),
        "rows": len(table),
        "without": table[REGION_MISSING].value_counts().to_dict(),
    }
    n = checked = 0
    for case in range(CASES):
        for j, spec in enumerate(sample_case(0, case, (1, 2)).images):
            image_id, n = f"img{n:05d}", n + 1
            ref = f"images/{image_id}.png"
            seen = np.asarray(synthetic.load_image(ref))[..., 0]
            assert np.array_equal(seen, np.asarray(plain.load_image(ref))[..., 0])
            if not spec.lesion:
                assert not (synthetic.root / "masks" / f"{image_id}.png").exists()
                continue
            labels = np.asarray(Image.open(synthetic.root / "masks" / f"{image_id}.png"))
            assert labels.max() == spec.lesion_count
            bare = replace(spec, lesion_count=0)
            without = _gray(render_image(bare, 32, (RENDER_STREAM, 0, case, j)))
            outside = labels == 0
            assert np.array_equal(seen[outside], without[outside])
            assert (seen[~outside] != without[~outside]).any()
            checked += 1
    assert checked >= 5


def test_robosurg_questions_about_the_mask_get_the_frames_mask(tmp_path: Path) -> None:
    """RoboSurg-VQA in its release layout: the tasks about the official mask (q2, q8) get
    their frame's `mask_path`, whose labelled pixels are the region; a frame the manifest
    gives no mask has none, and the other tasks name none."""
    fixture = robosurg_native.write(tmp_path / "robosurg")
    no_mask = fixture.manifest[0]["record_id"]
    for row in fixture.manifest:
        if row["record_id"] == no_mask:
            del row["mask_path"]
    robosurg_native.write_jsonl(fixture.manifest_file, fixture.manifest)
    source = RoboSurgVqa(fixture.root)
    table = source.table()
    about = table["question_id"].isin(["q2", "q8.mask_center_5pct_v1"])
    masked = table[R.IMAGE_ID] != no_mask
    assert (has_region(table) == (about & masked)).all()
    assert set(table.loc[about & ~masked, REGION_MISSING]) == {NO_REGION_FILE}
    assert set(table.loc[~about, REGION_MISSING]) == {NAMES_NO_REGION}
    counts = source.report()["regions"]
    assert counts["with_region"] == int((about & masked).sum()) > 0
    row = table[has_region(table)].iloc[0]
    image = source.load_image(row[R.IMAGE], row[R.ID])
    frame = next(f for f in fixture.manifest if f["record_id"] == row[R.IMAGE_ID])
    expected = np.load(fixture.root / frame["mask_path"]) != 0
    assert np.array_equal(region_mask(source, row, image.size), expected)


def test_slake_organs_named_by_the_releases_labels_get_their_boxes(tmp_path: Path) -> None:
    """SLAKE's `detection.json` per image: a question naming a label of the release (any
    case, a plural) gets that organ's boxes in its image, refined by `mask.png` where the
    folder has one; the others say: no region file, no label named, or a label the image
    lacks. The region files are part of the table's cache key."""
    fixture = slake_native.write(tmp_path / "slake")
    slake_native.write_regions(fixture.root)
    source = Slake(fixture.root, cache_dir=tmp_path / "cache")
    table = source.table()
    # 12 images x 10 kept rows; liver and lung images: 4 named organs each (3 liver, 1
    # "lungs"); lung-only images: the lung question, 3 liver questions unmatched.
    assert source.report()["regions"] == {
        "with_region": 4 * 4 + 4 * 1,
        "rows": 120,
        "without": {NAMES_NO_REGION: 8 * 6, LABEL_UNMATCHED: 4 * 3, NO_REGION_FILE: 4 * 10},
    }
    liver = table[
        (table[R.IMAGE] == "imgs/xmlab0/source.jpg") & table[R.QUESTION].str.contains("liver")
    ]
    lungs = table[
        (table[R.IMAGE] == "imgs/xmlab1/source.jpg") & table[R.QUESTION].str.contains("lungs")
    ]
    x, y, w, h = slake_native.LIVER_BOX
    refined = np.zeros((16, 16), dtype=bool)
    refined[y : y + h, x : slake_native.MASK_COLUMNS] = True  # the box's labelled pixels
    for _, row in liver.iterrows():
        assert np.array_equal(region_mask(source, row, (16, 16)), refined)
    x, y, w, h = slake_native.LUNG_BOX
    box = np.zeros((16, 16), dtype=bool)
    box[y : y + h, x : x + w] = True  # no mask.png in this folder: the box itself
    (row,) = [r for _, r in lungs.iterrows()]
    assert np.array_equal(region_mask(source, row, (16, 16)), box)
    before = source.fingerprint()
    (fixture.root / "imgs/xmlab1/detection.json").write_text(json.dumps([{"Heart": [1, 1, 2, 2]}]))
    assert Slake(fixture.root, cache_dir=tmp_path / "cache").fingerprint() != before


def test_a_region_that_is_no_region_is_refused_naming_the_row(
    synthetic: SyntheticVQA, tmp_path: Path
) -> None:
    """A `region` cell or mask path from a stranger: an edited cell, a mask outside the
    dataset's root, a missing mask file, a mask that is no array are refused, naming the row."""
    row = synthetic.table().loc[lambda t: has_region(t)].iloc[0]
    for cell in ("{", '{"mask": 3}', '{"boxes": [[1, 2, 3]]}', '{"code": "x"}', "{}", None):
        with pytest.raises(DataError, match=f"row {row[R.ID]!r}"):
            region_mask(synthetic, {**row, REGION: cell}, (32, 32))
    for mask, why in (("../../etc/passwd", "escapes"), ("masks/gone.png", "does not exist")):
        with pytest.raises(DataError, match=why):
            region_mask(synthetic, {**row, REGION: Region(mask=mask).text()}, (32, 32))
    (synthetic.root / "masks" / "odd.npy").write_bytes(b"not an array")
    with pytest.raises(DataError, match="cannot read region mask"):
        region_mask(synthetic, {**row, REGION: Region(mask="masks/odd.npy").text()}, (32, 32))


# -- the occlusions ----------------------------------------------------------------------------


def test_the_equal_area_elsewhere_is_away_from_the_region_and_drawn_per_row() -> None:
    """The region's own shape moved inside the image: the same area, clear of the region where
    the image has room, the same for the same seed and row whatever else is drawn, another
    for another row; a region over half the image overlaps it as little as the draws allow."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        mask = np.zeros((40, 48), dtype=bool)
        top, left = rng.integers(0, 30), rng.integers(0, 36)
        mask[top : top + rng.integers(2, 10), left : left + rng.integers(2, 12)] = True
        mask[top, left + 1 : left + 3] = True
        moved = elsewhere(mask, rng_for(0, "row-a"))
        assert moved.sum() == mask.sum() and not (moved & mask).any()
        assert np.array_equal(moved, elsewhere(mask, rng_for(0, "row-a")))
        assert not np.array_equal(moved, elsewhere(mask, rng_for(0, "row-b")))
    big = np.zeros((20, 20), dtype=bool)
    big[2:18, 1:15] = True
    moved = elsewhere(big, rng_for(0, "row-a"))
    assert moved.sum() == big.sum() and (moved & big).sum() < big.sum()


def test_occlusion_fills_the_mask_only() -> None:
    pixels = np.random.default_rng(1).integers(0, 256, size=(12, 10, 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    mask = np.zeros((12, 10), dtype=bool)
    mask[3:6, 2:7] = True
    for fill, colour in (("mean", pixels.reshape(-1, 3).mean(axis=0).round()), ("black", 0)):
        hidden = np.asarray(occlude(image, mask, fill))
        assert np.array_equal(hidden[~mask], pixels[~mask])
        assert (hidden[mask] == np.asarray(colour, dtype=np.uint8)).all()


# -- the pass ------------------------------------------------------------------------------------


def _job(**extra: object) -> P.Job:
    config = {"data": {"eval_image": "image"}, "peft": {"name": "lora", "label": "LoRA"}, **extra}
    return P.Job(config, P.main_label(config), tuned=True)


def test_the_pass_is_asked_for_by_its_setting_and_recorded() -> None:
    """Off by default; `passes.region_occlusion=true` (or `{fill: ...}`) gives two passes,
    the region's and the equal area's, recorded with the job's seed and read back as they
    ran; a value that is neither is refused at start, naming the key."""
    assert not any(isinstance(p, RegionOcclusion) for p in P.job_passes(_job()))
    passes = P.job_passes(_job(passes={"region_occlusion": {"fill": "black"}}, seed=7))
    region, away = [p for p in passes if isinstance(p, RegionOcclusion)]
    assert (region.prefix, away.prefix) == ("occluded_region/", "occluded_elsewhere/")
    assert region.label == "LoRA, region occluded" and (away.fill, away.seed) == ("black", 7)
    assert [P.from_record(json.loads(json.dumps(p.record()))) for p in passes] == passes
    for hostile in ({"where": "../x"}, {"where": "region", "fill": "$(rm)"}):
        with pytest.raises(ValueError):  # an edited record's pass: skipped by recorded_passes
            P.from_record({**away.record(), "settings": {**away.settings(), **hostile}})
    # the plan's phases (`EvalPass.planned`, as tests/test_pass_kinds.py sees costed): each
    # pass the evaluated rows at most, those with a region only
    assert region.planned(100) == ("LoRA, region occluded, the rows with a region (all rows at most)", 100)  # fmt: skip
    for bad in ("yes", {"fill": "red"}, {"colour": "mean"}, 1):
        (problem,) = P.pass_problems({"passes": {"region_occlusion": bad}})
        assert problem.startswith("passes.region_occlusion=") and "fill: mean|black" in problem
    assert P.pass_problems(compose(["+passes.region_occlusion=true"])) == []


def test_the_pass_hides_the_region_or_an_equal_area_of_each_row_with_a_region(
    synthetic: SyntheticVQA,
) -> None:
    """Generation asks the rows with a region only, each image changed as the row says (read
    through the dataset: `image_change`): the region's pixels filled, or as many pixels away
    from it; the rows of one image share the region's image but not the placed area's. A job
    whose evaluated rows have no region is refused before the model loads."""
    table = synthetic.table()
    region, away = (
        RegionOcclusion.after("x", where="region"),
        RegionOcclusion.after("x", where="elsewhere"),
    )
    asked = region.rows(table)
    assert len(asked) == int(has_region(table).sum()) and has_region(asked).all()
    two = asked[asked.duplicated(R.IMAGE_ID, keep=False)].groupby(R.IMAGE_ID).head(2).iloc[:2]
    assert len(two) == 2
    keys = {p.where: [p.image_key("k", r) for _, r in two.iterrows()] for p in (region, away)}
    assert keys["region"][0] == keys["region"][1] and keys["elsewhere"][0] != keys["elsewhere"][1]
    row = asked.iloc[0]
    image = synthetic.load_image(row[R.IMAGE])
    mask = region_mask(synthetic, row, image.size)
    for p, hidden in ((region, mask), (away, elsewhere(mask, rng_for(0, str(row[R.ID]))))):
        changed = np.asarray(p.image_change(synthetic).transform_image(image, row))
        same = (changed == np.asarray(image)).all(axis=2)
        assert same[~hidden].all() and not same[hidden].all() and hidden.sum() == mask.sum()
    with pytest.raises(TypeError, match="image_change"):
        region.transform_image(image, row)
    with pytest.raises(ValueError, match="no evaluated row has a region"):
        RegionOcclusion.check([region, away], {"test_iid": table[~has_region(table)]}, _job())


# -- the view: planted models --------------------------------------------------------------------


@functools.cache
def _planted_rows(n: int = 40) -> tuple[pd.DataFrame, list[Image.Image], list[np.ndarray]]:
    """`n` closed questions "is the marked spot bright?" over noise images, each with its spot
    (the region) bright or dark; two rows per case, i.i.d. and OoD halves."""
    rng = np.random.default_rng(3)
    images, masks, rows = [], [], []
    for i in range(n):
        pixels = rng.integers(100, 156, size=(24, 24, 3), dtype=np.uint8)
        mask = np.zeros((24, 24), dtype=bool)
        top, left = rng.integers(0, 18, size=2)
        mask[top : top + 5, left : left + 5] = True
        bright = i % 2 == 0
        pixels[mask] = 230 if bright else 20
        images.append(Image.fromarray(pixels))
        masks.append(mask)
        rows.append({R.SPLIT: "test_iid" if i < n // 2 else "test_ood", R.ID: f"q{i}",
                     R.CASE_ID: f"c{i // 2}", R.ANSWER: "yes" if bright else "no",
                     R.ANSWER_TYPE: "closed", "reader": "region" if i % 4 < 2 else "blind"})  # fmt: skip
    return pd.DataFrame(rows), images, masks


def _answers(rows: pd.DataFrame, images: list[Image.Image], model) -> pd.DataFrame:  # type: ignore[no-untyped-def]
    """`rows` answered by `model(image, row)`, scored as the traditional family scores them."""
    answers = [model(image, row) for image, (_, row) in zip(images, rows.iterrows(), strict=True)]
    right = [float(a == t) for a, t in zip(answers, rows[R.ANSWER], strict=True)]
    return rows.assign(**{R.PREDICTION: answers, "closed_correct": right})


def _occluded(images: list[Image.Image], masks: list[np.ndarray], rows: pd.DataFrame, where: str):  # type: ignore[no-untyped-def]
    """The images as the pass shows them: each row's region, or the equal area, filled."""
    out = []
    for image, mask, rid in zip(images, masks, rows[R.ID], strict=True):
        hidden = mask if where == "region" else elsewhere(mask, rng_for(0, str(rid)))
        out.append(occlude(image, hidden, "mean"))
    return out


def _view(model, breakdown: tuple[str, ...] = ()) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """The region view's figures of `model` on the planted rows, through `run_views`."""
    rows, images, masks = _planted_rows()
    passes = [RegionOcclusion.after("m", where=w) for w in ("region", "elsewhere")]
    others = {
        p.prefix: _answers(rows, _occluded(images, masks, rows, p.where), model) for p in passes
    }
    main = _answers(rows, images, model)
    _, figures = run_views(JobRows(main, others, passes, list(breakdown), BOOTSTRAP))
    return figures


def _region_reader(image: Image.Image, row: pd.Series) -> str:
    """Reads the spot only: bright, dark, or (filled with the image's mean) neither."""
    _, _, masks = _planted_rows()
    spot = np.asarray(image)[masks[int(str(row[R.ID])[1:])]].mean()
    return "yes" if spot > 200 else "no" if spot < 50 else "unsure"


def _image_blind(image: Image.Image, row: pd.Series) -> str:
    """Answers from the question alone (here: its parity), never looking."""
    return "yes" if int(str(row[R.ID])[1:]) % 2 == 0 else "no"


def test_a_model_that_reads_only_the_region_is_caught() -> None:
    """Every answer changes with the region hidden, none with the same area elsewhere: a
    wide gap between the two change rates (intervals apart), a full accuracy drop under the
    region's occlusion and none elsewhere, and no row right without the evidence."""
    m = _view(_region_reader)
    for split in ("test_iid", "test_ood"):
        assert m[f"{split}/occlusion_n"] == 20
        assert m[f"{split}/occlusion_region_changed"] == 1.0
        assert m[f"{split}/occlusion_elsewhere_changed"] == 0.0
        assert m[f"{split}/occlusion_region_acc_drop"] == 1.0
        assert m[f"{split}/occlusion_elsewhere_acc_drop"] == 0.0
        assert m[f"{split}/occlusion_region_still_right"] == 0.0
        assert m[f"{split}/occlusion_elsewhere_still_right"] == 1.0


def test_a_model_that_ignores_the_image_is_caught_the_other_way() -> None:
    """No answer changes under either occlusion, accuracy does not drop, and every right
    answer is right without the evidence; by subgroup, the region readers and the blind
    rows of one model are told apart."""
    m = _view(_image_blind)
    for split in ("test_iid", "test_ood"):
        for where in ("region", "elsewhere"):
            assert m[f"{split}/occlusion_{where}_changed"] == 0.0
            assert m[f"{split}/occlusion_{where}_acc_drop"] == 0.0
            assert m[f"{split}/occlusion_{where}_still_right"] == 1.0
            assert m[f"{split}/occlusion_{where}_changed_ci_hi"] == 0.0

    def mixed(image: Image.Image, row: pd.Series) -> str:
        reads = row["reader"] == "region"
        return _region_reader(image, row) if reads else _image_blind(image, row)

    m = _view(mixed, breakdown=("reader",))
    assert m["test_iid/reader=region/occlusion_region_changed"] == 1.0
    assert m["test_iid/reader=blind/occlusion_region_changed"] == 0.0
    lo = m["test_iid/occlusion_region_changed_ci_lo"]
    assert 0 < lo < m["test_iid/occlusion_region_changed"] == 0.5


def test_a_missing_occluded_answer_makes_its_group_nan() -> None:
    """A row with a region whose answer under one occlusion is missing: that occlusion's
    figures of its split are NaN (never a share of the rows that happen to have one); the
    other occlusion's, over the same rows, and the other split's stand."""
    rows, images, _ = _planted_rows()
    passes = [RegionOcclusion.after("m", where=w) for w in ("region", "elsewhere")]
    main = _answers(rows, images, _image_blind)
    others = {p.prefix: main for p in passes}
    others["occluded_elsewhere/"] = main[main[R.ID] != "q0"]  # q0 (i.i.d.) never answered
    _, m = run_views(JobRows(main, others, passes))
    assert math.isnan(m["test_iid/occlusion_elsewhere_changed"])
    assert math.isnan(m["test_iid/occlusion_elsewhere_acc_drop"])
    assert m["test_iid/occlusion_region_changed"] == 0.0 and m["test_iid/occlusion_n"] == 20
    assert m["test_ood/occlusion_elsewhere_changed"] == 0.0


# -- a run ---------------------------------------------------------------------------------------


def test_the_region_pass_runs_scores_and_reports(tmp_path: Path, cache_dir: Path) -> None:
    """One run on the tiny model with `dataset.regions=true +passes.region_occlusion=true`:
    both passes generated over exactly the evaluated rows with a region, scored, recorded
    (the OoD row drawn has none: that split asks nothing, its figures NaN); the view's
    figures in results.json; medvqa-report's table, figure and the explorer's pass columns."""
    from medvqa.cli.report import main as report_main

    run_dir = tmp_path / "runs" / "run"
    args = ["debug=smoke", "peft=none", "task.references=[]", "logger=csv",
            "data.limit.test_iid=12", "data.limit.test_ood=1", "dataset.regions=true",
            "+passes.region_occlusion=true"]  # fmt: skip
    done = run_main(args, run_dir, cache_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((run_dir / "results.json").read_text())
    kinds = [p["kind"] for p in record["provenance"]["passes"]]
    assert kinds.count("region_occlusion") == 2
    main = pd.read_json(run_dir / "predictions.jsonl", lines=True)
    expected = set(main.loc[has_region(main), R.ID])
    assert expected
    for key in ("occluded_region", "occluded_elsewhere"):
        asked = pd.read_json(run_dir / f"predictions_{key}.jsonl", lines=True)
        assert set(asked[R.ID]) == expected and len(asked) == len(expected)
        assert (run_dir / f"scores_{key}.parquet").is_file()
    metrics = record["metrics"]
    assert metrics["test_iid/occlusion_n"] == len(expected)
    assert 0 <= metrics["test_iid/occlusion_region_changed"] <= 1
    assert metrics["test_ood/occlusion_n"] == 0
    assert metrics["test_ood/occlusion_region_changed"] is None  # NaN: JSON null

    out = tmp_path / "report"
    assert report_main([str(tmp_path / "runs"), "--out", str(out)]) == 0
    rows = pd.read_csv(out / "runs.csv").set_index("method")
    assert rows.loc["No Finetune, region occluded", "kind"] == "extra region"
    assert list(out.glob("tables/Region_occlusion_*.csv"))
    assert list(out.glob("figures/region_occlusion_*.png"))
    text = (out / "explorer" / "rows.js").read_text()
    explorer = json.loads(text[text.index("{") : text.rindex("}") + 1])
    (run,) = explorer["runs"]
    assert [p["key"] for p in run["passes"]] == ["occluded_region", "occluded_elsewhere"]
    changed = {row["id"]: [p[1] for p in row["p"]] for row in explorer["rows"]}  # per pass
    assert {rid for rid, c in changed.items() if None not in c} == expected
    assert all(c == [None, None] for rid, c in changed.items() if rid not in expected)
