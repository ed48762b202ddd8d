"""The rollout record of a step's responses, and the no-grad forward passes over it (old and reference
logprobs, values) that annotate it."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from relm.data.prompt_batch import PromptBatch
from relm.distributed.balance import same_group_count
from relm.distributed.context import DistContext
from relm.distributed.gathering import gathered_for_passes, passes_are_collective
from relm.learner.batch import Rollout, TeacherTopK
from relm.learner.forward import response_token_stats, response_topk, response_values
from relm.learner.minibatch import forward_token_counts, microbatch_indices
from relm.rollout.base import GenerationOutput
from relm.rollout.padding import left_pad

logger = logging.getLogger("relm")


def build_rollout(
    prompts: PromptBatch, gen: GenerationOutput, *, n: int, pad_token_id: int, group_offset: int = 0
) -> Rollout:
    """Join each prompt with its `n` responses (engines return them grouped prompt by prompt); the
    prompts' group ids start at `group_offset` (a later DAPO round's rows join the earlier ones')."""
    num_rows = len(prompts) * n
    if gen.response_ids.shape[0] != num_rows:
        raise RuntimeError(
            f"engine returned {gen.response_ids.shape[0]} responses for {len(prompts)} x n={n}"
        )
    repeated = [ids for ids in prompts.prompt_ids for _ in range(n)]
    prompt_ids, prompt_mask = left_pad(repeated, pad_token_id)

    def rep(values: list) -> list:
        return [v for v in values for _ in range(n)]

    response_mask = gen.response_mask.cpu()
    return Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=gen.response_ids.cpu(),
        # A multi-turn rollout's tool results are attended to but not trained on.
        response_mask=response_mask if gen.model_mask is None else gen.model_mask.cpu(),
        response_attention_mask=response_mask,
        group_ids=torch.arange(len(prompts)).repeat_interleave(n) + group_offset,
        data_sources=rep(prompts.data_sources),
        ground_truths=rep(prompts.ground_truths),
        # A multi-turn rollout's `turn_scores` and `tool_rewards` reach the reward function, as in verl.
        extra_infos=rep(prompts.extra_infos)
        if gen.extra_fields is None
        else [
            {**info, **extra} for info, extra in zip(rep(prompts.extra_infos), gen.extra_fields, strict=True)
        ],
        finish_reasons=list(gen.finish_reasons),
        rollout_logprobs=gen.logprobs.float().cpu(),
        token_versions=None if gen.token_versions is None else gen.token_versions.cpu(),
    )


@torch.no_grad()
def batched_logprobs(
    model: nn.Module,
    batch: Rollout,
    *,
    rows_per_forward: int,
    temperature: float,
    device: torch.device,
    remove_padding: bool = False,
    max_tokens_per_forward: int | None = None,
    dist: DistContext | None = None,
    vocab_limit: int | None = None,
) -> torch.Tensor:
    """[N, R] logprobs of the responses under `model`, in forward passes of `rows_per_forward` rows
    (or of at most `max_tokens_per_forward` tokens). With `dist` (data parallel, `batch` this rank's
    rows) every rank makes as many passes, and when the model is sharded an out-of-memory pass is not
    retried on one rank alone. `vocab_limit`: as in `response_logprobs`."""

    return _batched_response_stats(
        model, batch, sum_pi_squared=False, rows_per_forward=rows_per_forward, temperature=temperature,
        device=device, remove_padding=remove_padding, max_tokens_per_forward=max_tokens_per_forward, dist=dist,
        vocab_limit=vocab_limit,
    )  # fmt: skip


@torch.no_grad()
def batched_logprobs_and_sum_pi_squared(
    model: nn.Module,
    batch: Rollout,
    *,
    rows_per_forward: int,
    temperature: float,
    device: torch.device,
    remove_padding: bool = False,
    max_tokens_per_forward: int | None = None,
    dist: DistContext | None = None,
    vocab_limit: int | None = None,
) -> torch.Tensor:
    """[N, R, 2]: the logprobs of `batched_logprobs` ([..., 0]) and, from the same forwards, each position's sum
    over the vocabulary of the squared probabilities ([..., 1]), which the optimal token baselines read. One
    tensor so that the passes and the data-parallel gathering stay those of `batched_logprobs`."""

    return _batched_response_stats(
        model, batch, sum_pi_squared=True, rows_per_forward=rows_per_forward, temperature=temperature,
        device=device, remove_padding=remove_padding, max_tokens_per_forward=max_tokens_per_forward, dist=dist,
        vocab_limit=vocab_limit,
    )  # fmt: skip


def _batched_response_stats(
    model: nn.Module,
    batch: Rollout,
    *,
    sum_pi_squared: bool,
    rows_per_forward: int,
    temperature: float,
    device: torch.device,
    remove_padding: bool,
    max_tokens_per_forward: int | None,
    dist: DistContext | None,
    vocab_limit: int | None,
) -> torch.Tensor:
    """The passes of `batched_logprobs` ([N, R]) and `batched_logprobs_and_sum_pi_squared` ([N, R, 2])."""

    def stats_of(mb: Rollout) -> torch.Tensor:
        stats = response_token_stats(
            model,
            mb.input_ids,
            mb.attention_mask,
            mb.position_ids,
            mb.response_width,
            temperature=temperature,
            remove_padding=remove_padding,
            vocab_limit=vocab_limit,
            compute_sum_pi_squared=sum_pi_squared,
        )
        if stats.sum_pi_squared is None:  # not asked for
            return stats.logprobs
        return torch.stack([stats.logprobs, stats.sum_pi_squared], dim=-1)

    return _in_forward_passes(
        model,
        batch,
        stats_of,
        "logprob forward",
        rows_per_forward=rows_per_forward,
        device=device,
        max_tokens=max_tokens_per_forward,
        remove_padding=remove_padding,
        dist=dist,
    )


