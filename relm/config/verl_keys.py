"""verl keys that relm accepts but does not act on, each with the reason.

A verl user's command line carries keys for machinery relm does not have (Ray, Megatron, vLLM engine
knobs, profilers, offload). Rejecting them would make every verl script fail on its first line;
silently dropping them would hide that a setting has no effect. So each such key is accepted with
one warning line that says why relm ignores it.

The table covers every key of verl's default PPO trainer config (ppo_trainer.yaml of verl 0.3-0.4 and
the flattened `_generated_ppo_trainer.yaml` of 0.5), plus the Megatron sections and Hydra's own keys.
A key ending in `.*` stands for a whole subtree. Keys that would change what is trained if relm
ignored them (LoRA, multi-turn) are listed in `UNSUPPORTED_WHEN_ENABLED`: they
are accepted at their off value and are an error when turned on.
"""

from __future__ import annotations

_RAY = "relm runs without Ray (processes start with torchrun)"
_FSDP = "relm chooses FSDP2 wrapping and resharding itself; `fsdp_size` and `offload_policy` are read"
_OFFLOAD = (
    "on one GPU the memory plan decides what waits in CPU memory; when sharded, `fsdp_config.offload_policy`"
)
_MODEL_DTYPE = (
    "relm's trained weights follow `actor_rollout_ref.model.dtype` (auto: fp32 master weights, or bf16 when the "
    "memory plan finds fp32 ones do not fit one GPU)"
)
_ACTIVATION_OFFLOAD = "activation offload is not implemented; the memory plan turns on gradient checkpointing"
_SP = "sequence parallelism (Ulysses) is not implemented yet"
_PROFILER = "verl's profiler hooks are not implemented; wrap `relm train` in a profiler instead"
_HDFS = "relm writes only to the local run folder"
_VLLM = "an sglang or vLLM setting that relm's engines have no counterpart for"
_MULTI_TURN = (
    "relm's multi-turn rollouts run in-process under `rollout.multi_turn.*`, without agent loop workers"
)
_MULTI_TURN_IDS = (
    "relm never re-tokenizes a conversation: the ids trained on are the ids sampled plus the tool ids"
)
_MULTIMODAL = "multimodal inputs are not supported"
_COMPILE = "relm reads `actor_rollout_ref.actor.use_torch_compile` for every training forward"
_KERNELS = "fused/Liger kernels are not wired in yet"
_LORA = "LoRA is not supported yet"
_RM = "reward models are not supported yet (`reward_model.enable=true` is an error)"
_CKPT = "relm saves model, optimizer and loop state in every checkpoint"
_HYDRA = "relm does not compose Hydra configs; write the values out in full"
_MEGATRON = "Megatron is not supported; relm trains with PyTorch FSDP"
_SHM = "relm loads models directly, without a shared-memory copy"
_DYN_LOGPROB = "log-prob forwards use the actor's `use_dynamic_bsz` and `ppo_max_token_len_per_gpu`"
_ENTROPY_MEM = "relm computes the entropy in one pass"
_CLIP_COV = "only used by the `clip_cov`/`kl_cov` policy losses, which relm does not implement"
_ASYNC = "relm generates synchronously, in-process"
_ROLLOUT_CORRECTION = (
    "importance-sampling and rejection corrections are not implemented; relm acts on `bypass_mode` alone"
)

