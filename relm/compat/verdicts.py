"""Verdicts on what a stage produced: pure functions of tensors and metrics, each raising
`CheckFailed` with the one line a user reads in the compat table."""

from __future__ import annotations

import math

import torch
from torch import nn

from relm.rollout.base import FINISH_LENGTH, FINISH_STOP, GenerationOutput, logprob_tolerance


class CheckFailed(Exception):
    """A stage ran but what it produced is wrong (invalid ids, non-finite loss, ...)."""


def check_generation(
    gen: GenerationOutput, vocab_rows: int, pad_id: int, eos_ids: list[int], max_new_tokens: int
) -> None:
    """Raise `CheckFailed` unless the engine's output is well formed.

    Valid ids, a mask of ones then zeros, at least one token per row, not only pad tokens, finish
    reasons that match the tokens (stop ends on an eos id, length fills the width), finite
    non-positive logprobs.
    """
    ids, mask, logprobs = gen.response_ids, gen.response_mask.bool(), gen.logprobs
    live = ids[mask]
    if live.numel() and (live.min() < 0 or live.max() >= vocab_rows):
        raise CheckFailed(f"generated id {int(live.max())} outside the vocabulary of {vocab_rows}")
    lengths = mask.sum(dim=1)  # [N]
    if not torch.equal(mask, torch.arange(mask.shape[1])[None, :] < lengths[:, None]):
        raise CheckFailed("response mask is not ones followed by zeros")
    if bool((lengths == 0).any()):
        raise CheckFailed("a response has no tokens")
    if live.numel() and bool((live == pad_id).all()):
        raise CheckFailed(f"every generated token is the pad token {pad_id}")
    for row, reason in enumerate(gen.finish_reasons):
        last = int(ids[row, lengths[row] - 1])
        if reason == FINISH_STOP and last not in eos_ids:
            raise CheckFailed(f"row {row} finished `stop` on token {last}, not an eos id {eos_ids}")
        if reason == FINISH_LENGTH and int(lengths[row]) != max_new_tokens:
            raise CheckFailed(
                f"row {row} finished `length` after {int(lengths[row])} < {max_new_tokens} tokens"
            )
        if reason not in (FINISH_STOP, FINISH_LENGTH):
            raise CheckFailed(f"row {row} has finish reason {reason!r}")
    live_logprobs = logprobs[mask]
    if not bool(torch.isfinite(live_logprobs).all()) or bool((live_logprobs > 1e-6).any()):
        raise CheckFailed("rollout logprobs are not all finite and <= 0")


@torch.no_grad()
def attends_to_later_tokens(model: nn.Module, vocab: int, device: torch.device) -> str | None:
    """Why `model` is not a causal LM, when its output at a position changes with a later token, else None.

    Some encoders have a `*ForCausalLM` class that transformers lists as a causal LM (XLM and RoFormer
    with bidirectional attention unless told otherwise, BERT-generation, XLNet's permutation LM): a
    rollout and the trainer's forward over the longer sequence then see different contexts. Two forwards
    that differ only in the last token find them; a causal model gives equal logits before it.
    """
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(min(5, vocab - 1), vocab, (1, 12), generator=generator)
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1 - min(5, vocab - 1)) % (vocab - min(5, vocab - 1)) + min(5, vocab - 1)
    logits = [model(input_ids=row.to(device)).logits[0, :-1].float() for row in (ids, changed)]  # [11, V]
    gap = float((logits[0] - logits[1]).abs().max())
    if gap <= 1e-4 * max(1.0, float(logits[0].abs().max())):
        return None
    return (
        f"is not causal: its logits at earlier positions change with the last token (by {gap:.3g}; "
        "bidirectional attention, an encoder); relm trains causal LMs"
    )


REQUIRED_UPDATE_METRICS = ("actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm")


def check_update_metrics(metrics: dict[str, float], step: int) -> None:
    """Raise `CheckFailed` unless the step updated both models with finite losses and gradients."""
    missing = [key for key in REQUIRED_UPDATE_METRICS if key not in metrics]
    if missing:
        raise CheckFailed(f"step {step} reported no {', '.join(missing)}: an update did not run")
    for key, value in metrics.items():
        if ("loss" in key or "grad_norm" in key) and not math.isfinite(value):
            raise CheckFailed(f"step {step}: {key} = {value}")
    if metrics.get("training/skipped_updates", 0.0):
        raise CheckFailed(
            f"step {step}: {metrics['training/skipped_updates']:g} update(s) skipped (non-finite grads)"
        )


def check_engine_agreement(metrics: dict[str, float], step: int, dtype: torch.dtype, engine: str) -> None:
    """Raise `CheckFailed` when the run's engine and the trainer disagree on the sampled tokens' logprobs
    (`rollout/logprob_diff_max|mean`) by more than the bf16 bounds of `logprob_tolerance`, whatever
    `dtype`: a run would train on another model's samples than it believes.

    Looser than the rollout stage's fp32 bounds because the run's engine has kernels of its own (the
    native engine's grouped attention and fused projections), whose last-bit differences can flip an MoE
    router's choice for a token: tiny/phimoe's update stage measured 0.078 max, 0.0014 mean in fp32.
    """
    if "rollout/logprob_diff_max" not in metrics:
        return
    worst, mean = metrics["rollout/logprob_diff_max"], metrics.get("rollout/logprob_diff_mean", 0.0)
    max_tolerance, mean_tolerance = logprob_tolerance(max(dtype, torch.bfloat16, key=_looser))
    if not (worst <= max_tolerance and mean <= mean_tolerance):
        raise CheckFailed(
            f"step {step}: the {engine} engine's and the trainer's logprobs differ by {worst:.3g} max, "
            f"{mean:.3g} mean (allowed {max_tolerance:g}, {mean_tolerance:g})"
        )


def _looser(dtype: torch.dtype) -> float:
    return logprob_tolerance(dtype)[0]


@torch.no_grad()
def sample_weights(model: nn.Module, per_tensor: int = 1024) -> list[torch.Tensor]:
    """Up to `per_tensor` evenly spaced elements of every parameter an update moves, copied (cheap at any
    size). Under LoRA those are the adapters' B matrices: the base is frozen, and A gets no gradient while
    B is still at its initial zero (the first step)."""
    samples = []
    lora = any(".lora_" in name for name, _ in model.named_parameters())
    for name, param in model.named_parameters():
        if not param.requires_grad or (lora and ".lora_A." in name):
            continue
        flat = param.detach().reshape(-1)
        count = min(flat.numel(), per_tensor)
        # Integer arithmetic: a float32 linspace rounds indices past 2^24 and can step off the end.
        index = torch.arange(count, device=flat.device) * (flat.numel() - 1) // max(count - 1, 1)
        samples.append(flat[index].clone())
    return samples


def changed_fraction(before: list[torch.Tensor], after: list[torch.Tensor]) -> float:
    """Median over tensors of the share of sampled elements whose value changed.

    The median, because some tensors legitimately keep most values (embedding rows of tokens not
    in the batch, experts no token was routed to), while an optimizer step that moves weights at
    all moves most elements of most tensors.
    """
    shares = torch.stack([(b != a).float().mean() for b, a in zip(before, after, strict=True)])
    return float(shares.quantile(0.5))  # the interpolated median (torch.median takes the lower one)
