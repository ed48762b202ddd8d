#!/usr/bin/env bash
# One GPU call for the memory plan: large shapes train with default settings, or are refused in one line.
# Usage (repository root, GPU machine, PYTHONPATH with relm and omegaconf): bash bench/gpu_plan.sh
set -u
RESULTS="${OUT:-bench/results}"
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1 RELM_CACHE="${RELM_CACHE:-/tmp/relm-cache}"
PY="${PYTHON:-python3}"
run() {  # run NAME SECONDS ARGS...
  local name="$1" limit="$2"; shift 2
  echo; echo "=== $name"
  local start=$SECONDS
  timeout --signal=KILL "$limit" "$PY" -m relm.cli bench step --steps 1 --json "$RESULTS/$name.json" "$@" \
    > "$RESULTS/$name.log" 2>&1
  local rc=$?
  grep -E "memory plan|micro-batches|waiting on|error:|step [0-9]|perf/|timing_s/step|max_memory" "$RESULTS/$name.log" | tail -n 14
  echo "--- $name: rc=$rc in $((SECONDS - start))s"
}
S="--prompts 16 --n 4 --prompt-len 256 --response-len 256"
run q7_grpo 240 --model zoo:Qwen/Qwen2.5-7B-Instruct --algo grpo $S
run q7_ppo 60 --model zoo:Qwen/Qwen2.5-7B-Instruct --algo ppo $S
run g9_grpo 60 --model zoo:google/gemma-2-9b-it --algo grpo $S
