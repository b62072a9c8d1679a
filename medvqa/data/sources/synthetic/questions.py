"""Questions about a synthetic image: SLAKE-like VQA templates and the pre-training set."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from medvqa.data.sources.synthetic.cases import BODY_PARTS, MODALITIES, ImageSpec

YES_NO = ["yes", "no"]
QA = tuple[str, str, str, list[str] | None]  # question, answer, answer_type, candidates

_ARTICLE = {"ct": "a ct", "mri": "an mri", "x-ray": "an x-ray"}
_NUMBER_WORDS = {1: "a", 2: "two", 3: "three"}

# Knowledge questions name an organ found in the image's body part; the answer depends on the
# question text only (a pure language prior, like SLAKE's knowledge questions).
KNOWLEDGE: dict[str, dict[str, dict[str, str]]] = {
    "chest": {
        "lung": {"system": "respiratory", "function": "breathing"},
        "heart": {"system": "circulatory", "function": "pumping blood"},
    },
    "head": {
        "brain": {"system": "nervous", "function": "thinking"},
        "skull": {"system": "skeletal", "function": "protection"},
    },
    "abdomen": {
        "liver": {"system": "digestive", "function": "detoxification"},
        "kidney": {"system": "urinary", "function": "filtering blood"},
        "bowel": {"system": "digestive", "function": "absorption"},
    },
}


def _pick(rng: np.random.Generator, options: Sequence[str]) -> str:
    return str(options[int(rng.integers(len(options)))])


def _other(rng: np.random.Generator, values: Sequence[str], truth: str) -> str:
    return _pick(rng, [v for v in values if v != truth])


def _q_modality_open(s: ImageSpec, rng: np.random.Generator) -> QA:
    q = _pick(
        rng,
        [
            "what modality is used to take this image?",
            "what imaging modality was used?",
            "which imaging technique is shown?",
            "how was this image acquired?",
        ],
    )
    return q, s.modality, "open", None


def _q_modality_pair(s: ImageSpec, rng: np.random.Generator) -> QA:
    pair = [s.modality, _other(rng, MODALITIES, s.modality)]
    if rng.random() < 0.5:
        pair.reverse()
    a, b = pair
    q = _pick(
        rng,
        [
            f"is this {_ARTICLE[a]} or {_ARTICLE[b]}?",
            f"was this image taken with {a} or {b}?",
            f"which modality is this, {a} or {b}?",
        ],
    )
    return q, s.modality, "closed", pair


def _q_organ_open(s: ImageSpec, rng: np.random.Generator) -> QA:
    q = _pick(
        rng,
        [
            "which part of the body does this image show?",
            "what body part is shown?",
            "which region of the body is imaged?",
            "what part of the body is being imaged?",
        ],
    )
    return q, s.body_part, "open", None


def _q_organ_yesno(s: ImageSpec, rng: np.random.Generator) -> QA:
    asked = s.body_part if rng.random() < 0.6 else _other(rng, BODY_PARTS, s.body_part)
    q = _pick(
        rng,
        [
            f"is this an image of the {asked}?",
            f"does this image show the {asked}?",
            f"is the {asked} shown in this image?",
        ],
    )
    return q, "yes" if asked == s.body_part else "no", "closed", list(YES_NO)


def _q_lesion_yesno(s: ImageSpec, rng: np.random.Generator) -> QA:
    q = _pick(
        rng,
        [
            "is there a lesion in this image?",
            "does this image contain a lesion?",
            "is any lesion visible?",
            "are there abnormal findings in this image?",
        ],
    )
    return q, "yes" if s.lesion else "no", "closed", list(YES_NO)


def _q_normal_yesno(s: ImageSpec, rng: np.random.Generator) -> QA:
    q = _pick(
        rng,
        [
            "does this image look normal?",
            "is this a normal image?",
            f"is the {s.body_part} healthy?",
        ],
    )
    return q, "no" if s.lesion else "yes", "closed", list(YES_NO)


def _q_abnormality_open(s: ImageSpec, rng: np.random.Generator) -> QA:
    q = _pick(
        rng,
        [
            "what is the abnormality?",
            "what abnormality is present?",
            "what is abnormal in this image?",
        ],
    )
    return q, s.lesion_kind, "open", None


def _q_position_open(s: ImageSpec, rng: np.random.Generator) -> QA:
    q = _pick(
        rng,
        [
            "where is the lesion?",
            "on which side is the lesion?",
            "which side of the image is the lesion on?",
            "where is the abnormality located?",
        ],
    )
    return q, s.lesion_side, "open", None


def _q_position_yesno(s: ImageSpec, rng: np.random.Generator) -> QA:
    asked = "left" if rng.random() < 0.5 else "right"
    q = _pick(
        rng,
        [
            f"is the lesion on the {asked} side?",
            f"is the lesion located on the {asked}?",
            f"is the abnormality on the {asked} side of the image?",
        ],
    )
    return q, "yes" if asked == s.lesion_side else "no", "closed", list(YES_NO)


def _q_size_pair(s: ImageSpec, rng: np.random.Generator) -> QA:
    pair = ["large", "small"] if rng.random() < 0.5 else ["small", "large"]
    a, b = pair
    q = _pick(
        rng,
        [
            f"is the lesion {a} or {b}?",
            f"is the abnormality {a} or {b}?",
            f"how big is the lesion, {a} or {b}?",
        ],
    )
    return q, s.lesion_size, "closed", pair


def _q_quantity_open(s: ImageSpec, rng: np.random.Generator) -> QA:
    q = _pick(
        rng,
        [
            "how many lesions are there?",
            "how many lesions are visible?",
            "what is the number of lesions?",
            "how many abnormalities can be seen?",
        ],
    )
    return q, str(s.lesion_count), "open", None


def _q_plane_open(s: ImageSpec, rng: np.random.Generator) -> QA:
    q = _pick(
        rng,
        [
            "in which plane is this image taken?",
            "what is the scanning plane?",
            "which plane is this image in?",
            "what plane is shown?",
        ],
    )
    return q, s.plane, "open", None


def _q_knowledge_system(s: ImageSpec, rng: np.random.Generator) -> QA:
    organ = _pick(rng, sorted(KNOWLEDGE[s.body_part]))
    q = _pick(
        rng,
        [
            f"which organ system does the {organ} belong to?",
            f"the {organ} is part of which organ system?",
            f"to which body system does the {organ} belong?",
        ],
    )
    return q, KNOWLEDGE[s.body_part][organ]["system"], "open", None


def _q_knowledge_function(s: ImageSpec, rng: np.random.Generator) -> QA:
    organ = _pick(rng, sorted(KNOWLEDGE[s.body_part]))
    q = _pick(
        rng,
        [
            f"what is the function of the {organ}?",
            f"what is the main function of the {organ}?",
            f"what does the {organ} do?",
        ],
    )
    return q, KNOWLEDGE[s.body_part][organ]["function"], "open", None


@dataclass(frozen=True)
class Template:
    """A question kind: its content type, whether it needs a lesion, and its generator."""

    name: str
    question_type: str
    needs_lesion: bool
    make: Callable[[ImageSpec, np.random.Generator], QA]
    weight: float = 1.0  # sampling weight: higher = asked for (almost) every image


VQA_TEMPLATES: tuple[Template, ...] = (
    Template("modality_open", "modality", False, _q_modality_open),
    Template("modality_pair", "modality", False, _q_modality_pair),
    Template("organ_open", "organ", False, _q_organ_open),
    Template("organ_yesno", "organ", False, _q_organ_yesno),
    Template("lesion_yesno", "abnormality", False, _q_lesion_yesno, 4.0),
    Template("normal_yesno", "abnormality", False, _q_normal_yesno, 4.0),
    Template("abnormality_open", "abnormality", False, _q_abnormality_open, 3.0),
    Template("position_open", "position", True, _q_position_open, 1.5),
    Template("position_yesno", "position", True, _q_position_yesno, 1.5),
    Template("size_pair", "size", True, _q_size_pair, 1.5),
    Template("quantity_open", "quantity", True, _q_quantity_open, 1.5),
    Template("plane_open", "plane", False, _q_plane_open),
    Template("knowledge_system", "knowledge", False, _q_knowledge_system),
    Template("knowledge_function", "knowledge", False, _q_knowledge_function),
)
QUESTION_TYPES: tuple[str, ...] = tuple(dict.fromkeys(t.question_type for t in VQA_TEMPLATES))

CAPTION_QUESTION = "Describe the image."


def caption(s: ImageSpec) -> str:
    """One-line report, e.g. 'ct of the chest with a large mass on the left'."""
    if not s.lesion:
        return f"{s.modality} of the {s.body_part} with no lesion"
    noun = (
        {"mass": "masses", "cyst": "cysts"}[s.lesion_kind] if s.lesion_count > 1 else s.lesion_kind
    )
    count = _NUMBER_WORDS[s.lesion_count]
    return f"{s.modality} of the {s.body_part} with {count} {s.lesion_size} {noun} on the {s.lesion_side}"


def _generic(
    questions: Sequence[str], answer: Callable[[ImageSpec], str]
) -> Callable[[ImageSpec, np.random.Generator], QA]:
    def make(s: ImageSpec, rng: np.random.Generator) -> QA:
        return _pick(rng, questions), answer(s), "open", None

    return make


def _fact(s: ImageSpec, rng: np.random.Generator) -> QA:
    """General medical knowledge, as a language model's pre-training text would hold it."""
    organ = _pick(rng, sorted(KNOWLEDGE[s.body_part]))
    fact = KNOWLEDGE[s.body_part][organ]
    answer = f"the {organ} belongs to the {fact['system']} system; its role is {fact['function']}"
    return (
        _pick(rng, [f"tell me about the {organ}.", f"explain the {organ}."]),
        answer,
        "open",
        None,
    )


