"""Range, choice and cross-field checks on a built `RelmConfig`, before any model or data is loaded.

Each rule raises `UserError` with one line that starts with the offending key, so a wrong run fails
in a second with the fix named, not an hour later inside a training step. The allowed values live in
the tuples below; a new estimator or engine is added there (and documented by `docs_gen`).

Batch sizes follow verl: `data.train_batch_size` and `ppo_mini_batch_size` count prompts, each sampled
`rollout.n` times; the `*_per_gpu` sizes count responses on one data-parallel rank; there are
`trainer.n_gpus_per_node * trainer.nnodes` ranks.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterable
from typing import Any

from relm.config.async_training import check_async_training
from relm.config.fsdp_size import FSDP_SIZE_KEYS, check_fsdp_size
from relm.config.rollout_correction import parse_rollout_correction
from relm.config.schema import ActorConfig, CriticConfig, RelmConfig, RewardModelConfig, RolloutConfig
from relm.errors import UserError

CONFIG_OK_MESSAGE = "All configuration checks passed successfully!"
"""What the CLI prints when `validate_config` passes (verl users grep for this line)."""

OPTIMAL_TOKEN_BASELINES = ("optimal_token_baseline", "tir_optimal_token_baseline")
"""Estimators that read the actor's old-logprob forward before the update (each token's sum of squared
probabilities, `sum_pi_squared`): bypass mode, which skips that forward, cannot feed them."""
ADV_ESTIMATORS = (
    "gae",
    "grpo",
    "rloo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "opo",
    "grpo_vectorized",
    "rloo_vectorized",
    "gpg",
    "grpo_passk",
    "gdpo",
    *OPTIMAL_TOKEN_BASELINES,
)
GROUP_ESTIMATORS = (
    "grpo",
    "rloo",
    "reinforce_plus_plus_baseline",
    "opo",
    "grpo_vectorized",
    "rloo_vectorized",
    "gpg",
    "grpo_passk",
    "gdpo",
)
"""Estimators whose baseline comes from the other responses to the same prompt. With `rollout.n=1` each
group holds one response and gets verl's group-of-one baseline (its raw score, or 0 for `rloo_vectorized`):
such a run trains as in verl, with one line at start (`group_of_one_warnings`); `grpo_passk` alone stops,
as verl's raises."""
LOSS_AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
POLICY_LOSS_MODES = (
    "vanilla",
    "gspo",
    "gpg",
    "cispo",
    "geo_mean",
    "dppo_tv",
    "dppo_kl",
    "sapo",
    "dro",
    "clip_cov",
    "kl_cov",
    "bypass_mode",
)
KL_ESTIMATORS: tuple[str, ...] = ("kl", "abs", "mse", "low_var_kl", "k1", "k2", "k3")
# verl 0.9.1: a `+` suffix keeps the value and takes the gradient of k2 (relm.algorithms.kl).
KL_ESTIMATORS += tuple(kind + "+" for kind in KL_ESTIMATORS)
KL_CTRL_TYPES = ("fixed", "adaptive")
WARMUP_STYLES = ("constant", "cosine")
ROLLOUT_ENGINES = ("native", "hf", "vllm")
DEVICES = ("auto", "cpu", "cuda")
ASCEND_DEVICES = ("npu", "ascend")
"""verl's names for Huawei Ascend NPUs (its `ascend_extras` and `*_npu.sh` scripts): one line, not a choice list."""
LOGGERS = ("console", "jsonl", "tensorboard", "wandb")
LOGGERS_NOT_YET = ("swanlab", "mlflow", "vemlp_wandb", "clearml", "trackio", "file")
"""verl logger names relm knows of but does not provide yet."""
RESUME_MODES = ("auto", "disable", "resume_path")
STRATEGIES = ("fsdp", "fsdp2")
REWARD_MANAGERS = ("naive", "dapo", "prime", "gdpo", "batch")
"""verl's reward managers relm has the behaviour of: `naive`, `dapo`, `prime` and `gdpo` call the rule or
custom function once a response (`prime` in verl only spreads that over a process pool, as relm's reward
workers do); `dapo` adds the overlong shaping that `reward_model.overlong_buffer` switches on; `gdpo` adds
the run's `trainer.experiment_name` to each response's `extra_info` (verl's GDPO example scorer reads it);
`batch` calls a batched function once for many responses."""
TRUNCATION_MODES = ("error", "left", "right", "middle")
MODEL_DTYPES = ("auto", "float32", "bfloat16", "float16")
ROLLOUT_DTYPES = ("bfloat16", "float16", "float32")
ROLLOUT_QUANTIZATIONS = ("fp8",)
"""`actor_rollout_ref.rollout.quantization` values the native engine implements (`relm.rollout.native.fp8`)."""

