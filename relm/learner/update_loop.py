"""The loop the actor's and the critic's updates share: epochs of mini-batches, each accumulated over
its micro-batches, clipped and stepped.

What differs between the two is only how one mini-batch's micro-batches are computed (policy loss or
value loss), passed in as `accumulate`; the rest is here once: train/eval mode, cutting each
mini-batch into micro-batches with its loss normaliser (`relm.learner.minibatch.minibatch_split`),
FSDP's once-per-mini-batch gathering and gradient sync (`relm.distributed.gathering`), redoing a
mini-batch that ran out of GPU memory with smaller micro-batches (`relm.learner.microbatch_retry`),
skipping a step with a non-finite gradient norm, and the per-mini-batch metrics.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from relm.algorithms.losses import AggScale
from relm.distributed.context import DistContext
from relm.distributed.gathering import Accumulation
from relm.learner.batch import Advantaged
from relm.learner.microbatch_retry import MicroBatchSize, with_halving_on_oom
from relm.learner.minibatch import MinibatchMetrics, forward_token_counts, minibatch_indices, minibatch_split
from relm.learner.optim import clip_and_step
from relm.learner.trainee import Trainee


@dataclass(frozen=True)
class MicroStep:
    """What one micro-batch's forward, loss and backward computed."""

    rows: torch.Tensor
    """[m] its row indices in the update's batch."""
    metrics: Mapping[str, torch.Tensor | float]
    forward: torch.Tensor
    """[m, R] fp32 on the CPU, detached: the forward's output (the actor's logprobs, the critic's values)."""


Accumulate = Callable[[list[torch.Tensor], AggScale, Accumulation], list[MicroStep]]
"""(each micro-batch's row indices, the mini-batch's loss normaliser, the accumulation context) ->
each micro-batch's step, after every micro-batch's backward."""


@dataclass(frozen=True)
class UpdateResult:
    """Per-metric lists (one entry per mini-batch), how many optimizer steps were skipped, and the first
    epoch's forward outputs."""

    metrics: dict[str, list[float]]
    num_skipped_updates: int
    first_forward: torch.Tensor
    """[N, R] fp32 on the CPU: each row's forward output in the update's first epoch. Before any optimizer
    step only when the update is one mini-batch of one epoch (the on-policy actor's old logprobs)."""
    microbatch: MicroBatchSize
    """The trainee's micro-batch size after the update: smaller than before after an out-of-memory retry."""


def run_update(
    trainee: Trainee,
    batch: Advantaged,
    accumulate: Accumulate,
    *,
    device: torch.device,
    rng: torch.Generator | None = None,
    dist: DistContext | None = None,
) -> UpdateResult:
    """`trainee.batching.num_epochs` passes over `batch` in mini-batches (a 1/world share of
    `rows_per_minibatch` on each rank), one optimizer step each; metrics are named `{trainee.name}/...`.

    Micro-batches are cut by `trainee.microbatch`, which an out-of-memory retry makes smaller for good.
    """
    model, optimizer, scheduler, name = trainee.module, trainee.optimizer, trainee.scheduler, trainee.name
    batching = trainee.batching
    remove_padding = batching.remove_padding
    model.train()
    stats = MinibatchMetrics(name)
    skipped = 0
    single_process = dist is None or not dist.is_distributed
    token_counts = forward_token_counts(batch.rollout.attention_mask, remove_padding)

    def one_pass(mini: torch.Tensor, accumulation: Accumulation, size: MicroBatchSize) -> list[MicroStep]:
        scale, micros = minibatch_split(
            batch.loss_mask,
            mini,
            size.rows,
            token_counts=token_counts,
            max_tokens=size.max_tokens,
            dist=dist,
        )
        size.largest_rows = max(len(micro) for micro in micros)
        size.largest_tokens = max(int(token_counts[micro].sum()) for micro in micros)
        return accumulate(micros, scale, accumulation)

    world_size = 1 if dist is None or single_process else dist.world_size
    rows_per_minibatch = batching.rows_per_minibatch // world_size
    first_forward = torch.zeros(len(batch), batch.rollout.response_width)
    with Accumulation.planned(model, device, dist) as accumulation:
        for epoch in range(batching.num_epochs):
            for mini in minibatch_indices(
                len(batch), rows_per_minibatch, shuffle=batching.shuffle, generator=rng
            ):
                this_minibatch = functools.partial(one_pass, mini, accumulation)
                for micro in with_halving_on_oom(
                    this_minibatch, trainee.microbatch, model, f"{name} update", single_process
                ):
                    stats.add(micro.metrics)
                    if epoch == 0:
                        first_forward[micro.rows] = micro.forward
                accumulation.end_minibatch()
                grad_norm, stepped = clip_and_step(model, optimizer, scheduler, trainee.grad_clip)
                skipped += int(not stepped)
                stats.end_minibatch({"grad_norm": grad_norm})
    model.eval()
    return UpdateResult(
        metrics={**stats.result(), f"{name}/lr": [float(scheduler.get_last_lr()[0])]},
        num_skipped_updates=skipped,
        first_forward=first_forward,
        microbatch=trainee.microbatch,
    )
