"""Content hashes are the same in every process: a set (peft's `target_modules`) hashes by its
items, not by an iteration order that changes with the process's string hashing."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT

SNIPPET = (
    "from medvqa.hashing import Hasher; "
    "print(Hasher().update({'target_modules': {'q_proj', 'k_proj', 'v_proj', 'o_proj', "
    "'gate_proj', 'up_proj', 'down_proj'}, 'r': 16}).hexdigest())"
)


def test_a_set_hashes_the_same_in_every_process() -> None:
    keys = set()
    for seed in ("1", "2", "3", "4"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", SNIPPET], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        keys.add(done.stdout.strip())
    assert len(keys) == 1, keys


def test_a_set_and_its_sorted_list_differ_from_other_items() -> None:
    from medvqa.hashing import content_hash

    assert content_hash({"a", "b"}) == content_hash({"b", "a"}) == content_hash(["a", "b"])
    assert content_hash({"a", "b"}) != content_hash({"a", "c"})
