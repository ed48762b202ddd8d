"""Per-component specs: the verl-language config translated once into the values each part of a run reads.

verl's schema (`relm.config.schema`) is the user's language: one tree of sections whose keys name verl's
machinery, with fallbacks between keys. A component should not need that tree to be built or tested, so
`relm.config.translate.translate` turns it, once, into the small frozen records below, one per component
(torchtitan's builders take only their own section). Every field says which key sets it; the table in
`relm.config.key_table` lists, for every key relm accepts, the field it sets (or why it sets none), and a
test holds the two together.

Values are resolved here: fallbacks between keys are already applied (`relm.config.loader._fill_derived`),
deprecated global sizes converted, rollout correction parsed. Sizes that also need the data (rows per
micro-batch, the step count) are computed from these specs by `relm.trainer.components.compute_sizes`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from relm.config.rollout_correction import RolloutCorrection


@dataclass(frozen=True)
class DataSpec:
    """The prompt dataset and its loader (`data.*`)."""

    train_files: tuple[str, ...] | None
    """Training prompt sources; None runs the built-in demo task."""
    val_files: tuple[str, ...] | None
    """Validation prompt sources."""
    train_max_samples: int
    """Rows of the training sources used (-1: all)."""
    val_max_samples: int
    """Rows of the validation sources used (-1: all)."""
    prompt_key: str
    """Column holding the prompt."""
    reward_fn_key: str
    """Column whose value selects the rule scorer."""
    max_prompt_length: int
    """Longest prompt in tokens."""
    max_response_length: int
    """New tokens per response at most."""
    prompts_per_step: int
    """Prompts per training step (`data.train_batch_size`)."""
    val_batch_size: int | None
    """Prompts per validation batch (None: all at once)."""
    shuffle: bool
    """Shuffle the training prompts each epoch."""
    filter_overlong_prompts: bool
    """Drop prompts longer than `max_prompt_length`."""
    truncation: str
    """What happens to overlong prompts that are kept."""
    chat_template_kwargs: Mapping[str, Any]
    """Extra arguments of `apply_chat_template`."""
    return_raw_chat: bool
    """Keep the raw chat messages on the prompt batch."""
    trust_remote_code: bool
    """Allow the tokenizer's own code (verl loads the trainer's tokenizer with `data.trust_remote_code`)."""
    seed: int
    """Seed of the shuffle and of sub-sampling."""
    custom_cls: tuple[str, str] | None = None
    """A user's verl dataset class (`data.custom_cls.path`, `.name`) that reads the files instead (None: relm's)."""
    verl_config: Mapping[str, Any] | None = None
    """The `data.*` section as verl hands it to a dataset class (`config=`), for `custom_cls`."""


@dataclass(frozen=True)
class LoraSpec:
    """LoRA adapters of one trained model (rank 0: none)."""

    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    exclude_modules: tuple[str, ...] | None
    adapter_path: str | None


@dataclass(frozen=True)
class ModelSourceSpec:
    """Where one trained model's weights come from and how they load."""

    path: str | None
    """Model folder, Hub id or `zoo:` name (the critic's None: the actor's folder)."""
    tokenizer_path: str | None
    """Tokenizer folder or Hub id (None: `path`)."""
    chat_template: str | None
    """A Jinja chat template replacing the tokenizer's."""
    override_config: Mapping[str, Any]
    """Values set on the HF config before loading."""
    gradient_checkpointing: bool | None
    """Recompute activations in backward (None: the memory plan decides)."""
    remove_padding: bool
    """Pack rows without padding in training forwards."""
    trust_remote_code: bool
    """Allow the model folder's own code (the critic's also when it shares the actor's folder and the actor's is on)."""
    trust_key: str
    """The key that allows it, for the message that asks for it."""
    external_lib: str | None
    """A module imported before loading the model."""
    lora: LoraSpec
    """Adapters (rank 0: every weight trains)."""
    init_seed: int
    """Seed of the random weights a folder without weight files (a `zoo:` model) gets."""


@dataclass(frozen=True)
class OptimSpec:
    """AdamW and its learning-rate schedule, for one trained model."""

    lr: float
    warmup_steps: int
    """Warmup optimizer steps (-1: from `warmup_steps_ratio`)."""
    warmup_steps_ratio: float
    min_lr_ratio: float
    schedule: str
    """`constant` or `cosine` (`optim.warmup_style`, verl 0.6's `lr_scheduler_type`)."""
    weight_decay: float
    betas: tuple[float, float]
    total_training_steps: int | None
    """Training steps the schedule spans when the user set them (a set value wins); None: the run's."""
    moments_dtype: str | None
    """The user's AdamW moment storage (None: the memory plan decides)."""


