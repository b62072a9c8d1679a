"""The LLM judge's machinery, one job per module (the metric families that use it live in
`medvqa.evaluation.families.judge` and `.aspect_judge`; docs/judge.md):

* `rubrics`: what the judge model reads, versioned by content hash;
* `replies`: reading its replies into scores (`Judgment`);
* `backends`: where replies come from (`hf` local model, `openai`-compatible server);
* `keys`: which API key goes to which server, and keeping keys out of configs and records;
* `cache`: the SQLite store of judgments;
* `engine`: the one engine that joins them (shortcut, cache, batching, counters);
* `selfcheck`: items with known verdicts every judge answers before its scores are trusted.
"""

from medvqa.evaluation.judge.backends import (
    CONFIG_KEYS,
    HFBackend,
    JudgeBackend,
    JudgeConfig,
    JudgeConfigError,
    JudgeRequest,
    OpenAIBackend,
    Reply,
    build_backend,
)
from medvqa.evaluation.judge.cache import CACHE_FILE, JudgeCache, cache_from_config
from medvqa.evaluation.judge.engine import SHORTCUT_REASON, JudgeEngine, JudgeItem, as_text
from medvqa.evaluation.judge.replies import Judgment, parse_judgment
from medvqa.evaluation.judge.rubrics import (
    ASKED_CLASS,
    CLASS_RUBRIC,
    INPUT_KEYS,
    RUBRICS,
    Rubric,
    build_messages,
    select_rubric,
)
from medvqa.evaluation.judge.selfcheck import SELFCHECK_ID, SelfCheck, run_selfcheck

__all__ = [
    "ASKED_CLASS",
    "CACHE_FILE",
    "CLASS_RUBRIC",
    "CONFIG_KEYS",
    "INPUT_KEYS",
    "RUBRICS",
    "SELFCHECK_ID",
    "SHORTCUT_REASON",
    "HFBackend",
    "JudgeBackend",
    "JudgeCache",
    "JudgeConfig",
    "JudgeConfigError",
    "JudgeEngine",
    "JudgeItem",
    "JudgeRequest",
    "Judgment",
    "OpenAIBackend",
    "Reply",
    "Rubric",
    "SelfCheck",
    "as_text",
    "build_backend",
    "build_messages",
    "cache_from_config",
    "parse_judgment",
    "run_selfcheck",
    "select_rubric",
]
