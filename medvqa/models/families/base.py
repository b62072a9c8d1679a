"""What medvqa knows of a VLM architecture beyond its YAML preset, in one class per family.

A family is a transformers architecture, named by its config's `model_type` (the plug-in's
`name`): `llava`, `qwen2_vl`, `gemma3`, ... A `ModelFamily` subclass in a module of this package
(or one named in $MEDVQA_PLUGINS, `medvqa.plugins`) registers itself and carries every
per-family fact the code asks for: how many tokens an image becomes (the memory plan), the
stand-in tokenizer and processor classes of a rehearsal with random weights, how a checkpoint
is shrunk to a CPU's size, its tiny random twin for the tests, whether its image prefixes can
be shared, whether its FLOPs are counted, and the preset its tests run. Adding a family is its
module plus its `conf/model/<name>.yaml` (docs/extending.md#a-model).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from medvqa import plugins

# (height, width) of a picture in pixels.
ImageSize = tuple[int, int]


@dataclass(frozen=True)
class StandIn:
    """The tokenizer of a checkpoint as a stand-in rebuilds it (`medvqa.models.stand_in`):
    the special tokens (the first is padding), bos/eos, the named extras a processor looks
    up (`image_token`, ...), a chat template of the family's shape, and the config attributes
    that hold a special token's id (config attribute -> token): a rehearsal points the
    checkpoint's config at the stand-in's ids, a tiny twin's config is built with them."""

    special: tuple[str, ...]
    bos: str | None
    eos: str
    extra: Mapping[str, str]
    template: str
    config_tokens: Mapping[str, str]

    def __post_init__(self) -> None:
        unknown = sorted(set(self.config_tokens.values()) - set(self.special))
        if unknown:
            raise plugins.PluginError(
                f"config_tokens names {', '.join(map(repr, unknown))}, which is not a special "
                f"token of the stand-in ({', '.join(self.special)})"
            )

    def config_ids(self, tokenizer: Any) -> dict[str, int]:
        """Config attribute -> the id `tokenizer` (the stand-in's) gives its token: what a
        rehearsal sets on the checkpoint's config and a tiny twin's config is built with."""
        ids = tokenizer.convert_tokens_to_ids
        return {attribute: ids(token) for attribute, token in self.config_tokens.items()}


@dataclass(frozen=True)
class TinyShape:
    """The size of a tiny twin (`medvqa.zoo.families.TinyFamilyBuilder`): ~1M parameters."""

    image_size: int
    patch_size: int
    vision_hidden: int
    text_hidden: int
    text_layers: int

    def text(self, tokenizer: Any, **extra: Any) -> dict[str, Any]:
        """A text-config dict of this size whose ids are `tokenizer`'s."""
        return {
            "vocab_size": len(tokenizer),
            "hidden_size": self.text_hidden,
            "intermediate_size": 2 * self.text_hidden,
            "num_hidden_layers": self.text_layers,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 512,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
            **extra,
        }

    def vision(self, **extra: Any) -> dict[str, Any]:
        """A one-layer vision-config dict of this size."""
        return {
            "hidden_size": self.vision_hidden,
            "intermediate_size": 2 * self.vision_hidden,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": self.image_size,
            "patch_size": self.patch_size,
            **extra,
        }


def content(image: str) -> str:
    """The Jinja of a message's content list: `image` for an image item, the text of a text one."""
    return (
        "{% for c in m['content'] %}{% if c['type'] == 'image' %}" + image + "{% elif c['type'] "
        "== 'text' %}{{ c['text'] }}{% endif %}{% endfor %}"
    )


# What every family class sets (its base class may set it for it).
REQUIRED = ("stand_in", "image_processor", "processor", "preset")


