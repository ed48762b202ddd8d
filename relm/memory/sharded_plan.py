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

A critic is built from shards too (16 bytes a parameter over S). A model that falls back to loading whole
on every rank (LoRA, weights transformers renames while loading: `relm.distributed.sharded_load`) is not
counted at its whole size here. Gathered blocks, activations and logits come on top (the update's own
arithmetic, `relm.memory.plan`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from relm.memory.plan import PlanRequest

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
        return (
            f"sharded construction: each rank holds ~{_size(self.steady)} of models "
            f"({_size(self.trained_shards)} of fp32 weights, gradients and AdamW moments and "
            f"{_size(self.reference_shard)} of reference, over {self.shard_size} ranks; "
            f"{_size(self.engine_copy)} of {self._copy_kind()}), one process would hold "
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
    return ShardedRankPlan(
        shard_size=shard_size,
        trained_shards=(trained + critic_trained) // shard_size,
        reference_shard=reference // shard_size,
        engine_copy=engine,
        in_flight=4 * policy.vocab_size * policy.hidden_size,
        one_process=trained + critic_trained + reference + one_engine,
        tp_size=tp_size,
    )
