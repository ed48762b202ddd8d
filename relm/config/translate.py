"""The one translation of the verl-language config into per-component specs (`relm.config.specs`).

`translate` reads a loaded `RelmConfig` (fallbacks between keys already filled by the loader) and returns
the specs with the start-up warnings of keys that are accepted but do not act with the values given
(`relm.config.key_table` lists them). It is pure: no file is read, nothing is logged.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from relm.config import key_table
from relm.config.async_training import async_spec
from relm.config.distillation import parse_distillation
from relm.config.remote_code import ACTOR_KEY, CRITIC_KEY, model_trust
from relm.config.rollout_correction import parse_rollout_correction
from relm.config.schema import (
    ActorConfig,
    CriticConfig,
    FSDPConfig,
    OptimConfig,
    RelmConfig,
)
from relm.config.specs import (
    ActorLossSpec,
    AlgorithmSpec,
    CriticLossSpec,
    DataSpec,
    EngineSpec,
    JudgeSpec,
    KLControlSpec,
    LoopSpec,
    LoraSpec,
    LossParams,
    MemorySpec,
    ModelSourceSpec,
    MultiTurnSpec,
    OptimSpec,
    OverlongSpec,
    ReferenceSpec,
    RewardModelSpec,
    RewardSpec,
    RunSpec,
    SamplingSpec,
    ShardingSpec,
    TrainedModelSpec,
    UpdateSpec,
)
from relm.config.validate import group_of_one_warnings, tensor_parallel_size

CRITIC_SEED_OFFSET = 1
"""The critic's shuffles and rounding draw from `seed + 1`, so they differ from the actor's."""


def translate(cfg: RelmConfig) -> tuple[RunSpec, list[str]]:
    """Every component's spec for `cfg`, and one warning line per accepted key that will not act.

    Raises:
        UserError: an `algorithm.rollout_correction` or `distillation` value verl would refuse (parsed here,
            once).
    """
    distillation, distillation_warnings = parse_distillation(cfg.distillation)
    spec = RunSpec(
        data=data_spec(cfg),
        actor=actor_spec(cfg),
        actor_loss=actor_loss_spec(cfg.actor_rollout_ref.actor),
        critic=critic_spec(cfg),
        critic_loss=CriticLossSpec(cliprange_value=cfg.critic.cliprange_value),
        reference=ReferenceSpec(
            rows_per_forward=cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu,
            shard_size=cfg.actor_rollout_ref.ref.fsdp_config.fsdp_size,
        ),
        engine=engine_spec(cfg),
        reward=reward_spec(cfg),
        algorithm=algorithm_spec(cfg),
        memory=MemorySpec(
            weights_dtype=cfg.actor_rollout_ref.model.dtype,
            max_gpu_memory_gb=cfg.trainer.max_gpu_memory_gb,
            max_host_memory_gb=cfg.trainer.max_host_memory_gb,
            num_gpus=cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes,
        ),
        loop=loop_spec(cfg),
        distillation=distillation,
        asynchronous=async_spec(cfg),
    )
    tensor_parallel = [line for line in [tensor_parallel_size(cfg)[1]] if line]
    warnings = key_table.unused_value_warnings(cfg, spec) + group_of_one_warnings(cfg) + tensor_parallel
    return spec, warnings + distillation_warnings


def data_spec(cfg: RelmConfig) -> DataSpec:
    data = cfg.data
    assert data.seed is not None, "the loader fills data.seed from seed"
    return DataSpec(
        train_files=tuple(data.train_files) if data.train_files else None,
        val_files=tuple(data.val_files) if data.val_files else None,
        train_max_samples=data.train_max_samples,
        val_max_samples=data.val_max_samples,
        prompt_key=data.prompt_key,
        reward_fn_key=data.reward_fn_key,
        max_prompt_length=data.max_prompt_length,
        max_response_length=data.max_response_length,
        prompts_per_step=data.train_batch_size,
        val_batch_size=data.val_batch_size,
        shuffle=data.shuffle,
        filter_overlong_prompts=data.filter_overlong_prompts,
        truncation=data.truncation,
        chat_template_kwargs=dict(data.apply_chat_template_kwargs),
        return_raw_chat=data.return_raw_chat,
        trust_remote_code=data.trust_remote_code,
        seed=data.seed,
        custom_cls=(data.custom_cls.path, data.custom_cls.name or "") if data.custom_cls.path else None,
        verl_config=_merged(dataclasses.asdict(data), data.plus_keys) if data.custom_cls.path else None,
    )


def _merged(base: dict[str, Any], added: dict[str, Any]) -> dict[str, Any]:
    """`base` with `added`'s keys put in, section by section (a `+data.custom_cls.extra` keeps `path`)."""
    merged = dict(base)
    for key, value in added.items():
        below = merged.get(key)
        merged[key] = _merged(below, value) if isinstance(below, dict) and isinstance(value, dict) else value
    return merged


