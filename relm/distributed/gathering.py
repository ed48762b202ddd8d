"""When an FSDP2 model gathers its weights and reduces its gradients: once per optimizer step, once per phase.

FSDP2's defaults suit one forward and one backward per optimizer step: each unit (a transformer block,
then the root) all-gathers its weights before its forward and frees them after, gathers them again for
backward, and reduce-scatters its gradients after backward. An update of k micro-batches per
optimizer step thus moves the whole model's gradients k times and its weights 2k times, and a logprob
phase of k forward passes gathers it k times.

- `Accumulation` (the actor's and the critic's updates): the gradients of all but the last
  micro-batch of a mini-batch stay unsharded on each rank (`set_requires_gradient_sync(False)`,
  accumulated in fp32, FSDP's reduce dtype) and are reduced once, with the last. With
  `keep_gathered`, each unit's weights, once gathered, stay until the mini-batch's last backward is
  done (`reshard_after_forward` and `reshard_after_backward` off), and are freed before the optimizer
  step, whose new weights the next mini-batch gathers.
- `gathered_for_passes` (the no-grad logprob and value phases): the weights stay gathered from the
  first forward pass to the last.

Both cost memory: the unsharded gradient of the whole model less the shard it replaces (4 bytes a
parameter x (1 - 1/shard size): nothing for a replicated model), and the whole model's gathered
weights (counted at the master dtype's size, an upper bound under bf16 compute). Each is taken when
it fits `GATHER_SHARE` of the GPU memory free at the start of the phase, the rest staying for
activations; a CPU run (gloo) takes both unless the process has a host budget
(`trainer.max_host_memory_gb`, `DistContext.host_budget_bytes`), which is then what must hold them:
CI runs these paths without one. The ranks take the decision together (the least memory any of them
has decides): a rank that gathers while another does not would wait for it forever. A model under
`CPUOffloadPolicy` takes neither: offloading says memory matters more than speed. A model that is not
FSDP (a single-process run) is left alone.

Summing a rank's micro-batch gradients before reducing them instead of after changes only the order
of fp32 additions: the parity tests hold these paths to the same tolerance as the others.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from relm.distributed.context import DistContext
from relm.memory.host import process_rss_bytes

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule

GATHER_SHARE = 0.5
"""Share of the free GPU memory that deferred gradients and kept weights may take together."""


@dataclass(frozen=True)
class GatherChoice:
    """What an update does differently from FSDP2's per-micro-batch defaults."""

    defer_grad_sync: bool
    """Reduce gradients once per optimizer step (with the mini-batch's last micro-batch)."""
    keep_gathered: bool
    """Gather each unit's weights once per mini-batch instead of once or twice per micro-batch."""


NO_CHANGE = GatherChoice(defer_grad_sync=False, keep_gathered=False)


def fsdp_units(model: nn.Module) -> list[FSDPModule]:
    """The FSDP-managed modules of `model`: its blocks and, last, the root (empty: not FSDP)."""
    from torch.distributed.fsdp import FSDPModule

    units: list[FSDPModule] = [m for m in model.modules() if isinstance(m, FSDPModule)]
    return units[::-1]


def shard_group_size(model: nn.Module) -> int | None:
    """Ranks one copy of `model` is sharded over (1 when replicated); None when it is not FSDP."""
    for param in model.parameters():
        placements = getattr(param, "placements", None)
        if placements is None:
            return None
        shard_dims = [dim for dim, placement in enumerate(placements) if placement.is_shard()]
        return param.device_mesh.size(shard_dims[0]) if shard_dims else 1  # type: ignore[attr-defined]  # a DTensor
    return None


def passes_are_collective(model: nn.Module) -> bool:
    """Whether a forward of `model` exchanges weights with other ranks, so that every rank must make
    the same passes (a replicated model's forward talks to no other rank)."""
    size = shard_group_size(model)
    return size is not None and size > 1


def available_bytes(device: torch.device, dist: DistContext | None = None) -> int | None:
    """GPU memory free for new tensors: the driver's free memory plus the allocator's unused cache; on
    CPU what the process's host budget leaves (None without one: unbounded). With `dist`, the least
    over the ranks (a collective), so that every rank makes the same choice."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        available: int | None = (
            free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        )
    else:
        budget = dist.host_budget_bytes if dist is not None else None
        available = None if budget is None else max(budget - process_rss_bytes(), 0)
    if dist is None or not dist.is_distributed:
        return available
    unbounded = float("inf")
    least = -dist.max_floats([-(unbounded if available is None else float(available))])[0]
    return None if least == unbounded else int(least)


def fits(extra_bytes: int, available: int | None) -> bool:
    """Whether `extra_bytes` stay within `GATHER_SHARE` of `available` (always, when None: CPU)."""
    return available is None or extra_bytes <= GATHER_SHARE * available


def gather_costs(model: nn.Module) -> tuple[int, int]:
    """(bytes of deferred gradients, bytes of kept weights) beyond FSDP2's defaults, for `model`."""
    size = shard_group_size(model) or 1
    numel = sum(p.numel() for p in model.parameters())  # a DTensor's numel is the whole tensor's
    itemsize = next(model.parameters()).dtype.itemsize
    return 4 * numel * (size - 1) // size, itemsize * numel


