"""The generation copy split over a tensor-parallel group (`rollout.tensor_model_parallel_size=N`).

The native and HF engines generate with an HF module; here its decoder layers are split over the N
ranks of a `DeviceMesh` with PyTorch's `torch.distributed.tensor.parallel`, following the plan the
model's own config declares (`base_model_tp_plan`, the one transformers' `tp_plan="auto"` reads):
query/key/value and gate/up projections split by output rows (`ColwiseParallel`: each rank computes
its own heads and its own MLP columns), the output and down projections by input columns
(`RowwiseParallel`: partial sums, all-reduced). Attention code reshapes with `-1` heads, so each rank's
attention runs on its local heads unchanged, and the engines' KV caches are sized by the states the
layers produce: each rank keeps 1/N of the cache. Embeddings, norms and the output head stay whole on
every rank, so every rank of the group computes the same logits and draws the same tokens from the same
seed; the engines' loops need no change.

Only the plain styles split (`colwise`, `rowwise`); modules under any other entry stay whole (an
embedding, packed experts). A plan with no plain entry (Phi-3's fused qkv, `colwise_gather_output`) is
refused, as are head counts the group size does not divide.

The parameters become DTensors; `copy_whole_into` writes a whole tensor (a weight sync, the initial
fill from the trainer's shards) into such a parameter by taking this rank's piece of it.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

TENSOR_PARALLEL_STYLES = ("colwise", "rowwise")
"""Entries of a model's `base_model_tp_plan` that split a Linear layer here; the module of any other entry
(`embedding_rowwise`, `replicated_with_grad_allreduce` q/k norms, packed experts) stays whole on every
rank, which computes the same numbers, only without saving its memory."""


def model_tp_plan(model: nn.Module) -> dict[str, str]:
    """The model's tensor-parallel plan as full module-name patterns (`model.layers.*.self_attn.q_proj`)."""
    plan = config_tp_plan(model.config)
    prefix = getattr(model, "base_model_prefix", "")
    base = getattr(model, prefix, None) if prefix else None
    return {
        f"{prefix}.{pattern}" if isinstance(base, nn.Module) else pattern: style
        for pattern, style in plan.items()
    }


def config_tp_plan(config: Any) -> dict[str, str]:
    """The decoder's `base_model_tp_plan` (module-name patterns relative to the base model -> style)."""
    return dict(getattr(config.get_text_config(), "base_model_tp_plan", None) or {})


def tensor_parallel_config_blocker(config: Any, tp_size: int) -> str | None:
    """Why a model of `config` cannot generate split over `tp_size` ranks (one clause), or None: its
    plan splits nothing the plain styles split, or `tp_size` does not divide its heads."""
    text = config.get_text_config()
    name = (getattr(config, "architectures", None) or [type(config).__name__])[0]
    plan = config_tp_plan(config)
    if not any(style in TENSOR_PARALLEL_STYLES for style in plan.values()):
        styles = ", ".join(sorted(set(plan.values()))) or "none"
        return f"{name}'s tensor-parallel plan (base_model_tp_plan) has no colwise/rowwise layers (it has: {styles})"
    heads = getattr(text, "num_attention_heads", None)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    for what, count in (("attention heads", heads), ("key/value heads", kv_heads)):
        if isinstance(count, int) and count % tp_size:
            return f"{name} has {count} {what}, not divisible by {tp_size}"
    return None


def tensor_parallel_blocker(model: nn.Module, tp_size: int) -> str | None:
    """`tensor_parallel_config_blocker`, then each planned layer's split dimension (one clause), or None."""
    problem = tensor_parallel_config_blocker(model.config, tp_size)
    if problem:
        return problem
    planned = _planned_linears(model, model_tp_plan(model))
    if not planned:  # the plan names modules the built model does not have (a nested language model)
        return f"no Linear layer of {type(model).__name__} matches its tensor-parallel plan"
    for module_name, linear, style in planned:
        size = linear.out_features if style == "colwise" else linear.in_features
        if size % tp_size:
            side = "output" if style == "colwise" else "input"
            return f"{module_name} has {size} {side} features, not divisible by {tp_size}"
    return None


