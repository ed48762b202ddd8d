"""How a run fits on one GPU: precision, what waits in CPU memory, checkpointing, micro-batch budgets.

Users of other RL frameworks hand-tune memory per model: lower the engine's share for a 3B model,
shorten prompts for a 7B, switch optimizers for a 9B. The arithmetic behind those choices is simple
enough to do once, before any weight is loaded, from the shapes of the models (P actor parameters,
C critic parameters) and the run's lengths. Bytes a parameter:

- a trained model (actor, critic) holds weights and gradients of the weights' dtype (w = 4 for fp32
  master weights, 2 for bf16), the bf16 copies autocast caches of fp32 weights while it computes
  (2, none for bf16 weights; where training compiles the norms and MLPs, as it does on a GPU, only the
  eagerly cast attention projections keep one: `ModelShape.autocast_cached_params`), and two AdamW
  moments (8 in fp32, 4 in bf16);
- frozen copies hold 2: the reference model, and the engine's bf16 copy of the policy (the engine copy), which exists only
  beside fp32 master weights (bf16 weights are generated on directly); the distillation teachers, frozen models of
  their own shapes, hold 2 a parameter of theirs (4 where the run computes in fp32, as the reference does);
- activations of one micro-batch, per token: without gradient checkpointing every layer keeps its
  intermediate tensors; with it only each layer's input stays and one layer is recomputed at a time,
  plus the output head's bf16 logits and their gradient, and 2 GiB of log-softmax scratch.

Each update is its own phase, and the plan checks both, and one moment before them: while the engine's
bf16 copy is made, tensor by tensor, beside the actor's weights (`_startup_bytes`; below every update
measured so far). During the actor's update the GPU holds the
actor's (2w + 2 or 2w) P, its moments (or one 2 GiB chunk of them when they wait in CPU memory and
step chunk by chunk), the frozen copies, and the idle critic's weights and moments. During the
critic's update the actor holds only its weights (its gradients are freed, its autocast copies
dropped at the phase change) and its moments if resident, beside the critic's full update. Whatever
waits in CPU memory is pinned (it cannot be swapped, and pinned copies run at full PCIe speed) and
stays allocated between trips: offloaded moments, parked models (a parked critic with its moments),
and their sum must stay within `HOST_SHARE` of the machine's memory.

The plan walks rungs of precision, cheapest loss first, and within each rung arrangements of rising
transfer cost: park the reference, then the teachers, then the engine copy, then the critic (each moved once a step),
then keep the actor's moments in CPU memory, then the critic's too (moved every optimizer step):

1. fp32 master weights and fp32 moments (nothing given up);
2. fp32 master weights, bf16 moments (`relm.learner.compact_adamw`: fp32 step, bf16 storage);
3. bf16 weights with stochastically rounded updates and bf16 moments, no engine copy.

The first arrangement that leaves room for a comfortable actor micro-batch (one sequence plus 8,192
tokens with checkpointing) wins, else the first that holds one sequence; the first rung with either
is the plan. Worked on one H200 (torch reports 150,754,820,096 B: 128.1e9 usable; 126 GiB host,
94.7e9 pinnable), 512-token sequences: a Qwen2.5-7B GRPO actor (P = 7.62e9) keeps rung 1 with its
moments offloaded (108.8e9 on the GPU, 60.9e9 pinned); 7B PPO needs rung 2; Gemma-2-9b GRPO keeps
rung 1 by parking the reference (one sequence fits, a comfortable batch does not); Gemma-2-9b PPO
needs rung 3 (tests/unit/test_memory_plan.py has the sums).

With the memory left the plan prefers no gradient checkpointing (about a third less compute) when a
micro-batch of at least two full sequences fits without it. A setting the user made explicitly
(`model.dtype`, `optim.moments_dtype`, `enable_gradient_checkpointing`, `ppo_max_token_len_per_gpu`)
is kept; the plan only reports what it estimates for it.

Measured on the H200 against this arithmetic (2026-12-02, `relm bench step` Qwen2.5-7B GRPO 16 x 4,
512-token rows, checkpointing; docs/benchmarks.md): full fine-tuning 90.45 GiB against 95.69 planned at the
step's largest micro-batch, LoRA rank 64 48.08 GiB against 52.62; tests/unit/test_memory_plan.py works both
out.

The per-token activation constants are calibrated on an H200 (Qwen2.5-1.5B shape, 16,384 packed
tokens, fp32 master weights under bf16 autocast: 86 GB peak without checkpointing) and rounded up;
a plan is an estimate, so a phase that still runs out of memory is retried with half the micro-batch
(forwards: `relm.trainer.experience`; updates: `relm.learner.microbatch_retry`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import torch

from relm.memory.cpu_batching import CPU_CHUNK_VALUES
from relm.memory.host_allocator import KEEP_FACTOR
from relm.memory.model_shape import ModelShape

__all__ = [
    "POLICY",
    "Lora",
    "MemoryPlan",
    "ModelShape",
    "PlanDoesNotFit",
    "PlanRequest",
    "Rung",
    "TraineePlan",
    "TraineeRequest",
    "cpu_host_need",
    "lora_offer",
    "plan_memory",
    "with_lora",
]

GIB = 1 << 30
USABLE_SHARE = 0.85
"""Share of the GPU a plan fills: the rest is the CUDA context, allocator fragmentation and kernels'
workspaces."""
HOST_SHARE = 0.7
"""Share of host memory that pinned buffers may take: the process, the data and the OS need the rest,
and pinned pages cannot be swapped."""
LOGIT_SCRATCH_BYTES = 2 * GIB
"""fp32 vocabulary chunks of the chunked log-softmax and its recomputation in backward."""
OPTIMIZER_CHUNK_BYTES = 2 * GIB
"""AdamW moments brought to the GPU at once when they are offloaded (`OffloadedOptimizerStates`). The
compact step's fp32 scratch (`compact_adamw.SLICE_ELEMENTS`, ~1 GiB) comes after the backward pass,
in the room the micro-batch's activations and the log-softmax scratch had."""
MIN_TOKENS_WITHOUT_CHECKPOINTING = 8192
MAX_TOKENS_PER_MICROBATCH = 65536
FP32, BF16 = torch.float32, torch.bfloat16
OFFERED_LORA_RANK = 64
"""The rank the "does not fit" message offers (verl's and TRL's 7B examples use 32-64)."""