_DEPRECATED_GLOBAL_SIZES = (
    ("actor_rollout_ref.actor", "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu"),
    ("actor_rollout_ref.ref", "log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu"),
    ("actor_rollout_ref.rollout", "log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu"),
    ("critic", "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu"),
)


def num_data_parallel_ranks(cfg: RelmConfig) -> int:
    """Ranks that split a batch: `n_gpus_per_node * nnodes`, as verl counts them."""
    return cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes


def convert_deprecated(cfg: RelmConfig) -> list[str]:
    """Turn verl's deprecated global micro-batch sizes into per-GPU sizes, in place, as verl does.

    verl divides a global size by the number of ranks; doing the same keeps old scripts running with
    the batch they always had. Returns one warning line per converted key; both the old and the new
    key set is an error, as in verl, because the two could disagree.
    """
    ranks = num_data_parallel_ranks(cfg)
    if ranks < 1:
        raise UserError(
            f"`trainer.n_gpus_per_node` x `trainer.nnodes` must be at least 1, got {ranks}; set both positive"
        )
    warnings = []
    for section_name, old, new in _DEPRECATED_GLOBAL_SIZES:
        section = _section(cfg, section_name)
        global_size = getattr(section, old)
        if global_size is None:
            continue
        if getattr(section, new) is not None:
            raise UserError(
                f"`{section_name}.{old}` and `{section_name}.{new}` are both set; drop the deprecated `{old}`"
            )
        if global_size < ranks or global_size % ranks:
            raise UserError(
                f"`{section_name}.{old}={global_size}` (deprecated, counted over all GPUs) must be a "
                f"positive multiple of the {ranks} GPUs; set `{section_name}.{new}` instead"
            )
        per_gpu = global_size // ranks
        setattr(section, new, per_gpu)
        setattr(section, old, None)
        warnings.append(
            f"`{section_name}.{old}` is deprecated: converted to `{section_name}.{new}={per_gpu}` "
            f"({global_size} / {ranks} GPUs); set that key instead"
        )
    return warnings


def validate_config(cfg: RelmConfig, *, max_position_embeddings: int | None = None) -> None:
    """Check every rule; the first broken one raises.

    Args:
        cfg: A config from `load_config` (derived keys filled in).
        max_position_embeddings: The policy model's context limit, when known; prompt plus response
            must fit in it.

    Raises:
        UserError: naming the key, its value and the fix.
    """
    _check_choices(cfg)
    _check_ranges(cfg)
    _check_batches(cfg)
    _check_fsdp_sizes(cfg)
    _check_features(cfg)
    _check_rollout_correction(cfg)
    _check_policy_loss_settings(cfg)
    _check_gdpo(cfg)
    _check_lora(cfg)
    check_async_training(cfg)
    data = cfg.data
    if data.val_files and not data.train_files and not cfg.trainer.val_only:
        raise UserError(
            "data.train_files: not set, but data.val_files is; set data.train_files to train on your prompts, "
            "or trainer.val_only=true to only validate the model on data.val_files"
        )
    total = data.max_prompt_length + data.max_response_length
    if max_position_embeddings is not None and total > max_position_embeddings:
        raise UserError(
            f"`data.max_prompt_length={data.max_prompt_length}` + `data.max_response_length="
            f"{data.max_response_length}` = {total} exceeds the model's max_position_embeddings="
            f"{max_position_embeddings}; shorten one of them"
        )


