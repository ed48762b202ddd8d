"""What the rollout engine receives after each actor update, and the check that it arrived.

Full fine-tuning sends every parameter by name. A LoRA actor sends only the weights its adapters change,
merged (`W + scaling * B @ A`), to an engine that holds its own plain copy, and then reads one of them back
from that copy: an adapter that never reaches the engine is the failure LoRA users of other frameworks meet
most (the engine keeps sampling the initial policy while training "runs"), and here it ends the run at
the first sync instead. An engine that generates with the actor module itself (CPU, fp32) computes the
adapters in its forward and needs nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from relm.learner.lora import check_synced, has_lora, merged_weights, probe_name


@dataclass
class WeightSync:
    """The actor's side of `RolloutEngine.sync_weights`."""

    actor: nn.Module
    engine_model: nn.Module | None
    """The module the engine generates with (the actor itself, or its separate copy: bf16 on a GPU); None
    when the engine keeps its weights out of reach (vLLM)."""

    @property
    def lora(self) -> bool:
        return has_lora(self.actor)

    @property
    def colocated(self) -> bool:
        """The engine generates with the actor module itself (adapters run in its forward)."""
        return self.engine_model is self.actor

    def tensors(self) -> Iterable[tuple[str, torch.Tensor]]:
        """Named tensors for `sync_weights`: every parameter, or a LoRA actor's merged adapted weights."""
        if not self.lora:
            return self.actor.named_parameters()
        return () if self.colocated else merged_weights(self.actor)

    def verify(self) -> None:
        """Raise `AdapterNotSynced` if a LoRA actor's separate engine copy missed the sync."""
        if not self.lora or self.engine_model is None or self.colocated:
            return
        name = probe_name(self.actor)
        if name is not None:
            check_synced(self.actor, self.engine_model, name)