def optim_spec(optim: OptimConfig) -> OptimSpec:
    assert optim.min_lr_ratio is not None, "the loader fills a null min_lr_ratio with 0"
    return OptimSpec(
        lr=optim.lr,
        warmup_steps=optim.lr_warmup_steps,
        warmup_steps_ratio=optim.lr_warmup_steps_ratio,
        min_lr_ratio=optim.min_lr_ratio,
        schedule=optim.warmup_style,
        weight_decay=optim.weight_decay,
        betas=(float(optim.betas[0]), float(optim.betas[1])),
        # verl writes -1 (and 0 in some releases) for "filled in by the trainer"
        total_training_steps=optim.total_training_steps if optim.total_training_steps > 0 else None,
        moments_dtype=optim.moments_dtype,
    )


def _sharding(fsdp: FSDPConfig) -> ShardingSpec:
    return ShardingSpec(offload_policy=fsdp.offload_policy, shard_size=fsdp.fsdp_size)


def _update(section: ActorConfig | CriticConfig, rows_per_forward: int | None) -> UpdateSpec:
    mini, epochs = section.ppo_mini_batch_size, section.ppo_epochs
    dynamic, shuffle, agg = section.use_dynamic_bsz, section.shuffle, section.loss_agg_mode
    assert mini is not None and epochs is not None and dynamic is not None, "the loader fills the critic's"
    assert shuffle is not None and agg is not None, "the loader fills the critic's"
    return UpdateSpec(
        prompts_per_minibatch=mini,
        rows_per_microbatch=section.ppo_micro_batch_size_per_gpu,
        rows_per_forward=rows_per_forward,
        dynamic_batch=dynamic,
        max_tokens_per_microbatch=section.ppo_max_token_len_per_gpu,
        num_epochs=epochs,
        shuffle=shuffle,
        grad_clip=section.grad_clip,
        loss_agg_mode=agg,
    )


def _lora(
    rank: int, alpha: float, targets: list[str], exclude: list[str] | None, path: str | None
) -> LoraSpec:
    return LoraSpec(
        rank=int(rank),
        alpha=float(alpha),
        # verl writes `all-linear` as one string; the schema holds a list
        target_modules=(targets,) if isinstance(targets, str) else tuple(targets),
        exclude_modules=tuple(exclude) if exclude is not None else None,
        adapter_path=path,
    )


def actor_spec(cfg: RelmConfig) -> TrainedModelSpec:
    arr = cfg.actor_rollout_ref
    model, actor = arr.model, arr.actor
    source = ModelSourceSpec(
        path=model.path,
        tokenizer_path=model.tokenizer_path,
        chat_template=model.custom_chat_template,
        override_config=dict(model.override_config),
        gradient_checkpointing=model.enable_gradient_checkpointing,
        remove_padding=model.use_remove_padding,
        trust_remote_code=model.trust_remote_code,
        trust_key=ACTOR_KEY,
        external_lib=model.external_lib,
        lora=_lora(
            model.lora_rank,
            model.lora_alpha,
            model.target_modules,
            model.exclude_modules,
            model.lora_adapter_path,
        ),
        init_seed=cfg.seed,
    )
    return TrainedModelSpec(
        name="actor",
        source=source,
        optim=optim_spec(actor.optim),
        update=_update(actor, arr.rollout.log_prob_micro_batch_size_per_gpu),
        sharding=_sharding(actor.fsdp_config),
        seed=cfg.seed,
    )


