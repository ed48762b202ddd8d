#!/usr/bin/env bash
# One GPU call for the memory plan: large shapes train with default settings, or are refused in one line.
# Usage (repository root, GPU machine, PYTHONPATH with relm and omegaconf): bash bench/gpu_plan.sh
set -u
RESULTS="${OUT:-bench/results}"
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1 RELM_CACHE="${RELM_CACHE:-/tmp/relm-cache}"
PY="${PYTHON:-python3}"
STEP_FILTER="memory plan|micro-batches|waiting on|moments|error:|step [0-9]|perf/|timing_s/step"
source "$(dirname "$0")/lib.sh"
B="$PY -m relm.cli bench step --steps 1 --prompts 16 --n 4 --prompt-len 256 --response-len 256"
step q7_grpo 200 $B --model zoo:Qwen/Qwen2.5-7B-Instruct --algo grpo --json "$RESULTS/q7_grpo.json"
step q7_ppo 60 $B --model zoo:Qwen/Qwen2.5-7B-Instruct --algo ppo --json "$RESULTS/q7_ppo.json"
step g9_grpo 60 $B --model zoo:google/gemma-2-9b-it --algo grpo --json "$RESULTS/g9_grpo.json"
summary
