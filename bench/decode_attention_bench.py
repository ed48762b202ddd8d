"""One layer's decode attention, Triton kernel against sdpa (CUDA only): us per call, GB/s, error.

python bench/decode_attention_bench.py            # the table (about 30 s on an H200)
python bench/decode_attention_bench.py --no-sweep # without the launch-parameter sweep

Shapes are Qwen2.5-1.5B's (12 query heads over 2 KV heads, head size 128, bf16) at batch 64, 256 and
1024 over 264, 384 and 512 cache columns, laid out as the engine hands them over: key/value are
`[:B, :, :K]` slices of a [B, 2, 576, 128] cache buffer, the query is transposed, the mask is a slice
of a wider buffer. Masks are a lock-step step's: left padding of 0-63 columns per row and the
last 40 columns of the length bucket not yet written.

Each variant is timed as a replayed CUDA graph of 12 calls (no launch overhead, as in the engine),
cycling over enough copies of the cache that they do not fit in L2 together, so every call reads
its K/V from memory as a real decode step does. GB/s counts every K/V byte of the K columns (what
sdpa reads); the kernel skips masked columns, so its count includes bytes it did not need to read.
max|diff| is against the fp32 torch reference.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch
import torch.nn.functional as F

from relm.rollout.native.decode_attention import (
    KernelConfig,
    decode_attention,
    default_config,
    reference_decode_attention,
)

KV_HEADS, GROUP, HEAD_DIM, MAX_LENGTH = 2, 6, 128, 576
CALLS_PER_GRAPH = 12
L2_FLUSH_BYTES = 256 << 20  # several times an H200's L2 (60 MB)


def decode_inputs(batch: int, columns: int, copies: int) -> list[tuple[torch.Tensor, ...]]:
    """`copies` sets of query [B, H, 1, D], key/value [B, Hkv, K, D], mask [B, 1, 1, K], as engine slices."""
    sets = []
    for _ in range(copies):
        cache = torch.randn(2, batch, KV_HEADS, MAX_LENGTH, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        query = torch.randn(batch, 1, KV_HEADS * GROUP, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        mask = torch.zeros(batch, 1, 1, MAX_LENGTH, dtype=torch.bool, device="cuda")
        own = columns - 41  # the step's write column: the bucket's last 40 columns are still empty
        pad = torch.randint(0, 64, (batch,), device="cuda")
        positions = torch.arange(MAX_LENGTH, device="cuda")
        mask[:, 0, 0] = ((positions >= pad[:, None]) & (positions <= own)) | (positions == own)
        sets.append(
            (query.transpose(1, 2), cache[0, :, :, :columns], cache[1, :, :, :columns], mask[..., :columns])
        )
    return sets


def time_graph(fn, sets: list[tuple[torch.Tensor, ...]]) -> float:
    """Microseconds per call of `fn(*inputs)`, replayed from a CUDA graph cycling over `sets`."""
    for inputs in sets:  # compiles the kernel and lets sdpa pick its algorithm, outside the capture
        fn(*inputs)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in range(CALLS_PER_GRAPH):
            fn(*sets[call % len(sets)])
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    replays = 20
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (replays * CALLS_PER_GRAPH)


def sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """native_attention's CUDA decode path before the kernel."""
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=HEAD_DIM**-0.5, enable_gqa=True
    )
    return out.transpose(1, 2).contiguous()


def triton_variant(config: KernelConfig | None):
    def run(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return decode_attention(query, key, value, mask, HEAD_DIM**-0.5, None, config)

    return run


def variants(batch: int, columns: int) -> dict[str, object]:
    """What each shape compares: sdpa, the kernel's defaults, and the defaults with one thing changed."""
    chosen = default_config(batch * KV_HEADS, columns, HEAD_DIM, torch.bfloat16, torch.device("cuda"))
    result = {"sdpa gqa + mask": sdpa, f"triton {describe(chosen)}": triton_variant(None)}
    if chosen.num_splits > 1:
        unsplit = dataclasses.replace(chosen, num_splits=1)
        result[f"triton {describe(unsplit)}"] = triton_variant(unsplit)
    unskipped = dataclasses.replace(chosen, skip_masked=False)
    result[f"triton {describe(unskipped)}"] = triton_variant(unskipped)
    return result


def sweep() -> dict[str, object]:
    """Launch parameters around the defaults (64 columns, 4 warps, 3 stages) at batch 256 x 384 columns."""
    configs = [
        KernelConfig(32, 1),
        KernelConfig(32, 1, num_stages=4),
        KernelConfig(32, 2),
        KernelConfig(64, 1, num_stages=2),
        KernelConfig(64, 1, num_stages=4),
        KernelConfig(64, 1, num_warps=8),
        KernelConfig(64, 2),
        KernelConfig(64, 3),
        KernelConfig(128, 1, num_warps=8),
    ]
    return {f"triton {describe(c)}": triton_variant(c) for c in configs}


def describe(config: KernelConfig) -> str:
    text = f"n{config.block_n} s{config.num_splits} w{config.num_warps} st{config.num_stages}"
    return text + ("" if config.skip_masked else " all-cols")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--columns", type=int, nargs="+", default=[264, 384, 512])
    parser.add_argument("--no-sweep", action="store_true", help="skip the launch-parameter sweep")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("decode_attention_bench needs a CUDA device")
    import triton

    started = time.perf_counter()
    device = torch.cuda.get_device_properties(0)
    print(
        f"{device.name} ({device.multi_processor_count} SMs), torch {torch.__version__}, triton "
        f"{triton.__version__}; {KV_HEADS * GROUP}/{KV_HEADS} heads, head size {HEAD_DIM}, bf16"
    )
    print(f"{'batch':>5} {'K':>4} {'live':>5}  {'variant':<32} {'us':>7} {'GB/s':>6} {'max|diff|':>9}")
    shapes = [(b, k, variants(b, k)) for b in args.batch for k in args.columns]
    if not args.no_sweep:
        shapes.append((256, 384, sweep()))
    for batch, columns, fns in shapes:
        kv_bytes = 2 * batch * KV_HEADS * columns * HEAD_DIM * 2
        sets = decode_inputs(batch, columns, copies=max(1, -(-L2_FLUSH_BYTES // kv_bytes)))
        query, key, value, mask = sets[0]
        want = reference_decode_attention(query, key, value, mask, HEAD_DIM**-0.5).float()
        live = mask.float().mean().item()
        for name, fn in fns.items():
            micros = time_graph(fn, sets)
            diff = (fn(query, key, value, mask).float() - want).abs().max().item()
            print(
                f"{batch:>5} {columns:>4} {live:>5.0%}  {name:<32} {micros:>7.1f} "
                f"{kv_bytes / micros / 1e3:>6.0f} {diff:>9.4f}"
            )
        del sets
        torch.cuda.empty_cache()
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
