"""Building everything one run needs from its specs: models, optimizers, engine, data, reward.

Kept apart from the loop so that `trainer/ppo.py` reads as the algorithm alone, and so tests can build
a run's parts and drive one step by hand. Each trained model (the actor, the critic when the estimator
reads values) is loaded, sharded and given its optimizer by the same code (`load_trained_model`,
`build_trainee`) from its own `TrainedModelSpec`; every builder takes its part of the `RunSpec` that
`relm.config.translate` made once from the config; nothing here reads the config itself (only the entry
points speak verl's config language: tests/unit/test_config_boundary.py).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from relm.algorithms.kl import KLController, make_kl_controller
from relm.config.specs import DataSpec, EngineSpec, RewardSpec, RunSpec, TrainedModelSpec
from relm.data.dataset import PromptDataset
from relm.data.demo_task import DEMO_DATA_SOURCE, write_demo_parquet
from relm.data.loader import PromptLoader
from relm.data.lookup_task import LOOKUP_DATA_SOURCE
from relm.distributed.context import DistContext
from relm.distributed.fsdp import shard_model
from relm.distributed.layout import Layout
from relm.distributed.multi_turn import DataParallelMultiTurn
from relm.distributed.rollout import DataParallelEngine
from relm.distributed.sharded_load import (
    StoredWeights,
    critic_weights,
    fill_from_shards,
    materialize_parameters,
    materialize_shards,
    stored_weights,
)
from relm.distributed.tensor_parallel import split_generation_copy
from relm.errors import UserError
from relm.learner.lora import adapters_disabled, add_lora, has_lora, lora_settings, without_adapters
from relm.learner.microbatch_retry import MicroBatchSize
from relm.learner.optim import build_optimizer
from relm.learner.trainee import Batching, Trainee
from relm.learner.varlen_attention import (
    VARLEN_ATTENTION,
    register_varlen_attention,
    varlen_kernel_available,
)
from relm.learner.vocab_chunks import compiled_pieces
from relm.learner.weight_sync import LogprobCheck, WeightSync, vllm_lora
from relm.memory.choices import (
    MemoryChoices,
    build_residency,
    builds_critic,
    builds_reference,
    cap_gpu_memory,
    choose_memory,
    host_budget_bytes,
    sharded_rank_plan,
)
from relm.memory.cpu_batching import default_rows_per_microbatch
from relm.memory.offload import OffloadedOptimizerStates, Residency
from relm.models.fused_layers import FusedLayers
from relm.models.loading import load_causal_lm, pick_dtype, resolve_model_dir
from relm.models.padding_probe import padding_answer, probe_padding_mask, record_padding_answer
from relm.models.precision import Precision, copy_in_dtype
from relm.models.safetensors_rows import SafetensorsFolder
from relm.models.tokenizer import end_of_turn_ids, load_tokenizer
from relm.models.value_model import load_value_model
from relm.models.zoo import default_cache_dir
from relm.rewards.custom import ComputeScore, resolve_compute_score
from relm.rewards.manager import RewardManager, build_reward_manager
from relm.rewards.model_reward import ModelScorer, build_reward_model
from relm.rewards.registry import default_compute_score
from relm.rollout.base import RolloutEngine
from relm.rollout.hf_engine import HFRolloutEngine
from relm.rollout.multi_turn.conversations import ConversationRollout
from relm.rollout.multi_turn.setup import (
    build_multi_turn,
    load_run_interactions,
    load_run_tools,
    tool_schemas,
)
from relm.rollout.multi_turn.tools import Tool
from relm.rollout.native.engine import NativeRolloutEngine
from relm.rollout.tensor_parallel import materialize_split
from relm.rollout.vllm_engine import VLLMRolloutEngine, VLLMSettings
from relm.rollout.vllm_lora import VLLMLora
from relm.rollout.watchdog import WatchedEngine
from relm.trainer.data_parallel import choose_layouts, data_parallel_memory
from relm.trainer.teachers import Teachers, load_teachers

logger = logging.getLogger("relm")


@dataclass(frozen=True)
class Sizes:
    """The run's sizes, resolved once from the config by `compute_sizes`.

    Fallbacks from one config key to another are filled in `relm.config.loader._fill_derived`; the
    defaults that are no key's value (16 responses per micro-batch, the logprob temperature, the step
    count from the epochs) are computed here and nowhere else.
    """

    batching: dict[str, Batching]
    """Per trained model (`actor`, `critic`) how its update and no-grad forwards cut the rows."""
    rows_per_ref_forward: int
    """Responses per reference forward (`actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu`)."""
    logprob_temperature: float
    """Logits are divided by it in every logprob forward and in the policy loss: the rollout's
    sampling temperature, 1.0 for a greedy rollout (temperature 0)."""
    total_training_steps: int


@dataclass(frozen=True)
class ExperienceSources:
    """What the rollout phase (trainer/collect.py) reaches: the prompts, the engine and its conversation
    driver, the reward side, and the specs that say how to sample and score. Not the trained models, their
    optimizers, the memory residency or the data-parallel context: collecting experience changes none of them.
    """

    spec: RunSpec
    loader: PromptLoader
    engine: RolloutEngine
    multi_turn: ConversationRollout | None
    tokenizer: PreTrainedTokenizerBase
    reward: RewardManager
    reward_model: ModelScorer | None


@dataclass
class RunComponents:
    """Everything a PPO run holds; built by `build_components`."""

    spec: RunSpec
    """Every component's spec, translated once from the config (`relm.config.translate`)."""
    device: torch.device
    run_dir: Path
    tokenizer: PreTrainedTokenizerBase
    actor: Trainee
    critic: Trainee | None
    """Built only for an estimator that reads values (`relm.algorithms.advantages.estimator_needs`)."""
    ref: nn.Module | None
    """A frozen copy of the starting policy when the run reads a reference and trains the full actor;
    a LoRA actor's reference is the actor itself with its adapters off (`reference`)."""
    engine: RolloutEngine
    reward: RewardManager
    loader: PromptLoader
    kl_ctrl: KLController
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
    dist: DistContext
    """This process's place in a data-parallel run (the single-process context by default)."""
    weight_sync: WeightSync
    """What the engine receives after each actor update (every weight, or a LoRA actor's merged adapted
    ones), and the check that a separate engine copy took it."""
    reward_model: ModelScorer | None = None
    """The frozen reward model or LLM judge (`reward_model.enable`), whose score is the reward."""
    teachers: Teachers | None = None
    """The frozen teachers of on-policy distillation (`distillation.enabled`), one per teacher folder."""
    multi_turn: ConversationRollout | None = None
    """Drives `engine` through conversations with tools when `rollout.multi_turn.enable` (else None);
    data-parallel, each rank runs whole conversations for its share of the prompts."""
    model_dir: str | None = None
    """The actor's resolved local folder (`actor_rollout_ref.model.path`): an asynchronous run's rollout process
    builds its engine's model from it."""
    tracked_config: Mapping[str, Any] = field(default_factory=dict)
    """The config as the user wrote it, as a plain dict: what an experiment tracker records beside the
    metrics (W&B's run config). Never read to run anything; the specs say what the run does."""

    def reference(self) -> contextlib.AbstractContextManager[nn.Module] | None:
        """The reference policy for a forward (`with c.reference() as ref:`), or None when nothing reads one."""
        if self.ref is not None:
            return contextlib.nullcontext(self.ref)
        if builds_reference(self.spec) and has_lora(self.actor.module):
            return adapters_disabled(self.actor.module)
        return None

    @property
    def experience_sources(self) -> ExperienceSources:
        """The part of the run the rollout phase reads (`trainer/collect.collect_experience`)."""
        return ExperienceSources(
            spec=self.spec,
            loader=self.loader,
            engine=self.engine,
            multi_turn=self.multi_turn,
            tokenizer=self.tokenizer,
            reward=self.reward,
            reward_model=self.reward_model,
        )

    @property
    def trainees(self) -> list[Trainee]:
        """The trained models, actor first: what updates, checkpoints and offload loop over."""
        return [self.actor] if self.critic is None else [self.actor, self.critic]


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


