"""What medvqa trains can leave it (issue #59): `medvqa-export` writes a run's weights as a peft
adapter folder or a whole transformers checkpoint with a model card, and a process that cannot
import medvqa (tests/export_loader.py) loads them with transformers and peft alone and gets
medvqa's own logits and greedy answers, in float32.

Per family (the tiny twin of each, tests/test_families.py): every method's adapter and merged
export of weights drawn at random through the same saving and export code as a run's, checked
against `task=eval`'s model (the base, the method applied, the weights loaded). The demo itself
(a trained LoRA run) is exported and answered again from its images and questions (slow).
Refusals need no model: a rehearsal, a run that did not finish, damaged weights, an `--out`
that holds something else.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from medvqa.atomic import OUTPUT_MARKER, OutputDirError
from medvqa.export.card import NOT_RECORDED, ExportFacts, model_card
from medvqa.export.job import CARD_FILE, export_run
from medvqa.export.weights import (
    ExportError,
    adapter_model,
    load_trained,
    merged_model,
    write_adapter,
    write_merged,
)
from medvqa.models.loading import resolve_pretrained
from medvqa.models.saving import TRAINED_DIR, WEIGHTS_FILE, WeightsMismatch, save_trainable
from medvqa.record import RESULTS_FILE
from tests.conftest import ROOT, compose, run_main
from tests.test_families import FAMILIES, METHODS, model_cfg
from tests.test_run_folder import _flip_a_bit, _run

LOADER = ROOT / "tests" / "export_loader.py"
QUESTION = "is there a lesion?"
NEW_TOKENS = 4


def _run_loader(cases: list[dict[str, Any]], tmp_path: Path) -> tuple[dict, dict]:
    """Run tests/export_loader.py on `cases` in a fresh interpreter; (report, tensors)."""
    from safetensors.torch import load_file

    spec = {"cases": cases, "tensors": str(tmp_path / "out.safetensors")}
    spec["report"] = str(tmp_path / "report.json")
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    done = subprocess.run(
        [sys.executable, str(LOADER), str(tmp_path / "spec.json")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(Path(spec["report"]).read_text())
    assert report.pop("medvqa imported") is False
    tensors = load_file(spec["tensors"]) if Path(spec["tensors"]).is_file() else {}
    return report, tensors


# -- refusals: no model is loaded ----------------------------------------------------------------


def _export(run: Path, out: Path, *overrides: str) -> Path:
    from medvqa.cli.export import export_folder

    return export_folder(run, out, overrides=["logger=csv", "debug=smoke", *overrides])


@pytest.mark.heavy
def test_a_rehearsal_is_refused(tmp_path: Path) -> None:
    run = _run(tmp_path)
    record = json.loads((run / RESULTS_FILE).read_text())
    record["rehearsal"] = True
    (run / RESULTS_FILE).write_text(json.dumps(record))
    with pytest.raises(ExportError, match="a rehearsal"):
        _export(run, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("status", ["running", "failed", "interrupted", "diverged"])
def test_a_run_that_did_not_finish_is_refused(tmp_path: Path, status: str) -> None:
    run = _run(tmp_path)
    record = json.loads((run / RESULTS_FILE).read_text())
    record["status"] = status
    (run / RESULTS_FILE).write_text(json.dumps(record))
    with pytest.raises(ValueError, match=f"the run is '{status}'"):
        _export(run, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.heavy
def test_damaged_weights_are_refused(tmp_path: Path) -> None:
    run = _run(tmp_path)
    _flip_a_bit(run / TRAINED_DIR / WEIGHTS_FILE)
    with pytest.raises(WeightsMismatch, match="has SHA-256"):
        _export(run, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.heavy
def test_an_out_folder_holding_something_else_is_refused_and_kept(tmp_path: Path) -> None:
    run = _run(tmp_path)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(OutputDirError, match="is not a medvqa-export output"):
        _export(run, out)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    with pytest.raises(OutputDirError):  # the run folder itself, too
        _export(run, run)
    assert (run / RESULTS_FILE).is_file()


def test_a_method_that_trained_nothing_is_refused(tmp_path: Path) -> None:
    run = _run(tmp_path)
    record = json.loads((run / RESULTS_FILE).read_text())
    record["config"]["peft"] |= {"name": "none", "fit": False, "adapter": None}
    (run / RESULTS_FILE).write_text(json.dumps(record))
    with pytest.raises(ExportError, match="trains nothing"):
        export_run(OmegaConf.create(record["config"]), run, tmp_path / "out")


@pytest.mark.heavy
def test_the_console_script_exits_2_with_the_reason(tmp_path: Path, caplog) -> None:
    from medvqa.cli.export import main

    run = _run(tmp_path)
    _flip_a_bit(run / TRAINED_DIR / WEIGHTS_FILE)
    assert main([str(run), "--out", str(tmp_path / "out"), "debug=smoke", "logger=csv"]) == 2
    assert "has SHA-256" in caplog.text


# -- the model card: only what the record holds ----------------------------------------------


def _record() -> dict[str, Any]:
    metrics = {
        "test_iid/closed_acc": 0.8,
        "test_iid/closed_acc_ci_lo": 0.7,
        "test_iid/closed_acc_ci_hi": 0.9,
        "test_ood/closed_acc": 0.6,
        "robustness/rr_closed": 0.75,
        "robustness/rr_closed_ci_lo": 0.6,
        "robustness/rr_closed_ci_hi": 0.9,
        "test_iid/open_f1": None,
    }
    config = compose(["peft=lora", "metric=[traditional]"]).copy()
    plain = OmegaConf.to_container(config, resolve=False)
    plain = {k: v for k, v in plain.items() if k not in ("hydra", "paths", "model", "dataset")}
    return {
        "status": "finished",
        "metrics": metrics,
        "config": {**plain, "evaluation": {"primary_closed": "closed_acc",
                                            "primary_open": "open_f1",
                                            "bootstrap": {"level": 0.95}}},
        "provenance": {"data": {"dataset": "synthetic"}, "git": {"commit": "abc123", "dirty": False}},
        "choices": {"dataset": "synthetic"},
    }  # fmt: skip


def test_the_card_front_matter_has_the_headline_figures_and_their_intervals() -> None:
    facts = ExportFacts("synthetic-lora", merged=False, base="org/base-7b", virtual_tokens=0)
    card = model_card(_record(), None, facts)
    meta = yaml.safe_load(str(card).split("---")[1])
    assert meta["base_model"] == "org/base-7b" and meta["library_name"] == "peft"
    assert meta["datasets"] == ["synthetic"] and "medvqa" in meta["tags"]
    (index,) = meta["model-index"]
    found = {
        (r["dataset"]["split"], m["type"]): (m["value"], m.get("args"))
        for r in index["results"]
        for m in r["metrics"]
    }
    assert found[("test_iid", "closed_acc")] == (
        0.8,
        {"ci_lo": 0.7, "ci_hi": 0.9, "ci_level": 0.95},
    )
    assert found[("test_ood", "closed_acc")] == (0.6, None)  # no interval recorded: none written
    assert found[("robustness", "rr_closed")][0] == 0.75
    assert ("test_iid", "open_f1") not in found  # null in the record: not a figure


def test_the_card_body_says_not_recorded_for_what_the_record_lacks() -> None:
    facts = ExportFacts("x", merged=True, base="org/base-7b", virtual_tokens=20)
    text = str(model_card(_record(), None, facts))
    body = text.split("---", 2)[2]
    assert "commit: abc123" in body
    for missing in ("whole job", "device", "optimiser steps", "Splits"):
        line = next(line for line in body.splitlines() if missing in line)
        assert NOT_RECORDED in line, line
    assert "No LLM judge scored this run" in body
    assert "<medvqa_vt_0>" in body and "resize_token_embeddings" not in body  # merged


# -- each family's exports, loaded without medvqa ------------------------------------------------


def _drawn_run(name: str, family: str, method: str, cache: Path, out: Path) -> Any:
    """The weights a run of `method` would save, drawn at random (the adapters' initial values
    would hide a weight that does not load: LoRA's B is zero), through `save_trainable`."""
    from medvqa.models.adapters import apply_method
    from medvqa.models.loading import load_vlm, roles

    cfg = compose([f"peft={method}"], cache)
    cfg.model = model_cfg(name, cache, family)
    model, processor = load_vlm(cfg.model)
    model = apply_method(model, cfg.peft, roles(cfg.model), processor)
    torch.manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.05 * torch.randn_like(param))
    save_trainable(model, out / TRAINED_DIR, method)
    return cfg


