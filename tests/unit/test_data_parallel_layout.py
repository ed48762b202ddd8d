"""Which layout each model of a data-parallel run takes (`relm.distributed.layout`), what memory settings
follow from it (`relm.memory.choices`), and the single-process side of `relm.distributed.gathering`.

The plan figures use test_memory_plan's made-up shape (1e9 parameters): a 100 GiB GPU keeps everything
with checkpointing off and 65,536-token micro-batches, a 27 GiB GPU parks the reference, a 20 GiB GPU
also keeps the actor's AdamW moments in CPU memory, a 10 GiB GPU fits only at a lower precision rung
with moments in CPU memory, a 2 GiB GPU not at all.
"""

from __future__ import annotations

import pytest
import torch

from relm.config.loader import load_config
from relm.config.translate import translate
from relm.config.validate import validate_config
from relm.distributed.gathering import NO_CHANGE, Accumulation, choose_for_update, fits, gathered_for_passes
from relm.distributed.layout import Layout, decide_layout, describe_layouts
from relm.errors import UserError
from relm.memory.choices import data_parallel_choices, data_parallel_plan, whole_model_plan
from relm.memory.plan import GIB, ModelShape, PlanRequest, TraineeRequest
from relm.models.precision import pick_precision
from tests.tiny_models import tiny_lm

SHAPE = ModelShape(
    num_params=10**9, num_layers=10, hidden_size=1000, intermediate_size=4000, vocab_size=10_000
)
KEY = "actor_rollout_ref.actor.fsdp_config.fsdp_size"
FP32 = pick_precision("auto", torch.device("cpu"))


def plan_request(cfg, actor: ModelShape, critic: ModelShape | None, *, gpu_bytes: int) -> PlanRequest:
    """What a single-GPU run of `cfg` asks the planner with the made-up shape and plenty of host memory."""
    arr = cfg.actor_rollout_ref
    policy = TraineeRequest(
        actor,
        checkpointing=arr.model.enable_gradient_checkpointing,
        max_tokens=arr.actor.ppo_max_token_len_per_gpu,
    )
    return PlanRequest(
        trainees={"actor": policy} | ({"critic": TraineeRequest(critic)} if critic is not None else {}),
        has_reference=arr.actor.use_kl_loss,
        max_sequence_length=cfg.data.max_prompt_length + cfg.data.max_response_length,
        gpu_bytes=gpu_bytes,
        host_bytes=1024 * GIB,
    )


def layout(value: int | None, world_size: int = 2, fits: bool = True) -> Layout:
    return decide_layout(value, key=KEY, world_size=world_size, plan_fits=fits, plan_reason="PLAN")


def test_unset_follows_the_plan_and_an_explicit_size_wins():
    assert (layout(None).shard_size, layout(None).reason) == (1, "PLAN")  # fits one GPU: replicated
    assert layout(None, fits=False).shard_size == 2  # does not: sharded over all ranks
    assert layout(-1).shard_size == 2 and layout(-1).reason == "fsdp_size=-1 in the config"  # verl's -1
    assert layout(1, fits=False).replicated  # the user's 1 even when the plan would shard
    hybrid = layout(2, world_size=8)
    assert (hybrid.shard_size, hybrid.num_copies, hybrid.kind()) == (2, 4, "sharded over 2 ranks, 4 copies")


@pytest.mark.parametrize("value", [3, 0, -2])
def test_a_size_that_does_not_divide_the_ranks_is_named(value: int):
    with pytest.raises(
        UserError, match=rf"`{KEY}={value}` must divide the 4 data-parallel ranks; use one of 1, 2, 4"
    ):
        layout(value, world_size=4)


def test_config_validation_checks_every_models_size_against_the_world_size():
    base = ["trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"]
    validate_config(load_config([*base, "actor_rollout_ref.ref.fsdp_config.fsdp_size=1"]))
    for key in ("actor_rollout_ref.ref.fsdp_config.fsdp_size", "critic.model.fsdp_config.fsdp_size"):
        with pytest.raises(UserError, match=f"`{key}=4` must divide the 2 data-parallel ranks"):
            validate_config(load_config([*base, f"{key}=4"]))


def test_the_start_up_line_groups_models_by_layout():
    replicated = Layout(1, 2, "the memory plan fits one GPU")
    assert describe_layouts({"actor": replicated}) == (
        "data parallel: 2 ranks, each holds the whole actor (replicated; the memory plan fits one GPU)"
    )
    sharded = Layout(4, 4, "no memory plan on cpu")
    assert describe_layouts({"actor": sharded, "reference": sharded, "critic": sharded}) == (
        "data parallel: 4 ranks, the actor, reference and critic sharded over 4 ranks (no memory plan on cpu)"
    )
    mixed = {
        "actor": Layout(1, 4, "fsdp_size=1 in the config"),
        "critic": Layout(2, 4, "fsdp_size=2 in the config"),
    }
    assert describe_layouts(mixed) == (
        "data parallel: 4 ranks, each holds the whole actor (replicated; fsdp_size=1 in the config); "
        "the critic sharded over 2 ranks, 2 copies (fsdp_size=2 in the config)"
    )


