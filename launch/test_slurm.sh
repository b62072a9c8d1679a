#!/usr/bin/env bash
# `make test-slurm`: the main job through `hydra/launcher=slurm` on a real (one-node) SLURM cluster.
#
#   1. a two-job multirun (seed=0,1) of the debug main job: both results.json must say "finished";
#   2. requeue: a longer job with the study's settings (study=sure_vqa: ckpt_path=last, last.ckpt
#      every N optimiser steps) is signalled mid-epoch as if preempted (USR2, as SLURM does before
#      a time limit); submitit requeues it and the second attempt must resume from last.ckpt at
#      the step it saved (that epoch's next batch, not step 0 nor the epoch's start) and finish
#      with the full number of steps;
#   3. ranks: a job of two tasks (trainer.devices=2, DDP over gloo) is two ranks of one run: one
#      finished results.json, complete predictions without duplicates, no shard left, and each
#      rank's own log (run.log, run_rank1.log).
#
# Root on Debian/Ubuntu (launch/slurm_cluster.sh installs slurm-wlm + munge if missing). The
# daemons this script started are stopped on exit, pass or fail; a cluster that was already
# running is used and left running. Outputs are kept under $WORK when a check fails.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-.venv/bin/python}"
CLUSTER=launch/slurm_cluster.sh
# The test node has no GPUs (trainer=cpu asks for none) and may have 2 CPUs: small jobs, two at
# a time.
NODE=(hydra.launcher.cpus_per_task=1 hydra.launcher.mem_gb=4 hydra.launcher.timeout_min=10)
# The debug main job on a tiny model and dataset that build in seconds (cached in MEDVQA_CACHE,
# default .cache/): this checks the launcher, not the model.
JOB=(debug=smoke logger=csv "task.references=[]" model=tiny dataset.n_cases=60
    model.builder.pretrain.data.n_cases=30 model.builder.pretrain.epochs=1
    model.builder.pretrain.progress_bar=false)
# Check 2: epochs of 24 steps (96 rows, batch 4), a step checkpoint every 5 (never an epoch's end).
REQUEUE_EPOCHS=3
REQUEUE_STEPS_PER_EPOCH=24
REQUEUE_EVERY=5

say() { echo "[test_slurm $(date +%T)] $*" >&2; }
fail() {
    say "FAIL: $*"
    exit 1
}

[[ -x "$PY" ]] || fail "$PY not found: run \`make install\` first (or set PYTHON=...)"
"$PY" -c "import hydra_plugins.hydra_submitit_launcher" 2>/dev/null \
    || fail "hydra-submitit-launcher is missing: $PY -m pip install -e '.[slurm]'"

