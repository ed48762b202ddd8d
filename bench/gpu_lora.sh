#!/usr/bin/env bash
# One GPU call for issue 19 (LoRA) and issue 20 (budgets): Qwen2.5-7B GRPO with LoRA rank 64 against full
# fine-tuning at the same shape, with defaults, then Qwen2.5-1.5B held to a 24 GB card and the 7B LoRA run
# held to a 48 GB card (with the GPU tests of the budgets first). Each run prints its
# memory plan and "memory after the first step: GPU peak ... measured, ... planned (...)", and writes its
# timings to $RESULTS/NAME.json. About 9 minutes; each run is killed at its limit so the call ends.
# Usage (repository root, GPU machine, PYTHONPATH with relm, omegaconf and hydra-core): bash bench/gpu_lora.sh
set -u
RESULTS="${OUT:-bench/results}"
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1 RELM_CACHE="${RELM_CACHE:-/tmp/relm-cache}"
PY="${PYTHON:-python3}"
STEP_FILTER="memory plan|planned|LoRA adapters|timing_s|perf/|does not fit|error:|Error|passed|failed"
STEP_TAIL=24
source "$(dirname "$0")/lib.sh"
Q7="${Q7:-zoo:Qwen/Qwen2.5-7B-Instruct}"
Q15="${Q15:-zoo:Qwen/Qwen2.5-1.5B-Instruct}"
B=("$PY" -m relm.cli bench step --steps 1 --prompts 16 --n 4 --prompt-len 256 --response-len 256 --algo grpo)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)"
if "$PY" -c "import pytest" 2>/dev/null; then
  step gpu_tests 90 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/integration/test_gpu_memory_budget.py
fi
step q7_lora64 200 "${B[@]}" --model "$Q7" --json "$RESULTS/q7_lora64.json" \
  actor_rollout_ref.model.lora_rank=64 actor_rollout_ref.model.lora_alpha=32
step q7_full 200 "${B[@]}" --model "$Q7" --json "$RESULTS/q7_full.json"
step q15_24gb 110 "${B[@]}" --model "$Q15" --json "$RESULTS/q15_24gb.json" \
  trainer.max_gpu_memory_gb=24 trainer.max_host_memory_gb=32
step q7_lora64_48gb 150 "${B[@]}" --model "$Q7" --json "$RESULTS/q7_lora64_48gb.json" \
  actor_rollout_ref.model.lora_rank=64 actor_rollout_ref.model.lora_alpha=32 \
  trainer.max_gpu_memory_gb=48 trainer.max_host_memory_gb=64
summary
