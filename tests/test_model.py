"""The tiny VLM reloads through the Auto classes and generates; methods train what they say."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

from medvqa.models.adapters import apply_method
from medvqa.models.loading import load_vlm, roles
from medvqa.models.prompting import IGNORE_INDEX, encode, prompt_text
from medvqa.models.spec import ModuleRoles
from medvqa.training.datamodule import META_KEY, VQADataset, make_loader
from medvqa.training.module import VQAModule
from tests.conftest import CONF, compose


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path):
    cfg = OmegaConf.create({"name": "tiny", "pretrained": str(tiny_model_dir), "dtype": "float32"})
    return load_vlm(cfg)


def test_reload_from_directory_and_generate(loaded, tiny_model_dir: Path) -> None:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model, processor = loaded
    assert (tiny_model_dir / "config.json").is_file()
    assert type(processor).__name__ == "LlavaProcessor"
    again = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    for (n, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), n
    image = Image.new("RGB", (64, 64), (90, 90, 90))
    enc = processor(
        images=[image], text=[prompt_text(processor, "what modality is this?")], return_tensors="pt"
    )
    out = model.generate(**enc, max_new_tokens=5, do_sample=False)
    assert out.shape[1] > enc["input_ids"].shape[1]
    assert isinstance(AutoProcessor.from_pretrained(tiny_model_dir).tokenizer.decode(out[0]), str)


def test_labels_cover_only_the_answer(loaded) -> None:
    _, processor = loaded
    image = Image.new("RGB", (64, 64))
    train = encode(processor, "is there a lesion?", image, answer="yes")
    infer = encode(processor, "is there a lesion?", image)
    n = infer["input_ids"].shape[0]
    # training and inference share the prompt token for token
    assert torch.equal(train["input_ids"][:n], infer["input_ids"])
    assert (train["labels"][:n] == IGNORE_INDEX).all()
    answer_ids = train["labels"][n:]
    assert (answer_ids != IGNORE_INDEX).all()
    text = processor.tokenizer.decode(answer_ids, skip_special_tokens=True).strip()
    assert text == "yes"
    assert answer_ids[-1].item() == processor.tokenizer.eos_token_id


def _batches(processor, source_table, source, n: int = 3):
    ds = VQADataset(source_table.head(4 * n), source, processor, with_answer=True)
    return make_loader(ds, 4, shuffle=False, padding_side="right")


@pytest.mark.parametrize("method", ["lora", "ia3", "full"])
def test_method_trains_what_it_says(method: str, tiny_model_dir: Path, cache_dir: Path) -> None:
    """TRL-style: a few steps, then base weights unchanged / adapter (or base) changed."""
    from hydra.utils import instantiate

    from tests.conftest import SMALL

    cfg = compose([*SMALL, f"peft={method}"], cache_dir)
    model, processor = load_vlm(
        OmegaConf.create({"name": "tiny", "pretrained": str(tiny_model_dir), "dtype": "float32"})
    )
    source = instantiate(cfg.dataset)
    table = source.table()
    part_roles = roles(cfg.model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model = apply_method(model, cfg.peft, part_roles)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable, "the method must train something"
    assert not any(part_roles["vision"] in n for n in trainable), "vision tower stays frozen"
    module = VQAModule(model, lr=1e-2, projector_lr=None)
    trainer = L.Trainer(
        max_steps=3,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, train_dataloaders=_batches(processor, table, source))

    after = dict(model.named_parameters())
    base_changed, adapter_changed = [], []
    for name, param in after.items():
        base_name = name.replace("base_model.model.", "").replace(".base_layer", "")
        if base_name in before and param.shape == before[base_name].shape:
            if not torch.equal(param.detach(), before[base_name]):
                base_changed.append(base_name)
        else:
            assert param.requires_grad, f"new parameter {name} should be the trainable adapter"
            adapter_changed.append(name)
    projector = part_roles["projector"]
    if method == "full":
        assert any(part_roles["language"] in n for n in base_changed)
    else:
        assert adapter_changed, "adapter weights must change"
        changed_adapter = [
            n
            for n in adapter_changed
            if not torch.equal(after[n].detach(), _init_value(n, after[n]))
        ]
        assert changed_adapter
        # the frozen language model and vision tower are untouched; only the projector trains
        assert base_changed and all(projector in n for n in base_changed), base_changed
    assert not any(part_roles["vision"] in n for n in base_changed)


def _init_value(name: str, param: torch.Tensor) -> torch.Tensor:
    """peft's init: LoRA B = 0, (IA)^3 vectors = 1; LoRA A is random (compare with B only)."""
    if "lora_B" in name:
        return torch.zeros_like(param)
    if "ia3_l" in name:
        return torch.ones_like(param)
    return param.detach()  # LoRA A: no known init value; judged through B


