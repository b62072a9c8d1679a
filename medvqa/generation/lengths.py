"""How many new tokens generation may produce: the model's budget or the dataset's need."""

from __future__ import annotations

from typing import Any

from medvqa.data.base import VQASource


def generation_length(model_cfg: Any, source: VQASource) -> int:
    """max(`model.max_new_tokens`, the dataset's `answer_tokens`).

    `model.max_new_tokens` suits short answers (a word, yes/no); a dataset whose answers are
    lists (MIMIC-CXR-VQA) states its own need, so its answers are not cut off whatever model
    answers them.
    """
    return max(int(model_cfg.max_new_tokens), int(source.answer_tokens))