ACCEPTED_UNUSED: dict[str, str] = {
    # Hydra's own keys, present in verl's unflattened YAML files.
    "defaults": _HYDRA,
    "hydra.*": _HYDRA,
    # data
    "data.tokenizer": "relm uses `actor_rollout_ref.model.tokenizer_path` (or the model's tokenizer)",
    "data.use_shm": _SHM,
    "data.return_raw_input_ids": _RM,
    "data.return_full_prompt": "relm keeps prompt token ids; the full prompt text is not stored",
    "data.dataloader_num_workers": "relm tokenizes in-process, without dataloader workers",
    "data.validation_shuffle": "relm validates in file order",
    "data.filter_overlong_prompts_workers": "relm filters prompts in-process",
    "data.gen_batch_size": "DAPO dynamic sampling draws data.train_batch_size prompts per generation round",
    "data.image_key": _MULTIMODAL,
    "data.video_key": _MULTIMODAL,
    "data.return_multi_modal_inputs": _MULTIMODAL,
    "data.sampler.*": "relm samples prompts in (seeded) shuffled order; custom samplers are not supported",
    "data.datagen.*": "dynamic data generation is not supported",
    # actor_rollout_ref
    "actor_rollout_ref.nccl_timeout": "relm uses PyTorch's default process-group timeout",
    "actor_rollout_ref.model.use_shm": _SHM,
    "actor_rollout_ref.model.enable_activation_offload": _ACTIVATION_OFFLOAD,
    "actor_rollout_ref.model.lora_rank": _LORA,
    "actor_rollout_ref.model.lora_alpha": _LORA,
    "actor_rollout_ref.model.target_modules": _LORA,
    "actor_rollout_ref.model.exclude_modules": _LORA,
    "actor_rollout_ref.model.use_liger": _KERNELS,
    "actor_rollout_ref.model.use_fused_kernels": _KERNELS,
    "actor_rollout_ref.model.fused_kernel_options.*": _KERNELS,
    "actor_rollout_ref.model.return_last_hidden_state": "only used by verl's fused-loss path",
    "actor_rollout_ref.model.use_fused_loss": _KERNELS,
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": _SP,
    "actor_rollout_ref.actor.checkpoint.*": _CKPT,
    "actor_rollout_ref.actor.optim.num_cycles": "relm's cosine schedule decays once (half a cycle)",
    "actor_rollout_ref.actor.fsdp_config.*": _FSDP,
    "actor_rollout_ref.actor.fsdp_config.param_offload": _OFFLOAD,
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": _OFFLOAD,
    "actor_rollout_ref.actor.fsdp_config.model_dtype": _MODEL_DTYPE,
    "actor_rollout_ref.actor.use_fused_kernels": _KERNELS,
    "actor_rollout_ref.actor.profiler.*": _PROFILER,
    "actor_rollout_ref.actor.entropy_from_logits_with_chunking": _ENTROPY_MEM,
    "actor_rollout_ref.actor.entropy_checkpointing": _ENTROPY_MEM,
    "actor_rollout_ref.actor.use_remove_padding": "relm reads `actor_rollout_ref.model.use_remove_padding`",
    "actor_rollout_ref.actor.policy_loss.clip_cov_ratio": _CLIP_COV,
    "actor_rollout_ref.actor.policy_loss.clip_cov_lb": _CLIP_COV,
    "actor_rollout_ref.actor.policy_loss.clip_cov_ub": _CLIP_COV,
    "actor_rollout_ref.actor.policy_loss.kl_cov_ratio": _CLIP_COV,
    "actor_rollout_ref.actor.policy_loss.ppo_kl_coef": _CLIP_COV,
    "actor_rollout_ref.actor.megatron.*": _MEGATRON,
    "actor_rollout_ref.ref.strategy": "the reference uses the actor's backend",
    "actor_rollout_ref.ref.use_torch_compile": _COMPILE,
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": _DYN_LOGPROB,
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": _DYN_LOGPROB,
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size": _SP,
    "actor_rollout_ref.ref.fsdp_config.*": _FSDP,
    "actor_rollout_ref.ref.fsdp_config.param_offload": _OFFLOAD,
    "actor_rollout_ref.ref.profiler.*": _PROFILER,
    "actor_rollout_ref.ref.model": "the reference is always a copy of the initial policy",
    "actor_rollout_ref.ref.entropy_from_logits_with_chunking": _ENTROPY_MEM,
    "actor_rollout_ref.ref.entropy_checkpointing": _ENTROPY_MEM,
    "actor_rollout_ref.ref.megatron.*": _MEGATRON,
    "actor_rollout_ref.rollout.mode": _ASYNC,
    "actor_rollout_ref.rollout.chat_scheduler": _ASYNC,
    "actor_rollout_ref.rollout.use_fire_sampling": "FIRE sampling is not implemented",
    "actor_rollout_ref.rollout.cudagraph_capture_sizes": "relm leaves vLLM's CUDA-graph batch sizes at vLLM's default",
    "actor_rollout_ref.rollout.load_format": "relm's vLLM engine starts from dummy weights and takes the actor's in memory",
    "actor_rollout_ref.rollout.layered_summon": "relm streams the actor's weights into vLLM layer by layer already",
    "actor_rollout_ref.rollout.disable_log_stats": "relm keeps vLLM's periodic statistics log off",
    "actor_rollout_ref.rollout.multi_stage_wake_up": _VLLM,
    "actor_rollout_ref.rollout.update_weights_bucket_megabytes": "relm hands weights to vLLM in-process, tensor by tensor (no buckets)",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": _DYN_LOGPROB,
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": _DYN_LOGPROB,
    "actor_rollout_ref.rollout.multi_turn.interaction_config_path": "interactions (scripted users) are not implemented",
    "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template": _MULTI_TURN_IDS,
    "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode": _MULTI_TURN_IDS,
    "actor_rollout_ref.rollout.agent.*": _MULTI_TURN,
    "actor_rollout_ref.rollout.trace.*": _MULTI_TURN,
    "actor_rollout_ref.rollout.over_sample_rate": _ASYNC,
    "actor_rollout_ref.rollout.calculate_log_probs": "every relm engine returns the sampled tokens' logprobs",
    "actor_rollout_ref.rollout.skip_rollout": "rollout dumps for debugging are not implemented",
    "actor_rollout_ref.rollout.skip_dump_dir": "rollout dumps for debugging are not implemented",
    "actor_rollout_ref.rollout.profiler.*": _PROFILER,
    # critic
    "critic.rollout_n": "relm reads `actor_rollout_ref.rollout.n` directly",
    "critic.enable": "relm uses a critic exactly when `algorithm.adv_estimator=gae`",
    "critic.optim.num_cycles": "relm's cosine schedule decays once (half a cycle)",
    "critic.model.use_shm": _SHM,
    "critic.model.enable_activation_offload": _ACTIVATION_OFFLOAD,
    "critic.model.fsdp_config.*": _FSDP,
    "critic.model.fsdp_config.param_offload": _OFFLOAD,
    "critic.model.fsdp_config.optimizer_offload": _OFFLOAD,
    "critic.model.fsdp_config.model_dtype": _MODEL_DTYPE,
    "critic.model.lora_rank": _LORA,
    "critic.model.lora_alpha": _LORA,
    "critic.model.target_modules": _LORA,
    "critic.forward_micro_batch_size": "deprecated in verl; use `critic.forward_micro_batch_size_per_gpu`",
    "critic.forward_max_token_len_per_gpu": "value forwards use `critic.ppo_max_token_len_per_gpu`",
    "critic.ulysses_sequence_parallel_size": _SP,
    "critic.checkpoint.*": _CKPT,
    "critic.profiler.*": _PROFILER,
    "critic.megatron.*": _MEGATRON,
    # reward_model: everything but `enable` and `reward_manager`
    "reward_model.strategy": _RM,
    "reward_model.model.*": _RM,
    "reward_model.micro_batch_size": _RM,
    "reward_model.micro_batch_size_per_gpu": _RM,
    "reward_model.max_length": _RM,
    "reward_model.ulysses_sequence_parallel_size": _RM,
    "reward_model.use_dynamic_bsz": _RM,
    "reward_model.forward_max_token_len_per_gpu": _RM,
    "reward_model.profiler.*": _RM,
    "reward_model.megatron.*": _MEGATRON,
    "reward_model.launch_reward_fn_async": "relm scores rewards in the training process",
    "reward_model.sandbox_fusion.*": "remote code sandboxes are not supported; score in a custom function",
    # algorithm
    "algorithm.use_pf_ppo": "PF-PPO (policy filtration) reweighting is not implemented",
    "algorithm.pf_ppo.*": "PF-PPO (policy filtration) reweighting is not implemented",
    "algorithm.rollout_correction.*": _ROLLOUT_CORRECTION,
    # trainer
    "trainer.esi_redundant_time": "elastic-server checkpoint timing is specific to verl's cluster setup",
    "trainer.default_hdfs_dir": _HDFS,
    "trainer.del_local_ckpt_after_load": _HDFS,
    "trainer.ray_wait_register_center_timeout": _RAY,
    "trainer.use_legacy_worker_impl": "relm has one worker implementation",
    # top level
    "ray_init.*": _RAY,
    "ray_kwargs.*": _RAY,
    "global_profiler.*": _PROFILER,
}
"""Dotted verl key (or `prefix.*` subtree) -> why relm ignores it."""