def shard_for_generation(model: nn.Module, mesh: Any) -> nn.Module:
    """Split `model` (a frozen generation copy, on any device or the meta device) over the 1-D
    `mesh`'s ranks, in place; returns it. Check `tensor_parallel_blocker` first.

    Imported lazily: a single-process run never loads `torch.distributed`'s tensor machinery.
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    plan = {name: styles[style]() for name, _, style in _planned_linears(model, model_tp_plan(model))}
    parallelize_module(model, mesh, plan)
    for param in model.parameters():
        param.requires_grad_(False)
    return model


def _planned_linears(model: nn.Module, plan: dict[str, str]) -> list[tuple[str, nn.Linear, str]]:
    """(name, layer, style) of every Linear the plan splits."""
    found = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        style = next((s for pattern, s in plan.items() if _matches(pattern, name)), None)
        if style in TENSOR_PARALLEL_STYLES:
            found.append((name, module, style))
    return found


def _matches(pattern: str, name: str) -> bool:
    """Whether module `name` is the plan's `pattern`, whose `*` stands for a layer index (as transformers
    reads its plans), never for a path of several names."""
    return re.fullmatch(re.escape(pattern).replace(r"\*", r"\d+"), name) is not None


def is_split(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is a DTensor parameter of a split generation copy."""
    return hasattr(tensor, "device_mesh") and hasattr(tensor, "to_local")


def group_size(model: nn.Module) -> int:
    """Ranks `model`'s split layers are split over (1 when none is split). FSDP2-sharded parameters are
    DTensors too; only a tensor-parallel plan's `Shard` pieces of Linear layers count here."""
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, nn.Linear) and weight is not None and is_split(weight):
            split: Any = weight
            return int(split.device_mesh.size())
    return 1


def local_numel(tensor: torch.Tensor) -> int:
    """Elements this rank holds of `tensor` (a split parameter's piece, or the whole tensor)."""
    if is_split(tensor):
        split: Any = tensor
        return int(split.to_local().numel())
    return tensor.numel()


def local_piece(whole: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """This rank's piece of `whole` where `target` (a DTensor of `whole`'s shape) keeps its own."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(whole.shape, target.device_mesh, target.placements)  # type: ignore[attr-defined]  # a DTensor
    piece = whole
    for dim, (start, size) in enumerate(zip(offset, shape, strict=True)):
        if size != whole.shape[dim]:
            piece = piece.narrow(dim, start, size)
    return piece


@torch.no_grad()
def copy_whole_into(target: torch.Tensor, whole: torch.Tensor) -> None:
    """Copy the whole tensor `whole` into `target`: a plain tensor, or a split parameter's own piece
    (no collective: every rank of the group has `whole` and takes its piece)."""
    if is_split(target):
        split: Any = target  # a DTensor
        split.to_local().copy_(local_piece(whole, target))
    else:
        target.copy_(whole)


@torch.no_grad()
def materialize_split(model: nn.Module, device: torch.device, dtype: torch.dtype) -> None:
    """Give the split parameters of a generation copy built on the meta device empty local pieces on
    `device` in `dtype`; whole ones are left to `materialize_parameters`."""
    from torch.distributed.tensor import DTensor

    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None or not is_split(param) or param.device.type != "meta":
                continue
            meta: Any = param  # a DTensor
            empty = torch.empty(meta.to_local().shape, dtype=dtype, device=device)
            split = DTensor.from_local(
                empty,
                meta.device_mesh,
                meta.placements,
                run_check=False,
                shape=meta.shape,
                stride=meta.stride(),
            )
            module._parameters[name] = nn.Parameter(split, requires_grad=False)
