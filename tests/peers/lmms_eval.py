# Code copied from lmms-eval keeps its own idioms:
# ruff: noqa: SIM101, SIM114, UP006, UP035
"""lmms-eval's own per-sample log writer (`--log_samples`), for tests of `medvqa-score`.

Copied (trimmed where marked) from github.com/EvolvingLMMs-Lab/lmms-eval:
- the sample dict: `lmms_eval/evaluator.py` (`example = {...}; example.update(metrics)`) at
  v0.3.5 (f7a6d6bf6b1622e08ebf5336a48f98e69d503ea6), v0.4 (b7b4b1d9163c7e6cbc131cc11eca2695a018a032;
  v0.6 6f312287065370897d55d14d85239dd383552af6 builds it the same way) and HEAD
  (75571cfe0fa36ca5ec2e6aa2bb268f9d38295af3);
- its serialisation: `lmms_eval/loggers/evaluation_tracker.py` `save_results_samples` at the same
  commits. v0.4 and later pop `doc` and `arguments`; v0.7+ (HEAD) also unwraps a one-request
  `filtered_resps` list to its string;
- the per-sample metric dicts: `lmms_eval/tasks/slake/utils.py` `slake_process_results` at HEAD
  (the only medical VQA task in lmms-eval; its `_default_template_yaml` gives the post prompt).
  The same task code is used for every version, so the files differ only in what the writer keeps.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List

import numpy as np

VERSIONS = ("v0.3.5", "v0.4", "head")

# lmms_eval/tasks/slake/_default_template_yaml
GENERATION_KWARGS = {"max_new_tokens": 32, "temperature": 0, "do_sample": False}
LMMS_EVAL_SPECIFIC_KWARGS = {
    "pre_prompt": "",
    "post_prompt": "\nAnswer the question using a single word or phrase.",
}

# -- lmms_eval/tasks/slake/utils.py (HEAD) ------------------------------------------------------

EN_YES = {"yes", "yeah", "yep", "true"}
EN_NO = {"no", "nope", "false"}
ZH_YES = {"是", "是的", "有", "包含", "可以", "能", "会", "正常"}
ZH_NO = {"否", "不是", "没有", "无", "不包含", "不能", "不会", "不可以", "不正常", "异常"}
ZH_PUNCTUATION = (
    "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～、，。；：《》？【】（）"
)
# trimmed: 3 of the 16 metrics (each gets the same record)
SLAKE_METRICS = ("slake_accuracy", "slake_open_accuracy", "slake_closed_accuracy")


def slake_doc_to_text(doc: Dict[str, Any], lmms_eval_specific_kwargs=None) -> str:
    """Build the text prompt for a SLAKE question."""
    if lmms_eval_specific_kwargs is None:
        lmms_eval_specific_kwargs = {}
    pre_prompt = lmms_eval_specific_kwargs.get("pre_prompt", "")
    post_prompt = lmms_eval_specific_kwargs.get("post_prompt", "")
    return f"{pre_prompt}{doc['question'].strip()}{post_prompt}"


def slake_process_results(doc: Dict[str, Any], results: List[str]) -> Dict[str, Dict[str, Any]]:
    """Normalize a generated answer and return per-sample SLAKE metric records."""
    prediction = results[0] if results else ""
    target = doc["answer"]
    pred_norm = normalize_answer(prediction)
    target_norm = normalize_answer(target)
    is_correct = pred_norm == target_norm
    record = {
        "id": str(doc.get("qid") or doc.get("id") or ""),
        "prediction": prediction,
        "prediction_normalized": pred_norm,
        "target": target,
        "target_normalized": target_norm,
        "language": _normalize_language(doc.get("q_lang")),
        "answer_type": _normalize_answer_type(doc.get("answer_type")),
        "modality": _normalize_group_value(doc.get("modality")),
        "content_type": _normalize_group_value(doc.get("content_type")),
        "is_correct": is_correct,
    }
    return {metric: record for metric in SLAKE_METRICS}


def normalize_answer(answer: Any) -> str:
    """Normalize English and Chinese short answers for exact-match scoring."""
    text = "" if answer is None else str(answer)
    text = text.strip().lower()
    text = re.sub(r"\([^)]*\)", " ", text)
    text = re.sub(r"（[^）]*）", " ", text)
    punctuation_table = str.maketrans({char: " " for char in string.punctuation + ZH_PUNCTUATION})
    text = text.translate(punctuation_table)
    text = re.sub(r"\s+", " ", text).strip()
    text = _normalize_medical_aliases(text)
    text = _normalize_yes_no(text)
    return text


def _normalize_yes_no(text: str) -> str:
    if text in EN_YES or text in ZH_YES:
        return "yes"
    if text in EN_NO or text in ZH_NO:
        return "no"
    return text


def _normalize_medical_aliases(text: str) -> str:
    if text in {"x ray", "xray"}:
        return "xray"
    return text


def _normalize_language(value: Any) -> str:
    return str(value or "").strip().lower()


def _normalize_answer_type(value: Any) -> str:
    return str(value or "").strip().lower()


def _normalize_group_value(value: Any) -> str:
    return str(value or "").strip().lower()


# -- lmms_eval/utils.py and lmms_eval/api/instance.py -------------------------------------------


def hash_string(string: str) -> str:
    return hashlib.sha256(string.encode("utf-8")).hexdigest()


def handle_non_serializable(o):
    if isinstance(o, np.int64) or isinstance(o, np.int32):
        return int(o)
    elif isinstance(o, set):
        return list(o)
    else:
        return str(o)


def sanitize_list(sub):
    """
    Takes possible nested list and recursively converts all inner component to strings
    """
    if isinstance(sub, list):
        return [sanitize_list(item) for item in sub]
    if isinstance(sub, tuple):
        return tuple(sanitize_list(item) for item in sub)
    else:
        return str(sub)


@dataclass
class Instance:
    """trimmed: the fields the sample writer reads."""

    arguments: tuple
    resps: list = field(default_factory=list)
    filtered_resps: dict = field(default_factory=dict)
    raw_filtered_resps: dict = field(default_factory=dict)
    doc: dict = None

    @property
    def args(self):
        return self.arguments if isinstance(self.arguments, tuple) else (self.arguments,)


def doc_to_visual(doc: Dict[str, Any]) -> list:  # not serialisable, so not logged
    return []


# -- lmms_eval/evaluator.py: one logged sample --------------------------------------------------


def build_example(version: str, doc_id: int, doc: Dict[str, Any], prediction: str) -> dict:
    """The sample dict `evaluate` appends to `logged_samples` for a generate_until request."""
    filter_key = "none"
    ctx = slake_doc_to_text(doc, LMMS_EVAL_SPECIFIC_KWARGS)  # zero-shot fewshot_context
    # lmms_eval/api/task.py construct_requests (generate_until, doc_to_text)
    arguments = (ctx, copy.deepcopy(GENERATION_KWARGS), doc_to_visual, doc_id, "slake_en", "test")
    req = Instance(arguments, resps=[prediction], filtered_resps={filter_key: prediction}, doc=doc)
    requests = [req]
    metrics = slake_process_results(doc, [req.filtered_resps[filter_key] for req in requests])
    target = doc["answer"]  # task.doc_to_target(doc): doc_to_target: "answer"
    saved_doc = {}
    for key, value in doc.items():
        if "image" not in key:  # v0.3.5; HEAD: not is_multimodal_content(value)
            saved_doc[key] = value
    filtered_arguments = []
    for req in requests:
        for value in req.args:
            if isinstance(value, (str, int, float, bool, list, dict, type(None))):
                filtered_arguments.append(value)
    doc_hash = hash_string(
        json.dumps(
            requests[0].doc,
            indent=2,
            default=handle_non_serializable,
            ensure_ascii=False,
        )
    )
    if version == "v0.3.5":
        example = {
            "doc_id": doc_id,
            "doc": saved_doc,
            "target": target,
            "arguments": filtered_arguments,
            "resps": [req.resps for req in requests],
            "filtered_resps": [req.filtered_resps[filter_key] for req in requests],
            "doc_hash": doc_hash,
            "prompt_hash": hash_string(requests[0].arguments[0]),
            "target_hash": hash_string(str(target)),
        }
    elif version == "v0.4":
        example = {
            "doc_id": doc_id,
            "doc": saved_doc,
            "target": target,
            "arguments": filtered_arguments,
            "resps": [req.resps for req in requests],
            "filtered_resps": [req.filtered_resps[filter_key] for req in requests],
            "doc_hash": doc_hash,
            # Removing prompt hash and target hash here
        }
    else:
        per_sample_tc = [None]  # trimmed: no token counts without a model
        example = {
            "doc_id": doc_id,
            "doc": saved_doc,
            "target": target,
            "arguments": filtered_arguments,
            "resps": [req.raw_filtered_resps.get(filter_key, req.resps) for req in requests],
            "filtered_resps": [req.filtered_resps[filter_key] for req in requests],
            "token_counts": per_sample_tc,
            "doc_hash": doc_hash,
        }
    example.update(metrics)
    return example


# -- lmms_eval/loggers/evaluation_tracker.py save_results_samples ---------------------------------


def save_results_samples(version: str, samples: list, file_results_samples: Path) -> None:
    """One JSON line per sample, sanitised as each version's tracker does."""
    for sample in samples:
        if version == "v0.3.5":
            arguments = {}
            for key, value in enumerate(sample["arguments"][1]):  # update metadata into args
                arguments[key] = value

            sample["input"] = sample["arguments"][0]
            sample["resps"] = sanitize_list(sample["resps"])
            sample["filtered_resps"] = sanitize_list(sample["filtered_resps"])
            sample["arguments"] = arguments
            sample["target"] = str(sample["target"])
        elif version == "v0.4":
            sample["input"] = sample["arguments"][0]
            sample["resps"] = sanitize_list(sample["resps"])
            sample["filtered_resps"] = sanitize_list(sample["filtered_resps"])
            if (
                sample["filtered_resps"] == sample["resps"][0]
                or sample["filtered_resps"] == sample["resps"]
            ):
                sample.pop("resps")
            sample["target"] = str(sample["target"])
            sample.pop("arguments")
            sample.pop("doc")
        else:
            sample["input"] = sample["arguments"][0]
            sample["resps"] = sanitize_list(sample["resps"])
            sample["filtered_resps"] = sanitize_list(sample["filtered_resps"])
            if isinstance(sample["resps"], list) and len(sample["resps"]) == 1:
                sample["resps"] = sample["resps"][0]
            if isinstance(sample["filtered_resps"], list) and len(sample["filtered_resps"]) == 1:
                sample["filtered_resps"] = sample["filtered_resps"][0]

            if sample["resps"] == sample["filtered_resps"]:
                sample.pop("resps")
            elif (
                isinstance(sample["resps"], list)
                and len(sample["resps"]) == 1
                and sample["resps"][0] == sample["filtered_resps"]
            ):
                sample.pop("resps")
            sample["target"] = str(sample["target"])
            sample.pop("arguments")
            sample.pop("doc")

        sample_dump = (
            json.dumps(
                sample,
                default=handle_non_serializable,
                ensure_ascii=False,
            )
            + "\n"
        )

        with open(file_results_samples, "a", encoding="utf-8") as f:
            f.write(sample_dump)


def write_samples(
    version: str, docs: List[Dict[str, Any]], predictions: Dict[Any, str], out_dir: Path
) -> Path:
    """`{date_id}_samples_slake_en.jsonl` as `version` writes it for SLAKE rows (HF `BoKelvin/SLAKE`
    columns) and a prediction per qid; `slake_process_docs` adds the `id` column first."""
    if version not in VERSIONS:
        raise ValueError(f"version {version!r}: choose from {VERSIONS}")
    path = Path(out_dir) / f"20250101_000000_samples_slake_en_{version}.jsonl"
    samples = []
    for doc_id, doc in enumerate(docs):
        doc = {**doc, "id": str(doc.get("qid") or f"slake_{doc_id}")}
        samples.append(build_example(version, doc_id, doc, predictions[doc["qid"]]))
    save_results_samples(version, samples, path)
    return path