UNSUPPORTED_WHEN_ENABLED: dict[str, str] = {
    "actor_rollout_ref.model.lora_rank": "LoRA is not supported yet; set it to 0 (full fine-tuning)",
    "critic.model.lora_rank": "LoRA is not supported yet; set it to 0 (full fine-tuning)",
    "algorithm.use_pf_ppo": "PF-PPO (policy filtration) is not supported yet",
    "algorithm.rollout_correction.rollout_is": "rollout importance sampling is not implemented yet",
    "algorithm.rollout_correction.rollout_rs": "rollout rejection sampling is not implemented yet",
    "algorithm.rollout_correction.rollout_token_veto_threshold": "rollout rejection sampling is not implemented yet",
    "algorithm.rollout_correction.use_pure_rollout_correction": "relm's update keeps the PPO clipped loss",
    "algorithm.rollout_correction.bypass_old_logprob_for_rollout": (
        "later verl names this `algorithm.rollout_correction.bypass_mode`; set that key"
    ),
}
"""Accepted keys whose non-off value would change what is trained: turning them on is an error."""

HYDRA_TARGET_KEY = "_target_"
"""Hydra's class pointer, present in every section of verl 0.5's flattened config; skipped silently."""


def match_accepted(key: str) -> str | None:
    """Return the `ACCEPTED_UNUSED` entry that covers a dotted key, or None.

    An exact entry wins over a subtree, and a deeper subtree over a shallower one, so a specific
    reason (offload) can sit inside a general one (FSDP details).
    """
    if key in ACCEPTED_UNUSED:
        return key
    parts = key.split(".")
    # Depth len(parts) lets `ray_init=null` match `ray_init.*` as well as `ray_init.num_cpus` does.
    for depth in range(len(parts), 0, -1):
        pattern = ".".join(parts[:depth]) + ".*"
        if pattern in ACCEPTED_UNUSED:
            return pattern
    return None


def accepted_key_names() -> list[str]:
    """Accepted keys with the `.*` stripped, for "did you mean" suggestions."""
    return [pattern.removesuffix(".*") for pattern in ACCEPTED_UNUSED]