def test_adapter_stays_out_of_the_vision_tower(loaded) -> None:
    from peft import LoraConfig

    from medvqa.models.adapters import build_adapter_config

    adapter = OmegaConf.create(
        {"_target_": "peft.LoraConfig", "r": 2, "target_modules": ["q_proj", "v_proj"]}
    )
    config = build_adapter_config(adapter, "language", vars(ModuleRoles()))
    assert isinstance(config, LoraConfig)
    from peft import get_peft_model
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_config(loaded[0].config)
    wrapped = get_peft_model(model, config)
    adapted = [n for n, _ in wrapped.named_modules() if n.endswith("lora_A")]
    assert adapted and all("language_model" in n for n in adapted)
    assert not any("vision_tower" in n for n in adapted)


def test_batch_carries_record_ids(loaded, cache_dir: Path) -> None:
    from hydra.utils import instantiate

    from tests.conftest import SMALL

    cfg = compose(SMALL, cache_dir)
    source = instantiate(cfg.dataset)
    batch = next(iter(_batches(loaded[1], source.table(), source, n=1)))
    assert batch[META_KEY] == source.table().head(4)["id"].tolist()
    assert batch["input_ids"].shape == batch["labels"].shape
    assert (CONF / "model" / "tiny.yaml").is_file()


def test_nan_loss_raises_diverged() -> None:
    from medvqa.training.module import Diverged

    class NaNModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))

        def forward(self, **_: object) -> object:
            return type("Out", (), {"loss": self.w * float("nan")})()

    from torch.utils.data import DataLoader

    from tests.test_numerics import _trainer

    loader = DataLoader([{"input_ids": torch.ones(3)}] * 2, batch_size=2)
    with pytest.raises(Diverged) as err:
        _trainer(max_steps=1).fit(
            VQAModule(NaNModel(), projector_lr=None), train_dataloaders=loader
        )
    assert err.value.step == 0 and "diverged" in str(err.value)


@pytest.mark.parametrize("method", ["lora", "prompt_tuning"])
def test_saved_weights_reload_to_identical_outputs(
    method: str, tiny_model_dir: Path, cache_dir: Path, tmp_path: Path
) -> None:
    from hydra.utils import instantiate

    from medvqa.models.saving import load_trainable, save_trainable
    from tests.conftest import SMALL

    cfg = compose([*SMALL, f"peft={method}"], cache_dir)
    spec = OmegaConf.create({"name": "tiny", "pretrained": str(tiny_model_dir), "dtype": "float32"})
    source = instantiate(cfg.dataset)
    model, processor = load_vlm(spec)
    model = apply_method(model, cfg.peft, roles(cfg.model), processor)
    loader = _batches(processor, source.table(), source, n=2)
    trainer = L.Trainer(
        max_steps=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(VQAModule(model, lr=1e-2, projector_lr=None), train_dataloaders=loader)
    save_trainable(model, tmp_path, method)

    fresh, fresh_processor = load_vlm(spec)
    fresh = apply_method(fresh, cfg.peft, roles(cfg.model), fresh_processor)
    load_trainable(fresh, tmp_path, method)
    batch = {k: v for k, v in next(iter(loader)).items() if k not in (META_KEY, "labels")}
    model.eval()
    fresh.eval()
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, fresh(**batch).logits)

    other, _ = load_vlm(spec)  # a model without the method applied cannot take the weights
    with pytest.raises(ValueError, match="does not match"):
        load_trainable(apply_method(other, compose(["peft=full"]).peft, roles(cfg.model)), tmp_path)


