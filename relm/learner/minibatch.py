"""How one step's responses are cut into optimizer steps (mini-batches) and forward passes (micro-batches)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import torch

from relm.algorithms.losses import AggScale
from relm.distributed.balance import same_group_count

if TYPE_CHECKING:
    from relm.distributed.context import DistContext

ADDITIVE_METRICS = frozenset({"pg_loss", "entropy", "kl_loss", "vf_loss", "distillation/loss"})
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


def microbatch_indices(
    minibatch: torch.Tensor,
    rows_per_microbatch: int,
    *,
    token_counts: torch.Tensor | None = None,
    max_tokens: int | None = None,
) -> Iterator[torch.Tensor]:
    """Split one mini-batch's rows into micro-batches for gradient accumulation (or forward passes).

    By rows (`rows_per_microbatch` each), or, with `max_tokens` (verl's `use_dynamic_bsz` with
    `ppo_max_token_len_per_gpu`), into as few micro-batches as first-fit-decreasing packing finds whose
    tokens stay within the budget: RL responses vary in length, so a fixed row count either wastes
    memory on short batches or runs out of it on long ones. A row longer than the budget goes alone.
    The loss is normalised per mini-batch (`AggScale`), so how rows are grouped does not change the
    gradient beyond float rounding.

    Args:
        minibatch: [M] row indices into the step's batch.
        token_counts: [num_rows of the step] tokens each row costs in a forward (indexed by row id).
    """
    if max_tokens is None:
        yield from minibatch.split(max(1, rows_per_microbatch))
        return
    if token_counts is None:
        raise ValueError("a token budget needs the rows' token counts")
    yield from token_budget_bins(minibatch, token_counts[minibatch], max_tokens)


def token_budget_bins(rows: torch.Tensor, costs: torch.Tensor, max_tokens: int) -> list[torch.Tensor]:
    """First-fit decreasing: rows [M] with costs [M] into bins of at most `max_tokens` (rows ascending
    within a bin, bins in order of their first row so runs are deterministic)."""
    bins: list[list[int]] = []
    loads: list[int] = []
    for position in torch.argsort(costs, descending=True, stable=True).tolist():
        cost = int(costs[position])
        target = next((i for i, load in enumerate(loads) if load + cost <= max_tokens), None)
        if target is None:
            bins.append([position])
            loads.append(cost)
        else:
            bins[target].append(position)
            loads[target] += cost
    ordered = sorted(sorted(members) for members in bins)
    return [rows[torch.tensor(members, dtype=torch.long)] for members in ordered]


def minibatch_split(
    response_mask: torch.Tensor,
    minibatch: torch.Tensor,
    rows_per_microbatch: int,
    *,
    token_counts: torch.Tensor,
    max_tokens: int | None,
    dist: DistContext | None,
) -> tuple[AggScale, list[torch.Tensor]]:
    """A mini-batch's loss normaliser and its micro-batches, for the actor and the critic alike.

    The normaliser counts the whole mini-batch, summed over ranks in a data-parallel run (each rank's
    loss is its share of the global one), and every rank makes as many micro-batches (each FSDP pass
    is a collective).

    Args:
        response_mask: [N, R] of the step's whole batch.
        minibatch: [M] row indices of this mini-batch.
    """
    scale = AggScale.of(response_mask[minibatch])
    micros = list(
        microbatch_indices(minibatch, rows_per_microbatch, token_counts=token_counts, max_tokens=max_tokens)
    )
    if dist is not None and dist.is_distributed:
        scale = AggScale(*dist.sum_floats([scale.num_tokens, scale.num_seqs]))
        micros = same_group_count(micros, dist)
    return scale, micros


def forward_token_counts(attention_mask: torch.Tensor, remove_padding: bool) -> torch.Tensor:
    """[N] tokens each row costs in a forward: its real tokens when packed, the padded width otherwise."""
    if remove_padding:
        return attention_mask.sum(dim=-1)
    return torch.full((attention_mask.shape[0],), attention_mask.shape[1], dtype=torch.long)


class MinibatchMetrics:
    """Collects micro-batch metrics into one value per mini-batch, then one per step.

    Additive losses are summed over a mini-batch's micro-batches (giving the mini-batch loss);
    the rest are averaged. The step value is the mean over mini-batches.
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._per_minibatch: dict[str, list[float]] = {}
        self._current: dict[str, list[float]] = {}

    def add(self, metrics: Mapping[str, torch.Tensor | float]) -> None:
        """Record one micro-batch's metrics."""
        for name, value in metrics.items():
            self._current.setdefault(name, []).append(float(value))

    def end_minibatch(self, extra: dict[str, torch.Tensor | float] | None = None) -> None:
        """Close the current mini-batch (after its optimizer step), with its own metrics such as grad_norm."""
        for name, values in self._current.items():
            value = sum(values) if name in ADDITIVE_METRICS else sum(values) / len(values)
            self._per_minibatch.setdefault(name, []).append(value)
        for name, extra_value in (extra or {}).items():
            self._per_minibatch.setdefault(name, []).append(float(extra_value))
        self._current = {}

    def result(self) -> dict[str, list[float]]:
        """Per-mini-batch lists under `prefix/name` (a name with its own section, `rollout_corr/kl`, as it is);
        the trainer averages each."""
        return {
            name if "/" in name else f"{self.prefix}/{name}": values
            for name, values in self._per_minibatch.items()
        }
