"""The configuration schema: one dataclass per section, with verl's key names and meanings.

Each field carries a one-line docstring (the string literal below it); docs/configuration.md is
written from the same words. Keys of verl's default PPO config that relm accepts but does not use
live in `relm.config.verl_keys`, not here: this file holds only what relm acts on.

Defaults follow verl where a verl user would expect them; the built-in demo preset
(`relm/config/demo.yaml`) supplies small sizes when no dataset is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class CustomClsConfig:
    """A user's verl dataset class loaded from a file (verl's `data.custom_cls`): it reads `data.train_files`
    and `data.val_files` instead of relm's own readers."""

    path: str | None = None
    """Python file that defines the class (a `torch.utils.data.Dataset` taking verl's `data_files, tokenizer, config, processor`)."""
    name: str | None = None
    """Name of the class in that file."""


@dataclass
class DataConfig:
    """Where prompts come from and how they are batched (`data.*`)."""

    train_files: list[str] | None = None
    """Training prompts: parquet, jsonl/json or csv file(s), `save_to_disk` folders or Hub dataset ids; unset runs the built-in demo task."""
    val_files: list[str] | None = None
    """Validation prompts, in the same forms (a Hub id takes its `test` split; `org/name:split` names one)."""
    train_max_samples: int = -1
    """Rows of `train_files` used: -1 all; else a random subset (seeded by `seed`) when `shuffle` is on, the first rows when off (as verl 0.9)."""
    val_max_samples: int = -1
    """Rows of `val_files` used, drawn as `train_max_samples` draws."""
    prompt_key: str = "prompt"
    """Column holding the prompt: a list of chat messages, or a text (one user message)."""
    reward_fn_key: str = "data_source"
    """Column whose value selects the rule scorer."""
    max_prompt_length: int = 512
    """Longest prompt in tokens, chat template included; longer ones are dropped or cut (`filter_overlong_prompts`, `truncation`)."""
    max_response_length: int = 512
    """Generation stops after this many new tokens."""
    train_batch_size: int = 1024
    """Prompts per training step (each sampled `rollout.n` times)."""
    val_batch_size: int | None = None
    """Prompts per validation batch; unset means the whole validation set at once."""
    shuffle: bool = True
    """Shuffle the training prompts each epoch (seeded, so a resume continues the same order)."""
    filter_overlong_prompts: bool = True
    """Drop prompts longer than `max_prompt_length` (one warning with the count); false hands them to `truncation`."""
    truncation: str = "error"
    """Overlong prompts kept by `filter_overlong_prompts=false`: `error` stops naming the row; `left` keeps the last tokens, `right` the first, `middle` both ends (as verl)."""
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra arguments of `tokenizer.apply_chat_template` (as verl), e.g. `{date_string: 26 Jul 2024}` for Llama 3's template."""
    return_raw_chat: bool = False
    """Keep each prompt's raw chat messages on the prompt batch beside the token ids (for rewards that read them)."""
    trust_remote_code: bool = False
    """Allow the tokenizer's own code from its folder (relm's one tokenizer reads the data too, so this key or the
    model's allows it)."""
    seed: int | None = None
    """Seed for the shuffle; unset uses the top-level `seed`."""
    custom_cls: CustomClsConfig = field(default_factory=CustomClsConfig)
    """A user's verl dataset class that reads the data files instead of relm's readers."""

    def __post_init__(self) -> None:
        self.plus_keys: dict[str, Any] = {}
        """Keys the command line added with Hydra's `+data.KEY=VALUE` that the schema lacks (nested), which
        verl accepts and passes to its dataset class with the rest of `data`: a `data.custom_cls` class gets
        them in its `config`. Not a field: no key of its own, set by the loader only."""


