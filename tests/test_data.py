"""Data plumbing: image paths stay in the dataset root, bad images are named, caches are keyed."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from medvqa.data.base import VQASource
from medvqa.errors import DataError
from medvqa.zoo.tiny import TinyLlavaBuilder


class _Folder(VQASource):
    name = "folder"

    def __init__(self, root: Path, rows: list[dict]) -> None:
        super().__init__(root)
        self.rows = rows

    def table(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)


def test_image_path_must_stay_inside_root(tmp_path: Path) -> None:
    (tmp_path / "outside.png").write_bytes(b"x")
    root = tmp_path / "data"
    root.mkdir()
    src = _Folder(root, [])
    with pytest.raises(DataError, match=r"escapes the dataset root"):
        src.image_path("../outside.png", "r1")


def test_missing_and_unreadable_images_are_named(tmp_path: Path) -> None:
    src = _Folder(tmp_path, [])
    with pytest.raises(DataError, match=r"missing\.png.*r7"):
        src.load_image("missing.png", "r7")
    (tmp_path / "broken.png").write_bytes(b"not an image")
    with pytest.raises(DataError, match=r"broken\.png.*r8"):
        src.load_image("broken.png", "r8")


def test_fingerprint_follows_content(tmp_path: Path) -> None:
    a = _Folder(tmp_path, [{"id": "1", "question": "q", "answer": "a"}])
    b = _Folder(tmp_path, [{"id": "1", "question": "q", "answer": "b"}])
    assert a.fingerprint() == _Folder(tmp_path, list(a.rows)).fingerprint()
    assert a.fingerprint() != b.fingerprint()


def test_model_cache_key_follows_the_pretraining_data(tmp_path: Path, monkeypatch) -> None:
    """A changed data generator must rebuild the tiny model, never reuse a stale one."""
    from medvqa.data.sources.synthetic import dataset as synthetic

    pretrain = {
        "data": {
            "_target_": "medvqa.data.sources.synthetic.SyntheticVQA",
            "n_cases": 4,
            "question_set": "pretrain",
        },
        "epochs": 1,
    }
    sizes = dict(image_size=64, patch_size=8, vision_hidden=64, vision_layers=2, vision_heads=4)
    sizes |= dict(text_hidden=128, text_layers=2, text_heads=4, vocab_size=512, seed=0)
    key = TinyLlavaBuilder(tmp_path, pretrain=pretrain, **sizes).key
    assert (
        TinyLlavaBuilder(tmp_path / "elsewhere", pretrain=pretrain, **sizes).key == key
    )  # cache moved
    assert TinyLlavaBuilder(tmp_path, pretrain=pretrain, **sizes).key == key
    assert TinyLlavaBuilder(tmp_path, pretrain={**pretrain, "epochs": 2}, **sizes).key != key
    monkeypatch.setattr(synthetic, "GENERATOR_VERSION", synthetic.GENERATOR_VERSION + 100)
    assert TinyLlavaBuilder(tmp_path, pretrain=pretrain, **sizes).key != key
