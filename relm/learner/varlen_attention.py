"""Attention over packed sequences that respects their boundaries without a dense mask.

With remove-padding, a micro-batch is one row of S = sum(lengths) tokens. transformers' sdpa path
then builds a [S, S] block-diagonal mask and runs attention over all S^2 pairs, most of them masked
(it made packed training slower than padded on the CPU). Flash attention's variable-length kernel
instead takes the cumulative lengths (`cu_seq_lens`) and computes only each sequence's own causal
block; PyTorch ships it as `torch.nn.attention.varlen.varlen_attn` (CUDA, fp16/bf16).

`VARLEN_ATTENTION` is registered with transformers' `AttentionInterface` and mask interface, so an
HF model switched to it (`model.set_attn_implementation(VARLEN_ATTENTION)`) receives the lengths the
packing code passes as `cu_seq_lens_q` / `max_length_q` and no mask. Where the kernel does not apply
(CPU, fp32 without autocast, soft-capped logits) each sequence's block runs through sdpa one by one:
the same result, used by the CPU parity tests. Calls without lengths (padded forwards) go to sdpa
with the mask transformers built, so a model switched to this implementation still runs unpacked.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

VARLEN_ATTENTION = "relm_varlen"
"""The attention implementation name training models take when packing on a GPU."""


def register_varlen_attention() -> None:
    """Make `VARLEN_ATTENTION` a valid attention implementation (idempotent)."""
    AttentionInterface.register(VARLEN_ATTENTION, varlen_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(VARLEN_ATTENTION, _mask_unless_packed)


def varlen_kernel_available() -> bool:
    """Whether this torch has the flash variable-length kernel (torch >= 2.10 with CUDA)."""
    try:
        from torch.nn.attention import varlen  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


def _mask_unless_packed(*args: Any, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> Any:
    # Packed forwards pass no padding mask: the lengths travel as kwargs, so no [S, S] mask is built.
    if attention_mask is None:
        return None
    # transformers passes the mask arguments by keyword: no positional one lands on attention_mask.
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)  # type: ignore[misc]


def varlen_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal attention of query [1, H, S, D] over key/value [1, Hkv, S, D] -> ([1, S, H, D], None).

    Sequence i spans columns cu_seq_lens_q[i] .. cu_seq_lens_q[i + 1] - 1 and attends only itself.
    """
    cu_seq_lens = kwargs.get("cu_seq_lens_q")
    if cu_seq_lens is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
            sliding_window=sliding_window, softcap=softcap, **kwargs,
        )  # fmt: skip
    if query.shape[0] != 1:
        raise ValueError(f"packed attention expects one packed row, got a batch of {query.shape[0]}")
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    if _kernel_applies(query, softcap):
        out = _flash_varlen(
            query, key, value, cu_seq_lens, int(kwargs["max_length_q"]), scaling, sliding_window
        )
    else:
        out = _blockwise(query, key, value, cu_seq_lens, scaling, sliding_window, softcap)
    return out.unsqueeze(0), None


def _kernel_applies(query: torch.Tensor, softcap: float | None) -> bool:
    if not query.is_cuda or softcap:
        return False
    return query.dtype in (torch.float16, torch.bfloat16) or torch.is_autocast_enabled(query.device.type)


def _flash_varlen(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    max_length: int,
    scaling: float,
    sliding_window: int | None,
) -> torch.Tensor:
    from torch.nn.attention.varlen import varlen_attn

    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [S, heads, D]
    if q.dtype == torch.float32:
        # Under autocast the rotary products come out in fp32; the kernel takes half precision only.
        dtype = torch.get_autocast_dtype(q.device.type)
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    options: dict[str, Any] = {"scale": scaling}
    # Causal is a left window of everything and no right window; a sliding window of W keeps the
    # query and the W - 1 keys before it, as transformers' sliding masks do.
    options["window_size"] = (sliding_window - 1 if sliding_window else -1, 0)
    group = q.shape[1] // k.shape[1]
    if group > 1:
        if "enable_gqa" in _varlen_parameters():
            options["enable_gqa"] = True
        else:  # torch 2.11's kernel has no grouped-query mode
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    cu = cu_seq_lens.to(torch.int32)
    out = varlen_attn(q, k, v, cu, cu, max_length, max_length, **options)  # [S, H, D]
    assert isinstance(out, torch.Tensor), "without return_aux the kernel returns the output alone"
    return out.to(query.dtype)


def _varlen_parameters() -> set[str]:
    from torch.nn.attention.varlen import varlen_attn

    return set(inspect.signature(varlen_attn).parameters)


def _blockwise(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    scaling: float,
    sliding_window: int | None,
    softcap: float | None,
) -> torch.Tensor:
    """Each sequence's causal block on its own (eager math when soft-capped); [S, H, D]."""
    group = query.shape[1] // key.shape[1]
    bounds = cu_seq_lens.tolist()
    parts = []
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        q = query[:, :, start:end]
        k = key[:, :, start:end].repeat_interleave(group, dim=1)
        v = value[:, :, start:end].repeat_interleave(group, dim=1)
        length = end - start
        rows = torch.arange(length, device=query.device)
        allowed = rows[None, :] <= rows[:, None]  # [L, L] causal
        if sliding_window:
            allowed &= rows[None, :] > rows[:, None] - sliding_window
        if softcap:
            scores = torch.matmul(q, k.transpose(-1, -2)) * scaling
            scores = torch.tanh(scores / softcap) * softcap
            scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
            out = torch.matmul(probs, v)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scaling)
        parts.append(out[0].transpose(0, 1))  # [L, H, D]
    return torch.cat(parts)