@dataclass(frozen=True)
class Lora:
    """A trained model with LoRA: a frozen base and `num_trainable_params` fp32 trainable parameters."""

    rank: int
    num_trainable_params: int
    """r * (in + out) per target Linear (`ModelShape.lora_params`), plus a value model's head."""


@dataclass(frozen=True)
class TraineeRequest:
    """One trained model's side of the arithmetic: its shape and what the user fixed for it."""

    shape: ModelShape
    moments_dtype: torch.dtype | None = None
    """The user's `optim.moments_dtype`; None: planned."""
    checkpointing: bool | None = None
    """The user's `enable_gradient_checkpointing`; None: planned."""
    max_tokens: int | None = None
    """The user's `ppo_max_token_len_per_gpu`; None: planned (read for the policy, whose update the token
    budget is planned for)."""
    lora: Lora | None = None
    """LoRA on this model: the base is frozen in the trained weights' dtype, the adapters train in fp32
    with fp32 moments, and a policy's reference is its own base (no copy)."""


POLICY = "actor"
"""The trained model the engine generates with: its update sets the token budget, its reference and the
engine's copy are the frozen models the plan prices."""


@dataclass(frozen=True)
class PlanRequest:
    """The run's side of the arithmetic."""

    trainees: Mapping[str, TraineeRequest]
    """Per trained model (`Trainee.name`): the policy (`actor`) first, then any other (`critic`)."""
    has_reference: bool
    max_sequence_length: int
    """Prompt plus response tokens of the longest row."""
    gpu_bytes: int
    host_bytes: int
    """Physical memory of the machine: parked models and offloaded moments live there (pinned)."""
    generation_dtype: torch.dtype | None = BF16
    """dtype the engine generates in with its own copy of the actor when the trained weights are in
    another; None where it never copies (it generates in the training dtype, or vLLM keeps its own)."""
    weights_dtype: torch.dtype | None = None
    """The trained weights as the user fixed them (`model.dtype`); None: planned (fp32 master weights
    under bf16 autocast first, bf16 weights last)."""
    autocast: bool = True
    """fp32 weights compute in bf16 under autocast (`model.dtype=auto` on a GPU); else in fp32."""
    compiled_layers: bool = False
    """Training runs the norms and dense MLPs as compiled pieces (`actor.use_torch_compile` on a GPU,
    `relm.models.fused_layers`): autocast then caches bf16 copies of the other Linear layers only
    (`ModelShape.autocast_cached_params`); else of every weight."""
    host_baseline_bytes: int = 0
    """What the process holds in host memory before loading (torch, CUDA's host side, the data)."""
    saves_checkpoints: bool = True
    """Checkpoints are saved: each trained model's weights are staged in host memory while written."""
    cpu_rows_per_microbatch: int = 1
    """CPU runs: responses per forward/backward (`actor.ppo_micro_batch_size_per_gpu` or relm's default)."""
    response_length: int = 0
    """CPU runs: response tokens of the longest row; the training forwards hold logits for all of them."""
    cpu_microbatches_per_step: int = 1
    """CPU runs: forward/backward passes of the actor's update a step (every mini-batch's micro-batches,
    every epoch); past one, the heap keeps freed memory between them (`cpu_logit_bytes`)."""
    teacher_params: int = 0
    """Parameters of the frozen distillation teachers together (`distillation.teacher_models`), held in the
    compute dtype like the reference; 0 without distillation."""

    def __post_init__(self) -> None:
        if next(iter(self.trainees), None) != POLICY:
            raise ValueError(f"a plan request lists the policy ({POLICY!r}) first, got {list(self.trainees)}")

    @property
    def policy(self) -> TraineeRequest:
        return self.trainees[POLICY]

    @property
    def lora(self) -> dict[str, Lora]:
        """The trained models with LoRA."""
        return {name: t.lora for name, t in self.trainees.items() if t.lora is not None}


