"""`medvqa-convert llava-med`: the original LLaVA-Med layout in, transformers' LLaVA out.

The fixture writes a tiny checkpoint exactly as LLaVA-Med saves one (model_type llava_mistral,
Mistral keys `model.*`/`lm_head`, projector `model.mm_projector.{0,2}`, CLIP tower under
`model.vision_tower.vision_tower.vision_model.*` or only named in `mm_vision_tower`, sharded
safetensors with an index, a Mistral-style tokenizer). The converted model must give the logits
of the original architecture, computed here independently from the same modules.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

from medvqa.cli.convert import main
from medvqa.models.convert import (
    CLIP_VIT_L14_336,
    KNOWN_TOWERS,
    ConversionError,
    convert_llava_med,
)
from medvqa.models.loading import load_vlm
from medvqa.models.prompting import answer_text, encode, prompt_text

IMAGE_TOKEN_INDEX = -200  # LLaVA's placeholder id for the image in its own input_ids
SELECT_LAYER = -2
IMAGE_SIZE, PATCH = 16, 8
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CORPUS = [
    "[INST] what modality is this image? [/INST] the image shows a ct scan of the chest",
    "is there a lesion in the left lung? yes no mri x-ray which organ is shown? liver",
]


def mistral_tokenizer() -> Any:
    """A tiny tokenizer of Mistral's kind: <unk>/<s>/</s> = 0/1/2, byte fallback, "▁" word
    prefix, BOS added, no pad token."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaTokenizer

    bpe = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    special = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    bpe.train_from_iterator(
        CORPUS, trainers.BpeTrainer(vocab_size=360, special_tokens=special, show_progress=False)
    )
    model = json.loads(bpe.to_str())["model"]
    return LlamaTokenizer(
        vocab=model["vocab"],
        merges=[tuple(m) for m in model["merges"]],
        add_bos_token=True,
        add_eos_token=False,
    )


def _scale(module: torch.nn.Module, std: float) -> None:
    """Matrices of a size that makes logits O(1): a default init gives near-zero logits, where
    any tolerance passes. Norm weights stay at one."""
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, std)


