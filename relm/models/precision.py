"""Which dtype holds the weights and which one the matrix products run in.

Training keeps fp32 master weights (and fp32 AdamW states) and computes in bf16 on a GPU through
autocast. Storing the weights themselves in bf16 with a plain optimizer is not an option for RL: at
the learning rates RL uses (1e-6), an update is far below bf16's spacing near a typical weight (about
1e-4 at 0.02), so AdamW's steps round away and the run reports finite losses while the policy does not
move. Where bf16 weights are needed to fit (the memory plan's last rung, or `model.dtype=bfloat16`),
`relm.learner.compact_adamw` steps them in fp32 and rounds the result stochastically instead.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from relm.models.loading import pick_dtype


@dataclass(frozen=True)
class Precision:
    """Master (storage) and compute dtypes of the trained models."""

    master: torch.dtype
    """Weights and optimizer states."""
    compute: torch.dtype
    """Matrix products in forward and backward (autocast when it differs from `master`)."""
    device_type: str
    use_autocast: bool = True
    """False where FSDP2's `MixedPrecisionPolicy` casts the sharded models itself (`relm.distributed`)."""

    def autocast(self) -> contextlib.AbstractContextManager:
        """The context the trainer's forward and backward passes run in."""
        if self.compute == self.master or not self.use_autocast:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.compute)


def pick_precision(model_dtype: str, device: torch.device) -> Precision:
    """`auto`: fp32 master weights, bf16 compute on CUDA (fp32 on CPU). An explicit dtype is used for both."""
    if model_dtype == "auto":
        compute = torch.bfloat16 if device.type == "cuda" else torch.float32
        return Precision(master=torch.float32, compute=compute, device_type=device.type)
    dtype = pick_dtype(model_dtype, device)
    return Precision(master=dtype, compute=dtype, device_type=device.type)


@torch.no_grad()
def copy_in_dtype(
    module: nn.Module,
    dtype: torch.dtype | None,
    *,
    replaced: Mapping[int, Callable[[], torch.Tensor]] | None = None,
) -> Any:
    """A frozen deep copy of `module` whose floating parameters and buffers are made in `dtype`, one
    tensor at a time.

    Why not `copy.deepcopy(module).to(dtype)`: that holds a whole second copy in the source dtype before
    the cast, e.g. 30 GB of fp32 next to a 7B actor on the GPU for a copy that ends up 15 GB of bf16 (a
    LoRA run under a 48 GB budget ran out of memory there). Here each tensor is cast straight from the
    source into its new storage, so the copy's peak is the copy itself. Tied weights stay tied (one
    source tensor, one copy), as in `deepcopy`.

    Args:
        module: the model to copy (its tensors on any device; the copy's stay there).
        dtype: the copy's floating dtype, as `Module.to(dtype)` would cast; None keeps each tensor's own.
        replaced: id of a source parameter -> a function making the tensor its copy takes instead (then
            cast to `dtype`), so a caller that changes a weight in the copy (LoRA's merged weights) never
            copies the old one; called one at a time, so only one such tensor lives at once.
    """
    replaced = replaced or {}

    def cast(tensor: torch.Tensor) -> torch.Tensor:
        make = replaced.get(id(tensor))
        source = tensor.detach() if make is None else make()
        target = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
        return source.to(target, copy=make is None)  # a replacement is a fresh tensor already

    # deepcopy takes a tensor it meets from its memo instead of copying it: every parameter and buffer is
    # placed there already made, so deepcopy only copies the module tree and small attributes.
    memo: dict[int, Any] = {}
    for param in module.parameters():
        memo[id(param)] = nn.Parameter(cast(param), requires_grad=False)
    for buffer in module.buffers():
        memo[id(buffer)] = cast(buffer)
    return copy.deepcopy(module, memo).requires_grad_(False)