@dataclass(frozen=True)
class Rung:
    """One precision the run can train at."""

    weights: torch.dtype
    moments: Mapping[str, torch.dtype]
    """Dtype of each trained model's AdamW moments."""


@dataclass
class TraineePlan:
    """What the plan decided for one trained model."""

    checkpointing: bool
    """Gradient checkpointing during its updates."""
    moments_dtype: torch.dtype = FP32
    offload_optimizer: bool = False
    """Its AdamW moments live in CPU memory and step on the GPU a chunk at a time."""
    parked: bool = False
    """It waits in CPU memory (with its moments) outside its own phases."""
    lora: Lora | None = None


@dataclass
class MemoryPlan:
    """What the planner decided, with the estimates behind it (bytes)."""

    trainees: dict[str, TraineePlan]
    """Per trained model, the policy (`actor`) first."""
    max_tokens_per_microbatch: int
    """The token budget of the policy's micro-batches (a critic's follows it unless the user set its own)."""
    rung: Rung
    park_reference: bool = False
    park_teachers: bool = False
    park_engine_copy: bool = False
    engine_copy: bool = False
    """The engine generates with its own copy of the actor (fp32 master weights)."""
    update_peak_bytes: int = 0
    """The actor update's peak at the planned micro-batch token budget."""
    update_fixed_bytes: int = 0
    """The actor update's bytes that do not grow with the micro-batch (weights, grads, moments, scratch)."""
    update_bytes_per_token: int = 0
    """Activation bytes per micro-batch token of the actor update."""
    startup_peak_bytes: int = 0
    """GPU bytes while the engine's own copy of the actor is made (0 without a copy): the run's peak when
    it is above the update's (LoRA)."""
    budget_bytes: int = 0
    host_bytes: int = 0
    """Pinned CPU memory the plan takes: offloaded moments and parked models."""
    host_budget_bytes: int = 0
    host_peak_bytes: int = 0
    """The process's predicted peak in host memory: what it held before loading, the pinned buffers, and
    a checkpoint's staging (pageable)."""
    checkpoint_staging_bytes: int = 0
    given_up: list[str] = field(default_factory=list)
    """The precision the plan lowered to fit (empty when nothing was given up or the user chose it)."""
    notes: list[str] = field(default_factory=list)
    fp32_bytes: dict[str, int] = field(default_factory=dict)
    """What fp32 would have needed, for the lines that say what was given up: `actor moments`,
    `critic moments` (8 bytes a parameter) and `weights` (fp32 master weights and gradients, 8)."""

    @property
    def policy(self) -> TraineePlan:
        return self.trainees[POLICY]

    def update_peak_at(self, tokens: int) -> int:
        """The actor update's predicted peak when its largest micro-batch computes `tokens` tokens (a step's
        batch may hold fewer than the budget allows: the prediction to compare a measurement with)."""
        return (
            self.update_fixed_bytes
            + min(tokens, self.max_tokens_per_microbatch) * self.update_bytes_per_token
        )

    def gpu_peak_at(self, tokens: int) -> int:
        """The run's predicted GPU peak: the larger of the start-up's and the actor update's at `tokens`."""
        return max(self.startup_peak_bytes, self.update_peak_at(tokens))

    def describe(self) -> str:
        """The lines printed before the first step."""
        parked = [
            name
            for name, on in (
                ("reference", self.park_reference),
                ("teachers", self.park_teachers),
                ("engine copy", self.park_engine_copy),
            )
            if on
        ] + [name for name, t in self.trainees.items() if t.parked]
        checkpointing = ", ".join(
            f"{'on' if t.checkpointing else 'off'} ({name})" for name, t in self.trainees.items()
        )
        lines = [
            f"memory plan: actor update peak ~{self.update_peak_bytes / GIB:.1f} GiB of "
            f"{self.budget_bytes / GIB:.1f} GiB usable; ~{self.host_bytes / GIB:.1f} GiB of "
            f"{self.host_budget_bytes / GIB:.1f} GiB pinnable host memory (host peak "
            f"~{self.host_peak_bytes / GIB:.1f} GiB with {self.checkpoint_staging_bytes / GIB:.1f} GiB of "
            "checkpoint staging)",
            f"  micro-batches of at most {self.max_tokens_per_microbatch} tokens; gradient checkpointing "
            f"{checkpointing}",
            f"  waiting on the CPU outside their phases: {', '.join(parked) if parked else 'nothing'}",
            f"  {self._weights_line()}",
        ]
        lines += [f"  {name}'s AdamW moments: {self._moments_line(name)}" for name in self.trainees]
        for name, t in self.trainees.items():
            if t.lora is not None:
                lines.append(
                    f"  {name}: LoRA rank {t.lora.rank}, {t.lora.num_trainable_params / 1e6:.1f}M trainable "
                    "parameters (fp32 with fp32 moments); the base frozen"
                    + ("; the reference is the base with adapters off" if name == POLICY else "")
                )
        if self.startup_peak_bytes:
            lines.append(
                f"  start-up peak ~{self.startup_peak_bytes / GIB:.1f} GiB while the engine's copy is made "
                "from the actor's weights"
            )
        return "\n".join(lines + [f"  {note}" for note in self.notes])

    def _weights_line(self) -> str:
        if self.policy.lora is not None:
            copy = (
                "; the engine generates with its own copy, adapters merged at each sync"
                if self.engine_copy
                else ""
            )
            return f"trained weights: the actor's LoRA adapters in fp32 on its frozen {_short(self.rung.weights)} base{copy}"
        if self.rung.weights == FP32:
            copy = "; the engine generates with a bf16 copy" if self.engine_copy else ""
            return f"trained weights: fp32 master weights{copy}"
        if self.rung.weights == BF16:
            return (
                "trained weights: bf16, AdamW updates stochastically rounded, generated on directly "
                f"(fp32 master weights and gradients would need ~{self.fp32_bytes['weights'] / GIB:.0f} GiB)"
            )
        return f"trained weights: {str(self.rung.weights).removeprefix('torch.')}"

    def _moments_line(self, name: str) -> str:
        trainee = self.trainees[name]
        if trainee.lora is not None:
            return "fp32, of the LoRA adapters only"
        where = "in CPU memory, stepped in chunks" if trainee.offload_optimizer else "on the GPU"
        line = f"{_short(trainee.moments_dtype)}, {where}"
        if trainee.moments_dtype != FP32:
            line += f" (fp32 moments would need ~{self.fp32_bytes[f'{name} moments'] / GIB:.0f} GiB)"
        return line


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.").replace("bfloat16", "bf16").replace("float32", "fp32")


