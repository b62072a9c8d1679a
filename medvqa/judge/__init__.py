"""The LLM judge's machinery, one job per module (the metric families that use it live in
`medvqa.scoring.metrics.judge` and `.aspect_judge`; docs/judge.md):

* `config`: the `judge` config node (`JudgeConfig`: every key with its default);
* `rubrics`: what the judge model reads, versioned by content hash;
* `replies`: reading its replies into scores (`Judgment`);
* `base`: what every backend shares (requests, replies, the `JudgeBackend` base class);
* `backend_hf`, `backend_openai`: where replies come from (a local model embedded through
  transformers, an OpenAI-compatible server); `backends.build_backend` picks one from a config;
* `keys`: which API key goes to which server, and keeping keys out of configs and records;
* `cache`: the SQLite store of judgments;
* `engine`: the one engine that joins them (shortcut, cache, batching, counters);
* `selfcheck`: items with known verdicts every judge answers before its scores are trusted.

Nothing is re-exported here: importing one module (e.g. `config`, which `medvqa.config` needs)
loads only what that module imports, not the engine or a backend.
"""
