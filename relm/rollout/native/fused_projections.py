"""One matrix product for the projections that read the same input (q/k/v, gate/up) while generating.

At decode batch sizes a layer's products are small: for the Qwen2.5-1.5B shape at 256 rows the key
and value projections are [256 x 1536] @ [1536 x 256], a few microseconds each of mostly fixed cost,
and the query projection is not much bigger. Concatenating the weights of projections that take the
same input turns three products into one (and gate/up into one), which keeps more of the GPU busy
per launch; vLLM and TensorRT-LLM store those weights fused for the same reason.

relm keeps the HF module (its names are what weight syncing and checkpoints speak), so the fusion is
done in storage: each group's weights are copied into one buffer and every member's parameter is
re-pointed at its rows (`.data` views), so in-place updates (`sync_weights`) keep writing where the
fused product reads. While `applied()` is active, the first member (q_proj, gate_proj) computes the
whole group's product and hands the other members their columns when they are called with the same
input; any other call computes its own product as before, so an architecture that calls its
projections differently gets the same numbers, just unfused.

Only a model nobody trains is fused (every parameter frozen: the GPU engine copy). A trained
model's parameters are what its optimizer, sharding and checkpoints hold; re-pointing them at one
shared buffer would change their storage under all of those. Nothing here holds the buffer between
calls: `applied()` finds it again from the members' storage, so parking the engine copy in CPU memory
(which replaces each parameter's `.data`) frees it, and the next `applied()` fuses the returned
weights again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
"""Sibling projections that transformers' decoder layers call on one input, by their HF names."""


