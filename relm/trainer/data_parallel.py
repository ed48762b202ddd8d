"""The PPO step's data-parallel glue: which rows this rank computes on, and putting results back together.

Every rank holds the step's whole experience (the rollout engine gathers it, see
`relm.distributed.rollout`). Forward passes (old/reference logprobs, values) and updates run on this
rank's rows only (`rank_rows`); forward results are gathered back into the whole batch, so advantage
estimation runs on the global batch on every rank and needs no distributed statistics: GRPO groups,
GAE's batch-wide whitening and the KL controller see exactly what one process would. In a
single-process run each function here is the identity.

`choose_layouts` decides, once at start-up, whether each model is replicated or sharded over the
ranks (`relm.distributed.layout`), and whether FSDP2 offloads a sharded model to CPU memory where the
user left `fsdp_config.offload_policy` unset (`relm.memory.sharded_plan.decide_offload`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import replace

import torch

from relm.config.fsdp_size import FSDP_SIZE_KEYS
from relm.config.specs import RunSpec
from relm.distributed.balance import partition_rows
from relm.distributed.context import DistContext
from relm.distributed.layout import Layout, decide_layout, describe_layouts
from relm.learner.batch import Advantaged, Rollout
from relm.learner.minibatch import ADDITIVE_METRICS
from relm.learner.trainee import Trainee
from relm.memory.choices import (
    MemoryChoices,
    data_parallel_choices,
    data_parallel_plan,
    device_memory,
    gpu_budget_bytes,
    host_budget_bytes,
    sharded_rank_plan,
)
from relm.memory.host import process_rss_bytes
from relm.memory.plan import MemoryPlan
from relm.memory.sharded_plan import decide_offload
from relm.models.precision import Precision

logger = logging.getLogger("relm")


def choose_layouts(
    spec: RunSpec,
    model_dir: str,
    dist: DistContext,
    precision: Precision,
    *,
    has_reference: bool,
    has_critic: bool,
) -> tuple[dict[str, Layout], MemoryPlan | None]:
    """How the actor, the reference and the critic sit on the ranks, and the single-GPU plan that the
    replicated ones follow (None when it does not hold every model whole on one GPU); logs the one
    start-up line that says so.

    The plan is the one a single-GPU run of the same config would make on this GPU, from the models'
    configs, before anything is loaded or sharded.
    """
    plan, reason = data_parallel_plan(spec, model_dir, dist.device)
    values = {
        "actor": spec.actor.sharding.shard_size,
        "reference": spec.reference.shard_size,
        "critic": spec.critic.sharding.shard_size,
    }
    # CPU offload is asked for to save GPU memory: a planned layout then shards (the reference is
    # offloaded with the actor).
    offloaded = {
        "actor": spec.actor.sharding.offload_policy,
        "reference": spec.actor.sharding.offload_policy,
        "critic": spec.critic.sharding.offload_policy,
    }
    names = ["actor", *(["reference"] if has_reference else []), *(["critic"] if has_critic else [])]
    layouts = {
        name: decide_layout(
            values[name],
            key=FSDP_SIZE_KEYS[name],
            world_size=dist.world_size,
            plan_fits=plan is not None and not offloaded[name],
            plan_reason="offload_policy=true in the config" if offloaded[name] else reason,
        )
        for name in names
    }
    if dist.device.type == "cuda" and plan is None and any(lay.replicated for lay in layouts.values()):
        logger.warning("%s: the replicated models follow the config's memory settings, not a plan", reason)
    layouts = choose_offload(spec, model_dir, dist, precision, layouts)
    logger.info("%s", describe_layouts(layouts))
    return layouts, plan


OFFLOAD_KEYS = {
    "actor": "actor_rollout_ref.actor.fsdp_config.offload_policy",
    "critic": "critic.model.fsdp_config.offload_policy",
}


def choose_offload(
    spec: RunSpec, model_dir: str, dist: DistContext, precision: Precision, layouts: dict[str, Layout]
) -> dict[str, Layout]:
    """`layouts` with FSDP2's CPU offload where the user asked for it, or left it unset and the sharded
    models fit this GPU only with it (`decide_offload`, said in one line); the reference follows the actor.

    On a GPU with the actor sharded; elsewhere only the user's value counts (on CPU it is an error). The
    host's room is the least any rank sees, so that every rank decides alike.
    """
    user = {"actor": spec.actor.sharding.offload_policy, "critic": spec.critic.sharding.offload_policy}
    trained = [name for name in ("actor", "critic") if name in layouts]
    offload: set[str] = {name for name in trained if user[name] and not layouts[name].replicated}
    memory = device_memory(dist.device)
    actor = layouts["actor"]
    if memory is not None and not actor.replicated:
        card_bytes, host_bytes = memory
        if (gpu_budget := gpu_budget_bytes(spec.memory)) is not None:
            card_bytes = min(card_bytes, gpu_budget)
        local_ranks = spec.loop.n_gpus_per_node
        if (host_budget := host_budget_bytes(spec.memory)) is not None:
            host_bytes = min(host_bytes, local_ranks * max(host_budget - process_rss_bytes(), 0))
        host_bytes = int(-dist.max_floats([-float(host_bytes)])[0])
        free = {name for name in trained if user[name] is None and not layouts[name].replicated}
        on_card, offloaded = (
            sharded_rank_plan(
                spec, model_dir, dist.device, precision, actor.shard_size, offload=frozenset(models)
            )
            for models in (offload, offload | free)
        )
        chosen, line = decide_offload(
            on_card,
            offloaded,
            card_bytes=card_bytes,
            host_bytes=host_bytes,
            local_ranks=local_ranks,
            user=None if free else bool(offload),
            key=OFFLOAD_KEYS["actor" if "actor" in free or not free else "critic"],
        )
        if line is not None:
            (logger.info if chosen else logger.warning)("%s", line)
        if chosen:
            offload |= free
    if "actor" in offload:
        offload.add("reference")
    return {name: replace(layout, offload=name in offload) for name, layout in layouts.items()}


def data_parallel_memory(
    spec: RunSpec, plan: MemoryPlan | None, precision: Precision, layouts: dict[str, Layout]
) -> MemoryChoices:
    """`data_parallel_choices` for these layouts; logs which replicated models follow the plan."""
    replicated = {name: layout.replicated for name, layout in layouts.items() if name != "reference"}
    memory = data_parallel_choices(spec, plan, precision, replicated=replicated)
    if memory.plan is not None:
        followers = [name for name, on in replicated.items() if on]
        logger.info(
            "%s\n  data parallel: the replicated %s follow this plan; sharded models, the config's settings",
            memory.plan.describe(),
            " and ".join(followers),
        )
    return memory


def rank_rows(
    batch: Rollout, dist: DistContext, trainees: list[Trainee], *, balance: bool
) -> torch.Tensor | None:
    """This rank's rows of the step (see `relm.distributed.balance`), or None in a single-process run.

    Chunks are the largest row count that divides every trainee's mini-batch, so each rank's local
    mini-batches are its parts of the global ones for every trained model. `balance` is
    `trainer.balance_batch`.
    """
    if not dist.is_distributed:
        return None
    chunk = math.gcd(*(trainee.batching.rows_per_minibatch for trainee in trainees))
    parts = partition_rows(
        batch.attention_mask.sum(-1),
        world_size=dist.world_size,
        chunk_rows=min(chunk, len(batch)),
        balance=balance,
    )
    return parts[dist.rank]


def on_rank_rows(
    dist: DistContext,
    batch: Rollout,
    rows: torch.Tensor | None,
    compute: Callable[[Rollout], torch.Tensor],
) -> torch.Tensor:
    """`compute` over this rank's `rows`, gathered into the whole batch's [N, ...] result on every rank."""
    if rows is None:
        return compute(batch)
    return gather_rows(dist, len(batch), rows, compute(batch.select(rows)))


def gather_rows(
    dist: DistContext, num_rows: int, rows: torch.Tensor | None, local: torch.Tensor
) -> torch.Tensor:
    """Every rank's `local` [len(rows), ...] result for its `rows`, as the whole batch's [num_rows, ...] on every
    rank (`local` itself in a single-process run)."""
    if rows is None:
        return local
    local = local.cpu()
    merged = torch.empty((num_rows, *local.shape[1:]), dtype=local.dtype)
    for part_rows, part in dist.gather_objects((rows, local)):
        merged[part_rows] = part
    return merged


def local_rows(batch: Advantaged, rows: torch.Tensor | None) -> Advantaged:
    """The rows this rank updates with (the whole batch in a single-process run)."""
    return batch if rows is None else batch.select(rows)


def reduce_update_metrics(metrics: dict[str, list[float]], dist: DistContext) -> dict[str, list[float]]:
    """One value per mini-batch for the whole run, from each rank's per-mini-batch values.

    Losses (`ADDITIVE_METRICS`) are each rank's share of the global mini-batch loss, so they are summed;
    ratios and fractions are averaged over ranks; grad norm and lr are the same on every rank.
    """
    if not dist.is_distributed:
        return metrics
    names = sorted(metrics)  # the same order on every rank
    summed = iter(dist.sum_floats([v for name in names for v in metrics[name]]))
    reduced: dict[str, list[float]] = {}
    for name in names:
        values = [next(summed) for _ in metrics[name]]
        if name.split("/", 1)[-1] not in ADDITIVE_METRICS:
            values = [v / dist.world_size for v in values]
        reduced[name] = values
    return reduced
