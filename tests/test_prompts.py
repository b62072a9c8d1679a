"""Prompt templates (conf/prompt/, model.chat_template): the text each renders for one row, and
that training and generation see the same prompt."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from PIL import Image

from medvqa.data import records as R
from medvqa.generation.predict import prediction_key
from medvqa.models.loading import load_vlm
from medvqa.models.prompting import (
    CHAT_TEMPLATES,
    IGNORE_INDEX,
    PromptTemplate,
    chat_template,
    encode,
    prompt_text,
)
from medvqa.training.datamodule import VQADataset
from tests.conftest import compose
from tests.generating import settings

KVASIR_SYSTEM = (
    "You are a medical vision-language assistant; given an endoscopic image and a clinical "
    "question that may ask about one or more findings, provide a concise, clinically accurate "
    "response addressing all parts of the question in natural-sounding medical language as if "
    "spoken by a doctor in a single sentence."
)


def _prompt(*overrides: str) -> PromptTemplate:
    return instantiate(compose(list(overrides), Path("/nonexistent")).prompt)


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path):
    cfg = OmegaConf.create({"name": "tiny", "pretrained": str(tiny_model_dir), "dtype": "float32"})
    return load_vlm(cfg)


@pytest.mark.heavy
def test_the_sure_experiments_name_the_closed_options_from_the_candidates() -> None:
    sure = _prompt("+experiment=slake_modality")
    assert sure == _prompt("prompt=sure")
    assert (
        sure.question("Is the lung healthy?", "closed", ["yes", "no"])
        == "Is the lung healthy? Please choose from the following two options: [yes, no]."
    )
    # The options come from the row's candidates, not its answer: four for MIMIC's "A or B".
    assert sure.question("Which side?", "closed", ["left", "right", "none", "both"]) == (
        "Which side? Please choose from the following four options: [left, right, none, both]."
    )
    assert sure.question("What organ is shown?", "open", None) == "What organ is shown?"
    assert _prompt().question("Is the lung healthy?", "closed", ["yes", "no"]) == (
        "Is the lung healthy?"
    )


def test_kvasir_puts_its_system_turn_first(loaded) -> None:
    _, processor = loaded
    kvasir = _prompt("+experiment=kvasir_transformed")
    assert kvasir.system == KVASIR_SYSTEM and kvasir.options is None
    text = prompt_text(processor, "Are there polyps?", with_image=True, system=kvasir.system)
    bos = processor.tokenizer.bos_token
    assert text == f"{bos}SYSTEM: {KVASIR_SYSTEM}\nUSER: <image>\nAre there polyps?\nASSISTANT:"


def test_a_template_that_drops_the_system_turn_is_refused(loaded) -> None:
    _, processor = loaded

    class NoSystem:
        tokenizer = processor.tokenizer

        def apply_chat_template(self, messages, **kwargs):
            return "USER: " + messages[-1]["content"][-1]["text"] + "\nASSISTANT:"

    with pytest.raises(ValueError, match="drops the system turn"):
        prompt_text(NoSystem(), "q", system="be brief")


def test_llava_med_conversation_format(loaded) -> None:
    """model=llava_med renders LLaVA-Med v1.5's Mistral format whatever template the checkpoint's
    processor carries; the answer (and its </s>) are the only labels."""
    _, processor = loaded
    cfg = compose(["model=llava_med"], Path("/nonexistent"))
    assert cfg.model.chat_template == "llava_med"
    med = type(processor).from_pretrained(processor.tokenizer.name_or_path)
    med.chat_template = CHAT_TEMPLATES["llava_med"]
    question = "Is the lung healthy?"
    assert prompt_text(med, question) == "[INST] <image>\nIs the lung healthy? [/INST]"
    assert prompt_text(med, question, with_image=False) == "[INST] Is the lung healthy? [/INST]"
    assert prompt_text(med, question, system="Be brief.") == (
        "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n<image>\nIs the lung healthy? [/INST]"
    )
    enc = encode(med, question, Image.new("RGB", (64, 64)), answer="yes")
    labels = enc["labels"][enc["labels"] != IGNORE_INDEX]
    answer = med.tokenizer(" yes </s>", add_special_tokens=False)["input_ids"]
    assert labels.tolist() == answer and labels[-1] == med.tokenizer.eos_token_id


def test_training_and_generation_see_the_same_prompt(loaded, tmp_path: Path) -> None:
    """VQADataset renders a row once through the template: the training example is the
    generation prompt followed by the answer's tokens."""
    _, processor = loaded

    class OneImage:
        def load_image(self, image: str, rid: str) -> Image.Image:
            return Image.new("RGB", (64, 64), (120, 80, 40))

    frame = pd.DataFrame(
        {
            R.ID: ["a"],
            R.IMAGE: ["x.png"],
            R.QUESTION: ["Is the lung healthy?"],
            R.ANSWER: ["yes"],
            R.ANSWER_TYPE: ["closed"],
            R.CANDIDATES: [["yes", "no"]],
        }
    )
    sure = PromptTemplate(options=" Please choose from the following {n} options: [{options}].")
    train = VQADataset(frame, OneImage(), processor, True, prompt=sure)[0]
    infer = VQADataset(frame, OneImage(), processor, False, prompt=sure)[0]
    n = infer["input_ids"].shape[0]
    assert torch.equal(train["input_ids"][:n], infer["input_ids"])
    assert (train["labels"][:n] == IGNORE_INDEX).all() and (train["labels"][n:] >= 0).all()
    shown = processor.tokenizer.decode(infer["input_ids"], skip_special_tokens=True)
    assert "Please choose from the following two options: [yes, no]." in shown
    plain = VQADataset(frame, OneImage(), processor, False)[0]
    assert plain["input_ids"].shape[0] < n


def test_the_prompt_is_part_of_the_shared_answers_key(loaded) -> None:
    model, processor = loaded
    frames = {"test_iid": pd.DataFrame({R.ID: ["a"], R.QUESTION: ["q"]})}
    prompts = (PromptTemplate(), PromptTemplate(system="s"), PromptTemplate(options="x"))
    chosen = settings(model, processor)
    keys = {prediction_key("w", model, processor, frames, chosen, prompt=p) for p in prompts}
    keys.add(prediction_key("w", model, processor, frames, chosen))
    assert len(keys) == 3  # no prompt given and the default template are the same prompt


def test_paligemma_gets_a_template_its_checkpoints_lack() -> None:
    """PaliGemma's checkpoints have no chat template; model=paligemma names one: the question
    as PaliGemma was trained (its processor adds the image tokens, <bos> and the newline)."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    from medvqa.models.prompting import build_messages

    assert compose(["model=paligemma"], Path("/nonexistent")).model.chat_template == "paligemma"
    template = _compile_jinja_template(chat_template("paligemma"))
    turn = build_messages("Are there polyps?", True)
    answer = [{"role": "assistant", "content": [{"type": "text", "text": "yes"}]}]
    render = partial(template.render, eos_token="<eos>")
    assert render(messages=turn, add_generation_prompt=True) == "Are there polyps?"
    assert render(messages=turn + answer) == "Are there polyps?yes<eos>"
    with_system = build_messages("Are there polyps?", True, system="Be brief.")
    assert render(messages=with_system, add_generation_prompt=True) == (
        "Be brief.\nAre there polyps?"
    )
