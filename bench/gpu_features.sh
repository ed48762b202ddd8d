#!/usr/bin/env bash
# Features first proven on a CPU, run on the GPU: on-policy distillation from a demo teacher trained here
# (top-k forward KL, task rewards off), the optimal token baseline (squared-probability sums from the old
# forward), and both in one run. Each run's metrics land in $OUT/NAME.metrics.jsonl.
# Usage (repository root): bash bench/gpu_features.sh   (STEPS=N for a shorter dry run on a CPU)
set -u
R="${OUT:-bench/results}"
mkdir -p "$R"
PY="${PYTHON:-python3}"
S="${STEPS:-20}"
W="$(mktemp -d)"
run() {
  local name=$1 start=$SECONDS
  shift
  timeout "${RUN_LIMIT:-200}" "$PY" -c "import sys; from relm.cli import main; sys.exit(main())" train \
    "trainer.default_local_dir=$W/$name" "$@" > "$R/$name.log" 2>&1
  echo "$name rc=$? in $((SECONDS - start))s"
  cp "$W/$name/metrics.jsonl" "$R/$name.metrics.jsonl" 2>/dev/null
  grep -E "^error|Traceback|step $S\b" "$R/$name.log" | tail -3
}
run teacher "trainer.total_training_steps=$S" "trainer.save_freq=$S"
TOPK=(distillation.enabled=true "distillation.teacher_models.teacher_model.model_path=$W/teacher/global_step_$S/actor"
  distillation.distillation_loss.loss_mode=forward_kl_topk distillation.distillation_loss.topk=16)
run distill "trainer.total_training_steps=$S" "${TOPK[@]}" distillation.distillation_loss.use_task_rewards=false
run otb "trainer.total_training_steps=$S" algorithm.adv_estimator=optimal_token_baseline
run otb_distill "trainer.total_training_steps=$((S / 4 + 1))" algorithm.adv_estimator=optimal_token_baseline "${TOPK[@]}"
rm -rf "$W"