@dataclass
class ModelConfig:
    """The policy model (`actor_rollout_ref.model.*`)."""

    path: str = "zoo:tiny/qwen2"
    """Local folder, Hub id, `zoo:NAME` (random weights, known config) or `zoo:tiny/NAME` (shrunk)."""
    tokenizer_path: str | None = None
    """Tokenizer folder or Hub id; unset uses `path`."""
    custom_chat_template: str | None = None
    """A Jinja chat template that replaces the tokenizer's own."""
    override_config: dict[str, Any] = field(default_factory=dict)
    """Values set on the model's HF config before loading (e.g. `{attn_implementation: eager}`)."""
    enable_gradient_checkpointing: bool | None = None
    """Recompute activations in backward to save memory; unset lets the memory plan decide on a GPU (off when
    two full sequences fit without it) and is off on CPU. verl's default is on."""
    use_remove_padding: bool = False
    """Pack the batch into one sequence (no padding computed); on a GPU attention then runs torch's flash
    variable-length kernel; on CPU the dense packed mask makes it slower than padding."""
    trust_remote_code: bool = False
    """Allow model code shipped inside the model folder."""
    external_lib: str | None = None
    """A module imported before loading, for architectures registered outside transformers."""
    lora_rank: int = 0
    """LoRA adapters of this rank on the target layers, the rest frozen (0: train every weight); docs/lora.md."""
    lora_alpha: float = 16
    """LoRA scale numerator: adapters add (lora_alpha / lora_rank) * B @ A to each target weight."""
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Layers that get adapters: `all-linear` (every Linear but the output head) or a list of names."""
    exclude_modules: list[str] | None = None
    """Layer names kept without adapters."""
    lora_adapter_path: str | None = None
    """A saved PEFT adapter folder (adapter_config.json) to start from instead of fresh adapters."""
    dtype: str = "auto"
    """Dtype of the trained weights (actor and critic): `auto` is fp32 master weights computing in bf16 on a
    GPU, or bf16 weights when the memory plan finds fp32 ones do not fit, and fp32 on CPU; `float32`,
    `bfloat16` (AdamW updates stochastically rounded in single-process runs) or `float16` fix it."""


@dataclass
class OptimConfig:
    """AdamW with linear warmup (`*.optim.*`)."""

    lr: float = 1e-6
    """Peak learning rate."""
    lr_warmup_steps: int = -1
    """Warmup steps; -1 derives them from `lr_warmup_steps_ratio`."""
    lr_warmup_steps_ratio: float = 0.0
    """Share of the total training steps spent warming up."""
    min_lr_ratio: float | None = 0.0
    """Floor of the cosine schedule as a share of `lr` (null means 0)."""
    warmup_style: str = "constant"
    """`constant` (flat after warmup) or `cosine` (decays to `min_lr_ratio`)."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    total_training_steps: int = -1
    """Training steps the learning-rate schedule spans (warmup ratio, cosine decay); -1 (or 0) is the run's
    length from the data and epochs, a set value wins (verl overwrites it with the run's length)."""
    moments_dtype: str | None = None
    """relm: storage of AdamW's two moments, `float32` or `bfloat16` (the step computes in fp32 either way);
    unset lets the memory plan decide on one GPU (fp32 unless it does not fit) and is fp32 elsewhere."""


@dataclass
class FSDPConfig:
    """FSDP2 settings of a sharded model (`*.fsdp_config.*`); they act only in a torchrun run."""

    offload_policy: bool | None = None
    """FSDP2's CPUOffloadPolicy: parameters, gradients and the optimizer step live on the CPU. Unset (verl
    writes false): relm turns it on for a sharded GPU run whose shards fit the card only that way and whose
    machine holds them (docs/distributed.md); true or false is kept."""
    fsdp_size: int | None = None
    """Ranks one copy of the model is sharded over: 1 replicates it (every rank holds it whole), -1
    shards it over all ranks (verl's default), a divisor of the world size gives copies of that many
    ranks each (HSDP). Unset: relm's memory plan decides, replicated when a single-GPU run of the
    model fits one GPU with nothing parked, else sharded over all ranks (docs/distributed.md)."""


@dataclass
class PolicyLossConfig:
    """Which surrogate the actor minimises (`actor.policy_loss.*`)."""

    loss_mode: str = "vanilla"
    """`vanilla` (clipped PPO surrogate) or another registered policy loss."""
    clip_cov_ratio: float = 0.0002
    """`clip_cov`: share of valid tokens (of those PPO's clip left alone, covariance in (lb, ub)) taken out
    of the gradient, at least one."""
    clip_cov_lb: float = 1.0
    """`clip_cov`: a candidate's advantage-logprob covariance exceeds this..."""
    clip_cov_ub: float = 5.0
    """`clip_cov`: ...and stays below this."""
    kl_cov_ratio: float = 0.0002
    """`kl_cov`: share of valid tokens, those of largest advantage-logprob covariance, that get the KL
    penalty, at least one."""
    ppo_kl_coef: float = 0.1
    """`kl_cov`: weight of the absolute log-ratio (log pi - log pi_old) on those tokens."""
    dro_beta: float | None = None
    """`dro`: weight of the quadratic log-ratio penalty; required (> 0) with `loss_mode=dro`."""


