"""The shipped architecture configs build the real models on the meta device, offline.

Each checkpoint's meta build must have its published parameter count (a wrong layer count, width
or vocabulary shows up there), and `image_tokens` must give the counts the real processors give.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

from medvqa.models import architectures as arch
from medvqa.models.families import idefics3, qwen

# Published parameter counts of each checkpoint, with where they were found.
PUBLISHED: dict[str, int] = {
    # Derived: microsoft/llava-med-v1.5-mistral-7b model.safetensors.index.json total_size 15,132,438,528
    # bytes of bf16 = 7,566,219,264 (vendored at github.com/m2ai-lab/LLaVA-Med_Extension), plus the 64
    # rows the conversion adds to embed_tokens and lm_head (32000 -> 32064): 2 * 64 * 4096 = 524,288.
    "chaoyinshe/llava-med-v1.5-mistral-7b-hf": 7_566_743_552,
    # A public test: count_parameters(LlavaForConditionalGeneration(LlavaConfig.from_pretrained(
    # "llava-hf/llava-1.5-7b-hf"))) == 7063427072; also transformers' quantization blog snippet.
    "llava-hf/llava-1.5-7b-hf": 7_063_427_072,
    # mteb ModelMeta n_parameters of Qwen2-VL-2B fine-tunes; a VLM size table "qwen/qwen2-vl-2b-instruct".
    "Qwen/Qwen2-VL-2B-Instruct": 2_208_985_600,
    # The same VLM size table: "qwen/qwen2-vl-7b-instruct": 8291375616.
    "Qwen/Qwen2-VL-7B-Instruct": 8_291_375_616,
    # model.safetensors.index.json total_size 7,509,245,952 bytes of bf16 (a vendored copy of the repo);
    # mteb ModelMeta of GVE-3B (a Qwen2.5-VL-3B fine-tune).
    "Qwen/Qwen2.5-VL-3B-Instruct": 3_754_622_976,
    # Hugging Face API numParameters of Qwen/Qwen2.5-VL-7B-Instruct; mteb ModelMeta of GVE-7B.
    "Qwen/Qwen2.5-VL-7B-Instruct": 8_292_166_656,
    # keras-hub preset medgemma_instruct_4b "params": 4300079472 (the same as gemma-3-4b-it).
    "google/medgemma-4b-it": 4_300_079_472,
    # A public benchmark table of PaliGemma-3B-224 loaded with transformers. keras-hub's
    # pali_gemma_3b_mix_224 says 2,923,335,408: it drops the 64 padding rows of the 257,216-token
    # embedding (64 * 2048 = 131,072).
    "google/paligemma-3b-mix-224": 2_923_466_480,
    # Public run logs "params 256484928"; model.safetensors is 513,028,808 bytes = 2 * 256,484,928 + header.
    "HuggingFaceTB/SmolVLM-256M-Instruct": 256_484_928,
}
REL_TOLERANCE = 0.005


def test_every_checkpoint_is_shipped_once():
    assert set(arch.SHIPPED) == set(PUBLISHED)


@pytest.mark.parametrize("hub_id", sorted(arch.SHIPPED))
def test_shipped_file_is_complete(hub_id):
    raw = json.loads(arch.SHIPPED[hub_id].read_text())
    assert raw["hub_id"] == hub_id
    assert len(raw["source"]) > 100, "say where every value came from"
    # Qwen's hub files keep the text settings at the top level; transformers nests them as text_config.
    assert {"model_type", "vision_config"} <= set(raw["config"])
    config = arch.config_from_dict(raw["config"])
    assert config.get_text_config() is not config and config.vision_config is not None
    assert raw["preprocessor"], "the image-token facts of the checkpoint's processor"


@pytest.mark.parametrize("hub_id", sorted(arch.SHIPPED))
def test_meta_build_has_the_published_parameter_count(hub_id):
    config, _ = arch.load_architecture(hub_id)
    model = arch.meta_model(config, torch.bfloat16)

    assert all(p.is_meta for p in model.parameters()), "parameters must hold no memory"
    assert all(b.is_meta for b in model.buffers()), "buffers must hold no memory"
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    # The class transformers maps this model_type to, and the one the checkpoint names.
    expected = MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES[config.model_type]
    assert type(model).__name__ == expected
    assert config.architectures == [expected]
    count = sum(p.numel() for p in model.parameters())  # tied weights counted once
    assert abs(count - PUBLISHED[hub_id]) <= REL_TOLERANCE * PUBLISHED[hub_id], f"{count:,}"


@pytest.mark.parametrize(
    ("hub_id", "tokens"),
    [
        # (336 / 14)^2 patches; CLIP's CLS token is dropped by the "default" feature strategy.
        ("llava-hf/llava-1.5-7b-hf", 576),
        ("chaoyinshe/llava-med-v1.5-mistral-7b-hf", 576),
        # mm_tokens_per_image / image_seq_length.
        ("google/medgemma-4b-it", 256),
        ("google/paligemma-3b-mix-224", 256),
        # max_pixels 12,845,056 / (14 * 2)^2: a 3584 x 3584 picture.
        ("Qwen/Qwen2-VL-2B-Instruct", 16384),
        ("Qwen/Qwen2-VL-7B-Instruct", 16384),
        ("Qwen/Qwen2.5-VL-3B-Instruct", 16384),
        ("Qwen/Qwen2.5-VL-7B-Instruct", 16384),
        # Longest edge 2048 -> 4 x 4 tiles of 512 plus the global view, 64 tokens each.
        ("HuggingFaceTB/SmolVLM-256M-Instruct", (16 + 1) * 64),
    ],
)
def test_worst_case_image_tokens(hub_id, tokens):
    config, preprocessor = arch.load_architecture(hub_id)
    assert arch.image_tokens(config, preprocessor) == tokens


def test_fixed_size_families_ignore_the_picture_size():
    for hub_id in (
        "llava-hf/llava-1.5-7b-hf",
        "google/medgemma-4b-it",
        "google/paligemma-3b-mix-224",
    ):
        config, preprocessor = arch.load_architecture(hub_id)
        worst = arch.image_tokens(config, preprocessor)
        assert arch.image_tokens(config, preprocessor, (480, 1920)) == worst


def test_qwen_tokens_follow_smart_resize_and_the_pixel_cap():
    config, preprocessor = arch.load_architecture("Qwen/Qwen2-VL-2B-Instruct")
    assert arch.image_tokens(config, preprocessor, (448, 448)) == 16 * 16
    assert arch.image_tokens(config, preprocessor, (20, 20)) == 2 * 2  # raised to min_pixels 56*56
    capped = {**preprocessor, "max_pixels": 1280 * 28 * 28}
    assert arch.image_tokens(config, capped) == 1280
    assert arch.image_tokens(config, capped, (4000, 3000)) <= 1280
    # transformers 5 files spell the bounds as size; min/max_pixels still win when both are there.
    resized = {"size": {"shortest_edge": 3136, "longest_edge": 512 * 28 * 28}}
    assert arch.image_tokens(config, resized) == 512
    assert arch.image_tokens(config, {**resized, "max_pixels": 256 * 28 * 28}) == 256


def test_smart_resize_matches_transformers():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    for height, width in [(20, 20), (224, 224), (333, 517), (1080, 1920), (4000, 3000), (28, 5000)]:
        for max_pixels in (1280 * 28 * 28, 12845056):
            expected = smart_resize(height, width, 28, 3136, max_pixels)
            assert qwen.smart_resize(height, width, 28, 3136, max_pixels) == expected


def test_smolvlm_tiles_follow_the_longest_edge():
    config, preprocessor = arch.load_architecture("HuggingFaceTB/SmolVLM-256M-Instruct")
    # Any picture is first resized so its longest edge is 2048: a small square still makes 4 x 4 tiles.
    assert arch.image_tokens(config, preprocessor, (100, 100)) == 17 * 64
    assert arch.image_tokens(config, preprocessor, (1024, 2048)) == (2 * 4 + 1) * 64
    whole = {**preprocessor, "do_image_splitting": False}
    assert arch.image_tokens(config, whole) == 64


def test_idefics3_tiles_match_transformers():
    from transformers.models.idefics3.image_processing_pil_idefics3 import (
        Idefics3ImageProcessorPil,
    )

    processor = Idefics3ImageProcessorPil(
        size={"longest_edge": 2048}, max_image_size={"longest_edge": 512}, do_image_splitting=True
    )
    for height, width in [
        (100, 100),
        (512, 512),
        (333, 1517),
        (2000, 700),
        (5000, 5000),
        (601, 600),
    ]:
        _, rows, cols = processor.get_number_of_image_patches(height, width)
        assert idefics3.idefics3_tiles(height, width, 2048, 512, True) == (rows, cols)


def test_markers_count_the_special_tokens_around_images():
    expected = {
        "llava-hf/llava-1.5-7b-hf": 576,
        "Qwen/Qwen2-VL-2B-Instruct": 16384 + 2,  # <|vision_start|> <|vision_end|>
        "google/medgemma-4b-it": 256 + 2,  # <start_of_image> <end_of_image>
        "google/paligemma-3b-mix-224": 256,
        # 16 tiles x (<fake_token_around_image> <row_i_col_j>) + <fake><global-img>...<fake>
        "HuggingFaceTB/SmolVLM-256M-Instruct": 17 * 64 + 16 * 2 + 3,
    }
    for hub_id, tokens in expected.items():
        config, preprocessor = arch.load_architecture(hub_id)
        assert arch.image_tokens(config, preprocessor, with_markers=True) == tokens, hub_id


def test_gemma3_pan_and_scan_adds_crops():
    config, preprocessor = arch.load_architecture("google/medgemma-4b-it")
    scanning = {**preprocessor, "do_pan_and_scan": True}
    assert arch.image_tokens(config, scanning) == (1 + 4) * 256  # pan_and_scan_max_num_crops 4
    assert arch.image_tokens(config, scanning, (896, 2688)) == (1 + 3) * 256  # 3:1 -> 3 crops
    assert arch.image_tokens(config, scanning, (896, 896)) == 256  # square: no crops


def test_local_checkpoint_wins_over_the_shipped_file(tmp_path, monkeypatch):
    hub_id = "Qwen/Qwen2-VL-2B-Instruct"
    shipped = json.loads(arch.SHIPPED[hub_id].read_text())["config"]
    local = (
        tmp_path / hub_id
    )  # a directory that spells the hub id, relative to the working directory
    local.mkdir(parents=True)
    (local / "config.json").write_text(json.dumps({**shipped, "num_hidden_layers": 2}))
    (local / "processor_config.json").write_text(
        json.dumps({"image_processor": {"max_pixels": 64 * 28 * 28, "image_mean": [0.5] * 3}})
    )
    monkeypatch.chdir(tmp_path)

    config, preprocessor = arch.load_architecture(hub_id)

    assert config.get_text_config().num_hidden_layers == 2
    assert preprocessor == {"max_pixels": 64 * 28 * 28}  # only the image-token fields
    assert arch.image_tokens(config, preprocessor) == 64
    assert arch.load_architecture(Path(hub_id))[0].get_text_config().num_hidden_layers == 2


def test_unknown_checkpoint_names_the_fix(tmp_path):
    with pytest.raises(KeyError, match=r"no architecture for 'acme/vlm-1b'") as raised:
        arch.load_architecture("acme/vlm-1b")
    message = str(raised.value)
    assert "Qwen/Qwen2-VL-2B-Instruct" in message  # lists what is shipped
    assert "model.pretrained" in message and "acme--vlm-1b.json" in message
    with pytest.raises(KeyError, match=r"has no config\.json"):
        arch.load_architecture(tmp_path)


def test_image_tokens_refuses_an_unknown_family():
    config = transformers.AutoConfig.for_model("blip-2")
    with pytest.raises(ValueError, match="no model family 'blip-2' for the image-token count"):
        arch.image_tokens(config, {})