def _check_rollout_correction(cfg: RelmConfig) -> None:
    """verl 0.9.1's rollout-correction keys parse (relm.config.rollout_correction), bypass mode's REINFORCE
    loss is not asked for beside another policy loss it would replace, and bypass mode is not asked for beside
    an optimal token baseline, whose input comes from the forward it skips."""
    correction = parse_rollout_correction(cfg.algorithm.rollout_correction)
    loss_mode = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
    if (
        correction.bypass
        and correction.loss_type == "reinforce"
        and loss_mode not in ("vanilla", "bypass_mode")
    ):
        raise UserError(
            "`algorithm.rollout_correction.loss_type=reinforce` replaces the policy loss, so "
            f"`actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}` would not act: set loss_mode=vanilla "
            "or loss_type=ppo_clip"
        )
    estimator = cfg.algorithm.adv_estimator
    if correction.bypass and estimator in OPTIMAL_TOKEN_BASELINES:
        raise UserError(
            f"`algorithm.adv_estimator={estimator}` reads each token's sum of squared probabilities from the actor's "
            "old-logprob forward, which `algorithm.rollout_correction.bypass_mode=true` skips (verl stops there "
            "too): set bypass_mode=false (decoupled mode) or choose another estimator"
        )


def _check_policy_loss_settings(cfg: RelmConfig) -> None:
    """The settings the chosen policy loss reads are ones its formula can take (verl asserts the same)."""
    actor = cfg.actor_rollout_ref.actor
    loss = actor.policy_loss
    key = "actor_rollout_ref.actor"
    needs: dict[str, tuple[tuple[str, float | None], ...]] = {
        "sapo": (("tau_pos", actor.tau_pos), ("tau_neg", actor.tau_neg)),
        "dro": (("policy_loss.dro_beta", loss.dro_beta),),
        "clip_cov": (("policy_loss.clip_cov_ratio", loss.clip_cov_ratio),),
        "kl_cov": (("policy_loss.kl_cov_ratio", loss.kl_cov_ratio),),
    }
    for name, value in needs.get(loss.loss_mode, ()):
        if value is None or value <= 0:
            raise UserError(
                f"`{key}.{name}={_yaml_value(value)}`: the `{loss.loss_mode}` policy loss needs a positive value; "
                f"set {key}.{name}=<value > 0>"
            )


def _check_gdpo(cfg: RelmConfig) -> None:
    """GDPO reads the reward function's numbers by name: it needs the names (verl asserts so), one weight each."""
    algo = cfg.algorithm
    if algo.adv_estimator != "gdpo":
        return
    if not algo.gdpo_reward_keys:
        raise UserError(
            "`algorithm.adv_estimator=gdpo` normalises each reward the reward function returns by name: set "
            "`+algorithm.gdpo_reward_keys=[key1,key2]` to keys of its dict (e.g. format_reward, accuracy_reward)"
        )
    weights = algo.gdpo_reward_weights
    if weights is not None and len(weights) != len(algo.gdpo_reward_keys):
        raise UserError(
            f"`algorithm.gdpo_reward_weights` has {len(weights)} entries for {len(algo.gdpo_reward_keys)} "
            "`algorithm.gdpo_reward_keys`: give one weight per key, or none (each weighs 1)"
        )


def _yaml_value(value: float | None) -> str:
    return "null" if value is None else str(value)


def _check_lora(cfg: RelmConfig) -> None:
    """LoRA's keys, and the parts of relm LoRA does not reach yet (docs/lora.md)."""
    trainer = cfg.trainer
    for key, model in (
        ("actor_rollout_ref.model", cfg.actor_rollout_ref.model),
        ("critic.model", cfg.critic.model),
    ):
        if model.lora_rank < 0:
            raise UserError(f"`{key}.lora_rank={model.lora_rank}` must be >= 0 (0 trains every weight)")
        if model.lora_adapter_path and not model.lora_rank:
            raise UserError(
                f"`{key}.lora_adapter_path` is set but `{key}.lora_rank=0`: set lora_rank to the adapter's rank"
            )
        if not model.lora_rank:
            continue
        if model.lora_alpha <= 0:
            raise UserError(f"`{key}.lora_alpha={model.lora_alpha}` must be > 0")
        if trainer.n_gpus_per_node * trainer.nnodes > 1:
            raise UserError(
                f"`{key}.lora_rank={model.lora_rank}` runs on one GPU for now; set trainer.n_gpus_per_node=1 "
                "and trainer.nnodes=1, or train the full model (lora_rank=0)"
            )
        if importlib.util.find_spec("peft") is None:
            raise UserError(f"`{key}.lora_rank={model.lora_rank}` needs peft: pip install 'relm[lora]'")


