"""`RewardManager`: decode each response, score it, and place the score on its last token.

This is verl's "naive" reward manager (one call of the scoring function per response), its "gdpo" one
(the same, with the run's experiment name added to each `extra_info`: `extra_info_fields`) and its "batch"
one (one call for many). Its other job is to judge what the (often user-written) function does: a
None or NaN reward that slips through poisons every advantage of the step and surfaces, if ever, as a
diverged run, while one odd response that makes the function raise should not end a run hours in.
So every failed call is scored a stated default and counted, and only a step where failures pass a
set share ends the run (relm/rewards/calls.py judges each value; relm/rewards/pool.py adds the time
limit and survives dead workers).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from relm.config.specs import RewardSpec
from relm.errors import UserError
from relm.rewards.calls import FAILURE_METRICS, Outcome, Row, score_rows
from relm.rewards.pool import RewardPool, RewardSource

logger = logging.getLogger("relm")


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


@dataclass(frozen=True)
class FailurePolicy:
    """What a failed reward call scores and how many failures a step tolerates (`reward_model.*`)."""

    failure_score: float = 0.0
    """The score of a response whose call timed out, raised, or returned a non-finite value."""
    max_failure_share: float = 0.25
    """More failed responses than this share of a scoring call's ends the run (the reward is broken)."""


class RewardManager:
    """Scores batches of responses with a `compute_score(data_source, solution_str, ground_truth,
    extra_info)` function (the built-in dispatch or a user's), in a pool of worker processes or here.

    A call that times out (pool only), raises, or returns something that is not a finite number scores
    `policy.failure_score` and is counted (`failure_counts`, logged as `reward/timeouts`,
    `reward/errors`, `reward/non_finite`); the first failure of each kind is written to the run log.
    More than `policy.max_failure_share` of one batch failing ends the run with a `UserError` naming
    the reward and an example: the user's reward code is at fault, and training on default scores
    would only hide it.

    Args:
        tokenizer: Decodes the response ids.
        compute_score: Returns a finite number, or a dict with a finite `score` and optionally
            other numeric values, reported as extra metrics (a list of them when `batched`).
        pool: Worker processes to score in (None: in this process, with no time limit).
        policy: Failure score and tolerated failure share.
        batched: `compute_score` takes lists (verl's `batch` reward manager).
        extra_info_fields: Added to every response's `extra_info` (a copy: the prompt's own dict, shared
            by its `n` responses, is left alone). verl's `gdpo` manager adds `experiment_name`.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        compute_score: Callable[..., Any],
        pool: RewardPool | None = None,
        policy: FailurePolicy | None = None,
        batched: bool = False,
        extra_info_fields: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.compute_score = compute_score
        self.pool = pool
        self.policy = policy or FailurePolicy()
        self.batched = batched
        self.extra_info_fields = dict(extra_info_fields or {})
        self.failure_counts = dict.fromkeys(FAILURE_METRICS, 0)
        """Failed responses by kind since `take_failure_metrics` last read them."""
        self._logged: set[str] = set()

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
            UserError: More than `max_failure_share` of the responses failed, or the built-in dispatch
                has no scorer for a data_source.
        """
        num_rows = response_ids.shape[0]
        ids = [response_ids[row][response_mask[row].bool()].tolist() for row in range(num_rows)]
        texts = self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        if self.extra_info_fields:
            extra_infos = [{**(info or {}), **self.extra_info_fields} for info in extra_infos]
        rows = [
            Row(row, data_sources[row], texts[row], ground_truths[row], extra_infos[row])
            for row in range(num_rows)
        ]
        if self.pool is not None:
            outcomes = self.pool.score(rows)
        else:
            outcomes = [outcome for _, outcome in score_rows(self.compute_score, rows, self.batched)]
        scores: list[float] = []
        extra: dict[str, list[float]] = {}
        failed: list[tuple[Row, Outcome]] = []
        for row, outcome in zip(rows, outcomes, strict=True):
            if outcome.kind == "user_error":
                raise UserError(outcome.reason)  # already names its culprit (e.g. an unknown data_source)
            if outcome.metric is not None:
                failed.append((row, outcome))
            scores.append(outcome.score if outcome.kind == "ok" else self.policy.failure_score)
            for key, number in outcome.extra.items():
                # Rows before the first that reported this key get NaN, as do rows that omit it.
                extra.setdefault(key, [math.nan] * row.index).append(number)
            for column in extra.values():
                if len(column) < row.index + 1:
                    column.append(math.nan)
        if num_rows and len(failed) > self.policy.max_failure_share * num_rows:
            row, outcome = failed[0]
            raise UserError(
                f"reward function {self._name()} failed on {len(failed)} of {num_rows} responses, more than "
                f"reward_model.max_failure_share={self.policy.max_failure_share:g}; e.g. it {outcome.reason} on "
                f"response {row.index} {_where(row)}; fix the scoring function"
            )
        for row, outcome in failed:
            self.failure_counts[outcome.metric] += 1  # type: ignore[index]
            self._log_first(row, outcome)
        score_tensor = torch.tensor(scores, dtype=torch.float32)  # [N]
        return RewardResult(
            scores=score_tensor,
            token_scores=place_on_last_token(score_tensor, response_mask),
            extra=extra,
            texts=texts,
        )

    def take_failure_metrics(self) -> dict[str, float]:
        """`reward/timeouts`, `reward/errors`, `reward/non_finite` since the last call, then reset."""
        metrics = {f"reward/{name}": float(count) for name, count in self.failure_counts.items()}
        self.failure_counts = dict.fromkeys(FAILURE_METRICS, 0)
        return metrics

    def close(self) -> None:
        """Stop the worker pool, if any."""
        if self.pool is not None:
            self.pool.close()

    def _log_first(self, row: Row, outcome: Outcome) -> None:
        if outcome.kind in self._logged:
            return
        self._logged.add(outcome.kind)
        shown = " ".join(row.solution_str.split())
        logger.warning(
            "reward function %s: first %s: it %s on a response %s (response: %r); it scores "
            "reward_model.failure_score=%g, counted in reward/%s",
            self._name(), outcome.kind, outcome.reason, _where(row),
            shown[:200] + ("..." if len(shown) > 200 else ""), self.policy.failure_score, outcome.metric,
        )  # fmt: skip

    def _name(self) -> str:
        if self.pool is not None:
            return self.pool.source.describe()
        return getattr(self.compute_score, "__name__", "the reward function")