class PlanDoesNotFit(ValueError):
    """No precision and arrangement holds one sequence (or the host cannot pin what must wait there)."""


@dataclass(frozen=True)
class _Layout:
    """Bytes one arrangement at one rung holds: per trained model's update phase on the GPU, and pinned on
    the host."""

    phases: Mapping[str, int]
    """GPU bytes through each trained model's update, before its activations (the policy's first)."""
    startup: int
    """GPU bytes while the engine's copy is made (`_startup_bytes`), which no arrangement changes."""
    host: int
    parked: frozenset[str]
    offloaded: frozenset[str]


def plan_memory(request: PlanRequest) -> MemoryPlan:
    """Decide precision, parking, moment offload, checkpointing and the micro-batch token budget.

    Raises:
        PlanDoesNotFit: nothing holds one sequence; the message names what does not fit.
    """
    budget = int(request.gpu_bytes * USABLE_SHARE)
    host_budget = int(request.host_bytes * HOST_SHARE)
    request = replace(
        request,
        trainees={
            name: replace(t, shape=t.shape.with_lora_inputs()) if t.lora is not None else t
            for name, t in request.trainees.items()
        },
    )
    policy = request.policy
    smallest_need = _per_token(policy.shape, True) * request.max_sequence_length + LOGIT_SCRATCH_BYTES
    comfortable = smallest_need + _per_token(policy.shape, True) * MIN_TOKENS_WITHOUT_CHECKPOINTING
    # the other models' updates must hold one checkpointed sequence beside what their phase keeps
    needs = {
        name: _per_token(t.shape, True) * request.max_sequence_length
        for name, t in request.trainees.items()
        if name != POLICY
    }

    staging = _checkpoint_staging(request) if request.saves_checkpoints else 0

    def fits(layout: _Layout, need: int) -> bool:
        others_fit = all(layout.phases[name] + needs[name] <= budget for name in needs)
        host_fits = layout.host <= host_budget and layout.host + staging <= request.host_bytes
        startup_fits = layout.startup <= budget
        return layout.phases[POLICY] + need <= budget and others_fit and host_fits and startup_fits

    rungs = _rungs(request)
    chosen, layouts = None, []
    for rung in rungs:
        layouts = [_layout(request, rung, *arrangement) for arrangement in _arrangements(request, rung)]
        chosen = next((x for x in layouts if fits(x, comfortable)), None)
        chosen = chosen or next((x for x in layouts if fits(x, smallest_need)), None)
        if chosen is not None:
            break
    if chosen is None:
        raise PlanDoesNotFit(
            _why_not(
                _closest(layouts, budget, host_budget, smallest_need, needs),
                budget,
                host_budget,
                smallest_need,
                needs,
                staging,
                request,
            )
        )

    free = budget - chosen.phases[POLICY] - LOGIT_SCRATCH_BYTES
    checkpointing, max_tokens = _budget(policy.shape, free, request.max_sequence_length, policy.checkpointing)
    trainees = {}
    for name, t in request.trainees.items():
        if name != POLICY:
            # a model other than the policy checkpoints unless the policy's token budget fits without
            checkpointing_of, _ = _budget(
                t.shape, budget - chosen.phases[name], request.max_sequence_length, t.checkpointing,
                tokens=max_tokens,
            )  # fmt: skip
        else:
            checkpointing_of = checkpointing
        trainees[name] = TraineePlan(
            checkpointing=checkpointing_of,
            moments_dtype=rung.moments[name],
            offload_optimizer=name in chosen.offloaded,
            parked=name in chosen.parked,
            lora=t.lora,
        )
    plan = MemoryPlan(
        trainees=trainees,
        max_tokens_per_microbatch=max_tokens,
        rung=rung,
        park_reference="reference" in chosen.parked,
        park_teachers="teachers" in chosen.parked,
        park_engine_copy="engine copy" in chosen.parked,
        engine_copy=_engine_copy_bytes(request, rung) > 0,
        budget_bytes=budget,
        host_bytes=chosen.host,
        host_budget_bytes=host_budget,
        host_peak_bytes=request.host_baseline_bytes + chosen.host + staging,
        checkpoint_staging_bytes=staging,
        startup_peak_bytes=chosen.startup,
        given_up=_given_up(request, rung),
        fp32_bytes={
            **{f"{name} moments": 8 * t.shape.num_params for name, t in request.trainees.items()},
            "weights": 8 * sum(t.shape.num_params for t in request.trainees.values()),
        },
    )
    if policy.max_tokens is not None:
        if policy.max_tokens > max_tokens:
            plan.notes.append(
                f"ppo_max_token_len_per_gpu={policy.max_tokens} is kept; the plan estimates at most "
                f"{max_tokens} fit"
            )
        plan.max_tokens_per_microbatch = policy.max_tokens
    plan.update_fixed_bytes = chosen.phases[POLICY] + LOGIT_SCRATCH_BYTES
    plan.update_bytes_per_token = _per_token(policy.shape, plan.policy.checkpointing)
    plan.update_peak_bytes = plan.update_peak_at(plan.max_tokens_per_microbatch)
    return plan


