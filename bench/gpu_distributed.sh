#!/usr/bin/env bash
# Two-GPU check of data-parallel training (torchrun, FSDP2, NCCL) at the Qwen2.5-1.5B shape, random weights.
#
# Usage (repository root, a machine with 2 GPUs; relm and omegaconf importable, e.g. through PYTHONPATH):
#   bash bench/gpu_distributed.sh   # ~8 min at most (BUDGET seconds, default 450, plus the last kill grace)
# Results under $OUT (bench/results/distributed when unset): one log per step, step_*.json (relm bench step),
# parity_*.json (the largest differences between 1 GPU and 2 GPUs) and summary.md (docs rows).
# Every step runs under its own time limit, capped by what is left of BUDGET; a step that no longer fits
# is skipped and said so; a failing step is reported and the next one still runs. In order:
#
# 1. step_1gpu / step_2gpu: `relm bench step` GRPO (+KL loss, reference), 64 prompts x n=8, 256+256 tokens,
#    micro-batches of 16 per GPU, 1 warm-up + 2 measured steps, the same global batch on 1 and on 2 GPUs,
#    relm's defaults (on 2 GPUs the planned layout: replicated when one GPU's memory plan holds every model).
#    Target: step throughput on 2 GPUs >= 1.8x one GPU. Each phase's time is printed.
# 2. parity_fp32: one PPO (GAE) and one GRPO step on the same global batch (8 prompts x n=4), fp32 master
#    and compute, TF32 off; 1 GPU through the single-process path, then 2 GPUs (planned layout). Gradients of
#    chosen parameters at every optimizer step, weights and AdamW moments after the step, losses.
#    Tolerance: the same responses, and gradients within 1e-4 relative (L2) at every optimizer step.
# 3. step_2gpu_sharded: step 1 on 2 GPUs with every model sharded over both (fsdp_size=-1), checkpointing as
#    the 1-GPU plan chose it: what the gradient sync per optimizer step and the kept weights buy a sharded run.
# 4. parity_sharded: step 2's 2-GPU side with fsdp_size=-1, against the same 1-GPU results.
# 5. parity_offload: step 2 on the tiny Qwen2 with FSDP2's CPUOffloadPolicy on the 2-GPU side (the code path,
#    not its speed); same tolerance.
# 6. parity_bf16: step 2 with the GPU default precision (fp32 master, bf16 compute: autocast on one GPU,
#    FSDP's MixedPrecisionPolicy on two), reported only: bf16 rounding differs between the two by design.
set -u
RESULTS="${OUT:-bench/results/distributed}"
mkdir -p "$RESULTS"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export RELM_CACHE="${RELM_CACHE:-/tmp/relm-cache}"
# NVLink multicast stays off on shared machines (see the machine's notes); keep it so for every process.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY="${PYTHON:-python3}"
TORCHRUN=("$PY" -m torch.distributed.run --standalone --nproc_per_node=2)
source "$(dirname "$0")/lib.sh"  # for ensure_datasets (its own `step` below replaces lib.sh's)
MODEL="${MODEL:-zoo:Qwen/Qwen2.5-1.5B}"
DEVICE="${DEVICE:-cuda}"  # DEVICE=cpu MODEL=zoo:tiny/qwen2 SMALL=1 runs the same steps on a CPU, in seconds
BUDGET="${BUDGET:-450}"   # seconds for the whole script
STATUS=()
SHARDED=(actor_rollout_ref.actor.fsdp_config.fsdp_size=-1 actor_rollout_ref.ref.fsdp_config.fsdp_size=-1
         critic.model.fsdp_config.fsdp_size=-1)

step() {  # step NAME SECONDS COMMAND...: skipped when fewer than SECONDS/2 of the budget are left
  local name="$1" limit="$2"; shift 2
  local left=$((BUDGET - SECONDS))
  if [ "$left" -lt $((limit / 2)) ]; then
    STATUS+=("$name: skipped (${SECONDS}s elapsed, ${left}s of the ${BUDGET}s budget left)")
    echo; echo "=== $name: skipped, ${left}s of the budget left ==="
    return 1
  fi
  [ "$left" -lt "$limit" ] && limit=$left
  echo; echo "=== $name (limit ${limit}s, ${SECONDS}s elapsed) ==="
  local start=$SECONDS
  # TERM first: torchrun passes it on to its workers (their own sessions) and kills them 30 s later;
  # a KILL would leave them holding the GPUs.
  timeout --kill-after=45 "$limit" "$@" 2>&1 | grep -v "^W[0-9]* .*torch/distributed/elastic" \
    | tee "$RESULTS/$name.log"
  local rc=${PIPESTATUS[0]}
  STATUS+=("$name: rc=$rc, $((SECONDS - start))s")
  echo "--- $name: rc=$rc in $((SECONDS - start))s"
  return "$rc"
}

