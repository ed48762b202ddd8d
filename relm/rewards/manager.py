"""`RewardManager`: decode each response, score it, and place the score on its last token.

This is verl's "naive" reward manager: one call of the scoring function per response. Its other
job is to check what the (often user-written) function returns, because a None or NaN reward that
slips through poisons every advantage of the step and surfaces, if ever, as a diverged run.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from relm.errors import UserError


@dataclass
class RewardResult:
    """Scores of N responses."""

    scores: torch.Tensor
    """[N] float32, one score per response."""
    token_scores: torch.Tensor
    """[N, R] float32, the score on each response's last token, 0 elsewhere."""
    extra: dict[str, list[float]] = field(default_factory=dict)
    """Extra numeric values the function returned in its dict, N each (NaN where a row lacked the key)."""
    texts: list[str] = field(default_factory=list)
    """N decoded responses (special tokens skipped), as the function saw them."""


def place_on_last_token(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Put each response's score on its last generated token.

    The mask's last 1 is used, not its length, so any mask shape works. A response with no
    tokens has nowhere to carry a score: its row stays all zero, so it contributes no reward and
    no gradient (engines emit at least one token whenever max_new_tokens >= 1).

    Args:
        scores: [N] one score per response.
        response_mask: [N, R] 1 on generated tokens.

    Returns:
        [N, R] float32.
    """
    num_rows, width = response_mask.shape
    token_scores = torch.zeros((num_rows, width), dtype=torch.float32, device=response_mask.device)
    if width == 0:
        return token_scores
    positions = torch.arange(width, device=response_mask.device).expand(num_rows, width)  # [N, R]
    last = torch.where(response_mask.bool(), positions, -1).amax(dim=1)  # [N], -1 for empty responses
    rows = torch.nonzero(last >= 0).squeeze(1)  # [M]
    token_scores[rows, last[rows]] = scores.to(device=response_mask.device, dtype=torch.float32)[rows]
    return token_scores


class RewardManager:
    """Scores batches of responses with a `compute_score(data_source, solution_str, ground_truth,
    extra_info)` function (the built-in dispatch or a user's).

    Args:
        tokenizer: Decodes the response ids.
        compute_score: Returns a finite number, or a dict with a finite `score` and optionally
            other numeric values, reported as extra metrics.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, compute_score: Callable[..., Any]) -> None:
        self.tokenizer = tokenizer
        self.compute_score = compute_score

    def __call__(
        self,
        response_ids: torch.Tensor,
        response_mask: torch.Tensor,
        data_sources: list[str],
        ground_truths: list[Any],
        extra_infos: list[dict[str, Any]],
    ) -> RewardResult:
        """Score N responses.

        Args:
            response_ids: [N, R] int64.
            response_mask: [N, R] 1 on generated tokens.
            data_sources, ground_truths, extra_infos: N values each, from the prompts' rows.

        Raises:
            UserError: The function raised, or returned something that is not a finite score.
        """
        num_rows = response_ids.shape[0]
        ids = [response_ids[row][response_mask[row].bool()].tolist() for row in range(num_rows)]
        texts = self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        scores: list[float] = []
        extra: dict[str, list[float]] = {}
        for row in range(num_rows):
            where = f"(data_source '{data_sources[row]}'){_prompt_row(ground_truths[row], extra_infos[row])}"
            try:
                value = self.compute_score(
                    data_source=data_sources[row],
                    solution_str=texts[row],
                    ground_truth=ground_truths[row],
                    extra_info=extra_infos[row],
                )
            except UserError:
                raise  # already names its culprit (e.g. an unknown data_source)
            except Exception as exc:
                reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
                raise UserError(
                    f"reward function {self._name()} raised {reason} on response {row} {where}; fix the "
                    "scoring function or the row's ground truth"
                ) from exc
            score, values = self._check(value, row, where)
            scores.append(score)
            for key, number in values.items():
                # Rows before the first that reported this key get NaN, as do rows that omit it.
                extra.setdefault(key, [math.nan] * row).append(number)
            for column in extra.values():
                if len(column) < row + 1:
                    column.append(math.nan)
        score_tensor = torch.tensor(scores, dtype=torch.float32)  # [N]
        return RewardResult(
            scores=score_tensor,
            token_scores=place_on_last_token(score_tensor, response_mask),
            extra=extra,
            texts=texts,
        )

    def _name(self) -> str:
        return getattr(self.compute_score, "__name__", "the reward function")

    def _check(self, value: Any, row: int, where: str) -> tuple[float, dict[str, float]]:
        """(score, extra numeric values) of one return value, or a UserError saying what was wrong.

        `where` describes the response's prompt for the message (data_source and row).
        """
        score = value.get("score") if isinstance(value, dict) else value
        extras = {}
        if isinstance(value, dict):
            extras = {
                key: extra_value
                for key, item in value.items()
                if key != "score" and (extra_value := _as_number(item)) is not None
            }
        number = _as_number(score)
        if number is None or not math.isfinite(number):
            shown = " ".join(repr(value).split())[:120]
            missing = " (no 'score' key)" if isinstance(value, dict) and "score" not in value else ""
            raise UserError(
                f"reward function {self._name()} returned {type(value).__name__} {shown}{missing} for "
                f"response {row} {where}; return a finite number or a dict with a finite 'score'"
            )
        return number, extras


def _prompt_row(ground_truth: Any, extra_info: dict[str, Any] | None) -> str:
    """Which parquet row a response answers, as far as the scorer's inputs tell.

    The response's position in the batch means nothing to the user; the row's ground truth and
    verl's `extra_info.index` (written by verl's preprocessing scripts) let them find it.
    """
    shown = " ".join(repr(ground_truth).split())
    text = f" whose prompt row has ground_truth {shown[:60]}{'...' if len(shown) > 60 else ''}"
    index = (extra_info or {}).get("index")
    return text + (f" and extra_info index {index}" if index is not None else "")


def _as_number(value: Any) -> float | None:
    """float(value) for real numbers (Python, NumPy, one-element tensors), else None."""
    if isinstance(value, torch.Tensor):
        return float(value.item()) if value.numel() == 1 and not value.is_complex() else None
    if isinstance(value, numbers.Real):
        return float(value)
    return None
