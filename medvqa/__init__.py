"""medvqa: robustness of fine-tuned medical VLMs under distribution shift (see README.md)."""

from importlib.resources import files
from pathlib import Path

# The checkout medvqa runs from (its git state is recorded in each run's provenance); for an
# installed wheel, the directory that holds the package, which is no git checkout.
REPO_ROOT = Path(__file__).resolve().parents[1]


def _conf_dir() -> Path:
    """The Hydra configs: the wheel's copy (conf/ ships as medvqa/conf, see setup.py), else the
    checkout's conf/ (a checkout or an editable install, which have no medvqa/conf)."""
    installed = Path(str(files(__name__) / "conf"))
    return installed if installed.is_dir() else REPO_ROOT / "conf"


CONF_DIR = _conf_dir()
