"""Models that wait in CPU memory outside the phases that use them (the memory plan's "parking").

A step uses its models one phase at a time: the engine's generator copy while generating and
syncing, the reference model for one forward, the critic for its values and its update. When the
memory plan finds that the actor's update does not fit beside all of them, the ones it names are
moved to pinned CPU memory when their phase ends and back when it starts. A 7B model's bf16 copy
moves in about half a second each way over PCIe, small beside the step it makes possible.

Moving is done on the tensors' `.data`, so parameter objects (and the optimizer state keyed by them)
stay the same; CUDA graphs captured over the old addresses are dropped and recaptured by the engine
(`DecodeGraphs.check_weights`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

PHASE_NEEDS = {
    "generate": {"generator"},
    "old_log_prob": set(),
    "reference": {"reference"},
    "values": {"critic"},
    "update_critic": {"critic"},
    "update_actor": set(),
    "sync": {"generator"},
}
"""Which parkable models each phase of `ppo_step` uses."""


class ParkedModel:
    """One model (and optionally its optimizer's states) that can move between the GPU and pinned CPU memory.

    Args:
        module: the model.
        device: where it computes.
        optimizer: its optimizer, whose per-parameter state tensors move with it.
    """

    def __init__(
        self, module: nn.Module, device: torch.device, optimizer: torch.optim.Optimizer | None = None
    ):
        self.module = module
        self.device = torch.device(device)
        self.optimizer = optimizer
        self.parked = False
        self._host: dict[int, torch.Tensor] = {}

    def park(self) -> None:
        """Copy every tensor into its pinned CPU buffer and release the device copy."""
        if self.parked:
            return
        for tensor in self._tensors():
            host = self._host.get(id(tensor))
            if host is None:
                host = torch.empty(
                    tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=torch.cuda.is_available()
                )
                self._host[id(tensor)] = host
            host.copy_(tensor.data, non_blocking=True)
            tensor.data = host
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
        self.parked = True

    def unpark(self) -> None:
        """Bring every tensor back to the device (new device memory; the pinned buffers stay for next time)."""
        if not self.parked:
            return
        for tensor in self._tensors():
            tensor.data = tensor.data.to(self.device, non_blocking=True)
        self.parked = False

    def _tensors(self) -> Iterator[torch.Tensor]:
        yield from self.module.parameters()
        yield from self.module.buffers()
        if self.optimizer is not None:
            for state in self.optimizer.state.values():
                yield from (
                    value for value in state.values() if isinstance(value, torch.Tensor) and value.dim()
                )


class Residency:
    """The parkable models of a run and the phase that is running; `phase(name)` moves what it needs."""

    def __init__(self, models: dict[str, ParkedModel]) -> None:
        unknown = set(models) - {name for needs in PHASE_NEEDS.values() for name in needs}
        if unknown:
            raise ValueError(f"no phase uses {sorted(unknown)}")
        self.models = models

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Park what `name` does not use, bring back what it does; nothing moves when nothing is parkable."""
        needs = PHASE_NEEDS[name]
        for model_name, model in self.models.items():
            if model_name not in needs:
                model.park()
        for model_name in needs:
            if model_name in self.models:
                self.models[model_name].unpark()
        yield
