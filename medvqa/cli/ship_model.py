"""`MEDVQA_NUMERICS=portable python -m medvqa.cli.ship_model`: build conf/model/tiny.yaml's
tiny model from scratch under portable numerics and ship it in the package
(medvqa/models/builders/prebuilt/, read by `medvqa.models.builders.shipped`), with a manifest
of each file's SHA-256 and where, when and from which commit it was made. Run it when the tiny
model's key changes (tests/test_shipped_model.py says so)."""

from medvqa import numerics

numerics.reexec_if_requested()  # before numpy and torch load

import json  # noqa: E402
import logging  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402

from medvqa import CONF_DIR  # noqa: E402
from medvqa.hashing import file_hash  # noqa: E402
from medvqa.models.builders import shipped  # noqa: E402
from medvqa.models.builders.cache import DONE_FILE, builder_from_yaml  # noqa: E402
from medvqa.provenance import git_state  # noqa: E402

log = logging.getLogger(__name__)


def ship(yaml: Path) -> Path:
    """Build the model of the model YAML `yaml` from scratch into a temporary cache and copy it into
    `shipped.PREBUILT` with its manifest; refused unless the numerics are portable (a shipped build
    must be what any x86-64 CPU builds)."""
    numerics.apply()
    made = numerics.state()
    if made["mode"] != numerics.PORTABLE:
        raise SystemExit(f"ship only under {numerics.SWITCH}=portable (set it in the command)")
    with tempfile.TemporaryDirectory() as tmp:
        builder = builder_from_yaml(yaml, tmp)
        start = time.perf_counter()
        built = builder.build(use_shipped=False)
        seconds = time.perf_counter() - start
        target = shipped.PREBUILT / built.name
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        files = {}
        for path in sorted(built.iterdir()):
            if path.name != DONE_FILE:
                shutil.copy2(path, target / path.name)
                files[path.name] = file_hash(path)
    manifest = {
        "files": files,
        "made": {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "git": git_state(),
            "numerics": made,
            "build_seconds": round(seconds, 1),
        },
    }
    (target / shipped.MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return target


def main(argv: list[str] | None = None) -> None:
    """`MEDVQA_NUMERICS=portable python -m medvqa.cli.ship_model [model yaml]`: build
    conf/model/tiny.yaml's model (or the YAML's) and ship it, replacing the shipped builds."""
    logging.basicConfig(level=logging.INFO)
    args = argv if argv is not None else sys.argv[1:]
    yaml = Path(args[0]) if args else CONF_DIR / "model" / "tiny.yaml"
    for old in shipped.PREBUILT.glob("*/" + shipped.MANIFEST):
        shutil.rmtree(old.parent)
    log.info("shipped %s", ship(yaml))


if __name__ == "__main__":
    main()
