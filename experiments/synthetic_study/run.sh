#!/usr/bin/env bash
# The whole synthetic study on CPU: four methods x two shifts x three seeds, the baselines,
# then the report. Usage: bash experiments/synthetic_study/run.sh [OUT_DIR] [extra overrides]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-logs/synthetic_study}
shift || true
PY=${PYTHON:-.venv/bin/python}
start=$(date +%s)
$PY run.py -m sweep=synthetic_study logger=csv hydra.sweep.dir="$OUT/methods" "$@"
$PY run.py -m sweep=synthetic_baselines logger=csv hydra.sweep.dir="$OUT/baselines" "$@"
$PY -m medvqa.cli.report "$OUT/methods" "$OUT/baselines" --out "$OUT/report"
echo "synthetic study: $(( $(date +%s) - start )) s; report: $OUT/report/report.html"
