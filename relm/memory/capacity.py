"""How large a model relm trains on a number of cards of one size, from the memory plan's arithmetic.

One card: the single-GPU plan (`relm.memory.plan.plan_memory`: precision rungs, parking, AdamW moments in
CPU memory, checkpointing) holds one sequence. Several cards, as a data-parallel run lays its models out
(`relm.distributed.layout`): replicated where that plan holds every model whole in fp32 on the GPU
(`whole_model_plan`), else sharded over all W ranks (FSDP2, built from shards, fp32 weights and moments:
`relm.memory.sharded_plan`), where one rank's share must fit its card's usable share:

    per rank = 16 P / W + 2 P / W + 2 (P - T + T / N) + 4 V H        (shards, bf16 reference, generation
               + 4 (P - 2 V H) / L + 4 V H                             copy split over N, one fp32 parameter
               + a (one checkpointed sequence) + 2 GiB log-softmax     in flight; two gathered bf16 blocks
                                                                       and the gathered root; activations)

or, where it does not, with FSDP2's CPU offload as the run decides it (`decide_offload`): the first two
terms leave the card, and the machine's memory must hold them for all W ranks, 18 P in all, within
`HOST_SHARE` of it. N, the generation copy's tensor-parallel size (`rollout.tensor_model_parallel_size`),
is the largest of 1, 2, 4, 8 that divides W and the model's attention and key/value heads. The
generation's KV cache takes what is left (the engines decode fewer rows at a time when it is short), so it
is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from relm.memory.choices import whole_model_plan
from relm.memory.model_shape import ModelShape
from relm.memory.plan import (
    POLICY,
    USABLE_SHARE,
    MemoryPlan,
    PlanDoesNotFit,
    PlanRequest,
    TraineeRequest,
    plan_memory,
)
from relm.memory.sharded_plan import ShardedRankPlan, decide_offload, plan_sharded_rank

BF16 = torch.bfloat16
TP_SIZES = (8, 4, 2, 1)


@dataclass(frozen=True)
class Candidate:
    """A model the table may name: its shape and head counts."""

    name: str
    shape: ModelShape
    num_heads: int
    num_kv_heads: int


@dataclass(frozen=True)
class Fit:
    """How a model fits a number of cards."""

    layout: str
    """"one GPU's plan: ...", "replicated: ..." or "sharded over W, generation split over N"."""
    rank_bytes: int
    """One rank's bytes at the update's peak with one checkpointed sequence: the plan's fixed bytes (without
    the micro-batch's activations, which take what is left), or the sharded arithmetic's."""
    offloaded_bytes: int = 0
    """What FSDP2's CPU offload keeps in the machine's memory for all its ranks (0: nothing offloaded)."""


def tensor_parallel_size(candidate: Candidate, num_ranks: int) -> int:
    """The largest of 8, 4, 2, 1 dividing the ranks and the model's attention and key/value heads."""
    return next(
        n
        for n in TP_SIZES
        if num_ranks % n == 0 and candidate.num_heads % n == 0 and candidate.num_kv_heads % n == 0
    )


def sharded_rank_bytes(shape: ModelShape, num_ranks: int, tp_size: int, sequence_length: int) -> int:
    """One rank's bytes at the actor update's peak with the models sharded over `num_ranks` (module
    docstring): GRPO-style, actor and reference, generation copy in bf16 split over `tp_size`."""
    return sharded_rank(shape, num_ranks, tp_size, sequence_length).card


def sharded_rank(
    shape: ModelShape, num_ranks: int, tp_size: int, sequence_length: int, *, offload: bool = False
) -> ShardedRankPlan:
    """The sharded plan of one rank (`sharded_rank_bytes`), the actor and reference offloaded or not."""
    request = PlanRequest(
        trainees={"actor": TraineeRequest(shape)},
        has_reference=True,
        max_sequence_length=sequence_length,
        gpu_bytes=0,
        host_bytes=0,
    )
    return plan_sharded_rank(
        request,
        num_ranks,
        reference_dtype=BF16,
        engine_dtype=BF16,
        one_process_engine_dtype=BF16,
        tp_size=tp_size,
        offload=frozenset({"actor"} if offload else ()),
    )


