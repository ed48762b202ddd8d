#!/usr/bin/env bash
# One-call GPU check of the native rollout engine: the CUDA tests, then `relm bench rollout` runs.
#
# Usage (repository root, on the GPU machine):  bash bench/gpu_rollout.sh PART [PART ...]
#   tests     the tests marked gpu of the native engine, fused projections and decode attention (~4 min)
#   kernels   decode attention per layer (bench/decode_attention_bench.py) and the decode products one
#             by one (bench/decode_gemms.py)                                                   (~1 min)
#   headline  Qwen2.5-1.5B shape, 256+256: batch 256 and 64 with native and hf, 1024 native    (~3 min)
#   shapes    batch 256 at the 0.5B, 3B, 7B (memory share 0.5), Llama-3.2-3B, Gemma-2-2b shapes (~4 min)
#   cbatch    continuous batching: 512 prompts of 256 + up to 512 tokens with eos active (mean ~125):
#             all rows at once, 128 slots refilled, 4 lock-step waves of 128               (~2 min)
#   variants  the 1.5B batch-256 row with q/k/v and gate/up unfused, fused + max-autotune, and a
#             decode profile                                                                (~4 min)
#   quick = tests headline; full = tests kernels headline shapes
# Results: one JSON file per bench run and summary.md under $OUT (or bench/results/ when unset).
# Every step runs under its own time limit; a failing step is reported and the next one still runs.
set -u
PARTS=" ${*:-quick} "
PARTS="${PARTS// quick / tests headline }"
PARTS="${PARTS// full / tests kernels headline shapes }"
has() { [[ "$PARTS" == *" $1 "* ]]; }
RESULTS="${OUT:-bench/results}"
mkdir -p "$RESULTS"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export RELM_CACHE="${RELM_CACHE:-/tmp/relm-cache}"
PY="${PYTHON:-python3}"
source "$(dirname "$0")/lib.sh"

bench() {  # bench NAME SECONDS ARGS...
  local name="$1" limit="$2"; shift 2
  step "$name" "$limit" "$PY" -m relm.bench.rollout "$@" --json "$RESULTS/$name.json"
}

echo "=== environment ==="
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "no nvidia-smi"
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'available', torch.cuda.is_available()); print('transformers', transformers.__version__)" || exit 1
if ! "$PY" -c "import pytest" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi

GPU_TESTS=(tests/unit/test_decode_attention.py tests/unit/test_fused_projections.py tests/unit/test_native_engine.py)
if has tests; then
  if "$PY" -c "import pytest" 2>/dev/null; then
    step gpu_tests 240 "$PY" -m pytest -q -p no:cacheprovider -m gpu "${GPU_TESTS[@]}"
  else
    STATUS+=("gpu_tests: skipped (no pytest; carry its wheels in .whl)")
  fi
fi
SHAPE=(--prompt-len 256 --response-len 256)
QWEN15=(--model zoo:Qwen/Qwen2.5-1.5B "${SHAPE[@]}")
if has kernels; then
  [ -f bench/decode_attention_bench.py ] && step decode_attention 60 "$PY" bench/decode_attention_bench.py
  step decode_gemms 60 "$PY" bench/decode_gemms.py --rows 64 256 1024
fi
if has headline; then
  bench qwen1.5b_b256 150 "${QWEN15[@]}" --batch 256 --engine both
  bench qwen1.5b_b64 90 "${QWEN15[@]}" --batch 64 --engine both
  bench qwen1.5b_b1024 90 "${QWEN15[@]}" --batch 1024
fi
if has shapes; then
  bench qwen0.5b_b256 60 --model zoo:Qwen/Qwen2.5-0.5B --batch 256 "${SHAPE[@]}"
  bench qwen3b_b256 60 --model zoo:Qwen/Qwen2.5-3B-Instruct --batch 256 "${SHAPE[@]}"
  bench qwen7b_b256 90 --model zoo:Qwen/Qwen2.5-7B-Instruct --batch 256 "${SHAPE[@]}" --gpu-memory-utilization 0.5
  bench llama3b_b256 60 --model zoo:meta-llama/Llama-3.2-3B-Instruct --batch 256 "${SHAPE[@]}"
  bench gemma2b_b256 60 --model zoo:google/gemma-2-2b-it --batch 256 "${SHAPE[@]}"
fi
if has cbatch; then
  EOS=(--model zoo:Qwen/Qwen2.5-1.5B --batch 512 --prompt-len 256 --response-len 512 --eos-rate 0.008)
  bench qwen1.5b_eos_all_rows 90 "${EOS[@]}"
  bench qwen1.5b_eos_128_slots 90 "${EOS[@]}" --max-num-seqs 128
  bench qwen1.5b_eos_waves_128 90 "${EOS[@]}" --max-num-seqs 128 --waves
fi
if has variants; then
  bench qwen1.5b_b256_unfused 100 "${QWEN15[@]}" --batch 256 --no-fused-projections
  bench qwen1.5b_b256_autotune 140 "${QWEN15[@]}" --batch 256 --compile-mode max-autotune-no-cudagraphs
  step profile 80 "$PY" bench/profile_native_decode.py --rows 25
  step profile_prefill 60 "$PY" bench/profile_native_decode.py --prefill --rows 20
fi

summary
"$PY" - "$RESULTS" <<'EOF' | tee "$RESULTS/summary.md"
import json, sys
from pathlib import Path
from relm.bench.rollout import TABLE_HEADER, markdown_row
rows = [row for f in sorted(Path(sys.argv[1]).glob("*.json")) for row in json.loads(f.read_text())]
print(TABLE_HEADER)
for row in rows:
    print(markdown_row(row))
EOF