class ModelFamily(plugins.Plugin):
    """A VLM architecture: a class with facts and hooks, never instantiated."""

    plugin_kind: ClassVar[str] = "family"
    name: ClassVar[str]  # the architecture config's `model_type`
    # The stand-in tokenizer of rehearsals and tiny twins.
    stand_in: ClassVar[StandIn]
    # transformers' torchvision-free image processor and processor (class names, or dotted
    # names of medvqa.models.processors' classes), and the preprocessor fields the processor
    # itself takes.
    image_processor: ClassVar[str | type]
    processor: ClassVar[str | type]
    processor_fields: ClassVar[tuple[str, ...]] = ()
    # transformers' config and model classes (names) of the family, for a `tiny` that builds
    # its twin through `classes()`.
    model_classes: ClassVar[tuple[str, str]]
    # A chat template for checkpoints that ship none (`model.chat_template: <name>`).
    chat_template: ClassVar[str | None] = None
    # Why an image's keys and values cannot be shared between its questions, or None.
    unshareable: ClassVar[str | None] = None
    # Whether `medvqa.models.flops` counts this family's image FLOPs (else MFU is NaN).
    counts_flops: ClassVar[bool] = False
    # The conf/model preset the tests run this family's tiny twin with.
    preset: ClassVar[str]
    # (hidden size, attention heads, key-value heads) of a shrunk checkpoint's text layers.
    shrunk_text: ClassVar[tuple[int, int, int]] = (64, 4, 2)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        if "name" in cls.__dict__:
            missing = [key for key in REQUIRED if not hasattr(cls, key)]
            missing += [f"{hook}()" for hook in ("image_tokens", "tiny") if _inherited(cls, hook)]
            if missing:
                raise plugins.PluginError(
                    f"model family {cls.__module__}.{cls.__qualname__} lacks {', '.join(missing)}"
                    f" (see {__name__}.ModelFamily)"
                )
        super().__init_subclass__(**kwargs)

    @classmethod
    def image_tokens(
        cls, config: Any, preprocessor: Mapping[str, Any], image_size: ImageSize | None
    ) -> tuple[int, int]:
        """(placeholder tokens, marker tokens) one image of `image_size` becomes (None: the most
        the processor can make), following the family's processor in transformers."""
        raise NotImplementedError

    @classmethod
    def shrink_vision(cls, config: Any, text: Any) -> None:
        """Make `config`'s vision tower two narrow layers (`architectures.shrink`; `text` is its
        text config, already shrunk)."""
        vision = config.vision_config
        vision.hidden_size, vision.intermediate_size = 64, 128
        vision.num_hidden_layers, vision.num_attention_heads = 2, 4

    @classmethod
    def tiny(cls, shape: TinyShape, tokenizer: Any) -> tuple[Any, Any]:
        """(model, processor) of a tiny random twin: the family's classes, module names and
        processor at `shape`, with `tokenizer` (the stand-in's)."""
        raise NotImplementedError

    @classmethod
    def classes(cls) -> tuple[type, type]:
        """(config class, model class) of the family in transformers (`model_classes`)."""
        config_class, model_class = cls.model_classes
        return transformers_class(config_class), transformers_class(model_class)

    @classmethod
    def make_image_processor(cls, **settings: Any) -> Any:
        """The family's image processor (`image_processor`) with these settings."""
        return transformers_class(cls.image_processor)(**settings)

    @classmethod
    def make_processor(cls, image_processor: Any, tokenizer: Any, **fields: Any) -> Any:
        """The family's processor of `image_processor` and `tokenizer`, with the tokenizer's
        chat template and the processor's own `fields`: a tiny twin's and a rehearsal's."""
        return transformers_class(cls.processor)(
            image_processor=image_processor,
            tokenizer=tokenizer,
            chat_template=tokenizer.chat_template,
            **fields,
        )


def transformers_class(name_or_class: str | type) -> type:
    """A class a family names: transformers' class of that name, the class a dotted name
    names (`medvqa.models.processors.<class>`: imported only when a rehearsal builds one, so
    that finding the families imports no model code), or the class itself."""
    if isinstance(name_or_class, str):
        module, _, name = name_or_class.rpartition(".")
        import importlib

        return getattr(importlib.import_module(module or "transformers"), name)
    return name_or_class


def _inherited(cls: type, hook: str) -> bool:
    return getattr(cls, hook).__func__ is getattr(ModelFamily, hook).__func__


class UnknownFamilyError(ValueError):
    """No family is registered for a model_type; the message names the known ones and the fix."""


def family_of(model_type: str, needed_for: str) -> type[ModelFamily]:
    """The family of `model_type`; the error says what needed it and how to add one."""
    known = plugins.registered("family")
    if model_type not in known:
        raise UnknownFamilyError(
            f"no model family {model_type!r} for {needed_for} (known: {', '.join(known)}); add a "
            f"ModelFamily module to {__package__} (docs/extending.md#a-model)"
        )
    return known[model_type]


def family_of_config(config: Any) -> type[ModelFamily] | None:
    """The family of a model config (its `model_type`), or None where none is registered."""
    return families().get(str(getattr(config, "model_type", "")))


def families() -> dict[str, type[ModelFamily]]:
    """Every registered family by model_type."""
    return plugins.registered("family")


__all__ = [
    "ImageSize",
    "ModelFamily",
    "StandIn",
    "TinyShape",
    "UnknownFamilyError",
    "content",
    "families",
    "family_of",
    "family_of_config",
    "transformers_class",
]


def family_refusal(config: Any) -> str | None:
    """Why models of `config`'s family cannot share image prefixes (`ModelFamily.unshareable`:
    their image keys and values depend on what follows the image), or None when they can. The
    rule the plan and the run both ask."""
    kind = family_of_config(config)
    return kind.unshareable if kind is not None else None


def config_image_token(config: Any) -> int | None:
    """The token id a checkpoint's config says marks an image (`image_token_id`, or the older
    `image_token_index`), None where it names none: what the plan knows before any processor."""
    for name in ("image_token_id", "image_token_index"):
        value = getattr(config, name, None)
        if value is not None:
            return int(value)
    return None


def sharing_refusal(config: Any, image_token: int | None) -> str | None:
    """Why a model of `config`, whose prompts mark images with `image_token` (None: nothing
    does), cannot share image prefixes, or None when it can. The one rule: the run asks it with
    its processor's token, the plan with the config's (`config_image_token`)."""
    refusal = family_refusal(config)
    if refusal is None and image_token is None:
        refusal = "its processor names no image token"
    return refusal
