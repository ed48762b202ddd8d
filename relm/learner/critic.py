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
from relm.learner.trainee import Trainee
from relm.learner.update_loop import UpdateResult, run_update


def update_critic(
    critic: Trainee,
    batch: ExperienceBatch,
    *,
    device: torch.device,
    generator: torch.Generator | None = None,
    dist: DistContext | None = None,
) -> UpdateResult:
    """Clipped value-loss regression of V(s_t) onto the returns, `critic.batching.num_epochs` passes.

    Micro-batch losses are normalised by the mini-batch's counts (global ones with `dist`), as in
    `update_actor`.
    """
    cfg = critic.cfg
    assert isinstance(cfg, CriticConfig)
    assert batch.values is not None and batch.returns is not None
    accumulate = functools.partial(
        _accumulate_minibatch,
        value_model=critic.module,
        batch=batch,
        cfg=cfg,
        device=device,
        remove_padding=critic.batching.remove_padding,
    )
    return run_update(critic, batch, accumulate, device=device, generator=generator, dist=dist)


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
        assert mb.values is not None and mb.returns is not None, "set before the update"
        assert cfg.loss_agg_mode is not None, "the loader takes the actor's"
        vf_loss, vf_metrics = compute_value_loss(
            values,
            mb.values,
            mb.returns,
            mb.response_mask,
            cfg.cliprange_value,
            loss_agg_mode=cfg.loss_agg_mode,
            agg_scale=scale,
        )
        accumulation.backward(vf_loss, last=index == len(micros) - 1)
        vpred = masked_mean(values.detach(), mb.response_mask)
        collected.append({"vf_loss": vf_loss.detach(), "vpred_mean": vpred, **vf_metrics})
    return collected
