"""Which API key the judge sends to which server, and keeping keys out of configs and records.

`judge.base_url` can name any server (vLLM on a shared node, a third-party proxy), so a key is
sent only where it belongs:

* the key in `OPENAI_API_KEY` (the default `judge.api_key_env`) goes to OpenAI's API only,
  recognised by the URL's host name exactly (`api.openai.com.evil.example` is not it);
* any other server gets the key in the variable the user named for it
  (`judge.api_key_env=VLLM_KEY`), or, with none named, a placeholder (local servers ignore it).

`judge.api_key_env` holds a variable's *name*. A key pasted there by mistake would be written
to results.json, Hydra's files and W&B with the rest of the config, so `check_api_key_env`
refuses it (without repeating it), and `redact_secrets` scrubs one that reaches a record anyway.
`RefuseKeysInConfig`, a Hydra callback, refuses it before Hydra itself writes anything (its
`.hydra/` files and a multirun's folder names hold the overrides).
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any
from urllib.parse import urlsplit

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from medvqa.judge.errors import JudgeConfigError
from medvqa.redaction import (
    ENV_NAME,
    KEY_PREFIXES,
    KEY_PREFIXES_UPPER,
    REDACTED,
    looks_like_secret,
    redact_secrets,
)

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_KEY_ENV",
    "LOCAL_KEY",
    "OPENAI_HOST",
    "OPENAI_URL",
    "REDACTED",
    "RefuseKeysInConfig",
    "api_key_for",
    "check_api_key_env",
    "check_composed",
    "is_openai",
    "looks_like_secret",
    "redact_secrets",
]

OPENAI_HOST = "api.openai.com"
OPENAI_URL = f"https://{OPENAI_HOST}/v1"
DEFAULT_KEY_ENV = "OPENAI_API_KEY"
# A placeholder key for servers that take none (vLLM, llama.cpp, TGI); the client refuses an
# empty one.
LOCAL_KEY = "EMPTY"


def is_openai(base_url: str | None) -> bool:
    """Whether `base_url` is OpenAI's API (None: the client's default, which is): its host
    name compared exactly, so neither `api.openai.com.evil.example` nor a path containing
    `api.openai.com` counts."""
    if base_url is None:
        return True
    return urlsplit(base_url.strip()).hostname == OPENAI_HOST  # hostname is lower-cased


def _described(value: str) -> str:
    """What the error may say about a refused value: its length and a known key prefix, never
    the value (the error goes to logs and to the record of a failed run)."""
    prefix = next(
        (p for p in (*KEY_PREFIXES, *KEY_PREFIXES_UPPER) if value.strip().startswith(p)), None
    )
    start = f" (starting {prefix!r})" if prefix else ""
    return f"a {len(value)}-character value{start}"


def check_api_key_env(value: Any, setting: str = "judge.api_key_env") -> None:
    """Refuse an `api_key_env` (`setting`: which one, for the message) that is not an
    environment variable's name, or that looks like a key pasted in its place. None or ""
    (no key) passes."""
    if value is None or value == "":
        return
    if not isinstance(value, str):
        raise JudgeConfigError(
            f"{setting} must be the name of an environment variable, got a "
            f"{type(value).__name__}; e.g. {setting}=VLLM_KEY"
        )
    if looks_like_secret(value):
        problem = "looks like an API key"
    elif not ENV_NAME.fullmatch(value):
        problem = "is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*, no '$')"
    else:
        return
    raise JudgeConfigError(
        f"{setting} holds {_described(value)} that {problem}. It takes the *name* of the "
        "variable that holds the server's key, never the key: `export VLLM_KEY=...` and "
        f"pass {setting}=VLLM_KEY (a long name mixing cases and digits looks like a "
        "key: rename it, e.g. in UPPER_SNAKE_CASE). "
        "If a key was pasted on a command line, remove it from the shell history and consider "
        "rotating it."
    )


def api_key_for(base_url: str | None, api_key_env: str | None) -> tuple[str | None, str]:
    """(the key to send to `base_url`, or None for the placeholder; where it comes from, for
    the logs: the variable's name, never its value). OpenAI's API needs a key, so a missing
    one raises `JudgeConfigError`."""
    check_api_key_env(api_key_env)
    openai = is_openai(base_url)
    where = base_url or OPENAI_URL
    if api_key_env == DEFAULT_KEY_ENV and not openai:
        return None, (
            f"no key (a placeholder): ${DEFAULT_KEY_ENV} is sent only to {OPENAI_HOST}, and "
            f"{where} is not it; if the server needs a key, put it in a variable of its own "
            "and name it with judge.api_key_env=<VAR>"
        )
    value = os.environ.get(api_key_env) if api_key_env else None
    if value:
        return value, f"the key in ${api_key_env}"
    if openai:
        raise JudgeConfigError(
            f"judge.backend=openai against {where} needs an API key in the environment "
            f"variable {api_key_env or DEFAULT_KEY_ENV!r} (judge.api_key_env names it); "
            "export it before the run."
        )
    unset = f" (${api_key_env} is unset or empty)" if api_key_env else ""
    return None, f"no key (a placeholder){unset}"


class RefuseKeysInConfig(Callback):
    """Hydra callback (`hydra.callbacks`): refuse a key pasted as `judge.api_key_env` when a
    run or multirun starts, before Hydra creates its output folder or writes the overrides.
    A multirun's swept values are checked for anything that looks like a key; each job's own
    value is checked in full when it runs (`medvqa.config.check_judge_config`).

    Hydra turns an exception in a callback into a warning and carries on, so the refusal is
    an exit (status 1, the message on stderr), as for a config Hydra cannot compose."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _exit_on_key(config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _exit_on_key(config)


def _exit_on_key(config: DictConfig) -> None:
    try:
        check_composed(config)
    except JudgeConfigError as err:
        raise SystemExit(f"Error in the config: {err}") from err


def check_composed(config: DictConfig) -> None:
    """`check_api_key_env` on a composed config's `judge.api_key_env`, and on each value its
    command-line overrides give that key (a multirun's config does not hold swept values)."""
    check_api_key_env(OmegaConf.select(config, "judge.api_key_env"))  # None: no judge node
    served = "model.served.api_key_env"  # model=served's key, as the judge's
    check_api_key_env(OmegaConf.select(config, served, default=None), served)
    for juror in OmegaConf.select(config, "judge.jury") or []:  # None: no judge node
        if "api_key_env" in juror:  # a juror without one inherits the node's, checked above
            check_api_key_env(juror["api_key_env"])
    overrides = OmegaConf.select(config, "hydra.overrides.task", default=None) or []
    for override in overrides:
        key, _, value = str(override).partition("=")
        # A juror's variable is a value inside `judge.jury=[{name:a,api_key_env:VAR}]`.
        if not key.lstrip("+~").endswith("api_key_env") and "api_key_env" not in value:
            continue
        # A sweep (`A,B`, `choice(A,B)`) lists names; any part that looks like a key refuses.
        parts = re.split(r"[,()\[\]{}:\s]+", value)
        for part in (p.strip("'\"") for p in parts):
            if part and looks_like_secret(part):
                check_api_key_env(part)  # raises, without repeating the value
