"""Questions about a synthetic image: a table of templates and the one function that asks them.

A template is data: its wordings (format strings), the answer (a format string over the image's
facts), its form and, optionally, a *slot* drawn before the wording (the organ asked about, the
pair a choice offers, ...). `ask` turns a template and an image into one question, drawing
first the slot, then the wording, from the image's own generator, so a question never depends
on another image's. The VQA set is SLAKE-like (modality, organ, abnormality, position, size,
quantity, plane, knowledge); the pre-training set uses the same answers in other words.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
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


# -- slots: what a template draws before its wording (each returns format fields) ------------


def _modality_pair(s: ImageSpec, rng: np.random.Generator) -> dict[str, str]:
    """The true modality and another one, in random order (a two-way choice)."""
    pair = [s.modality, _other(rng, MODALITIES, s.modality)]
    if rng.random() < 0.5:
        pair.reverse()
    return {
        "a": pair[0],
        "b": pair[1],
        "article_a": _ARTICLE[pair[0]],
        "article_b": _ARTICLE[pair[1]],
    }


def _size_pair(s: ImageSpec, rng: np.random.Generator) -> dict[str, str]:
    a, b = ("large", "small") if rng.random() < 0.5 else ("small", "large")
    return {"a": a, "b": b}


def _organ_probe(s: ImageSpec, rng: np.random.Generator) -> dict[str, str]:
    """The imaged body part 60 % of the time, else another one."""
    asked = s.body_part if rng.random() < 0.6 else _other(rng, BODY_PARTS, s.body_part)
    return {"asked": asked}


def _side_probe(s: ImageSpec, rng: np.random.Generator) -> dict[str, str]:
    return {"asked": "left" if rng.random() < 0.5 else "right"}


def _uniform(values: Sequence[str]) -> Callable[[ImageSpec, np.random.Generator], dict[str, str]]:
    def draw(s: ImageSpec, rng: np.random.Generator) -> dict[str, str]:
        return {"asked": _pick(rng, values)}

    return draw


def _organ(s: ImageSpec, rng: np.random.Generator) -> dict[str, str]:
    """An organ of the imaged body part, with its knowledge facts."""
    organ = _pick(rng, sorted(KNOWLEDGE[s.body_part]))
    return {"organ": organ, **KNOWLEDGE[s.body_part][organ]}


SLOTS: dict[str, Callable[[ImageSpec, np.random.Generator], dict[str, str]]] = {
    "modality_pair": _modality_pair,
    "size_pair": _size_pair,
    "organ_probe": _organ_probe,
    "side_probe": _side_probe,
    "any_body_part": _uniform(BODY_PARTS),
    "any_side": _uniform(("left", "right")),
    "any_size": _uniform(("small", "large")),
    "organ": _organ,
}

# -- the templates -----------------------------------------------------------------------------

# How a template's answer is asked for and scored:
#   open     free text; the answer is `answer` filled in;
#   yes_no   closed [yes, no]: with an `asked` slot, "yes" iff it equals the filled-in answer,
#            else the filled-in answer itself (already yes/no);
#   choice   closed between the slot's two options `a`, `b`; the answer is `answer` filled in;
#   check    like yes_no but scored as an open answer (pre-training only).
FORMS = ("open", "yes_no", "choice", "check")


@dataclass(frozen=True)
class Template:
    """One kind of question (see the module docstring and FORMS)."""

    name: str
    question_type: str
    wordings: tuple[str, ...]
    answer: str
    form: str = "open"
    slot: str | None = None
    needs_lesion: bool = False
    weight: float = 1.0  # sampling weight: higher = asked for (almost) every image
    # Its answer is read off the findings: their mask is the question's region (with a lesion).
    region: bool = False


def _facts(s: ImageSpec) -> dict[str, str]:
    """What answers are written from: the spec's fields, as text."""
    return {
        "modality": s.modality,
        "body_part": s.body_part,
        "plane": s.plane,
        "lesion_kind": s.lesion_kind,
        "lesion_side": s.lesion_side,
        "lesion_size": s.lesion_size,
        "lesion_count": str(s.lesion_count),
        "has_lesion": "yes" if s.lesion else "no",
        "is_normal": "no" if s.lesion else "yes",
    }


def _fields(t: Template, s: ImageSpec, rng: np.random.Generator) -> Mapping[str, str]:
    """The image's facts and the template's slot (drawn from `rng`)."""
    return {**_facts(s), **(SLOTS[t.slot](s, rng) if t.slot else {})}


