"""Building everything one run needs from a validated config: models, optimizers, engine, data, reward.

Kept apart from the loop so that `trainer/ppo.py` reads as the algorithm alone, and so tests can build
a run's parts and drive one step by hand.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from relm.algorithms.advantages import ESTIMATORS_WITH_CRITIC
from relm.algorithms.kl import FixedKLController, make_kl_controller
from relm.config.schema import RelmConfig, RolloutConfig
from relm.data.dataset import PromptDataset
from relm.data.demo_task import DEMO_DATA_SOURCE, write_demo_parquet
from relm.data.loader import PromptLoader
from relm.distributed.context import DistContext
from relm.distributed.fsdp import shard_model
from relm.distributed.layout import Layout
from relm.distributed.rollout import DataParallelEngine
from relm.errors import UserError
from relm.learner.optim import build_optimizer
from relm.learner.varlen_attention import (
    VARLEN_ATTENTION,
    register_varlen_attention,
    varlen_kernel_available,
)
from relm.learner.vocab_chunks import compiled_pieces
from relm.memory.choices import MemoryChoices, build_residency, choose_memory, data_parallel_choices
from relm.memory.offload import OffloadedOptimizerStates, Residency
from relm.models.fused_layers import FusedLayers
from relm.models.loading import load_causal_lm, pick_dtype, resolve_model_dir
from relm.models.precision import Precision
from relm.models.tokenizer import load_tokenizer
from relm.models.value_model import load_value_model
from relm.models.zoo import default_cache_dir
from relm.rewards.custom import ComputeScore, resolve_compute_score
from relm.rewards.manager import RewardManager, build_reward_manager
from relm.rewards.registry import default_compute_score
from relm.rollout.base import RolloutEngine
from relm.rollout.hf_engine import HFRolloutEngine
from relm.rollout.native.engine import NativeRolloutEngine
from relm.rollout.vllm_engine import VLLMRolloutEngine, VLLMSettings
from relm.rollout.watchdog import WatchedEngine

logger = logging.getLogger("relm")


@dataclass
class Sizes:
    """Row counts the loop cuts batches by, derived once from the config."""

    actor_rows_per_minibatch: int
    actor_rows_per_microbatch: int
    critic_rows_per_minibatch: int
    critic_rows_per_microbatch: int
    critic_epochs: int
    rows_per_logprob_forward: int
    total_training_steps: int


@dataclass
class RunComponents:
    """Everything a PPO run holds; built by `build_components`."""

    cfg: RelmConfig
    device: torch.device
    run_dir: Path
    tokenizer: PreTrainedTokenizerBase
    actor: nn.Module
    actor_optimizer: torch.optim.Optimizer
    actor_scheduler: torch.optim.lr_scheduler.LRScheduler
    ref: nn.Module | None
    critic: nn.Module | None
    critic_optimizer: torch.optim.Optimizer | None
    critic_scheduler: torch.optim.lr_scheduler.LRScheduler | None
    engine: RolloutEngine
    reward: RewardManager
    loader: PromptLoader
    kl_ctrl: FixedKLController
    sizes: Sizes
    generator: torch.Generator
    """Seeds mini-batch shuffles; its state is part of a checkpoint."""
    precision: Precision
    """Master and compute dtypes of actor, reference and critic."""
    fused: FusedLayers
    """Compiled norm/MLP/rotary pieces the training forwards run under (`actor.use_torch_compile`)."""
    memory: MemoryChoices
    """Gradient checkpointing and micro-batch token budgets, planned on a GPU (`relm.memory.choices`)."""
    residency: Residency
    """Which models wait on the CPU outside their phases (none unless the plan parks them)."""
    actor_optimizer_offload: OffloadedOptimizerStates | None = None
    """Set when the plan keeps the actor's AdamW moments in CPU memory (its `step` is chunked)."""
    critic_optimizer_offload: OffloadedOptimizerStates | None = None
    """The same for the critic's."""
    dist: DistContext = field(default_factory=DistContext)
    """This process's place in a data-parallel run (the single-process context by default)."""


