"""`PromptLoader`: endless, seeded, resumable batches of prompts.

The order of epoch e is a permutation drawn from a generator seeded with `seed + e`, so the
loader's whole future is a function of (seed, epoch, step_in_epoch): a checkpoint stores those two
counters and a resumed run sees exactly the batches the uninterrupted run would have seen.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from relm.data.dataset import PromptDataset
from relm.data.prompt_batch import PromptBatch
from relm.errors import UserError


class PromptLoader:
    """Batches of a `PromptDataset`, epoch after epoch.

    Args:
        dataset: The prompts.
        batch_size: Prompts per batch.
        shuffle: Draw a new seeded order each epoch; false keeps dataset order.
        seed: Base seed of the per-epoch orders.
        drop_last: Drop the last partial batch of each epoch (training: every step the same size).
        batch_size_key: Config key of `batch_size`, named in error messages.
    """

    def __init__(
        self,
        dataset: PromptDataset,
        batch_size: int,
        *,
        shuffle: bool,
        seed: int,
        drop_last: bool = True,
        batch_size_key: str = "data.train_batch_size",
    ) -> None:
        if batch_size < 1:
            raise UserError(f"{batch_size_key}={batch_size}: must be at least 1")
        if drop_last and len(dataset) < batch_size:
            raise UserError(
                f"{batch_size_key}={batch_size} is larger than the dataset ({len(dataset)} prompts after "
                f"length filtering); lower {batch_size_key} or add prompts"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        """Epoch of the next batch (= epochs finished)."""
        self.step_in_epoch = 0
        """Position of the next batch within its epoch."""
        self._order: list[int] = []
        self._order_epoch = -1

    @property
    def batches_per_epoch(self) -> int:
        full, rest = divmod(len(self.dataset), self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def next_batch(self) -> PromptBatch:
        """The batch at the current position; advances, rolling over into the next epoch.

        The rollover happens right after an epoch's last batch, so `epoch` counts finished epochs
        once a pass is done (a trainer stops when `epoch == total_epochs`).
        """
        order = self._epoch_order(self.epoch)
        start = self.step_in_epoch * self.batch_size
        batch = self._collate(order[start : start + self.batch_size])
        self.step_in_epoch += 1
        if self.step_in_epoch >= self.batches_per_epoch:
            self.epoch, self.step_in_epoch = self.epoch + 1, 0
        return batch

    def __iter__(self) -> Iterator[PromptBatch]:
        """Endless batches from the current position (training pulls as many steps as it runs)."""
        while True:
            yield self.next_batch()

    def iter_epoch(self) -> Iterator[PromptBatch]:
        """The rest of the current epoch, then stop; called again, the whole next epoch (validation)."""
        epoch = self.epoch
        while self.epoch == epoch:
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        """Position plus the sizes it is meaningful for."""
        return {
            "epoch": self.epoch,
            "step_in_epoch": self.step_in_epoch,
            "batch_size": self.batch_size,
            "num_prompts": len(self.dataset),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at a saved position.

        Raises:
            UserError: The saved position was for another batch size or dataset size, where the
                same counters would point at other prompts.
        """
        if state["batch_size"] != self.batch_size or state["num_prompts"] != len(self.dataset):
            raise UserError(
                f"data.train_batch_size / data.train_files: the checkpoint's data loader ran with batch size "
                f"{state['batch_size']} over {state['num_prompts']} prompts, this run has {self.batch_size} "
                f"over {len(self.dataset)}; restore them or set trainer.resume_mode=disable"
            )
        self.epoch = int(state["epoch"])
        self.step_in_epoch = int(state["step_in_epoch"])

    def _epoch_order(self, epoch: int) -> list[int]:
        if self._order_epoch != epoch:
            if self.shuffle:
                generator = torch.Generator().manual_seed(self.seed + epoch)
                self._order = torch.randperm(len(self.dataset), generator=generator).tolist()
            else:
                self._order = list(range(len(self.dataset)))
            self._order_epoch = epoch
        return self._order

    def _collate(self, indices: list[int]) -> PromptBatch:
        items = [self.dataset[i] for i in indices]
        return PromptBatch(
            prompt_ids=[list(item["prompt_ids"]) for item in items],
            data_sources=[item["data_source"] for item in items],
            ground_truths=[item["ground_truth"] for item in items],
            extra_infos=[dict(item["extra_info"]) for item in items],
            indices=list(indices),
            raw_prompts=[item["raw_prompt"] for item in items] if self.dataset.return_raw_chat else [],
        )
