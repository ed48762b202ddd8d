"""Grouped-query attention as two batched matrix products: the CPU path and the decode kernel's reference.

Apart from `relm.rollout.native.attention` (which dispatches to it or to the Triton decode kernel)
because `relm.rollout.native.decode_attention.reference_decode_attention` computes the kernel's math
with it too: in either of those files the two would import each other.
"""

from __future__ import annotations

import torch


def grouped_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    scaling: float,
    softcap: float | None,
) -> torch.Tensor:
    """Masked attention with the query heads grouped over their KV head; eager math, no KV copy.

    The same operations and dtypes as transformers' eager attention (matrix products in the model
    dtype, softmax in fp32, soft-capping as tanh(s / cap) * cap), so soft-capped models match it.
    """
    batch, num_heads, num_queries, _ = query.shape
    num_kv_heads, num_keys = key.shape[1], key.shape[2]
    group = num_heads // num_kv_heads
    # Heads h = j * group + g share KV head j (repeat_kv's order), so [B, H, Q, D] regroups by view.
    grouped_query = (query * scaling).reshape(batch, num_kv_heads, group * num_queries, -1)
    scores = torch.matmul(grouped_query, key.transpose(-1, -2))  # [B, Hkv, G*Q, K]
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.view(batch, num_kv_heads, group, num_queries, num_keys)
    scores.masked_fill_(~mask[:, :, None], torch.finfo(scores.dtype).min)  # mask [B, 1, 1, Q, K]
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    out = torch.matmul(probs.view(batch, num_kv_heads, group * num_queries, num_keys), value)
    return out.view(batch, num_heads, num_queries, -1).transpose(1, 2).contiguous()  # [B, Q, H, Dv]
