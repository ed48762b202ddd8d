"""The run's generation copy split over groups of ranks (`rollout.tensor_model_parallel_size=N`).

A data-parallel run of W ranks forms W / N groups of N consecutive ranks (`DistContext.group_mesh`); each
group holds one copy of the generation model split over its ranks (`relm.rollout.tensor_parallel`), every
rank of a group generates the group's share of the prompts with the same seed, and `DataParallelEngine`
keeps the first rank's outputs of each group. Weights reach the copy as they reach a whole one: each
trained parameter gathered whole, one at a time, and each rank keeps its piece.
"""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

from relm.distributed.context import DistContext
from relm.errors import UserError
from relm.rollout.tensor_parallel import (
    shard_for_generation,
    tensor_parallel_blocker,
    tensor_parallel_config_blocker,
)

logger = logging.getLogger("relm")

TP_KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"


def check_tensor_parallel(config: Any, tp_size: int, model_name: str) -> None:
    """Before any process starts: the model's config allows groups of `tp_size` ranks.

    Raises:
        UserError: its plan splits nothing relm splits, or `tp_size` does not divide its heads.
    """
    if tp_size > 1:
        _raise_if(tensor_parallel_config_blocker(config, tp_size), tp_size, model_name)


def _raise_if(problem: str | None, tp_size: int, model_name: str) -> None:
    if problem is not None:
        raise UserError(f"`{TP_KEY}={tp_size}` with `{model_name}`: {problem}; use a size that fits, or 1")


def split_generation_copy(copy: nn.Module, dist: DistContext, tp_size: int, model_name: str) -> nn.Module:
    """`copy` (the engine's own frozen copy, possibly on the meta device) split over this rank's group
    of `tp_size` ranks, in place.

    Raises:
        UserError: the model cannot be split so (its plan, or head counts `tp_size` does not divide).
    """
    _raise_if(tensor_parallel_blocker(copy, tp_size), tp_size, model_name)
    shard_for_generation(copy, dist.group_mesh(tp_size))
    logger.info(
        "tensor-parallel generation: %d groups of %d ranks, each splitting attention heads and MLP columns",
        dist.world_size // tp_size,
        tp_size,
    )
    return copy
