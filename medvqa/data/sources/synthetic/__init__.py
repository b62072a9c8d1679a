"""The built-in synthetic dataset (`dataset=synthetic`): one module per job.

`cases` samples patients and images with their findings, `render` draws an image from its
spec, `questions` holds the question templates (a table) and `dataset` is the source class
that generates, caches and loads it all.
"""

from medvqa.data.sources.synthetic.cases import (
    BODY_PARTS,
    ETHNICITIES,
    MODALITIES,
    PLANES,
    Case,
    ImageSpec,
    sample_case,
)
from medvqa.data.sources.synthetic.dataset import METADATA_COLUMNS, SyntheticVQA
from medvqa.data.sources.synthetic.questions import (
    PRETRAIN_TEMPLATES,
    QUESTION_TYPES,
    VQA_TEMPLATES,
    Template,
    caption,
    make_questions,
)
from medvqa.data.sources.synthetic.render import render_image

__all__ = [
    "BODY_PARTS",
    "ETHNICITIES",
    "METADATA_COLUMNS",
    "MODALITIES",
    "PLANES",
    "PRETRAIN_TEMPLATES",
    "QUESTION_TYPES",
    "VQA_TEMPLATES",
    "Case",
    "ImageSpec",
    "SyntheticVQA",
    "Template",
    "caption",
    "make_questions",
    "render_image",
    "sample_case",
]
