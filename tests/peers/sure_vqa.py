# Code copied from SURE-VQA keeps its own idioms:
# ruff: noqa: B007, RUF015, SIM102, UP032
"""SURE-VQA's own writer and closed-accuracy scorer, for known-answer tests of `medvqa-score`.

Copied (lightly trimmed where marked) from github.com/IML-DKFZ/sure-vqa at commit
417e8868198a3dec333c7730d04a5753b08f4d34, so a `test_results.json` built here has the types
and spellings their inference writes (raw SLAKE answers such as "Yes", integer qids, the yes/no
prompt suffix) and `get_accuracy` is the number their evaluation reports.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader, Dataset

DEFAULT_IMAGE_TOKEN = "<image>"  # llava.constants, imported by their datamodule.py


def convert_raw_to_final(df: pd.DataFrame, save_path: Path, no_image: bool = False) -> None:
    """med_vlm_robustness/datamodule.py `convert_raw_to_final` (the split file their loader reads)."""
    final_data = []

    # Process each entry as a separate conversation
    for _, row in df.iterrows():
        qid = row["qid"]
        new_entry = {
            "id": str(qid),
            "image": "imgs/" + row["img_name"],
            "conversations": [
                {
                    "from": "human",
                    "value": f"{DEFAULT_IMAGE_TOKEN}\n{row['question']}"
                    if not no_image
                    else row["question"],
                },
                {"from": "gpt", "value": row["answer"]},
            ],
            "img_id": row["img_id"],
            "language": row["q_lang"],
            "location": row["location"],
            "modality": row["modality"],
            "answer_type": row["answer_type"],
            "base_type": row["base_type"],
            "content_type": row["content_type"],
        }
        final_data.append(new_entry)

    with open(str(save_path), "w") as output_file:
        json.dump(final_data, output_file, indent=4)


class SlakeDataset(Dataset):
    """med_vlm_robustness/dataset.py `SlakeDataset`; trimmed: no image is read (cv2.imread)."""

    def __init__(self, dataset_path: Path, json: pd.DataFrame) -> None:
        self.dataset_path = dataset_path
        self.json = json.reset_index(drop=True)
        self.ids = self.json["id"].to_list()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, Any]:
        row = self.json.iloc[index]
        image = 0  # trimmed: cv2.imread(str(self.dataset_path / row.image))
        # We assume that there is always only one q/a turn in the conversation
        question = [i["value"] for i in row.conversations if i["from"] == "human"][0]
        answer = [i["value"] for i in row.conversations if i["from"] == "gpt"][0]
        answer_type = row.answer_type
        if answer_type == "CLOSED":  # their nesting; their TODO comments trimmed
            if answer in ["Yes", "No", "yes", "no"]:
                question += " Please choose from the following two options: [yes, no]."
        batch = {
            "image": image,
            "question": question,
            "gt": answer,
            "qid": row.id,
            "answer_type": answer_type,
            "img_name": row.image,
        }
        return batch


def write_test_results(raw: pd.DataFrame, preds: dict[int, str], out_dir: Path) -> Path:
    """test_results.json for SLAKE-style raw rows and the model's output per qid.

    The path their inference takes: raw rows -> split file (`convert_raw_to_final`) ->
    `pd.read_json` (which types the string ids as integers) -> `SlakeDataset` -> DataLoader with
    batch_size 1 (inference_defaults.yaml) -> `SLAKE_Model.test_step`'s record ->
    `on_test_end`'s dump (med_vlm_robustness/model.py).
    """
    split_file = out_dir / "slake_test.json"
    convert_raw_to_final(raw, split_file)
    dataset = SlakeDataset(out_dir, pd.read_json(split_file))
    test_results = []
    for batch in DataLoader(dataset, batch_size=1, shuffle=False):
        outputs = preds[int(batch["qid"][0])].strip()  # model.py: `outputs = outputs.strip()`
        # model.py `test_step`, verbatim:
        test_results.append(
            {
                "qid": batch["qid"][0].item(),
                "question": batch["question"][0],
                "gt": batch["gt"][0],
                "pred": outputs,
                "answer_type": batch["answer_type"][0],
                "img_name": batch["img_name"][0],
            }
        )
    output_file = out_dir / "test_results.json"
    with open(output_file, "w") as json_file:  # model.py `on_test_end`
        json.dump(test_results, json_file, indent=2)
    assert isinstance(test_results[0]["qid"], int) and torch.is_tensor(batch["qid"])
    return output_file


# med_vlm_robustness/eval/eval_metrics.py `get_accuracy`, verbatim (run_eval.py calls it on the
# CLOSED rows of `pd.read_json(test_results.json)` with the data set's `list_categories`).
# fmt: off
def get_accuracy(eval_data, data_categories):
    num_categories = []
    results = [{
            'avg_accuracy': 0.,
            'avg_num_categories': 0.,
    }]
    for i, line in eval_data.iterrows():
        qid = line['qid']
        gt = line['gt']
        pred = line['pred']
        answer_type = line['answer_type']
        categories = data_categories[data_categories['qid'] == qid]['list_categories'].iloc[0]
        if answer_type == 'CLOSED':
            patterns_gt = []
            patterns_pred = []
            for category in categories:
                pattern = r'\b(?:{})\b(?:\s|$|,|.)'.format(category)
                if len(re.findall(pattern, gt, re.IGNORECASE)) > 0:
                    patterns_gt.append(pattern)
                if len(re.findall(pattern, pred, re.IGNORECASE)) > 0:
                    patterns_pred.append(pattern)
            if len(patterns_gt) != 1:
                print("Ground truth is ambiguous or none of the categories is in it!")
                print("Question ID: ", qid, "| Ground truth: ", gt, "| Categories: ", ", ".join(categories),
                      "| Num matches: ", len(patterns_gt))
                line['accuracy'] = np.nan
            elif len(patterns_pred) != 1:
                print("Prediction is ambiguous or none of the categories is in it!")
                print("Question ID: ", qid, "| Prediction: ", pred, "| Categories: ", ", ".join(categories),
                      "| Num matches: ", len(patterns_gt))
                line['accuracy'] = 0
                num_categories.append(len(categories))
            elif patterns_gt[0] == patterns_pred[0]:
                line['accuracy'] = 1
                num_categories.append(len(categories))
            else:
                line['accuracy'] = 0
                num_categories.append(len(categories))
            results.append(line.to_dict())
    results[0]['avg_accuracy'] = np.nanmean(np.array([x["accuracy"] for x in results if "accuracy" in x]))
    results[0]['avg_num_categories'] = np.nanmean(np.array(num_categories))
    return results
# fmt: on
