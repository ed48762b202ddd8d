#!/usr/bin/env bash
# One-call GPU measurement of the training side (issue 5): the actor update's MFU and the 3B step against TRL.
#
# Usage (repository root, one GPU; PYTHONPATH with relm and omegaconf): bash bench/gpu_train.sh [update|peer|all]
#   update  `relm bench update` at the Qwen2.5-1.5B shape (64 responses, 256 prompt + 256..1024 response
#           tokens): defaults with a kernel-family profile, then without compiled pieces (~2.5 min)
#   peer    `relm bench step --peer trl` at the Qwen2.5-3B shape, 64 prompts x n=8, 512+512 (~7 min;
#           TRL from the wheels in .whl/trl/, see bench/gpu_peer.sh)
#   all     both (default)
# Results: JSON and logs under $OUT (or bench/results/).
set -u
MODE="${1:-all}"
RESULTS="${OUT:-bench/results}"
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1 RELM_CACHE="${RELM_CACHE:-/tmp/relm-cache}"
PY="${PYTHON:-python3}"
STEP_FILTER="relm bench update|profile|^  |ms  |error|Error|relm bench step|TRL|ratio|throughput"
source "$(dirname "$0")/lib.sh"
if [ "$MODE" = "update" ] || [ "$MODE" = "all" ]; then
  U="$PY -m relm.bench.update --model zoo:Qwen/Qwen2.5-1.5B --rows 64 --prompt-len 256 --response-len 1024"
  step update_default 90 $U --profile --json "$RESULTS/update_default.json"
  step update_eager 60 $U --no-compile --json "$RESULTS/update_eager.json"
fi
if [ "$MODE" = "peer" ] || [ "$MODE" = "all" ]; then
  unset STEP_FILTER
  bash "$(dirname "$0")/gpu_peer.sh" 3b
fi
summary
