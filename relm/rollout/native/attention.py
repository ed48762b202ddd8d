"""The attention function the native engine swaps into an HF model while it generates.

Registered with transformers' `AttentionInterface` under `NATIVE_ATTENTION`, so every architecture
that dispatches through that interface (all of relm's zoo) runs its own projections, norms, RoPE,
MoE and output head unchanged and only the attention product is ours. Why ours: HF's sdpa path,
given a mask, copies the KV heads out to the query-head count in every layer (72% of a decode step
on an H200 for a 12/2-head model). Here grouped-query attention is a batched matrix product over
[kv_heads, group * queries] that reads each KV head once and never copies it.

The engine passes a boolean [B, 1, Q, K] mask (True = attend) in column space, built so that the
last column a query attends is the query's own column; that invariant lets the sliding window be
applied here from the mask alone, for models that pass one mask to every layer (Mistral, Phi-3)
and for those that pass per-layer-type masks (Gemma 2/3, Qwen2) alike.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface

from relm.rollout.native.decode_attention import available as decode_attention_available
from relm.rollout.native.decode_attention import decode_attention
from relm.rollout.native.grouped_attention import grouped_attention

NATIVE_ATTENTION = "relm_native"
"""The name the engine sets as the model's attention implementation during generation."""

CAUSAL_PREFILL = "relm_causal_prefill"
"""Keyword the engine passes through the model's forward when a prefill forward's prompts have no
padding in its columns and it is their first chunk, so its boolean mask is the plain causal one."""

# Keyword arguments that change the attention's math in ways this function does not implement
# (attention sinks, relative position biases, sparse or packed layouts). Seeing one means the
# architecture needs its own kernel; the engine then falls back to the HF engine.
_UNSUPPORTED_KWARGS = (
    "s_aux",
    "position_bias",
    "indices",
    "block_indices",
    "cu_seq_lens_q",
    "cu_seq_lens_k",
    "head_mask",
)


class NativeAttentionUnsupported(RuntimeError):
    """The model asked the native attention for something it does not compute; the message says what."""


def register_native_attention() -> None:
    """Make `NATIVE_ATTENTION` a valid attention implementation (idempotent)."""
    AttentionInterface.register(NATIVE_ATTENTION, native_attention)


def native_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """Causal attention of query [B, H, Q, D] over key/value [B, Hkv, K, D(v)] -> ([B, Q, H, Dv], None).

    CUDA decode steps take relm's Triton kernel (`relm.rollout.native.decode_attention`), soft-capped
    models included, or sdpa in its grouped-query mode with the mask where Triton is missing or the
    head size does not fit it; soft-capped models otherwise (sdpa has no soft-capping) and CPU
    decode steps take the grouped matrix-product path; a prefill takes sdpa over repeated KV heads
    (a one-off copy per prompt, with which sdpa's fused kernels accept the mask).

    Raises:
        NativeAttentionUnsupported: a feature the model needs that this function does not compute.
    """
    present = [name for name in _UNSUPPORTED_KWARGS if kwargs.get(name) is not None]
    if present:
        raise NativeAttentionUnsupported(f"the model's attention passes {', '.join(present)}")
    if kwargs.get("is_causal") is False:
        raise NativeAttentionUnsupported("the model's attention is not causal")
    if attention_mask is None or attention_mask.dtype != torch.bool or attention_mask.dim() != 4:
        raise NativeAttentionUnsupported(
            "native attention needs the engine's boolean [B, 1, Q, K] mask; the model built its own"
        )
    if query.shape[1] % key.shape[1]:
        raise NativeAttentionUnsupported(
            f"{query.shape[1]} query heads do not group over {key.shape[1]} KV heads"
        )
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    if kwargs.get(CAUSAL_PREFILL) and _plain_causal(query, key, sliding_window, softcap):
        # Unpadded prompts, first chunk: the mask is exactly causal, so sdpa may take its flash
        # kernel (grouped-query aware, no mask read, no KV copy) instead of a masked one.
        out = F.scaled_dot_product_attention(
            query, key, value, is_causal=True, scale=scaling, enable_gqa=True
        )
        return out.transpose(1, 2).contiguous(), None
    mask = attention_mask
    if sliding_window:
        mask = restrict_to_window(mask, sliding_window)
    if query.shape[2] == 1 and decode_attention_available(query, value):
        # CUDA decode step: relm's Triton kernel (KV heads read once per group, masked columns skipped).
        out = decode_attention(query, key, value, mask, scaling, softcap)
    elif softcap or (query.shape[2] == 1 and not query.is_cuda):
        out = grouped_attention(query, key, value, mask, scaling, softcap)
    elif query.shape[2] == 1:
        # Without Triton (or with head sizes it does not take). Measured on an H200 (torch 2.11,
        # batch 256, 2 KV heads x 6, 384 columns): 48 us a layer, against 101 us for the grouped
        # matrix products and 800 us with the KV heads repeated.
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, scale=scaling, enable_gqa=True
        )
        out = out.transpose(1, 2).contiguous()
    else:
        out = repeated_kv_sdpa(query, key, value, mask, scaling)
    return out, None


def _plain_causal(
    query: torch.Tensor, key: torch.Tensor, sliding_window: int | None, softcap: float | None
) -> bool:
    """Whether is_causal attention computes what the mask says: queries and keys the same columns,
    no window cutting inside them, no soft-capping (sdpa has none)."""
    columns = key.shape[2]
    return query.shape[2] == columns and not softcap and (not sliding_window or sliding_window >= columns)


def restrict_to_window(mask: torch.Tensor, window: int) -> torch.Tensor:
    """[B, 1, Q, K] mask limited to the `window` most recent columns of each query (its own included).

    A query's own column is the last one it attends (the engine's masks guarantee it), so the
    window is computed in column space; columns and positions differ by the row's left padding
    only, which cancels in the difference. Same rule as transformers: key k is kept when
    q - window < k <= q.
    """
    columns = torch.arange(mask.shape[-1], device=mask.device)  # [K]
    query_column = torch.where(mask, columns, -1).amax(dim=-1, keepdim=True)  # [B, 1, Q, 1]
    return mask & (columns > query_column - window)


def repeated_kv_sdpa(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scaling: float
) -> torch.Tensor:
    """Prefill attention through sdpa with the KV heads repeated (sdpa's GQA mode refuses masks on CUDA)."""
    group = query.shape[1] // key.shape[1]
    if group > 1:
        key = key.repeat_interleave(group, dim=1)
        value = value.repeat_interleave(group, dim=1)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
    return out.transpose(1, 2).contiguous()  # [B, Q, H, Dv]