def choose_for_update(
    model: nn.Module, device: torch.device, dist: DistContext | None = None
) -> GatherChoice:
    """Defer the gradient sync if it fits, then keep the weights gathered if that fits beside it.

    The gradient sync goes first: per micro-batch it moves fp32 gradients, twice the bytes of the
    bf16 weights a gather moves, and a replicated model defers it for free.
    """
    if shard_group_size(model) is None or _offloaded(model, device):
        return NO_CHANGE
    grad_bytes, weight_bytes = gather_costs(model)
    available = available_bytes(device, dist)
    defer = fits(grad_bytes, available)
    return GatherChoice(defer, fits(grad_bytes * defer + weight_bytes, available))


class Accumulation:
    """An update's gradient accumulation, with FSDP's communication once per optimizer step.

    Used around a whole update (`with Accumulation.planned(model, device) as acc:`): `acc.backward`
    each micro-batch's loss, saying whether it is the mini-batch's last, and `acc.end_minibatch()`
    after the last one, before clipping and stepping. For a model that is not FSDP, `backward` is
    `loss.backward()` and the rest does nothing.

    With `world_size` ranks each loss is multiplied by it before backward: the losses are normalised
    by the global mini-batch's counts, so the global gradient is the ranks' sum, while FSDP's
    reduction averages them.
    """

    def __init__(self, model: nn.Module, choice: GatherChoice, world_size: int = 1) -> None:
        self.model = model
        self.choice = choice
        self.world_size = world_size
        self._units = fsdp_units(model) if choice != NO_CHANGE else []

    @classmethod
    def planned(cls, model: nn.Module, device: torch.device, dist: DistContext | None = None) -> Accumulation:
        world_size = dist.world_size if dist is not None and dist.is_distributed else 1
        return cls(model, choose_for_update(model, device, dist), world_size)

    def __enter__(self) -> Accumulation:
        if self.choice.keep_gathered:
            _hold_weights(self._units, hold=True)
        return self

    def backward(self, loss: torch.Tensor, *, last: bool) -> None:
        """Backpropagate one micro-batch's loss; gradients are reduced over ranks only when `last`."""
        if self.choice.defer_grad_sync:  # chosen for FSDP models only
            cast("FSDPModule", self.model).set_requires_gradient_sync(last)
        if self.world_size > 1:
            loss = loss * self.world_size
        loss.backward()

    def end_minibatch(self) -> None:
        """Free the kept weights: the reduced gradients sit on the sharded parameters, which the grad
        clip and the optimizer read, and the step changes the weights the next gather must fetch."""
        if self.choice.keep_gathered:
            _reshard(self._units)

    def __exit__(self, *exc: object) -> None:
        if self.choice.defer_grad_sync:
            cast("FSDPModule", self.model).set_requires_gradient_sync(True)
        if self.choice.keep_gathered:
            _hold_weights(self._units, hold=False)
            _reshard(self._units)


@contextlib.contextmanager
def gathered_for_passes(
    model: nn.Module, device: torch.device, dist: DistContext | None = None
) -> Iterator[bool]:
    """Within it, an FSDP model's no-grad forward passes gather each unit's weights once, not once per
    pass, when the whole model's weights fit (see the module docstring); yields whether they do."""
    hold = shard_group_size(model) is not None and not _offloaded(model, device)
    hold = hold and fits(gather_costs(model)[1], available_bytes(device, dist))
    units = fsdp_units(model) if hold else []
    if hold:
        _hold_weights(units, hold=True)
    try:
        yield hold
    finally:
        if hold:
            _hold_weights(units, hold=False)
            _reshard(units)


def _hold_weights(units: list[FSDPModule], *, hold: bool) -> None:
    """Keep gathered weights through forward and backward, or restore FSDP2's defaults: blocks free
    theirs after forward, the root (last in `units`) keeps its own for the backward that follows."""
    for unit in units:
        unit.set_reshard_after_forward(not hold and unit is not units[-1], recurse=False)
        unit.set_reshard_after_backward(not hold, recurse=False)


def _reshard(units: list[FSDPModule]) -> None:
    for unit in units:
        unit.reshard()


def _offloaded(model: nn.Module, device: torch.device) -> bool:
    """Whether the shards live off the compute device (`CPUOffloadPolicy`)."""
    param = next(model.parameters())
    local = param.to_local() if hasattr(param, "to_local") else param
    return local.device.type != device.type