class Original:
    """The original modules (CLIP tower, mlp2x_gelu projector, Mistral LM) and their layout."""

    def __init__(self, root: Path, tower_in_source: bool, weights: str = "safetensors") -> None:
        from transformers import (
            CLIPConfig,
            CLIPModel,
            CLIPVisionConfig,
            MistralConfig,
            MistralForCausalLM,
        )

        torch.manual_seed(0)
        self.tokenizer = mistral_tokenizer()
        self.vision_config = CLIPVisionConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=3,  # hidden_states[-2] differs from [-1]
            num_attention_heads=2,
            image_size=IMAGE_SIZE,
            patch_size=PATCH,
            projection_dim=32,
        )
        self.text_config = MistralConfig(
            vocab_size=len(self.tokenizer),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            rope_theta=1e6,
            sliding_window=None,
            tie_word_embeddings=False,
        )
        # The tower as its own checkpoint: a whole CLIP model (text half included), as
        # openai/clip-vit-large-patch14-336 is published.
        clip = CLIPModel(
            CLIPConfig(
                vision_config=self.vision_config.to_dict(),
                text_config={
                    "hidden_size": 16,
                    "intermediate_size": 32,
                    "num_hidden_layers": 1,
                    "num_attention_heads": 2,
                    "vocab_size": 99,
                    "bos_token_id": 0,
                    "eos_token_id": 1,
                },
                projection_dim=32,
            )
        )
        _scale(clip.vision_model, 0.2)
        self.clip_dir = root / "clip-vit-tiny"
        clip.save_pretrained(self.clip_dir)
        from transformers import CLIPImageProcessorPil

        CLIPImageProcessorPil(
            size={"shortest_edge": IMAGE_SIZE},
            crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        ).save_pretrained(self.clip_dir)
        self.vision = clip.vision_model.eval()
        self.projector = torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 64)
        )
        _scale(self.projector, 0.2)
        self.lm = MistralForCausalLM(self.text_config).eval()
        _scale(self.lm, 0.2)
        self.src = root / "llava-med-v1.5-mistral-tiny"
        self.write(tower_in_source, weights)

    def state_dict(self, tower_in_source: bool) -> dict[str, torch.Tensor]:
        """The keys LLaVA-Med's LlavaMistralForCausalLM saves."""
        state = dict(self.lm.state_dict())  # model.embed_tokens, model.layers.*, lm_head
        assert "model.embed_tokens.weight" in state and "lm_head.weight" in state
        state.update({f"model.mm_projector.{k}": v for k, v in self.projector.state_dict().items()})
        if tower_in_source:
            for key, value in self.vision.state_dict().items():
                name = key if key.startswith("vision_model.") else f"vision_model.{key}"
                state[f"model.vision_tower.vision_tower.{name}"] = value
        return state

    def write(self, tower_in_source: bool, weights: str) -> None:
        """Two shards and their index, as safetensors (the release) or pytorch .bin files
        (older LLaVA saves, which also carry rotary `inv_freq` buffers)."""
        from safetensors.torch import save_file

        self.src.mkdir(parents=True)
        state = {k: v.contiguous() for k, v in self.state_dict(tower_in_source).items()}
        if weights == "bin":
            head_dim = self.text_config.hidden_size // self.text_config.num_attention_heads
            for i in range(self.text_config.num_hidden_layers):
                state[f"model.layers.{i}.self_attn.rotary_emb.inv_freq"] = torch.ones(head_dim // 2)
        keys = sorted(state)
        stem, suffix = (
            ("model", "safetensors") if weights == "safetensors" else ("pytorch_model", "bin")
        )
        shards = {
            f"{stem}-00001-of-00002.{suffix}": keys[: len(keys) // 2],
            f"{stem}-00002-of-00002.{suffix}": keys[len(keys) // 2 :],
        }
        for name, part in shards.items():
            if weights == "safetensors":
                save_file({k: state[k] for k in part}, self.src / name, metadata={"format": "pt"})
            else:
                torch.save({k: state[k] for k in part}, self.src / name)
        weight_map = {k: name for name, part in shards.items() for k in part}
        (self.src / f"{stem}.{suffix}.index.json").write_text(
            json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map})
        )
        config = {k: v for k, v in self.text_config.to_dict().items() if k != "rope_parameters"}
        config.update(
            {
                "model_type": "llava_mistral",
                "architectures": ["LlavaMistralForCausalLM"],
                "rope_theta": 1e6,  # Mistral-7B-v0.2's, stored the legacy way
                # the release names its tower by hub id; a local path is what LLaVA's own
                # training scripts write when the tower is loaded from disk
                "mm_vision_tower": (
                    str(self.clip_dir) if tower_in_source else "openai/clip-vit-large-patch14-336"
                ),
                "mm_hidden_size": 32,
                "mm_projector_type": "mlp2x_gelu",
                "mm_vision_select_layer": SELECT_LAYER,
                "mm_vision_select_feature": "patch",
                "mm_patch_merge_type": "flat",
                "mm_use_im_start_end": False,
                "mm_use_im_patch_token": False,
                "image_aspect_ratio": "pad",
                "tokenizer_model_max_length": 4096,
                "tokenizer_padding_side": "right",
                "use_mm_proj": True,
                "feature_outs": "encoder+decoder",
                "vision_backbone": "convnext-large",
            }
        )
        (self.src / "config.json").write_text(json.dumps(config))
        self.tokenizer.save_pretrained(self.src)

    @torch.no_grad()
    def logits(
        self, input_ids: list[int], pixel_values: torch.Tensor, layer: int = SELECT_LAYER
    ) -> torch.Tensor:
        """LLaVA's forward: tower hidden_states[layer] without CLS -> projector -> features
        spliced in at IMAGE_TOKEN_INDEX -> Mistral."""
        hidden = self.vision(pixel_values, output_hidden_states=True).hidden_states[layer]
        features = self.projector(hidden[:, 1:])[0]
        at = input_ids.index(IMAGE_TOKEN_INDEX)
        embed = self.lm.get_input_embeddings()
        before = embed(torch.tensor(input_ids[:at]))
        after = embed(torch.tensor(input_ids[at + 1 :]))
        embeds = torch.cat([before, features, after])[None]
        return self.lm(inputs_embeds=embeds).logits[0]


def expand2square(image: Image.Image, background: tuple[int, ...]) -> Image.Image:
    """LLaVA-Med's llava/mm_utils.py expand2square at the lower of its two random offsets."""
    width, height = image.size
    if width == height:
        return image
    side = max(width, height)
    result = Image.new(image.mode, (side, side), background)
    result.paste(
        image, (0, (width - height) // 2) if width > height else ((height - width) // 2, 0)
    )
    return result


def _spec(path: Path) -> Any:
    return OmegaConf.create({"name": "llava_med", "pretrained": str(path), "dtype": "float32"})


@pytest.fixture(
    scope="module",
    params=[("tower_in_source", "safetensors"), ("tower_by_path", "bin")],
    ids=["tower_in_source-safetensors", "tower_by_path-bin"],
)
def converted(request, tmp_path_factory) -> tuple[Original, Path]:
    tower, weights = request.param
    root = tmp_path_factory.mktemp(f"{tower}-{weights}")
    in_source = tower == "tower_in_source"
    original = Original(root, tower_in_source=in_source, weights=weights)
    dst = root / "converted"
    convert_llava_med(original.src, dst, vision_tower=None if in_source else original.clip_dir)
    return original, dst


def _row_image() -> Image.Image:
    rng = np.random.default_rng(7)
    return Image.fromarray(rng.integers(0, 256, (12, 20, 3), dtype=np.uint8))  # 20 wide, 12 high


def test_logits_match_the_original_architecture(converted) -> None:
    original, dst = converted
    model, processor = load_vlm(_spec(dst))
    model.eval()
    assert type(model).__name__ == "LlavaForConditionalGeneration"
    enc = processor(
        images=[_row_image()],
        text=[prompt_text(processor, "what modality is this image?")],
        return_tensors="pt",
    )
    ids = enc["input_ids"][0].tolist()
    image_id = model.config.image_token_index
    n_image = (IMAGE_SIZE // PATCH) ** 2  # patches without CLS ("patch" features)
    assert ids.count(image_id) == n_image
    first = ids.index(image_id)
    assert ids[first : first + n_image] == [image_id] * n_image
    original_ids = [*ids[:first], IMAGE_TOKEN_INDEX, *ids[first + n_image :]]
    with torch.no_grad():
        logits = model(**enc).logits[0]
    vocab = original.text_config.vocab_size
    padded = -(-(vocab + 2) // 64) * 64  # vocab + <image> + <pad>, padded to a multiple of 64
    assert logits.shape == (len(ids), padded) and padded > vocab + 2
    expected = original.logits(original_ids, enc["pixel_values"])
    assert expected.abs().max() > 1.0  # logits large enough for the tolerance to mean something
    torch.testing.assert_close(logits[:, :vocab], expected, atol=1e-5, rtol=1e-5)
    # the check can fail: the last layer's features, or another image, give other logits
    assert (
        original.logits(original_ids, enc["pixel_values"], layer=-1) - expected
    ).abs().max() > 1e-2
    black = processor.image_processor(images=[Image.new("RGB", (20, 12))], return_tensors="pt")
    assert (original.logits(original_ids, black["pixel_values"]) - expected).abs().max() > 1e-2


def test_new_tokens_and_config(converted) -> None:
    original, dst = converted
    model, processor = load_vlm(_spec(dst))
    tok = processor.tokenizer
    vocab = original.text_config.vocab_size
    assert tok.convert_tokens_to_ids("<image>") == vocab == model.config.image_token_index
    assert tok.pad_token == "<pad>" and tok.pad_token_id == vocab + 1
    assert model.config.vision_feature_layer == SELECT_LAYER
    assert model.config.vision_feature_select_strategy == "default"
    assert model.config.projector_hidden_act == "gelu"
    assert model.config.text_config.rope_parameters["rope_theta"] == 1e6
    embed = model.get_input_embeddings().weight
    torch.testing.assert_close(embed[vocab], embed[:vocab].mean(0))  # reproducible new rows
    assert json.loads((dst / "medvqa_convert.json").read_text())["source"] == str(
        original.src.resolve()
    )


@pytest.mark.parametrize("size", [(20, 12), (9, 17)])
def test_images_are_padded_to_square_with_the_clip_mean(converted, size) -> None:
    """pixel_values = CLIP preprocessing of LLaVA-Med's expand2square(image, mean colour)."""
    from transformers import CLIPImageProcessorPil

    _, dst = converted
    _, processor = load_vlm(_spec(dst))
    rng = np.random.default_rng(1)
    image = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    clip = CLIPImageProcessorPil(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    background = tuple(int(x * 255) for x in CLIP_MEAN)
    assert background == (122, 116, 104)
    expected = clip(images=[expand2square(image, background)], return_tensors="pt")
    got = processor.image_processor(images=[image], return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(got, expected["pixel_values"], atol=1e-6, rtol=0)
    # without padding (CLIP's own centre crop) the border would be cut, not filled
    cropped = clip(images=[image], return_tensors="pt")["pixel_values"]
    assert (cropped - got).abs().max() > 0.1


def test_prompt_is_llava_med_mistral_instruct(converted) -> None:
    """conv_mistral_instruct (LLAMA_2 style, system "", sep "", sep2 "</s>") renders
    "[INST] <image>\\n{q} [/INST]" and the answer as " {a} </s>"; the tokenizer adds <s>."""
    _, dst = converted
    _, processor = load_vlm(_spec(dst))
    question = "what modality is this image?"
    assert (
        prompt_text(processor, question) == "[INST] <image>\nwhat modality is this image? [/INST]"
    )
    assert answer_text(processor, question, "ct") == " ct </s>"
    row = encode(processor, question, _row_image(), answer="ct")
    tok = processor.tokenizer
    ids = row["input_ids"].tolist()
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    labels = row["labels"][row["labels"] != -100].tolist()
    assert labels[-1] == tok.eos_token_id
    assert tok.decode(labels, skip_special_tokens=True).strip() == "ct"


def test_command_line_and_layout_errors(tmp_path: Path) -> None:
    original = Original(tmp_path, tower_in_source=False)
    # the release names its tower by hub id only: the tower must be given
    with pytest.raises(ConversionError, match=r"--vision-tower"):
        convert_llava_med(original.src, tmp_path / "a")
    assert main(["llava-med", str(original.src), str(tmp_path / "a")]) == 2
    assert not (tmp_path / "a").exists()
    args = ["llava-med", str(original.src), str(tmp_path / "b"), "--vision-tower"]
    assert main([*args, str(original.clip_dir)]) == 0
    assert (tmp_path / "b" / "config.json").is_file()
    with pytest.raises(ConversionError, match="already exists"):
        convert_llava_med(original.src, tmp_path / "b", vision_tower=original.clip_dir)

    config = json.loads((original.src / "config.json").read_text())
    (original.src / "config.json").write_text(json.dumps({**config, "mm_projector_type": "linear"}))
    with pytest.raises(ConversionError, match=r"config.json: mm_projector_type='linear'"):
        convert_llava_med(original.src, tmp_path / "c", vision_tower=original.clip_dir)
    (original.src / "config.json").write_text(json.dumps(config))

    (original.src / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ConversionError, match=r"model-00002-of-00002.safetensors"):
        convert_llava_med(original.src, tmp_path / "d", vision_tower=original.clip_dir)


def test_missing_projector_is_named(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    original = Original(tmp_path, tower_in_source=False)
    for shard in original.src.glob("*.safetensors"):
        part = load_file(shard)
        save_file({k: v for k, v in part.items() if "mm_projector.2" not in k}, shard)
    with pytest.raises(ConversionError, match=r"multi_modal_projector\.linear_2"):
        convert_llava_med(original.src, tmp_path / "out", vision_tower=original.clip_dir)


def test_loading_the_original_names_the_converter(tmp_path: Path) -> None:
    original = Original(tmp_path, tower_in_source=False)
    with pytest.raises(ValueError, match=r"medvqa-convert llava-med .*llava-med-v1.5-mistral-tiny"):
        load_vlm(_spec(original.src))


def test_release_tower_named_by_hub_id(tmp_path: Path) -> None:
    """The release carries the tower's weights but names it only by hub id: its config is
    CLIP ViT-L/14-336's (transformers' default LLaVA tower), so tiny weights do not fit it."""
    from transformers import LlavaConfig

    default = LlavaConfig().vision_config
    assert {k: getattr(default, k) for k in KNOWN_TOWERS[CLIP_VIT_L14_336]} == KNOWN_TOWERS[
        CLIP_VIT_L14_336
    ]
    original = Original(tmp_path, tower_in_source=True)
    config = json.loads((original.src / "config.json").read_text())
    config["mm_vision_tower"] = CLIP_VIT_L14_336
    (original.src / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ConversionError, match=r"tower's weights do not fit its config.*--vision-tower"
    ):
        convert_llava_med(original.src, tmp_path / "out")
    # given the matching tower's config, the same weights convert
    convert_llava_med(original.src, tmp_path / "out", vision_tower=original.clip_dir)
    assert (tmp_path / "out" / "config.json").is_file()
