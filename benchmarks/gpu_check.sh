#!/bin/bash
# `make gpu-check`: one SURE job at LLaVA-Med-7B shape on one GPU, without the hub, then DeepSpeed
# ZeRO-2 full fine-tuning with a resume. A rehearsal (model=llava_med model.random_weights=true:
# the real architecture with seeded random weights drawn on the GPU, a stand-in tokenizer) runs
# the study's defaults end to end (the plan's check on this GPU, loading, zero-shot answers, 16
# optimiser steps, generation, scoring on 256 + 256 test rows); then the same architecture shrunk
# (model.random_weights=shrunk) trains 6 steps under ZeRO-2, and again to step 9 from its last
# checkpoint (the dry run: 2, then 3); then benchmarks/gpu.py's headline row. Writes summary.txt (stage exit codes and seconds), smi.csv
# (GPU memory twice a second), each stage's output and run, and the per-phase tables (the runs'
# own perf/... and plan/... metrics) to $GPU_CHECK_OUT. 486 s on an H100 (2026-11-28).
# Run from the project root with the project importable and its gpu extra installed.
# --cpu: a dry run of the same stages on this machine (shrunk for both, float32, a few steps,
# DeepSpeed's CPU test strategy): it checks the script, its figures mean nothing
# (tests/test_gpu_check.py, `make test-slow`).
set -u
CPU=0
[ "${1:-}" = "--cpu" ] && CPU=1
PY=${PYTHON:-python3}
OUT=${GPU_CHECK_OUT:-$PWD/logs/gpu-check}
mkdir -p "$OUT"
S=$OUT/summary.txt
: >"$S"
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export MEDVQA_CACHE=${MEDVQA_CACHE:-$OUT/cache}
SECONDS=0
if [ $CPU = 1 ]; then
  echo "cpu dry run: a script check, no figures" >>"$S"
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >>"$S"
fi
$PY -c "import torch, transformers, peft, lightning, deepspeed; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'lightning', lightning.__version__, 'deepspeed', deepspeed.__version__)" >>"$S" 2>&1
SMI=
if [ $CPU = 0 ]; then
  nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader -lms 500 >"$OUT/smi.csv" &
  SMI=$!
fi
trap '[ -n "$SMI" ] && kill $SMI 2>/dev/null' EXIT
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
# The dry run: the shrunk architecture for the job too, trainer=cpu in float32, a few rows and steps;
# ZeRO-2 through DeepSpeed's CPU test strategy. T scales the stages' time limits.
if [ $CPU = 1 ]; then
  BIG=shrunk T=3 TEST_ROWS=4 STEPS=(2 3) ZERO2_BATCH=2 EVERY=1 PROFILE_START=0 PROFILE_STEPS=1
  HEADLINE=(--cpu --setups none-8 --warmup 1 --steps 1)
  JOB=(trainer=cpu model.dtype=float32 trainer.max_steps=2 data.batch_size=4 data.eval_batch_size=8 data.limit.val=4)
  ZERO2_ON=(trainer.precision=bf16-mixed data.limit.val=4
    "trainer.strategy={_target_: tests.zero2_cpu.CPUZero2Strategy, exclude_frozen_parameters: true}")
else
  BIG=true T=1 TEST_ROWS=64 STEPS=(6 9) ZERO2_BATCH=8 EVERY=3 PROFILE_START=45 PROFILE_STEPS=3
  HEADLINE=(--setups none-8-compile --warmup 10 --steps 8 --gen-batch 256 --gen-cases
    gen-dynamic-11q gen-static-11q gen-static-merged-11q gen-static-merged-1q
    gen-static-merged-11q-100tok peft.adapter.r=128)
  # 100 optimiser steps: the fit's steady rate is over the second half, 50 steps
  JOB=(trainer=gpu trainer.max_steps=100 data.limit.test_iid=256 data.limit.test_ood=256)
  ZERO2_ON=(trainer=deepspeed_zero2 trainer.devices=1)
fi
[ $CPU = 1 ] && JOB+=(data.limit.test_iid=$TEST_ROWS data.limit.test_ood=$TEST_ROWS)
# The study's own SLAKE LoRA job (conf/hparams/sure_vqa/slake_lora.yaml: rank 128, lr 3e-5) on
# rows shaped like SLAKE's (11 questions per image).
# It profiles 3 optimiser steps once the compiled layers are warm, before the steady window
# (medvqa.training.profiling: job7b/profile/summary.md, perf/profile/...).
stage job7b $((600 * T)) $RUN study=sure_vqa hparams=sure_vqa/slake_lora \
  dataset.questions_per_image=11 model=llava_med model.random_weights=$BIG "${JOB[@]}" \
  +callbacks.step_profile._target_=medvqa.training.profiling.StepProfile \
  +callbacks.step_profile.start=$PROFILE_START +callbacks.step_profile.steps=$PROFILE_STEPS \
  hydra.run.dir="$OUT/job7b"
ZERO2="model=llava_med model.random_weights=shrunk
  peft=full data.batch_size=$ZERO2_BATCH data.limit.test_iid=$TEST_ROWS data.limit.test_ood=$TEST_ROWS
  callbacks.model_checkpoint.every_n_train_steps=$EVERY hydra.run.dir=$OUT/zero2"
stage zero2 $((150 * T)) $RUN $ZERO2 trainer.max_steps=${STEPS[0]} "${ZERO2_ON[@]}"
cp "$OUT/zero2/results.json" "$OUT/zero2_first_results.json" 2>/dev/null
stage zero2_resume $((150 * T)) $RUN $ZERO2 trainer.max_steps=${STEPS[1]} ckpt_path=last force=true \
  "${ZERO2_ON[@]}"
# The benchmark's headline row (benchmarks/gpu.py): LoRA on LLaVA-Med 7B, 8 x 2, no
# checkpointing, compiled layers, and generation unmerged and merged, beside the job's own rates.
stage headline $((420 * T)) $PY benchmarks/gpu.py --models llava_med --methods lora --no-mimic \
  "${HEADLINE[@]}" --out "$OUT/gpu_rows.jsonl"
echo "done ${SECONDS}s" >>"$S"
$PY benchmarks/gpu_check_table.py "$OUT"/job7b/results.json "$OUT"/zero2_first_results.json \
  "$OUT"/zero2/results.json >"$OUT/tables.md" 2>>"$S"
cat "$OUT/job7b/profile/summary.md" >>"$OUT/tables.md" 2>/dev/null
tail -n 30 "$OUT/headline.out" >>"$OUT/tables.md" 2>/dev/null
cat "$S" "$OUT/tables.md"
exit $FAILED
