"""The memory plan of a run: computed from the built models before the first step, applied, printed.

The arithmetic is `relm.training.memory_plan`; this module reads the run's side of it (shapes,
lengths, the GPU's and the host's memory, the user's explicit settings) and turns the decisions into
gradient checkpointing, micro-batch token budgets and the phases' `Residency`. It plans a single
CUDA process only: on CPU nothing is planned (checkpointing stays off unless asked for, it only
costs time there), and sharded runs size themselves through FSDP2 (`fsdp_config.offload_policy`).

A data-parallel run asks the same question first (`whole_model_plan`): when one GPU's plan keeps every
model on the GPU, each rank can hold the models whole (`relm.distributed.layout`) and runs that plan
on its own rows (`data_parallel_choices`); a model that ends up sharded follows the user's settings.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
from torch import nn

from relm.config.schema import RelmConfig
from relm.errors import UserError
from relm.training.memory_plan import MemoryPlan, ModelShape, PlanDoesNotFit, PlanRequest, plan_memory
from relm.training.offload import ParkedModel, Residency

logger = logging.getLogger("relm")


@dataclass
class MemoryChoices:
    """What the run uses, planned or as the user set it."""

    actor_checkpointing: bool
    critic_checkpointing: bool
    actor_max_tokens: int | None
    """Token budget of actor/reference micro-batches; None cuts them by rows."""
    critic_max_tokens: int | None
    plan: MemoryPlan | None = None


def choose_memory(
    cfg: RelmConfig,
    actor: nn.Module,
    critic: nn.Module | None,
    *,
    has_generator_copy: bool,
    device: torch.device,
    sharded: bool = False,
) -> MemoryChoices:
    """The plan on a single GPU (raising `UserError` when the run cannot fit), else the user's settings.

    Raises:
        UserError: the planner finds no arrangement that fits; the message names what does not.
    """
    if device.type != "cuda" or sharded or cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes > 1:
        return user_choices(cfg)
    request = plan_request(
        cfg,
        ModelShape.of(actor),
        ModelShape.of(critic) if critic is not None else None,
        has_generator_copy=has_generator_copy,
        gpu_bytes=torch.cuda.get_device_properties(device).total_memory,
    )
    try:
        plan = plan_memory(request)
    except PlanDoesNotFit as exc:
        raise UserError(
            f"`{cfg.actor_rollout_ref.model.path}` does not fit one GPU for this run: {exc}; use more GPUs "
            "(trainer.n_gpus_per_node) or shorter data.max_prompt_length / data.max_response_length"
        ) from None
    return planned_choices(cfg, plan)


def plan_request(
    cfg: RelmConfig,
    actor: ModelShape,
    critic: ModelShape | None,
    *,
    has_generator_copy: bool,
    gpu_bytes: int,
) -> PlanRequest:
    """What a single-GPU run of `cfg` asks the planner, on a GPU of `gpu_bytes`."""
    arr = cfg.actor_rollout_ref
    return PlanRequest(
        actor=actor,
        critic=critic,
        has_reference=cfg.algorithm.use_kl_in_reward or arr.actor.use_kl_loss,
        has_generator_copy=has_generator_copy,
        max_sequence_length=cfg.data.max_prompt_length + cfg.data.max_response_length,
        gpu_bytes=gpu_bytes,
        host_bytes=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        user_checkpointing=arr.model.enable_gradient_checkpointing,
        user_critic_checkpointing=cfg.critic.model.enable_gradient_checkpointing,
        user_max_tokens=arr.actor.ppo_max_token_len_per_gpu,
    )


def _critic_dynamic(cfg: RelmConfig) -> bool:
    actor_cfg, critic_cfg = cfg.actor_rollout_ref.actor, cfg.critic
    return actor_cfg.use_dynamic_bsz if critic_cfg.use_dynamic_bsz is None else critic_cfg.use_dynamic_bsz


def user_choices(cfg: RelmConfig) -> MemoryChoices:
    """What the config says, without a plan: unset checkpointing is off, unset budgets verl's defaults."""
    arr = cfg.actor_rollout_ref
    actor_cfg, critic_cfg = arr.actor, cfg.critic
    return MemoryChoices(
        actor_checkpointing=bool(arr.model.enable_gradient_checkpointing),
        critic_checkpointing=bool(critic_cfg.model.enable_gradient_checkpointing),
        actor_max_tokens=(actor_cfg.ppo_max_token_len_per_gpu or 16384)
        if actor_cfg.use_dynamic_bsz
        else None,
        critic_max_tokens=(critic_cfg.ppo_max_token_len_per_gpu or 32768) if _critic_dynamic(cfg) else None,
    )


