"""Grouped-query attention of one decode token per row, as one Triton kernel per layer.

Why a kernel of our own: a decode step's attention is a pure read of the KV cache, so its floor is
the cache's bytes over the memory bandwidth. sdpa's grouped-query mode with a mask (what CUDA decode
steps used before) took 37 us a layer on an H200 at batch 256, 12/2 heads, 384 columns, against
23 us for reading its 100 MB of K/V. This kernel reads each KV head once for its whole query group,
skips the loads of masked columns (left padding, columns past a row's own: in continuous batching
rows of one step sit at different lengths) and reads `key`/`value` in place as slices of the
preallocated cache, whatever their strides.

`decode_attention` is what `native_attention` calls for a CUDA decode step when `available` says
the shapes fit; `reference_decode_attention` is the same math in fp32 torch, what tests compare it
with. Triton is imported only when a kernel first runs (`relm.rollout.native.decode_attention_kernels`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from dataclasses import dataclass

import torch

from relm.rollout.native.grouped_attention import grouped_attention

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class KernelConfig:
    """Launch parameters of the decode kernel; `default_config` picks them from the shapes."""

    block_n: int
    """Cache columns per tile (a power of two >= 16)."""
    num_splits: int
    """Programs per (row, KV head) along the columns; above 1 a second kernel merges their results."""
    num_warps: int = 4
    """Warps per program."""
    num_stages: int = 3
    """Pipeline depth of the column loop: Triton copies the next `num_stages - 1` tiles into shared
    memory (cp.async) while one is computed; 1 does not pipeline."""
    skip_masked: bool = True
    """Predicate the K/V loads on the mask, so masked columns are not read (False: read every column
    up to K, the loads then not waiting on the mask's; a benchmark knob)."""


def available(query: torch.Tensor, value: torch.Tensor | None = None) -> bool:
    """Whether `decode_attention` runs this decode step: a CUDA tensor of fp16/bf16/fp32, head sizes
    powers of two in [16, 256] (`tl.dot` and the tiles need them) and Triton importable. False means
    the caller keeps its own path."""
    head_dims = [query.shape[-1]] + ([value.shape[-1]] if value is not None else [])
    return (
        query.is_cuda
        and query.dtype in _DTYPES
        and query.dim() == 4
        and query.shape[2] == 1
        and all(16 <= d <= 256 and d & (d - 1) == 0 for d in head_dims)
        and _triton_importable()
    )


def decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    softcap: float | None = None,
    config: KernelConfig | None = None,
) -> torch.Tensor:
    """One query per row over its cached columns: [B, H, 1, D] x [B, Hkv, K, D(v)] -> [B, 1, H, Dv].

    Args:
        query: [B, H, 1, D], any strides (transformers hands it transposed).
        key: [B, Hkv, K, D], any strides: usually `cache[:B, :, :K]` of a larger buffer.
        value: [B, Hkv, K, Dv], any strides.
        mask: [B, 1, 1, K] bool, True = attend (broadcast dimensions allowed). A row with no True
            column gets zeros; the engine never sends one.
        scale: multiplies q.k before the softmax.
        softcap: Gemma 2's attention soft-capping, cap * tanh(q.k * scale / cap), or None.
        config: launch parameters; None picks them from the shapes (`default_config`).

    Returns:
        [B, 1, H, Dv] contiguous in the query's dtype, the layout `native_attention` returns.
    """
    # Deferred: the kernels' module imports Triton, which a CPU-only install may lack.
    kernels = importlib.import_module("relm.rollout.native.decode_attention_kernels")
    batch, num_heads, _, head_dim = query.shape
    num_kv_heads, num_columns, value_dim = key.shape[1], key.shape[2], value.shape[-1]
    group = num_heads // num_kv_heads
    config = config or default_config(batch * num_kv_heads, num_columns, head_dim, query.dtype, query.device)
    # Bytes of the bool mask, read as integers; expand keeps broadcast dimensions at stride 0.
    mask_bytes = mask.expand(batch, 1, 1, num_columns).view(torch.uint8)[:, 0, 0]  # [B, K]
    out = torch.empty(batch, 1, num_heads, value_dim, dtype=query.dtype, device=query.device)
    num_tiles = max(1, -(-num_columns // config.block_n))
    tiles_per_split = -(-num_tiles // config.num_splits)
    num_splits = -(-num_tiles // tiles_per_split)  # no split left without a column
    split = num_splits > 1
    if split:
        partial_out = torch.empty(
            batch * num_kv_heads, num_splits, group, value_dim, dtype=torch.float32, device=query.device
        )
        partial_stats = torch.empty(
            batch * num_kv_heads, num_splits, 2, group, dtype=torch.float32, device=query.device
        )
    else:
        partial_out = partial_stats = out  # not written: the kernel stores into `out` directly
    group_pad = max(16, 1 << (group - 1).bit_length())
    # Triton launches on the current CUDA device, which need not be the tensors' one.
    on_device = torch.cuda.device(query.device) if query.is_cuda else contextlib.nullcontext()
    with on_device:
        kernels.decode_attention_kernel[(batch * num_kv_heads, num_splits)](
            query, key, value, mask_bytes, out, partial_out, partial_stats,
            *query.stride()[:2], query.stride(3),
            *key.stride(),
            *value.stride(),
            *mask_bytes.stride(),
            num_columns, tiles_per_split, float(scale), float(softcap or 1.0),
            NUM_KV_HEADS=num_kv_heads, GROUP=group, GROUP_PAD=group_pad,
            HEAD_DIM=head_dim, VALUE_DIM=value_dim,
            BLOCK_N=config.block_n, SPLIT=split, HAS_SOFTCAP=bool(softcap), SKIP_MASKED=config.skip_masked,
            # fp32 products stay fp32 (TF32 would miss the reference by ~1e-3); fp16/bf16 ignore it.
            PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
            num_warps=config.num_warps, num_stages=config.num_stages,
        )  # fmt: skip
        if split:
            kernels.combine_splits_kernel[(batch * num_kv_heads,)](
                partial_out, partial_stats, out, num_splits,
                GROUP=group, GROUP_PAD=group_pad, VALUE_DIM=value_dim, num_warps=4,
            )  # fmt: skip
    return out


def default_config(
    num_programs: int, num_columns: int, head_dim: int, dtype: torch.dtype, device: torch.device
) -> KernelConfig:
    """Launch parameters for `num_programs` (rows x KV heads) over `num_columns` columns.

    Tiles: measured on an H200 (Triton 3.6, batch 256, 12/2 heads of 128, 384 columns, bf16), 32
    columns a tile took 26.9 us against 31.3 at 64 and 36.2 at 128 (sdpa: 37.0); 4 warps and 3
    stages were at least as fast as the alternatives swept. fp32 (ieee products on CUDA cores)
    spills at 32-column tiles, so it takes 16 (8 warps for 256-wide heads).

    Split-K only while rows x KV heads leave the GPU short of programs: below two per streaming
    multiprocessor each split adds a partial result to write and merge, above it the GPU is busy
    (at batch 256 and 2 KV heads, 512 programs on an H200's 132 SMs).
    """
    if dtype == torch.float32:
        block_n, num_warps = 16, 8 if head_dim > 128 else 4
    else:
        block_n, num_warps = 32, 4
    target = 2 * _multiprocessors(device)
    num_tiles = max(1, -(-num_columns // block_n))
    num_splits = 1 if num_programs >= target else min(num_tiles, -(-target // num_programs))
    return KernelConfig(block_n=block_n, num_splits=num_splits, num_warps=num_warps)


def reference_decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    softcap: float | None = None,
) -> torch.Tensor:
    """`decode_attention`'s math in fp32 torch (the CPU path's grouped products), in the query's dtype."""
    out = grouped_attention(query.float(), key.float(), value.float(), mask, scale, softcap)
    return out.to(query.dtype)  # [B, 1, H, Dv]


@functools.cache
def _triton_importable() -> bool:
    try:  # the kernels' module imports Triton: whether that works is the question asked here
        importlib.import_module("relm.rollout.native.decode_attention_kernels")
    except ImportError:
        return False
    return True


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    if device.type != "cuda":
        return 1  # Triton's interpreter on CPU: no GPU to fill
    return torch.cuda.get_device_properties(device).multi_processor_count
