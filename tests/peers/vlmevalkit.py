# Code copied from VLMEvalKit keeps its own idioms:
# ruff: noqa: B905, SIM115
"""VLMEvalKit's own prediction-file writer and exact-matching MCQ scorer, for `medvqa-score`.

Copied (trimmed where marked) from github.com/open-compass/VLMEvalKit at commit
e8e78f05f3080fe28154f2130321f17951c3be94:
- `vlmeval/smp/file.py`: `NumpyEncoder`, `dump` (its `dump_tsv`, `dump_xlsx`, `dump_json`, ...),
  `load` (the loaders used: `load_tsv`), `get_pred_file_format`, `get_pred_file_path`;
- `vlmeval/smp/misc.py`: `istype`, `toliststr`;
- `vlmeval/dataset/image_base.py`: `ImageBaseDataset.__init__`'s typing of the dataset TSV;
- `vlmeval/inference.py`: `infer_data_job`'s rank-0 writing of the prediction file;
- `vlmeval/utils/matching_util.py`: `can_infer_option`, `can_infer_text`, `can_infer`;
- `vlmeval/dataset/utils/multiple_choice.py`: `build_choices`, `prefetch_answer`,
  `extract_answer_from_item`,
  `eval_vanilla` and the `hit` of `mcq_vanilla_eval`, the number VLMEvalKit reports for an MCQ
  dataset under `exact_matching` (no judge model: an answer `can_infer` cannot read is wrong).

So a fixture has what a real `{model}_{dataset}.xlsx/.tsv/.json` has: the dataset TSV's rows as
`pd.read_csv` types them (NaN for a missing option or hint, an int `index`), the `prediction`
column as `str(...)` of the reply, and no `image` column.
"""

from __future__ import annotations

import copy as cp
import csv
import json
import logging
import os
import os.path as osp
import pickle
import re
import string
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

logger = logging.getLogger(__name__)  # vlmeval.smp.log.get_logger(__name__)


# -- vlmeval/smp/misc.py ------------------------------------------------------------------------
# fmt: off
def istype(s, type):
    if isinstance(s, type):
        return True
    try:
        return isinstance(eval(s), type)
    except Exception:
        return False


def toliststr(s):
    if isinstance(s, str) and len(s) > 1 and (s[0] == '[') and (s[-1] == ']'):
        return [str(x) for x in eval(s)]
    elif isinstance(s, str):
        return [s]
    elif isinstance(s, list):
        return [str(x) for x in s]
    raise NotImplementedError
# fmt: on


# -- vlmeval/smp/file.py ------------------------------------------------------------------------
# fmt: off
class NumpyEncoder(json.JSONEncoder):
    # np.float_ / np.complex_ are gone in NumPy 2; unreached here: the fixtures' records hold
    # Python scalars (DataFrame.to_dict), which json encodes itself.
    def default(self, obj):
        if isinstance(obj,
                      (np.int_, np.intc, np.intp, np.int8, np.int16, np.int32, np.int64,
                       np.uint8, np.uint16, np.uint32, np.uint64)):
            return int(obj)
        elif isinstance(obj, (np.float_, np.float16, np.float32, np.float64)):
            return float(obj)
        elif isinstance(obj, (np.complex_, np.complex64, np.complex128)):
            return {'real': obj.real, 'imag': obj.imag}
        elif isinstance(obj, (np.ndarray,)):
            return obj.tolist()
        elif isinstance(obj, (np.bool_)):
            return bool(obj)
        elif isinstance(obj, (np.void)):
            return None
        return json.JSONEncoder.default(self, obj)


def dump(data, f, **kwargs):
    def dump_pkl(data, pth, **kwargs):
        pickle.dump(data, open(pth, 'wb'))

    def dump_json(data, pth, **kwargs):
        # 处理 DataFrame 对象
        if isinstance(data, pd.DataFrame):
            # 转换为 records 格式（列表格式）
            data = data.to_dict('records')
        json.dump(data, open(pth, 'w'), indent=4, ensure_ascii=False, cls=NumpyEncoder)

    def dump_jsonl(data, f, **kwargs):
        lines = [json.dumps(x, ensure_ascii=False, cls=NumpyEncoder) for x in data]
        with open(f, 'w', encoding='utf8') as fout:
            fout.write('\n'.join(lines))

    def dump_xlsx(data, f, **kwargs):
        with pd.ExcelWriter(
            f,
            engine='xlsxwriter',
            engine_kwargs={'options': {'strings_to_formulas': False}},
        ) as writer:
            data.to_excel(writer, index=False)

    def dump_csv(data, f, quoting=csv.QUOTE_ALL):
        data.to_csv(f, index=False, encoding='utf-8', quoting=quoting)

    def dump_tsv(data, f, quoting=csv.QUOTE_ALL):
        data.to_csv(f, sep='\t', index=False, encoding='utf-8', quoting=quoting)

    handlers = dict(pkl=dump_pkl, json=dump_json, jsonl=dump_jsonl, xlsx=dump_xlsx, csv=dump_csv, tsv=dump_tsv)
    suffix = f.split('.')[-1]
    try:
        return handlers[suffix](data, f, **kwargs)
    except Exception:
        # if dump failed, fallback to pkl format
        pkl_file = f.rsplit('.', 1)[0] + '.pkl'
        logger.warning(f'Failed to dump to {suffix} format, falling back to pkl: {pkl_file}')
        return dump_pkl(data, pkl_file, **kwargs)


