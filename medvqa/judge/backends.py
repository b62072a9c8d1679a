"""Where the LLM judge's answers come from: `build_backend` turns a `judge` config node into a
local causal LM (`hf`, backend_hf.py) or a client of any OpenAI-compatible server (`openai`,
backend_openai.py); what they share is in base.py, the node's keys and defaults in config.py.

The factory is the one place a config's values reach a backend, so the backends declare no
defaults of their own for the keys `JudgeConfig` has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from medvqa.judge.backend_hf import HFBackend
from medvqa.judge.backend_openai import OpenAIBackend
from medvqa.judge.base import JudgeBackend
from medvqa.judge.config import BACKENDS, JudgeConfig, JudgeConfigError, judge_config

__all__ = ["build_backend"]


def build_backend(cfg: Mapping[str, Any] | JudgeConfig) -> JudgeBackend:
    """The backend a `judge` config group describes (see conf/judge/default.yaml)."""
    c = judge_config(cfg)
    common = {
        "mode": c.mode,
        "batch_size": int(c.batch_size),
        "concurrency": int(c.concurrency),
        "max_new_tokens": int(c.max_new_tokens),
    }
    if c.backend == "openai":
        # One request per chunk: each judgment is stored the moment its request returns.
        common["batch_size"] = 1
        return OpenAIBackend(
            **common,
            model=c.model or "",
            base_url=c.base_url,
            api_key_env=c.api_key_env,
            timeout=float(c.timeout),
            retries=int(c.retries),
            backoff=float(c.backoff),
            structured=bool(c.structured),
        )
    if c.backend == "hf":
        # One model instance cannot run two batches at once usefully on CPU.
        common["concurrency"] = 1
        return HFBackend(
            **common, model=c.model, cache_dir=c.cache_dir, device=c.device, dtype=c.dtype
        )
    raise JudgeConfigError(f"judge.backend={c.backend!r} is not one of {BACKENDS}")