@dataclass
class ActorConfig:
    """Policy optimisation (`actor_rollout_ref.actor.*`)."""

    strategy: str = "fsdp"
    """verl's training backend name; relm trains with PyTorch (FSDP2 when distributed)."""
    ppo_mini_batch_size: int = 256
    """Prompts per optimizer step (times `rollout.n` responses)."""
    ppo_micro_batch_size: int | None = None
    """Deprecated global micro-batch size; use `ppo_micro_batch_size_per_gpu`."""
    ppo_micro_batch_size_per_gpu: int | None = None
    """Responses per forward/backward; gradients accumulate up to the mini-batch."""
    use_dynamic_bsz: bool = False
    """Form micro-batches by token count instead of by row count."""
    ppo_max_token_len_per_gpu: int | None = None
    """Token budget of one micro-batch when `use_dynamic_bsz` is on (or when the memory plan cuts by
    tokens); unset is the plan's budget on a GPU, 16384 elsewhere (verl's default)."""
    use_torch_compile: bool = True
    """On a GPU, run the layers' norms, MLPs, rotary embeddings and the fp32 log-softmax/entropy over
    vocabulary chunks as torch.compile'd fused kernels in every training forward and backward (actor,
    reference and critic); no effect on CPU (verl's default is on too). A piece whose compilation
    fails runs its eager code from then on, with one warning."""
    ppo_epochs: int = 1
    """Passes over each step's responses."""
    shuffle: bool = False
    """Shuffle responses between mini-batches."""
    clip_ratio: float = 0.2
    """PPO clip range; the default for both `clip_ratio_low` and `clip_ratio_high`."""
    clip_ratio_low: float | None = None
    """Lower clip range (ratio >= 1 - low); unset uses `clip_ratio`."""
    clip_ratio_high: float | None = None
    """Upper clip range (ratio <= 1 + high); unset uses `clip_ratio`."""
    clip_ratio_c: float = 3.0
    """Dual-clip bound for negative advantages (must exceed 1)."""
    loss_agg_mode: str = "token-mean"
    """`token-mean`, `token-sum`, `seq-mean-token-sum`, `seq-mean-token-mean` or `seq-mean-token-sum-norm`."""
    entropy_coeff: float = 0.0
    """Weight of the entropy bonus."""
    use_kl_loss: bool = False
    """Add KL to the reference model as a loss term (GRPO style)."""
    kl_loss_coef: float = 0.001
    """Weight of the KL loss term."""
    kl_loss_type: str = "low_var_kl"
    """KL estimator for the loss: `kl` (k1), `abs`, `mse` (k2), `low_var_kl` (k3); `+` (`k3+`): k2's gradient."""
    tau_pos: float = 1.0
    """`sapo`: gate temperature on tokens with a positive advantage."""
    tau_neg: float = 1.05
    """`sapo`: gate temperature on the others (larger: negative updates fade faster off-policy)."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value."""
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    """Policy loss selection."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Actor optimizer."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """Sharding of actor and reference (data-parallel runs)."""


@dataclass
class RefFSDPConfig:
    """Sharding of the reference model (`actor_rollout_ref.ref.fsdp_config.*`)."""

    fsdp_size: int | None = None
    """As the actor's `fsdp_config.fsdp_size`, for the reference; unset: the memory plan decides."""


@dataclass
class RefConfig:
    """The frozen reference policy (`actor_rollout_ref.ref.*`)."""

    log_prob_micro_batch_size: int | None = None
    """Deprecated global size; use `log_prob_micro_batch_size_per_gpu`."""
    log_prob_micro_batch_size_per_gpu: int | None = None
    """Responses per reference forward; unset uses the actor's micro-batch size."""
    fsdp_config: RefFSDPConfig = field(default_factory=RefFSDPConfig)
    """Sharding of the reference (data-parallel runs); it is offloaded with the actor."""


@dataclass
class ValKwargsConfig:
    """Sampling for validation (`rollout.val_kwargs.*`)."""

    temperature: float = 0.0
    """Validation temperature (0 is greedy)."""
    top_p: float = 1.0
    """Validation nucleus sampling threshold."""
    top_k: int = -1
    """Validation top-k (-1 is off)."""
    n: int = 1
    """Samples per validation prompt."""
    do_sample: bool = False
    """Sample at validation (false is greedy)."""


@dataclass
class MultiTurnConfig:
    """Multi-turn rollouts with tools (`rollout.multi_turn.*`, verl's names; docs/multi_turn.md)."""

    enable: bool = False
    """Let the model call tools (and scripted users answer it) over several turns; the reward comes at the end."""
    max_assistant_turns: int | None = None
    """Model turns per conversation (null: until `data.max_response_length` runs out)."""
    max_user_turns: int | None = None
    """Tool and interaction (user-side) turns per conversation (null: no limit)."""
    max_turns: int | None = None
    """verl's older name for `max_assistant_turns`, read when that is unset."""
    tool_config_path: str | None = None
    """verl's tool config YAML: `tools:` entries with `class_name`, `config` and `tool_schema`."""
    interaction_config_path: str | None = None
    """verl's interaction config YAML (`interaction:` list): scripted users that answer turns without a call."""
    format: str = "hermes"
    """How the model writes tool calls: `hermes` (`<tool_call>{json}</tool_call>`, as Qwen2.5 does)."""
    max_parallel_calls: int = 1
    """Calls run from one turn; later ones are dropped."""
    max_tool_response_length: int = 256
    """Characters of a tool result the model reads."""
    tool_response_truncate_side: str = "middle"
    """Which part of a longer result is cut: left, right or middle."""


