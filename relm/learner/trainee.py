"""One trained model and everything that trains it: the record the run holds for the actor and the critic.

The run holds an `actor` and an optional `critic` of this type (`relm.trainer.components.RunComponents`);
updates, checkpoints, out-of-memory halving and the memory plan loop over them instead of keeping a
field per model. A new trained model (a LoRA actor, a reward model being fitted) is one more
`Trainee`, not one more set of `actor_*`/`critic_*` fields.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from relm.learner.microbatch_retry import MicroBatchSize
from relm.memory.offload import OffloadedOptimizerStates


@dataclass(frozen=True)
class Batching:
    """How a trained model's update and its no-grad forwards cut a step's rows; resolved once from the
    config (`relm.trainer.components.compute_sizes`), never changed."""

    rows_per_minibatch: int
    """Responses per optimizer step over the whole run (each rank updates with a 1/world share)."""
    rows_per_microbatch: int
    """Responses per forward/backward, per GPU (the start value of `Trainee.microbatch.rows`)."""
    rows_per_forward: int
    """Responses per no-grad forward: old logprobs for the actor, values for the critic."""
    num_epochs: int
    """Passes over the step's responses."""
    shuffle: bool
    """Mini-batches drawn in a fresh random order each pass."""
    remove_padding: bool
    """Forwards pack the rows without padding (`model.use_remove_padding`)."""


@dataclass
class Trainee:
    """A model being trained, with its optimizer, schedule, batching and offload state."""

    name: str
    """`actor` or `critic`: the metric prefix and the checkpoint subfolder."""
    module: nn.Module
    """The model (a causal LM, or a `ValueModel`); FSDP-sharded in a data-parallel run."""
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    grad_clip: float
    """The global gradient norm its updates clip to (`grad_clip`); the loss settings are the objective's."""
    batching: Batching
    microbatch: MicroBatchSize
    """How updates cut mini-batches now: the config's or the plan's size, made smaller (and kept so for
    the rest of the run) after an update runs out of GPU memory. Its token budget also cuts the
    model's no-grad forwards."""
    optimizer_offload: OffloadedOptimizerStates | None = None
    """Set when the memory plan keeps the AdamW moments in CPU memory (the `step` is chunked)."""
    vocab_limit: int | None = None
    """A policy's tokenizer length: logits of ids past it (embedding rows no token reaches) are left out of
    its logprobs and entropy, as the engine never samples them. None for a value model."""
