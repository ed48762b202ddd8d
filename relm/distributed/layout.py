"""How each model of a data-parallel run is laid over the ranks: replicated, sharded, or both.

verl's key `fsdp_config.fsdp_size` (actor, reference, critic) names the ranks one copy of a model is
sharded over; the copies replicate it over the rest (world size / fsdp_size of them):

- `fsdp_size=1`: every rank holds the whole model (replicated). Each update all-reduces the gradients
  once per optimizer step and nothing else crosses ranks: no weights are gathered in forward or
  backward. The fastest layout whenever the model fits one GPU.
- `fsdp_size=-1` (verl's default) or the world size: sharded over all ranks (FSDP). Weights, gradients
  and AdamW states take 1/W of the memory each, paid for with an all-gather of each block's weights
  per pass and a reduce-scatter of its gradients.
- a divisor in between: copies of `fsdp_size` ranks each (HSDP), sharded within a copy and replicated
  across copies.
- unset (relm's default): planned. When the memory plan of a single-GPU run of the same config
  (`relm.memory.plan`) keeps every model on its GPU, each rank holds the whole model and
  runs that plan on its own rows (its gradient-checkpointing choice and token budgets); otherwise the
  model is sharded over all ranks, as verl does. On CPU there is no plan: sharded.

Every layout is FSDP2 (`fully_shard`): sharded over a 1-D mesh of all ranks, or over the "shard" dim
of a 2-D ("replicate", "shard") mesh, whose shard dim has size 1 when replicated (HSDP with one-rank
shards). Replicating through FSDP2 rather than DDP keeps one code path for every layout: the same
DTensor parameters, grad-norm clipping, `MixedPrecisionPolicy` (so the numerics of a replicated run
are those of a sharded one, held to the same parity tests), gradient accumulation without
communication (`set_requires_gradient_sync`), weight sync and DCP checkpoints. A checkpoint records
tensors by name whatever the layout, so a replicated run resumes a sharded run's checkpoint and the
reverse. DDP would wrap the model (parameter names gain a `module.` prefix that the weight sync, the
checkpoints and the memory plan would have to strip) and would bring autocast back beside FSDP's
casting, two precision schemes to keep in parity instead of one.
"""

from __future__ import annotations

from dataclasses import dataclass

from relm.config.fsdp_size import SHARD_OVER_ALL, check_fsdp_size


@dataclass(frozen=True)
class Layout:
    """How one model is spread over `world_size` ranks, and why."""

    shard_size: int
    """Ranks one copy of the model is sharded over (1: every rank holds it whole)."""
    world_size: int
    reason: str
    """Why: the key the user set, or what the memory plan found."""
    offload: bool = False
    """FSDP2's CPU offload: the shards, gradients and optimizer step live in CPU memory (the user's
    `fsdp_config.offload_policy`, or relm's choice where it is unset: `relm.memory.sharded_plan`)."""

    @property
    def num_copies(self) -> int:
        return self.world_size // self.shard_size

    @property
    def replicated(self) -> bool:
        return self.shard_size == 1

    def kind(self) -> str:
        if self.replicated:
            return "replicated"
        offload = ", shards in CPU memory" if self.offload else ""
        if self.num_copies == 1:
            return f"sharded over {self.shard_size} ranks{offload}"
        return f"sharded over {self.shard_size} ranks, {self.num_copies} copies{offload}"


def decide_layout(
    value: int | None, *, key: str, world_size: int, plan_fits: bool, plan_reason: str
) -> Layout:
    """One model's layout: the user's `fsdp_size` when set, else the plan's choice.

    Args:
        value: the model's `fsdp_size` (None: unset).
        key: its config key, for messages.
        world_size: data-parallel ranks.
        plan_fits: a single-GPU run keeps every model on one GPU (`relm.memory.choices`).
        plan_reason: what the plan found, said in the start-up line.
    """
    check_fsdp_size(value, key=key, world_size=world_size)
    if value is None:
        return Layout(1 if plan_fits else world_size, world_size, plan_reason)
    shard_size = world_size if value == SHARD_OVER_ALL else value
    return Layout(shard_size, world_size, f"fsdp_size={value} in the config")


def describe_layouts(layouts: dict[str, Layout]) -> str:
    """The one start-up line: how many ranks, and how each model sits on them.

    Example: "data parallel: 2 ranks, each holds the whole actor and reference (replicated; the memory
    plan fits one GPU)".
    """
    world_size = next(iter(layouts.values())).world_size
    groups: dict[tuple[str, str], list[str]] = {}
    for name, layout in layouts.items():
        groups.setdefault((layout.kind(), layout.reason), []).append(name)
    parts = []
    for (kind, reason), names in groups.items():
        models = " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
        if kind == "replicated":
            parts.append(f"each holds the whole {models} (replicated; {reason})")
        else:
            parts.append(f"the {models} {kind} ({reason})")
    return f"data parallel: {world_size} ranks, " + "; ".join(parts)