def _rungs(request: PlanRequest) -> list[Rung]:
    """fp32 everything, then bf16 moments, then bf16 weights; what the user fixed stays fixed."""
    rungs: list[Rung] = []
    # a LoRA model's adapters keep fp32 moments on every rung (they are small); the last rung loads its
    # frozen base in bf16
    for weights, moments in ((FP32, FP32), (FP32, BF16), (BF16, BF16)):
        weights = request.weights_dtype or weights
        if weights not in (FP32, BF16):  # fp16: torch's AdamW, moments in the weights' dtype
            rung = Rung(weights, {name: weights for name in request.trainees})
        else:
            rung = Rung(
                weights,
                {
                    name: FP32 if t.lora is not None else (t.moments_dtype or moments)
                    for name, t in request.trainees.items()
                },
            )
        if rung not in rungs:
            rungs.append(rung)
    return rungs


def _arrangements(request: PlanRequest, rung: Rung) -> list[tuple[frozenset[str], frozenset[str]]]:
    """(parked, offloaded) by rising transfer cost, without arrangements that would repeat another: park
    the reference, the engine copy, then each model but the policy; offload the policy's moments, then
    each other model's."""
    parkable = [
        name
        for name, present in (
            ("reference", _has_reference_copy(request)),
            ("teachers", request.teacher_params > 0),
            ("engine copy", _engine_copy_bytes(request, rung) > 0),
        )
        if present
    ] + [name for name in request.trainees if name != POLICY]
    offloadable = list(request.trainees)
    return [
        (frozenset(parkable[:parked]), frozenset(offloadable[:offloaded]))
        for offloaded in range(len(offloadable) + 1)
        for parked in range(len(parkable) + 1)
    ]


def _layout(request: PlanRequest, rung: Rung, parked: frozenset[str], offloaded: frozenset[str]) -> _Layout:
    """The bytes of one arrangement (see the module docstring for what each phase holds)."""
    P = request.policy.shape.num_params  # noqa: N806 - the docstring's name
    compute = 2 if (rung.weights == FP32 and request.autocast) or rung.weights != FP32 else 4
    frozen = {
        "reference": compute * P if _has_reference_copy(request) else 0,
        "teachers": compute * request.teacher_params,
        "engine copy": _engine_copy_bytes(request, rung) * P,
    }
    resident_frozen = sum(size for name, size in frozen.items() if name not in parked)
    trained = {name: _trained_bytes(request, rung, name) for name in request.trainees}

    def idle(name: str) -> int:
        """What a model holds on the GPU while another one updates."""
        if name in parked:
            return 0
        return trained[name].idle + (0 if name in offloaded else trained[name].moments)

    phases = {}
    for name, own in trained.items():
        gpu_moments = min(OPTIMIZER_CHUNK_BYTES, own.moments) if name in offloaded else own.moments
        others = sum(idle(other) for other in trained if other != name)
        phases[name] = own.updating + gpu_moments + resident_frozen + others
    host = sum(frozen[name] for name in parked if name in frozen)
    for name, own in trained.items():
        host += own.moments if name in offloaded or name in parked else 0
        host += own.idle if name in parked else 0
    return _Layout(phases, _startup_bytes(request, rung, trained[POLICY]), host, parked, offloaded)