def _check_choices(cfg: RelmConfig) -> None:
    arr, algo, trainer = cfg.actor_rollout_ref, cfg.algorithm, cfg.trainer
    if trainer.device in ASCEND_DEVICES:
        raise UserError(
            f"`trainer.device={trainer.device}`: Ascend NPUs are not supported; relm runs on CUDA GPUs or the "
            "CPU (trainer.device=auto)"
        )
    for key, value, allowed in (
        ("algorithm.adv_estimator", algo.adv_estimator, ADV_ESTIMATORS),
        ("algorithm.kl_penalty", algo.kl_penalty, KL_ESTIMATORS),
        ("algorithm.kl_ctrl.type", algo.kl_ctrl.type, KL_CTRL_TYPES),
        ("actor_rollout_ref.actor.loss_agg_mode", arr.actor.loss_agg_mode, LOSS_AGG_MODES),
        ("actor_rollout_ref.actor.policy_loss.loss_mode", arr.actor.policy_loss.loss_mode, POLICY_LOSS_MODES),
        ("actor_rollout_ref.actor.kl_loss_type", arr.actor.kl_loss_type, KL_ESTIMATORS),
        ("actor_rollout_ref.actor.strategy", arr.actor.strategy, STRATEGIES),
        ("actor_rollout_ref.actor.optim.warmup_style", arr.actor.optim.warmup_style, WARMUP_STYLES),
        ("actor_rollout_ref.model.dtype", arr.model.dtype, MODEL_DTYPES),
        ("actor_rollout_ref.rollout.name", arr.rollout.name, ROLLOUT_ENGINES),
        ("actor_rollout_ref.rollout.dtype", arr.rollout.dtype, ROLLOUT_DTYPES),
        ("critic.strategy", cfg.critic.strategy, STRATEGIES),
        ("critic.loss_agg_mode", cfg.critic.loss_agg_mode, LOSS_AGG_MODES),
        ("critic.optim.warmup_style", cfg.critic.optim.warmup_style, WARMUP_STYLES),
        ("data.truncation", cfg.data.truncation, TRUNCATION_MODES),
        ("reward_model.reward_manager", cfg.reward_model.reward_manager, REWARD_MANAGERS),
        ("trainer.device", trainer.device, DEVICES),
        ("trainer.resume_mode", trainer.resume_mode, RESUME_MODES),
    ):
        _choice(key, value, allowed)
    for name in trainer.logger:
        if name in LOGGERS_NOT_YET:
            raise UserError(
                f"`trainer.logger` names `{name}`, which relm does not provide yet; use {_listed(LOGGERS)}"
            )
        _choice("trainer.logger", name, LOGGERS)