@dataclass
class RolloutConfig:
    """Generation (`actor_rollout_ref.rollout.*`)."""

    name: str = "native"
    """Rollout engine: `native` (preallocated KV cache, GQA-aware attention, CUDA graphs), `hf` (plain reference)
    or `vllm` (needs `pip install -e .[vllm]`; see docs/rollout.md)."""
    free_cache_engine: bool = True
    """Free the engine's KV cache (and vLLM's weights: sleep mode) after generation so the update can use that
    memory."""
    n: int = 1
    """Responses sampled per prompt."""
    temperature: float = 1.0
    """Sampling temperature (0 is greedy)."""
    top_p: float = 1.0
    """Nucleus sampling threshold."""
    top_k: int = -1
    """Top-k sampling (-1 is off)."""
    do_sample: bool = True
    """Sample (false is greedy)."""
    dtype: str = "bfloat16"
    """Generation dtype on GPU; on CPU relm generates in the training dtype."""
    gpu_memory_utilization: float = 0.5
    """Share of GPU memory the engine may take for weights and KV cache."""
    ignore_eos: bool = False
    """Keep generating after eos (benchmarks with fixed lengths)."""
    prompt_length: int | None = None
    """verl mirror of `data.max_prompt_length`; set from it when unset."""
    response_length: int | None = None
    """verl mirror of `data.max_response_length`; set from it when unset."""
    log_prob_micro_batch_size: int | None = None
    """Deprecated global size; use `log_prob_micro_batch_size_per_gpu`."""
    log_prob_micro_batch_size_per_gpu: int | None = None
    """Responses per old-logprob forward; unset uses the actor's micro-batch size."""
    tensor_model_parallel_size: int = 1
    """Ranks that split the native or HF engine's generation copy (attention heads, MLP columns); a divisor of
    the run's ranks and of the model's heads (docs/distributed.md#tensor-parallel-generation); vLLM: 1."""
    enforce_eager: bool = True
    """vLLM: no CUDA graphs or compilation (faster start, slower decoding)."""
    enable_chunked_prefill: bool = True
    """vLLM: split long prompts over scheduler steps (off on CPU, where vLLM 0.32 cannot rewind seeded sampling)."""
    max_num_batched_tokens: int = 8192
    """Tokens in one scheduler step (vLLM) or one prefill forward (native: longer prompts are prefilled in
    chunks of columns)."""
    max_num_seqs: int = 1024
    """Sequences decoded at once (vLLM, native); a batch with more rows is continuously batched."""
    max_model_len: int | None = None
    """vLLM: longest prompt plus response; unset is `data.max_prompt_length + data.max_response_length`."""
    quantization: str | None = None
    """`fp8`: the native engine generates with FP8 copies of the linear layers' weights (128 x 128 blocks,
    activations per token; Hopper's FP8 products on CUDA), re-quantized at every weight sync (docs/rollout.md)."""
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """Further engine arguments by engine, e.g. `engine_kwargs.vllm.kv_cache_dtype=fp8` (passed to vllm.LLM)."""
    timeout_s: float | None = 600.0
    """End the run with an error naming the stage when generation makes no progress for this long (any engine);
    null waits forever."""
    val_kwargs: ValKwargsConfig = field(default_factory=ValKwargsConfig)
    """Sampling for validation."""
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    """Multi-turn rollouts with tools."""


@dataclass
class ActorRolloutRefConfig:
    """Policy, its reference and its rollout engine share one model (`actor_rollout_ref.*`)."""

    hybrid_engine: bool = True
    """verl's colocation switch; relm always colocates actor and rollout."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """Policy optimisation."""
    ref: RefConfig = field(default_factory=RefConfig)
    """Reference policy."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Generation."""


