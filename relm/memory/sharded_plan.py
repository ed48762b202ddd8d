"""What one rank holds when a data-parallel run builds its models from shards.

With sharded construction (`relm.distributed.sharded_load`) a rank never holds a whole fp32 model: the
actor's fp32 weights, gradients and AdamW moments (16 bytes a parameter) and the reference (its compute
dtype's bytes) are 1/S each over a copy of S ranks. What stays whole on every rank is the engine's
generation copy (2 bytes a parameter in bf16 on a GPU, 4 on CPU where generation runs in fp32), whole
but for its attention and MLP projections (T of the P parameters: `ModelShape.tensor_parallel_params`),
which a tensor-parallel copy splits over its N ranks (`rollout.tensor_model_parallel_size`,
`relm.rollout.tensor_parallel`); and, in flight, one whole fp32 parameter while the copy is filled or
synced (at most the vocabulary matrix). So, for P actor parameters and S ranks a copy:

    per rank    = 16 P / S + r P / S + g (P - T + T / N) + 4 V H   (r: the reference's bytes, g: the copy's)
    one process = 16 P + r P + g P                                (g = 0 where it generates on the actor itself)

On CPU (g = 4 with several ranks, 0 in one process, no reference) and N = 1 the ratio tends to
(16 / S + 4) / 16: 0.5 at S = 4, never below 0.25; splitting the copy lowers that floor to the embeddings
and head.

With FSDP2's CPU offload (`fsdp_config.offload_policy`, `CPUOffloadPolicy`) a model's shards, gradients
and AdamW moments live in pinned CPU memory and the optimizer steps there: those bytes leave the card for
the host, 16 P / S + r P / S a rank for the actor and its reference (`offloaded`). On the card stay the
generation copy, the parameter in flight and the update's own bytes: two gathered bf16 blocks and the
gathered root, one checkpointed sequence's activations and the log-softmax scratch (`update_extra`):

    card (offloaded) = g (P - T + T / N) + 4 V H + 4 (P - 2 V H) / L + 4 V H + a + 2 GiB
    host, per rank   = 16 P / S + r P / S

`decide_offload` turns it on where the card does not hold the shards and the machine's memory holds what
all its ranks move there, as the single-GPU plan decides its rungs.

A critic is built from shards too (16 bytes a parameter over S). A model that falls back to loading whole
on every rank (LoRA, weights transformers renames while loading: `relm.distributed.sharded_load`) is not
counted at its whole size here. Gathered blocks, activations and logits come on top: `update_extra`
counts their floor on a GPU (one checkpointed sequence; the micro-batches and the KV cache take what is
left).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from relm.memory.plan import GIB, HOST_SHARE, LOGIT_SCRATCH_BYTES, USABLE_SHARE, PlanRequest

TRAINED_BYTES = 16
"""fp32 weights, gradients and two AdamW moments, bytes a parameter."""


@dataclass(frozen=True)
class ShardedRankPlan:
    """Bytes one rank holds with sharded construction, and one process holding the same models whole."""

    shard_size: int
    trained_shards: int
    """The trained models' fp32 weights, gradients and moments: 16 P / S each."""
    reference_shard: int
    engine_copy: int
    """The generation copy every rank holds (its split projections' share when tensor-parallel)."""
    in_flight: int
    """One whole fp32 parameter gathered at a time (the largest: the vocabulary matrix)."""
    one_process: int
    tp_size: int = 1
    """Ranks the generation copy is split over."""
    offloaded: int = 0
    """Of the shards, the bytes FSDP2's CPU offload keeps in CPU memory (0: none offloaded)."""
    update_extra: int = 0
    """The actor update's bytes beyond the models on a GPU: two gathered bf16 blocks and the gathered root,
    one checkpointed sequence's activations, the log-softmax scratch."""

    @property
    def card(self) -> int:
        """On a GPU at the update's peak: what the offload leaves of the models, and the update's bytes."""
        return self.steady - self.offloaded + self.update_extra

    @property
    def steady(self) -> int:
        """Through training: shards, the whole generation copy, one parameter in flight."""
        return self.trained_shards + self.reference_shard + self.engine_copy + self.in_flight

    @property
    def startup(self) -> int:
        """While the models are built: weights' shards only (no gradients or moments yet)."""
        weights = self.trained_shards // 4
        return weights + self.reference_shard + self.engine_copy + self.in_flight

    def describe(self) -> str:
        offload = f", {_size(self.offloaded)} of them in CPU memory (FSDP2 offload)" if self.offloaded else ""
        return (
            f"sharded construction: each rank holds ~{_size(self.steady)} of models "
            f"({_size(self.trained_shards)} of fp32 weights, gradients and AdamW moments and "
            f"{_size(self.reference_shard)} of reference, over {self.shard_size} ranks; "
            f"{_size(self.engine_copy)} of {self._copy_kind()}{offload}), one process would hold "
            f"{_size(self.one_process)}"
        )

    def _copy_kind(self) -> str:
        return "whole generation copy" if self.tp_size == 1 else f"generation copy split over {self.tp_size}"


def _size(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.2f} GiB" if num_bytes >= 2**30 else f"{num_bytes / 2**20:.1f} MiB"


