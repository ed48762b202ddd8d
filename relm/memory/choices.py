"""The memory plan of a run: computed from the models' configs before any weight is loaded, applied, printed.

The arithmetic is `relm.memory.plan`; this module reads the run's side of it (shapes from
the configs, lengths, the GPU's and the host's memory, the user's explicit settings) and turns the
decisions into the dtype the models load in, the optimizers' moment dtype, gradient checkpointing,
micro-batch token budgets and the phases' `Residency`. The plan comes first because its last rung
(bf16 weights) decides how the models are loaded. It plans a single CUDA process only: on CPU nothing
is planned (checkpointing stays off unless asked for, it only costs time there), and sharded runs
size themselves through FSDP2 (`fsdp_config.offload_policy`, which `relm.memory.sharded_plan.decide_offload`
decides where it is unset).

A data-parallel run asks the same question first (`data_parallel_plan`): when one GPU's plan keeps
every model whole on the GPU in fp32 (nothing parked, AdamW moments on the GPU), each rank can hold
the models whole (`relm.distributed.layout`) and runs that plan on its own rows
(`data_parallel_choices`); a model that ends up sharded follows the user's settings.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from relm.algorithms.advantages import estimator_needs
from relm.config.specs import MemorySpec, RunSpec, TrainedModelSpec
from relm.errors import UserError
from relm.memory.cpu_batching import default_rows_per_microbatch
from relm.memory.host import available_host_bytes, host_room, process_rss_bytes
from relm.memory.model_shape import ModelShape
from relm.memory.offload import ParkedModel, Residency
from relm.memory.plan import (
    OFFERED_LORA_RANK,
    Lora,
    MemoryPlan,
    PlanDoesNotFit,
    PlanRequest,
    TraineeRequest,
    cpu_host_need,
    lora_offer,
    plan_memory,
    with_lora,
)
from relm.memory.sharded_plan import ShardedRankPlan, plan_sharded_rank
from relm.models.loading import load_config, pick_dtype, resolve_model_dir
from relm.models.precision import Precision, pick_precision

logger = logging.getLogger("relm")
MOMENTS_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


@dataclass
class ModelMemory:
    """One trained model's memory settings, planned or as the user set them."""

    checkpointing: bool
    """Gradient checkpointing during its updates."""
    max_tokens: int | None
    """Token budget of its micro-batches and no-grad forwards (the actor's also cuts the reference's
    forwards); None cuts them by rows."""
    moments_dtype: torch.dtype = torch.float32
    """Dtype of its AdamW moments."""
    offload_optimizer: bool = False
    """Its AdamW moments wait in CPU memory between steps."""


@dataclass
class MemoryChoices:
    """What the run uses, planned or as the user set it."""

    models: dict[str, ModelMemory]
    """Per trained model (`actor`, `critic`): the critic's entry is there whether or not a critic is built."""
    precision: Precision
    """Dtype of the trained weights and of their matrix products (bf16 for both at the plan's last rung)."""
    plan: MemoryPlan | None = None
    host_peak_bytes: int | None = None
    """The process's predicted peak in host memory (the plan's on a GPU, `check_cpu_host_memory`'s on CPU);
    None where nothing was predicted."""
    rows_per_microbatch: int | None = None
    """relm's responses per forward/backward where the user sets none, when it differs from the GPU default
    (a single-process CPU run: `relm.memory.cpu_batching`); None: the default."""


def builds_critic(spec: RunSpec) -> bool:
    """A critic is built only for an estimator that reads values (`relm.algorithms.advantages`)."""
    return estimator_needs(spec.algorithm.adv_estimator).critic


def builds_reference(spec: RunSpec) -> bool:
    """The reference model is built only when a KL term, or the estimator, reads it."""
    algo = spec.algorithm
    return (
        algo.use_kl_in_reward or spec.actor_loss.use_kl_loss or estimator_needs(algo.adv_estimator).reference
    )


class RunDoesNotFit(UserError):
    """The run does not fit the card or host it was given (a one-line `UserError` like any other).

    `lora_rank` is the rank the line offers when LoRA on every trained model would fit, else None: `relm
    compat` retries its update stage that way and reports the model as conditional on it, instead of
    failing a model that trains on that card with one key set."""

    def __init__(self, message: str, lora_rank: int | None) -> None:
        super().__init__(message)
        self.lora_rank = lora_rank