def load(f, fmt=None):
    # trimmed: load_pkl, load_json, load_jsonl, load_xlsx, load_csv and the URL download
    def load_tsv(f):
        return pd.read_csv(f, sep='\t')

    handlers = dict(tsv=load_tsv)
    if fmt is not None:
        return handlers[fmt](f)

    suffix = f.split('.')[-1]
    return handlers[suffix](f)


def get_pred_file_format():
    pred_format = os.getenv('PRED_FORMAT', '').lower()
    if pred_format == '':
        return 'xlsx'  # default format
    else:
        assert pred_format in ['tsv', 'xlsx', 'json'], f'Unsupported PRED_FORMAT {pred_format}'
        return pred_format


def get_pred_file_path(work_dir, model_name, dataset_name, use_env_format=True):
    if use_env_format:
        file_format = get_pred_file_format()
        if file_format == 'xlsx':
            return osp.join(work_dir, f'{model_name}_{dataset_name}.xlsx')
        elif file_format == 'tsv':
            return osp.join(work_dir, f'{model_name}_{dataset_name}.tsv')
        elif file_format == 'json':
            return osp.join(work_dir, f'{model_name}_{dataset_name}.json')
    else:
        # default
        return osp.join(work_dir, f'{model_name}_{dataset_name}.xlsx')
# fmt: on


# -- vlmeval/dataset/image_base.py: ImageBaseDataset.__init__ (trimmed to the data's typing) -----
# fmt: off
def dataset_data(dataset_tsv: str, skip_noimg=True):
    data = load(dataset_tsv)  # self.load_data(dataset) -> prepare_tsv -> load(data_path)
    if skip_noimg and 'image' in data:
        data = data[~pd.isna(data['image'])]

    data['index'] = [str(x) for x in data['index']]

    # The image field can store the base64 encoded image or another question index (for saving space)
    if 'image' in data:
        data['image'] = [str(x) if not pd.isna(x) else '' for x in data['image']]
        image_map = {x: y for x, y in zip(data['index'], data['image'])}
        for k in image_map:
            if len(image_map[k]) <= 64 and len(image_map[k]) > 0:
                idx = image_map[k]
                assert idx in image_map and len(image_map[idx]) > 64
                image_map[k] = image_map[idx]

        images = [toliststr(image_map[k]) for k in data['index']]
        data['image'] = [x[0] if len(x) == 1 else x for x in images]

    if np.all([istype(x, int) for x in data['index']]):
        data['index'] = [int(x) for x in data['index']]
    return data
# fmt: on


def write_predictions(
    dataset_tsv: Path, replies: dict[int, str], work_dir: Path, pred_format: str
) -> Path:
    """The prediction file `run.py` leaves for a dataset TSV and the model's reply per index:
    `infer_data_job`'s rank-0 branch (vlmeval/inference.py), with `PRED_FORMAT` as given."""
    work_dir.mkdir(parents=True, exist_ok=True)  # run.py: os.makedirs(pred_root, exist_ok=True)
    os.environ["PRED_FORMAT"] = pred_format
    try:
        result_file = get_pred_file_path(str(work_dir), "MedVLM", dataset_tsv.stem, True)
    finally:
        del os.environ["PRED_FORMAT"]
    data_all = dict(replies)  # trimmed: the per-rank .pkl files infer_data writes and merges
    data = dataset_data(str(dataset_tsv))
    # infer_data_job, verbatim from here (trimmed: the SPLIT_THINK and agent-record branches)
    for x in data["index"]:
        assert x in data_all
    data["prediction"] = [str(data_all[x]) for x in data["index"]]
    if "image" in data:
        data.pop("image")

    dump(data, result_file)
    return Path(result_file)


