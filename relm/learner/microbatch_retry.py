"""An update's micro-batches that run out of GPU memory are made smaller, and the mini-batch is redone.

The memory plan's token budgets are estimates (`relm.memory.plan`). A logprob or value
forward that does not fit is split in halves on the spot (`relm.trainer.experience`); an update
cannot do that mid-way, because the failed micro-batch's backward may already have added part of its
gradient. So the whole mini-batch starts again: gradients dropped, micro-batches half as large (by
token budget, or by rows when the run cuts by rows), and the smaller size kept for the rest of the run
(the caller stores it), since the next step's batches will be as large. Nothing was stepped yet, so
the optimizer step is the one the smaller micro-batches give: the same gradient up to float rounding.

Only a single process retries: with data parallelism every rank's backward ends in a collective that
the others wait for, and one rank cannot redo a mini-batch alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn

logger = logging.getLogger("relm")
T = TypeVar("T")


@dataclass
class MicroBatchSize:
    """How an update cuts its mini-batches: `max_tokens` per micro-batch when set, else `rows`."""

    rows: int
    max_tokens: int | None
    largest_rows: int = 0
    """Rows in the largest micro-batch of the last cut (set by the update): 1 means nothing to halve."""
    largest_tokens: int = 0
    """Tokens the largest micro-batch of the last cut computed (padding included unless packed): what
    the memory plan's predicted peak is read at."""
    halvings: int = 0

    def halve(self) -> bool:
        """Make the micro-batches half as large; False when they hold one row already."""
        if self.largest_rows <= 1:
            return False
        if self.max_tokens is not None:
            self.max_tokens = max(1, self.max_tokens // 2)
        else:
            self.rows = max(1, self.rows // 2)
        self.halvings += 1
        return True

    def describe(self) -> str:
        return f"{self.max_tokens} tokens" if self.max_tokens is not None else f"{self.rows} rows"


def with_halving_on_oom(
    run: Callable[[MicroBatchSize], T], size: MicroBatchSize, model: nn.Module, what: str, retry: bool
) -> T:
    """`run(size)` (one mini-batch's forwards and backwards); on a GPU out-of-memory, drop the
    gradients, halve `size` and run again, until a micro-batch of one row does not fit (then raise).
    `retry=False` (data parallel) raises at once."""
    while True:
        before = size.describe()
        try:
            return run(size)
        except torch.OutOfMemoryError:
            if not retry or not size.halve():
                raise
        # Outside the except block: the exception's frames (and the tensors they hold) are gone now.
        model.zero_grad(set_to_none=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        logger.warning(
            "%s: out of GPU memory with micro-batches of up to %s; redoing the mini-batch with %s, "
            "kept for the rest of the run",
            what,
            before,
            size.describe(),
        )
