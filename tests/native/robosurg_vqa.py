"""RoboSurg-VQA's release layout: configs/questions.json, data/manifest.jsonl,
data/vqa_records.jsonl and the frames as .npy arrays under external_data/.

The release's oddities are kept: JSON lines with sorted keys; `site2/video1` is a training and
a test sequence at once (same `video_key` and frame `id`, different `record_id`); EndoVis 2017
test frames have another shape than its training frames; q2 (anatomy) exists only for site2;
q1 and q3 have a single label; the file ends with a newline.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# The release's questions.json (task order = key order).
QUESTIONS: dict[str, dict[str, Any]] = {
    "q1": {
        "canonical": "What procedure does this source sequence depict?",
        "train_paraphrases": [
            "Which surgical procedure is shown in this source sequence?",
            "What operation was recorded in this sequence?",
        ],
        "heldout_paraphrase": "What type of operation is represented by this source sequence?",
    },
    "q2": {
        "canonical": "Which organ or anatomical region has the largest official mask area in "
        "this image?",
        "train_paraphrases": [
            "What is the dominant annotated anatomical region in this frame?",
            "Which anatomy class covers the greatest labelled area in the image?",
        ],
        "heldout_paraphrase": "What anatomical class occupies the largest official mask region "
        "in this frame?",
    },
    "q3": {
        "canonical": "What is the source imaging modality or view?",
        "train_paraphrases": [
            "Which camera modality produced this image?",
            "What imaging view is used for this frame?",
        ],
        "heldout_paraphrase": "What type of surgical camera view is shown here?",
    },
    "q4.bleeding": {
        "canonical": "Is bleeding visible in the image?",
        "train_paraphrases": [
            "Can bleeding be seen in this frame?",
            "Does the operative view show visible bleeding?",
        ],
        "heldout_paraphrase": "Does this image contain visible bleeding?",
    },
    "q4.smoke": {
        "canonical": "Is smoke visible in the image?",
        "train_paraphrases": [
            "Can smoke be seen in this frame?",
            "Does the operative view contain visible smoke?",
        ],
        "heldout_paraphrase": "Is there visible smoke in the surgical scene?",
    },
    "q4.occlusion": {
        "canonical": "Is the surgical view visibly obstructed?",
        "train_paraphrases": [
            "Is part of the operative field visibly obscured?",
            "Does anything noticeably block the surgical view?",
        ],
        "heldout_paraphrase": "Is visibility of the operative field obstructed?",
    },
    "q5": {
        "canonical": "How is the visual quality of the current scene?",
        "train_paraphrases": [
            "What best describes the image quality in this frame?",
            "How clear or degraded is the current surgical view?",
        ],
        "heldout_paraphrase": "Which visual-quality category applies to this image?",
    },
    "q6": {
        "canonical": "Is there specular reflection or glare?",
        "train_paraphrases": [
            "Can specular glare be seen in this frame?",
            "Does the image show specular reflection or glare?",
        ],
        "heldout_paraphrase": "Is specular glare visible in the operative view?",
    },
    "q7": {
        "canonical": "Is the image contrast normal?",
        "train_paraphrases": [
            "Does this frame have normal visual contrast?",
            "Is the contrast of the operative image normal?",
        ],
        "heldout_paraphrase": "Would the contrast in this image be considered normal?",
    },
    "q8.mask_center_5pct_v1": {
        "canonical": "Do official instrument masks occupy at least 5% of the central 50% by 50% "
        "image region?",
        "train_paraphrases": [
            "Is at least 5% of the central 50% by 50% region covered by official instrument masks?",
            "Within the central 50% by 50% window, do instrument masks cover 5% or more?",
        ],
        "heldout_paraphrase": "Is instrument-mask coverage at least 5% inside the central 50% by "
        "50% of the frame?",
    },
    "q9": {
        "canonical": "Which regions contain smoke?",
        "train_paraphrases": [
            "Where in the frame is smoke visible?",
            "Which image region contains the visible smoke?",
        ],
        "heldout_paraphrase": "Where is smoke present in the operative view?",
    },
}
# The release's fixed label lists (data/vqa_summary.json "task_labels").
LABELS: dict[str, list[str]] = {
    "q1": ["nephrectomy (robot-assisted)"],
    "q2": [
        "covered kidney (fat/fascia-covered kidney)",
        "kidney (parenchyma)",
        "other abdominal soft tissue (peritoneum/mesentery/fat)",
        "small intestine",
    ],
    "q3": ["robotic camera"],
    "q4.bleeding": ["no", "yes"],
    "q4.smoke": ["no", "yes"],
    "q4.occlusion": ["no", "yes"],
    "q5": ["blurry", "clear", "mixed"],
    "q6": ["no", "yes"],
    "q7": ["no", "yes"],
    "q8.mask_center_5pct_v1": ["no", "yes"],
    "q9": ["near instrument jaws", "none"],
}
SITE_DATASET = {"site1": "EndoVis 2017", "site2": "EndoVis 2018"}
# (site, split, video number, validation_role, frame shape): two frames each.
SEQUENCES = (
    ("site1", "train", 1, "train_core", (8, 10, 3)),
    ("site1", "train", 3, "validation", (8, 10, 3)),
    ("site1", "test", 9, "test", (9, 16, 3)),  # 2017 test frames are 1080 x 1920, not 1024 x 1280
    ("site2", "train", 1, "train_core", (8, 10, 3)),
    ("site2", "train", 2, "validation", (8, 10, 3)),
    ("site2", "test", 1, "test", (8, 10, 3)),  # same video_key as the training site2/video1
)
FRAMES_PER_SEQUENCE = 2
ROLE_SPLIT = {"train_core": "train", "validation": "validate", "test": "test"}


@dataclass
class RoboSurgFixture:
    root: Path
    manifest: list[dict[str, Any]] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def records_file(self) -> Path:
        return self.root / "data" / "vqa_records.jsonl"

    @property
    def manifest_file(self) -> Path:
        return self.root / "data" / "manifest.jsonl"

    @property
    def questions_file(self) -> Path:
        return self.root / "configs" / "questions.json"

    def base_rows(self, split: str, multi_label_only: bool = True) -> list[dict[str, Any]]:
        """The (frame, task) records of one normalised source split."""
        return [
            r
            for r in self.records
            if ROLE_SPLIT[r["validation_role"]] == split
            and (len(r["valid_answers"]) >= 2 or not multi_label_only)
        ]


def _answer(task: str, n: int) -> str:
    labels = LABELS[task]
    return labels[(n + len(task)) % len(labels)]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """JSON lines as the release writes them: sorted keys, UTF-8, a final newline."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows),
        encoding="utf-8",
    )