def _startup_bytes(request: PlanRequest, rung: Rung, policy: _Trained) -> int:
    """GPU bytes while the engine's own copy is made: the policy's weights beside the copy, which is built
    tensor by tensor in the generation dtype (`relm.models.precision.copy_in_dtype`; a LoRA layer is merged
    in fp32 one at a time, `relm.learner.lora.without_adapters`), so beyond the copy only one fp32 tensor is
    in flight, at most the vocabulary matrix. Nothing else is loaded yet (the reference, a critic and the
    optimizers come after). No copy: nothing beyond the updates.

    Until 2026-12-02 the copy was a deep copy of the fp32 policy cast afterwards, 2 (4 P + 4 T) on the
    Qwen2.5-7B shape at rank 64: 57.94 GiB, the LoRA run's measured peak of 58.76 GiB. Now it is
    4 P + 4 T + 2 P + 4 V H, below that run's update."""
    engine_copy = _engine_copy_bytes(request, rung)
    if engine_copy == 0:
        return 0
    shape = request.policy.shape
    return policy.idle + engine_copy * shape.num_params + 4 * shape.vocab_size * shape.hidden_size


@dataclass(frozen=True)
class _Trained:
    """Bytes of one trained model: through its update (weights, gradients, autocast's copies), while
    another model updates (weights), and its AdamW moments."""

    updating: int
    idle: int
    moments: int


def _trained_bytes(request: PlanRequest, rung: Rung, name: str) -> _Trained:
    """Full fine-tuning: 2w P + autocast's copies through the update, w P idle, 2 m P of moments. Autocast
    keeps a bf16 copy of each fp32 weight it casts until the step's optimizer clears its cache: 2 P, or
    under compiled training pieces 2 A, the attention projections' A parameters (the compiled norms and
    MLPs cast inside their graphs; measured on the H200 with checkpointing, the 7B update held no copies
    of the MLPs: 90.5 GiB where 2 P more would have been 99 GiB and up). LoRA: the frozen
    base in the trained weights' dtype (w (P - head): the loader's dtype, fp32 master weights or bf16 at the
    last rung; autocast caches casts of trainable leaves only, so the frozen base has no bf16 copies) and fp32
    trainable parameters T (PEFT keeps adapters in fp32 under a bf16 base) with gradients, autocast's copies
    and moments: w (P - head) + (8 + autocast) T, w (P - head) + 4 T idle, 8 T."""
    trainee = request.trainees[name]
    shape = trainee.shape
    w = rung.weights.itemsize
    autocast = 2 if rung.weights == FP32 and request.autocast else 0
    if trainee.lora is None:
        m = rung.moments[name].itemsize
        P = shape.num_params  # noqa: N806
        cached = (
            shape.autocast_cached_params if request.compiled_layers and shape.autocast_cached_params else P
        )
        return _Trained(2 * w * P + autocast * cached, w * P, 2 * m * P)
    base, T = w * (shape.num_params - shape.head_params), trainee.lora.num_trainable_params  # noqa: N806
    lora_autocast = 2 if request.autocast else 0
    return _Trained(base + (8 + lora_autocast) * T, base + 4 * T, 8 * T)


def _has_reference_copy(request: PlanRequest) -> bool:
    """A LoRA actor's reference is its own base with the adapters off: no copy."""
    return request.has_reference and request.policy.lora is None


def _checkpoint_staging(request: PlanRequest) -> int:
    """Host bytes a checkpoint stages at once: `save_pretrained` gathers one model's weights as bytes in
    host memory (safetensors), and torch.save copies one optimizer tensor at a time (the largest is a
    moment of the embedding). LoRA models save their adapters only."""
    largest = 0
    for t in request.trainees.values():
        weights = 4 * t.lora.num_trainable_params if t.lora else 4 * t.shape.num_params
        largest = max(largest, weights + (0 if t.lora else 4 * t.shape.vocab_size * t.shape.hidden_size))
    return largest


CPU_FULL_LOGIT_COPIES = 2
"""[rows, response + 1, vocabulary] fp32 tensors live at a CPU update's peak: the logits and their
gradient (the vocabulary chunks' gradients joined in one concatenation)."""
CPU_CHUNK_COPIES = 4
"""Intermediates of one vocabulary chunk (`CPU_CHUNK_VALUES`) live beside them: the chunk's recomputed
log-softmax and its gradient in the backward, the entropy metric's softmax and products in the forward.
Measured on README's verl block (glibc's `mallinfo2` sampled every 5 ms, `bench/host_memory_trace.py`,
2026-12-06): 364.5 MiB allocated at the update's peak above the 294.1 MiB held between micro-batches: two
[1, 257, 151,665] copies (297.4 MiB), four chunks of 27 positions (62.5 MiB) and 4.6 MiB of activations,
which the plan counts on their own."""


