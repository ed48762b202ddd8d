"""How one step's responses are cut into optimizer steps (mini-batches) and forward passes (micro-batches)."""

from __future__ import annotations

from collections.abc import Iterator

import torch


def minibatch_indices(
    num_rows: int, rows_per_minibatch: int, *, shuffle: bool, generator: torch.Generator | None = None
) -> list[torch.Tensor]:
    """Row indices of each mini-batch; the last one may be short only if the sizes do not divide.

    Config validation makes them divide, so in practice every mini-batch is full.
    """
    order = torch.randperm(num_rows, generator=generator) if shuffle else torch.arange(num_rows)
    return list(order.split(rows_per_minibatch))


def microbatch_indices(minibatch: torch.Tensor, rows_per_microbatch: int) -> Iterator[torch.Tensor]:
    """Split one mini-batch's rows into micro-batches for gradient accumulation."""
    yield from minibatch.split(max(1, rows_per_microbatch))


def append_metrics(
    store: dict[str, list[float]], prefix: str, metrics: dict[str, torch.Tensor | float]
) -> None:
    """Collect per-micro-batch metrics under `prefix/name`; the trainer averages each list."""
    for name, value in metrics.items():
        store.setdefault(f"{prefix}/{name}", []).append(float(value))
