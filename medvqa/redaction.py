"""Keys kept out of what medvqa writes: records, W&B configs, logs.

A key pasted where a name belongs (`judge.api_key_env=sk-...`) would be written with the
resolved config. `looks_like_secret` tells a key from a name; `redact_secrets` scrubs a config
before it is recorded. A leaf module (no medvqa imports): the record writer needs it.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

REDACTED = "<redacted: looked like a secret>"

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Prefixes of common provider keys (OpenAI, Hugging Face, GitHub, GitLab, Slack, AWS, Google).
KEY_PREFIXES = ("sk-", "sk_", "hf_", "ghp_", "gho_", "ghs_", "github_pat_", "glpat-", "xox")
KEY_PREFIXES_UPPER = ("AKIA", "AIza")
# A provider key anywhere in a config, whatever its key is called.
_PROVIDER_KEY = re.compile(
    r"(?:sk-|sk_|hf_|ghp_|gho_|ghs_|github_pat_|glpat-|xox[abprs]-)[A-Za-z0-9_-]{16,}"
)
# Config keys whose values are keys or name one.
_SECRET_KEY_NAMES = ("api_key", "key_env", "token", "secret", "password", "passwd")


def _entropy(text: str) -> float:
    """Shannon entropy in bits per character (random keys: above 4; NAMES_LIKE_THIS: below)."""
    counts = Counter(text)
    return -sum(c / len(text) * math.log2(c / len(text)) for c in counts.values())


def looks_like_secret(value: str) -> bool:
    """Whether `value` looks like a key rather than a name: an OpenAI-style `sk-` start, a
    long value with another provider's prefix, or a long random-looking string (upper and
    lower case and digits mixed, or a long run of letters and digits without word breaks)."""
    text = value.strip()
    if text.startswith("sk-"):
        return True
    if len(text) < 20:
        return False
    if text.startswith(KEY_PREFIXES) or text.startswith(KEY_PREFIXES_UPPER):
        return True
    digits = any(ch.isdigit() for ch in text)
    lower = any(ch.islower() for ch in text)
    upper = any(ch.isupper() for ch in text)
    if digits and lower and upper and _entropy(text) >= 3.5:
        return True
    return len(text) >= 32 and digits and text.isalnum()


def _secret_key_name(key: Any) -> bool:
    name = str(key).lower()
    return any(part in name for part in _SECRET_KEY_NAMES)


def redact_secrets(config: Any) -> Any:
    """A copy of a config (dicts, lists, scalars) in which every value that looks like a key
    is replaced by `REDACTED`: a provider key anywhere, a random-looking string under a key
    named like `api_key_env` or `token`, and an `api_key_env` that is not a variable name.
    Variable names and every other value are kept."""

    def clean(value: Any, key: Any = None) -> Any:
        if isinstance(value, Mapping):
            return {k: clean(v, k) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(v, key) for v in value]
        if not isinstance(value, str) or not value:
            return value
        if _PROVIDER_KEY.search(value):
            return REDACTED
        if key is not None and _secret_key_name(key):
            invalid_name = str(key) == "api_key_env" and not ENV_NAME.fullmatch(value)
            if invalid_name or looks_like_secret(value):
                return REDACTED
        return value

    return clean(config)
