"""How a run fits on one GPU: gradient checkpointing, micro-batch token budgets, and what waits on the CPU.

Users of other RL frameworks hand-tune memory per model: lower the engine's share for a 3B model,
shorten prompts for a 7B. The arithmetic behind those choices is simple enough to do once, before
the first step, from what the run holds:

- trainable models (actor, critic): fp32 master weights, fp32 gradients and two fp32 AdamW states,
  16 bytes a parameter, resident on the GPU through their update;
- frozen copies (reference model, the engine's bf16 generator copy): 2 bytes a parameter;
- activations of one micro-batch, per token: without gradient checkpointing every layer keeps its
  intermediate tensors; with it only each layer's input stays and one layer is recomputed at a time;
- the output head's logits for the micro-batch's response positions (bf16, and their gradient).

The plan keeps everything on the GPU when it fits; otherwise it parks, in this order, the reference
model, the engine's generator copy and the critic (with its optimizer states) in CPU memory outside
the phases that use them (`relm.training.offload`). With the remaining memory it prefers no
gradient checkpointing (about a third less compute) when a micro-batch of at least two full sequences
fits without it. A setting the user made explicitly (`enable_gradient_checkpointing`,
`ppo_max_token_len_per_gpu`) is kept; the plan only reports what it estimates for it.

The per-token activation constants are calibrated on an H200 (Qwen2.5-1.5B shape, 16,384 packed
tokens, fp32 master weights under bf16 autocast: 86 GB peak without checkpointing) and rounded up;
a plan is an estimate, so a phase that still runs out of memory is retried with half the micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

GIB = 1 << 30
USABLE_SHARE = 0.9
"""Share of the GPU a plan fills: the rest is the CUDA context, allocator fragmentation and kernels'
workspaces."""
HOST_SHARE = 0.7
"""Share of host memory parked models may take (pinned pages cannot be swapped)."""
LOGIT_SCRATCH_BYTES = 2 * GIB
"""fp32 vocabulary chunks of the chunked log-softmax and its recomputation in backward."""
MIN_TOKENS_WITHOUT_CHECKPOINTING = 8192
MAX_TOKENS_PER_MICROBATCH = 65536


@dataclass(frozen=True)
class ModelShape:
    """What the arithmetic needs of a model."""

    num_params: int
    num_layers: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int

    @classmethod
    def of(cls, model: nn.Module) -> ModelShape:
        backbone = getattr(model, "backbone", model)  # a value model wraps its causal LM
        config = backbone.config.get_text_config()
        hidden = config.hidden_size
        return cls(
            num_params=sum(p.numel() for p in model.parameters()),
            num_layers=config.num_hidden_layers,
            hidden_size=hidden,
            intermediate_size=getattr(config, "intermediate_size", None) or 4 * hidden,
            vocab_size=config.vocab_size,
        )

    def activation_bytes_per_token(self, checkpointing: bool) -> int:
        """Bytes one token's activations keep through a forward+backward (bf16 compute)."""
        one_layer = 2 * (12 * self.hidden_size + 6 * self.intermediate_size)
        if checkpointing:
            # each layer's fp32 residual input, plus one layer's full set while it is recomputed
            return self.num_layers * 4 * self.hidden_size + one_layer
        return self.num_layers * one_layer


@dataclass(frozen=True)
class PlanRequest:
    """The run's side of the arithmetic."""

    actor: ModelShape
    critic: ModelShape | None
    has_reference: bool
    has_generator_copy: bool
    """The engine generates with its own bf16 copy (a GPU run with fp32 master weights)."""
    max_sequence_length: int
    """Prompt plus response tokens of the longest row."""
    gpu_bytes: int
    host_bytes: int
    """Physical memory of the machine: parked models live there (pinned)."""
    user_checkpointing: bool | None = None
    user_critic_checkpointing: bool | None = None
    user_max_tokens: int | None = None


@dataclass
class MemoryPlan:
    """What the planner decided, with the estimates behind it (bytes)."""

    gradient_checkpointing: bool
    critic_gradient_checkpointing: bool
    max_tokens_per_microbatch: int
    park_reference: bool = False
    park_generator: bool = False
    park_critic: bool = False
    update_peak_bytes: int = 0
    budget_bytes: int = 0
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """The lines printed before the first step."""
        parked = [
            name
            for name, on in (
                ("reference", self.park_reference),
                ("generator copy", self.park_generator),
                ("critic", self.park_critic),
            )
            if on
        ]
        lines = [
            f"memory plan: actor update peak ~{self.update_peak_bytes / GIB:.1f} GiB of "
            f"{self.budget_bytes / GIB:.1f} GiB usable",
            f"  micro-batches of at most {self.max_tokens_per_microbatch} tokens; gradient checkpointing "
            f"{'on' if self.gradient_checkpointing else 'off'} (actor), "
            f"{'on' if self.critic_gradient_checkpointing else 'off'} (critic)",
            f"  waiting on the CPU outside their phases: {', '.join(parked) if parked else 'nothing'}",
        ]
        return "\n".join(lines + [f"  {note}" for note in self.notes])


