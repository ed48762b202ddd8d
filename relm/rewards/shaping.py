"""Reward shaping that depends on the response, not on the task: DAPO's soft overlong punishment."""

from __future__ import annotations

import torch


def overlong_penalty(
    response_lengths: torch.Tensor, *, max_response_length: int, buffer_len: int, penalty_factor: float
) -> torch.Tensor:
    """[N] penalty (<= 0) for responses that run into the last `buffer_len` tokens of the limit.

    DAPO (Yu et al. 2025, arXiv:2503.14476, "soft overlong punishment"): zero up to
    `max_response_length - buffer_len` tokens, then falling linearly to `-penalty_factor` at the
    limit, so truncated responses are discouraged without a cliff in the reward.
    """
    expected = max_response_length - buffer_len
    excess = (response_lengths.float() - expected).clamp(min=0)  # [N]
    return -excess / buffer_len * penalty_factor