WORK=$(mktemp -d /tmp/medvqa-test-slurm.XXXXXX)
STARTED=0
cleanup() {
    local rc=$?
    # A killed launcher leaves its jobs queued: cancel this script's jobs (ids = folder names).
    local jobs
    jobs=$(find "$WORK" -path '*/.submitit/*' -maxdepth 3 -type d -printf '%f\n' 2>/dev/null | grep -v _ || true)
    if [[ -n "$jobs" ]]; then
        # shellcheck disable=SC2086
        scancel $jobs 2>/dev/null || true
    fi
    if [[ $STARTED -eq 1 ]]; then
        "$CLUSTER" stop || rc=1
    fi
    if [[ $rc -eq 0 ]]; then
        rm -rf "$WORK"
    else
        say "outputs kept in $WORK (sbatch logs: $WORK/*/.submitit/*/)"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if "$CLUSTER" status 2>/dev/null; then
    say "using the running test cluster (left running)"
else
    STARTED=1
fi
"$CLUSTER" start
eval "$("$CLUSTER" env)"
export WANDB_MODE=offline WANDB_SILENT=true

# Status of the one results.json under a sweep dir whose config has the given seed.
status_of() {
    "$PY" - "$1" "$2" <<'EOF'
import json, sys
from pathlib import Path
sweep, seed = Path(sys.argv[1]), int(sys.argv[2])
found = [json.loads(p.read_text()) for p in sweep.rglob("results.json")]
found = [r for r in found if r.get("seed") == seed]
print(found[0]["status"] if len(found) == 1 else f"{len(found)} results.json for seed={seed}")
EOF
}

# --- 1. two jobs, one array ----------------------------------------------------------------
say "1/3: multirun seed=0,1 through hydra/launcher=slurm"
SWEEP="$WORK/multirun"
timeout 240 "$PY" run.py -m hydra/launcher=slurm "${NODE[@]}" "${JOB[@]}" seed=0,1 \
    "hydra.sweep.dir=$SWEEP" >"$WORK/multirun.log" 2>&1 \
    || { tail -30 "$WORK/multirun.log" >&2; fail "the multirun exited non-zero (log: $WORK/multirun.log)"; }
for seed in 0 1; do
    st=$(status_of "$SWEEP" "$seed")
    [[ "$st" == finished ]] || fail "seed=$seed: status '$st', expected 'finished' (under $SWEEP)"
    say "seed=$seed finished"
done

# --- 2. preempted mid-epoch, requeued, resumed -------------------------------------------------
say "2/3: a job preempted mid-epoch is requeued and resumes from its last step checkpoint"
SWEEP="$WORK/requeue"
# The study's checkpointing (conf/study/sure_vqa.yaml: ckpt_path=last, last.ckpt every N steps
# and when training ends), on the debug job: ckpt_path is not passed here, the study sets it.
timeout 300 "$PY" run.py -m hydra/launcher=slurm "${NODE[@]}" study=sure_vqa "${JOB[@]}" seed=0 \
    "data.limit.train=$((REQUEUE_STEPS_PER_EPOCH * 4))" trainer.max_steps=-1 \
    "trainer.max_epochs=$REQUEUE_EPOCHS" \
    "callbacks.model_checkpoint.every_n_train_steps=$REQUEUE_EVERY" \
    "hydra.sweep.dir=$SWEEP" >"$WORK/requeue.log" 2>&1 &
SWEEP_PID=$!
ckpt=""
for _ in $(seq 240); do
    ckpt=$(find "$SWEEP" -path '*/checkpoints/last.ckpt' 2>/dev/null | head -1 || true)
    [[ -n "$ckpt" ]] && break
    kill -0 "$SWEEP_PID" 2>/dev/null || break
    sleep 0.5
done
[[ -n "$ckpt" ]] || { kill "$SWEEP_PID" 2>/dev/null || true; fail "no last.ckpt appeared (log: $WORK/requeue.log)"; }
# submitit names the job's folder after its id (hydra.launcher.submitit_folder).
job=$(find "$SWEEP/.submitit" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | head -1 || true)
[[ -n "$job" && -n "$(squeue -h -j "$job" 2>/dev/null)" ]] || { kill "$SWEEP_PID" 2>/dev/null || true; fail "the job ended before it could be preempted: raise REQUEUE_EPOCHS"; }
# What SLURM sends signal_delay_s before a time limit or on preemption; submitit requeues.
scancel --signal=USR2 "$job"
for _ in $(seq 60); do
    [[ "$(squeue -h -j "$job" -o %t 2>/dev/null)" == PD ]] && break
    sleep 0.5
done
# While the job is held: the step, epoch and batch of the last.ckpt it will resume from.
read -r at_step at_epoch at_batch < <("$PY" - "$ckpt" <<'EOF'
import sys, torch
ckpt = torch.load(sys.argv[1], map_location="cpu", weights_only=False)
loader = ckpt["VQADataModule"]["train_loader"]
print(ckpt["global_step"], loader["epoch"], loader["batches"])
EOF
) || fail "could not read $ckpt"
# SLURM holds a requeued job for ~2 min (BeginTime); a test need not wait for that.
scontrol update JobId="$job" StartTime=now || true
wait "$SWEEP_PID" || { tail -30 "$WORK/requeue.log" >&2; fail "the requeued multirun exited non-zero"; }
st=$(status_of "$SWEEP" 0)
[[ "$st" == finished ]] || fail "requeued job: status '$st', expected 'finished'"
logs=("$SWEEP"/.submitit/"$job"*/*_log.*)
grep -q "Requeued job $job" "${logs[@]}" || fail "submitit did not requeue job $job (logs: ${logs[*]})"
# The first attempt recorded its end (`interrupted`, at its step) before submitit's exit.
grep -q "interrupted (SystemExit(-1)) at {'stage'" "${logs[@]}" \
    || fail "the preempted attempt did not record that it was interrupted (logs: ${logs[*]})"
grep -q "Restored all states from the checkpoint at .*last.ckpt" "${logs[@]}" \
    || fail "the requeued job did not resume from last.ckpt (logs: ${logs[*]})"
[[ "$at_step" -gt 0 && "$at_batch" -gt 0 && "$at_batch" -lt "$REQUEUE_STEPS_PER_EPOCH" ]] \
    || fail "last.ckpt was at step $at_step (epoch $at_epoch, batch $at_batch): not mid-epoch"
[[ "$at_step" -eq $((at_epoch * REQUEUE_STEPS_PER_EPOCH + at_batch)) ]] \
    || fail "last.ckpt: step $at_step is not epoch $at_epoch, batch $at_batch"
grep -q "resuming epoch $at_epoch at batch $at_batch of $REQUEUE_STEPS_PER_EPOCH" "${logs[@]}" \
    || fail "the second attempt did not go on at epoch $at_epoch, batch $at_batch (${logs[*]})"
steps=$("$PY" -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["metrics"]["train/global_step"]))' \
    "$(dirname "$(dirname "$ckpt")")/results.json")
[[ "$steps" -eq $((REQUEUE_EPOCHS * REQUEUE_STEPS_PER_EPOCH)) ]] \
    || fail "finished at step $steps, expected $((REQUEUE_EPOCHS * REQUEUE_STEPS_PER_EPOCH))"
say "job $job: preempted after step $at_step (epoch $at_epoch, batch $at_batch), requeued," \
    "resumed there, finished at step $steps"

# --- 3. one job, two tasks = two ranks ----------------------------------------------------------
say "3/3: two tasks of one job are two ranks; rank 0 writes"
SWEEP="$WORK/ranks"
timeout 300 "$PY" run.py -m hydra/launcher=slurm "${NODE[@]}" "${JOB[@]}" seed=0 \
    trainer.devices=2 trainer.strategy=ddp "hydra.sweep.dir=$SWEEP" >"$WORK/ranks.log" 2>&1 \
    || { tail -30 "$WORK/ranks.log" >&2; fail "the two-task job exited non-zero (log: $WORK/ranks.log)"; }
"$PY" - "$SWEEP" <<'EOF' || fail "two ranks: see above (outputs: $SWEEP)"
import json, sys
from pathlib import Path
records = list(Path(sys.argv[1]).rglob("results.json"))
assert len(records) == 1, f"{len(records)} results.json, expected 1"
job = records[0].parent
record = json.loads(records[0].read_text())
assert record["status"] == "finished", record["status"]
rows = [json.loads(l) for l in (job / "predictions.jsonl").read_text().splitlines() if l.strip()]
keys = [(r["split"], r["id"]) for r in rows]
n = record["metrics"]["test_iid/n"] + record["metrics"]["test_ood/n"]
assert len(keys) == len(set(keys)) == n, (len(keys), len(set(keys)), n)
assert not list(job.glob("*.rank*")), "shards left"
EOF
grep -q "global rank 1: running the task" "$SWEEP"/.submitit/*/*_log.* \
    || fail "no second rank ran (logs: $SWEEP/.submitit/)"
run_dir=$(dirname "$(find "$SWEEP" -name results.json | head -1)")
grep -q "global rank 1: running the task" "$run_dir/run_rank1.log" \
    || fail "rank 1 did not log to its own file ($run_dir/run_rank1.log)"
if grep -q "global rank 1" "$run_dir/run.log"; then fail "rank 1 wrote into rank 0's run.log"; fi
say "two ranks, one record, predictions complete, one log per rank"
say "PASS"
