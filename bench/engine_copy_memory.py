"""GPU peak of building the rollout engine's bf16 copy of an fp32 actor: the old way (deepcopy, then cast)
against `copy_in_dtype` / `without_adapters` (tensor by tensor in bf16), without and with LoRA adapters.

One short command (a 7B-shaped model with random weights, built on the device; about a minute on an H200):

    PYTHONPATH=. python bench/engine_copy_memory.py --model zoo:Qwen/Qwen2.5-7B-Instruct --lora-rank 64

writes `$OUT/engine_copy_memory.json` (or `--json PATH`) and prints one line per way: GiB the build added to
the device's peak above what was allocated before it. On CPU (`--device cpu`, a `zoo:tiny/...` model) it
runs the same code and reports bytes of the copy only (no device peak to read).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from relm.learner.lora import LoraSettings, add_lora, without_adapters
from relm.models.precision import copy_in_dtype
from relm.models.zoo import zoo_config

GIB = 2**30


def measure(make: Callable[[], torch.nn.Module], device: torch.device) -> dict[str, float]:
    """GiB `make()` adds to the device's peak (CUDA), and GiB of the copy's parameters, and seconds."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    start = time.perf_counter()
    made = make()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    row = {
        "seconds": time.perf_counter() - start,
        "copy_gib": sum(p.numel() * p.element_size() for p in made.parameters()) / GIB,
    }
    if device.type == "cuda":
        row["peak_added_gib"] = (torch.cuda.max_memory_allocated(device) - before) / GIB
    del made
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="zoo:Qwen/Qwen2.5-7B-Instruct")
    parser.add_argument("--lora-rank", type=int, default=64)
    parser.add_argument("--lora-alpha", type=float, default=32)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--skip-old", action="store_true", help="skip the deepcopy-then-cast rows")
    parser.add_argument(
        "--json", default=str(Path(os.environ.get("OUT", "bench/results")) / "engine_copy_memory.json")
    )
    args = parser.parse_args()

    device = torch.device(args.device)
    torch.manual_seed(0)
    with device:
        actor = AutoModelForCausalLM.from_config(zoo_config(args.model), dtype=torch.float32)
    fp32_gib = sum(p.numel() * 4 for p in actor.parameters()) / GIB
    rows: dict[str, dict[str, float]] = {}
    bf16 = torch.bfloat16
    if not args.skip_old:
        rows["full: deepcopy then cast"] = measure(lambda: copy.deepcopy(actor).to(bf16), device)
    rows["full: copy_in_dtype"] = measure(lambda: copy_in_dtype(actor, bf16), device)
    add_lora(actor, LoraSettings(rank=args.lora_rank, alpha=args.lora_alpha))
    rows[f"LoRA rank {args.lora_rank}: without_adapters"] = measure(
        lambda: without_adapters(actor, bf16), device
    )

    result = {"model": args.model, "device": str(device), "fp32_model_gib": fp32_gib, "rows": rows}
    if device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(device)
    print(f"{args.model}: fp32 model {fp32_gib:.2f} GiB on {device}")
    for name, row in rows.items():
        print(f"  {name}: " + ", ".join(f"{key} {value:.3f}" for key, value in row.items()))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
