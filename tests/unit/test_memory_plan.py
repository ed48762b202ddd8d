"""The memory planner's arithmetic, checked by hand on a made-up shape.

Shape: 1e9 parameters, 10 layers, hidden 1000, MLP 4000, vocabulary 10,000. Per token:
one layer's activations 2 * (12 * 1000 + 6 * 4000) = 72,000 B; logits and their gradient 4 * 10,000 =
40,000 B; without checkpointing 10 * 72,000 + 40,000 = 760,000 B; with it 10 * 4 * 1000 + 72,000 +
40,000 = 152,000 B. Through its update the actor holds 18e9 B (weights, gradients, AdamW moments,
autocast's bf16 copies), or 10e9 + a 2 GiB chunk of moments when they are offloaded; reference and
generator copy 2e9 B each. Plans fill 85% of the GPU and keep 2 GiB for the log-softmax chunks. One
checkpointed sequence of 1024 tokens needs 155,648,000 B + 2 GiB = 2,303,131,648 B; a comfortable
micro-batch (8192 more tokens) 3,548,315,648 B.
"""

from __future__ import annotations

import pytest

from relm.training.memory_plan import GIB, ModelShape, PlanDoesNotFit, PlanRequest, plan_memory

SHAPE = ModelShape(
    num_params=10**9, num_layers=10, hidden_size=1000, intermediate_size=4000, vocab_size=10_000
)


def request(gpu_gib: float, **kwargs) -> PlanRequest:
    base = dict(
        actor=SHAPE, critic=None, has_reference=True, has_generator_copy=True, max_sequence_length=1024,
        gpu_bytes=int(gpu_gib * GIB), host_bytes=64 * GIB,
    )  # fmt: skip
    return PlanRequest(**{**base, **kwargs})


def test_per_token_activation_constants():
    assert SHAPE.activation_bytes_per_token(checkpointing=False) == 720_000
    assert SHAPE.activation_bytes_per_token(checkpointing=True) == 112_000


def test_large_gpu_keeps_everything_and_turns_checkpointing_off():
    plan = plan_memory(request(100))
    # free = 0.85 * 100 GiB - 22e9 - 2 GiB = 67,120,571,392 B -> 88,316 tokens without checkpointing, capped
    assert not plan.gradient_checkpointing and plan.max_tokens_per_microbatch == 65536
    assert not (plan.park_reference or plan.park_generator or plan.park_critic or plan.offload_optimizer)
    assert plan.update_peak_bytes == 22 * 10**9 + 2 * GIB + 65536 * 760_000


def test_budget_rounds_down_to_whole_kilotokens():
    # free = int(0.85 * 34 GiB) - 22e9 - 2 GiB = 6,883,655,065 B -> 9,057 tokens -> 8192, >= 8192: no checkpointing
    plan = plan_memory(request(34))
    assert not plan.gradient_checkpointing and plan.max_tokens_per_microbatch == 8192


def test_tight_gpu_turns_checkpointing_on():
    # free = int(0.85 * 30 GiB) - 22e9 - 2 GiB = 3,232,932,864 B: 4,253 tokens without (< 8192); 21,269 with
    plan = plan_memory(request(30))
    assert plan.gradient_checkpointing and plan.max_tokens_per_microbatch == 20480


def test_parks_the_reference_first():
    # int(0.85 * 27 GiB) = 24,642,374,860 < 22e9 + 3,548,315,648; without the reference (20e9) it fits
    plan = plan_memory(request(27))
    assert plan.park_reference and not plan.park_generator and not plan.offload_optimizer
    assert "reference" in plan.describe() and "generator copy" not in plan.describe()


def test_offloads_the_moments_before_running_out():
    # int(0.85 * 22 GiB) = 20,078,972,108: even with both copies parked 18e9 + 3,548,315,648 is over;
    # with the moments offloaded 10e9 + 2 GiB + 4e9 + 3,548,315,648 = 19,695,799,296 fits, nothing parked
    plan = plan_memory(request(22))
    assert plan.offload_optimizer and not (plan.park_reference or plan.park_generator)
    assert "in CPU memory, stepped in chunks" in plan.describe()


def test_explicit_settings_win():
    plan = plan_memory(request(100, user_checkpointing=True))
    assert plan.gradient_checkpointing and plan.max_tokens_per_microbatch == 65536
    plan = plan_memory(request(34, user_max_tokens=100_000))
    assert plan.max_tokens_per_microbatch == 100_000
    assert "ppo_max_token_len_per_gpu=100000 is kept; the plan estimates at most 8192 fit" in plan.notes[0]


def test_refusals_name_what_does_not_fit():
    with pytest.raises(PlanDoesNotFit, match="actor's update needs ~13 GiB"):
        plan_memory(
            request(15)
        )  # 10e9 + 2 GiB + 2,303,131,648 > int(0.85 * 15 GiB) with everything else parked
    with pytest.raises(PlanDoesNotFit, match="host memory"):
        plan_memory(request(27, host_bytes=1 * GIB))
    with pytest.raises(PlanDoesNotFit, match="critic's update"):
        plan_memory(request(26, critic=SHAPE))  # critic 18e9 beside the actor's 12e9 > int(0.85 * 26 GiB)


def test_cpu_runs_follow_the_users_settings_without_a_plan():
    import torch

    from relm.config.loader import load_config
    from relm.trainer.memory import build_residency, choose_memory
    from tests.tiny_models import tiny_lm

    actor = tiny_lm(seed=0)
    cfg = load_config(["actor_rollout_ref.actor.use_dynamic_bsz=true"])
    choices = choose_memory(cfg, actor, None, has_generator_copy=False, device=torch.device("cpu"))
    # unset checkpointing is off on CPU; unset budgets are verl's defaults
    assert choices.plan is None and not choices.actor_checkpointing
    assert (choices.actor_max_tokens, choices.critic_max_tokens) == (16384, 32768)
    cfg = load_config(["actor_rollout_ref.model.enable_gradient_checkpointing=true"])
    choices = choose_memory(cfg, actor, None, has_generator_copy=False, device=torch.device("cpu"))
    assert choices.actor_checkpointing and choices.actor_max_tokens is None
    assert (
        build_residency(
            None, torch.device("cpu"), ref=actor, generator=None, critic=None, critic_optimizer=None
        ).models
        == {}
    )
