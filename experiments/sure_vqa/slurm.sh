#!/usr/bin/env bash
# SURE-VQA's study on a SLURM cluster: one array job per sweep, resources from
# conf/hydra/launcher/slurm.yaml (edit partition, GPUs, memory, time there or override here).
# Jobs longer than the time limit (MIMIC: 13-15 h) are requeued and resume where they stopped,
# mid-epoch included: the study sets ckpt_path=last and writes last.ckpt every 250 steps
# (conf/study/sure_vqa.yaml). Run this script in tmux/screen or a small CPU job: the sweep
# process waits for the array; launched again with the same hydra.sweep.dir=..., it skips
# finished jobs and resumes the others.
set -euo pipefail
cd "$(dirname "$0")/../.."
# The study selects LLaVA-Med (conf/study/sure_vqa.yaml); the full fine-tuning sweep its own
# trainer (DeepSpeed ZeRO-2, 4 GPUs per job), the others one GPU each.
LAUNCH=(hydra/launcher=slurm hydra.launcher.partition="${PARTITION:-gpu}")
JUDGE=(judge.backend=openai judge.base_url="${JUDGE_URL:?set JUDGE_URL to the judge server}"
    judge.model=mistralai/Mistral-7B-Instruct-v0.2 judge.mode=generate)
python run.py -m sweep=sure_study trainer=gpu "${LAUNCH[@]}" "${JUDGE[@]}"
python run.py -m sweep=sure_study_full "${LAUNCH[@]}" "${JUDGE[@]}"
python run.py -m sweep=sure_baselines trainer=gpu "${LAUNCH[@]}" "${JUDGE[@]}"
# After the study has finished: the blind ablation from its LoRA runs' weights (runs here, in turn).
# bash experiments/sure_vqa/blind.sh logs/multiruns/<sure_study dir> trainer=gpu
