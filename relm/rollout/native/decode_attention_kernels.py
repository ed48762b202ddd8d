"""Triton kernels of the grouped-query decode attention (`relm.rollout.native.decode_attention` launches them).

Kept apart from the launcher because defining a `triton.jit` function imports Triton: this module
is imported only once a CUDA decode step (or a test through Triton's interpreter) asks for it, so
`relm` imports and runs on machines without Triton.

One program computes one (row, KV head): the G query heads that share the KV head are the rows of
one [G_PAD, D] tile, so each K/V tile is read from memory once for the whole group and both
products run on tensor cores (`tl.dot` needs at least 16 rows, hence G padded up with zero
queries that are never stored). Softmax is the online (flash) form in fp32 with base-2
exponentials. With split-K (flash-decoding, for batches too small to fill the GPU) each program
covers a contiguous range of column tiles and leaves an unnormalized partial result that
`combine_splits_kernel` merges.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Globals a kernel reads must be constexpr objects (Triton refuses plain module floats).
LOG2E = tl.constexpr(1.4426950408889634)
"""log2(e): scores are scaled by it once so the kernel can use exp2."""

NO_MAX = tl.constexpr(-1.0e30)
"""Running maximum before any attended column: finite, so a tile whose columns are all masked
gives exp2(-inf - NO_MAX) = 0 rather than exp2(-inf - -inf) = NaN."""


@triton.jit
def decode_attention_kernel(
    query,  # [B, H, 1, D] any strides
    key,  # [B, Hkv, K, D] any strides (a slice of the cache buffer)
    value,  # [B, Hkv, K, Dv] any strides
    mask,  # [B, K] uint8 (the bool mask's bytes), 1 = attend
    out,  # [B, 1, H, Dv] contiguous; written when not SPLIT
    partial_out,  # [B * Hkv, S, G, Dv] fp32 unnormalized; written when SPLIT
    partial_stats,  # [B * Hkv, S, 2, G] fp32 running max (log2 units) and sum; written when SPLIT
    stride_qb,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_vd,
    stride_mb,
    stride_mn,
    num_columns,
    tiles_per_split,
    scale,
    softcap,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    VALUE_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    SKIP_MASKED: tl.constexpr,
    PRECISION: tl.constexpr,
):
    row_head = tl.program_id(0)
    split = tl.program_id(1)
    num_splits = tl.num_programs(1)
    # 64-bit row offsets: a whole cache buffer can pass 2**31 elements (1024 rows x 8 heads x 2048 x 128).
    row = (row_head // NUM_KV_HEADS).to(tl.int64)
    kv_head = row_head % NUM_KV_HEADS

    group = tl.arange(0, GROUP_PAD)
    is_head = group < GROUP
    heads = kv_head * GROUP + group  # heads j * G + g share KV head j (transformers' repeat_kv order)
    dims = tl.arange(0, HEAD_DIM)
    value_dims = tl.arange(0, VALUE_DIM)
    q = tl.load(
        query + row * stride_qb + heads[:, None] * stride_qh + dims[None, :] * stride_qd,
        mask=is_head[:, None],
        other=0.0,
    )  # [GROUP_PAD, D]
    key_base = key + row * stride_kb + kv_head * stride_kh
    value_base = value + row * stride_vb + kv_head * stride_vh
    mask_base = mask + row * stride_mb

    running_max = tl.full([GROUP_PAD], NO_MAX, tl.float32)
    running_sum = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, VALUE_DIM], tl.float32)
    first = split * tiles_per_split * BLOCK_N
    last = tl.minimum(num_columns, first + tiles_per_split * BLOCK_N)
    for start in range(first, last, BLOCK_N):
        columns = start + tl.arange(0, BLOCK_N)
        in_range = columns < last
        live = tl.load(mask_base + columns * stride_mn, mask=in_range, other=0) != 0  # [BLOCK_N]
        # SKIP_MASKED: masked columns are not read at all (predicated loads), so left padding and
        # the columns past a row's own cost no bandwidth; else every column in range is read (the
        # loads then do not wait on the mask's) and masked ones only get zero weight.
        load_mask = live if SKIP_MASKED else in_range
        k = tl.load(
            key_base + columns[:, None] * stride_kn + dims[None, :] * stride_kd,
            mask=load_mask[:, None],
            other=0.0,
        )  # [BLOCK_N, D]
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # [GROUP_PAD, BLOCK_N] fp32
        if HAS_SOFTCAP:
            # cap * tanh(s / cap), with tanh(x) = 2 * sigmoid(2x) - 1 (Gemma 2's attention soft-capping).
            scores = softcap * (2.0 * tl.sigmoid(2.0 * scores * scale / softcap) - 1.0) * LOG2E
        else:
            scores = scores * (scale * LOG2E)
        scores = tl.where(live[None, :], scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        rescale = tl.exp2(running_max - new_max)
        probs = tl.exp2(scores - new_max[:, None])
        running_sum = running_sum * rescale + tl.sum(probs, axis=1)
        v = tl.load(
            value_base + columns[:, None] * stride_vn + value_dims[None, :] * stride_vd,
            mask=load_mask[:, None],
            other=0.0,
        )  # [BLOCK_N, Dv]
        acc = acc * rescale[:, None] + tl.dot(probs.to(v.dtype), v, input_precision=PRECISION)
        running_max = new_max

    if SPLIT:
        slot = row_head * num_splits + split
        tl.store(
            partial_out + (slot * GROUP + group[:, None]) * VALUE_DIM + value_dims[None, :],
            acc,
            mask=is_head[:, None],
        )
        tl.store(partial_stats + (slot * 2) * GROUP + group, running_max, mask=is_head)
        tl.store(partial_stats + (slot * 2 + 1) * GROUP + group, running_sum, mask=is_head)
    else:
        # A row with no attended column (never sent by the engine) gets zeros, not 0/0.
        result = acc / tl.where(running_sum > 0, running_sum, 1.0)[:, None]
        out_offsets = (row * NUM_KV_HEADS * GROUP + heads[:, None]) * VALUE_DIM + value_dims[None, :]
        tl.store(out + out_offsets, result.to(out.dtype.element_ty), mask=is_head[:, None])


@triton.jit
def combine_splits_kernel(
    partial_out,  # [B * Hkv, S, G, Dv] fp32
    partial_stats,  # [B * Hkv, S, 2, G] fp32
    out,  # [B, 1, H, Dv] contiguous
    num_splits,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    VALUE_DIM: tl.constexpr,
):
    """out = sum_s w_s * acc_s / sum_s w_s * sum_s, with w_s = 2^(max_s - max over splits), per head."""
    row_head = tl.program_id(0).to(tl.int64)
    group = tl.arange(0, GROUP_PAD)
    is_head = group < GROUP
    value_dims = tl.arange(0, VALUE_DIM)
    running_max = tl.full([GROUP_PAD], NO_MAX, tl.float32)
    running_sum = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, VALUE_DIM], tl.float32)
    for split in range(0, num_splits):
        slot = row_head * num_splits + split
        split_max = tl.load(partial_stats + (slot * 2) * GROUP + group, mask=is_head, other=NO_MAX)
        split_sum = tl.load(partial_stats + (slot * 2 + 1) * GROUP + group, mask=is_head, other=0.0)
        split_acc = tl.load(
            partial_out + (slot * GROUP + group[:, None]) * VALUE_DIM + value_dims[None, :],
            mask=is_head[:, None],
            other=0.0,
        )
        new_max = tl.maximum(running_max, split_max)
        old_weight = tl.exp2(running_max - new_max)
        split_weight = tl.exp2(split_max - new_max)
        running_sum = running_sum * old_weight + split_sum * split_weight
        acc = acc * old_weight[:, None] + split_acc * split_weight[:, None]
        running_max = new_max
    result = acc / tl.where(running_sum > 0, running_sum, 1.0)[:, None]
    out_offsets = (row_head * GROUP + group[:, None]) * VALUE_DIM + value_dims[None, :]
    tl.store(out + out_offsets, result.to(out.dtype.element_ty), mask=is_head[:, None])