def resolve_train_files(data: DataSpec) -> list[str]:
    """The user's parquet files, or the built-in demo task written into relm's cache."""
    if data.train_files:
        return list(data.train_files)
    train, _ = write_demo_parquet(default_cache_dir() / "demo")
    logger.info("no data.train_files given: training on the built-in demo task (%s)", train)
    return [str(train)]


def compute_sizes(spec: RunSpec, batches_per_epoch: int, default_micro: int | None = None) -> Sizes:
    """Rows per mini/micro-batch from verl's sizes (mini-batches count prompts, micro-batches responses).

    `default_micro`: the micro-batch the memory choices made for an unset one (`MemoryChoices`); None
    takes `relm.memory.cpu_batching`'s GPU default."""
    actor, critic, n = spec.actor, spec.critic, spec.engine.sampling.n
    micro = actor.update.rows_per_microbatch
    if micro is None:
        micro = default_micro or default_rows_per_microbatch(spec)
        why = " (on CPU, as many as keep the fp32 logits within 256 MiB)" if default_micro else ""
        logger.warning(
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu is unset: relm uses %d responses per "
            "forward/backward%s; set it to change this",
            micro,
            why,
        )

    def rows(value: int | None) -> int:  # every unset per-GPU size falls back to the actor's
        return micro if value is None else value

    batching = {
        model.name: Batching(
            rows_per_minibatch=model.update.prompts_per_minibatch * n,
            rows_per_microbatch=micro if model is actor else rows(model.update.rows_per_microbatch),
            rows_per_forward=rows(model.update.rows_per_forward),
            num_epochs=model.update.num_epochs,
            shuffle=model.update.shuffle,
            remove_padding=model.source.remove_padding,
        )
        for model in (actor, critic)
    }
    loop = spec.loop
    return Sizes(
        batching=batching,
        rows_per_ref_forward=rows(spec.reference.rows_per_forward),
        logprob_temperature=spec.engine.sampling.temperature or 1.0,
        total_training_steps=loop.total_training_steps or loop.total_epochs * batches_per_epoch,
    )