def ask(t: Template, s: ImageSpec, rng: np.random.Generator) -> QA:
    """(question, answer, answer_type, candidates): the slot first, then the wording."""
    fields = _fields(t, s, rng)
    return _qa(t, fields, _pick(rng, t.wordings).format(**fields))


def rephrase(
    t: Template, s: ImageSpec, rng: np.random.Generator, other: np.random.Generator
) -> QA | None:
    """The question `ask(t, s, rng)` asks (`rng` in the state `ask` got it in), in another of
    the template's wordings drawn from `other`: the same slot, answer and candidates; None
    where the template has no other wording that reads differently."""
    fields = _fields(t, s, rng)
    asked = t.wordings[int(rng.integers(len(t.wordings)))].format(**fields)  # _pick's draw
    others = sorted({w.format(**fields) for w in t.wordings} - {asked})
    return _qa(t, fields, _pick(other, others)) if others else None


def _qa(t: Template, fields: Mapping[str, str], question: str) -> QA:
    answer = t.answer.format(**fields)
    if t.form in ("yes_no", "check") and "asked" in fields:
        answer = "yes" if fields["asked"] == answer else "no"
    if t.form == "yes_no":
        return question, answer, "closed", list(YES_NO)
    if t.form == "choice":
        return question, answer, "closed", [fields["a"], fields["b"]]
    return question, answer, "open", None


VQA_TEMPLATES: tuple[Template, ...] = (
    Template(
        "modality_open",
        "modality",
        (
            "what modality is used to take this image?",
            "what imaging modality was used?",
            "which imaging technique is shown?",
            "how was this image acquired?",
        ),
        "{modality}",
    ),
    Template(
        "modality_pair",
        "modality",
        (
            "is this {article_a} or {article_b}?",
            "was this image taken with {a} or {b}?",
            "which modality is this, {a} or {b}?",
        ),
        "{modality}",
        form="choice",
        slot="modality_pair",
    ),
    Template(
        "organ_open",
        "organ",
        (
            "which part of the body does this image show?",
            "what body part is shown?",
            "which region of the body is imaged?",
            "what part of the body is being imaged?",
        ),
        "{body_part}",
    ),
    Template(
        "organ_yesno",
        "organ",
        (
            "is this an image of the {asked}?",
            "does this image show the {asked}?",
            "is the {asked} shown in this image?",
        ),
        "{body_part}",
        form="yes_no",
        slot="organ_probe",
    ),
    Template(
        "lesion_yesno",
        "abnormality",
        (
            "is there a lesion in this image?",
            "does this image contain a lesion?",
            "is any lesion visible?",
            "are there abnormal findings in this image?",
        ),
        "{has_lesion}",
        form="yes_no",
        weight=4.0,
        region=True,
    ),
    Template(
        "normal_yesno",
        "abnormality",
        (
            "does this image look normal?",
            "is this a normal image?",
            "is the {body_part} healthy?",
        ),
        "{is_normal}",
        form="yes_no",
        weight=4.0,
        region=True,
    ),
    Template(
        "abnormality_open",
        "abnormality",
        (
            "what is the abnormality?",
            "what abnormality is present?",
            "what is abnormal in this image?",
        ),
        "{lesion_kind}",
        weight=3.0,
        region=True,
    ),
    Template(
        "position_open",
        "position",
        (
            "where is the lesion?",
            "on which side is the lesion?",
            "which side of the image is the lesion on?",
            "where is the abnormality located?",
        ),
        "{lesion_side}",
        needs_lesion=True,
        weight=1.5,
        region=True,
    ),
    Template(
        "position_yesno",
        "position",
        (
            "is the lesion on the {asked} side?",
            "is the lesion located on the {asked}?",
            "is the abnormality on the {asked} side of the image?",
        ),
        "{lesion_side}",
        form="yes_no",
        slot="side_probe",
        needs_lesion=True,
        weight=1.5,
        region=True,
    ),
    Template(
        "size_pair",
        "size",
        (
            "is the lesion {a} or {b}?",
            "is the abnormality {a} or {b}?",
            "how big is the lesion, {a} or {b}?",
        ),
        "{lesion_size}",
        form="choice",
        slot="size_pair",
        needs_lesion=True,
        weight=1.5,
        region=True,
    ),
    Template(
        "quantity_open",
        "quantity",
        (
            "how many lesions are there?",
            "how many lesions are visible?",
            "what is the number of lesions?",
            "how many abnormalities can be seen?",
        ),
        "{lesion_count}",
        needs_lesion=True,
        weight=1.5,
        region=True,
    ),
    Template(
        "plane_open",
        "plane",
        (
            "in which plane is this image taken?",
            "what is the scanning plane?",
            "which plane is this image in?",
            "what plane is shown?",
        ),
        "{plane}",
    ),
    Template(
        "knowledge_system",
        "knowledge",
        (
            "which organ system does the {organ} belong to?",
            "the {organ} is part of which organ system?",
            "to which body system does the {organ} belong?",
        ),
        "{system}",
        slot="organ",
    ),
    Template(
        "knowledge_function",
        "knowledge",
        (
            "what is the function of the {organ}?",
            "what is the main function of the {organ}?",
            "what does the {organ} do?",
        ),
        "{function}",
        slot="organ",
    ),
)
QUESTION_TYPES: tuple[str, ...] = tuple(dict.fromkeys(t.question_type for t in VQA_TEMPLATES))
# The templates whose question concerns the findings' region (`Template.region`).
REGION_TEMPLATES = frozenset(t.name for t in VQA_TEMPLATES if t.region)

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