def _check_ranges(cfg: RelmConfig) -> None:
    data, arr, critic, algo = cfg.data, cfg.actor_rollout_ref, cfg.critic, cfg.algorithm
    actor, rollout = arr.actor, arr.rollout
    value: float | None  # each loop below checks one kind of number
    for key, value in (
        ("data.max_prompt_length", data.max_prompt_length),
        ("data.max_response_length", data.max_response_length),
        ("data.train_batch_size", data.train_batch_size),
        ("data.val_batch_size", data.val_batch_size),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", actor.ppo_mini_batch_size),
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", actor.ppo_micro_batch_size_per_gpu),
        ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", actor.ppo_max_token_len_per_gpu),
        ("actor_rollout_ref.actor.ppo_epochs", actor.ppo_epochs),
        (
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
            arr.ref.log_prob_micro_batch_size_per_gpu,
        ),
        ("actor_rollout_ref.rollout.n", rollout.n),
        (
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
            rollout.log_prob_micro_batch_size_per_gpu,
        ),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size", rollout.tensor_model_parallel_size),
        ("actor_rollout_ref.rollout.val_kwargs.n", rollout.val_kwargs.n),
        ("actor_rollout_ref.rollout.max_num_batched_tokens", rollout.max_num_batched_tokens),
        ("actor_rollout_ref.rollout.max_num_seqs", rollout.max_num_seqs),
        ("actor_rollout_ref.rollout.max_model_len", rollout.max_model_len),
        ("critic.ppo_mini_batch_size", critic.ppo_mini_batch_size),
        ("critic.ppo_micro_batch_size_per_gpu", critic.ppo_micro_batch_size_per_gpu),
        ("critic.forward_micro_batch_size_per_gpu", critic.forward_micro_batch_size_per_gpu),
        ("critic.ppo_max_token_len_per_gpu", critic.ppo_max_token_len_per_gpu),
        ("critic.ppo_epochs", critic.ppo_epochs),
        ("trainer.total_epochs", cfg.trainer.total_epochs),
        ("trainer.total_training_steps", cfg.trainer.total_training_steps),
        ("trainer.n_gpus_per_node", cfg.trainer.n_gpus_per_node),
        ("trainer.nnodes", cfg.trainer.nnodes),
    ):
        if value is not None and value < 1:
            raise UserError(f"`{key}` must be a positive integer, got {value}")
    for key, value in (
        ("actor_rollout_ref.actor.optim.lr", actor.optim.lr),
        ("critic.optim.lr", critic.optim.lr),
        ("actor_rollout_ref.actor.clip_ratio", actor.clip_ratio),
        ("actor_rollout_ref.actor.grad_clip", actor.grad_clip),
        ("critic.grad_clip", critic.grad_clip),
        ("critic.cliprange_value", critic.cliprange_value),
        ("reward_model.timeout", cfg.reward_model.timeout),
        ("reward_model.memory_limit_mb", cfg.reward_model.memory_limit_mb or 1),
    ):
        if not value > 0:
            raise UserError(f"`{key}` must be greater than 0, got {value}")
    for key, value in (
        ("actor_rollout_ref.actor.clip_ratio_low", actor.clip_ratio_low),
        ("actor_rollout_ref.actor.clip_ratio_high", actor.clip_ratio_high),
        ("actor_rollout_ref.actor.kl_loss_coef", actor.kl_loss_coef),
        ("actor_rollout_ref.actor.optim.weight_decay", actor.optim.weight_decay),
        ("critic.optim.weight_decay", critic.optim.weight_decay),
        ("algorithm.kl_ctrl.kl_coef", algo.kl_ctrl.kl_coef),
        ("actor_rollout_ref.rollout.temperature", rollout.temperature),
        ("actor_rollout_ref.rollout.val_kwargs.temperature", rollout.val_kwargs.temperature),
        ("trainer.critic_warmup", cfg.trainer.critic_warmup),
        ("reward_model.num_workers", cfg.reward_model.num_workers),
    ):
        if value is not None and value < 0:
            raise UserError(f"`{key}` must be 0 or more, got {value}")
    for key, value in (
        ("actor_rollout_ref.rollout.top_p", rollout.top_p),
        ("actor_rollout_ref.rollout.val_kwargs.top_p", rollout.val_kwargs.top_p),
        ("actor_rollout_ref.rollout.gpu_memory_utilization", rollout.gpu_memory_utilization),
        ("algorithm.gamma", algo.gamma),
        ("algorithm.lam", algo.lam),
        ("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio", actor.optim.lr_warmup_steps_ratio),
        ("actor_rollout_ref.actor.optim.min_lr_ratio", actor.optim.min_lr_ratio),
        ("critic.optim.lr_warmup_steps_ratio", critic.optim.lr_warmup_steps_ratio),
        ("critic.optim.min_lr_ratio", critic.optim.min_lr_ratio),
        ("reward_model.max_failure_share", cfg.reward_model.max_failure_share),
    ):
        if value is not None and not 0 <= value <= 1:  # null min_lr_ratio: no floor
            raise UserError(f"`{key}` must be between 0 and 1, got {value}")
    if rollout.timeout_s is not None and not rollout.timeout_s > 0:
        raise UserError(
            f"`actor_rollout_ref.rollout.timeout_s` must be greater than 0 (null: no limit), got {rollout.timeout_s}"
        )
    for key, value in (
        ("trainer.max_gpu_memory_gb", cfg.trainer.max_gpu_memory_gb),
        ("trainer.max_host_memory_gb", cfg.trainer.max_host_memory_gb),
    ):
        if value is not None and not value > 0:
            raise UserError(f"`{key}` must be greater than 0 (null: no budget), got {value}")
    if rollout.gpu_memory_utilization == 0:
        raise UserError(
            "`actor_rollout_ref.rollout.gpu_memory_utilization` must be above 0 (at most 1), got 0"
        )
    for key, value in (
        ("actor_rollout_ref.rollout.top_k", rollout.top_k),
        ("actor_rollout_ref.rollout.val_kwargs.top_k", rollout.val_kwargs.top_k),
    ):
        if value < -1:
            raise UserError(f"`{key}` must be -1 (off) or a count of 0 or more, got {value}")
    if actor.clip_ratio_c <= 1:
        raise UserError(
            f"`actor_rollout_ref.actor.clip_ratio_c` must be greater than 1 (dual-clip bound), "
            f"got {actor.clip_ratio_c}"
        )
    if algo.kl_ctrl.type == "adaptive" and (algo.kl_ctrl.horizon < 1 or algo.kl_ctrl.target_kl <= 0):
        raise UserError(
            f"`algorithm.kl_ctrl` (adaptive) needs horizon >= 1 and target_kl > 0, "
            f"got horizon={algo.kl_ctrl.horizon}, target_kl={algo.kl_ctrl.target_kl}"
        )