def device_memory(device: torch.device) -> tuple[int, int] | None:
    """(GPU bytes, host bytes available now) of the machine; None where nothing is planned (CPU).

    The host side is MemAvailable or the cgroup's room (`relm.memory.host`), not MemTotal. The user's
    budgets cut both in `_plan_request`. Tests replace it to plan a CPU run as if it had a GPU of a given size.
    """
    if device.type != "cuda":
        return None
    host = available_host_bytes() or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return torch.cuda.get_device_properties(device).total_memory, host


def gpu_budget_bytes(memory: MemorySpec) -> int | None:
    """`trainer.max_gpu_memory_gb` in bytes (None: the whole GPU)."""
    budget = memory.max_gpu_memory_gb
    return None if budget is None else int(budget * 1e9)


def host_budget_bytes(memory: MemorySpec) -> int | None:
    """`trainer.max_host_memory_gb` in bytes (None: what the machine has available)."""
    budget = memory.max_host_memory_gb
    return None if budget is None else int(budget * 1e9)


def cap_gpu_memory(memory: MemorySpec, device: torch.device) -> None:
    """Hold torch's allocator to `trainer.max_gpu_memory_gb` on `device`: one large GPU then behaves like
    the smaller card the budget names (an allocation past it raises torch's out-of-memory error)."""
    cap_gpu_bytes(gpu_budget_bytes(memory), device)


def cap_gpu_bytes(budget_bytes: int | None, device: torch.device) -> None:
    """`cap_gpu_memory` for a budget in bytes (None or a CPU device: nothing)."""
    if budget_bytes is None or device.type != "cuda":
        return
    # torch wants the device's index here (plain `cuda` is refused): the current device stands for it.
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, budget_bytes / total), index)


def choose_memory(
    spec: RunSpec, model_dir: str, *, device: torch.device, sharded: bool = False
) -> MemoryChoices:
    """The plan on a single GPU (raising `UserError` when the run cannot fit), else the user's settings.

    Args:
        spec: the run's specs (the plan prices every model of the run).
        model_dir: the resolved folder of `actor_rollout_ref.model.path` (its config gives the shapes).
        device: where the run trains.
        sharded: a torchrun run (FSDP2 sizes it; nothing is planned).

    Raises:
        UserError: the planner finds no arrangement that fits (the message names what does not), or
            a moment dtype is set where relm cannot honour it.
    """
    user_moments = {
        "actor": _moments_dtype(
            spec.actor.optim.moments_dtype, "actor_rollout_ref.actor.optim.moments_dtype"
        ),
        "critic": _moments_dtype(spec.critic.optim.moments_dtype, "critic.optim.moments_dtype"),
    }
    precision = pick_precision(spec.memory.weights_dtype, device)
    explicit = [f"{key}={value}" for key, value in _explicit_precision(spec).items()]
    # Sharded runs step with torch's AdamW (fp32 moments): asking for exactly that is fine.
    compact_moments = any(dtype not in (None, torch.float32) for dtype in user_moments.values())
    unsupported_weights = precision.master not in (torch.float32, torch.bfloat16)
    if (sharded and compact_moments) or (any(user_moments.values()) and unsupported_weights):
        raise UserError(
            f"`{explicit[-1]}` applies to single-process runs with float32 or bfloat16 weights; "
            "remove it (sharded runs and float16 weights step with torch's AdamW)"
        )
    choices = user_choices(spec, precision, user_moments)
    single = not sharded and spec.memory.num_gpus == 1
    memory = device_memory(device) if single else None
    if memory is None:
        if single and device.type == "cpu":
            choices.rows_per_microbatch = default_rows_per_microbatch(spec, _vocab_size(spec, model_dir))
            choices.host_peak_bytes = check_cpu_host_memory(spec, model_dir, precision, user_moments)
        return choices
    request = _plan_request(spec, model_dir, device, precision, memory, user_moments)
    try:
        plan = plan_memory(request)
    except PlanDoesNotFit as exc:
        settings = f" with {', '.join(explicit)}" if explicit else ""
        offer = lora_offer(request, OFFERED_LORA_RANK)
        raise RunDoesNotFit(
            f"`{spec.actor.source.path}` does not fit one GPU for this run{settings}{_budgets(spec.memory)}: {exc}; "
            + (f"{offer}; or " if offer else "")
            + "use more GPUs (trainer.n_gpus_per_node) or shorter data.max_prompt_length / "
            "data.max_response_length",
            OFFERED_LORA_RANK if offer else None,
        ) from None
    logger.info("%s", plan.describe())
    if plan.given_up:
        logger.warning("memory plan: to fit one GPU, %s", "; ".join(plan.given_up))
    if plan.rung.weights != precision.master:  # the last rung: bf16 weights, computed in bf16
        precision = Precision(master=plan.rung.weights, compute=plan.rung.weights, device_type=device.type)
    choices = planned_choices(spec, plan, precision)
    choices.host_peak_bytes = plan.host_peak_bytes
    return choices


