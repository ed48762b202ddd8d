"""How one step's responses are cut into optimizer steps (mini-batches) and forward passes (micro-batches)."""

from __future__ import annotations

from collections.abc import Iterator

import torch

ADDITIVE_METRICS = frozenset({"pg_loss", "entropy", "kl_loss", "vf_loss"})
"""Losses computed with the mini-batch's `AggScale`: each micro-batch holds a share, so they are summed
within a mini-batch. Every other metric (ratios, fractions) is averaged."""


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


class MinibatchMetrics:
    """Collects micro-batch metrics into one value per mini-batch, then one per step.

    Additive losses are summed over a mini-batch's micro-batches (giving the mini-batch loss);
    the rest are averaged. The step value is the mean over mini-batches.
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._per_minibatch: dict[str, list[float]] = {}
        self._current: dict[str, list[float]] = {}

    def add(self, metrics: dict[str, torch.Tensor | float]) -> None:
        """Record one micro-batch's metrics."""
        for name, value in metrics.items():
            self._current.setdefault(name, []).append(float(value))

    def end_minibatch(self, extra: dict[str, torch.Tensor | float] | None = None) -> None:
        """Close the current mini-batch (after its optimizer step), with its own metrics such as grad_norm."""
        for name, values in self._current.items():
            value = sum(values) if name in ADDITIVE_METRICS else sum(values) / len(values)
            self._per_minibatch.setdefault(name, []).append(value)
        for name, value in (extra or {}).items():
            self._per_minibatch.setdefault(name, []).append(float(value))
        self._current = {}

    def result(self) -> dict[str, list[float]]:
        """Per-mini-batch lists under `prefix/name`; the trainer averages each."""
        return {f"{self.prefix}/{name}": values for name, values in self._per_minibatch.items()}
