"""The generation engine (medvqa.generation): the static decode gives the growing cache's answers
and log-probabilities (float32, CPU) on every family's tiny twin, shared or not; each image of a
batch is read and processed once; the settings are decided once and checked."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pandas as pd
import pytest
import torch

from medvqa.data import records as R
from medvqa.data.transforms import transformed_identity
from medvqa.generation import decode
from medvqa.generation.data import GenerationDataset, OncePerImage
from medvqa.generation.decode import Decoder
from medvqa.generation.logprobs import ChosenLogProbs
from medvqa.generation.predict import generate_predictions
from medvqa.generation.settings import GenerationSettings
from medvqa.models.loading import load_vlm
from medvqa.models.spec import decode_cache_length
from medvqa.training.datamodule import META_KEY, VQADataset
from tests.conftest import sampled
from tests.generating import settings
from tests.test_families import model_cfg
from tests.test_shared_prefix import SHARING, _frame, _same

FAMILIES = [*SHARING, "paligemma"]  # PaliGemma decodes unshared


@pytest.fixture(scope="module")
def source(cache_dir: Path):
    from medvqa.data.sources.synthetic import SyntheticVQA

    return SyntheticVQA(cache_dir, n_cases=4, image_size=32, questions_per_image=5)


def _answers(model, processor, frame, source, path: Path, engine: str, share: bool = True):
    options = settings(
        model, processor, batch_size=6, max_new_tokens=6, share_image_prefix=share, decode=engine
    )
    out = generate_predictions(model, processor, frame, source, path, "test", options)
    return out.set_index(R.ID).sort_index()


@pytest.mark.parametrize("name", sampled(FAMILIES, keep=1))
def test_the_static_decode_gives_the_growing_caches_answers(
    name: str, cache_dir: Path, source, tmp_path: Path
) -> None:
    """Mixed question lengths, several images per batch, one image asked once; shared prefixes
    where the family shares, and unshared."""
    model, processor = load_vlm(model_cfg(name, cache_dir))
    model.eval()
    text = model.config.get_text_config()
    if getattr(text, "sliding_window", None):  # the tiny Gemma's 64 tokens: rows would not fit
        text.sliding_window = 4096
    frame = _frame(source)
    dynamic = _answers(model, processor, frame, source, tmp_path / "d.jsonl", "dynamic")
    static = _answers(model, processor, frame, source, tmp_path / "s.jsonl", "static")
    _same(static, dynamic)
    if name == "llava_med":  # unshared as well (every family's unshared path is the same code)
        plain = _answers(model, processor, frame, source, tmp_path / "p.jsonl", "static", False)
        _same(plain, dynamic)


def test_a_resumed_split_decoded_static(cache_dir: Path, source, tmp_path: Path) -> None:
    model, processor = load_vlm(model_cfg("qwen2_5_vl", cache_dir))
    model.eval()
    frame = _frame(source)
    path = tmp_path / "predictions.jsonl"
    _answers(model, processor, frame.head(5), source, path, "static")  # killed after 5 rows
    resumed = _answers(model, processor, frame, source, path, "static")
    _same(resumed, _answers(model, processor, frame, source, tmp_path / "d.jsonl", "dynamic"))


@pytest.mark.parametrize("name", FAMILIES)
def test_each_image_of_a_batch_is_read_and_processed_once(
    name: str, cache_dir: Path, source, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of 10 rows showing 2 images: 2 reads, 2 runs of the image processor, and the
    features every row would get on its own (processors that pop keys from the image
    processor's output included: Idefics3, Gemma 3)."""
    _, processor = load_vlm(model_cfg(name, cache_dir))
    frame = source.table().head(10)
    assert frame[R.IMAGE].nunique() == 2
    dataset = GenerationDataset(frame, source, processor, with_answer=False)
    reads: list[str] = []
    real_read = type(source).load_image

    def counting_read(self, ref, record_id=None):  # type: ignore[no-untyped-def]
        reads.append(ref)
        return real_read(self, ref, record_id)

    monkeypatch.setattr(type(source), "load_image", counting_read)
    runs: list[OncePerImage] = []
    real_init = OncePerImage.__init__

    def tracking_init(self, inner):  # type: ignore[no-untyped-def]
        real_init(self, inner)
        runs.append(self)

    monkeypatch.setattr(OncePerImage, "__init__", tracking_init)
    batch = dataset.__getitems__(list(range(10)))
    assert len(reads) == 2 and sum(r.calls for r in runs) == 2
    alone = VQADataset(frame, source, processor, with_answer=False)
    for i, features in enumerate(batch):
        expected = alone[i]
        assert features.pop("image_identity") == alone.image_key(i)
        assert features.keys() == expected.keys()
        for key, value in expected.items():
            if key == META_KEY:  # (target, id): one target here
                assert features[key] == (0, value)
            else:
                assert torch.equal(features[key], value), key