_DEFAULT_MAX_TOKENS = {"actor": 16384, "critic": 32768}
"""verl's default token budget of a dynamic micro-batch, per trained model."""


def user_choices(
    spec: RunSpec, precision: Precision, user_moments: dict[str, torch.dtype | None] | None = None
) -> MemoryChoices:
    """What the config says, without a plan: unset checkpointing is off, unset budgets verl's defaults."""
    user_moments = user_moments or {}
    return MemoryChoices(
        models={
            model.name: ModelMemory(
                checkpointing=bool(model.source.gradient_checkpointing),
                max_tokens=(model.update.max_tokens_per_microbatch or _DEFAULT_MAX_TOKENS[model.name])
                if model.update.dynamic_batch
                else None,
                moments_dtype=user_moments.get(model.name) or torch.float32,
            )
            for model in _trained(spec).values()
        },
        precision=precision,
    )


def planned_choices(spec: RunSpec, plan: MemoryPlan, precision: Precision) -> MemoryChoices:
    """The plan's checkpointing, token budgets, moment dtypes and offload (micro-batches by the plan's
    token budget unless the user fixed their row count); a model the plan does not train keeps the user's
    settings."""
    models = user_choices(spec, precision).models
    for name, planned in plan.trainees.items():
        update = _trained(spec)[name].update
        by_tokens = update.dynamic_batch or update.rows_per_microbatch is None
        # the policy's budget is the plan's; another model's is its own key where the user set it
        own = update.max_tokens_per_microbatch if name != "actor" else None
        models[name] = ModelMemory(
            checkpointing=planned.checkpointing,
            max_tokens=(own or plan.max_tokens_per_microbatch) if by_tokens else None,
            moments_dtype=planned.moments_dtype,
            offload_optimizer=planned.offload_optimizer,
        )
    return MemoryChoices(models=models, precision=precision, plan=plan)


def _trained(spec: RunSpec) -> dict[str, TrainedModelSpec]:
    """The specs of the models a run may train, by name (the critic's whether or not it is built)."""
    return {"actor": spec.actor, "critic": spec.critic}


def data_parallel_plan(spec: RunSpec, model_dir: str, device: torch.device) -> tuple[MemoryPlan | None, str]:
    """`whole_model_plan` for the plan a single-GPU run of `spec` would make on `device`."""
    memory = device_memory(device)
    if memory is None:
        return None, f"no memory plan on {device.type}"
    precision = pick_precision(spec.memory.weights_dtype, device)
    return whole_model_plan(
        _plan_request(spec, model_dir, device, precision, memory, {"actor": None, "critic": None})
    )


def whole_model_plan(request: PlanRequest) -> tuple[MemoryPlan | None, str]:
    """One GPU's plan when it holds every model whole on the GPU (fp32 weights and moments, nothing
    parked, no moments in CPU memory), else None; and the phrase that says which, for the
    data-parallel start-up line."""
    try:
        plan = plan_memory(request)
    except PlanDoesNotFit as exc:
        return None, f"the memory plan does not fit one GPU: {exc}"
    waiting = [
        name
        for name, on in (
            ("the reference", plan.park_reference),
            ("the teachers", plan.park_teachers),
            ("the engine copy", plan.park_engine_copy),
        )
        if on
    ]
    waiting += [f"the {name}" for name, t in plan.trainees.items() if t.parked]
    waiting += [f"the {name}'s AdamW moments" for name, t in plan.trainees.items() if t.offload_optimizer]
    if waiting:
        listed = " and ".join([", ".join(waiting[:-1]), waiting[-1]] if len(waiting) > 1 else waiting)
        return None, f"one GPU would keep {listed} in CPU memory"
    if plan.given_up:
        return None, f"one GPU would need {'; '.join(plan.given_up)}"
    return plan, "the memory plan fits one GPU"


