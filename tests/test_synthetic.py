"""The built-in synthetic dataset: deterministic, cached, schema-valid and visually learnable."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from medvqa.data import records as R
from medvqa.data.sources import synthetic as S
from medvqa.data.sources.synthetic import ImageSpec, SyntheticVQA, render_image
from medvqa.errors import DataError

N_CASES = 40


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("synthetic_cache")


@pytest.fixture(scope="module")
def ds(cache: Path) -> SyntheticVQA:
    return SyntheticVQA(cache, seed=3, n_cases=N_CASES)


@pytest.fixture(scope="module")
def table(ds: SyntheticVQA) -> pd.DataFrame:
    return ds.table()


def _pixels(ds: SyntheticVQA, ref: str) -> np.ndarray:
    return np.asarray(ds.load_image(ref).convert("L"), dtype=np.float64) / 255.0


# -- determinism -------------------------------------------------------------------------------


def test_same_params_give_identical_tables_and_images(
    tmp_path: Path, ds: SyntheticVQA, table: pd.DataFrame
) -> None:
    other = SyntheticVQA(tmp_path, seed=3, n_cases=N_CASES, images_per_case=[1, 2])
    assert other.root != ds.root and other.root.name == ds.root.name
    pd.testing.assert_frame_equal(table, other.table())
    for ref in table[R.IMAGE].unique()[:5]:
        assert (ds.root / ref).read_bytes() == (other.root / ref).read_bytes()


def test_different_seed_gives_different_data(
    tmp_path: Path, ds: SyntheticVQA, table: pd.DataFrame
) -> None:
    other = SyntheticVQA(tmp_path, seed=4, n_cases=N_CASES)
    assert other.root.name != ds.root.name
    t = other.table()
    assert not t["age"].equals(table["age"])
    ref = "images/img00000.png"
    assert (other.root / ref).read_bytes() != (ds.root / ref).read_bytes()


def test_case_content_does_not_depend_on_other_cases(
    tmp_path: Path, ds: SyntheticVQA, table: pd.DataFrame
) -> None:
    fewer = SyntheticVQA(tmp_path, seed=3, n_cases=10)
    small = fewer.table().drop(columns=[R.SOURCE_SPLIT])  # splits are drawn over all cases
    big = table[table[R.CASE_ID].isin(small[R.CASE_ID])].drop(columns=[R.SOURCE_SPLIT])
    pd.testing.assert_frame_equal(small.reset_index(drop=True), big.reset_index(drop=True))
    for ref in small[R.IMAGE].unique()[:3]:
        assert (fewer.root / ref).read_bytes() == (ds.root / ref).read_bytes()


# -- caching -----------------------------------------------------------------------------------


def test_second_instance_reads_the_cache(
    ds: SyntheticVQA, table: pd.DataFrame, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*args: object, **kwargs: object) -> np.ndarray:
        raise AssertionError("rendered although the cache is complete")

    monkeypatch.setattr(S, "render_image", boom)
    again = SyntheticVQA(ds.cache_dir, seed=3, n_cases=N_CASES)
    assert again.root == ds.root
    pd.testing.assert_frame_equal(again.table(), table)


def test_cache_layout_and_manifest(ds: SyntheticVQA, table: pd.DataFrame) -> None:
    root = ds.root
    assert root.parent == ds.cache_dir / "synthetic"
    assert len(root.name) == 16
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["hash"] == root.name
    assert manifest["params"]["n_cases"] == N_CASES
    assert manifest["counts"]["records"] == len(table)
    assert manifest["counts"]["images"] == table[R.IMAGE_ID].nunique()
    lines = (root / "annotations.jsonl").read_text().splitlines()
    assert len(lines) == len(table)
    assert len(list((root / "images").glob("*.png"))) == table[R.IMAGE_ID].nunique()
    assert not list(root.parent.glob(".*tmp*"))  # no leftover temp directories


def test_directory_without_manifest_is_regenerated(tmp_path: Path) -> None:
    ds = SyntheticVQA(tmp_path, n_cases=5)
    ds.root.mkdir(parents=True)
    (ds.root / "junk.txt").write_text("half-written")
    t = ds.table()
    assert (ds.root / "manifest.json").is_file()
    assert not (ds.root / "junk.txt").exists()
    (ds.root / "manifest.json").unlink()
    again = SyntheticVQA(tmp_path, n_cases=5).table()
    assert (ds.root / "manifest.json").is_file()
    pd.testing.assert_frame_equal(t, again)


def test_unwritable_cache_dir_names_the_setting(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    ds = SyntheticVQA(blocker / "cache", n_cases=3)
    with pytest.raises(DataError, match=r"paths\.cache_dir") as err:
        ds.table()
    assert str(blocker) in str(err.value)


def test_hydra_style_lists_and_bad_params(tmp_path: Path) -> None:
    a = SyntheticVQA(tmp_path, images_per_case=[1, 2], split_fractions=[0.7, 0.15, 0.15])
    b = SyntheticVQA(tmp_path, images_per_case=(1, 2), split_fractions=(0.7, 0.15, 0.15))
    assert a.root == b.root
    with pytest.raises(ValueError, match="question_set"):
        SyntheticVQA(tmp_path, question_set="nope")
    with pytest.raises(ValueError, match="split_fractions"):
        SyntheticVQA(tmp_path, split_fractions=[0.5, 0.5, 0.5])


# -- schema and content ------------------------------------------------------------------------


def test_schema_is_valid(table: pd.DataFrame) -> None:
    R.validate_table(table, "synthetic", required=S.METADATA_COLUMNS)
    assert table[R.ID].str.fullmatch(r"img\d{5}_q\d+").all()
    assert table[R.IMAGE].str.fullmatch(r"images/img\d{5}\.png").all()
    assert table[R.CASE_ID].str.fullmatch(r"case\d{4}").all()
    assert (table[R.IMAGE] == "images/" + table[R.IMAGE_ID] + ".png").all()


def test_closed_and_open_answers(table: pd.DataFrame) -> None:
    closed = table[table[R.ANSWER_TYPE] == "closed"]
    assert len(closed) > 0
    for _, row in closed.iterrows():
        assert len(row[R.CANDIDATES]) == 2
        assert row[R.ANSWER] in row[R.CANDIDATES]
    assert table.loc[table[R.ANSWER_TYPE] == "open", R.CANDIDATES].isna().all()
    assert (table[R.ANSWER] == table[R.ANSWER].str.lower()).all()


def test_question_types_and_answer_sets(table: pd.DataFrame) -> None:
    assert set(table[R.QUESTION_TYPE]) == set(S.QUESTION_TYPES)
    expected = {
        "modality_open": {"ct", "mri", "x-ray"},
        "organ_open": {"head", "chest", "abdomen"},
        "abnormality_open": {"mass", "cyst", "none"},
        "position_open": {"left", "right"},
        "size_pair": {"small", "large"},
        "quantity_open": {"1", "2", "3"},
        "plane_open": {"axial", "coronal"},
    }
    for template, values in expected.items():
        assert set(table.loc[table["template"] == template, R.ANSWER]) <= values, template
    # Questions are consistent with the image's findings.
    lesion_q = table[table["template"] == "lesion_yesno"]
    assert (lesion_q[R.ANSWER] == lesion_q["lesion"]).all()
    assert (table.loc[table["lesion"] == "no", R.QUESTION_TYPE] != "position").all()
    plane = table[table["template"] == "plane_open"]
    assert (plane[R.ANSWER] == plane["modality"].map(S.PLANES)).all()
    # Knowledge answers depend on the question text alone.
    know = table[table[R.QUESTION_TYPE] == "knowledge"]
    assert (know.groupby(R.QUESTION)[R.ANSWER].nunique() == 1).all()
    # Several paraphrases per type.
    assert table.groupby(R.QUESTION_TYPE)[R.QUESTION].nunique().min() >= 3


def test_questions_per_image(table: pd.DataFrame) -> None:
    per_image = table.groupby(R.IMAGE_ID).size()
    assert (per_image == 8).all()
    assert not table.duplicated([R.IMAGE_ID, "template"]).any()


def test_metadata_columns(table: pd.DataFrame) -> None:
    assert set(table["modality"]) <= {"ct", "mri", "x-ray"}
    assert set(table["body_part"]) <= {"head", "chest", "abdomen"}
    assert set(table["sex"]) <= {"F", "M"}
    assert set(table["ethnicity"]) <= set(S.ETHNICITIES)
    assert set(table["lesion"]) == {"yes", "no"}
    assert table["age"].between(18, 90).all()
    assert pd.api.types.is_integer_dtype(table["age"])
    # Demographics are per case.
    assert (table.groupby(R.CASE_ID)[["sex", "age", "ethnicity"]].nunique() == 1).all().all()


def test_source_split_is_per_case(table: pd.DataFrame) -> None:
    assert (table.groupby(R.CASE_ID)[R.SOURCE_SPLIT].nunique() == 1).all()
    cases = table.drop_duplicates(R.CASE_ID)[R.SOURCE_SPLIT].value_counts()
    assert cases["train"] == 28 and cases["validate"] == 6 and cases["test"] == 6


def test_metadata_distributions_at_scale() -> None:
    cases = [S.sample_case(0, i, (1, 2)) for i in range(2000)]
    images = [img for c in cases for img in c.images]
    mods = pd.Series([i.modality for i in images]).value_counts(normalize=True)
    assert abs(mods["ct"] - 0.4) < 0.04 and abs(mods["x-ray"] - 0.25) < 0.04
    eth = pd.Series([c.ethnicity for c in cases]).value_counts(normalize=True)
    assert abs(eth["WHITE"] - 0.6) < 0.05
    young = [i.lesion for i in images if i.age < 40]
    old = [i.lesion for i in images if i.age >= 70]
    assert np.mean(old) > np.mean(young) + 0.15


# -- images ------------------------------------------------------------------------------------


def test_images_are_rgb_at_the_configured_size(ds: SyntheticVQA, table: pd.DataFrame) -> None:
    ref = table[R.IMAGE].iloc[0]
    with Image.open(ds.root / ref) as img:
        assert img.mode == "RGB" and img.size == (64, 64)


def _spec(modality: str, part: str = "chest", **kw: object) -> ImageSpec:
    return ImageSpec(modality, part, "M", 50, **kw)  # type: ignore[arg-type]


def test_modalities_look_different() -> None:
    dark: dict[str, list[float]] = {"ct": [], "mri": [], "x-ray": []}
    for modality in dark:
        for i, part in enumerate(S.BODY_PARTS * 4):
            img = render_image(_spec(modality, part), 64, (0, i))
            dark[modality].append(float((img < 0.06).mean()))
    ct, xray = np.mean(dark["ct"]), np.mean(dark["x-ray"])
    assert ct > 0.25 and xray < 0.1, (ct, xray)
    # MRI is smooth: neighbouring pixels differ less than on CT.
    ct_img = render_image(_spec("ct", "abdomen"), 64, (1,))
    mri_img = render_image(_spec("mri", "abdomen"), 64, (1,))
    assert np.abs(np.diff(mri_img, axis=1)).mean() < np.abs(np.diff(ct_img, axis=1)).mean()


def test_modality_differs_in_generated_images(ds: SyntheticVQA, table: pd.DataFrame) -> None:
    images = table.drop_duplicates(R.IMAGE_ID)
    frac = {
        m: np.mean([(_pixels(ds, ref) < 0.06).mean() for ref in g[R.IMAGE]])
        for m, g in images.groupby("modality")
    }
    assert frac["ct"] > frac["x-ray"] + 0.2


@pytest.mark.parametrize("modality", ["ct", "mri", "x-ray"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_lesion_is_visible_on_its_side(modality: str, side: str) -> None:
    for kind in ("mass", "cyst"):
        plain = render_image(_spec(modality), 64, (5, 5))
        sick = render_image(
            _spec(
                modality, lesion_count=1, lesion_kind=kind, lesion_side=side, lesion_size="large"
            ),
            64,
            (5, 5),
        )
        diff = np.abs(sick - plain)
        left, right = diff[:, :32].sum(), diff[:, 32:].sum()
        near, far = (left, right) if side == "left" else (right, left)
        assert near > 10 * max(far, 1.0), (modality, side, kind, near, far)
        assert diff.max() > 0.3


def test_large_lesions_are_larger_than_small() -> None:
    area = {}
    for size in ("small", "large"):
        plain = render_image(_spec("ct"), 64, (9,))
        sick = render_image(
            _spec("ct", lesion_count=1, lesion_kind="mass", lesion_side="left", lesion_size=size),
            64,
            (9,),
        )
        area[size] = int((np.abs(sick - plain) > 0.2).sum())
    assert area["large"] > 3 * area["small"] > 0


# -- pre-training question set -----------------------------------------------------------------


def test_pretrain_question_set(tmp_path: Path) -> None:
    ds = SyntheticVQA(tmp_path, n_cases=10, question_set="pretrain")
    t = ds.table()
    R.validate_table(t, "synthetic")
    assert set(t[R.QUESTION_TYPE]) == {"caption", "generic"}
    assert (t[R.ANSWER_TYPE] == "open").all()
    captions = t[t[R.QUESTION_TYPE] == "caption"]
    assert len(captions) == t[R.IMAGE_ID].nunique()
    assert (captions[R.QUESTION] == "Describe the image.").all()
    for _, row in captions.iterrows():
        assert row[R.ANSWER].startswith(f"{row['modality']} of the {row['body_part']} with ")
    assert not set(t["template"]) & {tmpl.name for tmpl in S.VQA_TEMPLATES}
    assert ds.root != SyntheticVQA(tmp_path, n_cases=10).root


def test_caption_text() -> None:
    spec = ImageSpec("ct", "chest", "F", 40, 1, "mass", "left", "large")
    assert S.caption(spec) == "ct of the chest with a large mass on the left"
    spec = ImageSpec("mri", "head", "F", 40, 2, "cyst", "right", "small")
    assert S.caption(spec) == "mri of the head with two small cysts on the right"
