"""What `relm bench rollout` measures (relm/bench/rollout.py reads the arguments and prints the table).

Apart from the command so that `relm bench rollout --help` prints without torch and transformers.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import time
from typing import Any

import torch
import transformers
from torch import nn

from relm.bench.cpu_estimate import CPU_LIMIT_S, CpuEstimate, duration, measure_matmul_flops, rollout_flops
from relm.errors import UserError
from relm.learner.forward import response_logprobs
from relm.memory.model_shape import ModelShape
from relm.memory.rollout_budget import kv_bytes_per_token
from relm.models.loading import load_causal_lm, pick_dtype
from relm.models.zoo import zoo_config
from relm.rollout.base import GenerationOutput, SamplingParams
from relm.rollout.hf_engine import HFRolloutEngine
from relm.rollout.native.engine import NativeRolloutEngine
from relm.rollout.padding import left_pad


def measure_rows(args: argparse.Namespace, engines: tuple[str, ...]) -> list[dict[str, Any]]:
    """One row per engine (and native quantization) that `relm bench rollout` measures, in run order."""
    for name in ("batch", "prompt_len", "response_len", "max_num_seqs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UserError(f"relm bench rollout: --{name.replace('_', '-')} must be >= 1")
    if not 0 <= args.eos_rate < 1:
        raise UserError(f"relm bench rollout: --eos-rate must be in [0, 1), got {args.eos_rate}")
    if args.waves and not args.max_num_seqs:
        raise UserError("relm bench rollout: --waves needs --max-num-seqs (the prompts per call)")
    from relm.trainer.components import pick_device

    device = pick_device(args.device, key="--device")
    dtype = pick_dtype(args.dtype, device)
    if device.type == "cpu" and args.model.startswith("zoo:"):
        check_cpu_estimate(args, dtype)
    if args.model.startswith("zoo:"):
        model = build_random_model(args.model, dtype, device, args.seed)
    else:  # a local folder or Hub id: its own weights, loaded (and checked) as the trainer loads them
        model = load_causal_lm(args.model, dtype=dtype, device=device).eval().requires_grad_(False)
    copy_bandwidth = measure_copy_bandwidth(device)
    vocab = model.config.get_text_config().vocab_size  # type: ignore[union-attr,operator]  # nn.Module hides the HF model's API
    generator = torch.Generator().manual_seed(args.seed)
    prompts = torch.randint(0, vocab, (args.batch, args.prompt_len), generator=generator).tolist()
    eos_ids = eos_share(vocab, args.eos_rate, generator)
    runs = [(name, q) for name in engines for q in (args.quantization if name == "native" else ["none"])]
    rows = []
    for name, quantization in runs:
        engine = make_engine(
            name, model, device, args, eos_ids, None if quantization == "none" else quantization
        )
        calls = args.max_num_seqs if args.waves else len(prompts)
        outputs: list[GenerationOutput] = []
        row = measure_engine(
            engine, prompts, args.response_len, args.warmup, device, bool(eos_ids), calls, outputs
        )
        row.update(engine=name, **_shape_fields(args, model, dtype, device, copy_bandwidth))
        row["quantization"] = None if quantization == "none" else quantization
        fp8 = getattr(engine, "fp8", None)
        if fp8 is not None:  # the decode step reads the FP8 copies instead of those layers' weights
            replaced = sum(linear.weight.nbytes for unit in fp8.units for linear in unit.linears)
            row["bytes_per_step"] += fp8.quantized_bytes() - replaced
            blocks = sum(unit.block is not None for unit in fp8.units)
            row["fp8_products"] = f"{blocks} with 128x128 blocks, {len(fp8.units) - blocks} per channel"
        if name == "native":
            row.update(logprob_gap(model, prompts, outputs[0], device))
        # The bytes a step reads assume every row live at the mean length: fixed lengths only.
        row["bandwidth_fraction"] = (
            float("nan") if eos_ids else row["bytes_per_step"] / (row["decode_step_s"] * copy_bandwidth)
        )
        if isinstance(engine, NativeRolloutEngine):
            # With waves the engine's last call may be a smaller remainder: the calls' size instead.
            row["slots"] = (
                min(args.max_num_seqs, args.batch)
                if args.waves
                else int(engine.last_stats.get("slots", args.batch))
            )
            row["cuda_graphs"] = engine.graphs is not None and engine.graphs.disabled_reason is None
            row["graphs_disabled_reason"] = engine.graphs.disabled_reason if engine.graphs else None
            row["fallback_reason"] = engine.fallback_reason
            row["fused_projections"] = len(engine.projections.groups)
            row["compile_mode"] = args.compile_mode
            row["prefill_s"] = engine.last_stats.get("prefill_s")
            engine.release_memory()
        rows.append(row)
        del engine
    return rows


CPU_EXAMPLE_MODEL = "zoo:tiny/qwen2"
"""The shape a refused CPU run is pointed to: Qwen2 shrunk to 2 layers and a 101-token vocabulary."""


def check_cpu_estimate(args: argparse.Namespace, dtype: torch.dtype) -> CpuEstimate:
    """Print the run's plan and estimate at once; refuse (exit 2) a run estimated over `CPU_LIMIT_S`."""
    num_params = ModelShape.from_config(zoo_config(args.model)).num_params
    estimate = CpuEstimate(
        num_params=num_params,
        flops=rollout_flops(num_params, args.batch, args.prompt_len, args.response_len),
        flops_per_s=measure_matmul_flops(),
        weight_bytes=num_params * dtype.itemsize,
        copy_bytes_per_s=measure_copy_bandwidth(torch.device("cpu"), 64 << 20),
        response_len=args.response_len,
    )
    print(
        f"{args.model}: batch {args.batch} x {args.prompt_len}+{args.response_len} tokens on cpu; "
        f"{estimate.describe()}",
        flush=True,
    )
    if estimate.seconds > CPU_LIMIT_S:
        raise UserError(
            f"relm bench rollout: {args.model} at batch {args.batch} x {args.prompt_len}+{args.response_len} "
            f"tokens would take ~{duration(estimate.seconds)} on this CPU (over {duration(CPU_LIMIT_S)}); "
            "run it on a GPU (--device cuda), or a CPU-sized shape: relm bench rollout "
            f"--model {CPU_EXAMPLE_MODEL} --batch 32 --prompt-len 64 --response-len 64"
        )
    return estimate