def build_components(
    spec: RunSpec,
    model_dir: str,
    *,
    tracked_config: Mapping[str, Any] | None = None,
    compute_score: ComputeScore | None = None,
    dist: DistContext | None = None,
) -> RunComponents:
    """Load tokenizer, actor (+ reference, teachers, critic), engine, data and reward for `spec`.

    `model_dir` is the resolved local folder of `actor_rollout_ref.model.path`; `compute_score` the
    already-loaded reward function (loaded from `custom_reward_function` when not given); `dist` the
    context of a torchrun process (`relm.distributed.context.init_distributed`): with it the models are
    sharded with FSDP2 and the engine generates this rank's share of each batch. `spec` is the config
    translated (`relm.config.translate.translate`); `tracked_config` the config as a dict for the trackers.
    """
    dist = dist or DistContext()
    device = dist.device if dist.is_distributed else pick_device(spec.loop.device)
    # Planned before loading: the plan's last rung loads the trained models in bf16.
    memory = choose_memory(spec, model_dir, device=device, sharded=dist.is_distributed)
    cap_gpu_memory(spec.memory, device)
    if dist.is_distributed:  # FSDP's MixedPrecisionPolicy casts instead of autocast
        memory.precision = replace(memory.precision, use_autocast=False)
    precision = memory.precision
    torch.manual_seed(spec.loop.seed)

    tokenizer = _load_run_tokenizer(spec, model_dir)
    tools = load_run_tools(spec.engine.multi_turn)
    loader = _prompt_loader(spec, tokenizer, tool_schemas(tools))
    sizes = compute_sizes(spec, loader.batches_per_epoch, memory.rows_per_microbatch)
    # Started before the models load, so the reward workers' imports overlap with it.
    reward = _reward_manager(spec.reward, tokenizer, loader, compute_score)
    sources = _trained_sources(spec, model_dir)
    models = {"actor": spec.actor, "critic": spec.critic}
    # Data-parallel, the actor is built on the meta device and each rank reads only its own shards
    # (`relm.distributed.sharded_load`); the reference and the generation copy follow it.
    actor, stored = load_trained(spec.actor, model_dir, device, precision.master, sharded=dist.is_distributed)
    # Taken before sharding: the engine generates with whole weights (a copy when data-parallel; from
    # a meta-built actor a meta copy, filled from the shards once they are read).
    # vLLM keeps its own copy of the weights (in rollout.dtype), so no HF copy is made for it.
    engine_model = (
        actor
        if spec.engine.name == "vllm"
        else engine_model_of(actor, spec.engine, device, precision, separate=dist.is_distributed)
    )
    tp_size = spec.engine.tensor_parallel_size if engine_model is not actor else 1
    if tp_size > 1:  # validated: a divisor of the world size, native or HF engine
        engine_model = split_generation_copy(engine_model, dist, tp_size, str(spec.actor.source.path))
    layouts: dict[str, Layout] = {}
    if dist.is_distributed:
        layouts, plan = choose_layouts(
            spec,
            model_dir,
            dist,
            precision,
            has_reference=builds_reference(spec),
            has_critic="critic" in sources,
        )
        memory = data_parallel_memory(spec, plan, precision, layouts)
        dist.host_budget_bytes = host_budget_bytes(spec.memory)
        if stored is not None:
            shard_size = layouts["actor"].shard_size
            offloaded = frozenset(
                name for name in ("actor", "critic") if name in layouts and layouts[name].offload
            )
            rank_plan = sharded_rank_plan(spec, model_dir, device, precision, shard_size, offloaded)
            logger.info("%s", rank_plan.describe())
    ref = (
        reference_model(spec, actor, precision, dist, layouts.get("reference"), stored)
        if builds_reference(spec) and not has_lora(actor)  # a LoRA actor's reference is its base
        else None
    )
    teachers = (
        load_teachers(spec.distillation, spec, device, precision.compute, len(tokenizer))
        if spec.distillation.enabled
        else None
    )
    if teachers is not None and spec.actor.source.remove_padding:
        for teacher in teachers.group:
            use_varlen_attention(teacher, device)
    trainees: dict[str, Trainee] = {}
    for name, source in sources.items():
        module, weights = (
            (actor, stored)
            if name == "actor"
            else load_trained(models[name], source, device, precision.master, sharded=dist.is_distributed)
        )
        trainees[name] = build_trainee(
            models[name],
            module,
            sizes,
            memory,
            rows_per_step=spec.data.prompts_per_step * spec.engine.sampling.n,
            device=device,
            dist=dist,
            layout=layouts.get(name),
            stored=weights,
        )
    if stored is not None and engine_model is not actor:
        # The generation copy (or, split, this rank's pieces of it), one gathered parameter at a time: its
        # peak beyond the copy is one whole fp32 parameter, never a whole fp32 model.
        gen_dtype = generation_dtype(spec.engine, device, precision)
        materialize_split(engine_model, device, gen_dtype)  # a tensor-parallel copy's own pieces
        materialize_parameters(engine_model, device, gen_dtype)
        engine_model.to(device)  # its buffers were copied from the actor's before sharding moved them
        fill_from_shards(engine_model, trainees["actor"].module.named_parameters(), device)
        probe_padding_mask(engine_model)  # built empty with the actor: `load_causal_lm` could not ask
    critic_module = trainees["critic"].module if "critic" in trainees else None
    _share_padding_answer(engine_model, [trainees["actor"].module, ref, critic_module])
    trainees["actor"].vocab_limit = len(tokenizer)  # the policy's logprobs cover only ids it can sample
    actor, critic = trainees["actor"].module, trainees.get("critic")
    residency = build_residency(
        memory.plan,
        device,
        ref=ref,
        teachers=teachers.group if teachers is not None else None,
        # A split copy stays put: parking re-points `.data`, which its DTensor parameters do not take.
        engine_copy=engine_model if engine_model is not actor and tp_size == 1 else None,
        trained={name: (t.module, t.optimizer) for name, t in trainees.items()},
    )
    kl = spec.algorithm.kl_ctrl
    # vLLM takes a LoRA actor's adapter through its LoRA support (or merged weights where it cannot).
    lora = vllm_lora(actor) if spec.engine.name == "vllm" else None
    engine = build_run_engine(
        spec.engine,
        engine_model,
        model_dir,
        tokenizer,
        dist=dist,
        device=device,
        precision=precision,
        lora=lora,
    )
    return RunComponents(
        spec=spec,
        device=device,
        run_dir=Path(spec.loop.run_dir),
        tokenizer=tokenizer,
        actor=trainees["actor"],
        critic=critic,
        ref=ref,
        engine=engine,
        reward=reward,
        loader=loader,
        kl_ctrl=make_kl_controller(kl.type, kl.kl_coef, kl.target_kl, kl.horizon),
        sizes=sizes,
        generator=torch.Generator().manual_seed(spec.loop.seed),
        precision=precision,
        fused=FusedLayers(
            actor,
            enabled=spec.actor_loss.use_torch_compile and device.type == "cuda",
            functions=compiled_pieces(),
        ),
        memory=memory,
        residency=residency,
        dist=dist,
        # vLLM keeps its own copy of the weights, out of reach: a LoRA sync is checked by what it computes.
        weight_sync=WeightSync(
            actor,
            engine_model=None if spec.engine.name == "vllm" else engine_model,
            vllm=lora,
            check=LogprobCheck(engine.probe, engine.settings.dtype) if lora is not None else None,  # type: ignore[attr-defined]  # the vLLM engine's, reached through WatchedEngine
        ),
        reward_model=build_reward_model(spec.reward.model, device=device, policy_tokenizer=tokenizer)
        if spec.reward.model.enable
        else None,
        teachers=teachers,
        multi_turn=_multi_turn(spec, tools, engine, tokenizer, engine_model)
        if spec.engine.multi_turn.enable
        else None,
        model_dir=model_dir,
        tracked_config=tracked_config or {},
    )


