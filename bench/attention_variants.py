"""Decode attention for one layer, several ways (development tool, CUDA only): which reads the cache fastest.

python bench/attention_variants.py --batch 256 --kv-heads 2 --group 6 --length 384
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from relm.rollout.native.grouped_attention import grouped_attention


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--group", type=int, default=6)
    parser.add_argument("--length", type=int, default=384)
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args()
    b, hkv, g, n, d = args.batch, args.kv_heads, args.group, args.length, args.head_dim
    cache = torch.randn(2, b, hkv, n + 128, d, device="cuda", dtype=torch.bfloat16)
    key, value = cache[0, :, :, :n], cache[1, :, :, :n]
    query = torch.randn(b, 1, hkv * g, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    mask = torch.ones(b, 1, 1, n, dtype=torch.bool, device="cuda")
    mask[:, :, :, :7] = False
    kv_bytes = 2 * key.numel() * key.element_size()
    scale = d**-0.5
    variants = {
        "grouped matmul (native: CPU)": lambda: grouped_attention(query, key, value, mask, scale, None),
        "sdpa gqa, no mask (reads masked columns too)": lambda: F.scaled_dot_product_attention(
            query, key, value, enable_gqa=True
        ),
        "sdpa gqa, bool mask (native: CUDA w/o Triton)": lambda: F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, enable_gqa=True, scale=scale
        ),
        "sdpa repeated kv, bool mask": lambda: F.scaled_dot_product_attention(
            query, key.repeat_interleave(g, 1), value.repeat_interleave(g, 1), attn_mask=mask, scale=scale
        ),
    }
    want = variants["grouped matmul (native: CPU)"]()
    for name, fn in variants.items():
        out = fn()
        out = out if out.shape == want.shape else out.transpose(1, 2)
        ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
        print(
            f"{name:<46} {ms * 1e3:8.1f} us  {kv_bytes / ms / 1e6:7.0f} GB/s of KV  max|diff| "
            f"{(out.float() - want.float()).abs().max().item():.3f}"
        )


if __name__ == "__main__":
    main()