def pick_device(name: str, key: str = "trainer.device") -> torch.device:
    """`auto` is cuda when a GPU is visible, else cpu; `cuda` without one is the user's mistake.

    Args:
        name: `auto`, `cpu` or `cuda`.
        key: how the user set it (a config key or a CLI flag), for the error message.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"`{key}={name}`: no CUDA device is visible; use cpu or auto")
    return device


def resolve_train_files(cfg: RelmConfig) -> list[str]:
    """The user's parquet files, or the built-in demo task written into relm's cache."""
    if cfg.data.train_files:
        return list(cfg.data.train_files)
    train, _ = write_demo_parquet(default_cache_dir() / "demo")
    logger.info("no data.train_files given: training on the built-in demo task (%s)", train)
    return [str(train)]


def compute_sizes(cfg: RelmConfig, batches_per_epoch: int) -> Sizes:
    """Rows per mini/micro-batch from verl's sizes (mini-batches count prompts, micro-batches responses)."""
    actor, critic, rollout = cfg.actor_rollout_ref.actor, cfg.critic, cfg.actor_rollout_ref.rollout
    actor_mini = actor.ppo_mini_batch_size * rollout.n
    actor_micro = actor.ppo_micro_batch_size_per_gpu
    if actor_micro is None:
        actor_micro = min(actor_mini, 16)
        logger.warning(
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu is unset: relm uses %d responses per "
            "forward/backward; set it to change this",
            actor_micro,
        )
    critic_mini = (critic.ppo_mini_batch_size or actor.ppo_mini_batch_size) * rollout.n
    critic_micro = critic.ppo_micro_batch_size_per_gpu or actor_micro
    logprob_rows = rollout.log_prob_micro_batch_size_per_gpu or actor_micro
    total = cfg.trainer.total_training_steps or cfg.trainer.total_epochs * batches_per_epoch
    return Sizes(
        actor_rows_per_minibatch=actor_mini,
        actor_rows_per_microbatch=actor_micro,
        critic_rows_per_minibatch=critic_mini,
        critic_rows_per_microbatch=critic_micro,
        critic_epochs=critic.ppo_epochs or actor.ppo_epochs,
        rows_per_logprob_forward=logprob_rows,
        total_training_steps=total,
    )


