"""Sharded construction: each rank materializes only its own shards, read straight from the files.

Without it every rank loads the whole fp32 actor (and copies it for the reference and the generator)
before FSDP2 shards anything, so the largest trainable model is what one device holds at start-up.
Here a model is built with its parameters on the meta device (`load_causal_lm(..., empty=True)`),
sharded by `fully_shard` (which then only records the layout), given empty storage for its own
shards (`to_empty`), and each shard is read from the model's safetensors files, row range by row
range (`relm.models.safetensors_rows`): FSDP2 shards every parameter on its first dim, so a rank's piece
is a contiguous run of rows. No rank ever holds a whole tensor it does not keep, except the generation
copy (`fill_from_shards`), which gathers one parameter at a time.

Only folders whose safetensors hold every parameter under the model's own names (tied weights once)
are built this way (`stored_names_match`); any other (pickled `.bin` weights, checkpoints whose names
transformers converts while loading, a folder without weights that is initialised at random) loads
whole on every rank as before.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from relm.distributed.fsdp import full_named_tensors
from relm.models.safetensors_rows import SafetensorsFolder


def stored_names_match(model: nn.Module, stored: SafetensorsFolder) -> bool:
    """Whether every parameter of `model` lies in `stored` under its own name with its own shape."""
    for name, param in model.named_parameters():
        tensor = stored.tensors.get(name)
        if tensor is None or tuple(tensor.shape) != tuple(param.shape):
            return False
    return True


@torch.no_grad()
def materialize_shards(model: nn.Module, stored: SafetensorsFolder, device: torch.device) -> None:
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
        stored.read_rows(name, first_row, local)  # cast to the shard's dtype while read
    # Persistent buffers stored with the weights (a few models save theirs) take the file's values.
    for name, buffer in model.named_buffers():
        if name in stored.tensors and tuple(stored.tensors[name].shape) == tuple(buffer.shape):
            stored.read_rows(name, 0, buffer)


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
        own[name].copy_(tensor)
        del tensor
