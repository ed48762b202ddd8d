"""`relm bench rollout`: new tokens/s, time to first token, peak memory and share of the bandwidth limit.

A random-weight model with a zoo entry's shape is built directly on the device (no weights written
or read; a local folder or Hub id loads its own weights instead), prompts are random ids of one length, and eos is ignored, so every run generates exactly
batch x response-len tokens and runs are comparable across engines, machines and versions.

`--eos-rate P` makes lengths vary instead, as RL rollouts do: a random P share of the vocabulary
ends a response, and random weights sample almost uniformly, so a response stops with probability
about P per token (lengths roughly geometric, mean near 1/P, cut at response-len). That is the
case continuous batching (`--max-num-seqs` below the batch) is for; `--waves` runs the same batch
as separate lock-step calls of max-num-seqs prompts, what an engine without it would do in the
same memory.

`--quantization none fp8` measures the native engine with the model's own weights and with FP8 copies of
its linear layers (`relm.rollout.native.fp8`), one after the other on the same model; each native row
also carries the gap between the engine's logprobs of its sampled tokens and the model's own forward
(the trainer's computation) over the first 16 rows. Random weights sample almost uniformly, so that gap
is smaller than a trained model's would be.

Bandwidth: decoding is memory-bound, so the yardstick is the bytes one decode step must read (the
weights plus the live KV cache) over the step's time, against a device copy measured at start.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import torch
import transformers
from torch import nn

from relm.config.validate import ROLLOUT_QUANTIZATIONS
from relm.errors import UserError, run_guarded
from relm.learner.forward import response_logprobs
from relm.memory.rollout_budget import kv_bytes_per_token
from relm.models.loading import load_causal_lm, pick_dtype
from relm.models.zoo import zoo_config
from relm.rollout.base import GenerationOutput, SamplingParams
from relm.rollout.hf_engine import HFRolloutEngine
from relm.rollout.native.engine import COMPILE_MODES, NativeRolloutEngine
from relm.rollout.padding import left_pad

ENGINES = ("native", "hf")
TABLE_HEADER = (
    "| date | machine | torch / transformers | model | batch | prompt+new | engine | new tok/s | decode tok/s "
    "| TTFT s | peak GB | % of bandwidth |\n"
    "| --- | --- | --- | --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |"
)
"""Header of docs/benchmarks.md's results table; `markdown_row` writes its rows."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UserError(f"relm bench rollout: {message} (see `relm bench rollout --help`)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="relm bench rollout", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        required=True,
        help="zoo:NAME (random weights with that shape), a local model folder or a Hub id",
    )
    parser.add_argument("--batch", type=int, required=True, help="prompts per generate call (n = 1)")
    parser.add_argument("--prompt-len", type=int, required=True)
    parser.add_argument("--response-len", type=int, required=True)
    parser.add_argument("--engine", choices=(*ENGINES, "both"), default="native")
    parser.add_argument("--dtype", default="auto", help="auto (bf16 on cuda, fp32 on cpu), bfloat16, float32")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first (native: full size)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    parser.add_argument("--no-cuda-graphs", action="store_true", help="native engine decodes eagerly")
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        help="native: rows decoded at once; fewer than --batch is continuous batching",
    )
    parser.add_argument(
        "--eos-rate",
        type=float,
        default=0.0,
        help="share of the vocabulary that ends a response (0: eos ignored, fixed lengths)",
    )
    parser.add_argument(
        "--waves",
        action="store_true",
        help="with --max-num-seqs: one lock-step call per max-num-seqs prompts",
    )
    parser.add_argument(
        "--compile-mode",
        choices=[mode for mode in COMPILE_MODES if mode],
        help="native: torch.compile mode of the compiled pieces",
    )
    parser.add_argument(
        "--no-fused-projections",
        action="store_true",
        help="native: keep q/k/v and gate/up as separate products (fused by default)",
    )
    parser.add_argument(
        "--quantization",
        nargs="+",
        choices=("none", *ROLLOUT_QUANTIZATIONS),
        default=["none"],
        help="native: the weights it generates with, each measured in turn (fp8: FP8 copies of the linear layers)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the results (a list of rows) to this file")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of `relm bench rollout ...`; exit code 0, or 2 on a usage error."""
    args = sys.argv[1:] if argv is None else argv
    return run_guarded(lambda: _run(build_parser().parse_args(args)))


def _run(args: argparse.Namespace) -> int:
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
    if args.model.startswith("zoo:"):
        model = build_random_model(args.model, dtype, device, args.seed)
    else:  # a local folder or Hub id: its own weights, loaded (and checked) as the trainer loads them
        model = load_causal_lm(args.model, dtype=dtype, device=device).eval().requires_grad_(False)
    copy_bandwidth = measure_copy_bandwidth(device)
    vocab = model.config.get_text_config().vocab_size  # type: ignore[union-attr,operator]  # nn.Module hides the HF model's API
    generator = torch.Generator().manual_seed(args.seed)
    prompts = torch.randint(0, vocab, (args.batch, args.prompt_len), generator=generator).tolist()
    eos_ids = eos_share(vocab, args.eos_rate, generator)
    engines = ENGINES if args.engine == "both" else (args.engine,)
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
    _print_table(rows)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


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


def _print_table(rows: list[dict[str, Any]]) -> None:
    first = rows[0]
    print(
        f"{first['model']} ({first['params_b']:.2f}B, {first['dtype']}) on {first['device']}, batch "
        f"{first['batch']}, {first['prompt_len']} prompt + {first['response_len']} new tokens; copy "
        f"bandwidth {first['copy_bandwidth_gbs']:.0f} GB/s; torch {first['torch']}, transformers "
        f"{first['transformers']}"
    )
    if first["eos_rate"]:
        print(
            f"eos active (rate {first['eos_rate']:g}): responses of {first['mean_response_len']:.0f} tokens on "
            f"average, {first['max_response_len']} at most"
        )
    header = (
        f"{'engine':<18} {'new tok/s':>11} {'decode tok/s':>13} {'TTFT s':>8} {'step ms':>8} {'peak GB':>8} "
        f"{'% bw':>6}"
    )
    print(header)
    for row in rows:
        peak = f"{row['peak_gb']:.1f}" if row["peak_gb"] is not None else "-"
        print(
            f"{engine_label(row):<18} {row['new_tokens_per_s']:>11,.0f} {row['decode_tokens_per_s']:>13,.0f} "
            f"{row['ttft_s']:>8.3f} "
            f"{row['decode_step_s'] * 1e3:>8.2f} {peak:>8} {_percent(row['bandwidth_fraction']):>6}"
        )
    speeds = {engine_label(row): row["new_tokens_per_s"] for row in rows}
    if "native" in speeds and "hf" in speeds:
        print(f"native / hf: {speeds['native'] / speeds['hf']:.1f}x")
    for quantization in ROLLOUT_QUANTIZATIONS:
        if "native" in speeds and f"native, {quantization}" in speeds:
            print(
                f"native {quantization} / native: {speeds[f'native, {quantization}'] / speeds['native']:.2f}x"
            )
    for row in rows:
        if "logprob_gap_max" in row:
            print(
                f"{engine_label(row)}: logprob gap to the model's forward (first 16 rows) max "
                f"{row['logprob_gap_max']:.4f}, mean {row['logprob_gap_mean']:.5f}"
                + (f"; fp8 products: {row['fp8_products']}" if row.get("fp8_products") else "")
            )
    for row in rows:
        if row.get("fallback_reason"):
            print(f"note: the native engine fell back to HF: {row['fallback_reason']}")
        if row.get("graphs_disabled_reason"):
            print(f"note: the native engine decoded without CUDA graphs: {row['graphs_disabled_reason']}")
    print("docs/benchmarks.md rows:")
    print(TABLE_HEADER)
    for row in rows:
        print(markdown_row(row))


def markdown_row(row: dict[str, Any]) -> str:
    """One row of docs/benchmarks.md's table (same column order as its header)."""
    peak = f"{row['peak_gb']:.1f}" if row["peak_gb"] is not None else "-"
    cells = [
        row["date"],
        row["device"],
        f"{row['torch']} / {row['transformers']}",
        f"{row['model'].removeprefix('zoo:')} ({row['params_b']:.2f}B {row['dtype']})",
        str(row["batch"]),
        f"{row['prompt_len']}+{row['response_len']}"
        + (f" (eos {row['eos_rate']:g}: mean {row['mean_response_len']:.0f})" if row.get("eos_rate") else ""),
        engine_label(row),
        f"{row['new_tokens_per_s']:,.0f}",
        f"{row['decode_tokens_per_s']:,.0f}",
        f"{row['ttft_s']:.3f}",
        peak,
        _percent(row["bandwidth_fraction"]),
    ]
    return "| " + " | ".join(cells) + " |"


def engine_label(row: dict[str, Any]) -> str:
    """The engine, with how the native one batched when not all rows at once: `native, 64 slots`
    (continuous batching) or `native, waves of 64` (separate lock-step calls)."""
    engine = f"{row['engine']}, {row['quantization']}" if row.get("quantization") else row["engine"]
    if row.get("waves"):
        return f"{engine}, waves of {row['max_num_seqs']}"
    if row.get("slots") is not None and row["slots"] < row["batch"]:
        return f"{engine}, {row['slots']} slots"
    return engine


def _percent(fraction: float) -> str:
    return "-" if math.isnan(fraction) else f"{100 * fraction:.1f}"


if __name__ == "__main__":
    sys.exit(main())