class ProjectionGroup:
    """Sibling `nn.Linear`s of one module whose weights live in one buffer, and their shared product."""

    def __init__(self, linears: list[nn.Linear]) -> None:
        self.linears = linears
        self.sizes = [linear.out_features for linear in linears]
        self.weight: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None
        self.product: Callable[[torch.Tensor], torch.Tensor] | None = None
        """The group's product for an input when not `F.linear(x, weight, bias)` (FP8 rollout weights,
        `relm.rollout.native.fp8`); set only while generating."""
        self._input: torch.Tensor | None = None
        self._pending: list[torch.Tensor | None] = []

    def ensure_fused(self) -> None:
        """Make the members' weights views of one buffer (again, if something moved them).

        The buffer is found again from the members' storage on every call rather than kept: a reference
        held between calls would keep it on the GPU after parking has moved the members to CPU memory.
        """
        self.weight = _adjacent_view([linear.weight for linear in self.linears])
        has_bias = self.linears[0].bias is not None
        self.bias = _adjacent_view([linear.bias for linear in self.linears]) if has_bias else None
        if self.weight is not None and (self.bias is not None or not has_bias):
            return
        self.weight = _concatenate([linear.weight for linear in self.linears])
        self.bias = _concatenate([linear.bias for linear in self.linears]) if has_bias else None
        start = 0
        for linear, size in zip(self.linears, self.sizes, strict=True):
            linear.weight.data = self.weight[start : start + size]
            if self.bias is not None:
                linear.bias.data = self.bias[start : start + size]
            start += size

    def member_forward(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Member `index`'s output for `x`.

        The first member (q_proj, gate_proj) computes the whole group's product and keeps the others'
        columns for `x`; a later member called with that same input takes its columns. Any other call
        (a member on another input, as cross-attention calls k/v on the encoder's states) computes its
        own product only, so an architecture that does not follow the pattern pays nothing extra.
        """
        if self._input is x and (pending := self._pending[index]) is not None:
            out = pending
        elif index == 0:
            assert self.weight is not None, "ensure_fused() comes first (`FusedProjections.applied`)"
            product = self.product(x) if self.product is not None else F.linear(x, self.weight, self.bias)
            out, *others = product.split(self.sizes, dim=-1)
            self._pending = [out, *others]
            self._input = x
        else:
            linear = self.linears[index]
            return F.linear(x, linear.weight, linear.bias)
        self._pending[index] = None
        if all(p is None for p in self._pending[1:]):
            self._input = None  # every member served: hold no activations between calls
        return out

    def reset(self) -> None:
        self._input, self._pending = None, [None] * len(self.linears)

    def release(self) -> None:
        """Drop every reference to the buffer and activations; the members' views keep the weights."""
        self.reset()
        self.weight = self.bias = None


class FusedProjections:
    """The projection groups of a frozen model, switched in around generation.

    Args:
        model: the engine's model; nothing is fused while any parameter requires grad.
        enabled: False fuses nothing (for comparisons).
    """

    def __init__(self, model: nn.Module, enabled: bool = True) -> None:
        self.model = model
        self.groups = find_groups(model) if enabled and _frozen(model) else []

    @property
    def active(self) -> bool:
        return bool(self.groups)

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """Fuse (or re-fuse) the weights and route the members' calls through their groups."""
        # Checked per call too: a model frozen when the engine was built may be trained since.
        groups = self.groups if _frozen(self.model) else []
        try:
            for group in groups:
                group.ensure_fused()
                group.reset()
                for index, linear in enumerate(group.linears):
                    # An instance attribute over the class's forward, popped again below.
                    linear.forward = _bound(group, index)  # type: ignore[method-assign]
            yield
        finally:
            # Also after a failure half-way through the set-up (out of memory re-fusing after parking).
            for group in groups:
                group.release()
                for linear in group.linears:
                    linear.__dict__.pop("forward", None)  # the class's own forward again


def find_groups(model: nn.Module) -> list[ProjectionGroup]:
    """Every module's `GROUPS` whose members are distinct plain linears over one input size and dtype,
    none of them shared with another group (a shared weight cannot be a view of two buffers)."""
    groups = []
    claimed: set[int] = set()
    for module in model.modules():
        for names in GROUPS:
            linears: list[Any] = [getattr(module, name, None) for name in names]  # `_fusable` checks them
            if not all(_fusable(linear, linears[0]) for linear in linears):
                continue
            tensors = {
                id(t) for linear in linears for t in (linear, linear.weight, linear.bias) if t is not None
            }
            if len(tensors) < len(linears) * (2 + (linears[0].bias is not None)) or tensors & claimed:
                continue
            claimed |= tensors
            groups.append(ProjectionGroup(linears))
    return groups


def _frozen(model: nn.Module) -> bool:
    return not any(p.requires_grad for p in model.parameters())


def _fusable(linear: object, first: object) -> bool:
    if type(linear) is not nn.Linear or type(first) is not nn.Linear:
        return False
    same = (
        linear.in_features == first.in_features
        and linear.weight.dtype == first.weight.dtype
        and linear.weight.device == first.weight.device
        and (linear.bias is None) == (first.bias is None)
        and (
            linear.bias is None
            or (linear.bias.dtype == first.weight.dtype and linear.bias.device == first.weight.device)
        )
    )
    # Hooks and forwards set on the instance (adapters, quantization observers, accelerate's
    # offloading) expect their own module's product.
    own_code = (
        linear._forward_hooks
        or linear._forward_pre_hooks
        or "forward" in vars(linear)
        or hasattr(linear, "_hf_hook")
    )
    return same and not own_code


def _adjacent_view(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """The tensors as one [sum of rows, ...] tensor when they already lie back to back in one storage
    (what `ensure_fused` left them as), else None."""
    first = tensors[0]
    storage = first.untyped_storage().data_ptr()
    expected = first.data_ptr()
    for tensor in tensors:
        if (
            not tensor.is_contiguous()
            or tensor.untyped_storage().data_ptr() != storage
            or tensor.data_ptr() != expected
            or tensor.shape[1:] != first.shape[1:]
        ):
            return None
        expected += tensor.numel() * tensor.element_size()
    rows = sum(tensor.shape[0] for tensor in tensors)
    return (
        first.detach()
        .new_empty(0)
        .set_(first.untyped_storage(), first.storage_offset(), (rows, *first.shape[1:]), first.stride())
    )


def _concatenate(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach() for t in tensors], dim=0)


def _bound(group: ProjectionGroup, index: int):  # noqa: ANN202 - a closure standing in for Linear.forward
    def forward(x: torch.Tensor) -> torch.Tensor:
        return group.member_forward(index, x)

    return forward
