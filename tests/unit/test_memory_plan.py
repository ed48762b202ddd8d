"""The memory planner's arithmetic, checked by hand on a made-up shape and on published shapes on one H200.

Made-up shape: 1e9 parameters, 10 layers, hidden 1000, MLP 4000, vocabulary 10,000. Per token:
one layer's activations 2 * (12 * 1000 + 6 * 4000) = 72,000 B; logits and their gradient 4 * 10,000 =
40,000 B; without checkpointing 10 * 72,000 + 40,000 = 760,000 B; with it 10 * 4 * 1000 + 72,000 +
40,000 = 152,000 B. Through its update an fp32 actor holds 18e9 B (weights, gradients, AdamW moments,
autocast's bf16 copies), or 10e9 + a 2 GiB chunk of moments when they are offloaded; reference and
engine copy 2e9 B each. With bf16 moments the moments are 4e9; with bf16 weights the actor holds
2e9 + 2e9 + 4e9 and there is no engine copy. Plans fill 85% of the GPU and keep 2 GiB for the
log-softmax chunks; pinned host memory is at most 70% of the machine's. One checkpointed sequence of
1024 tokens needs 155,648,000 B + 2 GiB = 2,303,131,648 B; a comfortable micro-batch (8192 more
tokens) 3,548,315,648 B.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from relm.config.translate import translate
from relm.memory.plan import (
    GIB,
    Lora,
    ModelShape,
    PlanDoesNotFit,
    PlanRequest,
    Rung,
    TraineeRequest,
    cpu_host_need,
    cpu_logit_bytes,
    lora_offer,
    plan_memory,
    with_lora,
)

SHAPE = ModelShape(
    num_params=10**9, num_layers=10, hidden_size=1000, intermediate_size=4000, vocab_size=10_000
)
FP32, BF16 = torch.float32, torch.bfloat16


def trainees(
    actor: ModelShape | TraineeRequest, critic: ModelShape | None = None
) -> dict[str, TraineeRequest]:
    """The request's trained models: the actor (its shape, or with the user's settings) and a critic."""
    listed = {"actor": actor if isinstance(actor, TraineeRequest) else TraineeRequest(actor)}
    return listed | ({"critic": TraineeRequest(critic)} if critic is not None else {})


def request(
    gpu_gib: float,
    actor: ModelShape | TraineeRequest = SHAPE,
    critic: ModelShape | None = None,
    **kwargs,
) -> PlanRequest:
    base = dict(
        trainees=trainees(actor, critic), has_reference=True, max_sequence_length=1024,
        gpu_bytes=int(gpu_gib * GIB), host_bytes=64 * GIB,
    )  # fmt: skip
    return PlanRequest(**{**base, **kwargs})


def test_per_token_activation_constants():
    assert SHAPE.activation_bytes_per_token(checkpointing=False) == 720_000
    assert SHAPE.activation_bytes_per_token(checkpointing=True) == 112_000


def test_large_gpu_keeps_everything_and_turns_checkpointing_off():
    plan = plan_memory(request(100))
    # free = 0.85 * 100 GiB - 22e9 - 2 GiB = 67,120,571,392 B -> 88,316 tokens without checkpointing, capped
    assert not plan.policy.checkpointing and plan.max_tokens_per_microbatch == 65536
    assert not (plan.park_reference or plan.park_engine_copy or plan.policy.offload_optimizer)
    assert plan.rung == Rung(FP32, {"actor": FP32}) and plan.engine_copy and not plan.given_up
    assert plan.update_peak_bytes == 22 * 10**9 + 2 * GIB + 65536 * 760_000 and plan.host_bytes == 0


def test_budget_rounds_down_to_whole_kilotokens():
    # free = int(0.85 * 34 GiB) - 22e9 - 2 GiB = 6,883,655,065 B -> 9,057 tokens -> 8192, >= 8192: no checkpointing
    plan = plan_memory(request(34))
    assert not plan.policy.checkpointing and plan.max_tokens_per_microbatch == 8192


def test_tight_gpu_turns_checkpointing_on():
    # free = int(0.85 * 30 GiB) - 22e9 - 2 GiB = 3,232,932,864 B: 4,253 tokens without (< 8192); 21,269 with
    plan = plan_memory(request(30))
    assert plan.policy.checkpointing and plan.max_tokens_per_microbatch == 20480


def test_parks_the_reference_first():
    # int(0.85 * 27 GiB) = 24,642,374,860 < 22e9 + 3,548,315,648; without the reference (20e9) it fits
    plan = plan_memory(request(27))
    assert plan.park_reference and not plan.park_engine_copy and not plan.policy.offload_optimizer
    assert plan.host_bytes == 2 * 10**9
    assert "reference" in plan.describe() and "engine copy" not in plan.describe()


def test_offloads_the_moments_before_running_out():
    # int(0.85 * 22 GiB) = 20,078,972,108: even with both copies parked 18e9 + 3,548,315,648 is over;
    # with the moments offloaded 10e9 + 2 GiB + 4e9 + 3,548,315,648 = 19,695,799,296 fits, nothing parked
    plan = plan_memory(request(22))
    assert plan.policy.offload_optimizer and not (plan.park_reference or plan.park_engine_copy)
    assert plan.rung == Rung(FP32, {"actor": FP32}) and plan.host_bytes == 8 * 10**9
    assert "actor's AdamW moments: fp32, in CPU memory, stepped in chunks" in plan.describe()


def test_bf16_moments_when_the_host_cannot_hold_fp32_ones():
    # GPU 22 GiB as above, host 10 GiB: at most int(0.7 * 10 GiB) = 7,516,192,768 B pinned. fp32 rung: only
    # the offloaded moments (8e9 pinned) fit the GPU. bf16 moments: 14e9 + 2e9 + 2e9 = 18e9 is over
    # 20,078,972,108 - 3,548,315,648 (and over it less 2,303,131,648), parking the reference leaves 16e9, which
    # holds a comfortable micro-batch with 2e9 pinned
    plan = plan_memory(request(22, host_bytes=10 * GIB))
    assert (
        plan.rung == Rung(FP32, {"actor": BF16}) and plan.park_reference and not plan.policy.offload_optimizer
    )
    assert plan.given_up == ["actor AdamW moments stored in bf16 instead of fp32"]
    assert "actor's AdamW moments: bf16, on the GPU (fp32 moments would need ~7 GiB)" in plan.describe()


def test_bf16_weights_when_nothing_else_fits():
    # int(0.85 * 12 GiB) = 10,952,166,604 B. Every fp32-weight layout holds >= 10e9 + 2 GiB > that less one
    # sequence. bf16 weights: 2e9 + 2e9 + 4e9 (+ 2e9 reference); parked reference 8e9 + 3,548,315,648 is over,
    # moments offloaded 4e9 + 2 GiB + 2e9 = 8,147,483,648 also; both: 6,147,483,648 + 3,548,315,648 =
    # 9,695,799,296 fits, with 2e9 + 4e9 pinned
    plan = plan_memory(request(12))
    assert plan.rung == Rung(BF16, {"actor": BF16}) and plan.policy.offload_optimizer and plan.park_reference
    assert not plan.engine_copy and plan.host_bytes == 6 * 10**9
    assert plan.given_up[0].startswith("weights trained in bf16 with stochastically rounded updates")
    assert "trained weights: bf16, AdamW updates stochastically rounded" in plan.describe()
    # free = 10,952,166,604 - 6,147,483,648 - 2 GiB = 2,657,199,308 -> 17,481 checkpointed tokens
    assert plan.policy.checkpointing and plan.max_tokens_per_microbatch == 17408


def test_explicit_settings_win():
    plan = plan_memory(request(100, TraineeRequest(SHAPE, checkpointing=True)))
    assert plan.policy.checkpointing and plan.max_tokens_per_microbatch == 65536
    plan = plan_memory(request(34, TraineeRequest(SHAPE, max_tokens=100_000)))
    assert plan.max_tokens_per_microbatch == 100_000
    assert "ppo_max_token_len_per_gpu=100000 is kept; the plan estimates at most 8192 fit" in plan.notes[0]
    # fp32 moments fixed where the plan would store them in bf16 (the host-bound case above): the rung after
    # fp32 keeps them and takes bf16 weights: 2e9 + 2e9 + 8e9 + 2e9 = 14e9 + 3,548,315,648 fits
    plan = plan_memory(request(22, TraineeRequest(SHAPE, moments_dtype=FP32), host_bytes=10 * GIB))
    assert plan.rung == Rung(BF16, {"actor": FP32}) and not (
        plan.park_reference or plan.policy.offload_optimizer
    )
    assert len(plan.given_up) == 1 and "weights" in plan.given_up[0]
    with pytest.raises(PlanDoesNotFit):
        plan_memory(request(12, weights_dtype=FP32))  # fp32 weights fixed where only bf16 ones fit
    plan = plan_memory(request(100, weights_dtype=BF16))  # chosen, not given up: nothing to warn about
    assert plan.rung == Rung(BF16, {"actor": FP32}) and not plan.given_up


def test_a_critic_is_parked_and_its_update_checked_beside_the_actor():
    # PPO: critic of the same shape, no reference, engine copy. int(0.85 * 30 GiB) = 27,380,416,512.
    # fp32, nothing offloaded: the actor's phase is 18e9 + 2e9 + 12e9 (idle critic) = 32e9, too much; parking
    # the engine copy and the critic leaves 18e9, but the critic's own update then holds the actor's 12e9
    # beside its 18e9. With the actor's moments offloaded and both parked: actor phase 10e9 + 2 GiB =
    # 12,147,483,648 (+ 3,548,315,648 fits); critic phase 4e9 + 18e9 = 22e9 (+ 155,648,000 fits); pinned
    # 8e9 + 2e9 + 12e9 = 22e9 of int(0.7 * 64 GiB) = 48,103,633,715
    plan = plan_memory(request(30, critic=SHAPE, has_reference=False))
    assert (
        plan.rung == Rung(FP32, {"actor": FP32, "critic": FP32})
        and plan.policy.offload_optimizer
        and not plan.trainees["critic"].offload_optimizer
    )
    assert plan.park_engine_copy and plan.trainees["critic"].parked and plan.host_bytes == 22 * 10**9
    assert "critic's AdamW moments: fp32, on the GPU" in plan.describe()


def test_refusals_name_what_does_not_fit():
    # int(0.85 * 8 GiB) = 7,301,444,403: the leanest layout (bf16, moments offloaded, reference parked)
    # needs 6,147,483,648 + 2,303,131,648 = 8,450,615,296 B
    with pytest.raises(PlanDoesNotFit, match="actor's update needs ~8 GiB"):
        plan_memory(request(8))
    # at 12 GiB that layout fits the GPU (see above) but pins 6e9 B, over int(0.7 * 1 GiB)
    with pytest.raises(
        PlanDoesNotFit, match="reference, actor's AdamW moments on the CPU needs ~6 GiB of host"
    ):
        plan_memory(request(12, host_bytes=1 * GIB))
    # critic of twice the parameters: its bf16 update with offloaded moments is 4e9 + 4e9 + 2 GiB beside the
    # actor's 2e9 = 12,147,483,648 B, over int(0.85 * 12 GiB)
    big = ModelShape(2 * 10**9, 10, 1000, 4000, 10_000)
    with pytest.raises(PlanDoesNotFit, match="critic's update needs ~11 GiB"):
        plan_memory(request(12, critic=big, has_reference=False))


# Published shapes on one H200: torch reports 150,754,820,096 B, so 128,141,597,081 B usable; the host
# has 126 GiB, so 94,704,028,876 B may be pinned. 512-token sequences (256 + 256), as bench/gpu_plan.sh runs.
H200 = dict(gpu_bytes=150_754_820_096, host_bytes=126 * GIB, max_sequence_length=512)


def published(name: str) -> tuple[ModelShape, ModelShape]:
    from relm.models.zoo import zoo_config

    config = zoo_config(name)
    return ModelShape.from_config(config), ModelShape.from_config(config, value_model=True)


def test_shapes_come_from_configs_without_weights():
    qwen, qwen_critic = published("Qwen/Qwen2.5-7B-Instruct")
    assert qwen.num_params == 7_615_616_512
    # the critic drops the untied 152,064 x 3,584 lm_head and adds a 3,584 + 1 value head
    assert qwen_critic.num_params == 7_615_616_512 - 152_064 * 3_584 + 3_585 == 7_070_622_721
    gemma, gemma_critic = published("google/gemma-2-9b-it")
    assert gemma.num_params == 9_241_705_984 and gemma_critic.num_params == 9_241_705_984 + 3_585  # tied head
    assert (gemma.num_layers, gemma.hidden_size, gemma.intermediate_size, gemma.vocab_size) == (
        42, 3584, 14336, 256_000,
    )  # fmt: skip


def test_qwen25_7b_grpo_keeps_fp32_with_its_moments_offloaded():
    # P = 7,615,616,512. Per checkpointed token 28 * 4 * 3584 + 2 * (12 * 3584 + 6 * 18944) + 4 * 152,064 =
    # 1,323,008 B; comfortable: 8704 tokens + 2 GiB = 13,662,945,280 B. fp32 with the reference and
    # engine copy resident: 18P + 4P is far over; moments offloaded: 10P + 2 GiB + 4P = 108,766,114,816,
    # + 13,662,945,280 = 122.4e9 fits; 8P = 60,924,932,096 B pinned
    actor, _ = published("Qwen/Qwen2.5-7B-Instruct")
    plan = plan_memory(PlanRequest(trainees(actor), has_reference=True, **H200))
    assert plan.rung == Rung(FP32, {"actor": FP32}) and plan.policy.offload_optimizer and not plan.given_up
    assert not (plan.park_reference or plan.park_engine_copy) and plan.host_bytes == 8 * actor.num_params
    # free = 128,141,597,081 - 108,766,114,816 - 2 GiB = 17,227,998,617 -> 13,021 tokens
    assert plan.policy.checkpointing and plan.max_tokens_per_microbatch == 12288


def test_qwen25_7b_ppo_stores_moments_in_bf16():
    # critic C = 7,070,622,721, no reference. fp32: the leanest pinning that fits the GPU offloads both
    # models' moments, 8P + 8C = 117,489,913,864 B, over 94.7e9. bf16 moments: offloading only the actor's
    # leaves the critic's update at 4P + 10C + 4C = 129,451,184,142 B even with the engine copy parked;
    # offloading both, parking the engine copy: actor phase 10P + 2 GiB + 4C = 106,586,139,652
    # (+ 13,662,945,280 fits), critic phase 4P + 10C + 2 GiB = 103,316,176,906, pinned 4P + 4C + 2P =
    # 73,976,189,956 B
    actor, critic = published("Qwen/Qwen2.5-7B-Instruct")
    plan = plan_memory(PlanRequest(trainees(actor, critic), has_reference=False, **H200))
    assert (
        plan.rung == Rung(FP32, {"actor": BF16, "critic": BF16})
        and plan.policy.offload_optimizer
        and plan.trainees["critic"].offload_optimizer
    )
    assert plan.park_engine_copy and not plan.trainees["critic"].parked and plan.host_bytes == 73_976_189_956
    assert plan.given_up == ["actor and critic AdamW moments stored in bf16 instead of fp32"]
    # free = 128,141,597,081 - 106,586,139,652 - 2 GiB = 19,407,973,781 -> 14,669 tokens
    assert plan.max_tokens_per_microbatch == 14336


def test_gemma2_9b_grpo_keeps_fp32_by_parking_the_reference():
    # P = 9,241,705,984; per checkpointed token 42 * 4 * 3584 + 2 * (12 * 3584 + 6 * 14336) + 4 * 256,000 =
    # 1,884,160 B; one sequence 3,112,173,568 B, comfortable 18,547,212,288 B. fp32, moments offloaded:
    # 14P + 2 GiB = 131.5e9 is over; reference parked 12P + 2 GiB = 113,047,955,456 holds one sequence, not a
    # comfortable batch; that needs the engine copy parked too, 12P = 110.9e9 pinned, over 94.7e9. So the
    # first layout that fits: reference parked, 8P + 2P = 92,417,059,840 B pinned
    actor, _ = published("google/gemma-2-9b-it")
    plan = plan_memory(PlanRequest(trainees(actor), has_reference=True, **H200))
    assert plan.rung == Rung(FP32, {"actor": FP32}) and plan.policy.offload_optimizer and plan.park_reference
    assert not plan.park_engine_copy and plan.host_bytes == 92_417_059_840 and not plan.given_up
    # free = 128,141,597,081 - 113,047,955,456 - 2 GiB = 12,946,158,977 -> 6,871 tokens
    assert plan.max_tokens_per_microbatch == 6144


def test_gemma2_9b_ppo_trains_bf16_weights():
    # C = 9,241,709,569. fp32 moments: pinning both 8P + 8C = 147.9e9. bf16 moments with fp32 weights: the
    # critic's update alone is 10C + 2 GiB beside the actor's 4P: 131,531,403,274 B, over 128.1e9. bf16
    # weights (2P + 2P + 4P, no engine copy): moments resident, critic parked, the critic's update holds
    # 2P + 4P + 2C + 2C + 4C = 129,383,912,456, over; the actor's moments offloaded, nothing parked: actor
    # phase 4P + 2 GiB + 6C = 94,564,564,998 (+ 18,547,212,288 fits), critic phase 2P + 8C = 92,417,088,520,
    # pinned 4P = 36,966,823,936 B
    actor, critic = published("google/gemma-2-9b-it")
    plan = plan_memory(PlanRequest(trainees(actor, critic), has_reference=False, **H200))
    assert (
        plan.rung == Rung(BF16, {"actor": BF16, "critic": BF16})
        and plan.policy.offload_optimizer
        and not plan.trainees["critic"].offload_optimizer
    )
    assert not (plan.trainees["critic"].parked or plan.park_engine_copy or plan.engine_copy)
    assert plan.host_bytes == 36_966_823_936 and len(plan.given_up) == 2
    # free = 128,141,597,081 - 94,564,564,998 - 2 GiB = 31,429,548,435 -> 16,680 tokens
    assert plan.max_tokens_per_microbatch == 16384


def test_mixtral_8x7b_does_not_fit_one_h200():
    # P = 46,702,792,704: even bf16 weights and gradients with offloaded moments and the reference parked are
    # 4P + 2 GiB = 188,958,654,464 B, and one sequence 512 * (32 * 4 * 4096 + 2 * (12 * 4096 + 6 * 14336) +
    # 4 * 32,000) + 2 GiB = 2,619,867,136 B more: 178.4 GiB
    actor, _ = published("mistralai/Mixtral-8x7B-Instruct-v0.1")
    assert actor.num_params == 46_702_792_704
    with pytest.raises(PlanDoesNotFit, match="actor's update needs ~178 GiB"):
        plan_memory(PlanRequest(trainees(actor), has_reference=True, **H200))


def test_cpu_runs_follow_the_users_settings_without_a_plan():
    from relm.config.loader import load_config
    from relm.memory.choices import build_residency, choose_memory
    from relm.models.loading import resolve_model_dir
    from tests.tiny_models import tiny_lm

    cfg = load_config(["actor_rollout_ref.actor.use_dynamic_bsz=true"])
    model_dir = resolve_model_dir(cfg.actor_rollout_ref.model.path)
    choices = choose_memory(translate(cfg)[0], model_dir, device=torch.device("cpu"))
    # unset checkpointing is off on CPU; unset budgets are verl's defaults; fp32 everything
    actor, critic = choices.models["actor"], choices.models["critic"]
    assert choices.plan is None and not actor.checkpointing
    assert (actor.max_tokens, critic.max_tokens) == (16384, 32768)
    assert choices.precision.master == FP32 and actor.moments_dtype == FP32
    cfg = load_config(
        ["actor_rollout_ref.model.enable_gradient_checkpointing=true", "critic.optim.moments_dtype=bfloat16"]
    )
    choices = choose_memory(translate(cfg)[0], model_dir, device=torch.device("cpu"))
    actor, critic = choices.models["actor"], choices.models["critic"]
    assert actor.checkpointing and actor.max_tokens is None
    assert (actor.moments_dtype, critic.moments_dtype) == (FP32, BF16)
    assert (
        build_residency(
            None,
            torch.device("cpu"),
            ref=tiny_lm(seed=0),
            engine_copy=None,
            trained={"critic": (tiny_lm(seed=1), None)},
        ).models
        == {}
    )


def test_moment_dtype_keys_are_checked_before_anything_loads():
    from relm.config.loader import load_config
    from relm.errors import UserError
    from relm.memory.choices import choose_memory

    cfg = load_config(["critic.optim.moments_dtype=float16"])
    with pytest.raises(UserError, match="`critic.optim.moments_dtype=float16`: choose float32 or bfloat16"):
        choose_memory(translate(cfg)[0], "unused", device=torch.device("cpu"))
    cfg = load_config(["actor_rollout_ref.actor.optim.moments_dtype=bfloat16"])
    with pytest.raises(UserError, match="applies to single-process runs"):
        choose_memory(translate(cfg)[0], "unused", device=torch.device("cpu"), sharded=True)


# LoRA (issue 19 part 3). The made-up shape with adapters of T = 1e7 trainable parameters: the frozen base is
# loaded as the trained weights are (fp32 master weights: 4e9; autocast caches no bf16 copy of a frozen
# weight), the adapters hold fp32 weights and gradients and their bf16 autocast copies (10 T = 1e8) and fp32
# moments (8 T = 8e7); the reference is the base with the adapters off (no copy); the engine's bf16 copy
# stays (2e9). Actor phase 6.18e9.
def test_lora_counts_only_adapter_gradients_and_moments_and_no_reference():
    plan = plan_memory(request(22, TraineeRequest(SHAPE, lora=Lora(8, 10**7))))
    # usable int(0.85 * 22 GiB) = 20,078,972,108; free 20,078,972,108 - 6.18e9 - 2 GiB = 11,751,488,460,
    # 15,462 tokens without checkpointing, rounded to 15,360 (>= 8,192: checkpointing off)
    assert plan.rung == Rung(FP32, {"actor": FP32}) and not plan.policy.checkpointing and not plan.given_up
    assert (
        not (plan.park_reference or plan.park_engine_copy or plan.policy.offload_optimizer)
        and plan.host_bytes == 0
    )
    assert plan.max_tokens_per_microbatch == 15360
    assert plan.update_peak_bytes == 6_180_000_000 + 2 * GIB + 15360 * 760_000 == 20_001_083_648
    # the same GPU without LoRA holds 22e9 and needs gradient checkpointing (test_tight_gpu above)
    assert plan_memory(request(22)).policy.checkpointing
    # a LoRA checkpoint stages the adapters only: 4 T
    assert plan.checkpoint_staging_bytes == 4 * 10**7 and plan.host_peak_bytes == 4 * 10**7
    assert "actor: LoRA rank 8, 10.0M trainable parameters" in plan.describe()
    assert "LoRA adapters in fp32 on its frozen fp32 base" in plan.describe()


def test_qwen25_7b_lora_and_full_peaks_within_10_percent_of_the_h200s():
    # bench/gpu_lora.sh's run: Qwen2.5-7B GRPO, LoRA rank 64 on all-linear, KL loss (the reference is the
    # base with adapters off), 512-token sequences. P = 7,615,616,512, T = 161,480,704. The update holds
    # the fp32 base 4P = 30,462,466,048, the adapters' weights, gradients, autocast copies 10T =
    # 1,614,807,040 and moments 8T = 1,291,845,632, the engine's bf16 copy 2P = 15,231,233,024: 48,600,351,744
    # + 2 GiB of log-softmax scratch = 50,747,835,392 fixed. Per checkpointed token 1,323,008 (as full
    # fine-tuning) + one layer's saved adapter inputs 2 * (6 * 3584 + 18944) = 80,896: 1,403,904. At a
    # largest micro-batch of 3,853 tokens (what docs/benchmarks.md's 52.3 GiB corresponds to) that is
    # 56,157,077,504 B = 52.3 GiB, where the H200 measured 58.76 GiB (+12%): that peak was the engine's copy,
    # then a deep copy of the fp32 actor (adapters included) cast to bf16 after, 2 (4P + 4T) = 57.94 GiB.
    # The copy is now built tensor by tensor in bf16: 4P + 4T beside 2P of copy and one fp32 vocabulary
    # matrix in flight (4 * 152,064 * 3,584 = 2,179,989,504), 48,519,611,392 B, below the update.
    actor, _ = published("Qwen/Qwen2.5-7B-Instruct")
    lora = Lora(64, 161_480_704)
    lora_request = PlanRequest(
        trainees(TraineeRequest(actor, lora=lora)), has_reference=True, compiled_layers=True, **H200
    )
    plan = plan_memory(lora_request)
    assert plan.rung == Rung(FP32, {"actor": FP32}) and plan.engine_copy and plan.policy.checkpointing
    assert plan.update_fixed_bytes == 50_747_835_392 and plan.update_bytes_per_token == 1_403_904
    assert plan.update_peak_at(3853) == 56_157_077_504
    assert plan.startup_peak_bytes == 6 * 7_615_616_512 + 4 * 161_480_704 + 2_179_989_504 == 48_519_611_392
    assert plan.gpu_peak_at(3853) == plan.update_peak_at(3853) == 56_157_077_504
    assert "start-up peak ~45.2 GiB while the engine's copy is made" in plan.describe()
    # full fine-tuning at the same shape (bench/gpu_lora.sh's q7_full: 90.5 GiB measured). Training compiles
    # the norms and MLPs, so autocast caches bf16 copies of the attention projections only, A = 28 * (2 *
    # 3584^2 + 2 * 3584 * 512 + 3584 + 2 * 512) = 822,212,608 parameters: with the moments offloaded the update
    # holds 8P + 2A + a 2 GiB chunk + the reference and engine copies 4P + 2 GiB scratch = 97,326,790,656 B;
    # at its largest micro-batch of about 4,060 tokens 102,698,203,136 B = 95.6 GiB (-5.4%). Counting 2P of
    # copies, as before, it was 108.3 GiB (-16%). Its copy (8P) stays below the update.
    full = plan_memory(PlanRequest(trainees(actor), has_reference=True, compiled_layers=True, **H200))
    assert actor.autocast_cached_params == 822_212_608 and full.policy.offload_optimizer
    assert full.update_fixed_bytes == 12 * 7_615_616_512 + 2 * 822_212_608 + 4 * GIB == 97_326_790_656
    assert full.gpu_peak_at(4060) == full.update_peak_at(4060) == 102_698_203_136
    assert abs(90.5 * GIB - full.gpu_peak_at(4060)) / (90.5 * GIB) < 0.1
    assert full.startup_peak_bytes == 6 * 7_615_616_512 + 2_179_989_504
    uncompiled = plan_memory(PlanRequest(trainees(actor), has_reference=True, **H200))
    assert uncompiled.update_fixed_bytes == 14 * 7_615_616_512 + 4 * GIB  # 2P of autocast copies
    # held to a 48 GB card (40.8e9 usable) the fp32 base's update (50.7e9 fixed) is over: the plan loads the
    # base in bf16, which the engine generates on directly (no copy); the fp32 base had run out of memory at
    # 44.6 GiB making the old fp32 copy
    small = plan_memory(replace(lora_request, gpu_bytes=48 * 10**9))
    assert (
        small.rung == Rung(BF16, {"actor": FP32}) and not small.engine_copy and not small.startup_peak_bytes
    )


LINEARS = tuple(
    (f"layers.{i}.{name}", fan_in, fan_out)
    for i in range(10)
    for name, fan_in, fan_out in (("q", 1000, 1000), ("up", 1000, 4000), ("down", 4000, 1000))
)


def test_lora_parameters_are_rank_times_in_plus_out_per_target():
    shape = replace(SHAPE, linears=LINEARS, head_params=1001)
    # per layer 64 * (2000 + 5000 + 5000) = 768,000; ten layers; the value head (1001) trains whole
    assert shape.lora_params(64) == 7_680_000 + 1001
    assert shape.lora_params(64, ["q"]) == 10 * 64 * 2000 + 1001
    assert shape.lora_params(64, exclude_modules=["down"]) == 10 * 64 * 7000 + 1001
    assert shape.lora_params(64, "layers\\.0\\..*") == 768_000 + 1001  # a string is a regex on the full name


def test_lora_of_a_real_shape_counts_like_peft():
    # Qwen2.5-7B, rank 64, all-linear: PEFT reports 161,480,704 trainable parameters
    actor, _ = published("Qwen/Qwen2.5-7B-Instruct")
    assert actor.lora_params(64) == 161_480_704
    assert len(actor.linears) == 28 * 7  # q k v o gate up down per layer; no lm_head


def test_does_not_fit_offers_lora_with_its_rank_and_figures():
    shape = replace(SHAPE, linears=LINEARS)
    # 6 GiB GPU (5,475,663,052 B usable): even bf16 weights and gradients with a 2 GiB chunk of moments,
    # 4e9 + 2 GiB, leave no room for one sequence (2,303,131,648 B)
    small = request(6, actor=shape)
    with pytest.raises(PlanDoesNotFit, match="actor's update needs ~8 GiB"):
        plan_memory(small)
    # LoRA rank 64, T = 7,680,000: an fp32 base (4e9) leaves no room either; a bf16 base generated on directly
    # (the last rung) holds 2e9 + 10 T + 8 T = 2,138,240,000 and one sequence fits, nothing pinned
    offer = lora_offer(small)
    assert offer is not None and offer.startswith("LoRA would fit: actor_rollout_ref.model.lora_rank=64")
    assert "(all-linear with the base in bf16) trains 8M parameters" in offer
    assert "~0 GiB of pinned host memory" in offer
    plan = plan_memory(with_lora(small, {"actor": Lora(64, 7_680_000)}))
    assert plan.given_up == ["the LoRA base held in bf16 instead of fp32 (the adapters train in fp32)"]
    assert plan.rung == Rung(BF16, {"actor": FP32}) and not plan.engine_copy
    assert lora_offer(request(1, actor=shape)) is None  # not even LoRA fits 1 GiB


def test_checkpoint_staging_counts_against_the_host():
    # full fine-tuning stages a model's fp32 weights (4e9) and its largest moment (4 * 10,000 * 1,000)
    plan = plan_memory(request(40))
    assert plan.checkpoint_staging_bytes == 4_040_000_000 and plan.host_bytes == 0
    assert plan_memory(request(40, host_bytes=4 * GIB, saves_checkpoints=False)).host_bytes == 0
    with pytest.raises(PlanDoesNotFit, match="a checkpoint stages ~4 GiB more, over the 3 GiB"):
        plan_memory(request(40, host_bytes=3 * GIB))


def test_cpu_runs_need_every_model_in_host_memory():
    # fp32 actor 16e9 (weights, gradients, moments), reference 4e9; a micro-batch of 4 responses of
    # 1024-token rows: fp32 activations 4 * 2 * 720,000 * 1024, and its logits over the 511 response
    # tokens + 1 in 8 passes a step (`cpu_logit_bytes`, worked above: 519,480,000); what the run loads after the plan,
    # 64 MiB + the tokenizer's 1,600 bytes an entry * 10,000; a checkpoint's staging 4.04e9
    cpu = request(
        0, autocast=False, generation_dtype=None, cpu_rows_per_microbatch=4, response_length=511,
        cpu_microbatches_per_step=8,
    )  # fmt: skip
    rows = 5_898_240_000 + 519_480_000 + 64 * 2**20 + 16_000_000
    assert cpu_host_need(cpu) == 20e9 + rows + 4_040_000_000
    lora = with_lora(cpu, {"actor": Lora(8, 10**7)})
    # LoRA: fp32 base 4e9, adapters 8 T + 8 T, no reference; staging 4 T
    assert cpu_host_need(lora) == 4e9 + 16 * 10**7 + rows + 4 * 10**7


def test_cpu_logit_bytes_count_two_full_copies_four_chunks_and_the_kept_heap():
    # live: 4 bytes * vocabulary * (2 copies of rows * (response + 1) positions + 4 chunks of the
    # positions 2^22 values hold); with more than one pass a step, 1 + KEEP_FACTOR (2.25) times that with
    # the free memory the heap keeps between passes.
    # README's verl block: 151,665 entries, 1 row, 256 tokens: a chunk is 4,194,304 // 151,665 = 27
    # positions (part of the row); 4 * 151,665 * (2 * 257 + 4 * 27) = 377,342,520 live
    assert cpu_logit_bytes(151_665, rows=1, response_length=256, microbatches=32) == 849_020_670
    # README's GSM8K tour: 8 rows of 16 tokens, one pass a step: a chunk is one whole row (27 // 16 = 1
    # row of 16); 4 * 151,665 * (2 * 8 * 17 + 4 * 16) = 203,837,760 live, nothing kept
    assert cpu_logit_bytes(151_665, rows=8, response_length=16, microbatches=1) == 203_837_760
    assert cpu_logit_bytes(151_665, rows=8, response_length=16, microbatches=2) == 458_634_960
    # the plan test's shape below: 10,000 entries, 4 rows of 511: 419 positions a chunk;
    # 4 * 10,000 * (2 * 4 * 512 + 4 * 419) = 230,880,000 live
    assert cpu_logit_bytes(10_000, rows=4, response_length=511, microbatches=8) == 519_480_000
    # a vocabulary past 2^22 entries still takes one position a chunk; no response (a plan without one)
    assert cpu_logit_bytes(5_000_000, rows=1, response_length=0, microbatches=2) == int(
        2.25 * 4 * 5_000_000 * (2 + 4)
    )


def test_cpu_micro_batch_keeps_one_copy_of_the_logits_within_256_mib():
    # README's verl block: mini-batch 8 prompts x n=4, 256 response tokens, Qwen2.5's 151,665 entries:
    # 4 * 151,665 * 257 = 156 MB a row, so one row; the demo's 101 entries keep relm's 16.
    from relm.config.loader import load_config
    from relm.memory.cpu_batching import default_rows_per_microbatch

    verl = translate(load_config(
        ["actor_rollout_ref.rollout.n=4", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
         "data.max_response_length=256"]
    ))[0]  # fmt: skip
    assert default_rows_per_microbatch(verl) == 16  # a GPU run
    assert default_rows_per_microbatch(verl, cpu_vocab_size=151_665) == 1
    assert default_rows_per_microbatch(verl, cpu_vocab_size=16_000) == 16  # 16.4 MB a row
    assert default_rows_per_microbatch(verl, cpu_vocab_size=40_000) == 6  # 41.1 MB a row


def test_cpu_passes_a_step_count_every_minibatch_micro_batch_and_epoch():
    from relm.config.loader import load_config
    from relm.memory.choices import _microbatches_per_step

    def spec(*overrides: str):
        return translate(
            load_config(
                [
                    "actor_rollout_ref.rollout.n=4",
                    "data.train_batch_size=8",
                    "actor_rollout_ref.actor.ppo_epochs=1",
                    *overrides,
                ]
            )
        )[0]

    # README's verl block: one mini-batch of 8 prompts x 4 = 32 rows, one row a pass: 32
    assert _microbatches_per_step(spec("actor_rollout_ref.actor.ppo_mini_batch_size=8"), 1) == 32
    # README's GSM8K tour: 4 prompts x 2 = 8 rows, all in one pass
    gsm8k = spec(
        "data.train_batch_size=4",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    )
    assert _microbatches_per_step(gsm8k, 8) == 1
    # 2 mini-batches of 4 prompts (16 rows, 3 passes of up to 6 rows each), 2 epochs: 2 * 3 * 2
    two = spec("actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_epochs=2")
    assert _microbatches_per_step(two, 6) == 12


def test_autocast_caches_the_eager_casts_of_weights_not_the_compiled_pieces():
    # What `autocast_cached_params` rests on: autocast keeps the bf16 copy of an fp32 weight it cast eagerly
    # (a later change of the weight goes unseen until the cache is cleared), also under checkpointing,
    # while a compiled function casts inside its graph and keeps nothing.
    from torch.nn import functional as F  # noqa: N812
    from torch.utils.checkpoint import checkpoint

    from tests.tiny_models import tiny_lm

    weight, x = torch.nn.Parameter(torch.randn(16, 16)), torch.randn(4, 16)

    def keeps_a_copy(fn) -> bool:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            before = fn(x).float()
            with torch.no_grad():
                weight.add_(1.0)
            after = fn(x).float()
        return torch.equal(before, after)

    assert keeps_a_copy(lambda y: F.linear(y, weight))
    assert keeps_a_copy(lambda y: checkpoint(lambda z: F.linear(z, weight), y, use_reentrant=False))
    assert not keeps_a_copy(torch.compile(lambda y: F.linear(y, weight), backend="aot_eager"))
    # a tiny Qwen2: the eager Linear layers are q, k, v (with biases) and o; the MLPs and norms compile
    model = tiny_lm()
    layer = model.model.layers[0].self_attn
    attention = sum(
        p.numel()
        for proj in (layer.q_proj, layer.k_proj, layer.v_proj, layer.o_proj)
        for p in proj.parameters()
    )
    assert ModelShape.of(model).autocast_cached_params == model.config.num_hidden_layers * attention


def test_the_distillation_teachers_are_priced_and_parked_after_the_reference():
    # A teacher of 5e9 parameters adds 2 bytes each (bf16 under autocast) to every phase.
    alone, taught = plan_memory(request(100)), plan_memory(request(100, teacher_params=5 * 10**9))
    assert taught.update_fixed_bytes - alone.update_fixed_bytes == 10 * 10**9
    # 27 GiB (see test_parks_the_reference_first): with a 1e9-parameter teacher, parking the reference
    # (2e9) leaves 22e9 + 3,548,315,648 over 24,642,374,860; parking the teacher too fits.
    plan = plan_memory(request(27, teacher_params=10**9))
    assert plan.park_reference and plan.park_teachers and not plan.park_engine_copy
    assert plan.host_bytes == 4 * 10**9
    assert "waiting on the CPU outside their phases: reference, teachers" in plan.describe()