@dataclass
class CriticModelConfig:
    """The value model (`critic.model.*`)."""

    path: str | None = None
    """Model for the critic backbone; unset uses the actor's `model.path`."""
    override_config: dict[str, Any] = field(default_factory=dict)
    """Values set on the critic's HF config before loading."""
    enable_gradient_checkpointing: bool | None = None
    """Recompute the critic's activations in backward; unset lets the memory plan decide (off on CPU)."""
    use_remove_padding: bool = False
    """Pack the batch into one sequence for the critic forward (see the actor's key)."""
    trust_remote_code: bool = False
    """Allow model code shipped inside the model folder."""
    external_lib: str | None = None
    """A module imported before loading the critic (as the actor's), for architectures registered outside transformers."""
    lora_rank: int = 0
    """LoRA adapters of this rank on the critic's backbone; its value head trains whole (0: no LoRA)."""
    lora_alpha: float = 16
    """LoRA scale numerator: adapters add (lora_alpha / lora_rank) * B @ A to each target weight."""
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Layers that get adapters: `all-linear` (every Linear but the output head) or a list of names."""
    exclude_modules: list[str] | None = None
    """Layer names kept without adapters."""
    lora_adapter_path: str | None = None
    """A saved PEFT adapter folder (adapter_config.json) to start from instead of fresh adapters."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """Sharding of the critic (data-parallel runs)."""


@dataclass
class CriticConfig:
    """Value function training (`critic.*`)."""

    strategy: str = "fsdp"
    """verl's training backend name; relm trains with PyTorch."""
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    """The value model."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    """Critic optimizer."""
    ppo_mini_batch_size: int | None = None
    """Prompts per critic optimizer step; unset uses the actor's."""
    ppo_micro_batch_size: int | None = None
    """Deprecated global micro-batch size; use `ppo_micro_batch_size_per_gpu`."""
    ppo_micro_batch_size_per_gpu: int | None = None
    """Responses per critic forward/backward; unset uses the actor's."""
    forward_micro_batch_size_per_gpu: int | None = None
    """Responses per value forward; unset uses `ppo_micro_batch_size_per_gpu`."""
    use_dynamic_bsz: bool | None = None
    """Form micro-batches by token count; unset uses the actor's."""
    ppo_max_token_len_per_gpu: int | None = None
    """Token budget of one critic micro-batch when `use_dynamic_bsz` is on; unset is the memory plan's on a
    GPU, 32768 elsewhere (verl's default)."""
    ppo_epochs: int | None = None
    """Passes over each step's responses; unset uses the actor's."""
    shuffle: bool | None = None
    """Shuffle responses between mini-batches; unset uses the actor's."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value."""
    cliprange_value: float = 0.5
    """Clip range of the value loss around the old values."""
    loss_agg_mode: str | None = None
    """How the value loss is averaged (same modes as the actor); unset uses the actor's."""


@dataclass
class OverlongBufferConfig:
    """DAPO's soft overlong punishment (`reward_model.overlong_buffer.*`)."""

    enable: bool = False
    """Penalise responses that run into the last `len` tokens before `data.max_response_length`."""
    len: int = 0
    """Buffer length in tokens; the penalty grows linearly over it."""
    penalty_factor: float = 1.0
    """Penalty at the very end of the buffer (the response hit the length limit)."""
    log: bool = False
    """verl's switch to log the penalty; relm always logs `reward_extra/overlong_penalty/mean`."""


@dataclass
class RewardModelModelConfig:
    """The reward model's weights and tokenizer (`reward_model.model.*`)."""

    path: str | None = None
    """Folder or Hub id: a sequence-classification model, a relm-exported critic, or a causal LM judge."""
    input_tokenizer: str | None = None
    """The policy's tokenizer: when set, responses are decoded and re-rendered with the reward model's own
    tokenizer and chat template; unset feeds the policy's token ids as they are (same tokenizer)."""
    trust_remote_code: bool | None = False
    """Allow the reward model's own modelling code (null, as verl 0.9 writes it, is no)."""


@dataclass
class RewardModelRolloutConfig:
    """How an LLM judge generates its verdicts (`reward_model.rollout.*`, verl's names)."""

    name: str = "native"
    """Engine that serves the judge: `native` or `hf`."""
    response_length: int = 32
    """Most tokens of a verdict."""
    prompt_length: int = 512
    """Longest judge prompt in tokens; a longer one keeps its end."""
    temperature: float = 1.0
    """Sampling temperature when `do_sample` is on."""
    top_p: float = 1.0
    """Nucleus sampling threshold when `do_sample` is on."""
    top_k: int = -1
    """Top-k sampling when `do_sample` is on; -1 is off."""
    do_sample: bool = False
    """Sample verdicts; off decodes greedily (relm's default, verl's is on)."""


@dataclass
class JudgeConfig:
    """A causal LM as judge (`reward_model.judge.*`, relm's keys: verl leaves this to a custom function)."""

    prompt_template: str | None = None
    """Judge prompt with `{prompt}`, `{response}`, `{ground_truth}` fields; setting it (or the path) makes
    the reward model a generative judge."""
    prompt_template_path: str | None = None
    """File holding the judge prompt (instead of `prompt_template`)."""
    score_regex: str = r"-?\d+(?:\.\d+)?"
    """Pattern whose last match in the verdict is the score (its first group when it has one)."""
    default_score: float = 0.0
    """Score of a verdict the pattern does not match (counted in `reward_model/judge_unparsed`)."""


