"""The demo task is learned, not just run: the score rises with `gae`, `grpo` and `rloo`; and a run builds
only the models its algorithm reads (a critic for `gae` alone, a reference model only for a KL term).

The learning runs go through the real entry point in-process, on the demo preset (no `data.train_files`:
the built-in letter task and the tiny random zoo model). On that task every estimator first learns to
write any of the six target letters (score about 1/6, whatever the prompt), then to write the prompt's
letter (score towards 1). A rise of 0.3 needs the second phase, i.e. a policy that reads its prompt.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relm.config.loader import load_config
from relm.config.translate import translate
from relm.models.loading import resolve_model_dir
from relm.trainer.components import build_components
from relm.trainer.main_ppo import main

pytestmark = pytest.mark.integration

REQUIRED_RISE = 0.3
"""Mean score of the last 5 steps minus that of the first 5: well above the 1/6 a prompt-blind policy reaches."""

CHEAPER_DEMO = (
    # Eight characters score the letter share as well as sixteen, and a step costs about 80% as much.
    "data.max_response_length=8",
    # 8 mini-batches x 2 epochs = 16 optimizer steps per batch instead of the preset's 2: on this task
    # the escape from the prompt-blind plateau is paced by optimizer steps, not by samples, so it
    # comes after ~30 steps instead of ~100-150 (measured over seeds 1-7 for each estimator).
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_epochs=2",
)
"""Overrides on top of the demo preset (its 32 prompts x 8 responses per step and lr 1e-3 stay)."""

NUM_STEPS = 50
"""Every one of 21 measured runs (seeds 1-7 x 3 estimators) had left the plateau by step ~35."""

SEEDS = {"gae": 5, "grpo": 1, "rloo": 2}
"""Per estimator, a seed whose rise (one thread) was >= 0.95 at every step count from 45 to 55, so a
shifted trajectory (other CPU kernels, another torch) is still likely to pass: over seeds 1-7 at 50 steps,
all 21 runs passed and the smallest rises were 0.74 (gae), 0.95 (grpo) and 0.47 (rloo, whose score can
dip after its first peak). That was with the exponential-race sampler.

Re-measured 2026-12-05 with the CPU inverse-CDF sampler (one thread, 2-core AMD EPYC VM), under its own
AVX-512 kernels and as an AVX2 machine computes it (`ATEN_CPU_CAPABILITY=avx2`):
grpo seeds 1, 2, 3: 0.981, 0.985, 0.947 (AVX2: 0.970, 0.984, 0.981); gae seeds 5, 1, 2, 3: 0.972, 0.839,
0.364, 0.429 (AVX2: 0.712, 0.877, 0.688, 0.665; gae's score peaks near 0.9 and can fall back, seed 2 to
0.52); rloo seeds 2, 1: 0.880, 0.979 (AVX2 seed 2: 0.618). The smallest at the tests' seeds is 0.618, so
REQUIRED_RISE (0.3) holds with margin on either kind of machine; across seeds the smallest is gae's 0.364.

On an Intel Xeon VM (AVX-512), 2026-12-05 22:17-22:45 UTC, one thread, beside a CI run: grpo seed 1 0.982, gae
seed 5 0.918, rloo seeds 2, 3 0.795, 0.978, and as AVX2 computes it rloo seeds 1, 3 0.953, 0.950."""


def scores_per_step(run_dir: Path) -> list[float]:
    """`critic/score/mean` of each training step, in step order, from the run's metrics.jsonl."""
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return [
        r["critic/score/mean"] for r in sorted(records, key=lambda r: r["step"]) if "critic/score/mean" in r
    ]


