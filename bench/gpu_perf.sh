#!/usr/bin/env bash
# One-call GPU measurement for the training-side and rollout figures in docs/benchmarks.md.
# Usage (repository root, GPU machine, PYTHONPATH with relm and omegaconf): bash bench/gpu_perf.sh
# Results: JSON files and logs under $OUT (or bench/results/).
set -u
RESULTS="${OUT:-bench/results}"
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1 RELM_CACHE="${RELM_CACHE:-/tmp/relm-cache}"
PY="${PYTHON:-python3}"
run() {  # run NAME SECONDS COMMAND...
  local name="$1" limit="$2"; shift 2
  echo; echo "=== $name"
  local start=$SECONDS
  timeout --signal=KILL "$limit" "$@" > "$RESULTS/$name.log" 2>&1
  local rc=$?
  grep -v -i -E "warn|^\s*$" "$RESULTS/$name.log" | tail -n 4
  echo "--- $name: rc=$rc in $((SECONDS - start))s"
}
run gpu_tests 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/unit/test_native_engine.py \
  tests/unit/test_varlen_attention.py tests/unit/test_fused_layers.py
U="$PY -m relm.bench.update --model zoo:Qwen/Qwen2.5-1.5B --rows 64 --prompt-len 256 --response-len 1024"
run update_packed_compiled 120 $U --json "$RESULTS/update_packed_compiled.json"
run update_packed_eager 120 $U --no-compile --json "$RESULTS/update_packed_eager.json"
run update_padded_compiled 120 $U --padded --max-tokens 20480 --json "$RESULTS/update_padded_compiled.json"
R="$PY -m relm.bench.rollout --prompt-len 256 --response-len 256"
run r_q15_b256 150 $R --model zoo:Qwen/Qwen2.5-1.5B --batch 256 --engine both --json "$RESULTS/r_q15_b256.json"
run r_q15_b64 90 $R --model zoo:Qwen/Qwen2.5-1.5B --batch 64 --engine both --json "$RESULTS/r_q15_b64.json"
run r_q15_b1024 90 $R --model zoo:Qwen/Qwen2.5-1.5B --batch 1024 --json "$RESULTS/r_q15_b1024.json"
run r_q3_b256 60 $R --model zoo:Qwen/Qwen2.5-3B-Instruct --batch 256 --json "$RESULTS/r_q3_b256.json"
run r_q7_b256 90 $R --model zoo:Qwen/Qwen2.5-7B-Instruct --batch 256 --gpu-memory-utilization 0.5 \
  --json "$RESULTS/r_q7_b256.json"
run r_g2_b256 60 $R --model zoo:google/gemma-2-2b-it --batch 256 --json "$RESULTS/r_g2_b256.json"
