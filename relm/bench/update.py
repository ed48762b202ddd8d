"""`relm bench update`: the actor update alone, on packed sequences of mixed lengths, and its MFU.

A full step (`relm bench step`) mixes generation, scoring and three kinds of forward passes; this
isolates the part the training-side kernels decide: `update_actor` (the trainer's own function) over
one batch of responses whose lengths are spread uniformly between a quarter of and the full response
length, as RL batches are. The model is the run's training model: fp32 master weights with bf16
autocast on a GPU, AdamW, the packed forward through the flash varlen kernel, fused norm/MLP/rotary
pieces, micro-batches by token budget. MFU is counted as the trainer counts `perf/mfu/actor`
(`relm.trainer.flops`): 6 x matmul params x tokens plus the attention term, over the update's wall
time (optimizer steps included) and the GPU's dense bf16 peak.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from relm.errors import UserError, run_guarded
from relm.logs import setup_logging

if TYPE_CHECKING:  # at run time imported where used: `--help` needs no torch
    import torch


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="relm bench update", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="zoo:tiny/qwen2", help="model path, Hub id or zoo:NAME")
    parser.add_argument("--rows", type=int, default=64, help="responses in the batch (one mini-batch)")
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument(
        "--response-len", type=int, default=1024, help="longest response; shortest is a quarter"
    )
    parser.add_argument("--max-tokens", type=int, default=16384, help="ppo_max_token_len_per_gpu")
    parser.add_argument("--repeats", type=int, default=3, help="measured updates (after one warm-up)")
    parser.add_argument("--no-compile", action="store_true", help="actor.use_torch_compile=false")
    parser.add_argument(
        "--padded", action="store_true", help="use_remove_padding=false (rows x padded width)"
    )
    parser.add_argument("--grad-checkpointing", action="store_true")
    parser.add_argument(
        "--entropy-coeff",
        type=float,
        default=0.0,
        help="actor.entropy_coeff (0, the default, keeps the entropy metric out of backward)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="profile one more update: GPU time by kernel family, top kernels",
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument("--json", type=Path, default=None)
    return parser.parse_args(argv)


def synthetic_batch(rows: int, prompt_len: int, response_len: int, vocab: int, seed: int = 0):
    """Random tokens with response lengths uniform in [response_len / 4, response_len]."""
    import torch

    from relm.learner.batch import ActorForward, Advantaged, Annotated, Rollout, Scored

    rng = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(1, response_len // 4), response_len + 1, (rows,), generator=rng)
    response_mask = (torch.arange(response_len)[None, :] < lengths[:, None]).long()
    zeros = torch.zeros(rows, response_len)
    rollout = Rollout(
        prompt_ids=torch.randint(0, vocab, (rows, prompt_len), generator=rng),
        prompt_mask=torch.ones(rows, prompt_len, dtype=torch.long),
        response_ids=torch.randint(0, vocab, (rows, response_len), generator=rng) * response_mask,
        response_mask=response_mask,
        response_attention_mask=response_mask,
        group_ids=torch.arange(rows),
        data_sources=["bench"] * rows,
        ground_truths=[None] * rows,
        extra_infos=[{}] * rows,
        finish_reasons=["length"] * rows,
        rollout_logprobs=zeros,
    )
    scored = Scored(rollout, token_scores=zeros, reward_extras=[{}] * rows, baseline_scores=None)
    old = ActorForward(-torch.rand(rows, response_len, generator=rng))
    return Advantaged(
        Annotated(scored, old_logprobs=old, ref_logprobs=None, values=None),
        token_rewards=zeros,
        loss_mask=response_mask,
        rollout_is_weights=None,
        advantages=torch.randn(rows, response_len, generator=rng),
        returns=zeros,
    )


def bench_update(argv: list[str]) -> int:
    args = parse_args(argv)
    setup_logging()  # after the arguments: it imports transformers, which `--help` does not need
    import torch

    from relm.config.rollout_correction import parse_rollout_correction
    from relm.config.schema import ActorConfig, RolloutCorrectionConfig
    from relm.config.translate import optim_spec
    from relm.learner.actor import update_actor
    from relm.learner.actor_objective import ActorObjective
    from relm.learner.microbatch_retry import MicroBatchSize
    from relm.learner.optim import build_optimizer
    from relm.learner.trainee import Batching, Trainee
    from relm.learner.vocab_chunks import compiled_pieces
    from relm.models.fused_layers import FusedLayers
    from relm.models.loading import load_causal_lm, resolve_model_dir
    from relm.models.precision import pick_precision
    from relm.trainer.components import pick_device, use_varlen_attention
    from relm.trainer.flops import peak_flops, training_flops

    if args.rows < 1 or args.response_len < 4 or args.prompt_len < 1:
        raise UserError("--rows, --prompt-len must be >= 1 and --response-len >= 4")
    device = pick_device(args.device, "--device")
    precision = pick_precision("auto", device)
    model = load_causal_lm(resolve_model_dir(args.model), dtype=precision.master, device=device)
    if not args.padded:
        use_varlen_attention(model, device)
    if args.grad_checkpointing:
        model.gradient_checkpointing_enable()
    cfg = ActorConfig(
        ppo_mini_batch_size=args.rows,
        use_dynamic_bsz=True,
        ppo_max_token_len_per_gpu=args.max_tokens,
        clip_ratio_low=0.2,
        clip_ratio_high=0.2,
        entropy_coeff=args.entropy_coeff,
    )
    objective = ActorObjective(
        loss_mode="vanilla", loss_agg_mode="token-mean", clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0,
        entropy_coeff=args.entropy_coeff, kl_loss=None, correction=parse_rollout_correction(RolloutCorrectionConfig()),
    )  # fmt: skip
    optimizer, scheduler = build_optimizer(model, optim_spec(cfg.optim), 10 * (args.repeats + 1))
    fused = FusedLayers(
        model, enabled=not args.no_compile and device.type == "cuda", functions=compiled_pieces()
    )
    batch = synthetic_batch(
        args.rows, args.prompt_len, args.response_len, model.config.get_text_config().vocab_size
    )
    seq_lens = batch.rollout.attention_mask.sum(-1).tolist()
    batching = Batching(
        rows_per_minibatch=args.rows,
        rows_per_microbatch=args.rows,
        rows_per_forward=args.rows,
        num_epochs=cfg.ppo_epochs,
        shuffle=cfg.shuffle,
        remove_padding=not args.padded,
    )
    actor = Trainee(
        "actor",
        model,
        optimizer,
        scheduler,
        cfg.grad_clip,
        batching,
        MicroBatchSize(args.rows, args.max_tokens),
    )

    def one_update() -> float:
        _sync(device)
        start = time.perf_counter()
        with precision.autocast(), fused.applied():
            update_actor(actor, batch, objective, temperature=1.0, device=device)
        _sync(device)
        return time.perf_counter() - start

    one_update()  # warm-up: compilation, allocator, optimizer states
    seconds = min(one_update() for _ in range(args.repeats))
    profile = profile_update(one_update, device) if args.profile else None
    peak = peak_flops(device)
    result = {
        "model": args.model,
        "rows": args.rows,
        "tokens": int(sum(seq_lens)),
        "update_s": seconds,
        "tokens_per_s": sum(seq_lens) / seconds,
        "mfu": training_flops(model, seq_lens) / seconds / peak if peak else None,
        "peak_gb": torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None,
        "packed": not args.padded,
        "compiled": fused.active,
        "grad_checkpointing": args.grad_checkpointing,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "entropy_coeff": args.entropy_coeff,
        "max_tokens": args.max_tokens,
        "profile": profile,
        "torch": torch.__version__,
    }
    mfu = f"{result['mfu']:.1%}" if result["mfu"] is not None else "n/a (no known peak)"
    print(
        f"relm bench update: {args.model}, {args.rows} responses, {result['tokens']} tokens "
        f"({args.prompt_len} prompt + {args.response_len // 4}..{args.response_len} response): "
        f"{seconds:.3f} s, {result['tokens_per_s']:,.0f} tokens/s, MFU {mfu}"
    )
    if profile:
        print(format_profile(profile))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


KERNEL_FAMILIES = (
    ("attention", ("flash", "fmha", "attention", "cudnn")),  # before products: flash names say "cutlass"
    ("matrix products", ("gemm", "cutlass", "nvjet", "xmma", "cublas", "splitk", "sm90_")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("compiled (triton)", ("triton",)),
    ("copies", ("memcpy", "memset", "copy_kernel")),
    ("collectives", ("nccl",)),
)
"""Kernel families by name fragment (lower case), first match wins; the rest is "other"."""


def profile_update(one_update, device: torch.device) -> dict:
    """GPU time of one more update by kernel family and its 15 costliest kernels (ms)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        wall = one_update()
    kernels: dict[str, float] = {}
    for event in prof.key_averages():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue  # operators' entries repeat their kernels' time; count the kernels alone
        device_us = getattr(event, "self_device_time_total", 0) or 0
        if device_us > 0:
            kernels[event.key] = kernels.get(event.key, 0.0) + device_us / 1000
    families: dict[str, float] = {}
    for name, ms in kernels.items():
        lowered = name.lower()
        family = next((f for f, frags in KERNEL_FAMILIES if any(x in lowered for x in frags)), "other")
        families[family] = families.get(family, 0.0) + ms
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:15]
    return {"wall_ms": wall * 1000, "families_ms": families, "top_kernels_ms": top}


def format_profile(profile: dict) -> str:
    gpu = sum(profile["families_ms"].values())
    lines = [f"profile: wall {profile['wall_ms']:.0f} ms, GPU busy {gpu:.0f} ms"]
    for family, ms in sorted(profile["families_ms"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  {family:18s} {ms:8.1f} ms")
    lines.append("  costliest kernels:")
    lines += [f"    {ms:8.1f} ms  {name[:110]}" for name, ms in profile["top_kernels_ms"]]
    return "\n".join(lines)


def _sync(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> int:
    return run_guarded(lambda: bench_update(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    raise SystemExit(main())
