"""`ExperienceBatch`: one step's responses and everything computed about them.

Layout follows verl: the prompt block is left-padded and the response block right-padded, so the
concatenation `[prompt | response]` has the boundary at a fixed column P and every response token
t sits at column P + t. Tensors over response tokens are all [N, R].
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import torch


@dataclass
class ExperienceBatch:
    """N = num_prompts * n responses. Optional fields are filled stage by stage."""

    prompt_ids: torch.Tensor
    """[N, P] int64, left-padded."""
    prompt_mask: torch.Tensor
    """[N, P] int64."""
    response_ids: torch.Tensor
    """[N, R] int64, right-padded."""
    response_mask: torch.Tensor
    """[N, R] int64, 1 on the tokens the model generated: what losses, KL, entropy and advantages cover."""
    group_ids: torch.Tensor
    """[N] int64, the prompt each response answers (GRPO-style groups)."""
    data_sources: list[str]
    ground_truths: list[Any]
    extra_infos: list[dict[str, Any]]
    finish_reasons: list[str]
    response_attention_mask: torch.Tensor | None = None
    """[N, R] int64, 1 on every response token the model attends to: the sampled ones and, in a
    multi-turn rollout, the tool results between them (0 in `response_mask`). None: `response_mask`."""
    reward_extras: list[dict[str, float]] | None = None
    """N dicts: the numbers the reward function returned beside each score (for the sample dumps)."""
    rollout_logprobs: torch.Tensor | None = None
    """[N, R] logprobs reported by the rollout engine."""
    baseline_scores: torch.Tensor | None = None
    """[N] score of the greedy response to the same prompt (ReMax's baseline)."""
    old_logprobs: torch.Tensor | None = None
    """[N, R] actor logprobs before this step's update."""
    rollout_is_weights: torch.Tensor | None = None
    """[N, R] rollout importance weights multiplying the policy loss (`algorithm.rollout_correction.rollout_is`)."""
    ref_logprobs: torch.Tensor | None = None
    """[N, R] reference-model logprobs."""
    values: torch.Tensor | None = None
    """[N, R] critic values before this step's update."""
    token_scores: torch.Tensor | None = None
    """[N, R] task score on the last response token, 0 elsewhere."""
    token_rewards: torch.Tensor | None = None
    """[N, R] scores minus the in-reward KL penalty (if any)."""
    advantages: torch.Tensor | None = None
    """[N, R]."""
    returns: torch.Tensor | None = None
    """[N, R]."""

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    @property
    def input_ids(self) -> torch.Tensor:
        """[N, P + R] prompt and response."""
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def response_tokens(self) -> torch.Tensor:
        """[N, R] 1 on every real response token (sampled or tool result): the whole conversation."""
        return self.response_mask if self.response_attention_mask is None else self.response_attention_mask

    @property
    def attention_mask(self) -> torch.Tensor:
        """[N, P + R]."""
        return torch.cat([self.prompt_mask, self.response_tokens], dim=1)

    @property
    def position_ids(self) -> torch.Tensor:
        """[N, P + R]: 0 at each row's first real token, so left padding does not shift positions."""
        return (self.attention_mask.cumsum(dim=1) - 1).clamp(min=0)

    @property
    def response_width(self) -> int:
        return self.response_ids.shape[1]

    def select(self, index: torch.Tensor | list[int]) -> ExperienceBatch:
        """The rows at `index` (tensor fields indexed, list fields picked), for mini/micro-batches."""
        idx = torch.as_tensor(index, dtype=torch.long)
        picked: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                picked[f.name] = value[idx.to(value.device)]
            elif isinstance(value, list):
                picked[f.name] = [value[i] for i in idx.tolist()]
        return replace(self, **picked)

    @staticmethod
    def concat(batches: list[ExperienceBatch], pad_token_id: int) -> ExperienceBatch:
        """Rows of several batches in order; prompt blocks are re-left-padded to a common width.

        Group ids must already be distinct across the batches (the caller offsets them).
        """
        width = max(b.prompt_ids.shape[1] for b in batches)

        def left_widen(t: torch.Tensor, fill: int) -> torch.Tensor:
            return torch.nn.functional.pad(t, (width - t.shape[1], 0), value=fill)

        merged: dict[str, Any] = {}
        for f in fields(ExperienceBatch):
            values = [getattr(b, f.name) for b in batches]
            if f.name == "prompt_ids":
                merged[f.name] = torch.cat([left_widen(v, pad_token_id) for v in values])
            elif f.name == "prompt_mask":
                merged[f.name] = torch.cat([left_widen(v, 0) for v in values])
            elif all(v is None for v in values):
                merged[f.name] = None
            elif isinstance(values[0], torch.Tensor):
                merged[f.name] = torch.cat(values)
            else:
                merged[f.name] = [item for v in values for item in v]
        return ExperienceBatch(**merged)

    def to(self, device: torch.device | str) -> ExperienceBatch:
        """A copy with every tensor on `device`."""
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return replace(self, **moved)
