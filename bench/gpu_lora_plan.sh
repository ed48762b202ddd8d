#!/usr/bin/env bash
# One short GPU call (about a minute) for issue 19's plan accuracy: the Qwen2.5-7B shape with LoRA rank 64,
# a warm-up step and one measured step on a small batch. The run's GPU peak is the moment the engine's bf16 copy is made from the
# fp32 actor (2 (4P + 4T) = 57.94 GiB planned; 58.76 GiB measured at bench/gpu_lora.sh's larger batch), which
# no batch size changes, so a small batch confirms it. Prints the plan ("start-up peak ...") and the line
# "memory after the first step: GPU peak ... measured, ... planned"; output in $RESULTS/q7_lora64_plan.log.
# Usage (repository root, GPU machine, PYTHONPATH with relm, omegaconf and hydra-core): bash bench/gpu_lora_plan.sh
set -u
RESULTS="${OUT:-bench/results}"
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1 RELM_CACHE="${RELM_CACHE:-/tmp/relm-cache}"
PY="${PYTHON:-python3}"
STEP_FILTER="memory plan|start-up peak|planned|LoRA adapters|step 1|error:|Error"
STEP_TAIL=12
source "$(dirname "$0")/lib.sh"
step q7_lora64_plan 85 "$PY" -m relm.cli bench step --steps 1 --prompts 4 --n 2 --prompt-len 64 \
  --response-len 32 --algo grpo --model "${Q7:-zoo:Qwen/Qwen2.5-7B-Instruct}" \
  actor_rollout_ref.model.lora_rank=64 actor_rollout_ref.model.lora_alpha=32
summary