def build_rollout_side(spec: RunSpec, model_dir: str, device: torch.device) -> ExperienceSources:
    """What an asynchronous run's rollout process holds (`relm.trainer.rollout_process`): its own tokenizer,
    prompt loader, reward and engine, whose model's weights the trainer sends before the first generation.
    The same builders as `build_components`, so the two processes read prompts and score alike."""
    torch.manual_seed(spec.loop.seed)
    precision = choose_memory(spec, model_dir, device=device, sharded=False).precision
    tokenizer = _load_run_tokenizer(spec, model_dir)
    loader = _prompt_loader(spec, tokenizer)
    reward = _reward_manager(spec.reward, tokenizer, loader, None)
    model = load_trained_model(
        spec.actor, model_dir, device, generation_dtype(spec.engine, device, precision)
    )
    engine = build_run_engine(
        spec.engine, model, model_dir, tokenizer, dist=DistContext(), device=device, precision=precision
    )
    reward_model = build_reward_model(spec.reward.model, device=device) if spec.reward.model.enable else None
    return ExperienceSources(
        spec=spec, loader=loader, engine=engine, multi_turn=None, tokenizer=tokenizer, reward=reward,
        reward_model=reward_model,
    )  # fmt: skip


def _trained_sources(spec: RunSpec, model_dir: str) -> dict[str, str]:
    """The folder each trained model loads from: the actor's, and a critic's where the estimator reads values."""
    sources = {"actor": model_dir}
    if builds_critic(spec):
        critic = spec.critic.source.path
        sources["critic"] = resolve_model_dir(critic) if critic else model_dir
    return sources