def plan_sharded_rank(
    request: PlanRequest,
    shard_size: int,
    *,
    reference_dtype: torch.dtype,
    engine_dtype: torch.dtype | None,
    one_process_engine_dtype: torch.dtype | None,
    tp_size: int = 1,
    offload: frozenset[str] = frozenset(),
) -> ShardedRankPlan:
    """The per-rank bytes (module docstring) for the shapes of `request`.

    Args:
        request: the run's shapes (`relm.memory.choices`), fully trained models.
        shard_size: ranks one copy of the actor is sharded over.
        reference_dtype: the reference's dtype (the compute dtype), counted when the run has one.
        engine_dtype: the generation copy's dtype on each rank; None where the engine keeps its own
            weights (vLLM).
        one_process_engine_dtype: the same in one process, where CPU runs generate on the actor itself
            (None).
        tp_size: ranks the generation copy is split over (`rollout.tensor_model_parallel_size`).
        offload: the trained models whose shards FSDP2 offloads to CPU memory ("actor" takes its
            reference along, as `fsdp_config.offload_policy` does).
    """
    policy = request.policy.shape
    P = policy.num_params  # noqa: N806 - the docstring's name
    trained = TRAINED_BYTES * P
    reference = reference_dtype.itemsize * P if request.has_reference else 0
    copy_params = P - policy.tensor_parallel_params + policy.tensor_parallel_params // tp_size
    engine = engine_dtype.itemsize * copy_params if engine_dtype is not None else 0
    one_engine = one_process_engine_dtype.itemsize * P if one_process_engine_dtype is not None else 0
    critic = request.trainees.get("critic")
    critic_trained = TRAINED_BYTES * critic.shape.num_params if critic is not None else 0
    offloaded = (trained + reference if "actor" in offload else 0) + (
        critic_trained if "critic" in offload else 0
    )
    root = 2 * policy.vocab_size * policy.hidden_size  # embeddings and output head (counted untied)
    gathered = 2 * 2 * max(P - root, 0) // policy.num_layers + 2 * root
    activations = policy.activation_bytes_per_token(checkpointing=True) * request.max_sequence_length
    return ShardedRankPlan(
        shard_size=shard_size,
        trained_shards=(trained + critic_trained) // shard_size,
        reference_shard=reference // shard_size,
        engine_copy=engine,
        in_flight=4 * policy.vocab_size * policy.hidden_size,
        one_process=trained + critic_trained + reference + one_engine,
        tp_size=tp_size,
        offloaded=offloaded // shard_size,
        update_extra=gathered + activations + LOGIT_SCRATCH_BYTES,
    )


def decide_offload(
    on_card: ShardedRankPlan,
    offloaded: ShardedRankPlan,
    *,
    card_bytes: int,
    host_bytes: int,
    local_ranks: int,
    user: bool | None,
    key: str,
) -> tuple[bool, str | None]:
    """Whether FSDP2 offloads the shards to CPU memory, and the one line that says why (None: nothing to say).

    Unset (`user` None), the shards stay on the card where `on_card.card` fits its usable share
    (`USABLE_SHARE`, as one GPU's plan), else go to CPU memory where `offloaded.card` fits it and the
    machine holds what its `local_ranks` ranks move there (`offloaded.offloaded` each) within `HOST_SHARE` of
    `host_bytes` (pinned memory, as the single-GPU plan counts it). The user's value is kept; a false that
    does not fit, or a run that fits neither way, is said in the line (the arithmetic is a floor: one
    checkpointed sequence, and the KV cache takes what is left).

    Args:
        on_card: the rank's plan with the shards on the card.
        offloaded: the same with the models that may be offloaded in CPU memory.
        card_bytes: one card's memory (cut by `trainer.max_gpu_memory_gb`).
        host_bytes: the machine's available memory (cut by `trainer.max_host_memory_gb` for each rank).
        local_ranks: ranks on this machine, each offloading its own shards.
        user: `fsdp_config.offload_policy` as set, or None.
        key: that key, for the line.
    """
    usable = int(card_bytes * USABLE_SHARE)
    host_need, host_room = local_ranks * offloaded.offloaded, int(host_bytes * HOST_SHARE)
    fits_on_card = on_card.card <= usable
    fits_offloaded = offloaded.card <= usable and host_need <= host_room
    on = f"~{_gib(on_card.card)} of each card with the shards on it, over the {_gib(usable)} usable"
    off = (
        f"~{_gib(offloaded.card)} with them in CPU memory, where this machine's {local_ranks} ranks keep "
        f"~{_gib(host_need)} of the {_gib(host_room)} it can pin ({HOST_SHARE:.0%} of {_gib(host_bytes)})"
    )
    if user is True:
        return True, None
    if fits_on_card:
        return False, None
    if user is False:
        fix = "; unset it or set it true: that fits" if fits_offloaded else ""
        return False, f"{key}=false in the config: the sharded models need {on}{fix}"
    if fits_offloaded:
        return True, (
            f"FSDP2 CPU offload on ({key} unset): the sharded models need {on}; {off}; "
            f"{key}=false keeps them on the cards"
        )
    return False, (
        f"the sharded models need {on}, and {off}: neither fits, the run may run out of memory; use more "
        "GPUs (trainer.n_gpus_per_node), shorter data.max_response_length, or LoRA (model.lora_rank)"
    )


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / GIB:.1f} GiB"
