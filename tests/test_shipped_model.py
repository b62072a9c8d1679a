"""The shipped pre-built tiny model (medvqa/models/builders/shipped.py): the demo's tiny LLaVA
ships, a builder whose key matches copies it instead of pre-training, a damaged copy is refused,
and (slow) building it again under portable numerics gives the shipped files bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from medvqa import numerics
from medvqa.errors import DataError
from medvqa.hashing import content_hash
from medvqa.models.builders import shipped
from medvqa.models.builders.cache import DONE_FILE, CachedModelBuilder, builder_from_yaml
from tests.conftest import CONF, DISTRIBUTED_ENV, ROOT

SHIP_COMMAND = "MEDVQA_NUMERICS=portable python -m medvqa.cli.ship_model"


def _default_builder(cache: Path) -> CachedModelBuilder:
    """conf/model/tiny.yaml's builder, as `make demo` composes it, with `cache` as its cache."""
    return builder_from_yaml(CONF / "model" / "tiny.yaml", cache)


def test_the_demo_model_ships(tmp_path: Path) -> None:
    """A change to the tiny model's parameters, its pre-training data or its fingerprint gives
    another key: the demo would then pre-train for minutes, so the build must be shipped again."""
    builder = _default_builder(tmp_path)
    entry = f"{builder.name}-{builder.key}"
    assert shipped.find(entry) is not None, (
        f"no shipped build for the demo's tiny model {entry} (medvqa/models/builders/prebuilt/ "
        f"holds {sorted(p.name for p in shipped.PREBUILT.glob('*'))}): run {SHIP_COMMAND} "
        "and commit its output"
    )
    made = json.loads((shipped.PREBUILT / entry / shipped.MANIFEST).read_text())["made"]
    assert made["numerics"]["mode"] == numerics.PORTABLE
    assert made["numerics"]["capability"] == "DEFAULT"
    assert (made["numerics"]["threads"], made["numerics"]["mkl_cbwr"]) == (numerics.THREADS, "AVX2")


class _Fake(CachedModelBuilder):
    """A builder that must not build: the shipped copy is all it may use."""

    name = "fake"

    def _build_into(self, out: Path) -> None:
        raise AssertionError("built although a build ships")


def _ship_fake(root: Path, builder: _Fake) -> Path:
    entry = root / f"{builder.name}-{builder.key}"
    entry.mkdir(parents=True)
    files = {"model.safetensors": b"\x00weights", "config.json": b'{"model_type": "llava"}'}
    for name, data in files.items():
        (entry / name).write_bytes(data)
    digests = {name: content_hash(data, length=None) for name, data in files.items()}
    made = {"date": "2026-11-29", "numerics": {"cpu": "test", "mode": "portable"}}
    (entry / shipped.MANIFEST).write_text(json.dumps({"files": digests, "made": made}))
    return entry


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[_Fake, Path]:
    monkeypatch.setattr(shipped, "PREBUILT", tmp_path / "prebuilt")
    builder = _Fake(tmp_path / "cache", {"size": 1})
    return builder, _ship_fake(tmp_path / "prebuilt", builder)


def test_a_shipped_build_is_copied_not_trained(fake: tuple[_Fake, Path]) -> None:
    builder, entry = fake
    built = builder.build()
    assert built.name == entry.name
    assert (built / "model.safetensors").read_bytes() == b"\x00weights"
    assert json.loads((built / DONE_FILE).read_text())["size"] == 1
    assert not (built / shipped.MANIFEST).exists()
    with pytest.raises(AssertionError, match="built although"):  # the maker's own path
        _Fake(builder.cache_dir.with_name("other"), {"size": 1}).build(use_shipped=False)


def test_other_parameters_build_as_before(fake: tuple[_Fake, Path]) -> None:
    builder, _ = fake
    with pytest.raises(AssertionError, match="built although"):
        _Fake(builder.cache_dir, {"size": 2}).build()


@pytest.mark.parametrize("damage", ["a flipped byte", "a file it does not list", "a missing file"])
def test_a_damaged_shipped_build_is_refused(fake: tuple[_Fake, Path], damage: str) -> None:
    """Nothing is cached from it: the error names the file and the fix."""
    builder, entry = fake
    if damage == "a flipped byte":
        (entry / "model.safetensors").write_bytes(b"\x01weights")
        match = r"model\.safetensors: its SHA-256 is not the one shipped\.json records"
    elif damage == "a file it does not list":
        (entry / "extra.bin").write_bytes(b"")
        match = "its shipped.json lists"
    else:
        (entry / "config.json").unlink()
        match = "its shipped.json lists"
    with pytest.raises(DataError, match=match):
        builder.build()
    assert not list((builder.cache_dir / "models").glob("fake-*"))


@pytest.mark.slow
def test_the_shipped_build_is_what_portable_numerics_build(tmp_path: Path) -> None:
    """The demo's tiny model built from scratch under portable numerics (minutes on one
    thread) gives every shipped file byte for byte: the shipped weights are the code's."""
    builder = _default_builder(tmp_path)
    entry = shipped.find(f"{builder.name}-{builder.key}")
    if entry is None:
        pytest.fail(f"no shipped build: run {SHIP_COMMAND}")
    build = (
        "from medvqa import numerics; numerics.reexec_if_requested(); numerics.apply(); "
        "import json, sys; from medvqa.hashing import file_hash; "
        "from tests.test_shipped_model import _default_builder; "
        "from pathlib import Path; out = _default_builder(Path(sys.argv[1])).build("
        "use_shipped=False); print(json.dumps({p.name: file_hash(p) "
        "for p in out.iterdir() if p.name != 'medvqa_build.json'}))"
    )
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_ENV}
    proc = subprocess.run(
        [sys.executable, "-c", build, str(tmp_path / "cache")],
        cwd=ROOT,
        env=env | {numerics.SWITCH: numerics.PORTABLE, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    made = json.loads(proc.stdout.strip().splitlines()[-1])
    recorded = json.loads((entry / shipped.MANIFEST).read_text())["files"]
    assert made == recorded, (
        f"building the demo's tiny model here gives other files than the shipped {entry.name}: "
        f"{sorted(k for k in made.keys() | recorded.keys() if made.get(k) != recorded.get(k))}"
    )