@dataclass(frozen=True)
class ShardingSpec:
    """FSDP2 settings of one model in a torchrun run."""

    offload_policy: bool | None
    """FSDP2's CPU offload (None: relm decides, `relm.trainer.data_parallel.choose_offload`)."""
    shard_size: int | None
    """`fsdp_size` (None: the memory plan decides)."""


@dataclass(frozen=True)
class UpdateSpec:
    """How one trained model's update cuts a step's responses (rows are per GPU)."""

    prompts_per_minibatch: int
    """`ppo_mini_batch_size`, counted in prompts (times `rollout.n` responses)."""
    rows_per_microbatch: int | None
    """Responses per forward/backward (None: relm's default of up to 16)."""
    rows_per_forward: int | None
    """Responses per no-grad forward (old logprobs or values; None: the micro-batch's)."""
    dynamic_batch: bool
    """Cut micro-batches by tokens (`use_dynamic_bsz`)."""
    max_tokens_per_microbatch: int | None
    """`ppo_max_token_len_per_gpu`."""
    num_epochs: int
    shuffle: bool
    grad_clip: float
    loss_agg_mode: str


@dataclass(frozen=True)
class TrainedModelSpec:
    """One trained model (the actor or the critic): its weights, optimizer, update and sharding."""

    name: str
    """`actor` or `critic`."""
    source: ModelSourceSpec
    optim: OptimSpec
    update: UpdateSpec
    sharding: ShardingSpec
    seed: int
    """Seed of this model's shuffles and of stochastic rounding."""


@dataclass(frozen=True)
class LossParams:
    """Settings only some policy losses read, under verl 0.9.1's key names and defaults.

    One record passed to every loss (rather than a keyword each) keeps the losses' signatures alike, so
    `compute_policy_loss` runs any registered loss the same way; a loss reads the fields it needs.
    """

    tau_pos: float = 1.0
    """`actor.tau_pos`: SAPO's gate temperature where A > 0."""
    tau_neg: float = 1.05
    """`actor.tau_neg`: SAPO's gate temperature where A <= 0."""
    clip_cov_ratio: float = 0.0002
    """`policy_loss.clip_cov_ratio`: share of valid tokens Clip-Cov may take out of the gradient."""
    clip_cov_lb: float = 1.0
    """`policy_loss.clip_cov_lb`: Clip-Cov's candidates have covariance above this..."""
    clip_cov_ub: float = 5.0
    """`policy_loss.clip_cov_ub`: ...and below this."""
    kl_cov_ratio: float = 0.0002
    """`policy_loss.kl_cov_ratio`: share of valid tokens (largest covariance) KL-Cov penalises."""
    ppo_kl_coef: float = 0.1
    """`policy_loss.ppo_kl_coef`: KL-Cov's weight of |log ratio| on those tokens."""
    dro_beta: float | None = None
    """`policy_loss.dro_beta`: DRO's quadratic log-ratio penalty (required, > 0, for `dro`)."""
    correction: RolloutCorrection | None = None
    """The rollout correction verl's `bypass_mode` loss reads; None: verl's `policy_loss.rollout_correction`
    default (relm's runs leave it None: in bypass mode the learner passes `algorithm.rollout_correction`
    to `bypass_policy_loss` itself)."""


@dataclass(frozen=True)
class ActorLossSpec:
    """The policy objective (`actor_rollout_ref.actor.*` loss keys)."""

    loss_mode: str
    clip_ratio_low: float
    clip_ratio_high: float
    clip_ratio_c: float
    entropy_coeff: float
    use_kl_loss: bool
    kl_loss_coef: float
    kl_loss_type: str
    use_torch_compile: bool
    """Compiled fused layer pieces in every training forward (GPU only)."""
    params: LossParams
    """Settings of the losses that read their own (`sapo`'s taus, `clip_cov`, `kl_cov`, `dro`, `bypass_mode`)."""


@dataclass(frozen=True)
class CriticLossSpec:
    """The value objective."""

    cliprange_value: float


