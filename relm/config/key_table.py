"""Every key relm accepts, and what it does: the spec field it sets, a start-up warning, or a refusal.

One entry per leaf key (or `prefix.*` subtree) of relm's schema and of verl 0.4.1-0.9.1's default PPO
configs (tests/unit/test_key_table.py walks every release's file and checks the table is total, that no
entry names a key that does not exist, and that each key of the first kind, set to another value, changes
the field it names in the specs `relm.config.translate.translate` builds). The three kinds:

- `Sets(field)`: the key acts; `field` is the dotted path of the value it sets in `relm.config.specs.RunSpec`.
  verl's other spellings of a key relm reads (`relm.config.verl_renames`) set the same field.
- `Ignored(why)`: accepted, not used; one warning line at start names the key and says why
  (`relm.config.verl_keys.ACCEPTED_UNUSED` for verl's keys; `IGNORED_SCHEMA_KEYS` below for keys of relm's
  schema that only act with some values).
- `Refused(why)`: accepted at the value that leaves relm's behaviour as it is; any other value stops the
  run with exit code 2 and one `error:` line that names the key and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass

from relm.config import verl_keys, verl_renames
from relm.config.schema import RelmConfig
from relm.config.specs import RunSpec


@dataclass(frozen=True)
class Sets:
    """The key sets this field of the run's specs."""

    field: str


@dataclass(frozen=True)
class Ignored:
    """Accepted, not used: a warning at start says why."""

    why: str


@dataclass(frozen=True)
class Refused:
    """Accepted at its off value; another value is an error that says what to do instead."""

    why: str


Entry = Sets | Ignored | Refused

_ARR, _ACTOR, _ROLLOUT, _MODEL = (
    "actor_rollout_ref",
    "actor_rollout_ref.actor",
    "actor_rollout_ref.rollout",
    "actor_rollout_ref.model",
)


def _optim_keys(prefix: str, spec: str) -> dict[str, str]:
    names = {
        "lr": "lr",
        "lr_warmup_steps": "warmup_steps",
        "lr_warmup_steps_ratio": "warmup_steps_ratio",
        "min_lr_ratio": "min_lr_ratio",
        "warmup_style": "schedule",
        "weight_decay": "weight_decay",
        "betas": "betas",
        "total_training_steps": "total_training_steps",
        "moments_dtype": "moments_dtype",
    }
    return {f"{prefix}.optim.{key}": f"{spec}.optim.{field}" for key, field in names.items()}


def _model_keys(prefix: str, spec: str) -> dict[str, str]:
    names = {
        "path": "path",
        "override_config": "override_config",
        "enable_gradient_checkpointing": "gradient_checkpointing",
        "use_remove_padding": "remove_padding",
        "trust_remote_code": "trust_remote_code",
        "external_lib": "external_lib",
        "lora_rank": "lora.rank",
        "lora_alpha": "lora.alpha",
        "target_modules": "lora.target_modules",
        "exclude_modules": "lora.exclude_modules",
        "lora_adapter_path": "lora.adapter_path",
    }
    return {f"{prefix}.{key}": f"{spec}.source.{field}" for key, field in names.items()}


def _update_keys(prefix: str, spec: str) -> dict[str, str]:
    names = {
        "ppo_mini_batch_size": "prompts_per_minibatch",
        "ppo_micro_batch_size_per_gpu": "rows_per_microbatch",
        # the deprecated global size is divided by the GPUs into the per-GPU one (as verl does)
        "ppo_micro_batch_size": "rows_per_microbatch",
        "use_dynamic_bsz": "dynamic_batch",
        "ppo_max_token_len_per_gpu": "max_tokens_per_microbatch",
        "ppo_epochs": "num_epochs",
        "shuffle": "shuffle",
        "grad_clip": "grad_clip",
        "loss_agg_mode": "loss_agg_mode",
    }
    return {f"{prefix}.{key}": f"{spec}.update.{field}" for key, field in names.items()}