def planned_choices(cfg: RelmConfig, plan: MemoryPlan) -> MemoryChoices:
    """The plan's checkpointing and token budgets (micro-batches by tokens unless the user fixed
    their row count)."""
    actor_cfg, critic_cfg = cfg.actor_rollout_ref.actor, cfg.critic
    by_tokens = actor_cfg.use_dynamic_bsz or actor_cfg.ppo_micro_batch_size_per_gpu is None
    critic_by_tokens = _critic_dynamic(cfg) or critic_cfg.ppo_micro_batch_size_per_gpu is None
    return MemoryChoices(
        actor_checkpointing=plan.gradient_checkpointing,
        critic_checkpointing=plan.critic_gradient_checkpointing,
        actor_max_tokens=plan.max_tokens_per_microbatch if by_tokens else None,
        critic_max_tokens=(critic_cfg.ppo_max_token_len_per_gpu or plan.max_tokens_per_microbatch)
        if critic_by_tokens
        else None,
        plan=plan,
    )


def whole_model_plan(request: PlanRequest) -> tuple[MemoryPlan | None, str]:
    """One GPU's plan when it keeps every model on the GPU (nothing parked, AdamW moments on the GPU),
    else None; and the phrase saying which, for the data-parallel start-up line."""
    try:
        plan = plan_memory(request)
    except PlanDoesNotFit as exc:
        return None, f"the memory plan does not fit one GPU: {exc}"
    waiting = [
        name
        for name, on in (
            ("the reference", plan.park_reference),
            ("the generator copy", plan.park_generator),
            ("the critic", plan.park_critic),
            ("the actor's AdamW moments", plan.offload_optimizer),
        )
        if on
    ]
    if waiting:
        listed = " and ".join([", ".join(waiting[:-1]), waiting[-1]] if len(waiting) > 1 else waiting)
        return None, f"one GPU would keep {listed} in CPU memory"
    return plan, "the memory plan fits one GPU"


def data_parallel_choices(
    cfg: RelmConfig, plan: MemoryPlan | None, *, actor_replicated: bool, critic_replicated: bool
) -> MemoryChoices:
    """Per model: the single-GPU plan's choices when the model is replicated and the plan holds every
    model whole (`whole_model_plan`), else the user's settings. The actor's budget also cuts the
    reference's forwards."""
    user = user_choices(cfg)
    if plan is None:
        return user
    planned = planned_choices(cfg, plan)
    actor, critic = (planned if actor_replicated else user), (planned if critic_replicated else user)
    return MemoryChoices(
        actor_checkpointing=actor.actor_checkpointing,
        critic_checkpointing=critic.critic_checkpointing,
        actor_max_tokens=actor.actor_max_tokens,
        critic_max_tokens=critic.critic_max_tokens,
        plan=plan if actor_replicated or critic_replicated else None,
    )


def critic_shape(cfg: RelmConfig, critic_dir: str) -> ModelShape:
    """The critic's shape from a weightless (meta-device) skeleton: a data-parallel run decides its
    layout before the critic is loaded."""
    from transformers import AutoModelForCausalLM

    from relm.models.loading import load_config, registered_model_class
    from relm.models.value_model import ValueModel

    model_cfg = cfg.critic.model
    _, config, _ = load_config(
        critic_dir, override_config=model_cfg.override_config, trust_remote_code=model_cfg.trust_remote_code
    )
    model_class = registered_model_class((getattr(config, "architectures", None) or [None])[0])
    with torch.device("meta"):
        if model_class is not None:
            causal_lm = model_class._from_config(config)
        else:
            causal_lm = AutoModelForCausalLM.from_config(
                config, trust_remote_code=model_cfg.trust_remote_code
            )
        return ModelShape.of(ValueModel(causal_lm))


def build_residency(
    plan: MemoryPlan | None,
    device: torch.device,
    *,
    ref: nn.Module | None,
    generator: nn.Module | None,
    critic: nn.Module | None,
    critic_optimizer: torch.optim.Optimizer | None,
) -> Residency:
    """The models the plan parks outside their phases (none without a plan)."""
    models: dict[str, ParkedModel] = {}
    if plan is not None:
        if plan.park_reference and ref is not None:
            models["reference"] = ParkedModel(ref, device)
        if plan.park_generator and generator is not None:
            models["generator"] = ParkedModel(generator, device)
        if plan.park_critic and critic is not None:
            models["critic"] = ParkedModel(critic, device, critic_optimizer)
    return Residency(models)
