#!/usr/bin/env bash
# verl's multi-turn GSM8K tool example (examples/verl_multiturn_gsm8k/run_qwen2.5-3b_gsm8k_multiturn.sh) at its
# own sizes on one GPU: 256 prompts x 16 conversations, 1,024 + 1,024 tokens, Qwen2.5-3B's shape (random
# weights, the real Qwen2.5 tokenizer), the real GSM8K rows through `examples/gsm8k_preprocess.py --multiturn
# tool`. Changed: the paths (MODEL_PATH, DATA_DIR, the run folder), trainer.n_gpus_per_node=1 (the machine has
# one GPU; verl's batch sizes are global, so the step computes the same update) and
# trainer.total_training_steps=1 (one step of its 15 epochs). MODE=interaction runs the other example,
# run_qwen2.5-0.5b_gsm8k_multiturn_w_interaction.sh (512 prompts x 8, 1,024 + 3,072 tokens, Qwen2.5-0.5B's shape). The run goes on in its own session so that a
# second call can wait for it past one call's 10 minutes: `bash bench/gpu_verl_multiturn.sh` starts it and
# waits up to WAIT seconds (default 540); `WAIT=500 bash bench/gpu_verl_multiturn.sh --wait` only waits.
# Results: $OUT/run.log (the whole log), $OUT/metrics.jsonl, $OUT/sample.jsonl (the first rollout rows).
# Usage (repository root, GPU machine; GSM8K's jsonl files in .gpudata/gsm8k; PYTHONPATH with relm,
# omegaconf and hydra-core). MODEL and EXTRA (more overrides) are for a smoke test on a CPU.
set -u
RESULTS="${OUT:-bench/results}"
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1 RELM_CACHE="${RELM_CACHE:-/tmp/relm-cache}" HF_HUB_OFFLINE=1
PY="${PYTHON:-python3}"
MODE="${MODE:-tool}"  # tool: the 3B tool example; interaction: the 0.5B example with verl's gsm8k interaction
if [ "$MODE" = tool ]; then
  SCRIPT=run_qwen2.5-3b_gsm8k_multiturn.sh; ZOO=zoo:Qwen/Qwen2.5-3B-Instruct
else
  SCRIPT=run_qwen2.5-0.5b_gsm8k_multiturn_w_interaction.sh; ZOO=zoo:Qwen/Qwen2.5-0.5B-Instruct
fi
WORK=/tmp/verl-multiturn-$MODE
LOG="$WORK/run.log"
if [ "${1:-}" != "--wait" ]; then
  rm -rf "$WORK" && mkdir -p "$WORK"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$WORK/machine.txt"
  "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
    | tee -a "$WORK/machine.txt"
  "$PY" examples/gsm8k_preprocess.py --local_dataset_path .gpudata/gsm8k --local_save_dir "$WORK/data" \
    --multiturn "$MODE" || exit 1
  setsid bash -c "start=\$(date +%s); MODEL_PATH='${MODEL:-$ZOO}' DATA_DIR='$WORK/data' PYTHON='$PY' \
    bash examples/verl_multiturn_gsm8k/$SCRIPT trainer.n_gpus_per_node=1 \
    trainer.total_training_steps=1 trainer.default_local_dir='$WORK/run' \
    trainer.rollout_data_dir='$WORK/run/rollout' ${EXTRA:-} > '$LOG' 2>&1; echo \"exit \$? after \$((\$(date +%s) - start)) s\" > '$WORK/done'" \
    < /dev/null > /dev/null 2>&1 &
fi
waited=0
while [ ! -f "$WORK/done" ] && [ "$waited" -lt "${WAIT:-540}" ]; do
  sleep 10; waited=$((waited + 10))
  [ $((waited % 60)) -eq 0 ] && echo "[$waited s] $(grep -E 'timing_s|step 1|validation|error' "$LOG" | tail -n 1 | cut -c1-200)"
done
cp "$LOG" "$RESULTS/run.log" 2>/dev/null
cp "$WORK/machine.txt" "$RESULTS/" 2>/dev/null
cp "$WORK/run/metrics.jsonl" "$RESULTS/" 2>/dev/null
head -n 32 "$WORK/run/rollout/1.jsonl" > "$RESULTS/sample.jsonl" 2>/dev/null
nvidia-smi --query-gpu=memory.used --format=csv,noheader
if [ -f "$WORK/done" ]; then cat "$WORK/done"; else echo "still running after ${waited}s"; fi
grep -E "error|Error|Traceback|timing_s|memory after|perf/|num_turns|tool_calls" "$LOG" | tail -n 40
