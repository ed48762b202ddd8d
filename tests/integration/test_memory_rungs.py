"""Each precision rung of the memory plan, planned for a pretend GPU and trained for real on the CPU.

The plan only runs for a CUDA device; here `device_memory` (the planner's view of the machine) is
replaced to plan the tiny model's CPU run as if it had a GPU of a few megabytes, and the two fixed
allowances (2 GiB of log-softmax scratch, 2 GiB moment chunks) shrink to fit that scale. Everything
else is the real run: the plan decides how the models load, which optimizer steps them and what waits
in (host) memory, and a GAE step with a critic trains on it.

Sizes (tiny/qwen2, 64 + 8 tokens): actor P = 80,768 and critic C = 80,833 parameters; one checkpointed
token 3,988 B, so one sequence needs 287,136 B in either update; moment chunks 4,096 B. On the CPU the
fp32 weights compute in fp32 (no autocast copies) and the engine generates on the actor (no copy).
"""

from __future__ import annotations

import math

import pytest

from relm.memory import choices as memory
from relm.memory import plan as memory_plan

pytestmark = pytest.mark.integration

GAE_WITH_SHORT_PROMPTS = ("algorithm.adv_estimator=gae", "data.max_prompt_length=64")
"""With the `varied_reward` fixture's reward: the demo's rule scores every response of a first step 0 at
some seeds (zero advantages, zero gradients, nothing for a rung to get wrong)."""


def pretend_gpu(monkeypatch: pytest.MonkeyPatch, usable: int, pinnable: int) -> None:
    """Plan the CPU run for a GPU with `usable` bytes (85% of it) and a host that may pin `pinnable`
    (the process's own memory left out: `host_baseline_bytes` only adds to the reported peak)."""
    monkeypatch.setattr(
        memory, "device_memory", lambda device: (math.ceil(usable / 0.85), math.ceil(pinnable / 0.7))
    )
    monkeypatch.setattr(memory_plan, "LOGIT_SCRATCH_BYTES", 0)
    monkeypatch.setattr(memory_plan, "OPTIMIZER_CHUNK_BYTES", 4096)
    # the rungs are chosen by the pinned share here; a checkpoint's staging (the model's weights, on the
    # scale of the pinnable bytes) is checked in tests/unit/test_memory_plan.py
    monkeypatch.setattr(memory_plan, "_checkpoint_staging", lambda request: 0)


# (usable, pinnable, plan lines, why)
RUNGS = {
    # fp32 rung: with both models' moments offloaded the actor's phase is 8P + 4096 + 4C = 973,572 B and the
    # critic's 4P + 8C + 4096 = 973,832 B (+ 287,136 each fits 1.3e6); every layout with fewer offloaded
    # moments holds >= 1,293,068 B in the critic's update; pinned 8P + 8C = 1,292,808 B
    "fp32 moments offloaded": (
        1_300_000, 1_500_000,
        ["trained weights: fp32 master weights", "actor's AdamW moments: fp32, in CPU memory, stepped in chunks",
         "critic's AdamW moments: fp32, in CPU memory, stepped in chunks"],
    ),
    # same GPU, but 1e6 B pinnable: the fp32 layout above pins too much; bf16 moments offloaded hold the same
    # GPU bytes with 4P + 4C = 646,404 B pinned
    "bf16 moments": (
        1_300_000, 1_000_000,
        ["actor's AdamW moments: bf16, in CPU memory, stepped in chunks",
         "critic's AdamW moments: bf16, in CPU memory, stepped in chunks"],
    ),
    # nothing pinnable: fp32 weights with every moment resident need 8P + 12C + 287,136 = 1,903,276 B in the
    # critic's update; bf16 weights 2P + 4P + 8C = 1,131,272 (+ 287,136) fit 1.6e6
    "bf16 weights": (
        1_600_000, 0,
        ["trained weights: bf16, AdamW updates stochastically rounded, generated on directly",
         "actor's AdamW moments: bf16, on the GPU"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("rung", list(RUNGS))
def test_each_rung_trains_a_ppo_step_with_finite_losses(
    rung: str, train, varied_reward: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    usable, pinnable, lines = RUNGS[rung]
    pretend_gpu(monkeypatch, usable, pinnable)

    result = train(*GAE_WITH_SHORT_PROMPTS, varied_reward, "trainer.total_training_steps=1")

    assert result.exit_code == 0, result.stderr
    assert "memory plan: actor update peak" in result.stderr
    for line in lines:
        assert line in result.stderr, f"{line!r} not in the plan:\n{result.stderr}"
    if rung == "fp32 moments offloaded":
        assert "to fit one GPU" not in result.stderr  # nothing given up, nothing to warn about
    else:
        assert "memory plan: to fit one GPU" in result.stderr  # the warning names what was given up
    (record,) = result.metrics
    for name in ("actor/pg_loss", "critic/vf_loss", "actor/grad_norm", "critic/grad_norm"):
        assert math.isfinite(record[name]), (name, record[name])
    assert record["actor/grad_norm"] > 0 and record["training/skipped_updates"] == 0


@pytest.mark.parametrize("rung", ["bf16 moments", "bf16 weights"])
def test_a_compact_run_resumes_exactly(
    rung: str, train, tmp_path, varied_reward: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1 step, save, resume for step 2 == 2 steps straight: the bf16 moments (and weights) and the
    stochastic rounding's noise generators come back from the checkpoint as they were."""
    usable, pinnable, _ = RUNGS[rung]
    pretend_gpu(monkeypatch, usable, pinnable)
    whole = train(
        *GAE_WITH_SHORT_PROMPTS, varied_reward, "trainer.total_training_steps=2", run_dir=tmp_path / "whole"
    )
    run_dir = tmp_path / "split"
    first = train(
        *GAE_WITH_SHORT_PROMPTS,
        varied_reward,
        "trainer.total_training_steps=1",
        "trainer.save_freq=1",
        run_dir=run_dir,
    )
    assert whole.exit_code == 0 and first.exit_code == 0, whole.stderr + first.stderr

    resumed = train(*GAE_WITH_SHORT_PROMPTS, varied_reward, "trainer.total_training_steps=2", run_dir=run_dir)

    assert resumed.exit_code == 0, resumed.stderr
    assert "continuing at step 2 of 2" in resumed.stderr
    assert [r["step"] for r in resumed.metrics] == [1, 2]
    for key in (
        "actor/pg_loss",
        "critic/vf_loss",
        "actor/grad_norm",
        "critic/grad_norm",
        "critic/score/mean",
    ):
        assert resumed.metrics[-1][key] == whole.metrics[-1][key], key


def test_explicit_fp32_moments_that_cannot_fit_exit_2_in_one_line(
    train, monkeypatch: pytest.MonkeyPatch
) -> None:
    usable, pinnable, _ = RUNGS["bf16 weights"]
    pretend_gpu(monkeypatch, usable, pinnable)

    result = train(
        *GAE_WITH_SHORT_PROMPTS,
        "actor_rollout_ref.actor.optim.moments_dtype=float32",
        "critic.optim.moments_dtype=float32",
        "actor_rollout_ref.model.dtype=float32",
    )

    assert result.exit_code == 2
    (line,) = [line for line in result.stderr_lines if line.startswith("error:")]
    assert "does not fit one GPU for this run with actor_rollout_ref.model.dtype=float32" in line
    assert "critic.optim.moments_dtype=float32" in line