def critic_spec(cfg: RelmConfig) -> TrainedModelSpec:
    critic, model = cfg.critic, cfg.critic.model
    source = ModelSourceSpec(
        path=model.path,
        # the critic reads the actor's token ids: its tokenizer is the actor's (key_table says so)
        tokenizer_path=cfg.actor_rollout_ref.model.tokenizer_path,
        chat_template=None,
        override_config=dict(model.override_config),
        gradient_checkpointing=model.enable_gradient_checkpointing,
        remove_padding=model.use_remove_padding,
        trust_remote_code=model_trust(cfg, "critic")[0],
        trust_key=CRITIC_KEY,
        external_lib=model.external_lib,
        lora=_lora(
            model.lora_rank,
            model.lora_alpha,
            model.target_modules,
            model.exclude_modules,
            model.lora_adapter_path,
        ),
        init_seed=cfg.seed,
    )
    return TrainedModelSpec(
        name="critic",
        source=source,
        optim=optim_spec(critic.optim),
        update=_update(critic, critic.forward_micro_batch_size_per_gpu),
        sharding=_sharding(model.fsdp_config),
        seed=cfg.seed + CRITIC_SEED_OFFSET,
    )


def actor_loss_spec(actor: ActorConfig) -> ActorLossSpec:
    low, high = actor.clip_ratio_low, actor.clip_ratio_high
    assert low is not None and high is not None, "the loader fills them from clip_ratio"
    return ActorLossSpec(
        loss_mode=actor.policy_loss.loss_mode,
        clip_ratio_low=low,
        clip_ratio_high=high,
        clip_ratio_c=actor.clip_ratio_c,
        entropy_coeff=actor.entropy_coeff,
        use_kl_loss=actor.use_kl_loss,
        kl_loss_coef=actor.kl_loss_coef,
        kl_loss_type=actor.kl_loss_type,
        use_torch_compile=actor.use_torch_compile,
        params=LossParams(
            tau_pos=actor.tau_pos,
            tau_neg=actor.tau_neg,
            clip_cov_ratio=actor.policy_loss.clip_cov_ratio,
            clip_cov_lb=actor.policy_loss.clip_cov_lb,
            clip_cov_ub=actor.policy_loss.clip_cov_ub,
            kl_cov_ratio=actor.policy_loss.kl_cov_ratio,
            ppo_kl_coef=actor.policy_loss.ppo_kl_coef,
            dro_beta=actor.policy_loss.dro_beta,
        ),
    )


def engine_spec(cfg: RelmConfig) -> EngineSpec:
    rollout = cfg.actor_rollout_ref.rollout
    val, turns = rollout.val_kwargs, rollout.multi_turn
    assert rollout.prompt_length is not None and rollout.response_length is not None, "the loader fills them"
    assert rollout.max_model_len is not None, "the loader fills it"
    return EngineSpec(
        name=rollout.name,
        dtype=rollout.dtype,
        sampling=SamplingSpec(
            rollout.temperature, rollout.top_p, rollout.top_k, rollout.do_sample, rollout.n
        ),
        val_sampling=SamplingSpec(val.temperature, val.top_p, val.top_k, val.do_sample, val.n),
        ignore_eos=rollout.ignore_eos,
        prompt_length=rollout.prompt_length,
        response_length=rollout.response_length,
        gpu_memory_utilization=rollout.gpu_memory_utilization,
        free_cache_engine=rollout.free_cache_engine,
        tensor_parallel_size=tensor_parallel_size(cfg)[0],
        enforce_eager=rollout.enforce_eager,
        enable_chunked_prefill=rollout.enable_chunked_prefill,
        max_num_batched_tokens=rollout.max_num_batched_tokens,
        max_num_seqs=rollout.max_num_seqs,
        max_model_len=rollout.max_model_len,
        quantization=rollout.quantization,
        engine_kwargs=dict(rollout.engine_kwargs),
        timeout_s=rollout.timeout_s,
        multi_turn=MultiTurnSpec(
            enable=turns.enable,
            max_assistant_turns=turns.max_assistant_turns,
            max_user_turns=turns.max_user_turns,
            max_turns=turns.max_turns,
            tool_config_path=turns.tool_config_path,
            interaction_config_path=turns.interaction_config_path,
            format=turns.format,
            max_parallel_calls=turns.max_parallel_calls,
            max_tool_response_length=turns.max_tool_response_length,
            tool_response_truncate_side=turns.tool_response_truncate_side,
        ),
        seed=cfg.seed,
    )


