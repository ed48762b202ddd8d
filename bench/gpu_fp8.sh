#!/usr/bin/env bash
# FP8 rollout weights (issue 23 part 1) on one Hopper GPU, in one call.
#
# Usage (repository root, GPU machine):  bash bench/gpu_fp8.sh [bench] [tests]      (default: bench)
#   bench  `relm bench rollout` at the Qwen2.5-1.5B shape, batch 256, 256 + 256 tokens, native engine,
#          bf16 weights then FP8 ones (`--quantization none fp8`) in one process on the same random
#          model: new tok/s, decode tok/s, the fp8/bf16 ratio, each row's logprob gap to the model's
#          own forward and how many products ran with 128x128 blocks or per channel     (< 90 s)
#   tests  the gpu-marked FP8 tests: torch._scaled_mm against the CPU path and a bf16 product at the
#          1.5B gate/up shape, and the fp8 engine with CUDA graphs on the tiny hd64 model   (~30 s)
# Results: fp8_rollout.json (the rows), one .log per step and summary.md under $OUT (else bench/results).
# Env overrides (a CPU try in about a minute):
#   DEVICE=cpu FP8_MODEL=zoo:tiny/qwen2-hd64 FP8_BATCH=8 FP8_PROMPT=16 FP8_RESPONSE=16 bash bench/gpu_fp8.sh
# FP8_LIMIT (80) and FP8_TEST_LIMIT (60) are the steps' time limits in seconds.
set -u
PARTS=" ${*:-bench} "
has() { [[ "$PARTS" == *" $1 "* ]]; }
RESULTS="${OUT:-bench/results}"
mkdir -p "$RESULTS"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export RELM_CACHE="${RELM_CACHE:-/tmp/relm-cache}"
PY="${PYTHON:-python3}"
STEP_FILTER="tok/s|native|logprob gap|fp8|Warning|warning|error|Error|passed|failed|skipped"
STEP_TAIL=20
source "$(dirname "$0")/lib.sh"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'available', torch.cuda.is_available()); print('transformers', transformers.__version__)" || exit 1
if has bench; then
  step fp8_rollout "${FP8_LIMIT:-80}" "$PY" -m relm.bench.rollout --model "${FP8_MODEL:-zoo:Qwen/Qwen2.5-1.5B}" \
    --batch "${FP8_BATCH:-256}" --prompt-len "${FP8_PROMPT:-256}" --response-len "${FP8_RESPONSE:-256}" \
    --device "${DEVICE:-auto}" --quantization none fp8 --json "$RESULTS/fp8_rollout.json"
fi
if has tests && ! "$PY" -c "import pytest" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"  # as gpu_rollout.sh: pytest's wheels carried in .whl/
fi
if has tests; then
  step fp8_gpu_tests "${FP8_TEST_LIMIT:-60}" "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/unit/test_fp8_rollout.py
fi
summary
if [ -f "$RESULTS/fp8_rollout.json" ]; then
  "$PY" - "$RESULTS/fp8_rollout.json" <<'PY' | tee "$RESULTS/summary.md"
import json, sys
from relm.bench.rollout import TABLE_HEADER, markdown_row
rows = json.load(open(sys.argv[1]))
print(TABLE_HEADER)
for row in rows:
    print(markdown_row(row))
for row in rows:
    print(f"{row.get('quantization') or row['dtype']}: logprob gap max {row['logprob_gap_max']:.4f}, "
          f"mean {row['logprob_gap_mean']:.5f}; {row.get('fp8_products') or 'no fp8 products'}")
PY
fi