@dataclass
class RewardModelConfig:
    """A learned reward model (`reward_model.*`)."""

    enable: bool = False
    """Score responses with a reward model: its score is the reward (the rule score is still logged)."""
    reward_manager: str = "naive"
    """verl's reward manager: `naive`, `dapo` (with `overlong_buffer`) and `prime` call the function once a
    response; `gdpo` too, with `trainer.experiment_name` added to each `extra_info` as `experiment_name`;
    `batch` once for many (`compute_score(data_sources, solution_strs, ground_truths, extra_infos)`
    returning a list). verl 0.9 spells it `reward.reward_manager.name`."""
    num_workers: int | None = None
    """Reward worker processes (verl 0.9 spells it `reward.num_workers`); unset: the CPU cores, at most 8;
    0 scores in the training process, with no time limit."""
    timeout: float = 30.0
    """Seconds one reward call may take before its worker is killed and the response scores `failure_score`
    (verl 0.9's `reward.timeout`; its default of 300 s is meant for remote judges)."""
    failure_score: float = 0.0
    """The score of a response whose reward call timed out, raised, or returned a non-finite value."""
    max_failure_share: float = 0.25
    """More failed reward calls than this share of a step's responses ends the run (exit 2)."""
    memory_limit_mb: float | None = 4096
    """Resident memory past which a reward worker is killed and replaced (unset: no limit)."""
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    """DAPO overlong reward shaping."""
    model: RewardModelModelConfig = field(default_factory=RewardModelModelConfig)
    """The reward model."""
    micro_batch_size_per_gpu: int | None = None
    """Responses per reward-model forward (or judge generation); unset is 16."""
    max_length: int | None = None
    """Longest reward-model input in tokens; a longer one keeps its end. Unset keeps all."""
    rollout: RewardModelRolloutConfig = field(default_factory=RewardModelRolloutConfig)
    """The judge's generation."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """LLM-as-judge prompt and parser."""


@dataclass
class CustomRewardFunctionConfig:
    """A user's scoring function (`custom_reward_function.*`)."""

    path: str | None = None
    """Python file defining the function."""
    name: str = "compute_score"
    """Function name: `f(data_source, solution_str, ground_truth, extra_info) -> float | dict`."""


@dataclass
class KLControlConfig:
    """KL penalty controller (`algorithm.kl_ctrl.*`)."""

    type: str = "fixed"
    """`fixed` or `adaptive` (Ziegler et al. 2019)."""
    kl_coef: float = 0.001
    """Initial (or fixed) KL coefficient."""
    horizon: int = 10000
    """Adaptive controller horizon."""
    target_kl: float = 0.1
    """Adaptive controller target KL."""


@dataclass
class FilterGroupsConfig:
    """DAPO dynamic sampling (`algorithm.filter_groups.*`)."""

    enable: bool = False
    """Drop prompts whose responses all got the same metric value and generate more until the batch is full."""
    metric: str | None = "acc"
    """What must vary in a group: `acc`/another reward-function key, or `score` (`seq_reward`, `seq_final_reward`); null (verl's generated configs) is accepted while `enable` is off."""
    max_num_gen_batches: int = 0
    """Cap on generation rounds per step (<= 0: no cap); at the cap relm fills up with dropped groups and warns."""


@dataclass
class RolloutCorrectionConfig:
    """The rollout engine's gap to the trainer's policy: old logprobs, importance weights, rejection (verl 0.9.1's keys)."""

    rollout_is: str | None = None
    """Importance weights exp(log pi_old - log pi_rollout) on the policy loss: `token`, `sequence` (product over the
    response), or null (none; the `rollout_corr/` gap metrics are logged either way)."""
    rollout_is_threshold: float | str = 2.0
    """A number: weights above it are truncated to it (TIS); `"lower_upper"` (e.g. `"0.5_5.0"`): weights outside
    the bounds are zeroed (IcePop)."""
    rollout_is_batch_normalize: bool = False
    """Divide the weights by their batch mean (per token, or per response for `sequence`), so they average 1."""
    rollout_rs: str | None = None
    """Rejection: drop tokens or whole responses whose divergence estimate is out of bounds; comma-separated,
    all must pass: `token_k1`, `seq_sum_k1`, `seq_mean_k1` (k2, k3 alike), `seq_max_k2`, `seq_max_k3`, or null."""
    rollout_rs_threshold: float | str | None = None
    """One bound per `rollout_rs` option (comma-separated; one is shared by all): `k1` options take ratio bounds
    `"lower_upper"` (a single number u means 1/u to u), `k2`/`k3` options an upper bound."""
    bypass_mode: bool = False
    """Take the engine's logprobs as the old logprobs instead of recomputing them with the actor (one forward
    fewer); the corrections then act inside the loss, against the current policy."""
    loss_type: str = "ppo_clip"
    """In bypass mode: `ppo_clip` (the policy loss of `policy_loss.loss_mode` against the engine's logprobs, no
    weights) or `reinforce` (-w * A * log pi, w the importance weights, no clipping)."""


