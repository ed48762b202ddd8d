"""Data-parallel generation: each rank generates for its share of the prompts; all ranks get every response.

`DataParallelEngine` wraps the rank's own engine (native or HF, generating with a full, unsharded copy
of the actor) behind the same `RolloutEngine` protocol, so the trainer's rollout phase, DAPO's
resampling rounds, ReMax's greedy baseline and validation shard themselves without knowing it.

Shares are contiguous blocks of whole prompts: the `n` samples of a prompt stay on one rank, where the
native engine prefills the prompt once for all of them. After generation every rank holds the whole
batch in prompt order, exactly as one process would have generated it (up to the random draws), so
scoring, advantage estimation and metrics see the global batch on every rank.

With an engine that shards the model itself (vLLM's `tensor_model_parallel_size`), the ranks of one
tensor-parallel group must send the same prompts: `tp_size` makes the share depend on
`rank // tp_size`, and only the first rank of each group contributes its outputs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import torch

from relm.distributed.context import DistContext
from relm.distributed.fsdp import full_named_tensors
from relm.rollout.base import GenerationOutput, RolloutEngine, SamplingParams, concat_outputs

SEED_STRIDE = 1_000_000_007
"""Added to a call's seed once per data-parallel rank, so ranks draw independent samples."""


def share_bounds(num_items: int, num_shares: int, index: int) -> tuple[int, int]:
    """`[start, end)` of share `index` when `num_items` are cut into `num_shares` contiguous blocks whose
    sizes differ by at most one (the first `num_items % num_shares` blocks get the extra item)."""
    base, extra = divmod(num_items, num_shares)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


class DataParallelEngine:
    """A `RolloutEngine` whose `generate` covers all prompts with every rank generating its share.

    Args:
        engine: this rank's engine over a full copy of the actor.
        dist: the run's context; `generate` and `sync_weights` are collectives over it.
        tp_size: ranks per tensor-parallel generation group (1 for the native and HF engines).
    """

    def __init__(self, engine: RolloutEngine, dist: DistContext, *, tp_size: int = 1) -> None:
        if dist.world_size % tp_size:
            raise ValueError(f"tensor-parallel size {tp_size} does not divide {dist.world_size} ranks")
        self.engine = engine
        self.dist = dist
        self.tp_size = tp_size

    @property
    def generator(self) -> torch.Generator | None:
        """The local engine's sampling generator (validation saves and restores it)."""
        return getattr(self.engine, "generator", None)

    @property
    def num_dp_groups(self) -> int:
        return self.dist.world_size // self.tp_size

    @property
    def dp_rank(self) -> int:
        return self.dist.rank // self.tp_size

    def share(self, num_prompts: int) -> tuple[int, int]:
        """`[start, end)` of the prompts this rank generates for."""
        return share_bounds(num_prompts, self.num_dp_groups, self.dp_rank)

    def rank_params(self, params: SamplingParams) -> SamplingParams:
        """`params` with this rank's seed, so ranks draw independent samples."""
        if params.seed is None:
            return params
        return replace(params, seed=params.seed + self.dp_rank * SEED_STRIDE)

    def gather(self, local: Any) -> list[Any]:
        """Every generation group's `local` (picklable, tensors on CPU), in rank order, on every rank."""
        return self.dist.gather_objects(local)[:: self.tp_size]

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> GenerationOutput:
        """All `len(prompts) * params.n` responses, in prompt order, on every rank."""
        start, end = self.share(len(prompts))
        params = self.rank_params(params)
        if end > start:
            local = self.engine.generate(prompts[start:end], params).to_cpu()
        else:  # fewer prompts than ranks (a small validation set)
            local = GenerationOutput.empty(params.max_new_tokens)
        return concat_outputs(self.gather(local))

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Gather each sharded parameter whole, one at a time, and copy it into the local engine."""
        self.engine.sync_weights(full_named_tensors(named_tensors, self.dist.device))

    def release_memory(self) -> None:
        self.engine.release_memory()
