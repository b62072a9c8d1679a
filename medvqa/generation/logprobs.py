"""The log-probability of each answer's tokens, recorded while decoding (no extra pass).

Greedy decoding takes the argmax of each step's scores; its log-probability at temperature T is
(max - max) / T - logsumexp((z - max) / T). Every temperature of `R.TEMPERATURES` is computed in
one batched reduction per step, on the device, kept as a [batch, temperatures] tensor (nothing
of the vocabulary's size is kept) and read once the batch is decoded: no host synchronisation
per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import LogitsProcessor

from medvqa.data import records as R


class ChosenLogProbs(LogitsProcessor):
    """Records, at every decoding step, the log-probability of the token greedy decoding takes
    (the largest of the scores it sees: custom processors run after the model's own, so these
    are the scores the choice is made from), at each temperature of `R.TEMPERATURES` (the
    argmax is the same at every temperature)."""

    def __init__(self, temperatures: Sequence[float] = R.TEMPERATURES) -> None:
        self.temperatures = tuple(float(t) for t in temperatures)
        self.steps: list[torch.Tensor] = []
        self._divisors: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        z = scores.float()
        if self._divisors is None or self._divisors.device != z.device:
            self._divisors = torch.tensor(self.temperatures, device=z.device)[:, None, None]
        shifted = z - z.amax(dim=-1, keepdim=True)
        # [temperatures, batch] in one reduction; stored as [batch, temperatures]
        self.steps.append(-torch.logsumexp(shifted / self._divisors, dim=-1).T)
        return scores

    def per_answer(
        self, new_tokens: torch.Tensor, end_ids: Sequence[int]
    ) -> list[tuple[float, float, int, dict[str, float]]]:
        """(mean, min, count, {temperature: sum}) of the log-probabilities per row of
        `new_tokens` (the generated part of the sequences), counting tokens up to and including
        the first end token; mean and min at temperature 1."""
        nan = float("nan")
        if not self.steps or new_tokens.shape[1] == 0:
            return [(nan, nan, 0, {})] * len(new_tokens)
        steps = torch.stack(self.steps, dim=1)[:, : new_tokens.shape[1]].cpu()  # [B, S, T]
        tokens = new_tokens[:, : steps.shape[1]].cpu()
        ends = torch.isin(tokens, torch.tensor(list(end_ids), dtype=tokens.dtype))
        after_end = (ends.int().cumsum(dim=1) - ends.int()) > 0
        valid = ~after_end
        count = valid.sum(dim=1)
        sums = (steps * valid[..., None]).sum(dim=1)  # [B, T]
        one = self.temperatures.index(1.0)
        at_one = steps[..., one]
        mean = sums[:, one] / count.clamp(min=1)
        low = at_one.masked_fill(after_end, float("inf")).amin(dim=1)
        out = []
        for m, lo, n, by_t in zip(mean.tolist(), low.tolist(), count.tolist(), sums.tolist(),
                                  strict=True):  # fmt: skip
            grid = {str(t): v for t, v in zip(self.temperatures, by_t, strict=True)}
            out.append((m, lo, n, grid) if n else (nan, nan, 0, {}))
        return out


def end_token_ids(model: torch.nn.Module, tokenizer: Any) -> list[int]:
    """The tokens that end an answer: the generation config's (Qwen has several), else the
    tokenizer's end-of-sequence token."""
    config = getattr(model, "generation_config", None)
    ids = getattr(config, "eos_token_id", None) if config is not None else None
    if ids is None:
        ids = tokenizer.eos_token_id
    return [int(i) for i in (ids if isinstance(ids, list | tuple) else [ids]) if i is not None]