class PlanDoesNotFit(ValueError):
    """Even with everything parked and checkpointing on, one sequence does not fit; the message says why."""


def plan_memory(request: PlanRequest) -> MemoryPlan:
    """Decide parking, checkpointing and the micro-batch token budget for one GPU.

    Raises:
        PlanDoesNotFit: the actor's own update cannot hold one sequence.
    """
    budget = int(request.gpu_bytes * USABLE_SHARE)
    actor, critic = request.actor, request.critic
    resident = {
        "actor": 16 * actor.num_params,
        "reference": 2 * actor.num_params if request.has_reference else 0,
        "generator copy": 2 * actor.num_params if request.has_generator_copy else 0,
        # outside its own update the critic keeps weights and AdamW states (no gradients)
        "critic": 12 * critic.num_params if critic else 0,
    }
    smallest_need = _per_token(actor, True) * request.max_sequence_length + LOGIT_SCRATCH_BYTES
    parked: set[str] = set()
    for name in ("reference", "generator copy", "critic"):
        if _resident(resident, parked) + smallest_need <= budget:
            break
        if resident[name]:
            parked.add(name)
    static = _resident(resident, parked)
    parked_bytes = sum(resident[name] for name in parked)
    if parked_bytes > HOST_SHARE * request.host_bytes:
        raise PlanDoesNotFit(
            f"parking the {', '.join(sorted(parked))} on the CPU needs ~{parked_bytes / GIB:.0f} GiB of host "
            f"memory, over {HOST_SHARE:.0%} of this machine's {request.host_bytes / GIB:.0f} GiB"
        )
    if static + smallest_need > budget:
        raise PlanDoesNotFit(
            f"the actor's update needs ~{(static + smallest_need) / GIB:.0f} GiB for one sequence of "
            f"{request.max_sequence_length} tokens with everything else on the CPU, over "
            f"{budget / GIB:.0f} GiB usable"
        )
    free = budget - static - LOGIT_SCRATCH_BYTES
    checkpointing, max_tokens = _budget(actor, free, request.max_sequence_length, request.user_checkpointing)
    plan = MemoryPlan(
        gradient_checkpointing=checkpointing,
        critic_gradient_checkpointing=checkpointing,
        max_tokens_per_microbatch=max_tokens,
        park_reference="reference" in parked,
        park_generator="generator copy" in parked,
        park_critic="critic" in parked,
        budget_bytes=budget,
    )
    if critic is not None:
        # The critic updates while the actor keeps weights and AdamW states (its gradients are freed).
        critic_static = static - resident["critic"] * ("critic" not in parked) + 16 * critic.num_params
        critic_static -= 4 * actor.num_params
        critic_need = _per_token(critic, True) * request.max_sequence_length
        if critic_static + critic_need > budget:
            raise PlanDoesNotFit(
                f"the critic's update needs ~{(critic_static + critic_need) / GIB:.0f} GiB beside the actor's "
                f"weights and optimizer states, over {budget / GIB:.0f} GiB usable"
            )
        plan.critic_gradient_checkpointing, _ = _budget(
            critic, budget - critic_static, request.max_sequence_length, request.user_critic_checkpointing,
            tokens=max_tokens,
        )  # fmt: skip
    if request.user_max_tokens is not None:
        if request.user_max_tokens > max_tokens:
            plan.notes.append(
                f"ppo_max_token_len_per_gpu={request.user_max_tokens} is kept; the plan estimates at most "
                f"{max_tokens} fit"
            )
        plan.max_tokens_per_microbatch = request.user_max_tokens
    plan.update_peak_bytes = (
        static
        + LOGIT_SCRATCH_BYTES
        + plan.max_tokens_per_microbatch * _per_token(actor, plan.gradient_checkpointing)
    )
    return plan


def _resident(resident: dict[str, int], parked: set[str]) -> int:
    return sum(size for name, size in resident.items() if name not in parked)


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
