"""FSDP2 (`fully_shard`) for actor, reference and critic, and full weights for the rollout engine.

Each transformer block is its own FSDP unit, then the root (embeddings, final norm, lm_head or value
head, which tied embeddings keep in one unit): a forward gathers one block's weights at a time, so
peak memory holds one unsharded block, not the model.

A model is laid over the ranks as `relm.distributed.layout` decides: sharded over all of them (the
1-D mesh), or over the "shard" dim of a 2-D mesh whose "replicate" dim holds the copies (HSDP; one-rank
shards when replicated). When weights are gathered and gradients reduced within an update is
`relm.distributed.gathering`'s business.

FSDP averages gradients over ranks (over both dims of a 2-D mesh). The updates normalise each rank's loss by the whole global
mini-batch's token and response counts (`AggScale` summed over ranks), so a rank's loss is its share of
the global loss and the global gradient is the sum of the ranks' gradients, not their mean: the updates
scale the loss they backpropagate by the world size, which FSDP's average divides out again. That keeps
FSDP's own reduction (NCCL's AVG, any backend) untouched: 2 ranks x half the batch = 1 rank x the batch.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from relm.distributed.context import DistContext
from relm.errors import UserError
from relm.models.precision import Precision

logger = logging.getLogger("relm")


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The modules HF marks as not to be split (`_no_split_modules`: the decoder layers), in order."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names and m is not model]


def shard_model(
    model: nn.Module,
    dist: DistContext,
    precision: Precision,
    *,
    offload: bool = False,
    shard_size: int | None = None,
) -> nn.Module:
    """`fully_shard` every transformer block, then the root; returns `model`, now holding DTensor shards.

    Args:
        model: the full model on `dist.device` (every rank holds the same weights).
        dist: the run's context.
        precision: when compute and master dtypes differ (bf16 compute, fp32 master on GPU) the blocks
            compute in `compute` through FSDP's `MixedPrecisionPolicy` and gradients are reduced in fp32;
            this replaces autocast for sharded models.
        offload: FSDP2's `CPUOffloadPolicy`: shards, gradients and the optimizer step live on the CPU.
        shard_size: ranks one copy is sharded over (`relm.distributed.layout`); None: all of them.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    if offload and dist.device.type != "cuda":
        raise UserError(
            "`fsdp_config.offload_policy=true` moves a GPU run's shards to the CPU; this run computes on "
            f"{dist.device.type}: set it to false"
        )
    mixed = MixedPrecisionPolicy()
    if precision.compute != precision.master:
        mixed = MixedPrecisionPolicy(param_dtype=precision.compute, reduce_dtype=torch.float32)
    kwargs = dict(
        mesh=dist.model_mesh(shard_size or dist.world_size),
        mp_policy=mixed,
        offload_policy=CPUOffloadPolicy() if offload else OffloadPolicy(),
    )
    # The critic returns values[..., 0], a view; nothing writes into it in place, which is what FSDP warns of.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    blocks = transformer_blocks(model)
    if not blocks:
        logger.warning(
            "%s names no transformer blocks (_no_split_modules): sharding it as one unit, which gathers "
            "every weight at once in forward",
            type(model).__name__,
        )
    for block in blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return model


def full_tensor(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The whole tensor behind an FSDP2 shard, gathered on `device`; a plain tensor is returned as is.

    A CPU-offloaded shard is moved to `device` first, because NCCL gathers only device memory. This is
    a collective: every rank must call it for the same tensors in the same order. A replicated model's
    "shard" is already whole: it is returned itself (on `device`), without a gather, so read it before
    the model changes rather than keep it.
    """
    to_local = getattr(tensor, "to_local", None)
    if to_local is None:
        return tensor
    from torch.distributed.tensor import DTensor

    assert isinstance(tensor, DTensor), "a tensor with `to_local` is a DTensor"
    local = to_local()
    # Decided by the mesh, the same on every rank (local shapes differ: a [1] bias sharded over 2 ranks
    # is whole on one of them), so that no rank skips a gather the others make.
    mesh = tensor.device_mesh
    if all(
        p.is_replicate() or (p.is_shard() and mesh.size(dim) == 1) for dim, p in enumerate(tensor.placements)
    ):
        return local.to(device)
    if local.device != device:
        tensor = DTensor.from_local(
            local.to(device),
            tensor.device_mesh,
            tensor.placements,
            shape=tensor.shape,
            stride=tensor.stride(),
        )
    return tensor.full_tensor()


def full_named_tensors(
    named: Iterable[tuple[str, torch.Tensor]], device: torch.device
) -> Iterator[tuple[str, torch.Tensor]]:
    """`(name, full tensor)` one at a time: weight sync gathers one parameter, copies it, frees it."""
    for name, tensor in named:
        yield name, full_tensor(tensor.detach(), device)