@dataclass(frozen=True)
class ReferenceSpec:
    """The frozen reference policy."""

    rows_per_forward: int | None
    """Responses per reference forward (None: the actor's micro-batch)."""
    shard_size: int | None


@dataclass(frozen=True)
class SamplingSpec:
    """Sampling settings of one generation pass."""

    temperature: float
    top_p: float
    top_k: int
    do_sample: bool
    n: int
    """Responses per prompt."""


@dataclass(frozen=True)
class MultiTurnSpec:
    """Multi-turn rollouts with tools (`rollout.multi_turn.*`)."""

    enable: bool
    max_assistant_turns: int | None
    max_user_turns: int | None
    max_turns: int | None
    tool_config_path: str | None
    interaction_config_path: str | None
    format: str
    max_parallel_calls: int
    max_tool_response_length: int
    tool_response_truncate_side: str


@dataclass(frozen=True)
class EngineSpec:
    """The rollout engine (`actor_rollout_ref.rollout.*`)."""

    name: str
    """`native`, `hf` or `vllm`."""
    dtype: str
    """Generation dtype on a GPU."""
    sampling: SamplingSpec
    val_sampling: SamplingSpec
    ignore_eos: bool
    prompt_length: int
    response_length: int
    gpu_memory_utilization: float
    free_cache_engine: bool
    tensor_parallel_size: int
    enforce_eager: bool
    enable_chunked_prefill: bool
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    quantization: str | None
    engine_kwargs: Mapping[str, Any]
    timeout_s: float | None
    multi_turn: MultiTurnSpec
    seed: int
    """Seed of the engine's sampler (each rank adds its rank)."""


@dataclass(frozen=True)
class OverlongSpec:
    """DAPO's overlong shaping."""

    enable: bool
    length: int
    penalty_factor: float
    log: bool


@dataclass(frozen=True)
class JudgeSpec:
    """An LLM judge's prompt and score parsing."""

    prompt_template: str | None
    prompt_template_path: str | None
    score_regex: str
    default_score: float


@dataclass(frozen=True)
class RewardModelSpec:
    """A reward model or LLM judge scoring in the training process."""

    enable: bool
    path: str | None
    input_tokenizer: str | None
    trust_remote_code: bool
    rows_per_forward: int | None
    max_length: int | None
    engine: str
    """The judge's engine (`reward_model.rollout.name`)."""
    sampling: SamplingSpec
    prompt_length: int
    response_length: int
    judge: JudgeSpec
    seed: int


@dataclass(frozen=True)
class RewardSpec:
    """How responses are scored: the rule or custom function, its worker pool, shaping, the model."""

    manager: str
    """`naive`, `batch`, `prime`, `dapo` or `gdpo`."""
    custom_function_path: str | None
    custom_function_name: str
    num_workers: int | None
    timeout_s: float
    failure_score: float
    max_failure_share: float
    memory_limit_mb: float | None
    overlong: OverlongSpec
    max_response_length: int
    model: RewardModelSpec
    experiment_name: str = ""
    """`trainer.experiment_name`, which the `gdpo` manager adds to each response's `extra_info`."""

    @property
    def uses_builtin_scorers(self) -> bool:
        """The rule scorers score the run (no custom function, no reward model): each row needs its answer."""
        return not self.custom_function_path and not self.model.enable


@dataclass(frozen=True)
class KLControlSpec:
    type: str
    kl_coef: float
    horizon: int
    target_kl: float


@dataclass(frozen=True)
class AlgorithmSpec:
    """Advantages, the in-reward KL penalty, DAPO group filtering and rollout correction."""

    adv_estimator: str
    gamma: float
    lam: float
    norm_adv_by_std_in_grpo: bool
    use_kl_in_reward: bool
    kl_penalty: str
    kl_ctrl: KLControlSpec
    filter_groups: bool
    filter_metric: str
    max_num_gen_batches: int
    rollout_correction: RolloutCorrection
    """Parsed once (`relm.config.rollout_correction.parse_rollout_correction`)."""
    gdpo_reward_keys: tuple[str, ...]
    """`gdpo`: the reward function's keys normalised one by one; empty for every other estimator's run."""
    gdpo_reward_weights: tuple[float, ...] | None
    """`gdpo`: their weights; None weighs each 1."""


