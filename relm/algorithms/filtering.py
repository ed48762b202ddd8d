"""DAPO dynamic sampling: keep only the groups whose responses disagree."""

from __future__ import annotations

import torch


def groups_with_variance(group_ids: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """[N] bool: True for rows whose group's `values` are not all equal.

    DAPO (Yu et al. 2025, arXiv:2503.14476, "dynamic sampling"): a group where every response got
    the same reward has zero group-relative advantage and contributes no gradient, so it is dropped
    and replaced by freshly sampled groups.

    Args:
        group_ids: [N] int64, the prompt each response answers.
        values: [N] float, the per-response metric (score, accuracy).
    """
    _, inverse = torch.unique(group_ids, return_inverse=True)  # [N] dense group index
    num_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    values = values.double()
    group_max = torch.full((num_groups,), -torch.inf, dtype=values.dtype).scatter_reduce(
        0, inverse, values, "amax"
    )
    group_min = torch.full((num_groups,), torch.inf, dtype=values.dtype).scatter_reduce(
        0, inverse, values, "amin"
    )
    return (group_max > group_min)[inverse]