@dataclass
class AlgorithmConfig:
    """Advantage estimation and reward shaping (`algorithm.*`)."""

    gamma: float = 1.0
    """Discount factor."""
    lam: float = 1.0
    """GAE lambda."""
    adv_estimator: str = "gae"
    """Advantage estimator: `gae`, `grpo`, `rloo`, `reinforce_plus_plus`, ..."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide GRPO advantages by the group's std (false gives Dr. GRPO)."""
    use_kl_in_reward: bool = False
    """Subtract a KL penalty to the reference from the token rewards."""
    kl_penalty: str = "kl"
    """KL estimator in the reward: `kl`, `abs`, `mse`, `low_var_kl` (also `k1`-`k3`, and with `+`)."""
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    """Controller of the in-reward KL coefficient."""
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    """DAPO dynamic sampling."""
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """Which policy's logprobs the update treats as old (the actor's, or the engine's in bypass mode) and the
    importance weights and rejection that correct for the engine's gap."""
    gdpo_reward_keys: list[str] | None = None
    """`gdpo`: the reward function's dict keys (returned beside `score`) normalised one by one within each
    group; required with `adv_estimator=gdpo`."""
    gdpo_reward_weights: list[float] | None = None
    """`gdpo`: one weight per `gdpo_reward_keys` entry for the sum of the normalised rewards; unset: all 1."""


def _one_teacher() -> dict[str, Any]:
    return {"teacher_model": {"key": None, "model_path": None, "num_replicas": 0}}


@dataclass
class DistillationLossConfig:
    """How the teacher's per-token log-probabilities train the student (`distillation.distillation_loss.*`)."""

    loss_mode: str = "k3"
    """The per-token divergence: `k1` (`kl`), `k3` (`low_var_kl`), `k2` (`mse`), `abs` (estimators of
    KL(student || teacher) at the sampled token) or `forward_kl_topk` (KL(teacher || student) over the
    teacher's top `topk` tokens)."""
    topk: int | None = 32
    """The teacher's top tokens per position for `forward_kl_topk`."""
    use_task_rewards: bool = True
    """Keep the task's policy loss (reward, advantages, KL and entropy terms) and add the distillation term
    times `distillation_loss_coef`; off, the distillation term alone trains the student."""
    distillation_loss_coef: float = 1.0
    """Weight of the distillation term beside the task's policy loss (with `use_task_rewards`)."""
    loss_max_clamp: float | None = None
    """Clamp each token's divergence to [-c, c] (unset: no clamp)."""
    log_prob_min_clamp: float | None = None
    """`forward_kl_topk`: floor of both sides' top-k log-probabilities (unset: none)."""
    use_policy_gradient: bool = False
    """Use the negated divergence as each token's advantage in a clipped policy loss (the reverse-KL reward
    of on-policy distillation; `k1` needs it); off, backpropagate the divergence itself (`k3`, `forward_kl_topk`)."""
    policy_loss_mode: str = "vanilla"
    """The policy loss of `use_policy_gradient`: verl 0.9.1 has only `vanilla` (the PPO clip)."""
    clip_ratio: float = 0.2
    """Clip range of that policy loss where `clip_ratio_low` / `clip_ratio_high` are unset."""
    clip_ratio_low: float | None = 0.2
    """Lower clip range of that policy loss."""
    clip_ratio_high: float | None = 0.2
    """Upper clip range of that policy loss."""


@dataclass
class DistillationConfig:
    """On-policy distillation from frozen teacher models (`distillation.*`, verl 0.9.1's keys)."""

    enabled: bool = False
    """Score each response's tokens with a teacher and train the student towards it."""
    distillation_loss: DistillationLossConfig = field(default_factory=DistillationLossConfig)
    """The distillation loss."""
    n_gpus_per_node: int = 8
    """verl's GPUs per node of the teacher's own resource pool; relm runs teachers in its training processes."""
    nnodes: int = 0
    """verl's nodes of the teacher's resource pool; relm runs teachers in its training processes."""
    teacher_models: dict[str, Any] = field(default_factory=_one_teacher)
    """Teachers by name, each `{key, model_path}`: one (`teacher_model`) scores every response; with several
    (added as `+distillation.teacher_models.NAME.*`, which drops `teacher_model`) each response goes to the
    teacher whose `key` is its row's `data_source`. A teacher shares the student's vocabulary; its `inference.*`
    and `num_replicas` size verl's teacher servers and are not used."""
    teacher_key: str = "data_source"
    """The row field that routes a response to a teacher when there are several: relm takes `data_source` only."""