def group_of_one_warnings(cfg: RelmConfig) -> list[str]:
    """The line a group estimator with one response a prompt gets: verl trains such a run (its scripts
    under examples/rollout_correction leave `n` at its default 1), each response measured against a
    baseline of 0, so relm trains it too and says what the advantage then is."""
    estimator, n = cfg.algorithm.adv_estimator, cfg.actor_rollout_ref.rollout.n
    if estimator not in GROUP_ESTIMATORS or estimator == "grpo_passk" or n >= 2 or not _advantages_train(cfg):
        return []
    baseline = "0 (verl's vectorised RLOO)" if estimator == "rloo_vectorized" else "its raw score, as in verl"
    return [
        f"`actor_rollout_ref.rollout.n={n}`: `{estimator}` compares responses to the same prompt, and each "
        f"prompt has one, so each response's advantage is {baseline}; set n >= 2 for a group baseline"
    ]


def _advantages_train(cfg: RelmConfig) -> bool:
    """False when distilling without the task's loss: the estimator's advantages then train nothing (verl's
    OPD scripts run grpo at n=1 so)."""
    distill = cfg.distillation
    return not (distill.enabled and not distill.distillation_loss.use_task_rewards)


def _check_batches(cfg: RelmConfig) -> None:
    arr, ranks = cfg.actor_rollout_ref, num_data_parallel_ranks(cfg)
    n, train = arr.rollout.n, cfg.data.train_batch_size
    if train * n % ranks:
        raise UserError(
            f"`data.train_batch_size={train}` x `rollout.n={n}` = {train * n} responses do not split evenly "
            f"over {ranks} GPUs; make the product a multiple of {ranks}"
        )
    if cfg.algorithm.adv_estimator == "grpo_passk" and n < 2 and _advantages_train(cfg):
        raise UserError(
            f"`actor_rollout_ref.rollout.n={n}`: `grpo_passk` rewards the best of a prompt's responses, so it "
            f"needs n >= 2 (verl's stops too)"
        )
    sections: list[tuple[str, ActorConfig | CriticConfig]] = [("actor_rollout_ref.actor", arr.actor)]
    if cfg.algorithm.adv_estimator == "gae":  # only GAE trains a critic
        sections.append(("critic", cfg.critic))
    for name, section in sections:
        # The loader fills the critic's sizes from the actor's; a hand-built config may not have.
        mini = section.ppo_mini_batch_size or arr.actor.ppo_mini_batch_size
        micro = section.ppo_micro_batch_size_per_gpu
        if mini > train:
            raise UserError(
                f"`{name}.ppo_mini_batch_size={mini}` exceeds `data.train_batch_size={train}` (both count "
                f"prompts); lower it"
            )
        if train % mini:
            raise UserError(
                f"`{name}.ppo_mini_batch_size={mini}` must divide `data.train_batch_size={train}` "
                f"(both count prompts, as in verl)"
            )
        if (mini * n) % ranks:
            raise UserError(
                f"`{name}.ppo_mini_batch_size={mini}` x `rollout.n={n}` = {mini * n} responses do not split "
                f"evenly over {ranks} GPUs; make the product a multiple of {ranks}"
            )
        if micro is not None and not section.use_dynamic_bsz and (mini * n) % (micro * ranks):
            raise UserError(
                f"`{name}.ppo_micro_batch_size_per_gpu={micro}` x {ranks} GPUs must divide the "
                f"{mini * n} responses of a mini-batch (`ppo_mini_batch_size={mini}` x `rollout.n={n}`)"
            )


