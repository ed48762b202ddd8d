"""AdamW with warmup and an optional cosine decay, as verl's `optim` section describes it."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from relm.config.specs import OptimSpec
from relm.learner.compact_adamw import CompactAdamW


def num_warmup_steps(spec: OptimSpec, total_steps: int) -> int:
    """Explicit `lr_warmup_steps` wins; otherwise the ratio of the total."""
    if spec.warmup_steps >= 0:
        return spec.warmup_steps
    return int(spec.warmup_steps_ratio * total_steps)


def lr_multiplier(
    step: int, *, warmup_steps: int, total_steps: int, style: str, min_lr_ratio: float
) -> float:
    """Share of the peak lr at optimizer step `step` (0-based).

    Linear warmup from 1/warmup to 1, then flat (`constant`) or a half cosine down to `min_lr_ratio`.
    """
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if style == "constant":
        return 1.0
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(
    model: nn.Module,
    spec: OptimSpec,
    total_steps: int,
    *,
    moments_dtype: torch.dtype | None = None,
    seed: int = 0,
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable parameters and its per-optimizer-step lr schedule.

    `total_steps` counts optimizer steps (mini-batches x epochs x training steps), which is what the
    scheduler is stepped by. With `moments_dtype` the optimizer is `CompactAdamW` (moments stored in
    that dtype, bf16 weights updated with stochastic rounding, `seed` seeding the rounding); without,
    torch's own AdamW (fp32 weights and moments, and sharded runs).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    settings: dict[str, Any] = dict(lr=spec.lr, betas=spec.betas, weight_decay=spec.weight_decay)
    optimizer: torch.optim.Optimizer
    if moments_dtype is None:
        # One fused kernel per parameter group instead of foreach's dozen passes over every fp32 tensor
        # (about 50 ms a step at 1.5B on an H200); plain CUDA tensors only (FSDP2's shards are DTensors).
        fused = bool(params) and all(p.is_cuda and not hasattr(p, "to_local") for p in params)
        optimizer = torch.optim.AdamW(params, **settings, fused=fused or None)
    else:
        optimizer = CompactAdamW(params, **settings, moments_dtype=moments_dtype, seed=seed)
    warmup = num_warmup_steps(spec, total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: lr_multiplier(
            step,
            warmup_steps=warmup,
            total_steps=total_steps,
            style=spec.schedule,
            min_lr_ratio=spec.min_lr_ratio,
        ),
    )
    return optimizer, scheduler


def clip_and_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    max_norm: float,
) -> tuple[torch.Tensor, bool]:
    """Clip the global grad norm, then step, unless the norm is not finite.

    A NaN/inf gradient would poison AdamW's moments for the rest of the run, so such an update is
    skipped (gradients dropped) and reported; the trainer counts skips.

    Returns:
        (grad_norm before clipping, whether the step was taken)
    """
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if hasattr(grad_norm, "full_tensor"):  # FSDP2: the norm over every rank's shards, replicated
        grad_norm = grad_norm.full_tensor()
    stepped = bool(torch.isfinite(grad_norm))
    if stepped:
        optimizer.step()
        # Autocast caches its bf16 casts of the weights until the outermost autocast context exits,
        # with no check that a weight changed; the trainer's step runs in one context, so without
        # this every later mini-batch (and epoch) would compute with the weights of the first.
        torch.clear_autocast_cache()
    optimizer.zero_grad(set_to_none=True)
    scheduler.step()
    return grad_norm.detach(), stepped