def assert_demo_score_rises(label: str, tmp_path: Path, *overrides: str) -> None:
    """Train the demo NUM_STEPS steps with `overrides` and check that the mean score of the last 5 steps
    rose by REQUIRED_RISE over the first 5."""
    code = main(
        [
            f"trainer.total_training_steps={NUM_STEPS}",
            f"trainer.default_local_dir={tmp_path}",
            # metrics.jsonl is what the test reads; no console table, no validation passes.
            "trainer.logger=[jsonl]",
            "trainer.test_freq=-1",
            "trainer.val_before_train=false",
            *CHEAPER_DEMO,
            *overrides,
        ]
    )

    assert code == 0
    scores = scores_per_step(tmp_path)
    assert len(scores) == NUM_STEPS
    first, last = sum(scores[:5]) / 5, sum(scores[-5:]) / 5
    assert last >= first + REQUIRED_RISE, (
        f"{label}: mean score of the first 5 steps {first:.3f}, of the last 5 {last:.3f}; "
        f"curve by tens of steps: {[round(sum(scores[i : i + 10]) / 10, 2) for i in range(0, NUM_STEPS, 10)]}"
    )


@pytest.mark.parametrize("estimator", sorted(SEEDS))
def test_demo_task_score_rises(estimator: str, tmp_path: Path, one_cpu_thread: None) -> None:
    assert_demo_score_rises(
        estimator, tmp_path, f"algorithm.adv_estimator={estimator}", f"seed={SEEDS[estimator]}"
    )


@pytest.mark.parametrize(
    ("overrides", "has_critic", "has_ref"),
    [
        (["algorithm.adv_estimator=grpo"], False, False),
        (["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=true"], False, True),
        (["algorithm.adv_estimator=rloo", "algorithm.use_kl_in_reward=true"], False, True),
        (["algorithm.adv_estimator=gae"], True, False),
    ],
    ids=["grpo-no-kl", "grpo-kl-loss", "rloo-kl-in-reward", "gae"],
)
def test_run_builds_only_the_models_its_algorithm_reads(
    overrides: list[str], has_critic: bool, has_ref: bool, tmp_path: Path
) -> None:
    cfg = load_config([*overrides, f"trainer.default_local_dir={tmp_path}"])
    c = build_components(translate(cfg)[0], resolve_model_dir(cfg.actor_rollout_ref.model.path))

    assert (c.critic is not None) == has_critic
    assert [trainee.name for trainee in c.trainees] == ["actor", "critic"][: 1 + has_critic]
    assert (c.ref is not None) == has_ref
    if c.ref is not None:
        # A frozen copy, not the actor itself: the KL must measure drift from the starting weights.
        assert c.ref is not c.actor.module
        assert not any(p.requires_grad for p in c.ref.parameters())


LORA_DEMO = (
    "actor_rollout_ref.model.lora_rank=8",  # lora_alpha stays verl's 16: scaling 2
    # Every Linear of the model, the output head included: PEFT's `all-linear` leaves the head out, and
    # this random model's head (tied to the input embedding, rows of norm 0.16 against a final-norm
    # output of norm 8) caps every logit near 1.3, so with it frozen no letter can pass ~3% probability.
    "actor_rollout_ref.model.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head]",
    # Twice the preset's full fine-tuning rate (docs/lora.md: verl and Thinking Machines advise up to 10x;
    # on this task 3e-3 peaked by step 30 and then fell back, 1e-2 never left the plateau), decayed to 0
    # over the run by verl's cosine schedule: held flat, 2e-3 too fell back from its peak.
    "actor_rollout_ref.actor.optim.lr=2e-3",
    "actor_rollout_ref.actor.optim.warmup_style=cosine",
)
"""docs/lora.md's LoRA recipe for the demo (17,704 adapter parameters on an 80,768-parameter model)."""


def test_demo_task_score_rises_with_lora(tmp_path: Path, one_cpu_thread: None) -> None:
    # Measured rises (one thread, these overrides, 50 steps): seeds 1, 2, 42 -> 0.90, 0.98, 0.97; with the CPU
    # inverse-CDF sampler (2026-12-05) 0.948, 0.978, 0.908, and seed 42 as AVX2 computes it 0.981. Without
    # the cosine decay: 0.50, 0.60, 0.74; at a flat 3e-3: 0.31, 0.26, 0.46; at a flat 1e-2: 0.11 (seed 1);
    # PEFT's `all-linear` alone: 0.005 (seed 1). On an Intel Xeon VM (2026-12-05): seed 42 0.978, and as AVX2
    # computes it seeds 1 and 2 0.822 and 0.972.
    pytest.importorskip("peft")
    assert_demo_score_rises("LoRA", tmp_path, "seed=42", *LORA_DEMO)
