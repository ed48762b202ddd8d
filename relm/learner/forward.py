"""The training-side forward: per-token logprobs, entropy and values of the response block.

Layout (see `relm.learner.batch`): `input_ids` is `[prompt | response]` with the boundary at column
P = T - R, so response token t sits at column P + t and is predicted by the logits at column
P + t - 1. These are pure functions of a model and tensors; the actor and critic updates call them
under autograd, the experience stage under `torch.no_grad`.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from relm.learner.packing import packed_response_token_stats, packed_response_values
from relm.learner.vocab_chunks import DEFAULT_CHUNK_VALUES, TokenStats, chunk_values, vocab_chunk_stats
from relm.models.padding_probe import reads_padding_mask
from relm.rollout.padding import leading_pads, realign_tail, shift_left


def response_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_width: int,
    *,
    temperature: float = 1.0,
    compute_entropy: bool = False,
    entropy_grad: bool = True,
    vocab_chunk: int | None = None,
    remove_padding: bool = False,
    vocab_limit: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """([N, R] logprobs, [N, R] entropy or None): `response_token_stats` without the sum of squared probabilities."""
    stats = response_token_stats(
        model, input_ids, attention_mask, position_ids, response_width, temperature=temperature,
        compute_entropy=compute_entropy, entropy_grad=entropy_grad, vocab_chunk=vocab_chunk,
        remove_padding=remove_padding, vocab_limit=vocab_limit,
    )  # fmt: skip
    return stats.logprobs, stats.entropy


def response_token_stats(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_width: int,
    *,
    temperature: float = 1.0,
    compute_entropy: bool = False,
    entropy_grad: bool = True,
    vocab_chunk: int | None = None,
    remove_padding: bool = False,
    vocab_limit: int | None = None,
    compute_sum_pi_squared: bool = False,
) -> TokenStats:
    """Logprob (and entropy, and sum of squared probabilities) of each response token under
    `softmax(logits / temperature)`.

    With `remove_padding` the rows are packed into one sequence first (`relm.learner.packing`),
    which skips every padded position; the results are equal up to float rounding.

    A model that does not read the attention mask (`relm.models.padding_probe`; RWKV) is never packed
    and runs each row with its real tokens first and its left pads moved after them, the outputs put
    back in their columns (`relm.rollout.padding`): it then never reads a pad before a real token.

    Memory: the model returns logits only for the last R + 1 columns (`logits_to_keep`, which every
    HF causal LM in transformers 5 accepts; it keeps model-specific logit soft-capping or scaling,
    which running `lm_head` on hidden states ourselves would silently skip). Those [N, R + 1, V]
    logits stay in the model dtype; the fp32 log-softmax runs over chunks of `vocab_chunk` token
    positions, each under activation checkpointing when autograd is on, so neither the forward nor
    the backward ever holds an [N, R, V] fp32 tensor, only one chunk's.

    Args:
        model: an HF causal LM (called with `use_cache=False`).
        input_ids, attention_mask, position_ids: [N, T] with the response in the last R columns.
        response_width: R.
        temperature: the rollout temperature, so the ratio compares the distribution sampled from;
            values <= 0 (greedy) mean 1.
        compute_entropy: also return the entropy of the temperature-scaled distribution.
        entropy_grad: let gradients flow through the entropy (an entropy bonus in the loss). Without
            it (`entropy_coeff=0`, only the metric) the entropy is computed outside autograd: no
            backward through a second pass over the vocabulary, and no recomputation of it.
        vocab_chunk: token positions whose full-vocabulary fp32 rows are held at once; None sizes
            chunks to about 2^26 fp32 values (2^22 on CPU, `relm.learner.vocab_chunks.chunk_values`).
        vocab_limit: the tokenizer's length: the softmax runs over the first `vocab_limit` logits only,
            because the engines never sample the embedding rows past it (`SampledColumns`), so both
            sides normalise over the same ids; None keeps every row.
        compute_sum_pi_squared: also return, per position, sum_v softmax(logits / temperature)_v^2 (without
            gradient; the optimal token baselines read it from the old-logprob forward), computed one chunk
            of positions at a time like the rest.

    Returns:
        `TokenStats`: [N, R] fp32 logprobs, entropy and sum of squared probabilities (None where not
        asked). Values at padded response positions are finite but meaningless; callers mask them with
        the response mask.
    """
    num_rows, width = input_ids.shape
    if not 0 < response_width < width:
        raise ValueError(
            f"response_width {response_width} must be in [1, {width - 1}] for sequences of {width}"
        )
    # The probe ran when the model was loaded (`relm.models.padding_probe`): this only reads its answer.
    if remove_padding and reads_padding_mask(model) and _accepts_logits_to_keep(model):
        return packed_response_token_stats(
            model, input_ids, attention_mask, response_width, temperature=temperature,
            compute_entropy=compute_entropy, entropy_grad=entropy_grad, positions_per_chunk=vocab_chunk,
            vocab_limit=vocab_limit, compute_sum_pi_squared=compute_sum_pi_squared,
        )  # fmt: skip
    return _padded_token_stats(
        model, input_ids, attention_mask, position_ids, response_width, input_ids[:, -response_width:],
        temperature=temperature, compute_entropy=compute_entropy, entropy_grad=entropy_grad,
        vocab_chunk=vocab_chunk, vocab_limit=vocab_limit, compute_sum_pi_squared=compute_sum_pi_squared,
    )  # fmt: skip


def response_logprobs_at(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_width: int,
    ids: torch.Tensor,
    *,
    temperature: float = 1.0,
    compute_entropy: bool = False,
    entropy_grad: bool = True,
    vocab_limit: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """`response_logprobs` (padded rows) and, from the same forward, the logprobs of `ids` [N, R, K] at each
    response position: a distillation teacher's top ids (`forward_kl_topk`), with gradient when autograd is on.

    Returns:
        ([N, R] logprobs of the sampled tokens, [N, R] entropy or None, [N, R, K] logprobs of `ids`).
    """
    targets = torch.cat([input_ids[:, -response_width:].unsqueeze(-1), ids], dim=-1)  # [N, R, 1 + K]
    stats = _padded_token_stats(
        model, input_ids, attention_mask, position_ids, response_width, targets,
        temperature=temperature, compute_entropy=compute_entropy, entropy_grad=entropy_grad,
        vocab_chunk=None, vocab_limit=vocab_limit,
    )  # fmt: skip
    picked = stats.logprobs  # [N, R, 1 + K]
    return picked[..., 0], stats.entropy, picked[..., 1:]


@torch.no_grad()
def response_topk(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_width: int,
    k: int,
    *,
    vocab_limit: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The `k` most likely ids at each response position under softmax(logits) (temperature 1) and their
    logprobs: what a distillation teacher gives for `forward_kl_topk` (verl asks its servers for the prompt's
    top-k logprobs). Rows of logits go through the fp32 log-softmax a few at a time.

    Returns:
        ([N, R, k] fp32 logprobs, [N, R, k] int64 ids), largest first.
    """
    logits = _response_logits(model, input_ids, attention_mask, position_ids, response_width)
    logits = logits[:, :-1, :vocab_limit]  # [N, R, V]; the last column predicts nothing
    rows = max(1, DEFAULT_CHUNK_VALUES // (logits.shape[1] * logits.shape[2]))
    values, ids = [], []
    for block in logits.split(rows):
        top = torch.log_softmax(block.float(), dim=-1).topk(k, dim=-1)
        values.append(top.values)
        ids.append(top.indices)
    return torch.cat(values), torch.cat(ids)


def _response_logits(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_width: int,
) -> torch.Tensor:
    """[N, R + 1, V] logits of the last R + 1 columns, in the model's dtype. A model that does not read the
    attention mask gets its rows shifted left past their pads (`_model_inputs`) and its logits moved back."""
    shifts, kwargs = _model_inputs(reads_padding_mask(model), input_ids, attention_mask, position_ids)
    extra = int(shifts.max()) if shifts is not None else 0  # columns the shifted rows' responses moved
    if _accepts_logits_to_keep(model):
        logits = model(**kwargs, use_cache=False, logits_to_keep=response_width + 1 + extra).logits
    else:
        logits = model(**kwargs, use_cache=False).logits[:, -response_width - 1 - extra :]
    if shifts is not None:
        logits = realign_tail(logits, shifts, response_width + 1)
    return logits


def _padded_token_stats(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_width: int,
    targets: torch.Tensor,
    *,
    temperature: float,
    compute_entropy: bool,
    entropy_grad: bool,
    vocab_chunk: int | None,
    vocab_limit: int | None,
    compute_sum_pi_squared: bool = False,
) -> TokenStats:
    """The padded path of `response_token_stats` for `targets` [N, R] (the sampled ids) or [N, R, k] (several
    ids a position). The logprobs take the targets' shape; entropy and sum of squared probabilities are per
    position, [N, R], either way."""
    logits = _response_logits(model, input_ids, attention_mask, position_ids, response_width)  # [N, R+1, V]
    logits = logits[..., :vocab_limit]  # a view; None keeps every row
    # targets [N, R] (or [N, R, k]): column P-1+t of `logits` predicts targets[:, t]

    # Blocks of whole rows when a row fits the budget, else column slices of one row. The blocks are
    # `split` views, not indexing: autograd joins a split's gradients in one concatenation, whereas
    # each indexed slice's backward materialises (and then adds) a zero-filled [N, R+1, V] gradient,
    # which cost a fifth of an update at 152k vocabulary entries.
    positions_per_block = vocab_chunk or max(1, chunk_values(logits.device) // logits.shape[-1])
    rows_per_block = max(1, positions_per_block // response_width)
    cols_per_block = min(response_width, positions_per_block)
    column_sizes = [cols_per_block] * (response_width // cols_per_block)
    if response_width % cols_per_block:
        column_sizes.append(response_width % cols_per_block)
    column_sizes.append(logits.shape[1] - response_width)  # the last column predicts nothing
    scale = temperature if temperature > 0 else 1.0
    use_checkpoint = torch.is_grad_enabled() and logits.requires_grad

    logprob_rows, entropy_rows, squared_rows = [], [], []
    for row_logits, row_targets in zip(
        logits.split(rows_per_block), targets.split(rows_per_block), strict=True
    ):
        logprob_cols, entropy_cols, squared_cols = [], [], []
        blocks = row_logits.split(column_sizes, dim=1)[:-1]
        for block_logits, block_targets in zip(
            blocks, row_targets.split(column_sizes[:-1], dim=1), strict=True
        ):
            logprob, entropy, squared = vocab_chunk_stats(
                block_logits, block_targets, scale, compute_entropy, entropy_grad, use_checkpoint,
                compute_sum_pi_squared,
            )  # fmt: skip
            logprob_cols.append(logprob)
            if entropy is not None:  # None unless compute_entropy
                entropy_cols.append(entropy)
            if squared is not None:  # None unless compute_sum_pi_squared
                squared_cols.append(squared)
        logprob_rows.append(torch.cat(logprob_cols, dim=1))
        if compute_entropy:
            entropy_rows.append(torch.cat(entropy_cols, dim=1))
        if compute_sum_pi_squared:
            squared_rows.append(torch.cat(squared_cols, dim=1))
    return TokenStats(
        logprobs=torch.cat(logprob_rows),  # [N, R] (or [N, R, k])
        entropy=torch.cat(entropy_rows) if compute_entropy else None,
        sum_pi_squared=torch.cat(squared_rows) if compute_sum_pi_squared else None,
    )


def _model_inputs(
    reads_mask: bool, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
    """(per-row shifts or None, the forward's ids/mask/positions): rows shifted left past their left pads
    when the model does not read the mask and some row has them (`relm.rollout.padding.shift_left`)."""
    kwargs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
    if reads_mask:
        return None, kwargs
    shifts = leading_pads(attention_mask)  # [N]
    if not bool(shifts.any()):
        return None, kwargs
    return shifts, {name: shift_left(tensor, shifts) for name, tensor in kwargs.items()}


def _accepts_logits_to_keep(model: nn.Module) -> bool:
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def response_values(
    value_model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_width: int,
    *,
    remove_padding: bool = False,
) -> torch.Tensor:
    """[N, R] fp32 values of the state before each response token (columns P-1 .. T-2).

    `remove_padding` packs the rows first, as in `response_logprobs` (zeros at padded positions); a
    backbone that does not read the attention mask runs its rows shifted as there.

    Value t estimates the return from the moment token t is about to be chosen, i.e. after the
    prompt and tokens < t; that is the last column the model has seen then, P + t - 1 (verl's
    `values[:, -R - 1 : -1]`). It lines up with the logprob of token t for GAE.
    """
    reads_mask = reads_padding_mask(value_model)
    if remove_padding and reads_mask:
        return packed_response_values(value_model, input_ids, attention_mask, response_width)
    shifts, kwargs = _model_inputs(reads_mask, input_ids, attention_mask, position_ids)
    values = value_model(**kwargs)  # [N, T]
    if shifts is not None:
        values = realign_tail(values, shifts, response_width + 1)
    return values[:, -response_width - 1 : -1]
