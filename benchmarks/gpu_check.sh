#!/bin/bash
# `make gpu-check`: one SURE job at LLaVA-Med-7B shape on one GPU, without the hub, then DeepSpeed
# ZeRO-2 full fine-tuning with a resume. A random-weight checkpoint of the real architecture
# (benchmarks/random_checkpoint.py) runs the study's defaults end to end (the plan's check on this
# GPU, loading, zero-shot answers, 16 optimiser steps, generation, scoring on 256 + 256 test rows);
# then a small LLaVA of the same processor trains 6 steps under ZeRO-2, and again to step 9 from
# its last checkpoint. Writes summary.txt (stage exit codes and seconds), smi.csv (GPU memory
# twice a second), each stage's output and run, and the per-phase tables (the runs' own
# perf/... and plan/... metrics) to $GPU_CHECK_OUT. About 5 minutes on an H200.
# Run from the project root with the project importable and its gpu extra installed.
set -u
PY=${PYTHON:-python3}
OUT=${GPU_CHECK_OUT:-$PWD/logs/gpu-check}
CK=${CKPT_DIR:-/dev/shm}  # ~15 GB for the 7B checkpoint
mkdir -p "$OUT"
S=$OUT/summary.txt
: >"$S"
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export MEDVQA_CACHE=${MEDVQA_CACHE:-$OUT/cache}
SECONDS=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >>"$S"
$PY -c "import torch, transformers, peft, lightning, deepspeed; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'lightning', lightning.__version__, 'deepspeed', deepspeed.__version__)" >>"$S" 2>&1
nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader -lms 500 >"$OUT/smi.csv" &
SMI=$!
trap 'kill $SMI 2>/dev/null' EXIT
FAILED=0
stage() { # name seconds command...
  local name=$1 t=$2 s0=$SECONDS rc
  shift 2
  timeout "$t" "$@" >"$OUT/$name.out" 2>&1
  rc=$?
  echo "$name rc=$rc $((SECONDS - s0))s (at ${SECONDS}s)" >>"$S"
  [ $rc -eq 0 ] || { FAILED=1; tail -n 20 "$OUT/$name.out" >>"$S"; }
}
RUN="$PY run.py +experiment=synthetic_modality logger=csv trainer.enable_progress_bar=false"
stage ckpt7b 150 $PY benchmarks/random_checkpoint.py "$CK/llavamed-random"
stage job7b 400 $RUN study=sure_vqa trainer=gpu model.pretrained="$CK/llavamed-random" \
  trainer.max_steps=16 data.limit.test_iid=256 data.limit.test_ood=256 hydra.run.dir="$OUT/job7b"
rm -rf "$CK/llavamed-random"
stage ckptsmall 60 $PY benchmarks/random_checkpoint.py "$CK/llava-small-random" --small
ZERO2="trainer=deepspeed_zero2 trainer.devices=1 model=llava_med model.pretrained=$CK/llava-small-random
  peft=full data.batch_size=8 data.limit.test_iid=64 data.limit.test_ood=64
  callbacks.model_checkpoint.every_n_train_steps=3 hydra.run.dir=$OUT/zero2"
stage zero2 150 $RUN $ZERO2 trainer.max_steps=6
cp "$OUT/zero2/results.json" "$OUT/zero2_first_results.json" 2>/dev/null
stage zero2_resume 150 $RUN $ZERO2 trainer.max_steps=9 ckpt_path=last force=true
rm -rf "$CK/llava-small-random"
echo "done ${SECONDS}s" >>"$S"
$PY benchmarks/gpu_check_table.py "$OUT"/job7b/results.json "$OUT"/zero2_first_results.json \
  "$OUT"/zero2/results.json >"$OUT/tables.md" 2>>"$S"
cat "$S" "$OUT/tables.md"
exit $FAILED
