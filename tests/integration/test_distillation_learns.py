"""On-policy distillation learns: a demo policy trained with GRPO becomes a frozen teacher (its checkpoint
folder as `distillation.teacher_models.teacher_model.model_path`), and a fresh student trained with the
teacher's per-token signal alone (`use_task_rewards=false`: the task's reward is scored and logged, never
trained on) closes most of the gap between its starting score and the teacher's.

Both runs go through the real entry point on the demo preset (the built-in letter task, the tiny random
zoo model), one CPU thread. Scores are the greedy validation score on the demo's 32 held-out prompts
(`val-core/relm/letters/reward/mean@1`): the teacher's after its 50 steps, the student's before its first
step and after its last.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

VAL_SCORE = "val-core/relm/letters/reward/mean@1"
REQUIRED_SHARE = 0.8
"""Share of the teacher-minus-fresh-student gap the distilled student must close."""

DEMO = (
    "data.max_response_length=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_epochs=2",
    "algorithm.adv_estimator=grpo",
)
"""test_learning.py's cheaper demo with GRPO (its teacher run is that test's grpo run)."""

TEACHER_STEPS, STUDENT_STEPS = 50, 20
TEACHER_SEED, STUDENT_SEED = 1, 2
"""Measured 2026-12-06 (2-core AMD EPYC VM, one thread, beside other test runs): the teacher (GRPO, seed 1)
validates at 1.0 after 50 steps. Students distilled with supervised `forward_kl_topk` (top 16) validate, at
steps 0, 5, 10, 15, 20: seed 1 0, 0.31, 1, 1, 1; seed 2 (as AVX2 computes it) 0, 0.5, 1, 1, 1; seed 3 (steps 0, 10,
20, 30) 0, 1, 1, 1: the whole gap closed by step 10 where REQUIRED_SHARE asks for 80% at step 20.

verl's scripts' default, k1 as a per-token reward (policy gradient), also learns but less surely in this budget
(steps 0, 10, 20, 30): seed 1 0, 0.5, 1, 1; seed 2 0, 0.69, 0.84, 1; seed 3 0, 0.69, 0.5, 0.64; and the k3
estimator backpropagated (verl's YAML default) barely moves in 30 steps (seeds 2, 3: 0 and 0.19): one sampled
token's estimate carries far less signal than the teacher's top 16. docs/distillation.md has these figures."""


def _val_scores(metrics: list[dict]) -> dict[int, float]:
    return {int(record["step"]): float(record[VAL_SCORE]) for record in metrics if VAL_SCORE in record}


def test_distilled_student_closes_most_of_the_gap_to_its_teacher(train, tmp_path: Path, one_cpu_thread):
    teacher = train(
        *DEMO,
        f"seed={TEACHER_SEED}",
        f"trainer.total_training_steps={TEACHER_STEPS}",
        f"trainer.save_freq={TEACHER_STEPS}",
        f"trainer.test_freq={TEACHER_STEPS}",
        "trainer.val_before_train=false",
        run_dir=tmp_path / "teacher",
        tiny=False,
    )
    assert teacher.exit_code == 0, teacher.stderr
    teacher_score = _val_scores(teacher.metrics)[TEACHER_STEPS]
    folder = teacher.run_dir / f"global_step_{TEACHER_STEPS}" / "actor"

    student = train(
        *DEMO,
        f"seed={STUDENT_SEED}",
        f"trainer.total_training_steps={STUDENT_STEPS}",
        f"trainer.test_freq={STUDENT_STEPS}",
        "distillation.enabled=true",
        f"distillation.teacher_models.teacher_model.model_path={folder}",
        "distillation.distillation_loss.loss_mode=forward_kl_topk",
        "distillation.distillation_loss.topk=16",
        "distillation.distillation_loss.use_task_rewards=false",
        run_dir=tmp_path / "student",
        tiny=False,
    )
    assert student.exit_code == 0, student.stderr
    scores = _val_scores(student.metrics)
    fresh, distilled = scores[0], scores[STUDENT_STEPS]
    gap = teacher_score - fresh
    assert gap > 0.5, f"the teacher ({teacher_score}) must score well above a fresh student ({fresh})"
    closed = (distilled - fresh) / gap
    assert closed >= REQUIRED_SHARE, (
        f"the student closed {closed:.0%} of the gap: {fresh} -> {distilled}, teacher {teacher_score}"
    )
    step = student.metrics[-1]
    # the teacher scored, its term trained; the teacher's top 16 hold most of its mass on this task
    assert (
        "timing_s/teacher" in step and "distillation/loss" in step and step["distillation/teacher_mass"] > 0.5
    )