def _check_fsdp_sizes(cfg: RelmConfig) -> None:
    arr = cfg.actor_rollout_ref
    values = (
        arr.actor.fsdp_config.fsdp_size,
        arr.ref.fsdp_config.fsdp_size,
        cfg.critic.model.fsdp_config.fsdp_size,
    )
    for key, value in zip(FSDP_SIZE_KEYS.values(), values, strict=True):
        check_fsdp_size(value, key=key, world_size=num_data_parallel_ranks(cfg))


def _check_reward_model(rm: RewardModelConfig) -> None:
    if not rm.model.path:
        raise UserError(
            "`reward_model.enable=true` needs `reward_model.model.path=<reward model folder or Hub id>`"
        )
    if rm.judge.prompt_template is not None and rm.judge.prompt_template_path is not None:
        raise UserError(
            "`reward_model.judge.prompt_template` and `reward_model.judge.prompt_template_path` are both set; keep one"
        )
    if rm.rollout.name not in ("native", "hf"):
        raise UserError(f"`reward_model.rollout.name={rm.rollout.name}`: the judge runs on `native` or `hf`")
    if rm.micro_batch_size_per_gpu is not None and rm.micro_batch_size_per_gpu < 1:
        raise UserError(
            f"`reward_model.micro_batch_size_per_gpu={rm.micro_batch_size_per_gpu}` must be at least 1"
        )
    try:
        re.compile(rm.judge.score_regex)
    except re.error as exc:
        raise UserError(
            f"`reward_model.judge.score_regex={rm.judge.score_regex}` is not a valid pattern: {exc}"
        ) from exc


def _check_quantization(rollout: RolloutConfig) -> None:
    """`rollout.quantization`: fp8, on the native engine (docs/rollout.md#fp8-rollout-weights)."""
    if rollout.quantization is None:
        return
    key = f"actor_rollout_ref.rollout.quantization={rollout.quantization}"
    if rollout.quantization not in ROLLOUT_QUANTIZATIONS:
        raise UserError(f"`{key}`: relm implements {_listed(ROLLOUT_QUANTIZATIONS)}; set that or null")
    if rollout.name != "native":
        raise UserError(
            f"`{key}` runs on the native engine; set actor_rollout_ref.rollout.name=native or drop the key"
        )


def _check_tensor_parallel(cfg: RelmConfig) -> None:
    """`rollout.tensor_model_parallel_size`: groups of ranks that split the native or HF engine's model
    (docs/distributed.md#tensor-parallel-generation); the model's own head counts are checked at load.
    Where the run cannot split the model, the size falls back to 1 (`tensor_parallel_size`)."""
    rollout = cfg.actor_rollout_ref.rollout
    size = rollout.tensor_model_parallel_size
    if size != 1 and rollout.name not in ("native", "hf"):
        raise UserError(
            f"`actor_rollout_ref.rollout.tensor_model_parallel_size={size}`: relm splits the model over ranks "
            "on the native and HF engines only; set actor_rollout_ref.rollout.name=native or the size to 1"
        )


