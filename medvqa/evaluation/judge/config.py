"""The `judge` config node: every key with its default, declared once (`JudgeConfig`; the Hydra
schema in `medvqa.config` is generated from it), and the checks a node passes before a backend
is built from it.

Light on purpose: `medvqa.config` imports it, so it loads neither a backend nor the engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from medvqa.evaluation.judge.errors import JudgeConfigError
from medvqa.evaluation.judge.keys import DEFAULT_KEY_ENV, check_api_key_env

__all__ = [
    "BACKENDS",
    "CONFIG_KEYS",
    "MODES",
    "JudgeConfig",
    "JudgeConfigError",
    "judge_config",
]

MODES = ("generate", "logits")
BACKENDS = ("hf", "openai")


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

    def __post_init__(self) -> None:
        # Every way to build a judge goes through here: a key pasted as api_key_env stops it
        # before a request is sent (runs refuse it earlier: medvqa.config.check_judge_config).
        check_api_key_env(self.api_key_env)


CONFIG_KEYS = tuple(f.name for f in fields(JudgeConfig))


def judge_config(cfg: Mapping[str, Any] | JudgeConfig) -> JudgeConfig:
    """A `judge` config node (see conf/judge/default.yaml) as a `JudgeConfig`; a key it does not
    know (e.g. a misspelled `retires`) raises `JudgeConfigError` instead of being ignored."""
    if isinstance(cfg, JudgeConfig):
        return cfg
    unknown = sorted(set(cfg) - set(CONFIG_KEYS) - {"_target_"})
    if unknown:
        raise JudgeConfigError(f"unknown judge config key(s) {unknown}; known: {CONFIG_KEYS}")
    return JudgeConfig(**{k: v for k, v in cfg.items() if k != "_target_"})
