"""How fast a decode step's matrix products run, one shape at a time (development tool, CUDA only).

For a zoo shape and a row count (the decode batch) it times, CUDA-graph replayed, each product of one
decoder layer separately (q, k, v, o, gate, up, down) and fused (qkv, gate_up), plus the output head,
and reports microseconds, TFLOP/s and weight-read TB/s, with two alternatives per shape: the
transposed product (weight @ x^T, which lets cuBLAS pick other tiles) and cuBLASLt as the preferred
library; `--autotune` adds inductor's max-autotune choice (Triton templates against cuBLAS). Usage (repository root):

    python bench/decode_gemms.py --model zoo:Qwen/Qwen2.5-1.5B --rows 256 [--autotune]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F

from relm.models.zoo import zoo_config


def replay_us(fn: Callable[[], torch.Tensor], repeats: int = 50) -> float:
    """Microseconds per call of `fn`, captured in a CUDA graph `repeats` times and replayed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeats):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (5 * repeats)


def shapes(config: object) -> dict[str, tuple[int, int]]:
    """(out_features, in_features) of one layer's products and the output head."""
    text = config.get_text_config()
    hidden, heads, kv_heads = text.hidden_size, text.num_attention_heads, text.num_key_value_heads
    head_dim = getattr(text, "head_dim", None) or hidden // heads
    inter = text.intermediate_size
    return {
        "q": (heads * head_dim, hidden),
        "k": (kv_heads * head_dim, hidden),
        "v": (kv_heads * head_dim, hidden),
        "qkv": ((heads + 2 * kv_heads) * head_dim, hidden),
        "o": (hidden, heads * head_dim),
        "gate": (inter, hidden),
        "up": (inter, hidden),
        "gate_up": (2 * inter, hidden),
        "down": (hidden, inter),
        "lm_head": (text.vocab_size, hidden),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="zoo:Qwen/Qwen2.5-1.5B")
    parser.add_argument("--rows", type=int, nargs="+", default=[256])
    parser.add_argument("--autotune", action="store_true")
    args = parser.parse_args()
    config = zoo_config(args.model)
    print(
        "| rows | product | out x in | cuBLAS us | TFLOP/s | weight TB/s | transposed us | cuBLASLt us | autotuned us |"
    )
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for rows in args.rows:
        for name, (out_f, in_f) in shapes(config).items():
            weight = torch.randn(out_f, in_f, device="cuda", dtype=torch.bfloat16) * 0.02
            x = torch.randn(rows, in_f, device="cuda", dtype=torch.bfloat16)
            us = replay_us(lambda w=weight, x=x: F.linear(x, w))
            transposed = replay_us(lambda w=weight, x=x: torch.mm(w, x.t()))
            torch.backends.cuda.preferred_blas_library("cublaslt")
            lt = replay_us(lambda w=weight, x=x: F.linear(x, w))
            torch.backends.cuda.preferred_blas_library("cublas")
            tuned = float("nan")
            if args.autotune:
                compiled = torch.compile(
                    lambda x, w: F.linear(x, w), mode="max-autotune-no-cudagraphs", dynamic=False
                )
                compiled(x, weight)
                tuned = replay_us(lambda w=weight, x=x, f=compiled: f(x, w))
            flops = 2 * rows * out_f * in_f
            print(
                f"| {rows} | {name} | {out_f} x {in_f} | {us:.1f} | {flops / us / 1e6:.0f} "
                f"| {weight.numel() * 2 / us / 1e6:.2f} | {transposed:.1f} | {lt:.1f} | {tuned:.1f} |"
            )


if __name__ == "__main__":
    main()