def data_parallel_choices(
    spec: RunSpec, plan: MemoryPlan | None, precision: Precision, *, replicated: dict[str, bool]
) -> MemoryChoices:
    """Per model: the single-GPU plan's checkpointing and token budget when the model is replicated
    (`replicated[name]`) and the plan holds every model whole (`data_parallel_plan`), else the user's
    settings. Moments stay fp32 and on the GPU (torch's AdamW steps sharded models)."""
    user = user_choices(spec, precision)
    if plan is None:
        return user
    planned = planned_choices(spec, plan, precision)
    models = {
        name: ModelMemory(
            checkpointing=source.models[name].checkpointing, max_tokens=source.models[name].max_tokens
        )
        for name in user.models
        for source in [planned if replicated.get(name, False) else user]
    }
    return MemoryChoices(models=models, precision=precision, plan=plan if any(replicated.values()) else None)


def _plan_request(
    spec: RunSpec,
    model_dir: str,
    device: torch.device,
    precision: Precision,
    memory: tuple[int, int],
    user_moments: dict[str, torch.dtype | None],
) -> PlanRequest:
    """The run's side of the arithmetic, with the shapes read from the configs (no weights exist yet)."""
    actor_source, critic_source = spec.actor.source, spec.critic.source
    _, config, _ = load_config(
        model_dir,
        override_config=dict(actor_source.override_config),
        trust_remote_code=actor_source.trust_remote_code,
    )
    actor = ModelShape.from_config(config, trust_remote_code=actor_source.trust_remote_code)
    critic = None
    if builds_critic(spec):
        critic_dir = resolve_model_dir(critic_source.path) if critic_source.path else model_dir
        trust = critic_source.trust_remote_code
        _, critic_config, _ = load_config(
            critic_dir,
            override_config=dict(critic_source.override_config),
            trust_remote_code=trust,
            trust_key=critic_source.trust_key,
        )
        critic = ModelShape.from_config(critic_config, value_model=True, trust_remote_code=trust)
    # The engine copies the actor into rollout.dtype on a GPU (CPU runs generate in the training
    # dtype); vLLM keeps its own weights outside this arithmetic.
    copies = spec.engine.name != "vllm" and device.type == "cuda"
    gpu_bytes, host_bytes = memory
    rss = process_rss_bytes()
    if (gpu_budget := gpu_budget_bytes(spec.memory)) is not None:
        gpu_bytes = min(gpu_bytes, gpu_budget)
    if (host_budget := host_budget_bytes(spec.memory)) is not None:
        host_bytes = min(host_bytes, max(host_budget - rss, 0))
    lora = _lora(spec, actor, critic)
    trainees = {
        "actor": TraineeRequest(
            actor,
            moments_dtype=user_moments["actor"],
            checkpointing=actor_source.gradient_checkpointing,
            max_tokens=spec.actor.update.max_tokens_per_microbatch,
            lora=lora.get("actor"),
        )
    }
    if critic is not None:
        trainees["critic"] = TraineeRequest(
            critic,
            moments_dtype=user_moments["critic"],
            checkpointing=critic_source.gradient_checkpointing,
            lora=lora.get("critic"),
        )
    cpu_rows = spec.actor.update.rows_per_microbatch or default_rows_per_microbatch(
        spec, actor.vocab_size if device.type == "cpu" else None
    )
    return PlanRequest(
        trainees=trainees,
        has_reference=builds_reference(spec),
        max_sequence_length=spec.data.max_prompt_length + spec.data.max_response_length,
        gpu_bytes=gpu_bytes,
        host_bytes=host_bytes,
        generation_dtype=pick_dtype(spec.engine.dtype, device) if copies else None,
        weights_dtype=None if spec.memory.weights_dtype == "auto" else precision.master,
        autocast=precision.compute != precision.master,
        compiled_layers=spec.actor_loss.use_torch_compile and device.type == "cuda",
        host_baseline_bytes=rss,
        saves_checkpoints=spec.loop.save_freq > 0,
        cpu_rows_per_microbatch=cpu_rows,
        cpu_microbatches_per_step=_microbatches_per_step(spec, cpu_rows),
        response_length=spec.data.max_response_length,
        teacher_params=_teacher_params(spec),
    )


