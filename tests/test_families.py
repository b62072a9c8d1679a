"""Every shipped model config works end to end, tested offline on a tiny model of its family.

The real config (`model=<name>`) is composed as a user would; only `model.builder` swaps the hub
checkpoint for `TinyFamilyBuilder` (same transformers classes, module names and processor) and
`model.dtype` is float32. Each method then trains one step, generates, and reloads its weights.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
import yaml

from medvqa.models.adapters import apply_method
from medvqa.models.architectures import SHIPPED, load_architecture
from medvqa.models.families.base import families
from medvqa.models.loading import architecture, load_vlm, roles
from medvqa.models.saving import load_trainable, save_trainable
from medvqa.training.datamodule import META_KEY, VQADataset, make_loader
from medvqa.training.module import VQAModule
from tests.conftest import CONF, compose

SLOW = pytest.mark.slow  # same architecture as a case that runs by default
# Every preset of a hub checkpoint (the offline toys have a builder instead), with the
# model_type of its shipped architecture: the family every per-family fact is keyed by.
PRESETS = {
    p.stem: load_architecture(hub)[0].model_type
    for p in sorted((CONF / "model").glob("*.yaml"))
    if (hub := yaml.safe_load(p.read_text()).get("pretrained"))
}
CONFIGS = sorted(PRESETS)
assert {"llava_med", "qwen2_vl", "medgemma", "smolvlm", "paligemma"} <= set(CONFIGS)
# The built-in families (medvqa/models/families/): each runs its tiny twin with the preset it
# names (`ModelFamily.preset`); a preset of another family's architecture, or a family run with
# a preset of a sibling architecture (SmolVLM2 with the SmolVLM preset), is slow.
FAMILIES = {n: f for n, f in families().items() if f.__module__.startswith("medvqa.")}


def _case(preset: str, name: str) -> object:
    own = PRESETS[preset] == name and getattr(FAMILIES.get(name), "preset", None) == preset
    return pytest.param(preset, name, marks=() if own else SLOW, id=f"{preset}-{name}")


CASES = [
    _case(preset, name)
    for preset, name in sorted(
        {(f.preset, n) for n, f in FAMILIES.items()} | {(p, n) for p, n in PRESETS.items()}
    )
]
# Every method that trains, found from its YAML: a new method is tested by adding its file.
METHODS = sorted(
    p.stem for p in (CONF / "peft").glob("*.yaml") if yaml.safe_load(p.read_text()).get("fit", True)
)
assert {"lora", "ia3", "full", "prompt_tuning"} <= set(METHODS)
ADAPTER_MARKERS = ("lora_", "ia3_l", "trainable_tokens_delta")


def model_cfg(name: str, cache: Path, family: str | None = None):
    """The real `model=<name>` config with the hub id swapped for the offline tiny twin of
    `family` (by default the preset's own)."""
    fam = family or PRESETS[name]
    builder = (
        f"model.builder={{_target_: medvqa.zoo.families.TinyFamilyBuilder, "
        f"family: {fam}, cache_dir: '{cache}'}}"
    )
    return compose([f"model={name}", builder, "model.dtype=float32"], cache).model


@pytest.fixture(scope="module")
def source(cache_dir: Path):
    from medvqa.data.sources.synthetic import SyntheticVQA

    return SyntheticVQA(cache_dir, n_cases=6, image_size=32, questions_per_image=2)


def _loader(processor, source, with_answer: bool, padding_side: str):
    ds = VQADataset(source.table().head(4), source, processor, with_answer=with_answer)
    return make_loader(ds, 4, shuffle=False, padding_side=padding_side)


def _base_name(name: str) -> str:
    return name.replace("base_model.model.", "").replace(".base_layer", "")


@pytest.mark.parametrize("name", CONFIGS)
def test_config_names_its_hub_checkpoint(name: str) -> None:
    assert (CONF / "model" / f"{name}.yaml").is_file()
    cfg = compose([f"model={name}"]).model
    family = architecture(cfg)[0].model_type  # the shipped config's: what every fact is keyed by
    assert cfg.name == name and family == PRESETS[name]
    assert "/" in cfg.pretrained and cfg.builder is None
    assert cfg.dtype == "bfloat16" and cfg.trust_remote_code is False
    assert set(roles(cfg)) == {"vision", "projector", "language", "lm_head"}
    if family == "llava":
        assert roles(cfg) == roles(compose(["model=llava_med"]).model)


def test_every_preset_has_a_family_and_every_family_a_preset() -> None:
    """A preset's architecture (its `model_type`) must have a family module, and each family
    names the preset its tests run (docs/extending.md#a-model)."""
    orphans = {preset: kind for preset, kind in PRESETS.items() if kind not in FAMILIES}
    assert not orphans, (
        f"presets whose model_type has no module in medvqa/models/families: {orphans}"
    )
    assert {name: f.preset for name, f in FAMILIES.items() if f.preset not in PRESETS} == {}


def _facts(cache: Path) -> dict[str, object]:
    """Everything the code asks of the PaliGemma family, as plain values."""
    from medvqa.models.architectures import image_tokens, shrink
    from medvqa.models.families.base import family_refusal
    from medvqa.models.flops import counts_flops
    from medvqa.models.prompting import chat_template
    from medvqa.models.rehearsal import stand_in_processor
    from medvqa.zoo.families import TinyFamilyBuilder

    config, preprocessor = load_architecture("google/paligemma-3b-mix-224")
    model, processor = TinyFamilyBuilder("paligemma", cache).make()
    stand_in = stand_in_processor(config, preprocessor)
    return {
        "image tokens": image_tokens(config, preprocessor, (300, 500)),
        "shrunk": shrink(config).to_json_string(),
        "stand-in": (type(stand_in).__name__, stand_in.tokenizer.get_vocab()),
        "template": chat_template("paligemma"),
        "sharing": family_refusal(config),
        "flops": counts_flops(config),
        "tiny twin": {k: v.tolist() for k, v in model.state_dict().items()},
        "tiny processor": processor.tokenizer.get_vocab(),
    }


def test_a_family_is_its_module_alone(tmp_path: Path, monkeypatch) -> None:
    """PaliGemma's module copied outside the repository, with the built-in one gone, found
    through MEDVQA_PLUGINS: every fact the code asks of the family (image tokens, shrinking,
    the rehearsal's stand-in processor, the chat template, prefix sharing, FLOPs, the tiny twin
    bit for bit) is the same. With neither, each of them fails naming the family: nothing else
    in medvqa knows it, so adding a family is its module plus its YAML."""
    import sys

    from medvqa import plugins
    from medvqa.models.families import paligemma
    from medvqa.models.families.base import UnknownFamilyError

    before = _facts(tmp_path)
    registry = plugins._REGISTRY["family"]
    monkeypatch.setitem(registry, "paligemma", registry["paligemma"])  # restored after the test
    del registry["paligemma"]
    with pytest.raises(UnknownFamilyError, match="no model family 'paligemma'"):
        _facts(tmp_path)

    (tmp_path / "moved_family.py").write_text(Path(paligemma.__file__).read_text())
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(plugins.ENV_VAR, "moved_family")
    try:
        assert families()["paligemma"].__module__ == "moved_family"
        assert _facts(tmp_path) == before
    finally:
        registry.pop("paligemma", None)
        sys.modules.pop("moved_family", None)
        plugins._imported.discard("moved_family")


def test_a_family_lacking_a_fact_is_refused_when_defined() -> None:
    from medvqa.models.families.base import ModelFamily, StandIn
    from medvqa.plugins import PluginError

    tokens = ("<pad>", "<image>")
    with pytest.raises(PluginError, match=r"lacks preset, image_tokens\(\), tiny\(\)"):

        class Half(ModelFamily):  # registers nothing: it is refused first
            name = "half_vlm"
            stand_in = StandIn(tokens, None, "<pad>", {}, "", {"image_token_id": "<image>"})
            image_processor = processor = "SiglipImageProcessorPil"

    with pytest.raises(PluginError, match="'<img>', which is not a special token"):
        StandIn(tokens, None, "<pad>", {}, "", {"image_token_id": "<img>"})
    assert "half_vlm" not in families()


def _case_methods() -> list[object]:
    """Each case with each method; `make test` runs each family's own preset with one method
    (in turn), the other pairs are slow: the same code on other values."""
    out = []
    for i, case in enumerate(CASES):
        for j, method in enumerate(METHODS):
            extra = () if j == i % len(METHODS) else (pytest.mark.slow,)
            out.append(
                pytest.param(
                    *case.values, method, marks=(*case.marks, *extra), id=f"{case.id}-{method}"
                )
            )
    return out


@pytest.mark.parametrize(("name", "family", "method"), _case_methods())
def test_family_trains_generates_and_reloads(
    name: str, family: str | None, method: str, cache_dir: Path, source, tmp_path: Path
) -> None:
    cfg = model_cfg(name, cache_dir, family)
    part = roles(cfg)
    model, processor = load_vlm(cfg)
    vision, projector = f"{part['vision']}.", f"{part['projector']}."
    # the vision tower proper (Qwen's projector lives inside `visual`)
    is_vision = lambda n: vision in n and projector not in n  # noqa: E731
    assert any(is_vision(n) for n, _ in model.named_parameters()), f"no vision role {vision!r}"

    peft_cfg = compose([f"peft={method}"]).peft
    model = apply_method(model, peft_cfg, part, processor)
    # the state training starts from (prompt tuning has already added its token rows)
    before = {_base_name(n): p.detach().clone() for n, p in model.named_parameters()}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and not any(is_vision(n) for n in trainable)
    adapted = [
        n
        for n, _ in model.named_modules()
        if n.endswith(("lora_A", "ia3_l", "embed_tokens"))
        and any(m in n2 for n2 in trainable if n2.startswith(n) for m in ADAPTER_MARKERS)
    ]
    assert not any(is_vision(n) for n in adapted), "no adapter in the vision tower"
    if method != "full":
        assert adapted and all(f"{part['language']}." in n for n in adapted)

    train = _loader(processor, source, with_answer=True, padding_side="right")
    trainer = L.Trainer(
        max_steps=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(
        VQAModule(model, lr=1e-2, warmup_ratio=0.0, projector_lr=None), train_dataloaders=train
    )

    changed, adapters_changed = set(), []
    for n, p in model.named_parameters():
        base = _base_name(n)
        if any(m in n for m in ADAPTER_MARKERS):
            init = torch.ones_like(p) if "ia3_l" in n else torch.zeros_like(p)
            if "lora_A" not in n and not torch.equal(p.detach(), init):
                adapters_changed.append(n)
        elif not torch.equal(p.detach(), before[base]):
            changed.add(base)
    assert not any(is_vision(n) for n in changed), "the vision tower must stay unchanged"
    if method == "full":
        assert any(f"{part['language']}." in n for n in changed)
    else:
        assert adapters_changed, "adapter weights must change"
        assert all(projector in n for n in changed), sorted(changed)[:5]

    model.eval()
    prompts = next(iter(_loader(processor, source, with_answer=False, padding_side="left")))
    prompts = {k: v for k, v in prompts.items() if k != META_KEY}
    with torch.no_grad():
        out = model.generate(**prompts, max_new_tokens=3, do_sample=False)
    assert out.shape[0] == 4 and out.shape[1] > prompts["input_ids"].shape[1]
    assert all(isinstance(t, str) for t in processor.batch_decode(out[:, -3:]))

    save_trainable(model, tmp_path, method)
    fresh, fresh_processor = load_vlm(cfg)
    fresh = apply_method(fresh, peft_cfg, part, fresh_processor)
    load_trainable(fresh, tmp_path, method)
    fresh.eval()
    batch = {k: v for k, v in next(iter(train)).items() if k not in (META_KEY, "labels")}
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, fresh(**batch).logits)


@pytest.mark.parametrize(("name", "family"), CASES)
def test_prompt_tuning_keeps_image_positions_and_attention(
    name: str, family: str | None, cache_dir: Path, source
) -> None:
    """Virtual tokens go after the image: image-token positions, token types, position ids
    (Qwen's 3D M-RoPE) and the image embeddings reaching the LM are those without them."""
    cfg = model_cfg(name, cache_dir, family)
    part = roles(cfg)
    model, processor = load_vlm(cfg)
    model.eval()
    frame = source.table().head(1)

    def lm_inputs(m: torch.nn.Module) -> tuple[dict, dict]:
        features = VQADataset(frame, source, processor, with_answer=False)[0]
        features.pop(META_KEY)
        batch = {k: (v[None] if v.dim() == 1 else v) for k, v in features.items()}
        seen: dict = {}
        language = next(mod for n, mod in m.named_modules() if n.endswith(part["language"]))
        hook = language.register_forward_pre_hook(
            lambda _m, args, kwargs: seen.update(kwargs), with_kwargs=True
        )
        with torch.no_grad():
            m(**batch)
        hook.remove()
        return batch, seen

    plain, plain_lm = lm_inputs(model)
    tuned_model = apply_method(model, compose(["peft=prompt_tuning"]).peft, part, processor)
    tuned, tuned_lm = lm_inputs(tuned_model)
    n_virtual = tuned["input_ids"].shape[1] - plain["input_ids"].shape[1]
    assert n_virtual == compose(["peft=prompt_tuning"]).peft.virtual_tokens

    image_id = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    where = (plain["input_ids"][0] == image_id).nonzero().flatten()
    assert len(where) > 0
    assert torch.equal(where, (tuned["input_ids"][0] == image_id).nonzero().flatten())
    last = int(where.max()) + 1  # everything up to the image's end is unchanged
    for key in plain:
        if plain[key].shape[:2] == plain["input_ids"].shape:  # per-token: ids, masks, types
            assert torch.equal(plain[key][:, :last], tuned[key][:, :last]), key
        else:  # pixel values, grids: the image itself
            assert torch.equal(plain[key], tuned[key]), key
    embeds_plain, embeds_tuned = plain_lm["inputs_embeds"], tuned_lm["inputs_embeds"]
    assert torch.allclose(embeds_plain[:, where], embeds_tuned[:, where])
    pos_plain, pos_tuned = plain_lm.get("position_ids"), tuned_lm.get("position_ids")
    if pos_plain is not None:  # Qwen2-VL/2.5-VL: M-RoPE indices of the image tokens
        assert torch.equal(pos_plain[..., where], pos_tuned[..., where])


@pytest.fixture(scope="module")
def paligemma(cache_dir: Path):
    from omegaconf import OmegaConf

    from medvqa.zoo.families import TinyFamilyBuilder

    path = TinyFamilyBuilder("paligemma", cache_dir).build()
    return load_vlm(
        OmegaConf.create({"name": "paligemma", "pretrained": str(path), "dtype": "float32"})
    )


def _paligemma_pair(processor) -> tuple[dict, dict]:
    from PIL import Image

    from medvqa.models.prompting import encode

    image = Image.new("RGB", (32, 32), (40, 80, 120))
    ours = encode(processor, "is there a lesion?", image, answer="yes")
    ref = processor(
        text=["is there a lesion?"], images=[image], suffix=["yes"], return_tensors="pt"
    )
    return ours, {k: v[0] for k, v in ref.items() if k != "pixel_values"}


def test_paligemma_shared_prompt_matches_its_suffix_format(paligemma) -> None:
    """PaliGemma: the chat-template path gives its own `suffix=` token ids and labels."""
    ours, ref = _paligemma_pair(paligemma[1])
    assert torch.equal(ours["input_ids"], ref["input_ids"])
    assert torch.equal(ours["labels"], ref["labels"])


def test_paligemma_answer_is_causal(paligemma) -> None:
    """Answer tokens are typed 1 (causal suffix), as PaliGemma's own `suffix=` path types them."""
    ours, ref = _paligemma_pair(paligemma[1])
    assert torch.equal(ours["token_type_ids"], ref["token_type_ids"])


@pytest.mark.parametrize("model_id", sorted(SHIPPED))
def test_the_plan_and_the_run_decide_prefix_sharing_by_one_rule(model_id: str) -> None:
    """task=plan asks the config's image token, a run its processor's: one rule
    (`sharing_refusal`), the same answer for every shipped architecture (with the processor a
    rehearsal builds from the shipped preprocessor config)."""
    from medvqa.generation.prefix import image_token_id
    from medvqa.models.families.base import config_image_token, sharing_refusal
    from medvqa.models.rehearsal import stand_in_processor

    config, preprocessor = load_architecture(model_id)
    processor = stand_in_processor(config, preprocessor)
    # the stand-in tokenizer numbers its tokens its own way: both name one, or neither does
    assert (config_image_token(config) is None) == (image_token_id(processor) is None)
    assert sharing_refusal(config, config_image_token(config)) == sharing_refusal(
        config, image_token_id(processor)
    )