def _region_check(s: ImageSpec, rng: np.random.Generator) -> QA:
    part = _pick(rng, BODY_PARTS)
    return (
        f"does this picture show the {part}?",
        "yes" if part == s.body_part else "no",
        "open",
        None,
    )


def _finding_check(s: ImageSpec, rng: np.random.Generator) -> QA:
    return "can you see a finding?", "yes" if s.lesion else "no", "open", None


def _side_check(s: ImageSpec, rng: np.random.Generator) -> QA:
    side = _pick(rng, ["left", "right"])
    return f"is the finding on the {side}?", "yes" if side == s.lesion_side else "no", "open", None


def _extent_check(s: ImageSpec, rng: np.random.Generator) -> QA:
    size = _pick(rng, ["small", "large"])
    return f"is the finding {size}?", "yes" if size == s.lesion_size else "no", "open", None


# Pre-training questions: the same answer vocabulary, phrased unlike the vqa templates, all open.
# Yes/no checks are included because a language model's pre-training teaches it what "yes" and
# "no" mean; without them the tiny base could only learn that during fine-tuning.
PRETRAIN_TEMPLATES: tuple[Template, ...] = (
    Template("finding_check", "generic", False, _finding_check, 2.0),
    Template("side_check", "generic", True, _side_check, 1.5),
    Template("extent_check", "generic", True, _extent_check, 1.5),
    Template("fact", "generic", False, _fact),
    Template("region_check", "generic", False, _region_check),
    Template(
        "scan",
        "generic",
        False,
        _generic(
            ["what kind of scan is this?", "which scanner made this picture?"], lambda s: s.modality
        ),
    ),
    Template(
        "region",
        "generic",
        False,
        _generic(
            ["what body region is this?", "which area of the body is pictured?"],
            lambda s: s.body_part,
        ),
    ),
    Template(
        "finding",
        "generic",
        False,
        _generic(["what is the finding?", "name the finding."], lambda s: s.lesion_kind),
    ),
    Template(
        "abnormal",
        "generic",
        False,
        _generic(["is anything abnormal here?"], lambda s: "yes" if s.lesion else "no"),
    ),
    Template(
        "orientation",
        "generic",
        False,
        _generic(["what is the orientation of the slice?"], lambda s: s.plane),
    ),
    Template(
        "side",
        "generic",
        True,
        _generic(["which side is the finding on?"], lambda s: s.lesion_side),
    ),
    Template(
        "extent", "generic", True, _generic(["how big is the finding?"], lambda s: s.lesion_size)
    ),
    Template(
        "count",
        "generic",
        True,
        _generic(["count the findings."], lambda s: str(s.lesion_count)),
    ),
)


def make_questions(
    spec: ImageSpec, question_set: str, n_questions: int, rng: np.random.Generator
) -> list[tuple[str, str, QA]]:
    """(template name, question_type, qa) for one image: distinct applicable templates."""
    if question_set == "pretrain":
        out: list[tuple[str, str, QA]] = [
            ("caption", "caption", (CAPTION_QUESTION, caption(spec), "open", None))
        ]
        templates, n_questions = PRETRAIN_TEMPLATES, n_questions - 1
    else:
        out, templates = [], VQA_TEMPLATES
    usable = [t for t in templates if spec.lesion or not t.needs_lesion]
    k = max(0, min(n_questions, len(usable)))
    # Weighted so that the abnormality questions are asked about nearly every image, lesion or
    # not; uniform sampling would ask them more often of normal images (fewer templates apply)
    # and wash out the yes/no priors.
    weights = np.array([t.weight for t in usable])
    chosen = sorted(rng.choice(len(usable), size=k, replace=False, p=weights / weights.sum()))
    for i in chosen:
        t = usable[int(i)]
        out.append((t.name, t.question_type, t.make(spec, rng)))
    return out
