"""Remove-padding ("packed") forward: every response's real tokens in one row, no padding computed.

RL batches are mostly padding: prompts are left-padded to the longest prompt and responses
right-padded to the longest response. Packing concatenates each row's real tokens (its prompt and
its response are contiguous in the `[prompt | response]` layout) into a single sequence of
`sum(lengths)` tokens with position ids restarting at 0 per row. With `attention_mask=None`,
transformers 5 reads the restarts from the position ids and builds a block-diagonal causal mask
(`masking_utils.find_packed_sequence_indices`) for every attention implementation, so sequences do
not attend to each other and the result equals the padded forward (tested per architecture).
That mask is dense ([S, S]); models switched to `relm.learner.varlen_attention` instead read the
rows' boundaries from `cu_seq_lens_q` / `max_length_q`, which every packed forward here passes (other
attention implementations ignore them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from relm.learner.vocab_chunks import TokenStats, chunk_values, vocab_chunk_stats


@dataclass
class PackedLayout:
    """Where each row's tokens and response predictions sit in the packed sequence."""

    input_ids: torch.Tensor
    """[1, S] the real tokens of all rows, row after row."""
    position_ids: torch.Tensor
    """[1, S] 0..len-1 within each row."""
    predict_index: torch.Tensor
    """[K] packed column of the logit (or value) that precedes each real response token."""
    targets: torch.Tensor
    """[K] the response tokens themselves."""
    scatter_index: torch.Tensor
    """[K] flat index (row * R + t) of each response token in the [N, R] output."""
    cu_seq_lens: torch.Tensor
    """[N + 1] int32 packed offset of each row's first token, then the total length S."""
    max_length: int
    """Tokens in the longest row."""

    def attention_kwargs(self) -> dict[str, torch.Tensor | int]:
        """The boundaries in the names transformers' attention functions receive them under."""
        return {
            "cu_seq_lens_q": self.cu_seq_lens,
            "cu_seq_lens_k": self.cu_seq_lens,
            "max_length_q": self.max_length,
            "max_length_k": self.max_length,
        }


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_width: int) -> PackedLayout:
    """Pack [N, T] left/right-padded rows whose last `response_width` columns are the response."""
    num_rows, width = input_ids.shape
    mask = attention_mask.bool()
    lengths = mask.sum(-1)  # [N]
    starts = torch.cumsum(lengths, 0) - lengths  # [N] packed offset of each row
    # Column -> position within its row's real tokens (valid where mask).
    in_row = mask.long().cumsum(-1) - 1  # [N, T]
    response_cols = torch.arange(width - response_width, width, device=input_ids.device)  # [R]
    response_mask = mask[:, width - response_width :]  # [N, R]
    rows, cols = torch.nonzero(response_mask, as_tuple=True)  # K each
    token_pos = in_row[rows, response_cols[cols]]  # [K] position of the token in its row
    return PackedLayout(
        input_ids=input_ids[mask].unsqueeze(0),
        position_ids=in_row[mask].unsqueeze(0),
        predict_index=starts[rows] + token_pos - 1,
        targets=input_ids[rows, response_cols[cols]],
        scatter_index=rows * response_width + cols,
        cu_seq_lens=torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int32),
        max_length=int(lengths.max()),
    )


def _unpack(values: torch.Tensor, layout: PackedLayout, num_rows: int, response_width: int) -> torch.Tensor:
    """[K] per-response-token values -> [N, R] with zeros at padding."""
    out = values.new_zeros(num_rows * response_width)
    return out.index_put((layout.scatter_index,), values).view(num_rows, response_width)


def packed_response_token_stats(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_width: int,
    *,
    temperature: float = 1.0,
    compute_entropy: bool = False,
    entropy_grad: bool = True,
    positions_per_chunk: int | None = None,
    vocab_limit: int | None = None,
    compute_sum_pi_squared: bool = False,
) -> TokenStats:
    """`response_token_stats` computed on the packed sequence; same outputs ([N, R], zeros at padding).

    Only the K positions that predict a response token go through the output head
    (`logits_to_keep` as an index tensor), and their fp32 log-softmax runs in checkpointed chunks.
    """
    num_rows = input_ids.shape[0]
    layout = pack(input_ids, attention_mask, response_width)
    logits = model(
        input_ids=layout.input_ids,
        position_ids=layout.position_ids,
        attention_mask=None,
        use_cache=False,
        logits_to_keep=layout.predict_index,
        **layout.attention_kwargs(),
    ).logits[..., :vocab_limit]  # [1, K, V]; ids the tokenizer lacks are never sampled
    scale = temperature if temperature > 0 else 1.0
    chunk = positions_per_chunk or max(1, chunk_values(logits.device) // logits.shape[-1])
    use_checkpoint = torch.is_grad_enabled() and logits.requires_grad
    logprob_parts, entropy_parts, squared_parts = [], [], []
    # `split`, not slicing: see `relm.learner.forward.response_logprobs` (one gradient concatenation
    # instead of a zero-filled full-size gradient per chunk).
    for chunk_logits, chunk_targets in zip(
        logits.split(chunk, dim=1), layout.targets.split(chunk), strict=True
    ):
        logprob, entropy, squared = vocab_chunk_stats(
            chunk_logits, chunk_targets[None], scale, compute_entropy, entropy_grad, use_checkpoint,
            compute_sum_pi_squared,
        )  # fmt: skip
        logprob_parts.append(logprob[0])
        if entropy is not None:
            entropy_parts.append(entropy[0])
        if squared is not None:
            squared_parts.append(squared[0])

    def unpacked(parts: list[torch.Tensor]) -> torch.Tensor | None:
        return _unpack(torch.cat(parts), layout, num_rows, response_width) if parts else None

    logprobs = _unpack(torch.cat(logprob_parts), layout, num_rows, response_width)
    return TokenStats(logprobs, unpacked(entropy_parts), unpacked(squared_parts))


def packed_response_values(
    value_model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_width: int
) -> torch.Tensor:
    """`response_values` on the packed sequence: [N, R] fp32, zeros at padding."""
    layout = pack(input_ids, attention_mask, response_width)
    values = value_model(
        input_ids=layout.input_ids,
        attention_mask=None,
        position_ids=layout.position_ids,
        **layout.attention_kwargs(),
    )  # [1, S]
    return _unpack(values[0, layout.predict_index], layout, input_ids.shape[0], response_width)
