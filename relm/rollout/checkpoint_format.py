"""The actor's weights as a checkpoint would name and shape them, streamed one layer at a time.

An engine with its own model code (vLLM) loads weights through the same function that reads a
checkpoint folder, so it expects checkpoint names and layouts: one `experts.3.gate_proj.weight` per
expert, where transformers 5 holds all experts of a layer fused in one `experts.gate_up_proj` tensor.
transformers itself undoes its load-time conversions when it saves (`revert_weight_conversion`);
applying that to one decoder layer's tensors at a time yields the checkpoint form without a full
second copy of the model: the reverted tensors are mostly views, and at most one layer's experts are
copied at once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch
from torch import nn

_LAYER_PREFIX = re.compile(r"^(.*?\.layers\.\d+\.)")
"""`model.layers.7.` of `model.layers.7.mlp.experts.gate_up_proj`: tensors that convert together."""


def checkpoint_format(
    model: nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield `(checkpoint name, tensor)` for `model`'s `(parameter name, tensor)` pairs, layer by layer.

    Args:
        model: the HF model the names belong to; its conversion rules (recorded by `from_pretrained`,
            or transformers' defaults for its class) decide the checkpoint form.
        named_tensors: e.g. `model.named_parameters()`; sharded DTensors are gathered one at a time.
            Tensors of one decoder layer must come together (as `named_parameters` yields them).
    """
    from transformers.core_model_loading import revert_weight_conversion

    group: dict[str, torch.Tensor] = {}
    group_key: str | None = None
    for name, tensor in named_tensors:
        match = _LAYER_PREFIX.match(name)
        key = match.group(1) if match else name
        if group and key != group_key:
            yield from revert_weight_conversion(model, group).items()  # type: ignore[arg-type]  # nn.Module hides the HF model's API
            group = {}
        group_key = key
        group[name] = _full(tensor).detach()
    if group:
        yield from revert_weight_conversion(model, group).items()  # type: ignore[arg-type]  # nn.Module hides the HF model's API


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind a possibly sharded DTensor (FSDP2 parameters)."""
    full_tensor = getattr(tensor, "full_tensor", None)
    return full_tensor() if callable(full_tensor) else tensor
