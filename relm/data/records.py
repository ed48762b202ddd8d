"""Typed records that leave the data stage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class PromptBatch:
    """One step's prompts, tokenized (chat template applied), not yet padded."""

    prompt_ids: list[list[int]]
    """B lists of token ids."""
    data_sources: list[str]
    """B values of the `data.reward_fn_key` column; they pick the rule scorer."""
    ground_truths: list[Any]
    """B values of `reward_model.ground_truth` (None where absent)."""
    extra_infos: list[dict[str, Any]]
    """B values of `extra_info` ({} where absent)."""
    indices: list[int]
    """B row numbers in the dataset, for error messages and resume."""
    raw_prompts: list[list[dict[str, str]]] = field(default_factory=list)
    """B chat message lists, kept when `data.return_raw_chat` is on."""

    def __len__(self) -> int:
        return len(self.prompt_ids)


def left_pad(
    sequences: list[list[int]], pad_id: int, width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists into ([B, W] ids, [B, W] mask); W is the longest unless given.

    Left padding keeps every prompt's last token in the same column, which is where generation
    continues and where the response starts in the concatenated training sequence.
    """
    width = max((len(s) for s in sequences), default=0) if width is None else width
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if len(seq) > width:
            raise ValueError(f"sequence of {len(seq)} tokens does not fit width {width}")
        if seq:
            ids[row, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
            mask[row, width - len(seq) :] = 1
    return ids, mask
