"""Stand-in tokenizers: a small byte-level BPE with a VLM family's special tokens and a chat
template of the family's shape (`medvqa.models.families`). The tiny test models (`medvqa.zoo`)
and rehearsals with random weights (`medvqa.models.rehearsal`) use them where no checkpoint
tokenizer exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from medvqa.models.families.base import family_of

CORPUS = [
    "USER: ASSISTANT: User: Assistant: user model assistant system",
    "what modality is this image? is there a lesion? which organ is shown? yes no",
    "the image shows a ct scan of the chest with an abnormality in the left lung",
    "mri x-ray ultrasound brain liver kidney heart abdomen normal abnormal",
]


def build_tokenizer(family: str, vocab_size: int, corpus: Sequence[str] = CORPUS) -> Any:
    """A byte-level BPE (any text tokenises) trained on `corpus`, with the special tokens and
    template of `family` (its `ModelFamily.stand_in`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    spec = family_of(family, "a stand-in tokenizer").stand_in
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(spec.special),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=spec.bos,
        eos_token=spec.eos,
        pad_token=spec.special[0],
        extra_special_tokens=dict(spec.extra),
        chat_template=spec.template,
    )