def test_a_pixels_identity_is_known_before_the_pixels() -> None:
    """A corruption is drawn per row, so rows of one image see other pixels; a Kvasir augment is
    drawn per image variant, so the questions on one variant see the same pixels."""
    one = transformed_identity("corruption:low:0", "r1", "img")
    assert one != transformed_identity("corruption:low:0", "r2", "img")
    assert one == transformed_identity("corruption:low:0", "r1", "img")
    assert one != transformed_identity("corruption:high:0", "r1", "img")
    ids = [transformed_identity("kvasir_augment:2:0", f"r{i}", "img") for i in range(20)]
    assert len(set(ids)) == 2  # two variants, each shared by its questions
    with pytest.raises(ValueError, match="unknown image transform"):
        transformed_identity("sharpen:1:0", "r1", "img")


def test_blank_and_partner_images_are_keyed_by_what_is_shown(cache_dir: Path, source) -> None:
    _, processor = load_vlm(model_cfg("llava_med", cache_dir))
    frame = source.table().head(10)
    image = VQADataset(frame, source, processor, False, "image")
    blank = VQADataset(frame, source, processor, False, "blank")
    none = VQADataset(frame, source, processor, False, "none")
    shuffled = VQADataset(frame, source, processor, False, "shuffled")
    assert {blank.image_key(i) for i in range(10)} == {
        f"blank\0{image.image_key(i)}" for i in range(10)
    }  # a blank image has its image's size
    assert {none.image_key(i) for i in range(10)} == {"none"}
    partner = shuffled.pool.iloc[shuffled.partners[str(frame[R.ID].iloc[0])]]
    assert shuffled.image_key(0).startswith(f"{partner[R.IMAGE]}\0")


def test_the_static_cache_length_is_bucketed() -> None:
    assert [decode_cache_length("static", n, 16) for n in (1, 48, 49)] == [64, 64, 128]
    assert decode_cache_length("dynamic", 49, 16) == 65


def test_generation_settings_are_checked() -> None:
    def chosen(batch: int = 8, **options) -> GenerationSettings:  # type: ignore[no-untyped-def]
        return GenerationSettings(batch, 16, True, None, False, **options)

    with pytest.raises(ValueError, match=re.escape("model.decode='paged'")):
        chosen(decode="paged")
    with pytest.raises(ValueError, match=re.escape("model.compile_decode=2")):
        chosen(compile=2)
    with pytest.raises(ValueError, match=re.escape("data.eval_batch_size=0")):
        chosen(0)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert chosen().compiles(cuda) and not chosen().compiles(cpu)  # auto, the default
    assert chosen(compile=True).compiles(cpu)
    assert not chosen(decode="dynamic", compile=True).compiles(cuda)
    assert not chosen(compile=False).compiles(cuda)


