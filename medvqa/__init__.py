"""medvqa: robustness of fine-tuned medical VLMs under distribution shift (see README.md)."""

from pathlib import Path

# The checkout medvqa runs from: its configs (what run.py composes) and its git state.
REPO_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = REPO_ROOT / "conf"
