#!/usr/bin/env bash
# One GPU call for issue 20's budgets and the plan's predicted peaks against the measured ones: the GPU
# tests of the budget (allocator capped, metrics recorded), then `relm bench step` GRPO runs with an H200
# held to smaller cards (24 GB GPU / 32 GB host for Qwen2.5-1.5B, 48/64 and 80/100 for Qwen2.5-7B), each
# printing its plan and "memory after the first step: GPU peak ... measured, ... planned (...); host peak ...".
# About 9 minutes in all; each run is killed at its limit so the call ends whatever happens.
# Usage (repository root, GPU machine, PYTHONPATH with relm and omegaconf): bash bench/gpu_memory.sh
# The compat tables of issue 20 (one call per few models):
#   python -m relm.cli compat --device cuda --max-gpu-memory-gb 80 --max-host-memory-gb 100 zoo:Qwen/Qwen2.5-7B-Instruct ...
#   python -m relm.cli compat --device cuda --max-gpu-memory-gb 24 --max-host-memory-gb 100 zoo:Qwen/Qwen2.5-3B-Instruct ...
set -u
RESULTS="${OUT:-bench/results}"
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1 RELM_CACHE="${RELM_CACHE:-/tmp/relm-cache}"
PY="${PYTHON:-python3}"
STEP_FILTER="memory plan|memory after the first step|does not fit|error:|passed|failed|skipped"
STEP_TAIL=8
source "$(dirname "$0")/lib.sh"
if "$PY" -c "import pytest" 2>/dev/null; then
  step gpu_tests 120 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/integration/test_gpu_memory_budget.py
fi
B=("$PY" -m relm.cli bench step --steps 1 --prompts 16 --n 4 --prompt-len 256 --response-len 256 --algo grpo)
Q15="${Q15:-zoo:Qwen/Qwen2.5-1.5B-Instruct}"  # overridable for a dry run on tiny models
Q7="${Q7:-zoo:Qwen/Qwen2.5-7B-Instruct}"
step q15_24gb 120 "${B[@]}" --model $Q15 --json "$RESULTS/q15_24gb.json" \
  trainer.max_gpu_memory_gb=24 trainer.max_host_memory_gb=32
step q7_48gb 170 "${B[@]}" --model $Q7 --json "$RESULTS/q7_48gb.json" \
  trainer.max_gpu_memory_gb=48 trainer.max_host_memory_gb=64
step q7_80gb 170 "${B[@]}" --model $Q7 --json "$RESULTS/q7_80gb.json" \
  trainer.max_gpu_memory_gb=80 trainer.max_host_memory_gb=100
summary
