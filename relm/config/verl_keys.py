"""verl keys that relm accepts but does not act on, each with the reason.

A verl user's command line carries keys for machinery relm does not have (Ray, Megatron, vLLM engine
knobs, profilers, offload). Rejecting them would make every verl script fail on its first line;
silently dropping them would hide that a setting has no effect. So each such key is accepted with
one warning line that says why relm ignores it.

The table covers every leaf key of verl's default PPO trainer config (ppo_trainer.yaml of verl 0.3-0.4
and the flattened `_generated_ppo_trainer.yaml` of 0.5, 0.6, 0.7 and 0.9; a test walks each release's
file) and of 0.9.1's Megatron, VeOmni and TorchTitan configs (`model_engine=...`, whose parallel layout
`relm.config.engines` reports in one line), plus MindSpeed's section and Hydra's own keys. Keys verl renamed whose new spelling relm acts
on (`optim.lr_scheduler_type`, 0.9's `reward.*` section) are folded in by `relm.config.verl_renames`.
A key ending in `.*` stands for a whole subtree. Keys that would change what is trained if relm
ignored them (LoRA, multi-turn) are listed in `UNSUPPORTED_WHEN_ENABLED`: they
are accepted at their off value and are an error when turned on.
"""

from __future__ import annotations

_FLOOR = (
    "an absolute floor becomes `optim.min_lr_ratio` (floor / lr), which needs `optim.lr` > 0; "
    "set `optim.min_lr_ratio` instead"
)
_LORA = "Megatron's LoRA section; relm reads the FSDP keys (model.lora_rank, lora_alpha, target_modules)"
_RAY = "relm runs without Ray (processes start with torchrun)"
_FSDP = "relm chooses FSDP2 wrapping and resharding itself; `fsdp_size` and `offload_policy` are read"
_OFFLOAD = (
    "on one GPU the memory plan decides what waits in CPU memory; when sharded, `fsdp_config.offload_policy` "
    "(unset: relm decides)"
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
_RM = "the reward model runs in the training process, on the actor's GPU, unsharded"
_RM_ROLLOUT = (
    "a vLLM/sglang serving knob; relm's judge generates with its own engine (`reward_model.rollout.name`)"
)
_CKPT = "relm saves model, optimizer and loop state in every checkpoint"
_MEGATRON = "Megatron's engine settings; relm trains on its FSDP2 path (the layout keys are named in the engine's line)"
_SHM = "relm loads models directly, without a shared-memory copy"
_DYN_LOGPROB = "log-prob forwards use the actor's `use_dynamic_bsz` and `ppo_max_token_len_per_gpu`"
_ENTROPY_MEM = "relm computes the entropy in one pass"
_ASYNC = "relm generates synchronously, in-process"
_SAPO_TAU = (
    "verl's `sapo` reads `actor_rollout_ref.actor.tau_{0}`, not this key (its own scripts set this one, which "
    "leaves the default); set actor_rollout_ref.actor.tau_{0}"
)
_QAT = "quantization-aware training is not implemented"
_QUANT_FILE = "a torchao/vLLM quantization config file; relm's `rollout.quantization=fp8` takes no file"
_ROUTER_REPLAY = "MoE router replay is not implemented"
_MTP = "multi-token prediction (MTP) heads are not implemented"
_TILED_MLP = "tiled MLP is not implemented; the memory plan turns on gradient checkpointing"
_IN_PROCESS = "relm's engine runs inside the training processes, one copy per GPU"
_OPTIM = "relm trains with AdamW (torch's, or its CompactAdamW when the memory plan needs it)"
_SEED = "relm seeds every shuffle and sample from `seed` (and `data.seed`)"
_ROLLOUT_N = "relm reads `actor_rollout_ref.rollout.n` directly"
_REWARD_IN_PROCESS = (
    "relm scores rewards in its own reward workers (`reward_model.num_workers`), not verl's reward loop"
)
_SANDBOX = "remote code sandboxes are not supported; score in a custom function"
_CHUNKED_TOPK = (
    "relm's log-softmax over the vocabulary always runs a few positions at a time (no [B, T, V] fp32 buffer)"
)
_TRANSFER_QUEUE = "verl's transfer queue moves data between Ray workers; relm has no workers to feed"
_SKIP = "rollout dumps and replays for debugging are not implemented"
_TRAINER_V1 = "relm has one synchronous trainer loop (verl's v1 trainer modes do not apply)"
_OTHER_ENGINE = (
    "VeOmni's or TorchTitan's engine settings; relm trains on its FSDP2 path (the layout keys are named in the "
    "engine's line)"
)
_MINDSPEED = (
    "MindSpeed's (Ascend's Megatron) engine settings; relm trains on its FSDP2 path (the layout keys are named "
    "in the engine's line)"
)
_ENGINE_OPTIM = (
    "the engine's own optimizer and scheduler knob; relm's AdamW and schedule follow the `optim.*` keys FSDP "
    "shares (`lr`, `lr_scheduler_type`, `min_lr_ratio`, warm-up, `weight_decay`, `betas`, `clip_grad`)"
)
_MEGATRON_OWNERS = ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic", "reward_model")
_LOAD_WEIGHT = "relm always loads the weights of `model.path`; `false` (random weights) is an error"
_RECOMPUTE = (
    "Megatron's recompute settings; relm's is `model.enable_gradient_checkpointing` (and the memory plan)"
)
_MEGATRON_OPTIM_KEYS = (
    "lr_warmup_init",
    "lr_decay_steps",
    "lr_decay_style",
    "weight_decay_incr_style",
    "lr_wsd_decay_style",
    "lr_wsd_decay_steps",
    "use_checkpoint_opt_param_scheduler",
    "use_precision_aware_optimizer",
    "main_grads_dtype",
    "exp_avg_dtype",
    "exp_avg_sq_dtype",
    "use_layer_wise_distributed_optimizer",
    "muon_momentum",
    "muon_nesterov",
    "muon_split_qkv",
    "muon_scale_mode",
    "muon_coefficient_type",
    "muon_num_ns_steps",
    "muon_tp_mode",
    "muon_fp32_matmul_prec",
    "muon_extra_scale_factor",
    "muon_scalar_optimizer",
    "muon_match_adamw_update_rms",
)
"""Megatron's optimizer section adds these to FSDP's (verl 0.9.1's `optim/megatron.yaml`)."""
_OTHER_OPTIM_KEYS = ("lr_start", "lr_decay_ratio", "eps", "decay_type")
"""VeOmni's and TorchTitan's additions (`optim/veomni.yaml`, `optim/torchtitan.yaml`) relm does not read."""
_CRITIC_ENGINE = "verl 0.9's engine copy of the critic's FSDP settings; relm reads `critic.model.fsdp_config`"
_ROLLOUT_CORRECTION = "a rollout-correction key of an older verl (0.6-0.7) that verl 0.9 dropped"

ACCEPTED_UNUSED: dict[str, str] = {
    # Hydra's own keys, present in verl's unflattened YAML files.
    "defaults": "`defaults:` lists are composed with `--config-path DIR --config-name NAME`; `--config FILE` reads one file",
    "hydra.*": "Hydra's own run settings (output folders, job logging); relm does not use them",
    # data
    "data.tokenizer": "relm uses `actor_rollout_ref.model.tokenizer_path` (or the model's tokenizer)",
    "data.use_shm": _SHM,
    "data.return_raw_input_ids": "the reward model re-renders responses itself (`reward_model.model.input_tokenizer`)",
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
    # verl 0.9.0's release branch: keep the sampled token stream across turns instead of re-templating text
    "data.continuous_token.*": _MULTI_TURN_IDS,
    # actor_rollout_ref
    "actor_rollout_ref.nccl_timeout": "relm uses PyTorch's default process-group timeout",
    "actor_rollout_ref.model.use_shm": _SHM,
    "actor_rollout_ref.model.enable_activation_offload": _ACTIVATION_OFFLOAD,
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
    "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template": _MULTI_TURN_IDS,
    "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode": _MULTI_TURN_IDS,
    "actor_rollout_ref.rollout.multi_turn.completion_callback": "relm's multi-turn loop has no completion callbacks",
    "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts": "each prompt's conversations are `rollout.n` rollouts",
    "actor_rollout_ref.rollout.multi_turn.function_tool_path": "tools come from `multi_turn.tool_config_path`",
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
    "critic.forward_micro_batch_size": "deprecated in verl; use `critic.forward_micro_batch_size_per_gpu`",
    "critic.forward_max_token_len_per_gpu": "value forwards use `critic.ppo_max_token_len_per_gpu`",
    "critic.ulysses_sequence_parallel_size": _SP,
    "critic.checkpoint.*": _CKPT,
    "critic.profiler.*": _PROFILER,
    "critic.megatron.*": _MEGATRON,
    # reward_model: relm reads `enable`, `reward_manager`, `model.path`, `model.input_tokenizer`,
    # `micro_batch_size_per_gpu`, `max_length` and the judge's `rollout.*` sampling keys
    "reward_model.strategy": _RM,
    "reward_model.model.*": _RM,
    "reward_model.micro_batch_size": "deprecated in verl; use `reward_model.micro_batch_size_per_gpu`",
    "reward_model.ulysses_sequence_parallel_size": _SP,
    "reward_model.use_dynamic_bsz": _RM,
    "reward_model.forward_max_token_len_per_gpu": _RM,
    "reward_model.profiler.*": _PROFILER,
    "reward_model.rollout.*": _RM_ROLLOUT,
    "reward_model.enable_resource_pool": _RM,
    "reward_model.n_gpus_per_node": _RM,
    "reward_model.nnodes": _RM,
    "reward_model.megatron.*": _MEGATRON,
    "reward_model.launch_reward_fn_async": "relm scores a step's rewards before the step goes on (in its reward workers)",
    "reward_model.sandbox_fusion.*": _SANDBOX,
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
    # Added in verl 0.6-0.9 (the leaves of their _generated_ppo_trainer.yaml).
    "data.audio_key": _MULTIMODAL,
    "data.image_patch_size": _MULTIMODAL,
    "data.mm_processor_kwargs": _MULTIMODAL,
    "data.mm_processor_kwargs.*": _MULTIMODAL,
    "data.tool_config_path": _MULTI_TURN,
    "data.function_tool_path": _MULTI_TURN,
    "actor_rollout_ref.profiler.*": _PROFILER,
    "actor_rollout_ref.model.hf_config_path": "relm reads the model's config from `actor_rollout_ref.model.path`",
    "actor_rollout_ref.model.lora.*": _LORA,
    "actor_rollout_ref.model.mtp.*": _MTP,
    "actor_rollout_ref.model.tiled_mlp.*": _TILED_MLP,
    "actor_rollout_ref.actor.calculate_entropy": "relm always computes the entropy (`actor/entropy`)",
    "actor_rollout_ref.actor.calculate_sum_pi_squared": (
        "relm's old-logprob forward computes sum_pi_squared exactly when `algorithm.adv_estimator` reads it "
        "(optimal_token_baseline, tir_optimal_token_baseline); verl's variance_proxy/ metrics are not computed"
    ),
    "actor_rollout_ref.actor.data_loader_seed": _SEED,
    "actor_rollout_ref.actor.freeze_vision_tower": _MULTIMODAL,
    "actor_rollout_ref.actor.loss_scale_factor": "a constant loss divisor is not implemented; `loss_agg_mode` decides",
    "actor_rollout_ref.actor.entropy_from_logits_chunk_size": _ENTROPY_MEM,
    "actor_rollout_ref.actor.pad_to_length": "relm packs or pads micro-batches itself",
    "actor_rollout_ref.actor.rollout_n": _ROLLOUT_N,
    "actor_rollout_ref.actor.use_prefix_grouper": "shared-prefix forwards are not implemented",
    "actor_rollout_ref.actor.optim.optimizer": _OPTIM,
    "actor_rollout_ref.actor.optim.optimizer_impl": _OPTIM,
    "actor_rollout_ref.actor.optim.override_optimizer_config": _OPTIM,
    "actor_rollout_ref.actor.optim.zero_indexed_step": "relm's learning-rate schedules count steps from 0",
    "actor_rollout_ref.actor.qat.*": _QAT,
    "actor_rollout_ref.actor.router_replay.*": _ROUTER_REPLAY,
    "actor_rollout_ref.ref.entropy_from_logits_chunk_size": _ENTROPY_MEM,
    "actor_rollout_ref.ref.pad_to_length": "relm packs or pads micro-batches itself",
    "actor_rollout_ref.ref.rollout_n": _ROLLOUT_N,
    "actor_rollout_ref.ref.router_replay.*": _ROUTER_REPLAY,
    "actor_rollout_ref.rollout.data_parallel_size": _IN_PROCESS,
    "actor_rollout_ref.rollout.expert_parallel_size": _IN_PROCESS,
    "actor_rollout_ref.rollout.pipeline_model_parallel_size": _IN_PROCESS,
    "actor_rollout_ref.rollout.n_gpus_per_node": _IN_PROCESS,
    "actor_rollout_ref.rollout.nnodes": _IN_PROCESS,
    "actor_rollout_ref.rollout.enable_prefix_caching": _VLLM,
    "actor_rollout_ref.rollout.scheduling_policy": _VLLM,
    "actor_rollout_ref.rollout.full_determinism": _VLLM,
    "actor_rollout_ref.rollout.skip_tokenizer_init": "relm's engines take and return token ids, never text",
    "actor_rollout_ref.rollout.logprobs_mode": "relm's engines return the logprobs of the distribution they sample from",
    "actor_rollout_ref.rollout.seed": _SEED,
    "actor_rollout_ref.rollout.enable_rollout_routing_replay": _ROUTER_REPLAY,
    "actor_rollout_ref.rollout.router_config_path": _ROUTER_REPLAY,
    "actor_rollout_ref.rollout.moe_load_balance_metrics_interval": "MoE load-balance metrics are not logged",
    "actor_rollout_ref.rollout.quantization_config_file": _QUANT_FILE,
    "actor_rollout_ref.rollout.qat.*": _QAT,
    "actor_rollout_ref.rollout.mtp": _MTP,
    "actor_rollout_ref.rollout.mtp.*": _MTP,
    "actor_rollout_ref.rollout.checkpoint_engine.*": "relm hands weights to its engine in-process",
    "actor_rollout_ref.rollout.disaggregation.*": "prefill/decode disaggregation is not implemented",
    "actor_rollout_ref.rollout.prometheus.*": "relm's engines export no Prometheus metrics",
    "critic.data_loader_seed": _SEED,
    "critic.loss_scale_factor": "a constant loss divisor is not implemented; `critic.loss_agg_mode` decides",
    "critic.fsdp.*": _CRITIC_ENGINE,
    "critic.model.tokenizer_path": (
        "the critic reads the actor's token ids, so its tokenizer is the actor's (`actor_rollout_ref.model.tokenizer_path`)"
    ),
    "critic.model.custom_chat_template": "the critic scores the actor's token ids; it applies no chat template",
    "critic.model.hf_config_path": "relm reads the critic's config from `critic.model.path`",
    "critic.model.lora.*": _LORA,
    "critic.model.mtp.*": _MTP,
    "critic.model.tiled_mlp.*": _TILED_MLP,
    "critic.model.use_fused_kernels": _KERNELS,
    "critic.model.use_liger": _KERNELS,
    "critic.model.fused_kernel_options.*": _KERNELS,
    "critic.optim.optimizer": _OPTIM,
    "critic.optim.optimizer_impl": _OPTIM,
    "critic.optim.override_optimizer_config": _OPTIM,
    "critic.optim.zero_indexed_step": "relm's learning-rate schedules count steps from 0",
    "algorithm.filter_groups.max_inflight_gen_batches": _ASYNC,
    "reward_model.use_reward_loop": _REWARD_IN_PROCESS,
    "reward_model.reward_loop_source": _REWARD_IN_PROCESS,
    "reward_model.reward_loop_module_path": _REWARD_IN_PROCESS,
    "reward_model.reward_loop_class_name": _REWARD_IN_PROCESS,
    "reward.reward_manager.source": _REWARD_IN_PROCESS,
    "reward.reward_manager.module.*": _REWARD_IN_PROCESS,
    "reward.reward_model.*": _RM,
    "reward.sandbox_fusion.*": _SANDBOX,
    "reward_manager.source": _REWARD_IN_PROCESS,
    "reward_manager.module.*": _REWARD_IN_PROCESS,
    "sandbox_fusion.*": _SANDBOX,
    # verl's dataclass-only keys of the top-k loss (not in its YAML; scripts add them with `+`)
    "distillation.distillation_loss.use_chunked_topk": _CHUNKED_TOPK,
    "distillation.distillation_loss.chunked_topk_chunk_size": _CHUNKED_TOPK,
    "transfer_queue.*": _TRANSFER_QUEUE,
    "skip.*": _SKIP,
    "trainer.checkpoint_callback_class": _CKPT,
    "trainer.profile_steps": _PROFILER,
    "trainer.controller_nsight_options.*": _PROFILER,
    "trainer.worker_nsight_options.*": _PROFILER,
    "trainer.npu_profile.*": _PROFILER,
    "trainer.use_v1": _TRAINER_V1,
    "trainer.v1.*": _TRAINER_V1,
    # Keys verl's own scripts add with `+` (not in its default config).
    "actor_rollout_ref.actor.model_engine": "relm trains on its FSDP2 path (verl's `dp` engine)",
    "actor_rollout_ref.actor.veomni.*": _OTHER_ENGINE,
    "actor_rollout_ref.ref.veomni.*": _OTHER_ENGINE,
    "critic.veomni.*": _OTHER_ENGINE,
    "actor_rollout_ref.actor.torchtitan.*": _OTHER_ENGINE,
    "actor_rollout_ref.ref.torchtitan.*": _OTHER_ENGINE,
    "critic.torchtitan.*": _OTHER_ENGINE,
    "actor_rollout_ref.actor.policy_loss.tau_pos": _SAPO_TAU.format("pos"),
    "actor_rollout_ref.actor.policy_loss.tau_neg": _SAPO_TAU.format("neg"),
    **{
        f"{section}.optim.{key}": _ENGINE_OPTIM
        for section in ("actor_rollout_ref.actor", "critic")
        for key in (*_MEGATRON_OPTIM_KEYS, *_OTHER_OPTIM_KEYS, "lr_min", "name")
    },
    # verl 0.4-0.7's Megatron configs (`ppo_megatron_trainer.yaml`) beside the engine sections.
    **{f"{section}.load_weight": _LOAD_WEIGHT for section in _MEGATRON_OWNERS},
    **{f"{section}.profile.*": _PROFILER for section in ("actor_rollout_ref.actor", "actor_rollout_ref.ref")},
    **{
        f"{section}.gradient_checkpointing_kwargs.*": _RECOMPUTE
        for section in ("actor_rollout_ref.model", "critic.model")
    },
    "actor_rollout_ref.rollout.layer_name_map.*": _MEGATRON,
    "critic.kl_ctrl.*": "verl 0.4's Megatron critic copy of `algorithm.kl_ctrl`; relm reads `algorithm.kl_ctrl`",
    "reward_model.nccl_timeout": _RAY,
    "actor_rollout_ref.ref.optim.*": "TorchTitan's engine gives the reference an optimizer section; it is not trained",
    "actor_rollout_ref.actor.checkpoint.mbridge_config.*": _MEGATRON,
    "critic.checkpoint.mbridge_config.*": _MEGATRON,
    "critic.nccl_timeout": _RAY,
    "actor_rollout_ref.actor.optim.override_optimizer_config.*": _OPTIM,
    "critic.optim.override_optimizer_config.*": _OPTIM,
    "actor_rollout_ref.rollout.moe_tensor_parallel_size": _IN_PROCESS,
    "actor_rollout_ref.actor.mindspeed.*": _MINDSPEED,
    "actor_rollout_ref.ref.mindspeed.*": _MINDSPEED,
    "critic.mindspeed.*": _MINDSPEED,
    "actor_rollout_ref.actor.optim.min_lr": "relm's cosine schedule decays to `optim.min_lr_ratio` x `optim.lr`",
    "critic.optim.min_lr": "relm's cosine schedule decays to `optim.min_lr_ratio` x `optim.lr`",
    # top level
    "model_engine": "relm trains on its FSDP2 path (verl's `dp` engine)",
    "ray_init.*": _RAY,
    "ray_kwargs.*": _RAY,
    "global_profiler.*": _PROFILER,
}
"""Dotted verl key (or `prefix.*` subtree) -> why relm ignores it."""

UNSUPPORTED_WHEN_ENABLED: dict[str, str] = {
    "algorithm.use_pf_ppo": "PF-PPO (policy filtration) is not supported yet",
    "algorithm.rollout_correction.rollout_rs_threshold_lower": (
        "verl 0.9 writes both bounds in `algorithm.rollout_correction.rollout_rs_threshold` as `lower_upper`; set that"
    ),
    "algorithm.rollout_correction.rollout_token_veto_threshold": (
        "verl 0.9 dropped the token veto; a `token_k1` bound in `algorithm.rollout_correction.rollout_rs` does its job"
    ),
    "algorithm.rollout_correction.use_policy_gradient": (
        "verl 0.9 names this `algorithm.rollout_correction.loss_type=reinforce` (with bypass_mode=true); set that"
    ),
    "algorithm.rollout_correction.use_pure_rollout_correction": (
        "verl 0.9 names this `algorithm.rollout_correction.loss_type=reinforce` (with bypass_mode=true); set that"
    ),
    "algorithm.rollout_correction.bypass_old_logprob_for_rollout": (
        "later verl names this `algorithm.rollout_correction.bypass_mode`; set that key"
    ),
    "actor_rollout_ref.model.lora.rank": "Megatron's LoRA section: set actor_rollout_ref.model.lora_rank instead",
    "critic.model.lora.rank": "Megatron's LoRA section: set critic.model.lora_rank instead",
    "actor_rollout_ref.actor.qat.enable": "quantization-aware training is not supported yet",
    "actor_rollout_ref.rollout.qat.enable": "quantization-aware training is not supported yet",
    "actor_rollout_ref.model.mtp.enable": "multi-token prediction (MTP) is not supported yet",
    "actor_rollout_ref.actor.loss_scale_factor": (
        "a constant loss divisor is not supported yet; leave it null and pick `loss_agg_mode`"
    ),
    "data.tool_config_path": "tool calling (multi-turn rollouts) is not supported yet",
    "transfer_queue.enable": "verl's transfer queue is not supported; leave it off",
    "reward.reward_manager.module.path": "custom reward-manager classes are not supported; use a custom function",
    "reward_manager.module.path": "custom reward-manager classes are not supported; use a custom function",
    "skip.rollout.enable": "rollout dumps and replays are not supported yet",
    "skip.async_rollout.enable": "rollout dumps and replays are not supported yet",
    "skip.rollout_tq.enable": "rollout dumps and replays are not supported yet",
    "actor_rollout_ref.actor.optim.min_lr": _FLOOR,
    "critic.optim.min_lr": _FLOOR,
    "actor_rollout_ref.actor.optim.optimizer": "relm trains with AdamW only",
    "critic.optim.optimizer": "relm trains with AdamW only",
    "actor_rollout_ref.actor.optim.optimizer_impl": "relm trains with torch's AdamW (`torch.optim`) only",
    "critic.optim.optimizer_impl": "relm trains with torch's AdamW (`torch.optim`) only",
    **{
        f"{section}.optim.{key}": _FLOOR
        for section in ("actor_rollout_ref.actor", "critic")
        for key in ("lr_min",)
    },
    **{
        f"{section}.optim.name": "relm trains with AdamW only"
        for section in ("actor_rollout_ref.actor", "critic")
    },
}
"""Accepted keys whose non-off value would change what is trained: turning them on is an error."""

OFF_VALUES: dict[str, tuple[object, ...]] = {
    # Megatron's `adam` decouples weight decay (AdamW); it is what verl's Megatron optimizer config writes.
    "actor_rollout_ref.actor.optim.optimizer": (None, "AdamW", "adamw", "adam"),
    "critic.optim.optimizer": (None, "AdamW", "adamw", "adam"),
    **{f"{section}.load_weight": (None, True) for section in _MEGATRON_OWNERS},
    "actor_rollout_ref.actor.optim.name": (None, "AdamW", "adamw"),
    "critic.optim.name": (None, "AdamW", "adamw"),
    "actor_rollout_ref.actor.optim.optimizer_impl": (None, "torch.optim"),
    "critic.optim.optimizer_impl": (None, "torch.optim"),
}
"""Values meaning "as relm does" for keys of `UNSUPPORTED_WHEN_ENABLED` where that is not verl's usual off
value (`null`, `false`, `0`, `""`)."""
_USUAL_OFF: tuple[object, ...] = (None, False, 0, "")


def is_off(key: str, value: object) -> bool:
    """Whether an accepted key's value leaves relm's behaviour as it is (see `UNSUPPORTED_WHEN_ENABLED`)."""
    return value in OFF_VALUES.get(key, _USUAL_OFF)


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