def test_a_plan_that_keeps_everything_on_one_gpu_is_what_replicated_models_run():
    cfg = load_config(
        ["actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.use_dynamic_bsz=true"]
    )
    plan, reason = whole_model_plan(plan_request(cfg, SHAPE, None, gpu_bytes=100 * GIB))
    assert plan is not None and reason == "the memory plan fits one GPU"
    replicated = data_parallel_choices(
        translate(cfg)[0], plan, FP32, replicated={"actor": True, "critic": False}
    )
    # micro-batches by tokens: the plan's budget; checkpointing as the plan chose (off)
    actor = replicated.models["actor"]
    assert (actor.checkpointing, actor.max_tokens) == (False, 65536)
    assert replicated.plan is plan
    sharded = data_parallel_choices(
        translate(cfg)[0], plan, FP32, replicated={"actor": False, "critic": False}
    )
    actor = sharded.models["actor"]
    assert (actor.checkpointing, actor.max_tokens, sharded.plan) == (False, 16384, None)
    cfg.actor_rollout_ref.model.enable_gradient_checkpointing = True  # the user's choice is kept
    plan, _ = whole_model_plan(plan_request(cfg, SHAPE, None, gpu_bytes=100 * GIB))
    assert (
        data_parallel_choices(translate(cfg)[0], plan, FP32, replicated={"actor": True, "critic": False})
        .models["actor"]
        .checkpointing
    )


def test_a_plan_that_parks_or_does_not_fit_makes_the_run_shard():
    cfg = load_config(["actor_rollout_ref.actor.use_kl_loss=true", "data.max_prompt_length=512"])
    parked, reason = whole_model_plan(plan_request(cfg, SHAPE, None, gpu_bytes=27 * GIB))
    assert parked is None and reason == "one GPU would keep the reference in CPU memory"
    offloads, reason = whole_model_plan(plan_request(cfg, SHAPE, None, gpu_bytes=20 * GIB))
    assert (
        offloads is None
        and reason == "one GPU would keep the reference and the actor's AdamW moments in CPU memory"
    )
    # 10 GiB: only a lower precision rung would fit (bf16 weights); replication needs fp32 whole
    lower, reason = whole_model_plan(plan_request(cfg, SHAPE, None, gpu_bytes=10 * GIB))
    assert lower is None and "CPU memory" in reason
    big, reason = whole_model_plan(plan_request(cfg, SHAPE, None, gpu_bytes=2 * GIB))
    assert big is None and reason.startswith("the memory plan does not fit one GPU: ")
    assert layout(None, fits=big is not None).shard_size == 2
    # without a plan every model follows the config, replicated or not
    user = data_parallel_choices(translate(cfg)[0], None, FP32, replicated={"actor": True, "critic": True})
    actor = user.models["actor"]
    assert (actor.checkpointing, actor.max_tokens, user.plan) == (False, None, None)


def test_a_data_parallel_run_plans_from_the_model_folders_config(monkeypatch):
    """The layout is decided before anything loads: the plan reads the shapes from the configs."""
    from relm.memory import choices as memory
    from relm.models.loading import resolve_model_dir

    folder = resolve_model_dir("zoo:tiny/qwen2")
    cfg = load_config(["algorithm.adv_estimator=gae"])
    assert data_parallel_plan(translate(cfg)[0], folder, torch.device("cpu")) == (
        None,
        "no memory plan on cpu",
    )
    monkeypatch.setattr(memory, "device_memory", lambda device: (80 * GIB, 256 * GIB))
    plan, reason = data_parallel_plan(translate(cfg)[0], folder, torch.device("cpu"))
    assert plan is not None and reason == "the memory plan fits one GPU"
    monkeypatch.setattr(memory, "device_memory", lambda device: (GIB // 2, 256 * GIB))
    plan, reason = data_parallel_plan(translate(cfg)[0], folder, torch.device("cpu"))
    assert plan is None and reason.startswith("the memory plan does not fit one GPU: ")


def test_gathering_budget_and_a_plain_model_left_alone():
    assert fits(50, 100) and not fits(51, 100) and fits(10**15, None)  # half of what is free; CPU: always
    model = tiny_lm()
    assert choose_for_update(model, torch.device("cpu")) == NO_CHANGE
    ids = torch.randint(0, 64, (2, 5))
    with Accumulation.planned(model, torch.device("cpu")) as accumulation:
        accumulation.backward(model(input_ids=ids).logits.square().mean(), last=False)
        accumulation.end_minibatch()
    expected = tiny_lm()
    expected(input_ids=ids).logits.square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), expected.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad), name  # a plain model: loss.backward(), nothing else
    with gathered_for_passes(model, torch.device("cpu")) as held:
        assert not held


def test_a_sharded_run_accepts_fp32_moments_and_refuses_bf16_ones():
    """Sharded runs step with torch's AdamW: `moments_dtype=float32` asks for what runs anyway."""
    from relm.memory.choices import choose_memory
    from relm.models.loading import resolve_model_dir

    folder = resolve_model_dir("zoo:tiny/qwen2")
    key = "actor_rollout_ref.actor.optim.moments_dtype"
    fp32 = choose_memory(
        translate(load_config([f"{key}=float32"]))[0], folder, device=torch.device("cpu"), sharded=True
    )
    assert fp32.models["actor"].moments_dtype == torch.float32
    with pytest.raises(UserError, match="single-process runs"):
        choose_memory(
            translate(load_config([f"{key}=bfloat16"]))[0], folder, device=torch.device("cpu"), sharded=True
        )
