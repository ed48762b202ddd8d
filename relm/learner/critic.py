"""One update of the value function over a step's responses."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from relm.algorithms.losses import AggScale, compute_value_loss
from relm.algorithms.masked import masked_mean
from relm.distributed.context import DistContext
from relm.distributed.gathering import Accumulation
from relm.learner.batch import Advantaged
from relm.learner.forward import response_values
from relm.learner.trainee import Trainee
from relm.learner.update_loop import MicroStep, UpdateResult, run_update
from relm.memory.host_allocator import release_heap_fragments


@dataclass(frozen=True)
class CriticObjective:
    """The value loss's settings (verl's `critic` keys of the same names)."""

    cliprange_value: float
    """How far V may move from the values the batch was annotated with before the loss clips it."""
    loss_agg_mode: str
    """How per-token losses reduce to a scalar (`relm.algorithms.losses.agg_loss`)."""


def update_critic(
    critic: Trainee,
    batch: Advantaged,
    objective: CriticObjective,
    *,
    device: torch.device,
    rng: torch.Generator | None = None,
    dist: DistContext | None = None,
) -> UpdateResult:
    """Clipped value-loss regression of V(s_t) onto the returns, `critic.batching.num_epochs` passes.

    Micro-batch losses are normalised by the mini-batch's counts (global ones with `dist`), as in
    `update_actor`. `rng` shuffles the mini-batches.
    """
    if batch.annotated.values is None:
        raise RuntimeError("the critic's update needs the values the batch was annotated with")
    accumulate = functools.partial(
        _accumulate_minibatch,
        value_model=critic.module,
        batch=batch,
        objective=objective,
        device=device,
        remove_padding=critic.batching.remove_padding,
    )
    return run_update(critic, batch, accumulate, device=device, rng=rng, dist=dist)


def _accumulate_minibatch(
    micros: list[torch.Tensor],
    scale: AggScale,
    accumulation: Accumulation,
    *,
    value_model: nn.Module,
    batch: Advantaged,
    objective: CriticObjective,
    device: torch.device,
    remove_padding: bool,
) -> list[MicroStep]:
    """Forward, value loss and backward of each of a mini-batch's micro-batches (`scale` normalises their losses)."""
    steps = []
    for index, micro in enumerate(micros):
        mb = batch.select(micro).to(device)
        rollout = mb.rollout
        values = response_values(
            value_model,
            rollout.input_ids,
            rollout.attention_mask,
            rollout.position_ids,
            rollout.response_width,
            remove_padding=remove_padding,
        )
        old_values = mb.annotated.values
        assert old_values is not None, "checked by update_critic"
        vf_loss, vf_metrics = compute_value_loss(
            values,
            old_values,
            mb.returns,
            mb.loss_mask,
            objective.cliprange_value,
            loss_agg_mode=objective.loss_agg_mode,
            agg_scale=scale,
        )
        accumulation.backward(vf_loss, last=index == len(micros) - 1)
        vpred = masked_mean(values.detach(), mb.loss_mask)
        metrics = {"vf_loss": vf_loss.detach(), "vpred_mean": vpred, **vf_metrics}
        steps.append(MicroStep(rows=micro, metrics=metrics, forward=values.detach().float().cpu()))
        release_heap_fragments()  # a CPU run's kept heap, bounded between micro-batches
    return steps
