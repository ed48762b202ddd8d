#!/usr/bin/env bash
# The seed's question on the card users have, in as few device calls as possible: the whole gpu-marked
# test suite at this commit, then `relm compat` on the seed models under an 80 GB / 100 GB budget and on
# those of 3B or fewer parameters under 24 GB / 32 GB, several budgeted processes side by side on the one
# H200 (bench/gpu_suite.py starts a job only while the running jobs' budgets add up to the machine's).
# Usage (repository root, GPU machine): bash bench/gpu_suite.sh [tests] [suite]   (default: both)
#   SUITE_DEADLINE  seconds the compat suite may take (default 500); models not started are listed
#   SET80, SET24    comma-separated models of each budget (default: all below); a later call passes
#                   the ones an earlier call did not reach
#   B80, B24        the budgets GPU_GB:HOST_GB of each set (default 80:100 and 24:32)
#   DEVICE=cpu GPU_GB=.. HOST_GB=.. B80=.. SET80=zoo:tiny/... for a dry run on a CPU
# Wheels relm needs that the GPU image lacks (omegaconf, hydra-core, antlr4 4.9.3, datasets, dill,
# multiprocess) travel flat in .whl/ (see bench/lib.sh for the pip download line; carry .whl).
set -u
RESULTS="${OUT:-bench/results}"
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1 RELM_CACHE="${RELM_CACHE:-/tmp/relm-cache}"
PY="${PYTHON:-python3}"
if ls .whl/*.whl >/dev/null 2>&1 && ! "$PY" -c "import omegaconf, hydra, datasets" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}/tmp/site"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PARTS="${*:-tests suite}"
{
  date -u +%FT%TZ
  git rev-parse HEAD 2>/dev/null || true
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  "$PY" -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__, torch.cuda.is_available())"
  grep MemTotal /proc/meminfo; nproc
} 2>&1 | tee "$RESULTS/machine.txt"

if [[ " $PARTS " == *" tests "* ]]; then
  echo "=== gpu-marked tests (limit ${TEST_LIMIT:-280}s) ==="
  start=$SECONDS
  PER_TEST=()
  "$PY" -c "import pytest_timeout" 2>/dev/null && PER_TEST=(--timeout 150)
  timeout --signal=KILL "${TEST_LIMIT:-280}" "$PY" -m pytest -q -p no:cacheprovider -m gpu -o addopts="" \
    "${PER_TEST[@]}" -rfEs tests > "$RESULTS/gpu_tests.log" 2>&1
  echo "gpu tests rc=$? in $((SECONDS - start))s"
  grep -E "^(FAILED|ERROR)|passed|failed|error|skipped|deselected" "$RESULTS/gpu_tests.log" | tail -25
fi

Q=zoo:Qwen/Qwen2.5- L=zoo:meta-llama/Llama-3.2- P=zoo:microsoft/Phi-3- G=zoo:google/gemma-2-
# The 80 GB set: the study's 12 (the four largest first: the 7B the host's OOM killer took, Phi-3-medium's
# bf16 gap, the MoE refused last time) and OLMoE.
DEFAULT80="${Q}7B-Instruct,${P}medium-4k-instruct,zoo:Qwen/Qwen1.5-MoE-A2.7B,${G}9b-it"
DEFAULT80+=",zoo:berkeley-nest/Starling-LM-7B-alpha,zoo:allenai/OLMoE-1B-7B-0924,${Q}3B-Instruct"
DEFAULT80+=",${P}mini-4k-instruct,${L}3B-Instruct,${G}2b-it,${Q}1.5B-Instruct,${L}1B-Instruct,${Q}0.5B-Instruct"
DEFAULT24="${Q}3B-Instruct,${P}mini-4k-instruct,${L}3B-Instruct,${G}2b-it,${Q}1.5B-Instruct,${L}1B-Instruct"
DEFAULT24+=",${Q}0.5B-Instruct"
if [[ " $PARTS " == *" suite "* ]]; then
  SETS=()
  [ -n "${SET80-$DEFAULT80}" ] && SETS+=("${B80:-80:100}=${SET80-$DEFAULT80}")
  [ -n "${SET24-$DEFAULT24}" ] && SETS+=("${B24:-24:32}=${SET24-$DEFAULT24}")
  EXTRA=()
  [ -n "${GPU_GB:-}" ] && EXTRA+=(--gpu-gb "$GPU_GB")
  # The single-H200 kind has 128 GiB; Firecracker's MemTotal can read less until memory is touched.
  EXTRA+=(--host-gb "${HOST_GB:-137}")
  "$PY" bench/gpu_suite.py --out "$RESULTS" --device "${DEVICE:-cuda}" --deadline-s "${SUITE_DEADLINE:-500}" \
    "${EXTRA[@]}" "${SETS[@]}"
fi