def test_image_modes(loaded, cache_dir: Path) -> None:
    """none: no image and no image tokens; blank: an image of the same size, all black."""
    from hydra.utils import instantiate

    from tests.conftest import SMALL

    _, processor = loaded
    source = instantiate(compose(SMALL, cache_dir).dataset)
    frame = source.table().head(2)
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    sighted = VQADataset(frame, source, processor, with_answer=True)[0]
    none = VQADataset(frame, source, processor, with_answer=True, image_mode="none")[0]
    blank = VQADataset(frame, source, processor, with_answer=True, image_mode="blank")[0]
    assert (sighted["input_ids"] == image_id).sum() > 0
    assert (none["input_ids"] == image_id).sum() == 0 and "pixel_values" not in none
    assert torch.equal(blank["input_ids"], sighted["input_ids"])
    assert blank["pixel_values"].shape == sighted["pixel_values"].shape
    per_channel = blank["pixel_values"][0].flatten(1).std(dim=1)  # constant within each channel
    assert per_channel.max() < 1e-6 < sighted["pixel_values"].std()
    assert torch.equal(
        none["labels"][none["labels"] != -100], sighted["labels"][sighted["labels"] != -100]
    )


@pytest.mark.heavy
def test_check_trainer() -> None:
    from medvqa.training.hardware import HardwareError, check_trainer

    cpu, gpu = compose(["trainer=cpu"]).trainer, compose(["trainer=gpu"]).trainer
    zero2 = compose(["trainer=deepspeed_zero2"]).trainer
    assert zero2.strategy.stage == 2 and zero2.strategy.exclude_frozen_parameters
    assert zero2.precision == "bf16-mixed"
    # The string form (Lightning's registry name) is still recognised, on a CPU accelerator too.
    by_name = OmegaConf.merge(cpu, {"strategy": "deepspeed_stage_2"})
    check_trainer(cpu, cuda_available=False)
    check_trainer(zero2, cuda_available=True)
    for trainer in (gpu, zero2, by_name):
        with pytest.raises(HardwareError, match="trainer=cpu"):
            check_trainer(trainer, cuda_available=False)


def test_zero2_strategy_is_instantiated_with_the_trainer() -> None:
    """The nested `_target_` becomes a DeepSpeedStrategy when train_eval instantiates cfg.trainer."""
    pytest.importorskip("deepspeed", reason="deepspeed is in the dev extra")
    from hydra.utils import instantiate
    from lightning.pytorch.strategies import DeepSpeedStrategy

    strategy = instantiate(compose(["trainer=deepspeed_zero2"]).trainer.strategy)
    assert isinstance(strategy, DeepSpeedStrategy)
    assert strategy.exclude_frozen_parameters and strategy.config["zero_optimization"]["stage"] == 2


def test_original_llava_med_layout_is_refused_with_the_fix(tmp_path: Path) -> None:
    """microsoft/llava-med-v1.5-mistral-7b (model_type llava_mistral) is not transformers'
    LLaVA format: the error says so and names a loadable copy, not a raw transformers error."""
    import json

    original = tmp_path / "llava-med-v1.5-mistral-7b"
    original.mkdir()
    (original / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llava_mistral",
                "architectures": ["LlavaMistralForCausalLM"],
                "mm_vision_select_layer": -2,
                "image_aspect_ratio": "pad",
            }
        )
    )
    spec = OmegaConf.create({"name": "llava_med", "pretrained": str(original)})
    with pytest.raises(ValueError, match=r"llava_mistral.*transformers' LLaVA format"):
        load_vlm(spec)
