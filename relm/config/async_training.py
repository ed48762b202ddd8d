"""`async_training.*` (verl's fully_async_policy keys): their spec, and the combinations this slice refuses.

What is built (docs/async.md): one rollout process beside one training process, whole steps generated ahead
by at most `floor(staleness_threshold)` weight versions, the weights sent after every step, and partial
rollouts (generation continued under weights that arrive mid-step). Everything a later slice adds
(data-parallel trainers, multi-turn, LoRA and vLLM on the rollout side) is refused here in one line rather
than run in a way the user did not ask for.
"""

from __future__ import annotations

from relm.config.schema import RelmConfig
from relm.config.specs import AsyncSpec
from relm.errors import UserError


def async_spec(cfg: RelmConfig) -> AsyncSpec:
    section = cfg.async_training
    return AsyncSpec(
        enabled=section.enable,
        staleness_threshold=section.staleness_threshold,
        trigger_parameter_sync_step=section.trigger_parameter_sync_step,
        require_batches=section.require_batches,
        partial_rollout=section.partial_rollout,
    )


def check_async_training(cfg: RelmConfig) -> None:
    """Refuse what this slice of asynchronous training does not do.

    Raises:
        UserError: `partial_rollout=true` without `enable=true` (it must not be silently ignored), or with
            `enable=true` a negative threshold, a sync period other than one step, or a feature the rollout
            process does not carry yet.
    """
    section = cfg.async_training
    if not section.enable:
        if section.partial_rollout:
            raise UserError(
                "`async_training.partial_rollout=true` continues generation under weights that arrive mid-step, "
                "which only an asynchronous run has: set async_training.enable=true or partial_rollout=false"
            )
        return
    if section.staleness_threshold < 0:
        raise UserError(
            f"`async_training.staleness_threshold={section.staleness_threshold}` must be 0 or more "
            "(0: synchronous, 1: one weight version old)"
        )
    if section.require_batches < 1:
        raise UserError(f"`async_training.require_batches={section.require_batches}` must be at least 1")
    mini = cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    prompts = cfg.data.train_batch_size
    trigger = section.trigger_parameter_sync_step
    if trigger is not None and trigger * section.require_batches * mini != prompts:
        one_step, rest = divmod(prompts, section.require_batches * mini)
        fix = f"set it to {one_step} or leave it unset" if not rest else "leave it unset"
        raise UserError(
            f"`async_training.trigger_parameter_sync_step={trigger}` x require_batches={section.require_batches} "
            f"x ppo_mini_batch_size={mini} = {trigger * section.require_batches * mini} prompts between weight "
            f"syncs; relm syncs after every step of data.train_batch_size={prompts}: {fix}"
        )
    trainer, arr = cfg.trainer, cfg.actor_rollout_ref
    for refused, key, fix in (
        (
            trainer.n_gpus_per_node * trainer.nnodes > 1,
            f"trainer.n_gpus_per_node={trainer.n_gpus_per_node} x trainer.nnodes={trainer.nnodes}",
            "train on one process (n_gpus_per_node=1, nnodes=1)",
        ),
        (arr.rollout.multi_turn.enable, "actor_rollout_ref.rollout.multi_turn.enable=true", "turn it off"),
        (
            arr.model.lora_rank > 0,
            f"actor_rollout_ref.model.lora_rank={arr.model.lora_rank}",
            "train all weights",
        ),
        (arr.rollout.name == "vllm", "actor_rollout_ref.rollout.name=vllm", "use the native or hf engine"),
    ):
        if refused:
            raise UserError(
                f"`async_training.enable=true` with `{key}`: the rollout process does not carry this yet; {fix} "
                "or set async_training.enable=false (docs/async.md)"
            )