@dataclass(frozen=True)
class DistillationLoss:
    """How the per-token divergences become the distillation term (`distillation.distillation_loss.*`;
    `relm.algorithms.distillation.distillation_loss`)."""

    loss_mode: str
    """One of `relm.algorithms.distillation.LOSS_MODES`."""
    use_policy_gradient: bool
    """The negated divergence is a per-token advantage in the clipped policy loss (else the divergence is
    the loss itself)."""
    loss_max_clamp: float | None
    """Per-token divergences are clamped to [-c, c] before they are used (None: no clamp)."""
    clip_ratio_low: float
    clip_ratio_high: float
    """The policy loss's clip range when `use_policy_gradient`."""


@dataclass(frozen=True)
class TeacherSpec:
    """One frozen teacher (`distillation.teacher_models.NAME`)."""

    name: str
    """Its entry's name under `teacher_models` (for messages)."""
    key: str
    """The `teacher_key` value of the rows it scores (`default` for a lone teacher, which scores all)."""
    path: str
    """Its weights: a folder, a Hub id or `zoo:NAME`."""


@dataclass(frozen=True)
class DistillationSpec:
    """On-policy distillation (`distillation.*`): the teachers and the loss."""

    enabled: bool
    teachers: tuple[TeacherSpec, ...]
    """Empty unless `enabled`; with several, a response goes to the one whose `key` is its row's data_source."""
    loss: DistillationLoss
    use_task_rewards: bool
    """The task's policy loss stays and the distillation term is added times `coef`; else it stands alone."""
    coef: float
    topk: int | None
    """`forward_kl_topk`: the teacher's top ids a position (None for the estimator modes)."""
    log_prob_min_clamp: float | None
    """`forward_kl_topk`: floor of both sides' top-k log-probabilities (None: none)."""


@dataclass(frozen=True)
class MemorySpec:
    """The run's side of the memory plan request that no model spec carries."""

    weights_dtype: str
    """`actor_rollout_ref.model.dtype` (`auto`, `float32`, `bfloat16`, `float16`)."""
    max_gpu_memory_gb: float | None
    max_host_memory_gb: float | None
    num_gpus: int
    """`n_gpus_per_node` x `nnodes`."""


@dataclass(frozen=True)
class LoopSpec:
    """The step loop: its length, validation, saving, logging and resuming (`trainer.*`)."""

    total_epochs: int
    total_training_steps: int | None
    project_name: str
    experiment_name: str
    loggers: tuple[str, ...]
    run_dir: str
    save_freq: int
    test_freq: int
    val_before_train: bool
    val_only: bool
    log_val_generations: int
    rollout_data_dir: str | None
    validation_data_dir: str | None
    critic_warmup: int
    n_gpus_per_node: int
    nnodes: int
    device: str
    balance_batch: bool
    resume_mode: str
    resume_from_path: str | None
    max_actor_ckpt_to_keep: int | None
    max_critic_ckpt_to_keep: int | None
    max_skipped_steps: int
    seed: int


@dataclass(frozen=True)
class AsyncSpec:
    """Asynchronous training (`async_training.*`): a rollout process ahead of the trainer by a bounded number
    of weight versions (`relm.trainer.async_rollout`)."""

    enabled: bool
    staleness_threshold: float
    """verl's share of a sync's samples the rollout side may generate ahead; whole steps count (`versions_behind`)."""
    trigger_parameter_sync_step: int | None
    """Checked against one step's mini-batches at start (`relm.config.async_training`); relm syncs every step."""
    require_batches: int
    partial_rollout: bool
    """Generate in segments and take up weights that arrive between them (`relm.rollout.partial`)."""

    @property
    def max_versions_behind(self) -> int:
        """The most weight versions a trained batch may be older than the weights it is trained on: whole
        steps of `staleness_threshold` (verl lets the rollout side produce (1 + threshold) syncs' samples per
        version; in whole batches that is floor(1 + threshold))."""
        return math.floor(self.staleness_threshold)


@dataclass(frozen=True)
class RunSpec:
    """Every component's spec for one run."""

    data: DataSpec
    actor: TrainedModelSpec
    actor_loss: ActorLossSpec
    critic: TrainedModelSpec
    critic_loss: CriticLossSpec
    reference: ReferenceSpec
    engine: EngineSpec
    reward: RewardSpec
    algorithm: AlgorithmSpec
    memory: MemorySpec
    loop: LoopSpec
    distillation: DistillationSpec
    asynchronous: AsyncSpec