def tensor_parallel_size(cfg: RelmConfig) -> tuple[int, str | None]:
    """The generation copy's tensor-parallel size the run uses, and the line saying why it is not the key's.

    verl's scripts set `tensor_model_parallel_size` for the GPUs they were written for (2 on one 8-GPU
    machine, with multi-turn too); run on fewer ranks, or with a rollout relm does not split, each rank
    generates with the whole model, as relm did before it split models at all, and says so."""
    rollout = cfg.actor_rollout_ref.rollout
    size = rollout.tensor_model_parallel_size
    if size == 1:
        return 1, None
    ranks = num_data_parallel_ranks(cfg)
    if ranks % size:
        reason = f"it does not divide the run's {ranks} rank(s) (trainer.n_gpus_per_node x trainer.nnodes)"
    elif rollout.quantization is not None:
        reason = f"generation with actor_rollout_ref.rollout.quantization={rollout.quantization} is not split"
    elif rollout.multi_turn.enable:
        reason = "multi-turn rollouts run each conversation on one rank"
    else:
        return size, None
    return 1, (
        f"`actor_rollout_ref.rollout.tensor_model_parallel_size={size}`: not used, {reason}; each rank "
        "generates with the whole model (size 1)"
    )


def _check_features(cfg: RelmConfig) -> None:
    data, rollout = cfg.data, cfg.actor_rollout_ref.rollout
    if cfg.reward_model.enable:
        _check_reward_model(cfg.reward_model)
    if data.custom_cls.path is not None and not data.custom_cls.name:
        raise UserError(
            f"`data.custom_cls.path={data.custom_cls.path}` needs `data.custom_cls.name=CLASS`, the dataset "
            "class in that file"
        )
    if cfg.trainer.resume_mode == "resume_path" and not cfg.trainer.resume_from_path:
        raise UserError(
            "`trainer.resume_mode=resume_path` needs `trainer.resume_from_path=<checkpoint folder>`"
        )
    for key, mirror, source_key, source in (
        ("prompt_length", rollout.prompt_length, "max_prompt_length", data.max_prompt_length),
        ("response_length", rollout.response_length, "max_response_length", data.max_response_length),
    ):
        if mirror is not None and mirror != source:
            raise UserError(
                f"`actor_rollout_ref.rollout.{key}={mirror}` differs from `data.{source_key}={source}`; relm "
                f"reads `data.{source_key}`: set the two equal or drop the rollout key"
            )
    _check_quantization(rollout)
    _check_tensor_parallel(cfg)
    longest = data.max_prompt_length + data.max_response_length
    if rollout.max_model_len is not None and rollout.max_model_len < longest:
        raise UserError(
            f"`actor_rollout_ref.rollout.max_model_len={rollout.max_model_len}` is shorter than a prompt plus its "
            f"response ({data.max_prompt_length} + {data.max_response_length}); raise it or leave it unset"
        )
    overlong = cfg.reward_model.overlong_buffer
    if overlong.enable and not 0 < overlong.len < data.max_response_length:
        raise UserError(
            f"`reward_model.overlong_buffer.len={overlong.len}` must be between 1 and "
            f"`data.max_response_length={data.max_response_length}` - 1 when the overlong buffer is enabled"
        )
    if cfg.algorithm.filter_groups.enable and rollout.n < 2:
        raise UserError(
            f"`algorithm.filter_groups.enable=true` needs groups: `actor_rollout_ref.rollout.n={rollout.n}` "
            "must be at least 2"
        )
    if cfg.algorithm.filter_groups.enable and cfg.algorithm.filter_groups.metric is None:
        raise UserError(
            "`algorithm.filter_groups.enable=true` needs `algorithm.filter_groups.metric` (acc, score or a key "
            "the reward function returns); it is null"
        )


def _choice(key: str, value: Any, allowed: Iterable[str]) -> None:
    if value not in allowed:
        raise UserError(f"`{key}={value}` is not supported; choose one of: {_listed(allowed)}")


def _listed(values: Iterable[str]) -> str:
    return ", ".join(values)


def _section(cfg: RelmConfig, dotted: str) -> Any:
    section: Any = cfg
    for name in dotted.split("."):
        section = getattr(section, name)
    return section
