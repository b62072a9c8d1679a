"""Stand-in tokenizers: a small byte-level BPE with a VLM family's special tokens and a chat
template of the family's shape. The tiny test models (`medvqa.zoo`) and rehearsals with random
weights (`medvqa.models.rehearsal`) use them where no checkpoint tokenizer exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from medvqa.models.prompting import chat_template

# The tiny LLaVA's (medvqa.zoo.tiny) special tokens (the first is padding) and template.
RESERVED_TOKENS = ["<pad>", "<s>", "</s>", "<image>"]
# Kept deliberately plain: every token here costs sequence length on a CPU.
LLAVA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'system' %}SYSTEM: {{ m['content'][0]['text'] }}{{ '\\n' }}"
    "{% elif m['role'] == 'user' %}USER: "
    "{% for c in m['content'] %}{% if c['type'] == 'image' %}<image>{{ '\\n' }}"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{{ '\\n' }}"
    "{% else %}ASSISTANT: {% for c in m['content'] %}{{ c['text'] }}{% endfor %}{{ eos_token }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


# --- chat templates: the family's turn markers, content lists of image/text items -------------


def _content(image: str) -> str:
    return (
        "{% for c in m['content'] %}{% if c['type'] == 'image' %}" + image + "{% elif c['type'] "
        "== 'text' %}{{ c['text'] }}{% endif %}{% endfor %}"
    )


QWEN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    + _content("<|vision_start|><|image_pad|><|vision_end|>")
    + "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GEMMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    + _content("<start_of_image>")
    + "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
IDEFICS3_TEMPLATE = (
    "<|im_start|>{% for m in messages %}{{ m['role'] | capitalize }}:"
    "{% if m['role'] == 'assistant' %} {% endif %}"
    + _content("<image>")
    + "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)

ROW_COL_TOKENS = [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)]

# Per family: special tokens (the first is padding), bos/eos, tokenizer extras, chat template.
TOKENS: dict[str, dict[str, Any]] = {
    "llava": {
        "special": RESERVED_TOKENS,
        "bos": "<s>",
        "eos": "</s>",
        "extra": {"image_token": "<image>"},
        "template": LLAVA_TEMPLATE,
    },
    "qwen2_vl": {
        "special": [
            "<|endoftext|>",
            "<|im_start|>",
            "<|im_end|>",
            "<|vision_start|>",
            "<|vision_end|>",
            "<|image_pad|>",
            "<|video_pad|>",
        ],
        "bos": None,
        "eos": "<|im_end|>",
        "extra": {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>"},
        "template": QWEN_TEMPLATE,
    },
    "gemma3": {
        "special": [
            "<pad>",
            "<eos>",
            "<bos>",
            "<start_of_turn>",
            "<end_of_turn>",
            "<start_of_image>",
            "<end_of_image>",
            "<image_soft_token>",
        ],
        "bos": "<bos>",
        "eos": "<end_of_turn>",
        "extra": {
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
        "template": GEMMA3_TEMPLATE,
    },
    "idefics3": {
        "special": [
            "<|endoftext|>",
            "<|im_start|>",
            "<end_of_utterance>",
            "<fake_token_around_image>",
            "<global-img>",
            "<image>",
            *ROW_COL_TOKENS,
        ],
        "bos": "<|im_start|>",
        "eos": "<end_of_utterance>",
        "extra": {
            "image_token": "<image>",
            "fake_image_token": "<fake_token_around_image>",
            "global_image_token": "<global-img>",
            "end_of_utterance_token": "<end_of_utterance>",
        },
        "template": IDEFICS3_TEMPLATE,
    },
    "paligemma": {
        "special": ["<pad>", "<eos>", "<bos>", "<image>"],
        "bos": "<bos>",
        "eos": "<eos>",
        "extra": {"image_token": "<image>"},
        "template": chat_template("paligemma"),  # the real checkpoints have none
    },
}
TOKENS["qwen2_5_vl"] = TOKENS["qwen2_vl"]
TOKENS["smolvlm"] = TOKENS["idefics3"]
FAMILIES = ("llava", "qwen2_vl", "qwen2_5_vl", "gemma3", "idefics3", "smolvlm", "paligemma")

CORPUS = [
    "USER: ASSISTANT: User: Assistant: user model assistant system",
    "what modality is this image? is there a lesion? which organ is shown? yes no",
    "the image shows a ct scan of the chest with an abnormality in the left lung",
    "mri x-ray ultrasound brain liver kidney heart abdomen normal abnormal",
]


def build_tokenizer(family: str, vocab_size: int, corpus: Sequence[str] = CORPUS) -> Any:
    """A byte-level BPE (any text tokenises) trained on `corpus`, with the family's special
    tokens and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    spec = TOKENS[family]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(spec["special"]),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=spec["bos"],
        eos_token=spec["eos"],
        pad_token=spec["special"][0],
        extra_special_tokens=dict(spec["extra"]),
        chat_template=spec["template"],
    )
