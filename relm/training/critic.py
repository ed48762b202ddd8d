"""One update of the value function over a step's responses."""

from __future__ import annotations

import torch
from torch import nn

from relm.algorithms.losses import compute_value_loss
from relm.algorithms.masked import masked_mean
from relm.config.schema import CriticConfig
from relm.training.actor import UpdateResult
from relm.training.batch import ExperienceBatch
from relm.training.forward import response_values
from relm.training.minibatch import append_metrics, microbatch_indices, minibatch_indices
from relm.training.optim import clip_and_step


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
) -> UpdateResult:
    """Clipped value-loss regression of V(s_t) onto the GAE returns, `num_epochs` passes."""
    assert batch.values is not None and batch.returns is not None
    value_model.train()
    metrics: dict[str, list[float]] = {}
    skipped = 0
    for _ in range(num_epochs):
        for mini in minibatch_indices(
            len(batch), rows_per_minibatch, shuffle=cfg.shuffle, generator=generator
        ):
            for micro in microbatch_indices(mini, rows_per_microbatch):
                mb = batch.select(micro).to(device)
                values = response_values(
                    value_model, mb.input_ids, mb.attention_mask, mb.position_ids, mb.response_width
                )
                vf_loss, vf_metrics = compute_value_loss(
                    values,
                    mb.values,
                    mb.returns,
                    mb.response_mask,
                    cfg.cliprange_value,
                    loss_agg_mode=cfg.loss_agg_mode,
                )
                (vf_loss * (len(micro) / len(mini))).backward()
                vpred = masked_mean(values.detach(), mb.response_mask)
                append_metrics(
                    metrics, "critic", {"vf_loss": vf_loss.detach(), "vpred_mean": vpred, **vf_metrics}
                )
            grad_norm, stepped = clip_and_step(value_model, optimizer, scheduler, cfg.grad_clip)
            skipped += int(not stepped)
            append_metrics(metrics, "critic", {"grad_norm": grad_norm})
    metrics["critic/lr"] = [scheduler.get_last_lr()[0]]
    value_model.eval()
    return UpdateResult(metrics=metrics, num_skipped_updates=skipped)