@dataclass
class TrainerConfig:
    """The loop, logging and checkpoints (`trainer.*`)."""

    total_epochs: int = 30
    """Passes over the training prompts."""
    total_training_steps: int | None = None
    """Stop after this many steps; unset runs `total_epochs`."""
    project_name: str = "relm"
    """Project name for loggers and the default run folder."""
    experiment_name: str = "demo"
    """Experiment name for loggers and the default run folder; unset with `data.train_files` given, `DATA-MODEL` (e.g. `gsm8k-tiny-qwen2.5`)."""
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    """Loggers: `console`, `jsonl` (metrics.jsonl, always written), `tensorboard`, `wandb` (offline: no API key)."""
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    """Run folder: metrics.jsonl, checkpoints; one run at a time (`relm.lock`), refused if it holds files relm did not write."""
    save_freq: int = -1
    """Save a checkpoint every this many steps (-1: never; the last step is saved when > 0)."""
    test_freq: int = -1
    """Validate every this many steps (-1: never)."""
    val_before_train: bool = True
    """Validate before the first step when validation files are given."""
    val_only: bool = False
    """Run validation alone (of the model, or of the resumed checkpoint's weights), log its metrics and exit."""
    log_val_generations: int = 0
    """Validation samples (input, output, score) to show at each validation: console, val_generations.jsonl, W&B/TensorBoard."""
    rollout_data_dir: str | None = None
    """Folder for one `{step}.jsonl` per step of the training responses (prompt and response text, score)."""
    validation_data_dir: str | None = None
    """Folder for one `{step}.jsonl` per validation of every validation response (verl's layout); `validation_{step}.jsonl` when it is `rollout_data_dir`."""
    critic_warmup: int = 0
    """Steps that update only the critic before the actor starts."""
    n_gpus_per_node: int = 1
    """Processes (GPUs) per node; more than one runs under torchrun, which `relm train` starts itself."""
    nnodes: int = 1
    """Nodes; with more than one, `relm train` runs on each with MASTER_ADDR set (or torchrun by hand)."""
    device: str = "auto"
    """`auto` (cuda when available), `cuda` or `cpu`."""
    balance_batch: bool = True
    """Balance tokens across data-parallel ranks (a no-op on one device)."""
    resume_mode: str = "auto"
    """`auto` (resume the run folder's latest checkpoint; refused if settings that change the training
    differ from its config.yaml), `disable` (start fresh) or `resume_path` (the named checkpoint, even
    under changed settings, which are logged)."""
    resume_from_path: str | None = None
    """Checkpoint folder when `resume_mode=resume_path`."""
    max_actor_ckpt_to_keep: int | None = None
    """Keep the actor of only this many newest checkpoints (unset or below 1: keep all)."""
    max_critic_ckpt_to_keep: int | None = None
    """Keep the critic of only this many newest checkpoints (unset or below 1: keep all)."""
    max_skipped_steps: int = 10
    """Stop with an error when more steps than this in a row skip an update for NaN/inf (-1: never)."""
    max_gpu_memory_gb: float | None = None
    """GPU memory relm may use (GB, 1e9 bytes): the memory plan plans for it and torch's allocator is capped at
    it (set_per_process_memory_fraction), so one large GPU stands in for a smaller one; docs/memory.md."""
    max_host_memory_gb: float | None = None
    """Host memory the process may use (GB, 1e9 bytes): a plan over it stops before loading, and a run that
    grows past it stops with the phase named; unset, the machine's available memory; docs/memory.md."""


@dataclass
class AsyncTrainingConfig:
    """Rollout and training in separate processes that overlap (`async_training.*`, the keys of verl's
    fully_async_policy recipe; docs/async.md)."""

    enable: bool = False
    """relm's switch (verl switches by entry point, `fully_async_main`): a rollout process generates the next
    steps' batches while this process trains, and receives the weights after every step."""
    staleness_threshold: float = 0.1
    """How far the rollout side may run ahead, as a share of one weight sync's samples: 0 is synchronous, 1 lets
    a batch be one weight version old; relm generates whole steps, so it is rounded down to whole steps."""
    trigger_parameter_sync_step: int | None = None
    """Updates of `require_batches` mini-batches between weight syncs; unset, one step's worth (relm syncs
    after every step, so a value must equal `data.train_batch_size / (require_batches * ppo_mini_batch_size)`)."""
    require_batches: int = 1
    """Mini-batches (`actor.ppo_mini_batch_size` prompts each) the trainer takes at once."""
    partial_rollout: bool = False
    """Continue generating under weights that arrive mid-step, in segments of 1/4 of the response length."""


@dataclass
class RelmConfig:
    """The whole run."""

    data: DataConfig = field(default_factory=DataConfig)
    """Prompts and batching."""
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    """Policy, reference and rollout engine."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """Value function."""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """Learned reward model."""
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    """User scoring function."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantages and reward shaping."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Loop, logs, checkpoints."""
    distillation: DistillationConfig = field(default_factory=DistillationConfig)
    """On-policy distillation from a frozen teacher."""
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    """Asynchronous training: rollout and update overlap, with bounded staleness."""
    seed: int = 42
    """Seed of every random generator relm owns."""