def reward_spec(cfg: RelmConfig) -> RewardSpec:
    rm, custom = cfg.reward_model, cfg.custom_reward_function
    judge, shaping = rm.judge, rm.overlong_buffer
    return RewardSpec(
        manager=rm.reward_manager,
        custom_function_path=custom.path,
        custom_function_name=custom.name,
        num_workers=rm.num_workers,
        timeout_s=rm.timeout,
        failure_score=rm.failure_score,
        max_failure_share=rm.max_failure_share,
        memory_limit_mb=rm.memory_limit_mb,
        overlong=OverlongSpec(shaping.enable, shaping.len, shaping.penalty_factor, shaping.log),
        max_response_length=cfg.data.max_response_length,
        experiment_name=cfg.trainer.experiment_name,
        model=RewardModelSpec(
            enable=rm.enable,
            path=rm.model.path,
            input_tokenizer=rm.model.input_tokenizer,
            trust_remote_code=bool(rm.model.trust_remote_code),
            rows_per_forward=rm.micro_batch_size_per_gpu,
            max_length=rm.max_length,
            engine=rm.rollout.name,
            sampling=SamplingSpec(
                rm.rollout.temperature, rm.rollout.top_p, rm.rollout.top_k, rm.rollout.do_sample, 1
            ),
            prompt_length=rm.rollout.prompt_length,
            response_length=rm.rollout.response_length,
            judge=JudgeSpec(
                judge.prompt_template, judge.prompt_template_path, judge.score_regex, judge.default_score
            ),
            seed=cfg.seed,
        ),
    )


def algorithm_spec(cfg: RelmConfig) -> AlgorithmSpec:
    algo = cfg.algorithm
    kl = algo.kl_ctrl
    return AlgorithmSpec(
        adv_estimator=algo.adv_estimator,
        gamma=algo.gamma,
        lam=algo.lam,
        norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
        use_kl_in_reward=algo.use_kl_in_reward,
        kl_penalty=algo.kl_penalty,
        kl_ctrl=KLControlSpec(kl.type, kl.kl_coef, kl.horizon, kl.target_kl),
        filter_groups=algo.filter_groups.enable,
        filter_metric=algo.filter_groups.metric or "acc",  # null only while disabled (validate_config)
        max_num_gen_batches=algo.filter_groups.max_num_gen_batches,
        rollout_correction=parse_rollout_correction(algo.rollout_correction),
        gdpo_reward_keys=tuple(algo.gdpo_reward_keys or ()),
        gdpo_reward_weights=None if algo.gdpo_reward_weights is None else tuple(algo.gdpo_reward_weights),
    )


def loop_spec(cfg: RelmConfig) -> LoopSpec:
    t = cfg.trainer
    return LoopSpec(
        total_epochs=t.total_epochs,
        total_training_steps=t.total_training_steps,
        project_name=t.project_name,
        experiment_name=t.experiment_name,
        loggers=tuple(t.logger),
        run_dir=t.default_local_dir,
        save_freq=t.save_freq,
        test_freq=t.test_freq,
        val_before_train=t.val_before_train,
        val_only=t.val_only,
        log_val_generations=t.log_val_generations,
        rollout_data_dir=t.rollout_data_dir,
        validation_data_dir=t.validation_data_dir,
        critic_warmup=t.critic_warmup,
        n_gpus_per_node=t.n_gpus_per_node,
        nnodes=t.nnodes,
        device=t.device,
        balance_batch=t.balance_batch,
        resume_mode=t.resume_mode,
        resume_from_path=t.resume_from_path,
        max_actor_ckpt_to_keep=t.max_actor_ckpt_to_keep,
        max_critic_ckpt_to_keep=t.max_critic_ckpt_to_keep,
        max_skipped_steps=t.max_skipped_steps,
        seed=cfg.seed,
    )
