"""Load medvqa's exports with transformers and peft alone, as someone without medvqa would.

`python tests/export_loader.py SPEC.json` (tests/test_export.py runs it in a subprocess): any
import of medvqa fails here, so nothing medvqa registers (its image-only processors) can help.
SPEC lists cases, each an export folder with how to load it:

- `{"name", "dir", "base": null}`: a merged checkpoint, `AutoModelForImageTextToText`;
- `{"name", "dir", "base": PATH}`: a peft adapter folder on `base`, with the embedding resized
  first where the folder's tokenizer has more tokens (prompt tuning's virtual tokens);

and what to run: `inputs` (a safetensors file of one prompt's tensors, as medvqa built them):
its logits and greedy tokens are written to SPEC's `tensors`; `rows` (`{"image", "question"}`):
each answered from the folder's own processor and chat template, greedily, with the folder's
generation config, into SPEC's `report` with whether the processor loaded (Qwen's and SmolVLM's
stock processors need torchvision for their video processor, which a CPU test machine lacks)
and whether it tokenises `inputs`' prompt as medvqa did (`prompt` with it).
"""

from __future__ import annotations

import importlib.abc
import json
import sys
from pathlib import Path
from typing import Any


class NoMedvqa(importlib.abc.MetaPathFinder):
    """Refuse every import of medvqa."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "medvqa" or name.startswith("medvqa."):
            raise ImportError(f"{name}: this loader runs without medvqa")


sys.meta_path.insert(0, NoMedvqa())

import torch  # noqa: E402
from PIL import Image  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForImageTextToText,
    AutoProcessor,
    AutoTokenizer,
    GenerationConfig,
)


def load(case: dict[str, Any]) -> Any:
    """The model of one case, in eval mode."""
    if case["base"] is None:
        return AutoModelForImageTextToText.from_pretrained(case["dir"]).eval()
    from peft import PeftModel

    base = AutoModelForImageTextToText.from_pretrained(case["base"])
    tokens = len(AutoTokenizer.from_pretrained(case["dir"]))
    if tokens > base.get_input_embeddings().weight.shape[0]:
        base.resize_token_embeddings(tokens)
    return PeftModel.from_pretrained(base, case["dir"]).eval()


def prompt(processor: Any, question: str, image: Image.Image) -> dict[str, Any]:
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}
    ]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return dict(processor(text=[text], images=[image], return_tensors="pt"))


def run(case: dict[str, Any], tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    model = load(case)
    generation = GenerationConfig.from_pretrained(case["dir"])
    report: dict[str, Any] = {"answers": []}
    name = case["name"]
    if case.get("inputs"):
        batch = load_file(case["inputs"])
        with torch.no_grad():
            tensors[f"{name}/logits"] = model(**batch).logits.contiguous()
            out = model.generate(**batch, generation_config=generation)
        tensors[f"{name}/tokens"] = out[:, batch["input_ids"].shape[1] :].contiguous()
    try:
        processor = AutoProcessor.from_pretrained(case["dir"])
    except Exception as err:  # no torchvision: the stock Qwen/SmolVLM processors need it
        report["processor"] = f"{type(err).__name__}: {err}"
        return report
    report["processor"] = "loaded"
    if case.get("prompt"):
        built = prompt(processor, case["prompt"], Image.open(case["image"]).convert("RGB"))
        report["same_prompt"] = torch.equal(built["input_ids"], batch["input_ids"])
    for row in case.get("rows", []):
        inputs = prompt(processor, row["question"], Image.open(row["image"]).convert("RGB"))
        with torch.no_grad():
            out = model.generate(**inputs, generation_config=generation)
        new = out[:, inputs["input_ids"].shape[1] :]
        report["answers"].append(processor.batch_decode(new, skip_special_tokens=True)[0].strip())
    return report


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    tensors: dict[str, torch.Tensor] = {}
    report = {case["name"]: run(case, tensors) for case in spec["cases"]}
    report["medvqa imported"] = any(m.split(".")[0] == "medvqa" for m in sys.modules)
    if tensors:
        save_file(tensors, spec["tensors"])
    Path(spec["report"]).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main(sys.argv[1])
