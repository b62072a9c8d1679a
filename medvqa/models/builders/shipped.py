"""Pre-built model directories shipped with the package, so a cache starts with them.

The CPU demo's tiny LLaVA is pre-trained for 2 epochs before any fine-tuning: minutes on a
2-core CPU, longer under portable numerics (`medvqa.numerics`, no SIMD outside MKL). Its
directory (2.3 MB) ships in `prebuilt/` under the cache entry's name, `<name>-<key>`: a builder
whose key matches copies it into the cache instead of training (`CachedModelBuilder.build`).
The key covers every parameter, the pre-training data's content and the pre-training's
fingerprint, so other parameters or code that trains other weights miss it and build as before.

A shipped directory is what `python -m medvqa.cli.ship_model` built under
`MEDVQA_NUMERICS=portable` (its `shipped.json` says when, where and from which commit); the slow
test tests/test_shipped_model.py builds it again from scratch and compares every file byte for
byte, and `shipped.json`'s SHA-256 of each file is checked before a copy is used.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from medvqa.errors import DataError
from medvqa.hashing import file_hash

log = logging.getLogger(__name__)

PREBUILT = Path(__file__).with_name("prebuilt")
MANIFEST = "shipped.json"


def find(entry: str) -> Path | None:
    """The shipped directory for the cache entry `entry` (`<name>-<key>`), if one ships."""
    candidate = PREBUILT / entry
    return candidate if (candidate / MANIFEST).is_file() else None


def copy_into(shipped: Path, out: Path) -> None:
    """Copy a shipped build into `out` (a cache entry being made), each file checked against
    the SHA-256 its manifest records: a damaged install is refused, not trained on."""
    manifest = json.loads((shipped / MANIFEST).read_text())
    files: dict[str, str] = manifest["files"]
    present = {p.name for p in shipped.iterdir() if p.name != MANIFEST}
    if present != set(files):
        raise DataError(
            f"{shipped}: holds {sorted(present)}, its {MANIFEST} lists {sorted(files)}. "
            "Reinstall medvqa (or delete the directory: the model is then built)."
        )
    for name, digest in sorted(files.items()):
        if file_hash(shipped / name) != digest:
            raise DataError(
                f"{shipped / name}: its SHA-256 is not the one {MANIFEST} records. Reinstall "
                "medvqa (or delete the directory: the model is then built)."
            )
        shutil.copy2(shipped / name, out / name)
    log.info(
        "%s: the shipped build (made %s on %s under %s numerics), not trained here",
        shipped.name,
        manifest["made"]["date"],
        manifest["made"]["numerics"]["cpu"],
        manifest["made"]["numerics"]["mode"],
    )
