#!/usr/bin/env bash
# relm against TRL's GRPOTrainer in the same run: `relm bench step --algo grpo --peer trl` on a GPU.
#
# Usage (repository root, on the GPU machine):  bash bench/gpu_peer.sh [tiny|quick|3b|all]
#   tiny   zoo:tiny/qwen2 on whatever device there is: checks the script itself (a CPU will do)
#   quick  Qwen2.5-0.5B shape, 8 prompts x n=4, 64+64 tokens: a broken set-up shows in about a minute
#   3b     Qwen2.5-3B shape, 64 prompts x n=8, 512+512 tokens, 1 measured step each (the issue's
#          figure); TRL's HF-generate step takes minutes, so TRL warms up with 8-token responses
#   all    quick, then 3b (default)
# TRL and datasets are not installed there and the machine has no network: their wheels travel in
# .whl/trl/ (carry that folder) and go into $SITE (/tmp/site). Results: one JSON per run and its log under
# $OUT (or bench/results/ when unset). Each run has its own time limit; a failing one does not stop the next.
set -u
MODE="${1:-all}"
RESULTS="${OUT:-bench/results}"
mkdir -p "$RESULTS"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
export RELM_CACHE="${RELM_CACHE:-/tmp/relm-cache}"
PY="${PYTHON:-python3}"
SITE="${SITE:-/tmp/site}"
source "$(dirname "$0")/lib.sh"

peer() {  # peer NAME SECONDS ARGS...
  local name="$1" limit="$2"; shift 2
  step "$name" "$limit" "$PY" -m relm.cli bench step --algo grpo --steps 1 --peer trl \
    --json "$RESULTS/$name.json" "$@"
}

echo "=== environment ==="
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "no nvidia-smi"
# relm's own missing dependencies (omegaconf), where a prepared site folder was carried along.
[ -d .gpu_site ] && export PYTHONPATH="$PYTHONPATH:$PWD/.gpu_site"
if ! "$PY" -c "import trl, datasets" 2>/dev/null; then
  ls .whl/trl/*.whl >/dev/null 2>&1 || { echo "TRL is not importable and .whl/trl/ has no wheels: carry .whl/trl"; exit 1; }
  "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" .whl/trl/*.whl || exit 1
  export PYTHONPATH="$PYTHONPATH:$SITE"
fi
"$PY" -c "import torch, transformers, accelerate, datasets, trl; print('torch', torch.__version__, \
'cuda', torch.cuda.is_available(), '| transformers', transformers.__version__, '| accelerate', \
accelerate.__version__, '| datasets', datasets.__version__, '| trl', trl.__version__); \
import relm.bench.peer_trl, relm.config.loader" || exit 1

if [ "$MODE" = "tiny" ]; then
  peer peer_tiny 120 --model zoo:tiny/qwen2 --prompts 4 --n 2 --prompt-len 24 --response-len 8 --micro 4
fi
if [ "$MODE" = "quick" ] || [ "$MODE" = "all" ]; then
  peer peer_quick 240 --model zoo:Qwen/Qwen2.5-0.5B-Instruct --prompts 8 --n 4 --prompt-len 64 --response-len 64
fi
if [ "$MODE" = "3b" ] || [ "$MODE" = "all" ]; then
  peer peer_3b "${PEER_LIMIT:-560}" --model zoo:Qwen/Qwen2.5-3B-Instruct --prompts 64 --n 8 --prompt-len 512 --response-len 512
fi

summary
"$PY" - "$RESULTS" <<'EOF'
import json, sys
from pathlib import Path
for path in sorted(Path(sys.argv[1]).glob("peer_*.json")):
    record = json.loads(path.read_text())
    relm, trl = record["results"]["grpo"], record["results"]["trl"]
    print(
        f"{path.stem}: relm {relm['timing_s/step']:.2f} s/step {relm['perf/throughput']:,.0f} tok/s/GPU, "
        f"TRL {record['peer']['version']} {trl['timing_s/step']:.2f} s/step {trl['perf/throughput']:,.0f} tok/s/GPU, "
        f"ratio x{record['peer']['throughput_ratio']:.2f}, peak GB relm "
        f"{relm.get('perf/max_memory_allocated_gb', float('nan')):.1f} / TRL {trl.get('perf/max_memory_allocated_gb', float('nan')):.1f}"
    )
EOF