def _optimizer_steps(total_steps: int, rows_per_step: int, rows_per_minibatch: int, epochs: int) -> int:
    return total_steps * max(1, rows_per_step // rows_per_minibatch) * epochs


def needs_reference(cfg: RelmConfig) -> bool:
    """The reference model is built only when a KL term reads it."""
    return cfg.algorithm.use_kl_in_reward or cfg.actor_rollout_ref.actor.use_kl_loss


def build_components(
    cfg: RelmConfig,
    model_dir: str,
    *,
    compute_score: ComputeScore | None = None,
    dist: DistContext | None = None,
) -> RunComponents:
    """Load tokenizer, actor (+ reference, critic), engine, data and reward for `cfg`.

    `model_dir` is the resolved local folder of `actor_rollout_ref.model.path`; `compute_score` the
    already-loaded reward function (loaded from `custom_reward_function` when not given); `dist` the
    context of a torchrun process (`relm.distributed.context.init_distributed`): with it the models are
    sharded with FSDP2 and the engine generates this rank's share of each batch.
    """
    arr = cfg.actor_rollout_ref
    dist = dist or DistContext()
    device = dist.device if dist.is_distributed else pick_device(cfg.trainer.device)
    # Planned before loading: the plan's last rung loads the trained models in bf16.
    memory = choose_memory(cfg, model_dir, device=device, sharded=dist.is_distributed)
    precision = memory.precision
    if dist.is_distributed:
        precision = replace(precision, use_autocast=False)  # FSDP's MixedPrecisionPolicy casts instead
    dtype = precision.master
    torch.manual_seed(cfg.seed)

    tokenizer = load_tokenizer(
        arr.model.tokenizer_path or model_dir,
        trust_remote_code=arr.model.trust_remote_code,
        path_key="actor_rollout_ref.model.tokenizer_path"
        if arr.model.tokenizer_path
        else "actor_rollout_ref.model.path",
    )
    dataset = PromptDataset(
        resolve_train_files(cfg),
        tokenizer,
        prompt_key=cfg.data.prompt_key,
        reward_fn_key=cfg.data.reward_fn_key,
        max_prompt_length=cfg.data.max_prompt_length,
        custom_chat_template=arr.model.custom_chat_template,
        return_raw_chat=cfg.data.return_raw_chat,
    )
    seed = cfg.data.seed if cfg.data.seed is not None else cfg.seed
    loader = PromptLoader(dataset, cfg.data.train_batch_size, shuffle=cfg.data.shuffle, seed=seed)
    sizes = compute_sizes(cfg, loader.batches_per_epoch)
    rows_per_step = cfg.data.train_batch_size * arr.rollout.n
    if compute_score is None:
        compute_score = resolve_compute_score(
            cfg.custom_reward_function.path, cfg.custom_reward_function.name,
            batched=cfg.reward_model.reward_manager == "batch",
        )  # fmt: skip
    # Started before the models load, so the workers' imports overlap with it. The demo task's scorer is
    # relm's own constant-time code: it scores in-process unless reward_model.num_workers says otherwise.
    demo_only = {row["data_source"] for row in loader.dataset} == {DEMO_DATA_SOURCE}
    reward = build_reward_manager(
        tokenizer, compute_score, cfg.reward_model, cfg.custom_reward_function,
        in_process_by_default=demo_only and compute_score is default_compute_score,
    )  # fmt: skip

    load_kwargs = dict(
        dtype=dtype, device=device, trust_remote_code=arr.model.trust_remote_code, seed=cfg.seed
    )
    logger.info("loading the actor from %s (%s on %s)", model_dir, dtype, device)
    actor = load_causal_lm(model_dir, override_config=arr.model.override_config, **load_kwargs)
    if arr.model.use_remove_padding:
        use_varlen_attention(actor, device)
    actor.eval()
    ref = None
    if needs_reference(cfg):
        # A frozen copy of the starting policy: identical weights without a second read from disk.
        ref = copy.deepcopy(actor).to(precision.compute).requires_grad_(False).eval()
    # Taken before sharding: the engine generates with whole weights (a copy when data-parallel).
    # vLLM keeps its own copy of the weights (in rollout.dtype), so no HF copy is made for it.
    generator = (
        actor
        if arr.rollout.name == "vllm"
        else generator_model(actor, arr.rollout, device, precision, separate=dist.is_distributed)
    )
    critic_dir = None
    if cfg.algorithm.adv_estimator in ESTIMATORS_WITH_CRITIC:
        critic_dir = cfg.critic.model.path or model_dir
        if cfg.critic.model.path:
            critic_dir = resolve_model_dir(cfg.critic.model.path)
    layouts: dict[str, Layout] = {}
    data_parallel_plan = None
    if dist.is_distributed:
        # Pending: data_parallel imports RunComponents back (a file cycle the Trainee rework removes).
        from relm.trainer.data_parallel import choose_layouts

        layouts, data_parallel_plan = choose_layouts(
            cfg, model_dir, dist, has_reference=ref is not None, has_critic=critic_dir is not None
        )
        offload = arr.actor.fsdp_config.offload_policy
        actor = shard_model(actor, dist, precision, offload=offload, shard_size=layouts["actor"].shard_size)
        if ref is not None:
            ref = shard_model(
                ref, dist, replace(precision, master=precision.compute), offload=offload,
                shard_size=layouts["reference"].shard_size,
            )  # fmt: skip
    # CompactAdamW where a moment or weight is bf16 (one process); torch's AdamW otherwise.
    compact = not dist.is_distributed and precision.master in (torch.float32, torch.bfloat16)
    compact_weights = precision.master == torch.bfloat16
    actor_moments = memory.actor_moments_dtype
    actor_optimizer, actor_scheduler = build_optimizer(
        actor,
        arr.actor.optim,
        _optimizer_steps(
            sizes.total_training_steps, rows_per_step, sizes.actor_rows_per_minibatch, arr.actor.ppo_epochs
        ),
        moments_dtype=actor_moments
        if compact and (compact_weights or actor_moments != torch.float32)
        else None,
        seed=cfg.seed,
    )

    critic = critic_optimizer = critic_scheduler = None
    if critic_dir is not None:
        logger.info("loading the critic from %s", critic_dir)
        critic = load_value_model(
            critic_dir,
            override_config=cfg.critic.model.override_config,
            **{**load_kwargs, "trust_remote_code": cfg.critic.model.trust_remote_code},
        )
        if cfg.critic.model.use_remove_padding:
            use_varlen_attention(critic.backbone, device)
        critic.eval()
        if dist.is_distributed:
            critic = shard_model(
                critic, dist, precision, offload=cfg.critic.model.fsdp_config.offload_policy,
                shard_size=layouts["critic"].shard_size,
            )  # fmt: skip
        critic_moments = memory.critic_moments_dtype
        critic_optimizer, critic_scheduler = build_optimizer(
            critic,
            cfg.critic.optim,
            _optimizer_steps(
                sizes.total_training_steps,
                rows_per_step,
                sizes.critic_rows_per_minibatch,
                sizes.critic_epochs,
            ),
            moments_dtype=critic_moments
            if compact and (compact_weights or critic_moments != torch.float32)
            else None,
            seed=cfg.seed + 1,
        )

    if dist.is_distributed:
        memory = data_parallel_choices(
            cfg, data_parallel_plan, precision, actor_replicated=layouts["actor"].replicated,
            critic_replicated="critic" in layouts and layouts["critic"].replicated,
        )  # fmt: skip
        if memory.plan is not None:
            followers = [name for name in ("actor", "critic") if name in layouts and layouts[name].replicated]
            logger.info(
                "%s\n  data parallel: the replicated %s follow this plan; sharded models, the config's settings",
                memory.plan.describe(),
                " and ".join(followers),
            )
    if memory.actor_checkpointing:
        actor.gradient_checkpointing_enable()
    if critic is not None and memory.critic_checkpointing:
        critic.gradient_checkpointing_enable()
    optimizer_offload = critic_optimizer_offload = None
    if memory.plan is not None and memory.plan.offload_optimizer:
        optimizer_offload = OffloadedOptimizerStates(actor_optimizer, device)
    if memory.plan is not None and memory.plan.offload_critic_optimizer and critic_optimizer is not None:
        critic_optimizer_offload = OffloadedOptimizerStates(critic_optimizer, device)
    residency = build_residency(
        memory.plan, device, ref=ref, generator=generator if generator is not actor else None,
        critic=critic, critic_optimizer=critic_optimizer,
    )  # fmt: skip
    eos_ids = eos_token_ids_of(tokenizer, actor)
    # Every generate call of the run is watched: no progress for rollout.timeout_s ends the run.
    engine = WatchedEngine(
        build_engine(
            arr.rollout,
            generator,
            model_dir=model_dir,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_ids=eos_ids,
            device=device,
            seed=cfg.seed + dist.rank,  # ranks generate different prompts: independent streams
            precision=precision,
            max_model_len=arr.rollout.max_model_len
            or cfg.data.max_prompt_length + cfg.data.max_response_length,
        ),
        arr.rollout.timeout_s,
    )
    if dist.is_distributed:
        # The native and HF engines hold the whole model on every rank, so every rank is its own
        # generation group; an engine that shards the model (vLLM) would pass its tensor-parallel size.
        if arr.rollout.tensor_model_parallel_size > 1:
            logger.warning(
                "actor_rollout_ref.rollout.tensor_model_parallel_size=%d has no effect with the %s engine: "
                "each rank generates with the whole model",
                arr.rollout.tensor_model_parallel_size, arr.rollout.name,
            )  # fmt: skip
        engine = DataParallelEngine(engine, dist, tp_size=1)
    kl = cfg.algorithm.kl_ctrl
    return RunComponents(
        cfg=cfg,
        device=device,
        run_dir=Path(cfg.trainer.default_local_dir),
        tokenizer=tokenizer,
        actor=actor,
        actor_optimizer=actor_optimizer,
        actor_scheduler=actor_scheduler,
        ref=ref,
        critic=critic,
        critic_optimizer=critic_optimizer,
        critic_scheduler=critic_scheduler,
        engine=engine,
        reward=reward,
        loader=loader,
        kl_ctrl=make_kl_controller(kl.type, kl.kl_coef, kl.target_kl, kl.horizon),
        sizes=sizes,
        generator=torch.Generator().manual_seed(cfg.seed),
        precision=precision,
        fused=FusedLayers(
            actor, enabled=arr.actor.use_torch_compile and device.type == "cuda", functions=compiled_pieces()
        ),
        memory=memory,
        residency=residency,
        actor_optimizer_offload=optimizer_offload,
        critic_optimizer_offload=critic_optimizer_offload,
        dist=dist,
    )


def use_varlen_attention(model: nn.Module, device: torch.device) -> None:
    """Packed forwards on a GPU cut attention at the rows' boundaries (flash varlen kernel) instead
    of building a dense [S, S] mask; models whose attention is not sdpa (soft-capped ones run eager)
    and CPU runs keep transformers' packed path."""
    if device.type != "cuda" or not varlen_kernel_available():
        return
    if model.config._attn_implementation != "sdpa":
        return
    register_varlen_attention()
    model.set_attn_implementation(VARLEN_ATTENTION)
    logger.info("packed sequences attend through the flash variable-length kernel")


def generation_dtype(rollout: RolloutConfig, device: torch.device, precision: Precision) -> torch.dtype:
    """`rollout.dtype` on a GPU; on CPU the training dtype (bf16 matrix products are slow there)."""
    return pick_dtype(rollout.dtype, device) if device.type == "cuda" else precision.master


def generator_model(
    actor: nn.Module,
    rollout: RolloutConfig,
    device: torch.device,
    precision: Precision,
    *,
    separate: bool = False,
) -> nn.Module:
    """The module the engine generates with: the actor itself where dtypes agree (CPU), else a copy in
    `rollout.dtype` (bf16 on GPU) that `sync_weights` refreshes in place after every update.

    `separate` always copies: a sharded actor cannot generate, its engine needs whole weights."""
    gen_dtype = generation_dtype(rollout, device, precision)
    if gen_dtype == precision.master and not separate:
        return actor
    logger.info(
        "generating with a %s copy of the actor (training keeps %s master weights)",
        gen_dtype,
        precision.master,
    )
    return copy.deepcopy(actor).to(gen_dtype).requires_grad_(False).eval()


def build_engine(
    rollout: RolloutConfig,
    model: nn.Module,
    *,
    model_dir: str,
    pad_token_id: int,
    eos_token_ids: list[int],
    device: torch.device,
    seed: int,
    precision: Precision,
    max_model_len: int,
) -> RolloutEngine:
    """The engine `rollout.name` names, colocated with the actor.

    `native` and `hf` generate with `model`: the actor's own module, or its copy in the generation dtype
    (`generator_model`). `vllm` takes the actor as `model` and keeps its own copy of the weights, built
    from `model_dir`'s config and loaded from the actor.
    """
    if rollout.name == "vllm":
        settings = VLLMSettings(
            dtype=generation_dtype(rollout, device, precision),
            max_model_len=max_model_len,
            seed=seed,
            gpu_memory_utilization=rollout.gpu_memory_utilization,
            tensor_model_parallel_size=rollout.tensor_model_parallel_size,
            enable_chunked_prefill=rollout.enable_chunked_prefill,
            enforce_eager=rollout.enforce_eager,
            max_num_batched_tokens=rollout.max_num_batched_tokens,
            max_num_seqs=rollout.max_num_seqs,
            free_cache_engine=rollout.free_cache_engine,
            engine_kwargs=vllm_engine_kwargs(rollout.engine_kwargs),
        )
        return VLLMRolloutEngine(
            model, model_dir, pad_token_id=pad_token_id, eos_token_ids=eos_token_ids, device=device,
            settings=settings,
        )  # fmt: skip
    if rollout.name == "hf":
        return HFRolloutEngine(
            model, pad_token_id=pad_token_id, eos_token_ids=eos_token_ids, device=device, seed=seed
        )
    return NativeRolloutEngine(
        model,
        pad_token_id=pad_token_id,
        eos_token_ids=eos_token_ids,
        device=device,
        seed=seed,
        gpu_memory_utilization=rollout.gpu_memory_utilization,
        max_num_seqs=rollout.max_num_seqs,
        max_prefill_tokens=rollout.max_num_batched_tokens,
    )


def vllm_engine_kwargs(engine_kwargs: dict) -> dict:
    """`engine_kwargs.vllm.*` (and, as older verl wrote them, top-level keys such as `swap_space`) without
    the null values verl's defaults carry, which mean "vLLM's default"."""
    top_level = {k: v for k, v in engine_kwargs.items() if k not in ("vllm", "sglang")}
    merged = {**top_level, **(engine_kwargs.get("vllm") or {})}
    return {key: value for key, value in merged.items() if value is not None}


def eos_token_ids_of(tokenizer: PreTrainedTokenizerBase, model: nn.Module) -> list[int]:
    """Every id that ends a response: the tokenizer's eos and the generation config's (may be a list)."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif isinstance(gen_eos, list | tuple):
        ids.update(int(i) for i in gen_eos)
    return sorted(ids)
