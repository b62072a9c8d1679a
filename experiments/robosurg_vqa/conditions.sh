#!/usr/bin/env bash
# RoboSurg-VQA's wording conditions from a finished canonical run's own weights (no retraining):
# the held-out paraphrase and the wrong question, each `task=eval` of the run with
# `dataset.test_wording=...`, written under <run>/<wording>/. The run's own overrides (Hydra's
# .hydra/overrides.yaml) are repeated, so the conditions ask the same test questions (same
# data, shift, limits, metrics); the model, method and seed come from its results.json. Then it
# prints the medvqa-report command that pairs every condition with the run.
#   bash experiments/robosurg_vqa/conditions.sh <finished canonical run dir> [more overrides]
set -euo pipefail
RUN=${1:?give the directory of a finished canonical RoboSurg-VQA run (its results.json)}
RUN=$(cd "$RUN" && pwd)  # before leaving the caller's directory
shift
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python}
LIST=$("$PYTHON" - "$RUN" <<'PY'
import json
import sys
from pathlib import Path

import yaml

run = Path(sys.argv[1])
record = json.loads((run / "results.json").read_text())
dataset = record.get("config", {}).get("dataset", {})
problem = None
if record.get("status") not in ("finished", "incomplete"):
    problem = f"the run is {record.get('status')!r}; only a finished run has weights to evaluate"
elif "test_wording" not in dataset:
    problem = "its dataset has no test_wording option; it is not a RoboSurg-VQA run"
elif dataset["test_wording"] != "canonical":
    problem = f"it was tested with test_wording={dataset['test_wording']}, not the canonical one"
if problem:
    sys.exit(f"conditions.sh: {run}: {problem}.")
# What the run was composed with, less what task=eval takes from the run or this script sets.
dropped = ("task=", "hydra.", "eval.", "dataset.test_wording=", "seed=", "peft=", "model=")
overrides = run / ".hydra" / "overrides.yaml"
if overrides.is_file():
    for item in yaml.safe_load(overrides.read_text()) or []:
        if not str(item).lstrip("+~").startswith(dropped):
            print(item)
else:  # no Hydra record (hydra.output_subdir=null): the experiment, the rest from the caller
    print(f"conditions.sh: {overrides} not found; repeat the run's overrides", file=sys.stderr)
    if record.get("choices", {}).get("experiment"):
        print(f"+experiment={record['choices']['experiment']}")
PY
)
OVERRIDES=()
if [[ -n $LIST ]]; then mapfile -t OVERRIDES <<<"$LIST"; fi
for wording in heldout_paraphrase wrong_question; do
    "$PYTHON" run.py task=eval "eval.from_run=$RUN" "dataset.test_wording=$wording" \
        ${OVERRIDES[@]+"${OVERRIDES[@]}"} "hydra.run.dir=$RUN/$wording" "$@"
done
echo "Conditions written under $RUN. Report (add the baselines' run directories, same seed):"
echo "  medvqa-report $RUN <baseline run dirs> --out <report dir>"