def build_random_model(path: str, dtype: torch.dtype, device: torch.device, seed: int) -> nn.Module:
    """The zoo entry's architecture with random weights, built on `device` (nothing read or written)."""
    config = zoo_config(path)
    # sdpa drops Gemma 2's attention soft-capping, so capped models run eager (as the loader does).
    capped = getattr(config.get_text_config(), "attn_logit_softcapping", None)
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(
            config, dtype=dtype, attn_implementation="eager" if capped else "sdpa"
        )
    # What the trainer generates with on a GPU is a frozen bf16 copy of the actor.
    return model.eval().requires_grad_(False)


def eos_share(vocab: int, rate: float, generator: torch.Generator) -> list[int]:
    """Random ids making up a `rate` share of the vocabulary (at least one when rate > 0); [] for 0."""
    if rate <= 0:
        return []
    count = max(1, round(rate * vocab))
    return sorted(torch.randperm(vocab, generator=generator)[:count].tolist())


def make_engine(
    name: str,
    model: nn.Module,
    device: torch.device,
    args: argparse.Namespace,
    eos_ids: list[int],
    quantization: str | None = None,
) -> Any:
    pad = model.config.get_text_config().pad_token_id or 0  # type: ignore[union-attr,operator]  # nn.Module hides the HF model's API
    if name == "hf":
        return HFRolloutEngine(model, pad_token_id=pad, eos_token_ids=eos_ids, device=device)
    graphs = False if args.no_cuda_graphs else None
    return NativeRolloutEngine(
        model,
        pad_token_id=pad,
        eos_token_ids=eos_ids,
        device=device,
        gpu_memory_utilization=args.gpu_memory_utilization,
        use_cuda_graphs=graphs,
        max_num_seqs=args.max_num_seqs,
        compile_mode=args.compile_mode,
        fuse_projections=not args.no_fused_projections,
        quantization=quantization,
    )


@torch.no_grad()
def logprob_gap(
    model: nn.Module, prompts: list[list[int]], output: GenerationOutput, device: torch.device, rows: int = 16
) -> dict[str, float]:
    """Largest and mean |engine logprob - forward logprob| of the sampled tokens of the first `rows` rows:
    what `rollout/logprob_diff_*` logs in training, against the model's own unquantized forward."""
    rows = min(rows, len(prompts), output.response_ids.shape[0])
    prompt_ids, prompt_mask = left_pad(prompts[:rows], 0)
    mask = torch.cat([prompt_mask, output.response_mask[:rows]], dim=1)
    ids = torch.cat([prompt_ids, output.response_ids[:rows]], dim=1)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    expected, _ = response_logprobs(
        model, ids.to(device), mask.to(device), positions.to(device), output.response_ids.shape[1]
    )
    gap = (expected.cpu().float() - output.logprobs[:rows].float()).abs()[output.response_mask[:rows].bool()]
    return {"logprob_gap_max": gap.max().item(), "logprob_gap_mean": gap.mean().item()}


