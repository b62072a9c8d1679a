"""The one prompt template, used for training and for inference.

Prompts go through the processor's own chat template, so every VLM family formats its image
and turn markers its own way. The answer's tokens (and only they) are the training labels: the
answer text is whatever the template puts after the generation prompt when the assistant turn is
rendered, so end-of-turn markers are learnt exactly as the template writes them.

What a protocol adds to the question (a system turn, the closed question's options) is a
:class:`PromptTemplate` from the `prompt` config group; the dataset rows go through it in one
place (`medvqa.training.datamodule.VQADataset`), for training and generation alike.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image

IGNORE_INDEX = -100
# Prompt tuning's virtual tokens: real added tokens placed right before the question text (after
# the image), so image-token positions, M-RoPE indices and token types are those of a prompt
# without them, in every family (PEFT's own prompt tuning breaks Qwen2-VL and Gemma3).
VIRTUAL_TOKEN = "<medvqa_vt_{}>"
_VIRTUAL = re.compile(r"^<medvqa_vt_(\d+)>$")


def labelled_tokens(labels: torch.Tensor) -> torch.Tensor:
    """How many tokens of `labels` carry a label, as transformers' shifted causal-LM loss counts
    them (position p predicts token p + 1). On the tensor's device: on the host it costs nothing,
    on a GPU reading it back waits for the GPU."""
    return (labels[:, 1:] != IGNORE_INDEX).sum()


def virtual_prefix(processor: Any) -> str:
    """The virtual tokens the tokenizer carries (none unless prompt tuning added them)."""
    tok = processor.tokenizer
    cached = getattr(tok, "_medvqa_prefix", None)
    if cached is not None and cached[0] == len(tok):
        return cached[1]
    found = sorted(
        (int(m.group(1)), name)
        for name in tok.get_added_vocab()
        if (m := _VIRTUAL.match(name)) is not None
    )
    prefix = "".join(name for _, name in found)
    tok._medvqa_prefix = (len(tok), prefix)
    return prefix


# Chat templates a model config can name (`model.chat_template`) to replace its processor's:
# for checkpoints whose processor was saved without the template the model was trained with.
# llava_med: LLaVA-Med v1.5's `mistral_instruct` conversation (llava/conversation.py: LLAMA_2
# separator style, empty system, sep "", sep2 "</s>"): "[INST] <image>\n{question} [/INST]" and
# the answer as " {answer} </s>", after the BOS the tokenizer adds; a system turn, if one is
# given, goes first inside [INST] as the <<SYS>> block that style writes.
CHAT_TEMPLATES = {
    "llava_med": (
        "{%- for message in messages -%}"
        "{%- if message['role'] == 'user' -%}"
        "{{ '[INST] ' }}"
        "{%- if loop.index0 == 1 and messages[0]['role'] == 'system' -%}"
        "{{ '<<SYS>>\\n' + messages[0]['content'][0]['text'] + '\\n<</SYS>>\\n\\n' }}"
        "{%- endif -%}"
        "{%- for part in message['content'] if part['type'] == 'image' -%}"
        "{{ '<image>\\n' }}"
        "{%- endfor -%}"
        "{%- for part in message['content'] if part['type'] == 'text' -%}"
        "{{ part['text'] }}"
        "{%- endfor -%}"
        "{{ ' [/INST]' }}"
        "{%- elif message['role'] == 'assistant' -%}"
        "{{ ' ' }}"
        "{%- for part in message['content'] if part['type'] == 'text' -%}"
        "{{ part['text'] }}"
        "{%- endfor -%}"
        "{{ ' </s>' }}"
        "{%- endif -%}"
        "{%- endfor -%}"
    ),
}


def chat_template(name: str) -> str:
    """The Jinja text of a named chat template: one of `CHAT_TEMPLATES`, or the template a
    model family gives checkpoints that ship none (`ModelFamily.chat_template`, by its name)."""
    from medvqa.models.families.base import families

    known = dict(CHAT_TEMPLATES)
    known.update({n: f.chat_template for n, f in families().items() if f.chat_template})
    if name not in known:
        raise ValueError(
            f"model.chat_template={name!r} is not a known template; choose one of "
            f"{sorted(known)} or null (the processor's own)."
        )
    return known[name]


_NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


@dataclass(frozen=True)
class PromptTemplate:
    """What a protocol adds around a row's question, identically in training and inference.

    `system`: a system turn (e.g. Kvasir-VQA-x1's instruction), or none. `options`: appended to
    a closed question that has candidates, formatted with `{n}` (the number of candidates, in
    words up to nine) and `{options}` (the candidates joined by ", "): SURE-VQA's
    " Please choose from the following {n} options: [{options}]." is built from the row's own
    candidates, never from its answer (SURE-VQA's reference code picks it from the ground truth,
    which leaks the label).
    """

    system: str | None = None
    options: str | None = None

    def question(
        self, question: str, answer_type: str | None, candidates: Sequence[str] | None
    ) -> str:
        """The user turn's text for one row."""
        if self.options is None or answer_type != "closed" or candidates is None:
            return question
        n = len(candidates)
        words = _NUMBER_WORDS[n] if n < len(_NUMBER_WORDS) else str(n)
        return question + self.options.format(n=words, options=", ".join(map(str, candidates)))

    def settings(self) -> dict[str, Any]:
        """The fields, for cache keys of generated answers."""
        return dataclasses.asdict(self)


PLAIN = PromptTemplate()  # the question as the dataset writes it (`prompt=plain`)


def build_messages(
    question: str, with_image: bool = True, system: str | None = None
) -> list[dict[str, Any]]:
    """The (system and) user turn: the image (if any) followed by the question."""
    content: list[dict[str, Any]] = [{"type": "image"}] if with_image else []
    content.append({"type": "text", "text": question})
    turns = [{"role": "user", "content": content}]
    if system is not None:
        turns.insert(0, {"role": "system", "content": [{"type": "text", "text": system}]})
    return turns


def prompt_text(
    processor: Any, question: str, with_image: bool = True, system: str | None = None
) -> str:
    """The prompt up to and including the assistant's generation prompt."""
    text = processor.apply_chat_template(
        build_messages(virtual_prefix(processor) + question, with_image, system),
        add_generation_prompt=True,
        tokenize=False,
    )
    if system is not None and system not in text:
        raise ValueError(
            "the model's chat template drops the system turn the prompt template asks for "
            "(prompt.system); use a model whose template has a system role, or set "
            "model.chat_template, or prompt=plain."
        )
    return text


def answer_text(
    processor: Any,
    question: str,
    answer: str,
    with_image: bool = True,
    system: str | None = None,
    prompt: str | None = None,
) -> str:
    """What the template renders after the generation prompt for `answer` (incl. end marker).

    `prompt`: `prompt_text` of the same arguments, when the caller has it already (the
    template is then rendered once more, not twice)."""
    if prompt is None:
        prompt = prompt_text(processor, question, with_image, system)
    messages = [
        *build_messages(virtual_prefix(processor) + question, with_image, system),
        {"role": "assistant", "content": [{"type": "text", "text": answer}]},
    ]
    full = processor.apply_chat_template(messages, tokenize=False)
    if not full.startswith(prompt):
        raise ValueError(
            "the chat template does not render the assistant turn as a continuation of the "
            f"generation prompt (prompt {prompt[-40:]!r}, full {full[-80:]!r}); this model "
            "family needs its own answer formatting in medvqa.models.prompting."
        )
    return full[len(prompt) :]


def encode(
    processor: Any,
    question: str,
    image: Image.Image | None,
    answer: str | None = None,
    system: str | None = None,
) -> dict[str, torch.Tensor]:
    """Tokenise one example (unpadded, batch dimension removed for per-token tensors).

    With `answer`, the answer tokens are appended and become the only labels (loss on answer
    tokens only); without it the result is a generation prompt.
    """
    text = prompt_text(processor, question, with_image=image is not None, system=system)
    kwargs: dict[str, Any] = {"text": [text], "return_tensors": "pt"}
    if image is not None:
        kwargs["images"] = [image]
    enc = dict(processor(**kwargs))
    input_ids = enc.pop("input_ids")
    n_prompt = input_ids.shape[1]
    per_token = {k: v for k, v in enc.items() if _is_per_token(v, input_ids)}
    other = {k: v for k, v in enc.items() if k not in per_token}
    out: dict[str, torch.Tensor] = {"input_ids": input_ids[0]}
    out.update({k: v[0] for k, v in per_token.items()})
    if answer is not None:
        suffix = answer_text(processor, question, answer, image is not None, system, prompt=text)
        ans = processor.tokenizer(suffix, add_special_tokens=False, return_tensors="pt")
        ans_ids = ans["input_ids"][0]
        out["input_ids"] = torch.cat([out["input_ids"], ans_ids])
        answer_type = _answer_token_type(processor)
        for key in per_token:
            fill = {"attention_mask": 1, "token_type_ids": answer_type}.get(key, 0)
            out[key] = torch.cat([out[key], torch.full_like(ans_ids, fill, dtype=out[key].dtype)])
        out["labels"] = torch.cat(
            [torch.full((n_prompt,), IGNORE_INDEX, dtype=torch.long), ans_ids.long()]
        )
    out.update(other)
    return out


def _answer_token_type(processor: Any) -> int:
    """The token type of answer tokens: PaliGemma types its answer (`suffix`) 1, which makes
    it causal; typed 0 it would be prefix and see the tokens after it in training. Every other
    family types text 0 (Gemma3 uses 1 for image tokens)."""
    return 1 if "suffix" in inspect.signature(type(processor).__call__).parameters else 0


def _is_per_token(value: Any, input_ids: torch.Tensor) -> bool:
    return (
        isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[:2] == input_ids.shape
    )


def per_token_keys(feature: dict[str, torch.Tensor]) -> list[str]:
    """The keys of an example's per-token tensors (ids, masks, token types); the others are
    its image's tensors."""
    return [k for k, v in feature.items() if v.dim() == 1 or k == "input_ids"]


def pad_batch(
    features: list[dict[str, torch.Tensor]], pad_token_id: int, padding_side: str = "right"
) -> dict[str, torch.Tensor]:
    """Pad per-token tensors to the longest example; concatenate image tensors along dim 0."""
    seq_keys = per_token_keys(features[0])
    max_len = max(f["input_ids"].shape[0] for f in features)
    pad_value = {"input_ids": pad_token_id, "labels": IGNORE_INDEX}
    batch: dict[str, torch.Tensor] = {}
    for key in seq_keys:
        rows = []
        for f in features:
            seq = f[key]
            pad = torch.full((max_len - seq.shape[0],), pad_value.get(key, 0), dtype=seq.dtype)
            rows.append(torch.cat([seq, pad] if padding_side == "right" else [pad, seq]))
        batch[key] = torch.stack(rows)
    for key in features[0]:
        if key not in batch:
            batch[key] = torch.cat([f[key] for f in features], dim=0)
    return batch
