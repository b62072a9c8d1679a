"""Every experiment's shift yields four non-empty splits on the default synthetic data."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from medvqa.data.shifts import Shift, make_splits
from tests.conftest import CONF, compose

EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("synthetic_*.yaml"))


@pytest.fixture(scope="module")
def table(cache_dir: Path):
    return instantiate(compose([], cache_dir).dataset).table()


@pytest.mark.parametrize("experiment", EXPERIMENTS)
@pytest.mark.heavy
def test_experiment_splits(experiment: str, table, cache_dir: Path) -> None:
    cfg = compose([f"+experiment={experiment}"], cache_dir)
    shift = Shift.from_config(OmegaConf.to_container(cfg.shift, resolve=True))
    splits = make_splits(table, shift, seed=0)
    report = splits.report()
    assert all(v["n"] > 0 for v in report["splits"].values()), report
    if shift.transform is not None:
        assert splits["test_ood"]["image_transform"].notna().all()
        assert splits["test_iid"]["image_transform"].isna().all()
        return
    ood = splits["test_ood"][shift.field]
    iid = splits["test_iid"][shift.field]
    if shift.ood_values is not None:
        assert set(ood) <= set(shift.ood_values) and not set(iid) & set(shift.ood_values)
    elif shift.iid_values is not None:
        assert set(iid) <= set(shift.iid_values) and not set(ood) & set(shift.iid_values)
    else:
        assert ood.max() < shift.ood_max and iid.min() >= shift.iid_min
