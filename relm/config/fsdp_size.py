"""The `fsdp_size` keys and the values a run can use: config arithmetic, checked before anything starts.

It sits in config/ rather than beside the layouts it feeds (`relm.distributed.layout`) because
validation checks it and config/ is below distributed/: the check needs only the world size, no
process group.
"""

from __future__ import annotations

from relm.errors import UserError

SHARD_OVER_ALL = -1
"""verl's `fsdp_size` for "shard over every rank"."""

FSDP_SIZE_KEYS = {
    "actor": "actor_rollout_ref.actor.fsdp_config.fsdp_size",
    "reference": "actor_rollout_ref.ref.fsdp_config.fsdp_size",
    "critic": "critic.model.fsdp_config.fsdp_size",
}
"""The config key that lays out each model."""


def check_fsdp_size(value: int | None, *, key: str, world_size: int) -> None:
    """An `fsdp_size` the run can use: unset, -1, or a positive divisor of the world size.

    Raises:
        UserError: naming the key, the world size and the values that work.
    """
    if value is None or value == SHARD_OVER_ALL:
        return
    if value < 1 or world_size % value:
        divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
        raise UserError(
            f"`{key}={value}` must divide the {world_size} data-parallel ranks; use one of "
            f"{', '.join(map(str, divisors))}, -1 (shard over all ranks) or leave it unset (relm's plan decides)"
        )