# Pre-training questions: the same answer vocabulary, phrased unlike the vqa templates, all open.
# Yes/no checks are included because a language model's pre-training teaches it what "yes" and
# "no" mean; without them the tiny base could only learn that during fine-tuning.
PRETRAIN_TEMPLATES: tuple[Template, ...] = (
    Template("finding_check", "generic", ("can you see a finding?",), "{has_lesion}", weight=2.0),
    Template(
        "side_check",
        "generic",
        ("is the finding on the {asked}?",),
        "{lesion_side}",
        form="check",
        slot="any_side",
        needs_lesion=True,
        weight=1.5,
    ),
    Template(
        "extent_check",
        "generic",
        ("is the finding {asked}?",),
        "{lesion_size}",
        form="check",
        slot="any_size",
        needs_lesion=True,
        weight=1.5,
    ),
    # General medical knowledge, as a language model's pre-training text would hold it.
    Template(
        "fact",
        "generic",
        ("tell me about the {organ}.", "explain the {organ}."),
        "the {organ} belongs to the {system} system; its role is {function}",
        slot="organ",
    ),
    Template(
        "region_check",
        "generic",
        ("does this picture show the {asked}?",),
        "{body_part}",
        form="check",
        slot="any_body_part",
    ),
    Template(
        "scan",
        "generic",
        ("what kind of scan is this?", "which scanner made this picture?"),
        "{modality}",
    ),
    Template(
        "region",
        "generic",
        ("what body region is this?", "which area of the body is pictured?"),
        "{body_part}",
    ),
    Template("finding", "generic", ("what is the finding?", "name the finding."), "{lesion_kind}"),
    Template("abnormal", "generic", ("is anything abnormal here?",), "{has_lesion}"),
    Template("orientation", "generic", ("what is the orientation of the slice?",), "{plane}"),
    Template(
        "side", "generic", ("which side is the finding on?",), "{lesion_side}", needs_lesion=True
    ),
    Template("extent", "generic", ("how big is the finding?",), "{lesion_size}", needs_lesion=True),
    Template("count", "generic", ("count the findings.",), "{lesion_count}", needs_lesion=True),
)


def make_questions(
    spec: ImageSpec,
    question_set: str,
    n_questions: int,
    rng: np.random.Generator,
    paraphrase_rng: np.random.Generator | None = None,
) -> list[tuple[str, str, QA, QA | None]]:
    """(template name, question_type, qa, paraphrase) for one image: distinct applicable
    templates. With `paraphrase_rng`, each question also in another wording of its template
    (`rephrase`; None where there is none); the questions themselves are the same either way."""
    if question_set == "pretrain":
        out: list[tuple[str, str, QA, QA | None]] = [
            ("caption", "caption", (CAPTION_QUESTION, caption(spec), "open", None), None)
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
        before = copy.deepcopy(rng) if paraphrase_rng is not None else None
        qa = ask(t, spec, rng)
        other = rephrase(t, spec, before, paraphrase_rng) if before is not None else None
        out.append((t.name, t.question_type, qa, other))
    return out