def _reward_manager(
    spec: RewardSpec,
    tokenizer: PreTrainedTokenizerBase,
    loader: PromptLoader,
    compute_score: ComputeScore | None,
) -> RewardManager:
    """The run's rule/custom reward, scored in reward workers. The demo's and the lookup task's scorers
    are relm's own constant-time code: they score in-process unless `reward_model.num_workers` says
    otherwise."""
    if compute_score is None:
        compute_score = resolve_compute_score(
            spec.custom_function_path, spec.custom_function_name, batched=spec.manager == "batch",
        )  # fmt: skip
    dataset = loader.dataset
    sources = {dataset[i]["data_source"] for i in range(len(dataset))}
    demo_only = sources <= {DEMO_DATA_SOURCE, LOOKUP_DATA_SOURCE}
    return build_reward_manager(
        tokenizer, compute_score, spec, in_process_by_default=demo_only and compute_score is default_compute_score,
    )  # fmt: skip


def _multi_turn(
    spec: RunSpec,
    tools: dict[str, Tool],
    engine: RolloutEngine,
    tokenizer: PreTrainedTokenizerBase,
    engine_model: nn.Module,
) -> ConversationRollout:
    """Drives `engine` through conversations with `tools` and the config's interactions
    (`rollout.multi_turn.enable`). Data-parallel, the conversations are shared out, not the turns:
    each rank drives its own engine through whole conversations and one gather ends the rollout
    (relm/distributed/multi_turn.py); a turn-by-turn collective would hang ranks whose
    conversations end at different turns."""
    local = engine.engine if isinstance(engine, DataParallelEngine) else engine
    rollout = build_multi_turn(
        spec.engine.multi_turn,
        tools,
        local,
        tokenizer,
        chat_template=spec.actor.source.chat_template,
        chat_template_kwargs=dict(spec.data.chat_template_kwargs),
        eos_token_ids=eos_token_ids_of(tokenizer, engine_model),
        interactions=load_run_interactions(spec.engine.multi_turn),
    )
    return DataParallelMultiTurn(rollout, engine) if isinstance(engine, DataParallelEngine) else rollout


def _share_padding_answer(engine_model: nn.Module, modules: list[nn.Module | None]) -> None:
    """Keep the engine model's answer to whether the model reads the attention mask
    (`relm.models.padding_probe`) on the modules built on the meta device, which `load_causal_lm` could
    not ask: the actor and the reference (copies of one model) and a critic of the same model type. The
    engine's copy is whole, so its probe is a local forward; probing the sharded models themselves (an FSDP
    forward before their optimizers exist) made the two-process checkpoint save fail (`KeyError` in
    torch's `get_optimizer_state_dict`, tests/integration/test_distributed.py). A critic of another type
    built empty keeps the default (it reads the mask, as every attention model does)."""
    reads_mask = padding_answer(engine_model)
    if reads_mask is None:  # vLLM's run generates on the actor itself, built empty: nothing to share
        return
    model_type = getattr(getattr(engine_model, "config", None), "model_type", None)
    for module in modules:
        if module is None or padding_answer(module) is not None:
            continue
        if getattr(getattr(module, "config", None), "model_type", None) == model_type:
            record_padding_answer(module, reads_mask)


def reference_model(
    spec: RunSpec,
    actor: nn.Module,
    precision: Precision,
    dist: DistContext,
    layout: Layout | None,
    stored: StoredWeights | None = None,
) -> nn.Module:
    """A frozen copy of the starting policy (identical weights without a second read from disk), in
    the compute dtype; sharded by `layout` in a data-parallel run. Taken before the actor is sharded.

    `stored`: the actor was built on the meta device; the reference is too, and each rank reads its
    own shards of it from these files in the compute dtype."""
    ref = copy_in_dtype(actor, precision.compute).eval()  # cast tensor by tensor: no second fp32 copy
    if layout is None:
        return ref
    ref = shard_model(  # offloaded with the actor (`relm.trainer.data_parallel.choose_offload`)
        ref,
        dist,
        replace(precision, master=precision.compute),
        offload=layout.offload,
        shard_size=layout.shard_size,
    )
    if stored is not None:
        materialize_shards(ref, stored, dist.device)
    return ref


