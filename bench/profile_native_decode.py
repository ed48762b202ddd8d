"""Where a native-engine decode step spends its GPU time (development tool, CUDA only).

Runs a few eager decode steps under torch.profiler and prints the kernels by total GPU time, the
GPU time per step against the wall time per step of the CUDA-graph path, and the sampling cost
alone. Usage (from the repository root):

    python bench/profile_native_decode.py --model zoo:Qwen/Qwen2.5-1.5B --batch 256 --prompt-len 256
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from relm.bench.rollout import build_random_model
from relm.rollout.base import SamplingParams
from relm.rollout.native.engine import NativeRolloutEngine
from relm.rollout.sampling import sample_next_token


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="zoo:Qwen/Qwen2.5-1.5B")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rows", type=int, default=30, help="kernel rows to print")
    parser.add_argument("--prefill", action="store_true", help="profile the prefill (a 1-token call) instead")
    args = parser.parse_args()
    model = build_random_model(args.model, torch.bfloat16, torch.device("cuda"), seed=0)
    vocab = model.config.get_text_config().vocab_size
    prompts = torch.randint(0, vocab, (args.batch, args.prompt_len)).tolist()
    params = SamplingParams(max_new_tokens=args.steps, ignore_eos=True, seed=0)

    if args.prefill:
        engine = NativeRolloutEngine(model, pad_token_id=0, eos_token_ids=[], device="cuda")
        one = SamplingParams(max_new_tokens=1, ignore_eos=True, seed=0)
        engine.generate(prompts, one)
        with profile(activities=[ProfilerActivity.CUDA], record_shapes=True) as prof:
            engine.generate(prompts, one)
            torch.cuda.synchronize()
        table = prof.key_averages(group_by_input_shape=True).table(
            sort_by="cuda_time_total",
            row_limit=args.rows,
            max_name_column_width=40,
            max_shapes_column_width=70,
        )
        print(table)
        print(f"prefill: {engine.last_stats['prefill_s'] * 1e3:.1f} ms")
        return
    eager = NativeRolloutEngine(model, pad_token_id=0, eos_token_ids=[], device="cuda", use_cuda_graphs=False)
    eager.generate(prompts, params)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        eager.generate(prompts, params)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=60))
    kernel_us = sum(e.self_device_time_total for e in prof.key_averages())
    eager.generate(prompts, params)
    print(f"eager: {eager.last_stats['decode_s'] / max(1, args.steps - 1) * 1e3:.2f} ms/step wall")
    eager.release_memory()

    graphed = NativeRolloutEngine(model, pad_token_id=0, eos_token_ids=[], device="cuda")
    graphed.generate(prompts, params)
    graphed.generate(prompts, params)
    step_ms = graphed.last_stats["decode_s"] / max(1, args.steps - 1) * 1e3
    print(f"graphs: {step_ms:.2f} ms/step wall, prefill {graphed.last_stats['prefill_s'] * 1e3:.1f} ms")
    print(f"all GPU kernels of the profiled call: {kernel_us / 1e3:.1f} ms (prefill included)")

    logits = torch.randn(args.batch, vocab, device="cuda")
    generator = torch.Generator(device="cuda").manual_seed(0)
    for sampler in (sample_next_token,):
        sampler(logits, params, generator)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(20):
            sampler(logits, params, generator)
        torch.cuda.synchronize()
        print(f"{sampler.__name__} alone: {(time.perf_counter() - start) / 20 * 1e3:.2f} ms/step")


if __name__ == "__main__":
    main()
