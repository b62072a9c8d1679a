"""Built-in synthetic medical VQA: procedurally rendered scans with SLAKE-like questions.

Why it exists: the CPU demo and the tests need a dataset that needs no download, builds in a
few seconds and that a ~1M-parameter VLM can learn in minutes. So the visual cues are strong
and global (modality contrast, body outline, bright/dark blobs on one side, small vs large),
while metadata (sex, age, ethnicity, modality, body part) behave like real covariates that a
distribution shift can split on: age raises the lesion rate and dims bone, sex narrows the
body outline, ethnicity has no visual effect at all.

Everything is deterministic from the seed: each case draws from its own
`np.random.default_rng([stream, seed, case_index, ...])`, so one case's content never depends
on how many cases come before it. The generated images and `annotations.jsonl` are cached under
`<cache_dir>/synthetic/<hash of the parameters>/`; `manifest.json` is written last and marks
the directory complete.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from PIL import Image

from medvqa.atomic import build_once, write_file
from medvqa.data import records as R
from medvqa.data.base import VQASource
from medvqa.data.regions import (
    NAMES_NO_REGION,
    NO_REGION_FILE,
    REGION,
    REGION_MISSING,
    Region,
    log_counts,
    region_counts,
)
from medvqa.data.sources.synthetic.cases import (
    MODALITIES,
    PARAPHRASE_STREAM,
    QUESTION_SETS,
    QUESTION_STREAM,
    RENDER_STREAM,
    Case,
    ImageSpec,
    assign_splits,
    sample_case,
)
from medvqa.data.sources.synthetic.questions import QA, REGION_TEMPLATES, make_questions
from medvqa.data.sources.synthetic.render import (
    render_image,
    render_with_findings,
    to_png_image,
)
from medvqa.errors import DataError
from medvqa.hashing import content_hash

log = logging.getLogger(__name__)

# Bump whenever rendering or question generation changes, so stale caches are not reused.
GENERATOR_VERSION = 4


METADATA_COLUMNS: tuple[str, ...] = (
    "modality",
    "body_part",
    "sex",
    "age",
    "ethnicity",
    "lesion",
    "lesion_kind",
    "lesion_count",
    "lesion_side",
    "lesion_size",
    "plane",
    "template",
)
# With `paraphrases`: the group shared by a question and its rewording, and which one it is.
PARAPHRASE_COLUMNS = [R.PARAPHRASE_GROUP, "phrasing"]
MANIFEST = "manifest.json"
ANNOTATIONS = "annotations.jsonl"
IMAGES_DIR = "images"
MASKS_DIR = "masks"  # with `regions`: the findings' mask of each image that has a finding


def text_cue(question: str, answer: str) -> str:
    """The question with its answer stated in its own text (`dataset.text_cue_modality`): a
    subgroup answerable without looking, as a report sentence quoted in a question would make
    it, so that the image-reliance analysis has something true to find."""
    return f"The report says: {answer}. {question}"


def _pair(value: Sequence[int], key: str) -> tuple[int, int]:
    items = list(value)
    if len(items) != 2 or not 1 <= int(items[0]) <= int(items[1]):
        raise ValueError(f"dataset.{key} must be [min, max] with 1 <= min <= max; got {value!r}.")
    return int(items[0]), int(items[1])


class SyntheticVQA(VQASource):
    """Procedurally generated medical-like VQA, cached on disk under a hash of its parameters."""

    name = "synthetic"
    real = False
    metadata_fields = METADATA_COLUMNS

    def __init__(
        self,
        cache_dir: str | Path,
        seed: int = 0,
        n_cases: int = 500,
        images_per_case: Sequence[int] = (1, 2),
        image_size: int = 64,
        questions_per_image: int = 8,
        question_set: str = "vqa",
        split_fractions: Sequence[float] = (0.7, 0.15, 0.15),
        text_cue_modality: str | None = None,
        paraphrases: bool = False,
        regions: bool = False,
    ) -> None:
        if int(seed) < 0:
            raise ValueError(f"dataset.seed must be >= 0; got {seed}.")
        if int(n_cases) < 1:
            raise ValueError(f"dataset.n_cases must be >= 1; got {n_cases}.")
        if int(image_size) < 16:
            raise ValueError(f"dataset.image_size must be >= 16 pixels; got {image_size}.")
        if int(questions_per_image) < 1:
            raise ValueError(
                f"dataset.questions_per_image must be >= 1; got {questions_per_image}."
            )
        if question_set not in QUESTION_SETS:
            raise ValueError(
                f"dataset.question_set must be one of {QUESTION_SETS}; got {question_set!r}."
            )
        if text_cue_modality is not None and text_cue_modality not in MODALITIES:
            raise ValueError(
                f"dataset.text_cue_modality must be one of {MODALITIES} or null; got "
                f"{text_cue_modality!r}."
            )
        fractions = [float(f) for f in split_fractions]
        if len(fractions) != 3 or min(fractions) < 0 or abs(sum(fractions) - 1.0) > 1e-6:
            raise ValueError(
                "dataset.split_fractions must be three non-negative numbers (train, validate, "
                f"test) summing to 1; got {split_fractions!r}."
            )
        self.seed = int(seed)
        self.n_cases = int(n_cases)
        self.images_per_case = _pair(images_per_case, "images_per_case")
        self.image_size = int(image_size)
        self.questions_per_image = int(questions_per_image)
        self.question_set = str(question_set)
        self.split_fractions = tuple(fractions)
        self.text_cue_modality = text_cue_modality
        self.paraphrases = bool(paraphrases)
        self.regions = bool(regions)
        self.cache_dir = Path(cache_dir).expanduser()
        canonical = json.dumps(self.params, sort_keys=True, separators=(",", ":"))
        self.config_hash = content_hash(canonical)
        super().__init__(self.cache_dir / "synthetic" / self.config_hash)
        self._table: pd.DataFrame | None = None

    @property
    def root(self) -> Path:
        """The cache directory of this configuration; images live under it."""
        return self._root

    @root.setter
    def root(self, value: str | Path) -> None:
        self._root = Path(value)

    @property
    def params(self) -> dict[str, Any]:
        """Everything that determines the content (hashed to name the cache directory)."""
        return {
            "seed": self.seed,
            "n_cases": self.n_cases,
            "images_per_case": list(self.images_per_case),
            "image_size": self.image_size,
            "questions_per_image": self.questions_per_image,
            "question_set": self.question_set,
            "split_fractions": list(self.split_fractions),
            "generator_version": GENERATOR_VERSION,
            # Only when set: the default data keeps the cache (and numbers) it always had.
            **({"text_cue_modality": self.text_cue_modality} if self.text_cue_modality else {}),
            **({"paraphrases": True} if self.paraphrases else {}),
            **({"regions": True} if self.regions else {}),
        }

    # -- public ----------------------------------------------------------------------------------

    def fingerprint(self) -> str:
        """The config hash already covers the generator version and every parameter."""
        return self.config_hash

    def table(self) -> pd.DataFrame:
        """All records; generates the cache on first use, afterwards only reads it."""
        if self._table is None:
            self.prepare()
            table = self._read()
            R.validate_table(table, self.name, required=METADATA_COLUMNS)
            self._table = table
            if self.regions:
                log_counts(self.name, region_counts(table))
        return self._table.copy()

    def report(self) -> dict[str, Any]:
        """With `regions`: how many rows have a region and why the others do not."""
        return {"regions": region_counts(self.table())} if self.regions else {}

    def prepare(self) -> Path:
        """Make sure the cache directory is complete (generating it if not); returns it."""
        if not self._complete(self.root):
            self._generate()
        return self.root

    def image_path(self, ref: str, record_id: str | None = None) -> Path:
        """Like the base class, but generates the cache first if images are asked for early."""
        if self._table is None:
            self.prepare()
        return super().image_path(ref, record_id)

    # -- cache -----------------------------------------------------------------------------------

    def _complete(self, directory: Path) -> bool:
        """A directory counts only with a manifest for exactly these parameters."""
        try:
            manifest = json.loads((directory / MANIFEST).read_text())
        except (OSError, ValueError):
            return False
        return (
            isinstance(manifest, dict)
            and manifest.get("hash") == self.config_hash
            and manifest.get("params") == self.params
            and (directory / ANNOTATIONS).is_file()
        )

    def _unwritable(self, err: OSError) -> DataError:
        return DataError(
            f"{self.name}: cannot write the generated dataset to {self.root} ({err}). Set "
            "paths.cache_dir (or the environment variable MEDVQA_CACHE) to a writable directory."
        )

    def _generate(self) -> None:
        """Generate once, atomically (`medvqa.atomic.build_once`): readers never see halves."""
        final = self.root
        if final.exists() and not self._complete(final):
            log.info("Removing incomplete synthetic cache %s", final)
            shutil.rmtree(final, ignore_errors=True)
        start = time.perf_counter()
        log.info(
            "Generating synthetic VQA dataset (%d cases, %s questions) in %s",
            self.n_cases,
            self.question_set,
            final,
        )
        counts: dict[str, Any] = {}
        try:
            built = build_once(
                final, lambda tmp: counts.update(self._write(tmp)), MANIFEST, "generated dataset"
            )
        except OSError as err:
            raise self._unwritable(err) from err
        if built:
            log.info(
                "Generated %d images and %d records in %.1fs",
                counts["images"],
                counts["records"],
                time.perf_counter() - start,
            )

    def _write(self, directory: Path) -> dict[str, Any]:
        """Render images and questions into `directory`; the manifest goes last, atomically."""
        (directory / IMAGES_DIR).mkdir()
        splits = assign_splits(self.n_cases, self.split_fractions, self.seed)
        n_images = n_records = 0
        split_counts = dict.fromkeys(R.SOURCE_SPLITS, 0)
        with open(directory / ANNOTATIONS, "w", encoding="utf-8") as out:
            for index in range(self.n_cases):
                case = sample_case(self.seed, index, self.images_per_case)
                split_counts[splits[index]] += 1
                for j, spec in enumerate(case.images):
                    image_id = f"img{n_images:05d}"
                    n_images += 1
                    region = self._draw(directory, spec, (index, j), image_id)
                    q_rng = np.random.default_rng([QUESTION_STREAM, self.seed, index, j])
                    p_rng = None  # paraphrases of the test cases' questions only
                    if self.paraphrases and splits[index] == "test":
                        p_rng = np.random.default_rng([PARAPHRASE_STREAM, self.seed, index, j])
                    qas = make_questions(
                        spec, self.question_set, self.questions_per_image, q_rng, p_rng
                    )
                    records = self._records(qas, spec, case, image_id, splits[index], region)
                    for record in records:
                        out.write(json.dumps(record) + "\n")
                        n_records += 1
        counts = {"cases": self.n_cases, "images": n_images, "records": n_records}
        manifest = {
            "hash": self.config_hash,
            "params": self.params,
            "counts": counts,
            "cases_per_split": split_counts,
        }
        text = json.dumps(manifest, indent=2, sort_keys=True)
        write_file(directory / MANIFEST, lambda tmp: tmp.write_text(text))
        return counts

    def _draw(
        self, directory: Path, spec: ImageSpec, at: tuple[int, int], image_id: str
    ) -> str | None:
        """Render the `at` = (case, image) image into `directory`; with `regions`, also the
        exact mask of its findings (`masks/<image_id>.png`: k on the k-th finding's pixels),
        whose region (`regions.Region`) is returned (None: no finding, no mask)."""
        seed = (RENDER_STREAM, self.seed, *at)
        if not self.regions:
            pixels = render_image(spec, self.image_size, seed)
            findings = None
        else:
            pixels, findings = render_with_findings(spec, self.image_size, seed)
        to_png_image(pixels).save(directory / IMAGES_DIR / f"{image_id}.png", format="PNG")
        if findings is None or not findings.any():
            return None
        ref = f"{MASKS_DIR}/{image_id}.png"
        (directory / MASKS_DIR).mkdir(exist_ok=True)
        Image.fromarray(findings).save(directory / ref, format="PNG")
        return Region(mask=ref).text()

    def _records(
        self,
        qas: list[tuple[str, str, QA, QA | None]],
        spec: ImageSpec,
        case: Case,
        image_id: str,
        split: str,
        region: str | None = None,
    ) -> list[dict[str, Any]]:
        """The records of one image's questions (`make_questions`'), each with the case's and
        the image's metadata (the fields shifts and breakdowns select on), with `regions` the
        findings' region where the question concerns them (`region`: the image's, None without
        a finding), and after each question its paraphrase where one was drawn, linked to it
        by a paraphrase group."""
        records = []
        for k, (template, qtype, qa, para) in enumerate(qas):
            question, answer, atype, cands = qa
            if spec.modality == self.text_cue_modality:
                question = text_cue(question, answer)
            record = {
                R.ID: f"{image_id}_q{k}",
                R.IMAGE: f"{IMAGES_DIR}/{image_id}.png",
                R.QUESTION: question,
                R.ANSWER: answer,
                R.ANSWER_TYPE: atype,
                R.QUESTION_TYPE: qtype,
                R.CANDIDATES: cands,
                R.CASE_ID: case.case_id,
                R.IMAGE_ID: image_id,
                R.SOURCE_SPLIT: split,
                "modality": spec.modality,
                "body_part": spec.body_part,
                "sex": case.sex,
                "age": case.age,
                "ethnicity": case.ethnicity,
                "lesion": "yes" if spec.lesion else "no",
                "lesion_kind": spec.lesion_kind,
                "lesion_count": spec.lesion_count,
                "lesion_side": spec.lesion_side,
                "lesion_size": spec.lesion_size,
                "plane": spec.plane,
                "template": template,
            }
            if self.paraphrases:  # the group links a question to its rewording
                record[R.PARAPHRASE_GROUP] = record[R.ID]
                record["phrasing"] = "original"
            if self.regions:
                record.update(_region_cells(template, region))
            records.append(record)
            if para is not None:
                reworded = para[0]
                if spec.modality == self.text_cue_modality:
                    reworded = text_cue(reworded, answer)
                records.append(
                    {
                        **record,
                        R.ID: f"{record[R.ID]}_p",
                        R.QUESTION: reworded,
                        "phrasing": "paraphrase",
                    }
                )
        return records

    def _read(self) -> pd.DataFrame:
        """Load `annotations.jsonl`; lists stay lists and open candidates stay None."""
        path = self.root / ANNOTATIONS
        rows = []
        with open(path, encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                try:
                    rows.append(json.loads(line))
                except ValueError as err:
                    raise DataError(
                        f"{self.name}: {path} line {line_no} is not valid JSON ({err}); delete "
                        f"{self.root} to regenerate it."
                    ) from err
        columns = [*R.CORE_COLUMNS, *METADATA_COLUMNS]
        if self.paraphrases:
            columns += PARAPHRASE_COLUMNS
        if self.regions:
            columns += [REGION, REGION_MISSING]
        return pd.DataFrame.from_records(rows, columns=columns)


def _region_cells(template: str, region: str | None) -> dict[str, str | None]:
    """A record's `region` and `region_missing`: the image's findings where the question is
    about them (`REGION_TEMPLATES`), else none, saying why."""
    if template not in REGION_TEMPLATES:
        return {REGION: None, REGION_MISSING: NAMES_NO_REGION}
    return {REGION: region, REGION_MISSING: None if region else NO_REGION_FILE}