def _load_run_tokenizer(spec: RunSpec, model_dir: str) -> PreTrainedTokenizerBase:
    """The one tokenizer of the run (prompts, rewards, engine). verl loads its trainer's tokenizer, the one
    that reads the data, with `data.trust_remote_code` and the actor's with the model's key; relm has one
    tokenizer for both roles, so either key allows its code."""
    model = spec.actor.source
    return load_tokenizer(
        model.tokenizer_path or model_dir,
        trust_remote_code=model.trust_remote_code or spec.data.trust_remote_code,
        path_key="actor_rollout_ref.model.tokenizer_path"
        if model.tokenizer_path
        else "actor_rollout_ref.model.path",
    )


def _prompt_loader(
    spec: RunSpec, tokenizer: PreTrainedTokenizerBase, tools: list[dict[str, Any]] | None = None
) -> PromptLoader:
    data = spec.data
    files, files_key, drop_last = resolve_train_files(data), "data.train_files", True
    if spec.loop.val_only and not data.train_files and data.val_files:
        # Validating a model on one's own prompts: nothing is trained, so no training data is needed;
        # the validation prompts stand in (the demo's would be tokenized for nothing, or not fit).
        files, files_key, drop_last = list(data.val_files), "data.val_files", False
    dataset = PromptDataset.from_spec(
        spec.data,
        files,
        tokenizer,
        chat_template=spec.actor.source.chat_template,
        builtin_scorers=spec.reward.uses_builtin_scorers,
        files_key=files_key,
        tools=tools,
    )
    # A reward model re-renders (or shows its judge) the prompt's messages, as verl's does.
    dataset.return_raw_chat = dataset.return_raw_chat or spec.reward.model.enable
    return PromptLoader(
        dataset, data.prompts_per_step, shuffle=data.shuffle, seed=data.seed, drop_last=drop_last
    )


def load_trained(
    spec: TrainedModelSpec, model_dir: str, device: torch.device, dtype: torch.dtype, *, sharded: bool
) -> tuple[nn.Module, StoredWeights | None]:
    """The actor or the critic, and where its shards are to be read from when it was built on the meta
    device.

    `sharded` (a data-parallel run) builds it empty when it can be filled shard by shard: a fully trained
    model (LoRA adapters are added to a loaded model) whose safetensors hold every parameter under its
    own name (`relm.distributed.sharded_load`). Otherwise it loads whole, as in one process."""
    if sharded and lora_settings(spec.source.lora) is None and SafetensorsFolder.present(model_dir):
        module = load_trained_model(spec, model_dir, device, dtype, empty=True)
        if spec.name == "actor":
            weights = stored_weights(module, SafetensorsFolder(model_dir))
        else:
            weights = critic_weights(module, model_dir)
        if weights is not None:
            logger.info("the %s is built on the meta device: each rank reads only its own shards", spec.name)
            return module, weights
        logger.info(
            "the %s's files name its weights otherwise than its modules do (transformers converts them "
            "while loading): every rank loads the whole %s before sharding it",
            spec.name,
            spec.name,
        )
    return load_trained_model(spec, model_dir, device, dtype), None


def load_trained_model(
    spec: TrainedModelSpec, model_dir: str, device: torch.device, dtype: torch.dtype, *, empty: bool = False
) -> nn.Module:
    """The actor (a causal LM) or the critic (a `ValueModel`) from `model_dir`, in eval mode, with
    packed forwards attending through the flash varlen kernel where the spec packs them.

    `empty`: its parameters on the meta device, for `relm.distributed.sharded_load`."""
    name, source = spec.name, spec.source
    common: dict[str, Any] = dict(
        override_config=dict(source.override_config),
        dtype=dtype,
        device=device,
        trust_remote_code=source.trust_remote_code,
        trust_key=source.trust_key,
        seed=source.init_seed,
    )
    module: nn.Module
    if empty:
        logger.info("building the %s of %s (%s, parameters on the meta device)", name, model_dir, dtype)
    else:
        logger.info("loading the %s from %s (%s on %s)", name, model_dir, dtype, device)
    module = (load_causal_lm if name == "actor" else load_value_model)(model_dir, empty=empty, **common)
    if source.remove_padding:
        use_varlen_attention(getattr(module, "backbone", module), device)
    settings = lora_settings(source.lora)
    if settings is not None:
        # The critic's backbone gets the adapters; its value head stays fully trained.
        trainable = add_lora(getattr(module, "backbone", module), settings)
        total = sum(p.numel() for p in module.parameters())
        logger.info(
            "the %s trains LoRA adapters of rank %d on %s: %s of %s parameters (%.2f%%)",
            name, settings.rank, settings.target_modules, f"{trainable:,}", f"{total:,}", 100 * trainable / total,
        )  # fmt: skip
    return module.eval()


