# Code copied from SURE-VQA keeps its own idioms:
# ruff: noqa: B007, E711, RUF015, SIM102, UP032, W605
"""SURE-VQA's own writer and closed-accuracy scorer, for known-answer tests of `medvqa-score`.

Copied (lightly trimmed where marked) from github.com/IML-DKFZ/sure-vqa at commit
417e8868198a3dec333c7730d04a5753b08f4d34, so a `test_results.json` built here has the types
and spellings their inference writes (raw SLAKE answers such as "Yes", integer qids, the yes/no
prompt suffix) and `get_accuracy` is the number their evaluation reports. Their open scorer
(`calculate_f1score` with `normalize_word` and its glossary, `split_sentence`) is at the end.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
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


# -- med_vlm_robustness/eval/glossary.py (whole) ---------------------------------------------

contractions = {
    "aint": "ain't",
    "arent": "aren't",
    "cant": "can't",
    "couldve": "could've",
    "couldnt": "couldn't",
    "couldn'tve": "couldn't've",
    "couldnt've": "couldn't've",
    "didnt": "didn't",
    "doesnt": "doesn't",
    "dont": "don't",
    "hadnt": "hadn't",
    "hadnt've": "hadn't've",
    "hadn'tve": "hadn't've",
    "hasnt": "hasn't",
    "havent": "haven't",
    "hed": "he'd",
    "hed've": "he'd've",
    "he'dve": "he'd've",
    "hes": "he's",
    "howd": "how'd",
    "howll": "how'll",
    "hows": "how's",
    "Id've": "I'd've",
    "I'dve": "I'd've",
    "Im": "I'm",
    "Ive": "I've",
    "isnt": "isn't",
    "itd": "it'd",
    "itd've": "it'd've",
    "it'dve": "it'd've",
    "itll": "it'll",
    "let's": "let's",
    "maam": "ma'am",
    "mightnt": "mightn't",
    "mightnt've": "mightn't've",
    "mightn'tve": "mightn't've",
    "mightve": "might've",
    "mustnt": "mustn't",
    "mustve": "must've",
    "neednt": "needn't",
    "notve": "not've",
    "oclock": "o'clock",
    "oughtnt": "oughtn't",
    "ow's'at": "'ow's'at",
    "'ows'at": "'ow's'at",
    "'ow'sat": "'ow's'at",
    "shant": "shan't",
    "shed've": "she'd've",
    "she'dve": "she'd've",
    "she's": "she's",
    "shouldve": "should've",
    "shouldnt": "shouldn't",
    "shouldnt've": "shouldn't've",
    "shouldn'tve": "shouldn't've",
    "somebody'd": "somebodyd",
    "somebodyd've": "somebody'd've",
    "somebody'dve": "somebody'd've",
    "somebodyll": "somebody'll",
    "somebodys": "somebody's",
    "someoned": "someone'd",
    "someoned've": "someone'd've",
    "someone'dve": "someone'd've",
    "someonell": "someone'll",
    "someones": "someone's",
    "somethingd": "something'd",
    "somethingd've": "something'd've",
    "something'dve": "something'd've",
    "somethingll": "something'll",
    "thats": "that's",
    "thered": "there'd",
    "thered've": "there'd've",
    "there'dve": "there'd've",
    "therere": "there're",
    "theres": "there's",
    "theyd": "they'd",
    "theyd've": "they'd've",
    "they'dve": "they'd've",
    "theyll": "they'll",
    "theyre": "they're",
    "theyve": "they've",
    "twas": "'twas",
    "wasnt": "wasn't",
    "wed've": "we'd've",
    "we'dve": "we'd've",
    "weve": "we've",
    "werent": "weren't",
    "whatll": "what'll",
    "whatre": "what're",
    "whats": "what's",
    "whatve": "what've",
    "whens": "when's",
    "whered": "where'd",
    "wheres": "where's",
    "whereve": "where've",
    "whod": "who'd",
    "whod've": "who'd've",
    "who'dve": "who'd've",
    "wholl": "who'll",
    "whos": "who's",
    "whove": "who've",
    "whyll": "why'll",
    "whyre": "why're",
    "whys": "why's",
    "wont": "won't",
    "wouldve": "would've",
    "wouldnt": "wouldn't",
    "wouldnt've": "wouldn't've",
    "wouldn'tve": "wouldn't've",
    "yall": "y'all",
    "yall'll": "y'all'll",
    "y'allll": "y'all'll",
    "yall'd've": "y'all'd've",
    "y'alld've": "y'all'd've",
    "y'all'dve": "y'all'd've",
    "youd": "you'd",
    "youd've": "you'd've",
    "you'dve": "you'd've",
    "youll": "you'll",
    "youre": "you're",
    "youve": "you've",
}

manual_map = {
    "none": "0",
    "zero": "0",
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
    "ten": "10",
}
articles = ["a", "an", "the"]
period_strip = re.compile("(?!<=\d)(\.)(?!\d)")
comma_strip = re.compile("(\d)(\,)(\d)")
punct = [
    ";",
    r"/",
    "[",
    "]",
    '"',
    "{",
    "}",
    "(",
    ")",
    "=",
    "+",
    "\\",
    "_",
    "-",
    ">",
    "<",
    "@",
    "`",
    ",",
    "?",
    "!",
]


def normalize_word(token):
    _token = token
    for p in punct:
        if (p + " " in token or " " + p in token) or (re.search(comma_strip, token) != None):
            _token = _token.replace(p, "")
        else:
            _token = _token.replace(p, " ")
    token = period_strip.sub("", _token, re.UNICODE)

    _token = []
    temp = token.lower().split()
    for word in temp:
        word = manual_map.setdefault(word, word)
        if word not in articles:
            _token.append(word)
    for i, word in enumerate(_token):
        if word in contractions:
            _token[i] = contractions[word]
    token = " ".join(_token)
    token = token.replace(",", "")
    return token


# -- med_vlm_robustness/eval/utils.py ------------------------------------------------------


def split_sentence(sentence, n):
    words = defaultdict(int)
    # tmp_sentence = re.sub("[^a-zA-Z ]", "", sentence)
    tmp_sentence = sentence
    tmp_sentence = tmp_sentence.lower()
    tmp_sentence = tmp_sentence.strip().split()
    length = len(tmp_sentence)
    for i in range(length - n + 1):
        tmp_words = " ".join(tmp_sentence[i : i + n])
        if tmp_words:
            words[tmp_words] += 1
    return words


# -- med_vlm_robustness/eval/eval_metrics.py -----------------------------------------------


# F1
def calculate_f1score(candidate, reference):
    candidate = normalize_word(candidate)
    reference = normalize_word(reference)

    candidate_words = split_sentence(candidate, 1)
    reference_words = split_sentence(reference, 1)
    word_set = set()
    for word in candidate_words:
        word_set.add(word)
    for word in reference_words:
        word_set.add(word)

    tp = 0
    fp = 0
    fn = 0
    for word in word_set:
        if word in candidate_words and word in reference_words:
            tp += candidate_words[word]
        elif word in candidate_words and word not in reference_words:
            fp += candidate_words[word]
        elif word not in candidate_words and word in reference_words:
            fn += reference_words[word]

    if len(candidate_words) == 0:
        return 0, 0, 0  # "0 (warning: length of candidate's words is 0)"
    elif len(reference_words) == 0:
        return 0, 0, 0
    else:
        precision = tp / (tp + fp)
        recall = tp / (tp + fn)
        if tp == 0:
            return 0, 0, 0
        else:
            return 2 * precision * recall / (precision + recall), precision, recall
