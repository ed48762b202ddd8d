#!/usr/bin/env bash
# One GPU call for the memory plan: 7B and 9B shapes train GRPO and PPO (critic of the same shape) on one
# H200 with default settings; each prints its plan, step times and peak GPU memory (and the host's peak
# resident memory where /usr/bin/time exists). Four runs of a warm-up step and one measured step, each
# killed at its limit (120-170 s, 570 s together; the first run also compiles every piece on a fresh machine),
# so the call ends within about 9.5 minutes whatever happens.
# Usage (repository root, GPU machine, PYTHONPATH with relm and omegaconf): bash bench/gpu_plan.sh
set -u
RESULTS="${OUT:-bench/results}"
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1 RELM_CACHE="${RELM_CACHE:-/tmp/relm-cache}"
PY="${PYTHON:-python3}"
STEP_FILTER="memory plan|micro-batches|waiting on|trained weights|moments|to fit one GPU|error:|step [0-9]|perf/|timing_s/|host max RSS"
STEP_TAIL=26
source "$(dirname "$0")/lib.sh"
TIMED=()
[ -x /usr/bin/time ] && TIMED=(/usr/bin/time -f "host max RSS %M KiB")
B=(${TIMED[@]+"${TIMED[@]}"} "$PY" -m relm.cli bench step --steps 1 --prompts 16 --n 4 --prompt-len 256 --response-len 256)
Q7="${Q7:-zoo:Qwen/Qwen2.5-7B-Instruct}"  # overridable for a dry run of the script on tiny models
G9="${G9:-zoo:google/gemma-2-9b-it}"
step q7_grpo 170 "${B[@]}" --model $Q7 --algo grpo --json "$RESULTS/q7_grpo.json"
step q7_ppo 140 "${B[@]}" --model $Q7 --algo ppo --json "$RESULTS/q7_ppo.json"
step g9_grpo 140 "${B[@]}" --model $G9 --algo grpo --json "$RESULTS/g9_grpo.json"
step g9_ppo 120 "${B[@]}" --model $G9 --algo ppo --json "$RESULTS/g9_ppo.json"
summary