def cpu_logit_bytes(vocab_size: int, rows: int, response_length: int, microbatches: int = 1) -> int:
    """Host bytes a CPU update's vocabulary-sized tensors take at the peak: the live ones
    (`CPU_FULL_LOGIT_COPIES` full copies of the micro-batch's logits, `CPU_CHUNK_COPIES` chunk
    intermediates), and, where a step's update runs `microbatches` > 1 passes, the freed memory the heap
    keeps between them.

    A CPU run keeps freed memory in the heap rather than fault it in again each micro-batch. One pass
    reuses its own freed blocks; over many, the blocks land in holes of other sizes and the heap grows,
    until the resident free memory between micro-batches passes `KEEP_FACTOR` times what the first left
    (its own working set: the live bytes above) and is given back
    (`relm.memory.host_allocator.release_heap_fragments`). So at the peak a run of several passes holds
    the live bytes and up to `KEEP_FACTOR` times them free, (1 + KEEP_FACTOR) times the live bytes in all;
    README's GSM8K tour (one pass of 8 rows a step) peaked at the live bytes, its verl block (32 passes of
    one row) 0.1-0.2 GiB under the bound (docs/benchmarks.md)."""
    positions = rows * (response_length + 1)
    # a chunk: whole rows of `response_length` positions where one fits, else part of a row (the padded
    # forward's blocks, `relm.learner.forward`)
    per_chunk, width = max(1, CPU_CHUNK_VALUES // vocab_size), max(1, response_length)
    chunk_positions = min(rows, per_chunk // width) * width if per_chunk >= width else per_chunk
    live = 4 * vocab_size * (CPU_FULL_LOGIT_COPIES * positions + CPU_CHUNK_COPIES * chunk_positions)
    return int((1 + KEEP_FACTOR) * live) if microbatches > 1 else live


CPU_LATE_BYTES = 64 * 2**20
"""Host memory a CPU run takes after the plan is made besides the tokenizer: the dataset's rows and token
ids, the reward manager, torch's first-use kernels and thread pools (the demo: ~0.07 GiB)."""
CPU_TOKENIZER_BYTES_PER_ENTRY = 1600
"""The tokenizer's tables per vocabulary entry (Qwen2.5's 151,665 entries: ~0.23 GiB, measured)."""


def cpu_host_need(request: PlanRequest) -> int:
    """Host bytes a run on CPU needs: every model resident in fp32 (no autocast, no engine copy), the larger
    of the update phases with one micro-batch's fp32 activations and vocabulary-sized logits, what the run
    loads after the plan (the tokenizer, the data), and a checkpoint's staging.

    The logits dominate at large vocabularies: 16 responses of 256 tokens at Qwen2.5's 151,665 entries
    are 2.5 GB per fp32 copy, which is why CPU runs default to fewer rows per micro-batch
    (`relm.memory.cpu_batching`)."""
    layout = _layout(request, _rungs(request)[0], frozenset(), frozenset())
    checkpointing = bool(request.policy.checkpointing)
    rows = request.cpu_rows_per_microbatch
    need = max(
        layout.phases[name]
        + rows * 2 * t.shape.activation_bytes_per_token(checkpointing) * request.max_sequence_length
        + cpu_logit_bytes(
            t.shape.vocab_size, rows, request.response_length, request.cpu_microbatches_per_step
        )
        for name, t in request.trainees.items()
    )
    late = CPU_LATE_BYTES + CPU_TOKENIZER_BYTES_PER_ENTRY * request.policy.shape.vocab_size
    return need + late + (_checkpoint_staging(request) if request.saves_checkpoints else 0)


def lora_offer(request: PlanRequest, rank: int = OFFERED_LORA_RANK) -> str | None:
    """The clause a "does not fit" message adds when LoRA of `rank` (all-linear) on every fully trained
    model would fit: the key to set and the figure that plan needs; None when it would not fit either."""
    added = {
        name: Lora(rank, t.shape.lora_params(rank))
        for name, t in request.trainees.items()
        if t.lora is None and t.shape.linears
    }
    if not added:
        return None
    try:
        plan = plan_memory(with_lora(request, added))
    except PlanDoesNotFit:
        return None
    keys = " and ".join(f"{LORA_KEYS.get(name, name)}.lora_rank={rank}" for name in added)
    base = " with the base in bf16" if plan.rung.weights == BF16 and request.weights_dtype is None else ""
    return (
        f"LoRA would fit: {keys} (all-linear{base}) trains {sum(x.num_trainable_params for x in added.values()) / 1e6:.0f}M "
        f"parameters and needs ~{plan.update_peak_bytes / GIB:.0f} GiB on the GPU and "
        f"~{plan.host_bytes / GIB:.0f} GiB of pinned host memory"
    )


LORA_KEYS = {POLICY: "actor_rollout_ref.model", "critic": "critic.model"}
"""The config section of each trained model's `lora_rank`."""


def with_lora(request: PlanRequest, lora: Mapping[str, Lora]) -> PlanRequest:
    """`request` with LoRA on the trained models `lora` names."""
    return replace(
        request,
        trainees={
            name: replace(t, lora=lora[name]) if name in lora else t for name, t in request.trainees.items()
        },
    )


def _closest(
    layouts: list[_Layout], budget: int, host_budget: int, smallest_need: int, needs: Mapping[str, int]
) -> _Layout:
    """The arrangement a refusal speaks of: the first that fits the GPU and the pinned share (only the
    checkpoint's staging is then over), else the most frugal."""
    return next(
        (
            x
            for x in layouts
            if x.startup <= budget
            and x.phases[POLICY] + smallest_need <= budget
            and all(x.phases[name] + need <= budget for name, need in needs.items())
            and x.host <= host_budget
        ),
        layouts[-1],
    )


def _why_not(
    layout: _Layout,
    budget: int,
    host_budget: int,
    smallest_need: int,
    needs: Mapping[str, int],
    staging: int,
    request: PlanRequest,
) -> str:
    """One clause on the most frugal arrangement of the last rung: what still does not fit."""
    if layout.startup > budget:
        return (
            f"making the engine's copy holds the actor's weights twice, ~{layout.startup / GIB:.0f} GiB, over "
            f"{budget / GIB:.0f} GiB usable"
        )
    if layout.phases[POLICY] + smallest_need > budget:
        return (
            f"the actor's update needs ~{(layout.phases[POLICY] + smallest_need) / GIB:.0f} GiB for one sequence "
            f"of {request.max_sequence_length} tokens with everything else on the CPU, over "
            f"{budget / GIB:.0f} GiB usable"
        )
    for name, need in needs.items():
        if layout.phases[name] + need > budget:
            return (
                f"the {name}'s update needs ~{(layout.phases[name] + need) / GIB:.0f} GiB beside the "
                f"actor's weights, over {budget / GIB:.0f} GiB usable"
            )
    waiting = sorted(layout.parked) + [f"{name}'s AdamW moments" for name in sorted(layout.offloaded)]
    if layout.host <= host_budget:
        held = f"keeping the {', '.join(waiting)} on the CPU needs" if waiting else "the plan pins"
        return (
            f"{held} ~{layout.host / GIB:.0f} GiB of host memory and a checkpoint stages ~{staging / GIB:.0f} GiB more, over the "
            f"{request.host_bytes / GIB:.0f} GiB this process may use"
        )
    return (
        f"keeping the {', '.join(waiting)} on the CPU needs ~{layout.host / GIB:.0f} GiB of host memory, "
        f"over {HOST_SHARE:.0%} of this machine's {request.host_bytes / GIB:.0f} GiB"
    )


def _given_up(request: PlanRequest, rung: Rung) -> list[str]:
    lost = []
    if request.weights_dtype is None and rung.weights != FP32:
        if all(t.lora is not None for t in request.trainees.values()):
            lost.append("the LoRA base held in bf16 instead of fp32 (the adapters train in fp32)")
        else:
            lost.append(
                "weights trained in bf16 with stochastically rounded updates instead of fp32 master weights"
            )
    planned = [
        name
        for name, t in request.trainees.items()
        if t.moments_dtype is None and rung.moments[name] != FP32 and rung.weights in (FP32, BF16)
    ]
    if planned:
        lost.append(f"{' and '.join(planned)} AdamW moments stored in bf16 instead of fp32")
    return lost


def _engine_copy_bytes(request: PlanRequest, rung: Rung) -> int:
    """Bytes a parameter of the engine's own copy: none where it generates on the trained weights."""
    dtype = request.generation_dtype
    return 0 if dtype is None or dtype == rung.weights else dtype.itemsize


def _per_token(shape: ModelShape, checkpointing: bool) -> int:
    # activations plus the bf16 logits of the position and their gradient
    return shape.activation_bytes_per_token(checkpointing) + 4 * shape.vocab_size


def _budget(
    shape: ModelShape, free: int, sequence: int, user_checkpointing: bool | None, tokens: int | None = None
) -> tuple[bool, int]:
    """(checkpointing, token budget): off when two sequences and 8k tokens fit without it."""
    without = free // _per_token(shape, False)
    if user_checkpointing is False or (
        user_checkpointing is None
        and without >= max(2 * sequence, MIN_TOKENS_WITHOUT_CHECKPOINTING, tokens or 0)
    ):
        return False, _round(min(without, MAX_TOKENS_PER_MICROBATCH), sequence)
    with_checkpointing = free // _per_token(shape, True)
    return True, _round(min(with_checkpointing, MAX_TOKENS_PER_MICROBATCH), sequence)


def _round(tokens: int, sequence: int) -> int:
    """Whole kilo-tokens, never below one sequence (a longer row goes alone anyway)."""
    return max(sequence, tokens // 1024 * 1024)