def test_a_decode_that_does_not_compile_goes_eager_under_auto(
    cache_dir: Path, source, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """auto: the batch is decoded again eagerly and later batches skip the attempt, with a log
    line; true: the failure stops the job."""
    model, processor = load_vlm(model_cfg("llava_med", cache_dir))
    model.eval()
    dataset = VQADataset(source.table().head(2), source, processor, with_answer=False)
    from medvqa.training.datamodule import make_loader

    batch = next(iter(make_loader(dataset, 2, shuffle=False, padding_side="left")))
    batch.pop(META_KEY)
    monkeypatch.setattr(GenerationSettings, "compiles", lambda self, device: True)
    real = type(model).generate
    attempts: list[bool] = []

    def generate(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        attempts.append(kwargs.get("disable_compile", True))
        if not kwargs.get("disable_compile", True):
            raise RuntimeError("no compiler for this op")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "generate", generate)
    auto = Decoder(GenerationSettings(2, 3, False, None, False, compile="auto"), pad_token_id=0)
    with caplog.at_level(logging.WARNING, logger=decode.__name__), torch.no_grad():
        first = auto(model, batch, ChosenLogProbs())
        second = auto(model, batch, ChosenLogProbs())
    assert attempts == [False, True, True] and torch.equal(first, second)
    assert "decoding eagerly from here on" in caplog.text and auto.eager
    strict = Decoder(GenerationSettings(2, 3, False, None, False, compile=True), pad_token_id=0)
    with pytest.raises(RuntimeError, match="no compiler"), torch.no_grad():
        strict(model, batch, ChosenLogProbs())


@pytest.mark.slow
def test_the_compiled_static_decode_gives_the_eager_answers(
    cache_dir: Path, source, tmp_path: Path
) -> None:
    """compile_decode=true on the CPU (inductor, a C++ compiler): the answers of the eager
    decode, shared prefixes on."""
    model, processor = load_vlm(model_cfg("llava_med", cache_dir))
    model.eval()
    frame = _frame(source).head(8)
    eager = _answers(model, processor, frame, source, tmp_path / "e.jsonl", "static")
    options = settings(model, processor, batch_size=6, max_new_tokens=6, compile=True)
    compiled = generate_predictions(
        model, processor, frame, source, tmp_path / "c.jsonl", "test", options
    )
    _same(compiled.set_index(R.ID).sort_index(), eager)


def test_passes_that_show_the_same_images_are_generated_together() -> None:
    from medvqa.generation.passes import Job, generation_groups, job_passes

    data = {"eval_image": "image", "extra_eval_images": ["blank", "shuffled"], "option_orders": 2}
    passes = job_passes(Job({"data": data}, "LoRA", True, "zero-shot"))
    groups = [[p.prefix for p in g] for g in generation_groups(passes)]
    # the untuned base is shared with other jobs: alone; the orders join the main answers
    assert groups == [["zero_shot/"], ["", "order1/", "order2/"], ["blank/"], ["shuffled/"]]
    data = {"eval_image": "image", "option_orders": 1}
    untuned = job_passes(Job({"data": data}, "zero-shot", False, None))
    assert [[p.prefix for p in g] for g in generation_groups(untuned)] == [[""], ["order1/"]]


def test_option_orders_share_each_images_prefix_with_the_main_answers(
    cache_dir: Path, source, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The main answers and an option order generated together: each file holds the answers
    of its own pass generated alone (float32), and each image's prefix ran once for both."""
    from medvqa.generation.passes.option_order import reordered
    from medvqa.generation.predict import PassFiles, generate_passes
    from tests.test_shared_prefix import Counter

    model, processor = load_vlm(model_cfg("llava_med", cache_dir))
    model.eval()
    frame = _frame(source)
    assert frame[R.CANDIDATES].map(lambda c: c is not None and len(c) > 1).any()
    frames = {"test": frame}
    orders = {"test": reordered(frame, 1)}
    options = settings(model, processor, batch_size=64, max_new_tokens=6)
    counter = Counter(monkeypatch)
    alone = [
        generate_passes(model, processor, source, [PassFiles(f, tmp_path / f"{i}.jsonl")], options)
        for i, f in enumerate((frames, orders))
    ]
    separate = sum(counter.batches)
    counter.batches.clear()
    together = generate_passes(
        model,
        processor,
        source,
        [PassFiles(frames, tmp_path / "main.jsonl"), PassFiles(orders, tmp_path / "order.jsonl")],
        options,
    )
    assert together is not None and all(a is not None for a in alone)
    for a, t in zip([a[0] for a in alone], together, strict=True):  # type: ignore[index]
        _same(t["test"].set_index(R.ID).sort_index(), a["test"].set_index(R.ID).sort_index())
    assert sum(counter.batches) == separate // 2  # one prefix per image for both passes
    main = pd.read_json(tmp_path / "main.jsonl", lines=True)
    order = pd.read_json(tmp_path / "order.jsonl", lines=True)
    assert len(main) == len(order) == len(frame)
    changed = main.set_index(R.ID)[R.CANDIDATES] != order.set_index(R.ID)[R.CANDIDATES]
    assert changed.any()  # each file holds its own pass's rows