def _where(row: Row) -> str:
    return f"(data_source '{row.data_source}'){_prompt_row(row.ground_truth, row.extra_info)}"


def _prompt_row(ground_truth: Any, extra_info: dict[str, Any] | None) -> str:
    """Which parquet row a response answers, as far as the scorer's inputs tell.

    The response's position in the batch means nothing to the user; the row's ground truth and
    verl's `extra_info.index` (written by verl's preprocessing scripts) let them find it.
    """
    shown = " ".join(repr(ground_truth).split())
    text = f" whose prompt row has ground_truth {shown[:60]}{'...' if len(shown) > 60 else ''}"
    index = (extra_info or {}).get("index")
    return text + (f" and extra_info index {index}" if index is not None else "")


def build_reward_manager(
    tokenizer: PreTrainedTokenizerBase,
    compute_score: Callable[..., Any],
    spec: RewardSpec,
    in_process_by_default: bool = False,
) -> RewardManager:
    """The run's reward manager: a worker pool sized by `reward_model.num_workers`, or in-process at 0.

    Workers load a user's file themselves (`spec.custom_function_path`); any other function travels by reference and must
    be importable by name (a module-level function). `in_process_by_default` scores in-process when
    `num_workers` is unset (the demo task: its scorer cannot hang, and a pool's start, about a second of
    CPU a worker, is a measurable share of a 25-second demo on two cores).
    """
    batched = spec.manager == "batch"
    fields = manager_extra_info(spec)
    policy = FailurePolicy(spec.failure_score, spec.max_failure_share)
    num_workers = spec.num_workers
    if num_workers is None:
        num_workers = 0 if in_process_by_default else min(8, os.cpu_count() or 1)
    if num_workers == 0:
        return RewardManager(
            tokenizer, compute_score, policy=policy, batched=batched, extra_info_fields=fields
        )
    if spec.custom_function_path:
        source = RewardSource(path=spec.custom_function_path, name=spec.custom_function_name, batched=batched)
    else:
        source = RewardSource(function=compute_score, batched=batched)
    pool = RewardPool(source, num_workers, spec.timeout_s, spec.memory_limit_mb)
    logger.info(
        "scoring rewards in %d worker processes (reward_model.num_workers), %g s a call (reward_model.timeout)",
        num_workers, spec.timeout_s,
    )  # fmt: skip
    return RewardManager(
        tokenizer, compute_score, pool=pool, policy=policy, batched=batched, extra_info_fields=fields
    )


def manager_extra_info(spec: RewardSpec) -> dict[str, Any]:
    """What the named reward manager adds to each response's `extra_info`.

    verl 0.9.1's `gdpo` manager sets `extra_info["experiment_name"]` to `trainer.experiment_name`: its
    example scorer (`verl/utils/reward_score/rlla.py`) picks the chat format to strip by whether that name
    says `qwen` or `llama`. (verl's naive manager's `num_turns` and tool fields come with relm's
    multi-turn rollouts instead: relm/rollout/multi_turn/driver.py.)
    """
    return {"experiment_name": spec.experiment_name} if spec.manager == "gdpo" else {}