def _prompt(processor: Any, image: Any) -> dict[str, torch.Tensor]:
    from medvqa.models.prompting import encode

    features = encode(processor, QUESTION, image)
    return {k: (v[None] if v.dim() == 1 else v).contiguous() for k, v in features.items()}


def _greedy(model: torch.nn.Module, processor: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """medvqa's own decode of one prompt (`generation.decode.Decoder`)."""
    from medvqa.generation.decode import Decoder
    from medvqa.generation.logprobs import ChosenLogProbs
    from medvqa.generation.settings import GenerationSettings

    settings = GenerationSettings(1, NEW_TOKENS, False, None, False, "static", False)
    tok = processor.tokenizer
    pad = tok.eos_token_id if tok.pad_token_id is None else tok.pad_token_id
    with torch.no_grad():
        out = Decoder(settings, pad)(model, dict(batch), ChosenLogProbs())
    return out[:, batch["input_ids"].shape[1] :]


def _family_cases(name: str, family: str, cache: Path, tmp_path: Path) -> None:
    from PIL import Image
    from safetensors.torch import save_file

    from medvqa.models.adapters import merged_adapters
    from medvqa.models.prompting import virtual_prefix

    image = Image.new("RGB", (32, 32), (40, 80, 120))
    image.save(tmp_path / "image.png")
    cases, expected = [], {}

    def case(label: str, folder: Path, base: str | None, logits: Any, tokens: Any) -> None:
        cases.append({"name": label, "dir": str(folder), "base": base, **prompt})
        expected[label] = (logits, tokens)

    for method in METHODS:
        run = tmp_path / method
        cfg = _drawn_run(name, family, method, cache, run)
        model, processor = load_trained(cfg.model, cfg.peft, run / TRAINED_DIR, True)
        model.generation_config.max_new_tokens = NEW_TOKENS
        batch = _prompt(processor, image)
        save_file(batch, run / "inputs.safetensors")
        prompt = {"inputs": str(run / "inputs.safetensors"), "image": str(tmp_path / "image.png")}
        prompt["prompt"] = virtual_prefix(processor) + QUESTION
        with torch.no_grad():
            logits, tokens = model(**batch).logits, _greedy(model, processor, batch)
            with merged_adapters(model):  # generation's own fold (model.merge_adapters)
                merged = (model(**batch).logits, _greedy(model, processor, batch))
        base = resolve_pretrained(cfg.model)
        if method != "full":
            exported = adapter_model(model, processor, cfg.model, cfg.peft, True, base)
            write_adapter(exported, processor, run / "adapter")
            case(f"{method}/adapter", run / "adapter", base, logits, tokens)
            model, processor = load_trained(cfg.model, cfg.peft, run / TRAINED_DIR, True)
            model.generation_config.max_new_tokens = NEW_TOKENS
        write_merged(merged_model(model, cfg.model), processor, run / "merged")
        case(f"{method}/merged", run / "merged", None, *merged)
    report, tensors = _run_loader(cases, tmp_path)
    for label, (logits, tokens) in expected.items():
        assert torch.equal(tensors[f"{label}/logits"], logits), label
        assert torch.equal(tensors[f"{label}/tokens"], tokens), label
        loaded = report[label]["processor"]
        if loaded == "loaded":
            assert report[label]["same_prompt"], (
                f"{label}: the folder's processor prompts otherwise"
            )
        else:  # only where the stock processor needs torchvision's video processor
            assert family in ("qwen2_vl", "qwen2_5_vl", "smolvlm"), (label, loaded)


FAMILY_CASES = [
    pytest.param(f.preset, n, marks=() if n == "llava" else pytest.mark.slow, id=n)
    for n, f in sorted(FAMILIES.items())
]


@pytest.mark.parametrize(("name", "family"), FAMILY_CASES)
def test_each_methods_export_loads_without_medvqa_and_answers_as_medvqa(
    name: str, family: str, cache_dir: Path, tmp_path: Path
) -> None:
    """Adapter folders give medvqa's logits bit for bit; merged checkpoints those of medvqa's
    own merged generation (`model.merge_adapters`: the same fold); both the same greedy answer."""
    _family_cases(name, family, cache_dir, tmp_path)


def test_a_lora_adapter_folder_is_peft_s_own(cache_dir: Path, tmp_path: Path) -> None:
    """The projector LoRA trains as full weights is peft's `modules_to_save`, the base's path
    is recorded, and the folder holds what PeftModel.from_pretrained reads."""
    cfg = _drawn_run("llava_med", "llava", "lora", cache_dir, tmp_path)
    model, processor = load_trained(cfg.model, cfg.peft, tmp_path / TRAINED_DIR, True)
    base = resolve_pretrained(cfg.model)
    write_adapter(adapter_model(model, processor, cfg.model, cfg.peft, True, base), processor,
                  tmp_path / "adapter")  # fmt: skip
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["modules_to_save"] == ["multi_modal_projector"]
    assert config["base_model_name_or_path"] == base and config["inference_mode"] is True
    assert {"adapter_model.safetensors", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in (tmp_path / "adapter").iterdir()
    }
    full = _drawn_run("llava_med", "llava", "full", cache_dir, tmp_path / "full")
    model, processor = load_trained(full.model, full.peft, tmp_path / "full" / TRAINED_DIR, True)
    with pytest.raises(ExportError, match="--merged"):
        adapter_model(model, processor, full.model, full.peft, True, base)


# -- the demo: trained, exported, answered again without medvqa ----------------------------------


@pytest.fixture(scope="module")
def demo_run(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("demo") / "lora"
    done = run_main(["debug=smoke", "logger=csv", "peft=lora"], run, cache_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    return run


@pytest.mark.slow
def test_the_demo_exported_answers_its_own_questions_without_medvqa(
    demo_run: Path, cache_dir: Path, tmp_path: Path
) -> None:
    """medvqa-export, then transformers + peft alone, from the images and questions: the
    demo's answers (predictions.jsonl), as an adapter folder and as a merged checkpoint; the
    card's figures are the record's."""
    from medvqa.cli.export import main
    from medvqa.data.sources.synthetic import SyntheticVQA

    env = ["logger=csv", f"paths.cache_dir={cache_dir}"]
    assert main([str(demo_run), "--out", str(tmp_path / "adapter"), *env]) == 0
    assert main([str(demo_run), "--out", str(tmp_path / "merged"), "--merged", *env]) == 0
    assert main([str(demo_run), "--out", str(tmp_path / "adapter"), *env]) == 0  # replaced whole
    assert (tmp_path / "adapter" / OUTPUT_MARKER).is_file()

    record = json.loads((demo_run / RESULTS_FILE).read_text())
    source = SyntheticVQA(**{k: v for k, v in record["config"]["dataset"].items()
                             if not k.startswith("_")})  # fmt: skip
    answers = [
        json.loads(line) for line in (demo_run / "predictions.jsonl").read_text().splitlines()
    ]
    rows = [
        {"image": str(source.image_path(a["image"], a["id"])), "question": a["question"]}
        for a in answers
    ]
    base = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    cases = [
        {"name": "adapter", "dir": str(tmp_path / "adapter"), "base": base["base_model_name_or_path"],
         "rows": rows},
        {"name": "merged", "dir": str(tmp_path / "merged"), "base": None, "rows": rows},
    ]  # fmt: skip
    report, _ = _run_loader(cases, tmp_path)
    want = [a["prediction"] for a in answers]
    assert report["adapter"]["answers"] == want
    assert report["merged"]["answers"] == want
    card = (tmp_path / "adapter" / CARD_FILE).read_text()
    assert f"value: {record['metrics']['test_iid/closed_acc']}" in card


@pytest.mark.slow
def test_task_export_writes_what_the_console_script_writes(
    demo_run: Path, cache_dir: Path, tmp_path: Path
) -> None:
    done = run_main(
        ["task=export", f"eval.from_run={demo_run}", f"task.out={tmp_path / 'out'}", "logger=csv"],
        tmp_path / "job",
        cache_dir,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "job" / RESULTS_FILE).read_text())["status"] == "finished"
    files = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", CARD_FILE} <= files