SPEC_KEYS: dict[str, str] = {
    # data
    "data.train_files": "data.train_files",
    "data.val_files": "data.val_files",
    "data.train_max_samples": "data.train_max_samples",
    "data.val_max_samples": "data.val_max_samples",
    "data.prompt_key": "data.prompt_key",
    "data.reward_fn_key": "data.reward_fn_key",
    "data.max_prompt_length": "data.max_prompt_length",
    "data.max_response_length": "data.max_response_length",
    "data.train_batch_size": "data.prompts_per_step",
    "data.val_batch_size": "data.val_batch_size",
    "data.shuffle": "data.shuffle",
    "data.filter_overlong_prompts": "data.filter_overlong_prompts",
    "data.truncation": "data.truncation",
    "data.apply_chat_template_kwargs": "data.chat_template_kwargs",
    "data.return_raw_chat": "data.return_raw_chat",
    "data.trust_remote_code": "data.trust_remote_code",
    "data.seed": "data.seed",
    # the policy
    **_model_keys(_MODEL, "actor"),
    f"{_MODEL}.tokenizer_path": "actor.source.tokenizer_path",
    f"{_MODEL}.custom_chat_template": "actor.source.chat_template",
    f"{_MODEL}.dtype": "memory.weights_dtype",
    **_update_keys(_ACTOR, "actor"),
    **_optim_keys(_ACTOR, "actor"),
    f"{_ACTOR}.fsdp_config.offload_policy": "actor.sharding.offload_policy",
    f"{_ACTOR}.fsdp_config.fsdp_size": "actor.sharding.shard_size",
    f"{_ACTOR}.use_torch_compile": "actor_loss.use_torch_compile",
    f"{_ACTOR}.clip_ratio": "actor_loss.clip_ratio_low",  # and clip_ratio_high, where those are unset
    f"{_ACTOR}.clip_ratio_low": "actor_loss.clip_ratio_low",
    f"{_ACTOR}.clip_ratio_high": "actor_loss.clip_ratio_high",
    f"{_ACTOR}.clip_ratio_c": "actor_loss.clip_ratio_c",
    f"{_ACTOR}.entropy_coeff": "actor_loss.entropy_coeff",
    f"{_ACTOR}.use_kl_loss": "actor_loss.use_kl_loss",
    f"{_ACTOR}.kl_loss_coef": "actor_loss.kl_loss_coef",
    f"{_ACTOR}.kl_loss_type": "actor_loss.kl_loss_type",
    f"{_ACTOR}.policy_loss.loss_mode": "actor_loss.loss_mode",
    f"{_ACTOR}.tau_pos": "actor_loss.params.tau_pos",
    f"{_ACTOR}.tau_neg": "actor_loss.params.tau_neg",
    f"{_ACTOR}.policy_loss.clip_cov_ratio": "actor_loss.params.clip_cov_ratio",
    f"{_ACTOR}.policy_loss.clip_cov_lb": "actor_loss.params.clip_cov_lb",
    f"{_ACTOR}.policy_loss.clip_cov_ub": "actor_loss.params.clip_cov_ub",
    f"{_ACTOR}.policy_loss.kl_cov_ratio": "actor_loss.params.kl_cov_ratio",
    f"{_ACTOR}.policy_loss.ppo_kl_coef": "actor_loss.params.ppo_kl_coef",
    f"{_ACTOR}.policy_loss.dro_beta": "actor_loss.params.dro_beta",
    # the reference
    f"{_ARR}.ref.log_prob_micro_batch_size_per_gpu": "reference.rows_per_forward",
    f"{_ARR}.ref.log_prob_micro_batch_size": "reference.rows_per_forward",
    f"{_ARR}.ref.fsdp_config.fsdp_size": "reference.shard_size",
    # the engine
    f"{_ROLLOUT}.name": "engine.name",
    f"{_ROLLOUT}.free_cache_engine": "engine.free_cache_engine",
    f"{_ROLLOUT}.n": "engine.sampling.n",
    f"{_ROLLOUT}.temperature": "engine.sampling.temperature",
    f"{_ROLLOUT}.top_p": "engine.sampling.top_p",
    f"{_ROLLOUT}.top_k": "engine.sampling.top_k",
    f"{_ROLLOUT}.do_sample": "engine.sampling.do_sample",
    f"{_ROLLOUT}.dtype": "engine.dtype",
    f"{_ROLLOUT}.gpu_memory_utilization": "engine.gpu_memory_utilization",
    f"{_ROLLOUT}.ignore_eos": "engine.ignore_eos",
    f"{_ROLLOUT}.prompt_length": "engine.prompt_length",
    f"{_ROLLOUT}.response_length": "engine.response_length",
    # verl's rollout worker computes the old logprobs: relm's actor does, cutting them by this size
    f"{_ROLLOUT}.log_prob_micro_batch_size_per_gpu": "actor.update.rows_per_forward",
    f"{_ROLLOUT}.log_prob_micro_batch_size": "actor.update.rows_per_forward",
    f"{_ROLLOUT}.tensor_model_parallel_size": "engine.tensor_parallel_size",
    f"{_ROLLOUT}.enforce_eager": "engine.enforce_eager",
    f"{_ROLLOUT}.enable_chunked_prefill": "engine.enable_chunked_prefill",
    f"{_ROLLOUT}.max_num_batched_tokens": "engine.max_num_batched_tokens",
    f"{_ROLLOUT}.max_num_seqs": "engine.max_num_seqs",
    f"{_ROLLOUT}.max_model_len": "engine.max_model_len",
    f"{_ROLLOUT}.quantization": "engine.quantization",
    f"{_ROLLOUT}.engine_kwargs": "engine.engine_kwargs",
    f"{_ROLLOUT}.timeout_s": "engine.timeout_s",
    **{
        f"{_ROLLOUT}.val_kwargs.{key}": f"engine.val_sampling.{key}"
        for key in ("temperature", "top_p", "top_k", "n")
    },
    f"{_ROLLOUT}.val_kwargs.do_sample": "engine.val_sampling.do_sample",
    **{
        f"{_ROLLOUT}.multi_turn.{key}": f"engine.multi_turn.{key}"
        for key in (
            "enable",
            "max_assistant_turns",
            "max_user_turns",
            "max_turns",
            "tool_config_path",
            "interaction_config_path",
            "format",
            "max_parallel_calls",
            "max_tool_response_length",
            "tool_response_truncate_side",
        )
    },
    # the critic
    **_model_keys("critic.model", "critic"),
    **_update_keys("critic", "critic"),
    "critic.forward_micro_batch_size_per_gpu": "critic.update.rows_per_forward",
    **_optim_keys("critic", "critic"),
    "critic.model.fsdp_config.offload_policy": "critic.sharding.offload_policy",
    "critic.model.fsdp_config.fsdp_size": "critic.sharding.shard_size",
    "critic.cliprange_value": "critic_loss.cliprange_value",
    # the reward
    "reward_model.enable": "reward.model.enable",
    "reward_model.reward_manager": "reward.manager",
    "reward_model.num_workers": "reward.num_workers",
    "reward_model.timeout": "reward.timeout_s",
    "reward_model.failure_score": "reward.failure_score",
    "reward_model.max_failure_share": "reward.max_failure_share",
    "reward_model.memory_limit_mb": "reward.memory_limit_mb",
    "reward_model.overlong_buffer.enable": "reward.overlong.enable",
    "reward_model.overlong_buffer.len": "reward.overlong.length",
    "reward_model.overlong_buffer.penalty_factor": "reward.overlong.penalty_factor",
    "reward_model.overlong_buffer.log": "reward.overlong.log",
    "reward_model.model.path": "reward.model.path",
    "reward_model.model.input_tokenizer": "reward.model.input_tokenizer",
    "reward_model.model.trust_remote_code": "reward.model.trust_remote_code",
    "reward_model.micro_batch_size_per_gpu": "reward.model.rows_per_forward",
    "reward_model.max_length": "reward.model.max_length",
    "reward_model.rollout.name": "reward.model.engine",
    "reward_model.rollout.response_length": "reward.model.response_length",
    "reward_model.rollout.prompt_length": "reward.model.prompt_length",
    **{
        f"reward_model.rollout.{key}": f"reward.model.sampling.{key}"
        for key in ("temperature", "top_p", "top_k")
    },
    "reward_model.rollout.do_sample": "reward.model.sampling.do_sample",
    **{
        f"reward_model.judge.{key}": f"reward.model.judge.{key}"
        for key in ("prompt_template", "prompt_template_path")
    },
    "reward_model.judge.score_regex": "reward.model.judge.score_regex",
    "reward_model.judge.default_score": "reward.model.judge.default_score",
    "custom_reward_function.path": "reward.custom_function_path",
    "custom_reward_function.name": "reward.custom_function_name",
    # the algorithm
    "algorithm.gamma": "algorithm.gamma",
    "algorithm.lam": "algorithm.lam",
    "algorithm.adv_estimator": "algorithm.adv_estimator",
    "algorithm.norm_adv_by_std_in_grpo": "algorithm.norm_adv_by_std_in_grpo",
    "algorithm.use_kl_in_reward": "algorithm.use_kl_in_reward",
    "algorithm.kl_penalty": "algorithm.kl_penalty",
    **{
        f"algorithm.kl_ctrl.{key}": f"algorithm.kl_ctrl.{key}"
        for key in ("type", "kl_coef", "horizon", "target_kl")
    },
    "algorithm.filter_groups.enable": "algorithm.filter_groups",
    "algorithm.filter_groups.metric": "algorithm.filter_metric",
    "algorithm.filter_groups.max_num_gen_batches": "algorithm.max_num_gen_batches",
    "algorithm.rollout_correction.rollout_is": "algorithm.rollout_correction.is_level",
    "algorithm.rollout_correction.rollout_is_threshold": "algorithm.rollout_correction.is_upper",
    "algorithm.rollout_correction.rollout_is_batch_normalize": "algorithm.rollout_correction.is_batch_normalize",
    "algorithm.rollout_correction.rollout_rs": "algorithm.rollout_correction.rejection",
    "algorithm.rollout_correction.rollout_rs_threshold": "algorithm.rollout_correction.rejection",
    "algorithm.rollout_correction.bypass_mode": "algorithm.rollout_correction.bypass",
    "algorithm.rollout_correction.loss_type": "algorithm.rollout_correction.loss_type",
    "algorithm.gdpo_reward_keys": "algorithm.gdpo_reward_keys",
    "algorithm.gdpo_reward_weights": "algorithm.gdpo_reward_weights",
    # the loop
    "trainer.total_epochs": "loop.total_epochs",
    "trainer.total_training_steps": "loop.total_training_steps",
    "trainer.project_name": "loop.project_name",
    "trainer.experiment_name": "loop.experiment_name",
    "trainer.logger": "loop.loggers",
    "trainer.default_local_dir": "loop.run_dir",
    **{
        f"trainer.{key}": f"loop.{key}"
        for key in (
            "save_freq",
            "test_freq",
            "val_before_train",
            "val_only",
            "log_val_generations",
            "rollout_data_dir",
            "validation_data_dir",
            "critic_warmup",
            "n_gpus_per_node",
            "nnodes",
            "device",
            "balance_batch",
            "resume_mode",
            "resume_from_path",
            "max_actor_ckpt_to_keep",
            "max_critic_ckpt_to_keep",
            "max_skipped_steps",
        )
    },
    "trainer.max_gpu_memory_gb": "memory.max_gpu_memory_gb",
    "trainer.max_host_memory_gb": "memory.max_host_memory_gb",
    "seed": "loop.seed",
    "data.custom_cls.path": "data.custom_cls",
    "data.custom_cls.name": "data.custom_cls",
    # on-policy distillation
    "distillation.enabled": "distillation.enabled",
    "distillation.teacher_models": "distillation.teachers",
    "distillation.distillation_loss.loss_mode": "distillation.loss.loss_mode",
    "distillation.distillation_loss.use_policy_gradient": "distillation.loss.use_policy_gradient",
    "distillation.distillation_loss.loss_max_clamp": "distillation.loss.loss_max_clamp",
    # and clip_ratio_high, where those are unset
    "distillation.distillation_loss.clip_ratio": "distillation.loss.clip_ratio_low",
    "distillation.distillation_loss.clip_ratio_low": "distillation.loss.clip_ratio_low",
    "distillation.distillation_loss.clip_ratio_high": "distillation.loss.clip_ratio_high",
    "distillation.distillation_loss.use_task_rewards": "distillation.use_task_rewards",
    "distillation.distillation_loss.distillation_loss_coef": "distillation.coef",
    "distillation.distillation_loss.topk": "distillation.topk",
    "distillation.distillation_loss.log_prob_min_clamp": "distillation.log_prob_min_clamp",
    # asynchronous training (docs/async.md)
    "async_training.enable": "asynchronous.enabled",
    "async_training.staleness_threshold": "asynchronous.staleness_threshold",
    "async_training.trigger_parameter_sync_step": "asynchronous.trigger_parameter_sync_step",
    "async_training.require_batches": "asynchronous.require_batches",
    "async_training.partial_rollout": "asynchronous.partial_rollout",
}
"""Schema key -> the `RunSpec` field it sets."""

