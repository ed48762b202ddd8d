"""Which rows of a step each rank trains on: equal row counts, balanced token counts, mini-batches kept.

The step's rows are cut into consecutive chunks (a chunk is the finest mini-batch boundary of actor
and critic), and every chunk is split into `world_size` equal parts, one per rank. A rank's rows are
its parts in chunk order, so its k-th local mini-batch is its part of the k-th global mini-batch:
the union over ranks of what the ranks update with is exactly the mini-batch one process would use,
and data parallelism does not change which responses share an optimizer step.

Within a chunk, `balance` assigns the rows with the most tokens first, each to the rank with the
fewest tokens so far that still has room (longest-processing-time first, with equal row counts). A
synchronous step waits for its slowest rank at every optimizer step, so the per-chunk balance is the
one that matters. Equal row counts are required: every rank must run the same number of forward and
backward passes, because each FSDP pass is a collective.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from relm.distributed.context import DistContext


def partition_rows(
    token_counts: torch.Tensor, *, world_size: int, chunk_rows: int, balance: bool
) -> list[torch.Tensor]:
    """The row indices each rank trains on, ascending within each chunk.

    Args:
        token_counts: [N] tokens of each row (prompt + response), the cost its forward and backward pay.
        world_size: ranks.
        chunk_rows: rows per chunk (a divisor of every mini-batch's row count); must divide N and be a
            multiple of `world_size`.
        balance: balance token counts within each chunk; False gives each rank a contiguous block.

    Returns:
        `world_size` int64 tensors of N / world_size rows each.

    Raises:
        ValueError: the sizes do not divide as required.
    """
    num_rows = token_counts.shape[0]
    if chunk_rows < 1 or num_rows % chunk_rows or chunk_rows % world_size:
        raise ValueError(
            f"{num_rows} rows in chunks of {chunk_rows} cannot be split evenly over {world_size} ranks"
        )
    per_rank = chunk_rows // world_size
    counts = token_counts.tolist()
    ranks: list[list[int]] = [[] for _ in range(world_size)]
    for start in range(0, num_rows, chunk_rows):
        chunk = list(range(start, start + chunk_rows))
        if balance:
            parts = _balanced_split(chunk, counts, world_size, per_rank)
        else:
            parts = [chunk[r * per_rank : (r + 1) * per_rank] for r in range(world_size)]
        for rank, part in enumerate(parts):
            ranks[rank].extend(sorted(part))
    return [torch.tensor(rows, dtype=torch.long) for rows in ranks]


def _balanced_split(rows: list[int], counts: list[float], num_parts: int, per_part: int) -> list[list[int]]:
    """Greedy LPT with a cardinality limit; ties go to the lower row and the lower rank (deterministic)."""
    parts: list[list[int]] = [[] for _ in range(num_parts)]
    loads = [0.0] * num_parts
    for row in sorted(rows, key=lambda r: (-counts[r], r)):
        open_parts = [p for p in range(num_parts) if len(parts[p]) < per_part]
        target = min(open_parts, key=lambda p: (loads[p], p))
        parts[target].append(row)
        loads[target] += counts[row]
    return parts


def same_group_count(groups: list[torch.Tensor], dist: DistContext | None) -> list[torch.Tensor]:
    """`groups` (micro-batches or forward passes of this rank), split until every rank has as many.

    Micro-batches cut by token budget (`use_dynamic_bsz`) can number differently on ranks whose rows
    differ in length, but every FSDP pass is a collective, so each rank makes as many as the rank with
    the most (`split_to_count`). A no-op in a single-process run (no collective either).
    """
    if dist is None or not dist.is_distributed:
        return groups
    return split_to_count(groups, int(dist.max_floats([float(len(groups))])[0]))


def split_to_count(groups: list[torch.Tensor], target: int) -> list[torch.Tensor]:
    """Halve the group with the most rows (the first of equals) until there are `target` groups.

    Always possible when `target` is at most the number of rows, which holds across ranks because
    every rank has the same number of rows; the loss is normalised per mini-batch, so splitting a
    micro-batch does not change the gradient, and halves stay within the token budget.
    """
    groups = list(groups)
    while len(groups) < target:
        largest = max(range(len(groups)), key=lambda i: (len(groups[i]), -i))
        if len(groups[largest]) < 2:
            raise ValueError(f"{sum(len(g) for g in groups)} rows cannot make {target} groups")
        half = len(groups[largest]) // 2
        groups[largest : largest + 1] = [groups[largest][:half], groups[largest][half:]]
    return groups
