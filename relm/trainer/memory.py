"""The memory plan of a run: computed from the built models before the first step, applied, printed.

The arithmetic is `relm.training.memory_plan`; this module reads the run's side of it (shapes,
lengths, the GPU's and the host's memory, the user's explicit settings) and turns the decisions into
gradient checkpointing, micro-batch token budgets and the phases' `Residency`. It plans a single
CUDA process only: on CPU nothing is planned (checkpointing stays off unless asked for, it only
costs time there), and sharded runs size themselves through FSDP2 (`fsdp_config.offload_policy`).
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
    arr = cfg.actor_rollout_ref
    actor_cfg, critic_cfg = arr.actor, cfg.critic
    critic_dynamic = (
        actor_cfg.use_dynamic_bsz if critic_cfg.use_dynamic_bsz is None else critic_cfg.use_dynamic_bsz
    )
    choices = MemoryChoices(
        actor_checkpointing=bool(arr.model.enable_gradient_checkpointing),
        critic_checkpointing=bool(critic_cfg.model.enable_gradient_checkpointing),
        actor_max_tokens=(actor_cfg.ppo_max_token_len_per_gpu or 16384)
        if actor_cfg.use_dynamic_bsz
        else None,
        critic_max_tokens=(critic_cfg.ppo_max_token_len_per_gpu or 32768) if critic_dynamic else None,
    )
    if device.type != "cuda" or sharded or cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes > 1:
        return choices
    request = PlanRequest(
        actor=ModelShape.of(actor),
        critic=ModelShape.of(critic) if critic is not None else None,
        has_reference=cfg.algorithm.use_kl_in_reward or actor_cfg.use_kl_loss,
        has_generator_copy=has_generator_copy,
        max_sequence_length=cfg.data.max_prompt_length + cfg.data.max_response_length,
        gpu_bytes=torch.cuda.get_device_properties(device).total_memory,
        host_bytes=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        user_checkpointing=arr.model.enable_gradient_checkpointing,
        user_critic_checkpointing=critic_cfg.model.enable_gradient_checkpointing,
        user_max_tokens=actor_cfg.ppo_max_token_len_per_gpu,
    )
    try:
        plan = plan_memory(request)
    except PlanDoesNotFit as exc:
        raise UserError(
            f"`{arr.model.path}` does not fit one GPU for this run: {exc}; use more GPUs "
            "(trainer.n_gpus_per_node) or shorter data.max_prompt_length / data.max_response_length"
        ) from None
    # Micro-batches by the plan's token budget unless the user fixed their row count.
    by_tokens = actor_cfg.use_dynamic_bsz or actor_cfg.ppo_micro_batch_size_per_gpu is None
    critic_by_tokens = critic_dynamic or critic_cfg.ppo_micro_batch_size_per_gpu is None
    return MemoryChoices(
        actor_checkpointing=plan.gradient_checkpointing,
        critic_checkpointing=plan.critic_gradient_checkpointing,
        actor_max_tokens=plan.max_tokens_per_microbatch if by_tokens else None,
        critic_max_tokens=(critic_cfg.ppo_max_token_len_per_gpu or plan.max_tokens_per_microbatch)
        if critic_by_tokens
        else None,
        plan=plan,
    )


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
