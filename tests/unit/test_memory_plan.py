"""The memory planner's arithmetic, checked by hand on a made-up shape.

Shape: 1e9 parameters, 10 layers, hidden 1000, MLP 4000, vocabulary 10,000. Per token:
one layer's activations 2 * (12 * 1000 + 6 * 4000) = 72,000 B; logits and their gradient 4 * 10,000 =
40,000 B; without checkpointing 10 * 72,000 + 40,000 = 760,000 B; with it 10 * 4 * 1000 + 72,000 +
40,000 = 152,000 B. Trainable actor 16e9 B, reference and generator copy 2e9 B each. Plans fill 90%
of the GPU and keep 2 GiB for the log-softmax chunks.
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
    # free = 0.9 * 100 GiB - 20e9 - 2 GiB = 74,489,280,512 B -> 98,012 tokens without checkpointing, capped
    assert not plan.gradient_checkpointing and plan.max_tokens_per_microbatch == 65536
    assert not (plan.park_reference or plan.park_generator or plan.park_critic)
    assert plan.update_peak_bytes == 20 * 10**9 + 2 * GIB + 65536 * 760_000


def test_budget_rounds_down_to_whole_kilotokens():
    # free = 0.9 * 30 GiB - 20e9 - 2 GiB = 6,843,545,600 B -> 9,004 tokens -> 8192, still >= 8192: no checkpointing
    plan = plan_memory(request(30))
    assert not plan.gradient_checkpointing and plan.max_tokens_per_microbatch == 8192


def test_tight_gpu_turns_checkpointing_on():
    # free = 0.9 * 25 GiB - 20e9 - 2 GiB = 2,011,707,392 B: 2,646 tokens without (< 8192); 13,234 with -> 12288
    plan = plan_memory(request(25))
    assert plan.gradient_checkpointing and plan.max_tokens_per_microbatch == 12288


def test_parks_the_reference_first_when_the_actor_would_not_fit():
    # 0.9 * 22 GiB = 21.26e9 < 20e9 + one checkpointed sequence (155,648,000 B) + 2 GiB; without the reference it fits
    plan = plan_memory(request(22))
    assert plan.park_reference and not plan.park_generator
    assert "reference" in plan.describe() and "generator copy" not in plan.describe()


def test_explicit_settings_win():
    plan = plan_memory(request(100, user_checkpointing=True))
    assert plan.gradient_checkpointing and plan.max_tokens_per_microbatch == 65536
    plan = plan_memory(request(30, user_max_tokens=100_000))
    assert plan.max_tokens_per_microbatch == 100_000
    assert "ppo_max_token_len_per_gpu=100000 is kept; the plan estimates at most 8192 fit" in plan.notes[0]


def test_refusals_name_what_does_not_fit():
    with pytest.raises(PlanDoesNotFit, match="actor's update needs ~17 GiB"):
        plan_memory(request(18))  # 16e9 + 2 GiB + one sequence > 0.9 * 18 GiB even with both copies parked
    with pytest.raises(PlanDoesNotFit, match="host memory"):
        plan_memory(request(22, host_bytes=1 * GIB))
    with pytest.raises(PlanDoesNotFit, match="critic's update"):
        plan_memory(request(26, critic=SHAPE))  # critic 16e9 beside the actor's 12e9 > 0.9 * 26 GiB


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