def _microbatches_per_step(spec: RunSpec, rows_per_microbatch: int) -> int:
    """Forward/backward passes of the actor's update a step: mini-batches x their micro-batches x epochs."""
    update = spec.actor.update
    minibatches = -(-spec.data.prompts_per_step // update.prompts_per_minibatch)
    per_minibatch = -(-update.prompts_per_minibatch * spec.engine.sampling.n // rows_per_microbatch)
    return minibatches * per_minibatch * update.num_epochs


def _teacher_params(spec: RunSpec) -> int:
    """Parameters of the distillation teachers together, from their configs (0 without distillation)."""
    total = 0
    for teacher in spec.distillation.teachers if spec.distillation.enabled else ():
        source = spec.actor.source
        _, config, _ = load_config(
            resolve_model_dir(teacher.path),
            trust_remote_code=source.trust_remote_code,
            trust_key=source.trust_key,
        )
        total += ModelShape.from_config(config, trust_remote_code=source.trust_remote_code).num_params
    return total


def _vocab_size(spec: RunSpec, model_dir: str) -> int:
    """The width of the actor's logits, from its config."""
    source = spec.actor.source
    _, config, _ = load_config(
        model_dir, override_config=dict(source.override_config), trust_remote_code=source.trust_remote_code
    )
    return int(config.get_text_config().vocab_size)


def _lora(spec: RunSpec, actor: ModelShape, critic: ModelShape | None) -> dict[str, Lora]:
    """The trained models with LoRA (`model.lora_rank` > 0) and their trainable parameter counts."""
    lora = {}
    for name, shape, adapters in (
        ("actor", actor, spec.actor.source.lora),
        ("critic", critic, spec.critic.source.lora),
    ):
        if shape is not None and adapters.rank > 0:
            exclude = None if adapters.exclude_modules is None else list(adapters.exclude_modules)
            count = shape.lora_params(adapters.rank, list(adapters.target_modules), exclude)
            lora[name] = Lora(adapters.rank, count)
    return lora


def _budgets(memory: MemorySpec) -> str:
    """The budgets the user set, for the "does not fit" line."""
    keys = [
        f"trainer.{key}={value:g}"
        for key, value in (
            ("max_gpu_memory_gb", memory.max_gpu_memory_gb),
            ("max_host_memory_gb", memory.max_host_memory_gb),
        )
        if value is not None
    ]
    return f" within {' and '.join(keys)}" if keys else ""


def check_cpu_host_memory(
    spec: RunSpec, model_dir: str, precision: Precision, user_moments: dict[str, torch.dtype | None]
) -> int | None:
    """On CPU every model lives in host memory: stop before loading when the run's models, one sequence's
    activations and a checkpoint's staging need more than the process may take.

    Returns:
        The process's predicted peak: what it holds now and what the run needs (None when the machine's
        memory cannot be read and no budget is set).

    Raises:
        UserError: it does not fit; the line gives the figures and, where it would fit, LoRA's.
    """
    room = host_room(host_budget_bytes(spec.memory))
    if room is None:
        return None
    device = torch.device("cpu")
    request = _plan_request(spec, model_dir, device, precision, (0, room), user_moments)
    need = cpu_host_need(request)
    if need <= room:
        return request.host_baseline_bytes + need
    budget = spec.memory.max_host_memory_gb
    where = (
        f"trainer.max_host_memory_gb={budget:g} less the "
        f"{_size(request.host_baseline_bytes)} the process holds"
        if budget is not None
        else "the host memory available (MemAvailable, cgroup limit)"
    )
    offer, rank = "", OFFERED_LORA_RANK
    if request.policy.lora is None and request.policy.shape.linears:
        lora_need = cpu_host_need(_with_lora(request, rank))
        if lora_need <= room:
            offer = f"; LoRA would fit: actor_rollout_ref.model.lora_rank={rank} needs ~{_size(lora_need)}"
    raise RunDoesNotFit(
        f"`{spec.actor.source.path}` does not fit this process's host memory for this run: training on "
        f"CPU needs ~{_size(need)} (models, optimizer states, one sequence's activations, checkpoint "
        f"staging), over the {_size(room)} left within {where}{offer}; raise "
        "trainer.max_host_memory_gb, free host memory, or train on a GPU (docs/memory.md)",
        rank if offer else None,
    )


def _size(num_bytes: int) -> str:
    return f"{num_bytes / 1e9:.1f} GB" if num_bytes >= 10**9 else f"{num_bytes / 1e6:.0f} MB"


def _with_lora(request: PlanRequest, rank: int) -> PlanRequest:
    return with_lora(
        request, {name: Lora(rank, t.shape.lora_params(rank)) for name, t in request.trainees.items()}
    )


def _moments_dtype(value: str | None, key: str) -> torch.dtype | None:
    if value is None:
        return None
    if value not in MOMENTS_DTYPES:
        raise UserError(f"`{key}={value}`: choose float32 or bfloat16 (null lets the memory plan decide)")
    return MOMENTS_DTYPES[value]


def _explicit_precision(spec: RunSpec) -> dict[str, str]:
    """The precision keys the user set, as they wrote them (for error messages)."""
    settings = {
        "actor_rollout_ref.model.dtype": spec.memory.weights_dtype,
        "actor_rollout_ref.actor.optim.moments_dtype": spec.actor.optim.moments_dtype,
        "critic.optim.moments_dtype": spec.critic.optim.moments_dtype,
    }
    return {key: value for key, value in settings.items() if value not in (None, "auto")}


def build_residency(
    plan: MemoryPlan | None,
    device: torch.device,
    *,
    ref: nn.Module | None,
    engine_copy: nn.Module | None,
    teachers: nn.Module | None = None,
    trained: Mapping[str, tuple[nn.Module, torch.optim.Optimizer | None]],
) -> Residency:
    """The models the plan parks outside their phases (none without a plan).

    `trained` maps each trained model's name to its module and optimizer. A parked model's optimizer
    travels with it unless its moments are offloaded already (they wait in CPU memory anyway, and would
    otherwise be copied into a second host buffer).
    """
    models: dict[str, ParkedModel] = {}
    if plan is not None:
        if plan.park_reference and ref is not None:
            models["reference"] = ParkedModel(ref, device)
        if plan.park_teachers and teachers is not None:
            models["teacher"] = ParkedModel(teachers, device)
        if plan.park_engine_copy and engine_copy is not None:
            models["engine_copy"] = ParkedModel(engine_copy, device)
        for name, (module, optimizer) in trained.items():
            planned = plan.trainees.get(name)
            if planned is not None and planned.parked:
                kept = None if planned.offload_optimizer else optimizer
                models[name] = ParkedModel(module, device, kept)
    return Residency(models)


def sharded_rank_plan(
    spec: RunSpec,
    model_dir: str,
    device: torch.device,
    precision: Precision,
    shard_size: int,
    offload: frozenset[str] = frozenset(),
) -> ShardedRankPlan:
    """What one rank of a data-parallel run holds with its models built from shards
    (`relm.memory.sharded_plan`; `offload`: the trained models FSDP2 offloads to CPU memory), and, on CPU
    under `trainer.max_host_memory_gb`, a check that it fits.

    Raises:
        RunDoesNotFit: on CPU, the rank's models alone exceed the budget less what the process holds.
    """
    request = _plan_request(spec, model_dir, device, precision, (0, 0), {"actor": None, "critic": None})
    vllm = spec.engine.name == "vllm"
    engine = pick_dtype(spec.engine.dtype, device) if device.type == "cuda" else precision.master
    plan = plan_sharded_rank(
        request,
        shard_size,
        reference_dtype=precision.compute,
        engine_dtype=None if vllm else engine,
        one_process_engine_dtype=None if vllm or engine == precision.master else engine,
        tp_size=spec.engine.tensor_parallel_size,
        offload=offload,
    )
    budget = host_budget_bytes(spec.memory)
    room = None if budget is None or device.type != "cpu" else budget - request.host_baseline_bytes
    if room is not None and max(plan.steady, plan.startup) > room:
        raise RunDoesNotFit(
            f"`{spec.actor.source.path}` does not fit each rank's host memory: {plan.describe()}, over the "
            f"{_size(room)} left within trainer.max_host_memory_gb={spec.memory.max_host_memory_gb:g}; "
            "raise it or use more ranks (trainer.n_gpus_per_node)",
            None,
        )
    return plan
