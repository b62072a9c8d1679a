"""The `judge` config node: every key with its default, declared once (`JudgeConfig`; the Hydra
schema in `medvqa.config` is generated from it), and the checks a node passes before a backend
is built from it.

Light on purpose: `medvqa.config` imports it, so it loads neither a backend nor the engine.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from medvqa.judge.errors import JudgeConfigError
from medvqa.judge.keys import DEFAULT_KEY_ENV, check_api_key_env

__all__ = [
    "BACKENDS",
    "CONFIG_KEYS",
    "JUROR_KEYS",
    "JURY_KEYS",
    "JURY_VERDICTS",
    "MODES",
    "JudgeConfig",
    "JudgeConfigError",
    "judge_config",
]

MODES = ("generate", "logits")
BACKENDS = ("hf", "openai")
# How a jury's verdict on an item comes from its jurors' scores (medvqa.judge.jury).
JURY_VERDICTS = ("majority", "median", "mean")
# A juror's name is part of column and metric names (`judge_score@strict`), so it may not hold
# the characters those names use as separators ("@", "/", "~", "=").
_JUROR_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


@dataclass(frozen=True)
class JudgeConfig:
    """Every key of the `judge` config node, with its default (the one place they are declared:
    the config schema is generated from this class, and the backends built from it by
    `backends.build_backend` have no defaults of their own for these keys)."""

    backend: str = "hf"  # hf | openai
    # hf: a local dir or hub id (null: SmolLM2 from the GGUF); openai: the served model name.
    model: str | None = None
    base_url: str | None = None  # openai; null: api.openai.com
    # The env var holding the API key, never the key (a key here is refused: keys.py).
    # $OPENAI_API_KEY goes to api.openai.com only; another server gets the variable named
    # here, or a placeholder.
    api_key_env: str | None = DEFAULT_KEY_ENV
    mode: str = "logits"  # generate (parse {"score", "reason"} JSON) | logits (label probs)
    concurrency: int = 8  # openai: requests in flight; hf runs one batch at a time
    timeout: float = 60.0  # openai: seconds per request
    retries: int = 3  # openai: after a timeout, connection error, HTTP 408/429/5xx
    backoff: float = 1.0  # openai: seconds before the first retry, doubled each time
    batch_size: int = 8  # hf: prompts per forward pass / generate call
    max_new_tokens: int = 64  # generate mode (and the openai logits request)
    device: str = "cpu"  # hf
    dtype: str = "float32"  # hf
    cache_dir: str | None = None  # the judgment cache (and the converted SmolLM2)
    # Before scoring, the judge answers items with known verdicts (judge/selfcheck.py); below
    # these floors its scores are marked unreliable in results.json, the summary and the report.
    # openai, generate mode: constrain replies to the rubric's JSON with an allowed score
    # (`response_format` json_schema), unless the server rejects it.
    structured: bool = True
    selfcheck: bool = True
    selfcheck_min_closed_acc: float = 0.8
    selfcheck_min_open_tau: float = 0.5
    # A jury (docs/judge.md#a-jury-of-judges): each entry is one juror, its `name` and the keys
    # of this node it changes (backend, model, base_url, mode, ...); every other key is this
    # node's. Empty: one judge, this node.
    jury: tuple[Mapping[str, Any], ...] = ()
    # The jury's verdict on an item from its jurors' scores (one of JURY_VERDICTS): closed
    # items by majority, open 1-5 items by the median; a juror that failed the item leaves it
    # without a verdict.
    jury_closed: str = "majority"
    jury_open: str = "median"

    def __post_init__(self) -> None:
        # Every way to build a judge goes through here: a key pasted as api_key_env stops it
        # before a request is sent (runs refuse it earlier: medvqa.config.check_judge_config).
        check_api_key_env(self.api_key_env)
        object.__setattr__(self, "jury", tuple(dict(j) for j in self.jury or ()))
        for key in ("jury_closed", "jury_open"):
            if getattr(self, key) not in JURY_VERDICTS:
                raise JudgeConfigError(
                    f"judge.{key}={getattr(self, key)!r} is not one of {JURY_VERDICTS}"
                )
        if self.jury:
            self.jurors()  # a juror that cannot be built is refused now, naming it

    def jurors(self) -> dict[str, JudgeConfig]:
        """Each juror's whole judge config, by name: this node with the juror's keys applied
        (empty without a jury). Refuses a jury of one, a juror without a usable name or with
        a key the node does not know, and two jurors of the same name."""
        if not self.jury:
            return {}
        if len(self.jury) < 2:
            raise JudgeConfigError(
                "judge.jury lists one juror; a jury needs two or more (one judge is the judge "
                "node itself: set its keys and leave judge.jury=[])"
            )
        out: dict[str, JudgeConfig] = {}
        for i, entry in enumerate(self.jury):
            name = str(entry.get("name", ""))
            where = f"judge.jury[{i}]"
            if not _JUROR_NAME.fullmatch(name):
                raise JudgeConfigError(
                    f"{where} needs a `name` of letters, digits, '_' or '-' (it names the "
                    f"juror's columns and scores, e.g. judge_score@strict), got {name!r}"
                )
            if name in out:
                raise JudgeConfigError(f"{where}: two jurors are named {name!r}; rename one")
            unknown = sorted(set(entry) - set(JUROR_KEYS) - {"name"})
            if unknown:
                raise JudgeConfigError(
                    f"{where} ({name}): unknown key(s) {unknown}; a juror sets keys of the "
                    f"judge node: {JUROR_KEYS}"
                )
            settings = {k: v for k, v in entry.items() if k != "name"}
            try:
                out[name] = replace(self, jury=(), **settings)
            except (TypeError, ValueError) as err:
                raise JudgeConfigError(f"{where} ({name}): {err}") from err
        return out


CONFIG_KEYS = tuple(f.name for f in fields(JudgeConfig))
JURY_KEYS = ("jury", "jury_closed", "jury_open")  # the jury's own: no juror sets them
JUROR_KEYS = tuple(k for k in CONFIG_KEYS if k not in JURY_KEYS)


def judge_config(cfg: Mapping[str, Any] | JudgeConfig) -> JudgeConfig:
    """A `judge` config node (see conf/judge/default.yaml) as a `JudgeConfig`; a key it does not
    know (e.g. a misspelled `retires`) raises `JudgeConfigError` instead of being ignored."""
    if isinstance(cfg, JudgeConfig):
        return cfg
    unknown = sorted(set(cfg) - set(CONFIG_KEYS) - {"_target_"})
    if unknown:
        raise JudgeConfigError(f"unknown judge config key(s) {unknown}; known: {CONFIG_KEYS}")
    return JudgeConfig(**{k: v for k, v in cfg.items() if k != "_target_"})