compare() {  # compare NAME ONE_DIR TWO_DIR
  "$PY" tests/dist_parity.py compare "$2" "$3" > "$RESULTS/$1.json" && cat "$RESULTS/$1.json"
}

echo "=== environment ==="
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "no nvidia-smi"
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'gpus', torch.cuda.device_count()); print('transformers', transformers.__version__)" || exit 1

# 1. GRPO step throughput, relm's defaults
BENCH=(--model "$MODEL" --device "$DEVICE" --algo grpo --prompts 64 --rollout-n 8 --prompt-len 256 --response-len 256
       --micro 16 --steps 2)
if [ -n "${SMALL:-}" ]; then
  BENCH=(--model "$MODEL" --device "$DEVICE" --algo grpo --prompts 8 --rollout-n 4 --prompt-len 32 --response-len 16
         --micro 4 --steps 1)
fi
step step_1gpu 150 env CUDA_VISIBLE_DEVICES=0 "$PY" -m relm.cli bench step "${BENCH[@]}" \
  --json "$RESULTS/step_1gpu.json"
step step_2gpu 120 "${TORCHRUN[@]}" -m relm.cli bench step "${BENCH[@]}" --json "$RESULTS/step_2gpu.json"

# 2. fp32 parity, planned layout. Parameters recorded whole (the rest enter through the grad-norm metric):
# first and last block, norms, value head.
PARAMS="layers.0.self_attn.q_proj.weight,layers.27.mlp.down_proj.weight,norm.weight,value_head"
PARITY=(--model "$MODEL" --device "$DEVICE" --prompts 8 --rollout-n 4 --response-len 32 --micro 4 --lr 1e-5
        --params "$PARAMS" --no-save)
step parity_fp32_1gpu 100 env CUDA_VISIBLE_DEVICES=0 "$PY" tests/dist_parity.py run "$RESULTS/parity_fp32/one" \
  "${PARITY[@]}" --dtype float32 \
  && step parity_fp32_2gpu 100 "${TORCHRUN[@]}" tests/dist_parity.py run "$RESULTS/parity_fp32/two" \
    "${PARITY[@]}" --dtype float32
compare parity_fp32 "$RESULTS/parity_fp32/one" "$RESULTS/parity_fp32/two"

# 3. the GRPO step sharded, gradient checkpointing as the 1-GPU plan chose it (a sharded run does not plan)
CKPT=$("$PY" -c "import json,sys; r=json.load(open(sys.argv[1]))['results']['grpo']; \
print(str(bool(r.get('memory/gradient_checkpointing', 0))).lower())" "$RESULTS/step_1gpu.json" 2>/dev/null || echo false)
step step_2gpu_sharded 120 "${TORCHRUN[@]}" -m relm.cli bench step "${BENCH[@]}" \
  --json "$RESULTS/step_2gpu_sharded.json" "${SHARDED[@]}" "actor_rollout_ref.model.enable_gradient_checkpointing=$CKPT"

# 4. fp32 parity, sharded layout, against step 2's 1-GPU results
if [ -f "$RESULTS/parity_fp32/one/grpo.pt" ]; then
  step parity_sharded_2gpu 100 "${TORCHRUN[@]}" tests/dist_parity.py run "$RESULTS/parity_sharded/two" \
    "${PARITY[@]}" --dtype float32 "${SHARDED[@]/#/--set=}" \
    && compare parity_sharded "$RESULTS/parity_fp32/one" "$RESULTS/parity_sharded/two"
fi

# 5. FSDP2's CPU offload on the 2-GPU side (a tiny model: it checks the code path, not its speed; GPU only)
OFFLOAD=(--model zoo:tiny/qwen2 --device "$DEVICE" --dtype float32 --no-save)
[ "$DEVICE" = cuda ] \
  && step offload_1gpu 60 env CUDA_VISIBLE_DEVICES=0 "$PY" tests/dist_parity.py run "$RESULTS/parity_offload/one" \
    "${OFFLOAD[@]}" \
  && step offload_2gpu 60 "${TORCHRUN[@]}" tests/dist_parity.py run "$RESULTS/parity_offload/two" "${OFFLOAD[@]}" \
    --set actor_rollout_ref.actor.fsdp_config.offload_policy=true --set critic.model.fsdp_config.offload_policy=true \
  && compare parity_offload "$RESULTS/parity_offload/one" "$RESULTS/parity_offload/two"