def measure_engine(
    engine: Any,
    prompts: list[list[int]],
    response_len: int,
    warmup: int,
    device: torch.device,
    eos: bool = False,
    prompts_per_call: int | None = None,
    outputs_sink: list[Any] | None = None,
) -> dict[str, Any]:
    """Time one full generate run after `warmup` untimed ones, and a 1-token call for TTFT.

    A run is one generate call, or with `prompts_per_call` one call per that many prompts (waves).
    The native engine's warm-up is full-size because it captures one CUDA graph per length bucket
    on first use; the HF engine's is 8 tokens (it only needs kernels loaded and handles made). With
    `eos`, every call has the same seed, so the warm-up draws what the timed run draws.
    The timed run's outputs are appended to `outputs_sink` when given.
    """
    native = isinstance(engine, NativeRolloutEngine)
    per_call = prompts_per_call or len(prompts)
    waves = [prompts[start : start + per_call] for start in range(0, len(prompts), per_call)]

    decode_steps: list[float] = []  # the native engine's, per call of the last run

    def run(max_new_tokens: int) -> list[Any]:
        decode_steps.clear()
        outputs = []
        for wave in waves:
            outputs.append(engine.generate(wave, _params(max_new_tokens, eos)))
            decode_steps.append(
                engine.last_stats.get("decode_steps", float("nan")) if native else float("nan")
            )
        return outputs

    for _ in range(warmup):
        run(response_len if native else min(response_len, 8))
    # Best of three: a tiny model's one-token call is short enough for scheduler noise to dominate.
    ttft = min(_timed(lambda: run(1), device) for _ in range(3))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    outputs: list[Any] = []
    total = _timed(lambda: outputs.extend(run(response_len)), device)
    if outputs_sink is not None:
        outputs_sink.extend(outputs)
    lengths = torch.cat([out.response_lengths for out in outputs]).float()
    new_tokens = int(lengths.sum())
    # Decode steps: fixed lengths take response_len - 1 after the first token; with eos the native
    # engine counts them (a lock-step batch runs until its longest row ends); the HF engine does not.
    steps = sum(decode_steps) if eos else len(waves) * (response_len - 1)
    # Where the call is not measurably longer than its prefill (tiny CPU models), there is no decode figure.
    decode_s = total - ttft
    decode_step_s = decode_s / steps if decode_s > 0 and steps > 0 else float("nan")
    return {
        "new_tokens_per_s": new_tokens / total,
        "new_tokens": new_tokens,
        "mean_response_len": float(lengths.mean()),
        "max_response_len": int(lengths.max()),
        "ttft_s": ttft,
        "total_s": total,
        "decode_step_s": decode_step_s,
        "decode_tokens_per_s": (new_tokens - len(prompts)) / decode_s if decode_s > 0 else float("nan"),
        "peak_gb": torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None,
    }


def measure_copy_bandwidth(device: torch.device, num_bytes: int | None = None) -> float:
    """Bytes per second of a large device-to-device copy, counting bytes read plus bytes written."""
    num_bytes = num_bytes or (2 << 30 if device.type == "cuda" else 256 << 20)
    source = torch.empty(num_bytes, dtype=torch.uint8, device=device).fill_(1)
    target = torch.empty_like(source)
    target.copy_(source)  # warm-up
    repeats = 10 if device.type == "cuda" else 3

    def copies() -> None:
        for _ in range(repeats):
            target.copy_(source)

    return 2 * num_bytes / (_timed(copies, device) / repeats)


def _shape_fields(
    args: argparse.Namespace, model: nn.Module, dtype: torch.dtype, device: torch.device, copy_bw: float
) -> dict[str, Any]:
    config = model.config.get_text_config()  # type: ignore[union-attr,operator]  # nn.Module hides the HF model's API
    dtype_bytes = torch.finfo(dtype).bits // 8
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    # Over the decode steps the live length grows from P + 1 to P + R - 1: P + R / 2 on average.
    live_tokens = args.batch * (args.prompt_len + args.response_len / 2)
    return {
        "model": args.model,
        "params_b": sum(p.numel() for p in model.parameters()) / 1e9,
        "batch": args.batch,
        "prompt_len": args.prompt_len,
        "response_len": args.response_len,
        "eos_rate": args.eos_rate,
        "max_num_seqs": args.max_num_seqs,
        "waves": args.waves,
        "dtype": str(dtype).removeprefix("torch."),
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "copy_bandwidth_gbs": copy_bw / 1e9,
        "bytes_per_step": weight_bytes + live_tokens * kv_bytes_per_token(config, dtype_bytes),
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def _params(max_new_tokens: int, eos: bool = False) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, ignore_eos=not eos, seed=0)


def _timed(fn: Any, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start
