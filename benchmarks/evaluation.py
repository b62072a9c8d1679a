"""Evaluation costs: token metrics, bootstrap, and the embedded judge (batched, cached).

Not a test. Figures:
- traditional metrics over 20,000 predictions;
- one case-clustered bootstrap (B=2000) over 20,000 questions in 4,000 cases;
- the text family (ROUGE, chrF++, BLEU-4, METEOR with WordNet) and Kvasir-VQA-x1's challenge
  scorer (`kvasir_official`) over 1,500 predictions (the Medico public validation subset's size);
- SmolLM2 judge (hf backend, logits mode) items/s at batch 8 vs one at a time, with the shared
  rubric prefix run once from its key/value cache and without (every prompt in full);
- judge calls when the same items are scored again with the cache (must be 0).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from medvqa.config import JudgeSchema  # noqa: E402
from medvqa.judge.backends import build_backend  # noqa: E402
from medvqa.judge.cache import JudgeCache  # noqa: E402
from medvqa.scoring.metrics.judge import JudgeMetric  # noqa: E402
from medvqa.scoring.metrics.kvasir_official import KvasirOfficial  # noqa: E402
from medvqa.scoring.metrics.text import TextMetric  # noqa: E402
from medvqa.scoring.metrics.traditional import TraditionalMetric  # noqa: E402
from medvqa.scoring.pipeline import score_frame  # noqa: E402
from medvqa.statistics.bootstrap import cluster_bootstrap  # noqa: E402

WORDS = ("left right lung liver kidney mass cyst small large ct mri x-ray axial chest head").split()  # noqa: SIM905


def predictions(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    closed = rng.random(n) < 0.5

    def phrase() -> str:
        return " ".join(rng.choice(WORDS, size=int(rng.integers(1, 6))))

    answers = [("yes" if rng.random() < 0.5 else "no") if c else phrase() for c in closed]
    preds = [
        ("no" if a == "yes" else "yes") if c else phrase()
        for a, c in zip(answers, closed, strict=True)
    ]
    return pd.DataFrame(
        {
            "id": [f"q{i}" for i in range(n)],
            "question": [f"question {i % 97}?" for i in range(n)],
            "answer": answers,
            "prediction": preds,
            "answer_type": np.where(closed, "closed", "open"),
            "candidates": [["yes", "no"] if c else None for c in closed],
            "case_id": [f"c{i // 5}" for i in range(n)],
        }
    )


def judge(batch_size: int, judgments: Path | None, share_prefix: bool = True) -> JudgeMetric:
    """The default (SmolLM2, logits) judge; `judgments`: a judgment cache dir, or none."""
    models = Path(os.environ.get("MEDVQA_CACHE", ROOT / ".cache")) / "judge"
    backend = build_backend(
        dataclasses.asdict(JudgeSchema(cache_dir=str(models), batch_size=batch_size))
    )
    backend.share_prefix = share_prefix
    return JudgeMetric(backend, JudgeCache(judgments) if judgments is not None else None)


def main() -> None:
    rows = []
    preds = predictions(20_000)
    start = time.perf_counter()
    score_frame(preds, [TraditionalMetric()])
    rows.append(("traditional metrics, 20,000 predictions", f"{time.perf_counter() - start:.2f} s"))

    cache = os.environ.get("MEDVQA_CACHE", str(ROOT / ".cache"))
    open_preds = predictions(3_000, seed=3).query("answer_type == 'open'").head(1_500)
    for name, family in (
        ("text metrics", TextMetric(cache_dir=cache)),
        ("kvasir_official", KvasirOfficial(cache_dir=cache)),
    ):
        family.per_sample(open_preds.head(2))  # WordNet restored once, NLTK loaded
        start = time.perf_counter()
        score_frame(open_preds, [family])
        rows.append((f"{name}, 1,500 open predictions", f"{time.perf_counter() - start:.2f} s"))

    values = (np.random.default_rng(1).random(20_000) < 0.7).astype(float)
    clusters = np.arange(20_000) // 5
    start = time.perf_counter()
    cluster_bootstrap(values, clusters, B=2000, seed=42)
    rows.append(
        ("bootstrap B=2000, 20,000 questions / 4,000 cases", f"{time.perf_counter() - start:.2f} s")
    )

    items = predictions(32, seed=2)
    judge(8, None).per_sample(items.head(2))  # load (and on first use convert) the model
    rates = {}
    for share in (False, True):
        for batch in (8, 1):
            metric = judge(batch, None, share_prefix=share)
            metric.per_sample(items.head(1))  # warm-up (and, shared, the prefix's cache)
            start = time.perf_counter()
            metric.per_sample(items)
            rates[share, batch] = len(items) / (time.perf_counter() - start)
            how = "shared rubric prefix" if share else "full prompts"
            rows.append(
                (
                    f"SmolLM2 judge (logits), batch {batch}, {how}",
                    f"{rates[share, batch]:.1f} items/s",
                )
            )
    rows.append(
        ("judge batched / one at a time (shared prefix)", f"{rates[True, 8] / rates[True, 1]:.2f}x")
    )
    best_before = max(rates[False, 8], rates[False, 1])
    rows.append(
        ("judge, shared prefix batch 8 / best without", f"{rates[True, 8] / best_before:.2f}x")
    )

    with tempfile.TemporaryDirectory() as tmp:
        first = judge(8, Path(tmp))
        first.per_sample(items)
        second = judge(8, Path(tmp))
        second.per_sample(items)
        counts = second.counters()
        rows.append(
            (
                "judge calls when re-scoring the same 32 items",
                f"{counts['judge/calls']} calls, {counts['judge/cache_hits']} cache hits",
            )
        )

    table = Table(title="evaluation costs (2 CPU cores)")
    table.add_column("what")
    table.add_column("figure", justify="right")
    for row in rows:
        table.add_row(*row)
    Console().print(table)


if __name__ == "__main__":
    main()