# -- vlmeval/utils/matching_util.py -------------------------------------------------------------
# fmt: off
# Matches verbose chain-of-thought answers such as:
#   "The correct answer is **B**. Here's why: ..."
#   "The answer is C."
_VERBOSE_ANSWER_RE = re.compile(r"(?i)(?:correct\s+)?answer\s+is\s+\**([ABCD])\**")


def can_infer_option(answer, choices):
    verbose = os.environ.get('VERBOSE', 0)
    # Choices is a dictionary
    if 'Failed to obtain answer via API' in answer:
        return False

    reject_to_answer = [
        "Sorry, I can't help with images of people yet.", "I can't process this file.",
        "I'm sorry, but without the image provided", 'Cannot determine the answer'
    ]
    for err in reject_to_answer:
        if err in answer:
            return 'Z'

    def count_choice(splits, choices, prefix='', suffix=''):
        cnt = 0
        for c in choices:
            if prefix + c + suffix in splits:
                cnt += 1
        return cnt

    answer_mod = cp.copy(answer)
    chars = '.()[],:;!*#{}'
    for c in chars:
        answer_mod = answer_mod.replace(c, ' ')

    splits = [x.strip() for x in answer_mod.split()]
    count = count_choice(splits, choices)

    if count == 1:
        for ch in choices:
            if 'A' in splits and len(splits) > 3 and verbose:
                logger.info(f'A might be a quantifier in the string: {answer}.')
                return False
            if ch in splits and splits.index(ch) > (len(splits) - 5):
                return ch
    elif count == 0 and count_choice(splits, {'Z', ''}) == 1:
        return 'Z'

    match = _VERBOSE_ANSWER_RE.search(answer or "")
    if match and match.group(1).upper() in choices:
        return match.group(1).upper()

    return False


def can_infer_text(answer, choices):
    answer = answer.lower()
    if len(answer) > 2 * sum(len(str(v)) for v in choices.values()):
        return False
    assert isinstance(choices, dict)
    for k in choices:
        assert k in string.ascii_uppercase
        choices[k] = str(choices[k]).lower()
    cands = []
    for k in choices:
        if choices[k] in answer:
            cands.append(k)
    if len(cands) == 1:
        return cands[0]
    return False


def can_infer(answer, choices):
    answer = str(answer)
    copt = can_infer_option(answer, choices)
    return copt if copt else can_infer_text(answer, choices)
# fmt: on


# -- vlmeval/dataset/utils/multiple_choice.py ---------------------------------------------------
# fmt: off
def build_choices(item):
    ret = {}
    for ch in string.ascii_uppercase:
        if ch in item and (not pd.isna(item[ch])):
            ret[ch] = item[ch]
    return ret


def prefetch_answer(item):
    choices = build_choices(item)
    return can_infer(item['prediction'], choices)


def extract_answer_from_item(model, item, dataset_name=None):
    # It will return: (pred, raw, llm_time)
    choices = build_choices(item)
    # trimmed: the judge prompt (option_str, build_prompt*) and the LEGO and judge branches
    ret = can_infer(item['prediction'], choices)
    if ret:
        return dict(opt=ret, log=item['prediction'])
    if model is None:
        return dict(opt='Z', log='Failed in Prefetch, no GPT-based answer matching under `exact_matching` policy.')


def eval_vanilla(model, item, dataset_name=None):
    res = extract_answer_from_item(model, item, dataset_name=dataset_name)
    opt, match_log = res['opt'], res['log']
    if opt == item['GT']:
        return dict(hit=1, log=f'Match Log: {match_log}. ')
    else:
        return dict(hit=0, log=f'Match Log: {match_log}. ')
# fmt: on


def exact_matching_hits(result_file: Path, dataset_tsv: Path) -> dict[Any, int]:
    """`hit` per index as `mcq_vanilla_eval` sets it with no judge model (`exact_matching`):
    the prediction file loaded as VLMEvalKit loads it, the key from the dataset (`meta`)."""
    data = {".tsv": lambda f: pd.read_csv(f, sep="\t"), ".xlsx": pd.read_excel}.get(
        result_file.suffix, lambda f: pd.DataFrame(json.load(open(f)))
    )(result_file)  # load(eval_file): load_tsv / load_xlsx / load_json
    meta = dataset_data(str(dataset_tsv))
    answer_map = {i: c for i, c in zip(meta["index"], meta["answer"])}
    data = data[data["index"].isin(answer_map)]
    data["GT"] = [answer_map[idx] for idx in data["index"]]
    return {item["index"]: eval_vanilla(None, item)["hit"] for _, item in data.iterrows()}