def build_trainee(
    spec: TrainedModelSpec,
    module: nn.Module,
    sizes: Sizes,
    memory: MemoryChoices,
    *,
    rows_per_step: int,
    device: torch.device,
    dist: DistContext,
    layout: Layout | None,
    stored: StoredWeights | None = None,
) -> Trainee:
    """Shard `module` (data parallel, by `layout`), give it its optimizer and schedule, and apply its
    memory choices (gradient checkpointing, AdamW moments in CPU memory).

    `stored`: `module` was built on the meta device; once sharded, each rank reads its own shards from
    these files.

    `rows_per_step` counts the responses of one training step; the schedule spans `optim.total_training_steps`
    training steps where the user set it (a set value wins), else the run's."""
    name, choice, precision = spec.name, memory.models[spec.name], memory.precision
    batching = sizes.batching[name]
    if layout is not None:
        module = shard_model(module, dist, precision, offload=layout.offload, shard_size=layout.shard_size)
        if stored is not None:
            materialize_shards(module, stored, device)
    # CompactAdamW where a moment or weight is bf16 (one process); torch's AdamW otherwise.
    compact = not dist.is_distributed and precision.master in (torch.float32, torch.bfloat16)
    compact_moments = compact and (
        precision.master == torch.bfloat16 or choice.moments_dtype != torch.float32
    )
    minibatches_per_step = max(1, rows_per_step // batching.rows_per_minibatch)
    training_steps = spec.optim.total_training_steps or sizes.total_training_steps
    optimizer, scheduler = build_optimizer(
        module,
        spec.optim,
        training_steps * minibatches_per_step * batching.num_epochs,
        moments_dtype=choice.moments_dtype if compact_moments else None,
        seed=spec.seed,
    )
    if choice.checkpointing:
        module.gradient_checkpointing_enable()  # type: ignore[operator]  # nn.Module hides the HF model's API
    return Trainee(
        name=name,
        module=module,
        optimizer=optimizer,
        scheduler=scheduler,
        grad_clip=spec.update.grad_clip,
        batching=batching,
        microbatch=MicroBatchSize(rows=batching.rows_per_microbatch, max_tokens=choice.max_tokens),
        optimizer_offload=OffloadedOptimizerStates(optimizer, device) if choice.offload_optimizer else None,
    )


def build_run_engine(
    spec: EngineSpec,
    engine_model: nn.Module,
    model_dir: str,
    tokenizer: PreTrainedTokenizerBase,
    *,
    dist: DistContext,
    device: torch.device,
    precision: Precision,
    lora: VLLMLora | None = None,
) -> RolloutEngine:
    """The run's engine (`build_engine`), watched for stalls, and shared out over the ranks when
    data-parallel (by groups of `tensor_model_parallel_size` ranks, whose copy is split over them)."""
    tp_size = spec.tensor_parallel_size if dist.is_distributed else 1
    eos_ids = eos_token_ids_of(tokenizer, engine_model)
    logger.info(
        "responses end at %s; no id at or past %d (the tokenizer's length) is sampled",
        ", ".join(f"{tokenizer.convert_ids_to_tokens(i)} ({i})" for i in eos_ids) or "no token",
        len(tokenizer),
    )
    # Every generate call of the run is watched: no progress for rollout.timeout_s ends the run.
    engine: RolloutEngine = WatchedEngine(
        build_engine(
            spec,
            engine_model,
            model_dir=model_dir,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_ids=eos_ids,
            vocab_limit=len(tokenizer),
            device=device,
            # Groups generate different prompts: independent streams; a tensor-parallel group's ranks
            # draw the same tokens.
            seed=spec.seed + dist.rank // tp_size,
            precision=precision,
            lora=lora,
        ),
        spec.timeout_s,
    )
    if dist.is_distributed:
        # Every group of `tp_size` ranks generates one share (a group of one: the whole model per rank).
        engine = DataParallelEngine(engine, dist, tp_size=tp_size)
    return engine


def use_varlen_attention(model: nn.Module, device: torch.device) -> None:
    """Packed forwards on a GPU cut attention at the rows' boundaries (flash varlen kernel) instead
    of building a dense [S, S] mask; models whose attention is not sdpa (soft-capped ones run eager)
    and CPU runs keep transformers' packed path."""
    if device.type != "cuda" or not varlen_kernel_available():
        return
    if model.config._attn_implementation != "sdpa":  # type: ignore[union-attr]  # nn.Module hides the HF model's API
        return
    register_varlen_attention()
    model.set_attn_implementation(VARLEN_ATTENTION)  # type: ignore[operator]  # nn.Module hides the HF model's API
    logger.info("packed sequences attend through the flash variable-length kernel")


def generation_dtype(spec: EngineSpec, device: torch.device, precision: Precision) -> torch.dtype:
    """`rollout.dtype` on a GPU; on CPU the training dtype (bf16 matrix products are slow there)."""
    return pick_dtype(spec.dtype, device) if device.type == "cuda" else precision.master


def engine_model_of(
    actor: nn.Module,
    spec: EngineSpec,
    device: torch.device,
    precision: Precision,
    *,
    separate: bool = False,
) -> nn.Module:
    """The module the engine generates with: the actor itself where dtypes agree (CPU), else a copy in
    `rollout.dtype` (bf16 on GPU) that `sync_weights` refreshes in place after every update.

    `separate` always copies: a sharded actor cannot generate, its engine needs whole weights."""
    gen_dtype = generation_dtype(spec, device, precision)
    if gen_dtype == precision.master and not separate:
        return actor
    logger.info(
        "generating with a %s copy of the actor (training keeps %s master weights)",
        gen_dtype,
        precision.master,
    )
    # A LoRA actor's copy is a plain model with its adapters merged: the engine's kernels and fused
    # projections see an ordinary transformers model, and each sync refreshes only the adapted weights.
    # Made tensor by tensor in `gen_dtype` (`copy_in_dtype`): a deepcopy cast afterwards would hold a second
    # fp32 model on the GPU first (a 7B LoRA run under a 48 GB budget ran out of memory there).
    plain = without_adapters(actor, gen_dtype) if has_lora(actor) else copy_in_dtype(actor, gen_dtype)
    return plain.eval()


def build_engine(
    spec: EngineSpec,
    model: nn.Module,
    *,
    model_dir: str,
    pad_token_id: int,
    eos_token_ids: list[int],
    device: torch.device,
    seed: int,
    precision: Precision,
    vocab_limit: int | None = None,
    lora: VLLMLora | None = None,
) -> RolloutEngine:
    """The engine `spec.name` names, colocated with the actor; none samples an id at or past
    `vocab_limit` (the tokenizer's length).

    `native` and `hf` generate with `model`: the actor's own module, or its copy in the generation dtype
    (`engine_model_of`). `vllm` takes the actor as `model` and keeps its own copy of the weights, built
    from `model_dir`'s config and loaded from the actor (for a LoRA actor, as `lora` says).
    """
    if spec.name == "vllm":
        settings = VLLMSettings(
            dtype=generation_dtype(spec, device, precision),
            max_model_len=spec.max_model_len,
            seed=seed,
            gpu_memory_utilization=spec.gpu_memory_utilization,
            tensor_model_parallel_size=spec.tensor_parallel_size,
            enable_chunked_prefill=spec.enable_chunked_prefill,
            enforce_eager=spec.enforce_eager,
            max_num_batched_tokens=spec.max_num_batched_tokens,
            max_num_seqs=spec.max_num_seqs,
            free_cache_engine=spec.free_cache_engine,
            engine_kwargs=vllm_engine_kwargs(dict(spec.engine_kwargs)),
        )
        return VLLMRolloutEngine(
            model,
            model_dir,
            pad_token_id=pad_token_id,
            eos_token_ids=eos_token_ids,
            device=device,
            settings=settings,
            vocab_limit=vocab_limit,
            lora=lora,
        )
    if spec.name == "hf":
        return HFRolloutEngine(
            model,
            pad_token_id=pad_token_id,
            eos_token_ids=eos_token_ids,
            device=device,
            seed=seed,
            vocab_limit=vocab_limit,
        )
    return NativeRolloutEngine(
        model,
        pad_token_id=pad_token_id,
        eos_token_ids=eos_token_ids,
        device=device,
        seed=seed,
        gpu_memory_utilization=spec.gpu_memory_utilization,
        max_num_seqs=spec.max_num_seqs,
        max_prefill_tokens=spec.max_num_batched_tokens,
        vocab_limit=vocab_limit,
        quantization=spec.quantization,
    )


def vllm_engine_kwargs(engine_kwargs: dict) -> dict:
    """`engine_kwargs.vllm.*` (and, as older verl wrote them, top-level keys such as `swap_space`) without
    the null values verl's defaults carry, which mean "vLLM's default"."""
    top_level = {k: v for k, v in engine_kwargs.items() if k not in ("vllm", "sglang")}
    merged = {**top_level, **(engine_kwargs.get("vllm") or {})}
    return {key: value for key, value in merged.items() if value is not None}


def eos_token_ids_of(tokenizer: PreTrainedTokenizerBase, model: nn.Module) -> list[int]:
    """Every id that ends a response: eos, the generation config's eos ids (may be a list) and the token
    the chat template closes an assistant turn with (Phi-3 `<|end|>`, Llama 3 `<|eot_id|>`)."""
    return end_of_turn_ids(tokenizer, getattr(model, "generation_config", None))
