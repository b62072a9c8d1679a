"""Third-party noise silenced where it starts, for medvqa's commands (not for importers).

Each entry is one known message of a library this project pins, that says nothing a user of
medvqa can act on (a deprecation inside the library's own code, an advertisement, a warning
that a CPU machine has no GPU). Everything else the libraries say still gets through.
"""

from __future__ import annotations

import logging
import os
import warnings

# Warnings (message regexes) with why a medvqa user cannot act on them.
WARNINGS = (
    # Lightning's pytree copy builds LeafSpec(), which torch >= 2.10 deprecates.
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    # peft reads PreTrainedModel.is_gradient_checkpointing, which transformers 5 deprecates.
    r"`is_gradient_checkpointing` is deprecated",
    # VQAModule's hook computes label positions on the host on purpose (training/module.py).
    r"You have overridden `on_before_batch_transfer` in `LightningModule`",
    # A resumed pass with nothing left to generate (medvqa logs what it resumed).
    r"Total length of `DataLoader` across ranks is zero",
)
# Lightning's rank-zero info lines that are advertisements, not information.
LIGHTNING_ADVERTS = ("💡 Tip:",)


class _DropMessages(logging.Filter):
    def __init__(self, starts: tuple[str, ...]) -> None:
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(self.starts)


def silence_third_party() -> None:
    """Install the filters (idempotent); call before the libraries are imported."""
    for message in WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _DropMessages) for f in rank_zero.filters):
        rank_zero.addFilter(_DropMessages(LIGHTNING_ADVERTS))
    # DeepSpeed, imported by Lightning's strategies, warns on import that it found no GPU and
    # uses the CPU; naming the CPU when CUDA is absent is what it would pick anyway.
    if "DS_ACCELERATOR" not in os.environ and not _has_cuda():
        os.environ["DS_ACCELERATOR"] = "cpu"
    # transformers' bars (loading and writing weights) are one line of carriage returns in a
    # log file; medvqa's own progress lines say what happens there.
    from medvqa import progress

    if progress.enabled():
        from huggingface_hub.utils import disable_progress_bars
        from transformers.utils import logging as transformers_logging

        disable_progress_bars()
        transformers_logging.disable_progress_bar()  # it copied the hub's switch when imported


def _has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())
