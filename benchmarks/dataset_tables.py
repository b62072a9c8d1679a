"""How long the data side takes before a model sees anything, on a SLAKE-sized native layout.

Not a test. Writes a SLAKE-layout fixture with SLAKE's image count (642 images, 12 rows each
here), then times: the first `table()` (parse JSON, clean, normalise, validate, write the
parquet cache), a cached `table()` in a fresh source, the cache key alone (hashing the
annotation files), `make_splits` + leakage audit, and the pre-training image check.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from medvqa.data.annotated import check_images  # noqa: E402
from medvqa.data.audit import audit_leakage  # noqa: E402
from medvqa.data.shifts import Shift, make_splits  # noqa: E402
from medvqa.data.sources.slake import Slake  # noqa: E402
from tests.native.slake import write as write_slake  # noqa: E402


def timed(fn, repeat: int = 3) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "slake"
        fixture = write_slake(root, images={"train": 450, "validate": 96, "test": 96})
        n_rows = sum(fixture.raw.values())
        cache = Path(tmp) / "cache"
        cold = time.perf_counter()
        table = Slake(root, cache_dir=cache).table()
        cold = time.perf_counter() - cold
        warm, _ = timed(lambda: Slake(root, cache_dir=cache).table())
        key, _ = timed(lambda: Slake(root, cache_dir=cache).fingerprint())
        shift = Shift(name="slake_modality", field="modality", ood_values=["X-Ray"])
        split_t, splits = timed(lambda: make_splits(table, shift))
        audit_t, _ = timed(lambda: audit_leakage(splits.frames))
        source = Slake(root, cache_dir=cache)
        check_t, _ = timed(lambda: check_images(source, splits.frames, "error"), repeat=1)

    out = Table(title=f"SLAKE-layout fixture: {n_rows} native rows -> {len(table)} after cleaning")
    out.add_column("step")
    out.add_column("seconds", justify="right")
    for name, value in (
        ("first table() (parse, clean, validate, cache)", cold),
        ("cached table() in a new source", warm),
        ("cache key (hash annotation files)", key),
        ("make_splits (slake_modality)", split_t),
        ("leakage audit", audit_t),
        ("image check (642 images, header only)", check_t),
    ):
        out.add_row(name, f"{value:.3f}")
    Console().print(out)


if __name__ == "__main__":
    main()