def write(root: Path) -> RoboSurgFixture:
    """Six source sequences (train_core, validation and test per site), two frames each."""
    fixture = RoboSurgFixture(root)
    global_answers = list(dict.fromkeys(a for task in QUESTIONS for a in LABELS[task]))
    n = 0
    for site, split, video, role, shape in SEQUENCES:
        video_key = f"{site}/video{video}"
        for frame_index in range(FRAMES_PER_SEQUENCE):
            frame_id = f"video{video}frame{frame_index:03d}"
            record_id = f"{site}/{split}/{frame_id}"
            image = f"external_data/{site}/{split}/image/{frame_id}.npy"
            mask = f"external_data/{site}/{split}/mask/{frame_id}.npy"
            rng = np.random.default_rng(n)
            (root / image).parent.mkdir(parents=True, exist_ok=True)
            (root / mask).parent.mkdir(parents=True, exist_ok=True)
            np.save(root / image, rng.integers(0, 256, size=shape, dtype=np.uint8))
            np.save(root / mask, rng.integers(0, 4, size=shape[:2], dtype=np.uint8))
            fixture.manifest.append(
                {
                    "dataset": SITE_DATASET[site],
                    "frame_index": frame_index,
                    "id": frame_id,
                    "image_dtype": "uint8",
                    "image_path": image,
                    "image_shape": list(shape),
                    "mask_dtype": "uint8",
                    "mask_path": mask,
                    "mask_shape": list(shape[:2]),
                    "record_id": record_id,
                    "site": site,
                    "split": split,
                    "video_id": f"video{video}",
                    "video_key": video_key,
                }
            )
            for task, wordings in QUESTIONS.items():
                if task == "q2" and site == "site1":  # EndoVis 2017 has no anatomy masks
                    continue
                answer = _answer(task, n)
                fixture.records.append(
                    {
                        "qa_id": f"{record_id}|{task}",
                        "record_id": record_id,
                        "video_key": video_key,
                        "source_sequence_id": f"{split}|{video_key}",
                        "source_split": split,
                        "dataset": SITE_DATASET[site],
                        "site": site,
                        "image_path": image,
                        "task": task,
                        "answer": answer,
                        "answer_index": global_answers.index(answer),
                        "valid_answers": LABELS[task],
                        "question_canonical": wordings["canonical"],
                        "question_train_paraphrases": wordings["train_paraphrases"],
                        "question_heldout_paraphrase": wordings["heldout_paraphrase"],
                        "validation_role": role,
                    }
                )
            n += 1
    fixture.questions_file.parent.mkdir(parents=True, exist_ok=True)
    fixture.questions_file.write_text(
        json.dumps({"schema_version": "shared_vqa_questions", "tasks": QUESTIONS}, indent=2),
        encoding="utf-8",
    )
    write_jsonl(fixture.manifest_file, fixture.manifest)
    write_jsonl(fixture.records_file, fixture.records)
    return fixture
