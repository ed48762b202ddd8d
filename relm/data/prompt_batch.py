"""Typed records that leave the data stage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
