"""Sharded construction: each rank materializes only its own shards, read straight from the files.

Without it every rank loads the whole fp32 actor (and copies it for the reference and the generator)
before FSDP2 shards anything, so the largest trainable model is what one device holds at start-up.
Here a model is built with its parameters on the meta device (`load_causal_lm(..., empty=True)`),
sharded by `fully_shard` (which then only records the layout), given empty storage for its own
shards (`to_empty`), and each shard is read from the model's safetensors files, row range by row
range (`relm.models.safetensors_rows`): FSDP2 shards every parameter on its first dim, so a rank's piece
is a contiguous run of rows. No rank ever holds a whole tensor it does not keep, except the generation
copy (`fill_from_shards`), which gathers one parameter at a time.

The actor, its reference and the critic are built this way where the folder's safetensors hold every
parameter under the model's own names (tied weights once; a critic's backbone under the causal LM's or
its own names, its head in `value_head.safetensors` or at zero): `stored_weights`, `critic_weights`. Any
other (pickled `.bin` weights, checkpoints whose names transformers converts while loading, a folder
without weights that is initialised at random, LoRA) loads whole on every rank as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from relm.distributed.fsdp import full_named_tensors
from relm.models.safetensors_rows import SafetensorsFolder
from relm.models.value_model import VALUE_HEAD_FILE
from relm.rollout.tensor_parallel import copy_whole_into


@dataclass(frozen=True)
class StoredWeights:
    """Where each tensor of a model lies in safetensors files: its name in the model -> (files, stored name).

    `zeros`: parameters the model starts at zero with no file behind them (a new critic's value head)."""

    sources: Mapping[str, tuple[SafetensorsFolder, str]]
    zeros: frozenset[str] = frozenset()


def stored_weights(
    model: nn.Module,
    stored: SafetensorsFolder,
    rename: Callable[[str], str] = lambda name: name,
    zeros: frozenset[str] = frozenset(),
) -> StoredWeights | None:
    """Every parameter of `model` (but `zeros`) in `stored` under `rename(name)` with its own shape, and
    the persistent buffers stored too; None when a parameter is missing there (then the model loads
    whole: transformers converts names while loading some checkpoints)."""
    sources: dict[str, tuple[SafetensorsFolder, str]] = {}
    for name, param in model.named_parameters():
        if name in zeros:
            continue
        tensor = stored.tensors.get(rename(name))
        if tensor is None or tuple(tensor.shape) != tuple(param.shape):
            return None
        sources[name] = (stored, rename(name))
    for name, buffer in model.named_buffers():
        tensor = stored.tensors.get(rename(name))
        if tensor is not None and tuple(tensor.shape) == tuple(buffer.shape):
            sources[name] = (stored, rename(name))  # a few models save theirs: the file's values win
    return StoredWeights(sources, zeros)


def critic_weights(model: nn.Module, folder: str) -> StoredWeights | None:
    """A `ValueModel`'s: its backbone's tensors in the folder's files, under the causal LM's names (the
    class's `base_model_prefix`, `model.` for most) or a backbone-only checkpoint's (relm's critic
    checkpoints), and its head in `value_head.safetensors`, or at zero without one (as `ValueModel`
    starts it)."""
    stored = SafetensorsFolder(folder)
    backbone_prefix = f"{getattr(model.backbone, 'base_model_prefix', '')}."
    head_names = frozenset(name for name, _ in model.named_parameters() if name.startswith("value_head."))
    head_file = Path(folder) / VALUE_HEAD_FILE

    def renamed(prefix: str) -> Callable[[str], str]:
        return lambda name: prefix + name.removeprefix("backbone.")

    for prefix in (backbone_prefix, ""):
        backbone = stored_weights(model, stored, renamed(prefix), zeros=head_names)
        if backbone is not None:
            break
    else:
        return None
    if not head_file.is_file():
        return StoredWeights(backbone.sources, head_names)
    head = SafetensorsFolder(folder, files=[VALUE_HEAD_FILE])
    sources = dict(backbone.sources)
    for name in head_names:
        short = name.removeprefix("value_head.")
        if short not in head.tensors:
            return None
        sources[name] = (head, short)
    return StoredWeights(sources)


@torch.no_grad()
def materialize_shards(model: nn.Module, weights: StoredWeights, device: torch.device) -> None:
    """Give a `fully_shard`-ed model built on the meta device storage for its own shards, and read them.

    Buffers (real tensors already, computed by the model's constructor and moved by `fully_shard`) keep
    their values and devices: `to_empty` replaces every tensor of the model, so they are put back
    afterwards. Under `CPUOffloadPolicy` FSDP2 moves each new shard to pinned CPU memory itself.
    """
    buffers = [(module, dict(module._buffers)) for module in model.modules() if module._buffers]
    model.to_empty(device=device)
    for module, kept in buffers:
        module._buffers.update(kept)
    for name, param in model.named_parameters():
        local, first_row = _own_rows(param)
        if name in weights.zeros:
            local.zero_()
            continue
        stored, stored_name = weights.sources[name]
        stored.read_rows(stored_name, first_row, local)  # cast to the shard's dtype while read
    for name, buffer in model.named_buffers():
        if name in weights.sources:
            stored, stored_name = weights.sources[name]
            stored.read_rows(stored_name, 0, buffer)


def _own_rows(param: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(this rank's piece of `param`, the index of its first row in the whole tensor).

    A plain tensor is whole (its piece starts at row 0); a DTensor's piece is where DTensor's own
    layout function puts it, which for FSDP2's `Shard(0)` (and `Replicate`) is whole rows.
    """
    to_local = getattr(param, "to_local", None)
    if to_local is None:
        return param.data, 0
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    local = to_local()
    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)  # type: ignore[attr-defined]  # a DTensor
    assert tuple(shape) == tuple(local.shape), (shape, local.shape)
    assert all(o == 0 for o in offset[1:]), f"a piece that is not whole rows: offset {offset}"
    return local, (offset[0] if offset else 0)


@torch.no_grad()
def materialize_parameters(model: nn.Module, device: torch.device, dtype: torch.dtype) -> None:
    """Give a model built on the meta device empty parameters on `device` in `dtype` (floating ones;
    others keep theirs), each made once so tied weights stay tied; buffers are left as they are."""
    made: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None or param.device.type != "meta":
                continue
            if id(param) not in made:
                target = dtype if param.is_floating_point() else param.dtype
                made[id(param)] = nn.Parameter(
                    torch.empty(param.shape, dtype=target, device=device), requires_grad=False
                )
            module._parameters[name] = made[id(param)]


@torch.no_grad()
def fill_from_shards(
    copy: nn.Module, named: Iterable[tuple[str, torch.Tensor]], device: torch.device
) -> None:
    """Copy each of the sharded model's parameters (`named`) into the whole `copy`, gathering one at
    a time: the peak beyond the copy is one whole parameter. A collective: every rank calls it."""
    own = dict(copy.named_parameters())
    for name, tensor in full_named_tensors(named, device):
        copy_whole_into(own[name], tensor)  # a tensor-parallel copy keeps its own piece
        del tensor