def fit(
    candidate: Candidate, num_cards: int, card_bytes: int, host_bytes: int, sequence_length: int
) -> Fit | None:
    """How `candidate` trains (GRPO with a reference) on `num_cards` cards of `card_bytes`, or None.

    `host_bytes`: the machine's memory, where the single-GPU plan may keep AdamW moments and parked models.
    """
    request = PlanRequest(
        trainees={"actor": TraineeRequest(candidate.shape)},
        has_reference=True,
        max_sequence_length=sequence_length,
        gpu_bytes=card_bytes,
        host_bytes=host_bytes,
        generation_dtype=BF16,
        compiled_layers=True,
    )
    if num_cards == 1:
        try:
            plan = plan_memory(request)
        except PlanDoesNotFit:
            return None
        return Fit(f"one GPU's plan: {_choices(plan)}", plan.update_fixed_bytes)
    whole, _ = whole_model_plan(request)
    if whole is not None:
        return Fit("replicated: fp32, all on each GPU", whole.update_fixed_bytes)
    tp_size = tensor_parallel_size(candidate, num_cards)
    split = f", generation split over {tp_size}" if tp_size > 1 else ""
    on_card = sharded_rank(candidate.shape, num_cards, tp_size, sequence_length)
    offloaded = sharded_rank(candidate.shape, num_cards, tp_size, sequence_length, offload=True)
    offload, _ = decide_offload(
        on_card,
        offloaded,
        card_bytes=card_bytes,
        host_bytes=host_bytes,
        local_ranks=num_cards,
        user=None,
        key="",
    )
    if offload:
        host = num_cards * offloaded.offloaded
        return Fit(f"sharded over {num_cards}{split}, CPU offload", offloaded.card, host)
    if on_card.card > card_bytes * USABLE_SHARE:
        return None
    return Fit(f"sharded over {num_cards}{split}", on_card.card)


def offload_host_bytes(candidate: Candidate, num_cards: int, sequence_length: int) -> int:
    """What FSDP2's CPU offload would keep in the machine's memory for `num_cards` ranks sharding
    `candidate`: 18 P, the actor's fp32 weights, gradients and moments and the bf16 reference."""
    tp_size = tensor_parallel_size(candidate, num_cards)
    rank = sharded_rank(candidate.shape, num_cards, tp_size, sequence_length, offload=True)
    return num_cards * rank.offloaded


def _choices(plan: MemoryPlan) -> str:
    """The single-GPU plan's precision and what it moved to CPU memory, in a few words."""
    moments = plan.rung.moments[POLICY]
    parts = [f"{_short(plan.rung.weights)} weights, {_short(moments)} moments"]
    if plan.policy.offload_optimizer:
        parts.append("moments in CPU memory")
    parked = [
        name
        for name, on in (("reference", plan.park_reference), ("engine copy", plan.park_engine_copy))
        if on
    ]
    if parked:
        parts.append(" and ".join(parked) + " parked")
    return ", ".join(parts)


def _short(dtype: torch.dtype) -> str:
    return "fp32" if dtype == torch.float32 else "bf16" if dtype == BF16 else str(dtype)


def largest(
    candidates: list[Candidate], num_cards: int, card_bytes: int, host_bytes: int, sequence_length: int
) -> tuple[Candidate, Fit] | None:
    """The largest candidate (by parameters) that fits, with how; None when none does."""
    fitting = [
        (c, f)
        for c in candidates
        if (f := fit(c, num_cards, card_bytes, host_bytes, sequence_length)) is not None
    ]
    return max(fitting, key=lambda pair: pair[0].shape.num_params, default=None)