# 6. bf16 parity, reported only, if the budget still allows both sides
step parity_bf16_1gpu 100 env CUDA_VISIBLE_DEVICES=0 "$PY" tests/dist_parity.py run "$RESULTS/parity_bf16/one" \
  "${PARITY[@]}" --dtype auto \
  && step parity_bf16_2gpu 100 "${TORCHRUN[@]}" tests/dist_parity.py run "$RESULTS/parity_bf16/two" \
    "${PARITY[@]}" --dtype auto \
  && compare parity_bf16 "$RESULTS/parity_bf16/one" "$RESULTS/parity_bf16/two"

echo; echo "=== summary (${SECONDS}s) ==="
printf '%s\n' "${STATUS[@]}"
grep -h "data parallel:" "$RESULTS"/step_2gpu*.log 2>/dev/null | sed 's/^.*\(data parallel:\)/\1/' | sort -u
"$PY" - "$RESULTS" <<'EOF' | tee "$RESULTS/summary.md"
import datetime
import json
import sys
from pathlib import Path

import torch
import transformers

results = Path(sys.argv[1])
machine = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
versions = f"{torch.__version__} / {transformers.__version__}"
print("## Parity, 1 GPU vs 2 GPUs (largest differences; rel = L2 of the difference over L2 of the 1-GPU value)\n")
for name in ("parity_fp32", "parity_sharded", "parity_offload", "parity_bf16"):
    path = results / f"{name}.json"
    if not path.is_file():
        print(f"- {name}: not run\n")
        continue
    report = json.loads(path.read_text() or "{}")
    if not report:
        print(f"- {name}: no results (a step failed: see its logs)\n")
        continue
    for algo, row in report.items():
        grads = [v for k, v in row.items() if " grad step " in k and k.endswith("rel_l2")]
        losses = {k.removeprefix("metric "): v for k, v in row.items() if k.endswith(("_loss", "/grad_norm"))}
        batch = {k.removeprefix("batch "): v for k, v in row.items() if k.startswith("batch ")}
        weights = {k: v for k, v in row.items() if k.endswith("weights_max_abs")}
        held = batch.get("response_ids") == 0.0 and bool(grads) and max(grads) <= 1e-4
        verdict = "" if name == "parity_bf16" else f" [{'within' if held else 'OUTSIDE'} the 1e-4 tolerance]"
        print(f"- {name} {algo}{verdict}: same responses: {batch.get('response_ids') == 0.0}; gradient rel L2 max "
              f"over {len(grads)} optimizer steps (actor and critic): {max(grads, default=float('nan')):.2e}; "
              + "; ".join(f"{k} |diff| {v:.2e}" for k, v in {**losses, **weights}.items())
              + "; batch max |diff| " + ", ".join(f"{k} {v:.2e}" for k, v in batch.items() if k != "response_ids"))
    print()

rows = {}
for name, label in (("step_1gpu", "1"), ("step_2gpu", "2"), ("step_2gpu_sharded", "2 (sharded)")):
    path = results / f"{name}.json"
    if path.is_file():
        rows[label] = json.loads(path.read_text())["results"]["grpo"]
print("## GRPO step, 64 prompts x n=8, 256+256 tokens, micro-batch 16 per GPU\n")
print("| date | machine | torch / transformers | GPUs | actor layout | step s | gen s | old_log_prob s | ref s "
      "| update_actor s | sync s | perf/throughput tok/s/GPU | MFU actor | peak GB |")
print("| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
today = datetime.date.today().isoformat()
for label, r in rows.items():
    def cell(key, fmt="{:.2f}"):
        return fmt.format(r[key]) if key in r else "-"
    shard = r.get("data_parallel/actor_shard_size")
    layout = "-" if shard is None else ("replicated" if shard == 1 else f"sharded over {shard:.0f}")
    print(f"| {today} | {machine} | {versions} | {label} | {layout} | {cell('timing_s/step')} | {cell('timing_s/gen')} "
          f"| {cell('timing_s/old_log_prob')} | {cell('timing_s/ref')} | {cell('timing_s/update_actor')} "
          f"| {cell('timing_s/sync')} | {cell('perf/throughput', '{:,.0f}')} | {cell('perf/mfu/actor', '{:.1%}')} "
          f"| {cell('perf/max_memory_allocated_gb', '{:.1f}')} |")
if "1" in rows:
    for label in ("2", "2 (sharded)"):
        if label in rows:
            speedup = rows["1"]["timing_s/step"] / rows[label]["timing_s/step"]
            print(f"\nStep throughput on {label.replace('2', '2 GPUs')}: {speedup:.2f}x one GPU (same global batch; target >= 1.8x): "
                  f"{'met' if speedup >= 1.8 else 'NOT met'}")
EOF