@torch.no_grad()
def batched_topk(
    model: nn.Module,
    batch: Rollout,
    k: int,
    *,
    rows_per_forward: int,
    device: torch.device,
    max_tokens_per_forward: int | None = None,
    vocab_limit: int | None = None,
) -> torch.Tensor:
    """A distillation teacher's top `k` ids and logprobs at each response position (`response_topk`), in
    forward passes of `rows_per_forward` rows (or `max_tokens_per_forward` tokens), padded rows.

    Returns:
        [N, R, k, 2] float64: the logprobs in `[..., 0]`, the ids in `[..., 1]` (float64 holds every id
        exactly), one tensor so that data-parallel ranks gather it like any other; `unpack_topk` splits it.
    """

    def topk_of(mb: Rollout) -> torch.Tensor:
        values, ids = response_topk(
            model,
            mb.input_ids,
            mb.attention_mask,
            mb.position_ids,
            mb.response_width,
            k,
            vocab_limit=vocab_limit,
        )
        return torch.stack([values.double(), ids.double()], dim=-1)

    return _in_forward_passes(
        model, batch, topk_of, "teacher top-k forward", rows_per_forward=rows_per_forward, device=device,
        max_tokens=max_tokens_per_forward, remove_padding=False, dist=None,
    )  # fmt: skip


def unpack_topk(packed: torch.Tensor) -> TeacherTopK:
    """`batched_topk`'s [N, R, k, 2] tensor as a `TeacherTopK` record."""
    return TeacherTopK(logprobs=packed[..., 0].float(), ids=packed[..., 1].long())


@torch.no_grad()
def batched_values(
    value_model: nn.Module,
    batch: Rollout,
    *,
    rows_per_forward: int,
    device: torch.device,
    remove_padding: bool = False,
    max_tokens_per_forward: int | None = None,
    dist: DistContext | None = None,
) -> torch.Tensor:
    """[N, R] critic values V(s_t) before each response token (`dist` as in `batched_logprobs`)."""

    def values_of(mb: Rollout) -> torch.Tensor:
        return response_values(
            value_model,
            mb.input_ids,
            mb.attention_mask,
            mb.position_ids,
            mb.response_width,
            remove_padding=remove_padding,
        )

    return _in_forward_passes(
        value_model,
        batch,
        values_of,
        "value forward",
        rows_per_forward=rows_per_forward,
        device=device,
        max_tokens=max_tokens_per_forward,
        remove_padding=remove_padding,
        dist=dist,
    )


def _in_forward_passes(
    model: nn.Module,
    batch: Rollout,
    compute: Callable[[Rollout], torch.Tensor],
    what: str,
    *,
    rows_per_forward: int,
    device: torch.device,
    max_tokens: int | None,
    remove_padding: bool,
    dist: DistContext | None,
) -> torch.Tensor:
    """[N, R, ...] on the CPU, fp32 (float64 where `compute` gives float64): `compute` ([n, R, ...] of a sub-batch
    on `device`; the trailing shape and the dtype are taken from the first pass) over groups of rows cut by
    row count or token budget, each retried in halves on out-of-memory (not when `model` is sharded:
    its passes gather weights from other ranks, so every rank must make the same ones). A sharded
    model's weights stay gathered from the first pass to the last where memory allows. A batch of no rows
    gives [0, R]."""
    found: list[torch.Tensor] = []  # [N, R, ...], shaped by the first pass's result

    def forward(rows: torch.Tensor) -> None:
        result = compute(batch.select(rows).to(device)).cpu()
        result = result if result.dtype == torch.float64 else result.float()
        if not found:
            found.append(torch.zeros(len(batch), *result.shape[1:], dtype=result.dtype))
        found[0][rows] = result

    groups = _forward_groups(batch, rows_per_forward, max_tokens, remove_padding)
    retry = not passes_are_collective(model)
    with gathered_for_passes(model, device, dist):
        for rows in same_group_count(groups, dist):
            run_halving_on_oom(rows, forward, what, retry=retry)
    return found[0] if found else torch.zeros(len(batch), batch.response_width)


def run_halving_on_oom(
    rows: torch.Tensor, forward: Callable[[torch.Tensor], None], what: str, retry: bool = True
) -> None:
    """`forward(rows)`, and on a GPU out-of-memory the same rows again as two halves (recursively).

    The memory plan's budgets are estimates; a forward that does not fit is cheaper to split than a
    run is to restart. Only a single row that does not fit is an error. `retry=False` (a sharded
    model, whose passes are collectives every rank must make alike) raises at once.
    """
    try:
        forward(rows)
        return
    except torch.OutOfMemoryError:
        if len(rows) == 1 or not retry:
            raise
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    half = len(rows) // 2
    logger.warning(
        "%s: out of GPU memory on %d rows; retrying as %d + %d", what, len(rows), half, len(rows) - half
    )
    run_halving_on_oom(rows[:half], forward, what)
    run_halving_on_oom(rows[half:], forward, what)


def _forward_groups(
    batch: Rollout, rows_per_forward: int, max_tokens: int | None, remove_padding: bool
) -> list[torch.Tensor]:
    token_counts = forward_token_counts(batch.attention_mask, remove_padding)
    return list(
        microbatch_indices(
            torch.arange(len(batch)), rows_per_forward, token_counts=token_counts, max_tokens=max_tokens
        )
    )
