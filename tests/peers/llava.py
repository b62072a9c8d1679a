# Code copied from LLaVA keeps its own idioms:
# ruff: noqa: B007, E722, F841, SIM115, UP015
"""LLaVA's and LLaVA-Med's `model_vqa.py` answer writers, for tests of `medvqa-score --questions`.

Copied (trimmed where marked: no model, tokenizer or image; the reply is given) from
- github.com/haotian-liu/LLaVA `llava/eval/model_vqa.py` at commit
  c121f0432da27facab705978f83c4ada465e46fd, identical in its question reading and answer writing
  to github.com/microsoft/LLaVA-Med `llava/eval/model_vqa.py` at commit
  d406e3fc7c3d1e4c797a7676de18cbfd070b6d2c (v1.5): a question JSONL of
  `{question_id, image, text, ...}` in, `{question_id, prompt, text, answer_id, model_id,
  metadata}` out;
- github.com/microsoft/LLaVA-Med `llava/eval/model_vqa_med.py` at v1.0.0
  (b9a98a736d2ef05bcf5ff345be6403fb3a664eaf), which reads a JSON list in LLaVA's conversation
  format (`{id, image, conversations: [human, gpt], answer_type}`, the VQA-RAD/SLAKE/PathVQA
  `test.json` its `run_eval.py` scores against) and writes the same answer records.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from pathlib import Path

DEFAULT_IMAGE_TOKEN = "<image>"  # llava.constants


class shortuuid:  # stands in for the shortuuid package
    @staticmethod
    def uuid() -> str:
        return uuid.uuid4().hex[:22]


# fmt: off
def split_list(lst, n):
    """Split a list into n (roughly) equal-sized chunks"""
    chunk_size = math.ceil(len(lst) / n)  # integer division
    return [lst[i:i+chunk_size] for i in range(0, len(lst), chunk_size)]


def get_chunk(lst, n, k):
    chunks = split_list(lst, n)
    return chunks[k]
# fmt: on


def model_vqa(
    question_file: Path,
    answers_file: Path,
    replies: dict[object, str],
    model_name: str = "llava-med-v1.5-mistral-7b",
    num_chunks: int = 1,
    chunk_idx: int = 0,
) -> Path:
    """`eval_model` of llava/eval/model_vqa.py; `outputs` is the given reply to the question."""
    # fmt: off
    questions = [json.loads(q) for q in open(os.path.expanduser(question_file), "r")]
    questions = get_chunk(questions, num_chunks, chunk_idx)
    answers_file = os.path.expanduser(answers_file)
    os.makedirs(os.path.dirname(answers_file), exist_ok=True)
    ans_file = open(answers_file, "w")
    for line in questions:
        idx = line["question_id"]
        image_file = line["image"]  # trimmed: the image is not read
        qs = line["text"]
        cur_prompt = qs
        # trimmed: the conversation template, tokenizer, image processing and model.generate
        outputs = replies[idx].strip()

        ans_id = shortuuid.uuid()
        ans_file.write(json.dumps({"question_id": idx,
                                   "prompt": cur_prompt,
                                   "text": outputs,
                                   "answer_id": ans_id,
                                   "model_id": model_name,
                                   "metadata": {}}) + "\n")
        ans_file.flush()
    ans_file.close()
    # fmt: on
    return Path(answers_file)


def model_vqa_med_v1(
    question_file: Path,
    answers_file: Path,
    replies: dict[object, str],
    model_name: str = "llava-med-7b-vqa_rad",
) -> Path:
    """`eval_model` of LLaVA-Med v1.0's llava/eval/model_vqa_med.py (conversation-format
    question file; an image is always there, so `cur_prompt` gets the image token)."""
    # fmt: off
    questions = json.load(open(os.path.expanduser(question_file), "r"))
    questions = get_chunk(questions, 1, 0)
    answers_file = os.path.expanduser(answers_file)
    os.makedirs(os.path.dirname(answers_file), exist_ok=True)
    ans_file = open(answers_file, "w")
    for i, line in enumerate(questions):
        idx = line["id"]
        # question = line['conversations'][0]
        # gt_ans = line["conversations"][1]

        try:
            question = line["conversations"][0] # ['value'].split('\n')[0]
            gt_ans = line["conversations"][1] # ['value']
        except:
            question = line["conversatons"][0] # ['value'].split('\n')[0]
            gt_ans = line["conversatons"][1] # ['value']

        qs = question['value']

        qs = qs.replace('<image>', '').strip()
        cur_prompt = qs

        if 'image' in line:
            # trimmed: the image is not read or processed
            cur_prompt = cur_prompt + '\n' + '<image>'
        outputs = replies[idx].strip()  # trimmed: the conversation template and model.generate

        ans_id = shortuuid.uuid()
        ans_file.write(json.dumps({"question_id": idx,
                                   "prompt": cur_prompt,
                                   "text": outputs,
                                   "answer_id": ans_id,
                                   "model_id": model_name,
                                   "metadata": {}}) + "\n")
        ans_file.flush()
    ans_file.close()
    # fmt: on
    return Path(answers_file)


def med_v1_test_json(path: Path, rows: list[tuple[object, str, str, str]]) -> Path:
    """LLaVA-Med v1.0's conversation-format `test.json` (what `model_vqa_med_v1` reads and
    run_eval.py scores against) for rows of (id, question, answer, answer_type); not copied
    code: the layout of the released VQA-RAD/SLAKE/PathVQA files."""
    test_json = [
        {
            "id": qid,
            "image": f"synpic{qid}.jpg",
            "conversations": [
                {"from": "human", "value": f"<image>\n{question}"},
                {"from": "gpt", "value": answer},
            ],
            "answer_type": answer_type,
        }
        for qid, question, answer, answer_type in rows
    ]
    Path(path).write_text(json.dumps(test_json))
    return Path(path)