_STRATEGY = "relm trains with PyTorch (FSDP2 when distributed): `fsdp`, `fsdp2` and `dp` are accepted, another value is an error"

REFUSED_SCHEMA_KEYS: dict[str, str] = {
    f"{_ACTOR}.strategy": _STRATEGY,
    "critic.strategy": _STRATEGY,
    "distillation.distillation_loss.policy_loss_mode": "verl's distillation takes only `vanilla`",
    "distillation.teacher_key": "relm routes responses to teachers by their row's `data_source` only",
}
"""Schema keys relm reads only to refuse values it cannot honour (`relm.config.validate`)."""

_TEACHER_POOL = (
    "relm's teachers score in the training processes, on their GPUs (verl's separate teacher pool)"
)

IGNORED_SCHEMA_KEYS: dict[str, str] = {
    f"{_ARR}.hybrid_engine": "relm's engine always shares the training process and the actor's weights (verl's hybrid engine)",
    "distillation.n_gpus_per_node": _TEACHER_POOL,
    "distillation.nnodes": _TEACHER_POOL,
}
"""Schema keys accepted and not used; a value other than the default is reported at start."""


def _renamed_entries() -> dict[str, Entry]:
    entries: dict[str, Entry] = {new: Sets(SPEC_KEYS[old]) for new, old in verl_renames.RENAMED}
    for key in verl_renames.MAX_RESP_LEN_KEYS:
        entries[key] = Refused(
            "must equal `data.max_response_length`, the length relm's overlong shaping measures against"
        )
    return entries


def build_table() -> dict[str, Entry]:
    """Every accepted key (or `prefix.*` subtree) with its one entry."""
    table: dict[str, Entry] = {key: Sets(field) for key, field in SPEC_KEYS.items()}
    table.update({key: Refused(why) for key, why in REFUSED_SCHEMA_KEYS.items()})
    table.update({key: Ignored(why) for key, why in IGNORED_SCHEMA_KEYS.items()})
    table.update(_renamed_entries())
    table.update(
        {
            key: Ignored(why)
            for key, why in verl_keys.ACCEPTED_UNUSED.items()
            if key not in verl_keys.UNSUPPORTED_WHEN_ENABLED
        }
    )
    table.update({key: Refused(why) for key, why in verl_keys.UNSUPPORTED_WHEN_ENABLED.items()})
    return table


def unused_value_warnings(cfg: RelmConfig, spec: RunSpec) -> list[str]:
    """Warnings for schema keys given a value that does not act (printed once, at start)."""
    warnings = []
    if not cfg.actor_rollout_ref.hybrid_engine:
        warnings.append(
            f"`{_ARR}.hybrid_engine=false`: accepted, not used ({IGNORED_SCHEMA_KEYS[f'{_ARR}.hybrid_engine']})"
        )
    return warnings
