"""One update of the value function over a step's responses."""

from __future__ import annotations

import functools

import torch
from torch import nn

from relm.algorithms.losses import AggScale, compute_value_loss
from relm.algorithms.masked import masked_mean
from relm.config.schema import CriticConfig
from relm.distributed.context import DistContext
from relm.distributed.gathering import Accumulation
from relm.learner.batch import ExperienceBatch
from relm.learner.forward import response_values
from relm.learner.microbatch_retry import MicroBatchSize
from relm.learner.update_loop import UpdateResult, run_update


def update_critic(
    value_model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    batch: ExperienceBatch,
    cfg: CriticConfig,
    *,
    rows_per_minibatch: int,
    rows_per_microbatch: int,
    num_epochs: int,
    device: torch.device,
    generator: torch.Generator | None = None,
    remove_padding: bool = False,
    max_tokens_per_microbatch: int | None = None,
    dist: DistContext | None = None,
) -> UpdateResult:
    """Clipped value-loss regression of V(s_t) onto the returns, `num_epochs` passes.

    Micro-batch losses are normalised by the mini-batch's counts (global ones with `dist`), as in
    `update_actor`.
    """
    assert batch.values is not None and batch.returns is not None
    accumulate = functools.partial(
        _accumulate_minibatch, value_model=value_model, batch=batch, cfg=cfg, device=device,
        remove_padding=remove_padding,
    )  # fmt: skip
    return run_update(
        value_model, optimizer, scheduler, batch, accumulate, name="critic",
        num_epochs=num_epochs, rows_per_minibatch=rows_per_minibatch,
        size=MicroBatchSize(rows=rows_per_microbatch, max_tokens=max_tokens_per_microbatch),
        grad_clip=cfg.grad_clip, shuffle=bool(cfg.shuffle), remove_padding=remove_padding,
        device=device, generator=generator, dist=dist,
    )  # fmt: skip


def _accumulate_minibatch(
    micros: list[torch.Tensor],
    scale: AggScale,
    accumulation: Accumulation,
    *,
    value_model: nn.Module,
    batch: ExperienceBatch,
    cfg: CriticConfig,
    device: torch.device,
    remove_padding: bool,
) -> list[dict]:
    """Forward and backward of one mini-batch's micro-batches (`scale` normalises their losses); their metrics."""
    agg_mode = cfg.loss_agg_mode or "token-mean"
    collected = []
    for index, micro in enumerate(micros):
        mb = batch.select(micro).to(device)
        values = response_values(
            value_model,
            mb.input_ids,
            mb.attention_mask,
            mb.position_ids,
            mb.response_width,
            remove_padding=remove_padding,
        )
        vf_loss, vf_metrics = compute_value_loss(
            values,
            mb.values,
            mb.returns,
            mb.response_mask,
            cfg.cliprange_value,
            loss_agg_mode=agg_mode,
            agg_scale=scale,
        )
        accumulation.backward(vf_loss, last=index == len(micros) - 1)
        vpred = masked_mean(values.detach(), mb.response_mask)
        collected.append({"vf_loss": vf_loss.detach(), "vpred_mean": vpred, **vf_metrics})
    return collected
