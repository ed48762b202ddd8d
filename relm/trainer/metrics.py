"""Step metrics under verl's names, computed from the finished `Advantaged` record."""

from __future__ import annotations

import torch

from relm.learner.batch import Advantaged
from relm.memory.choices import MemoryChoices
from relm.memory.host import peak_rss_bytes
from relm.rollout.base import FINISH_LENGTH


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    if values.numel() == 0:
        return {}
    return {
        f"{prefix}/mean": values.mean().item(),
        f"{prefix}/max": values.max().item(),
        f"{prefix}/min": values.min().item(),
    }


def _token_stats(prefix: str, values: torch.Tensor | None, mask: torch.Tensor) -> dict[str, float]:
    if values is None:
        return {}
    return _stats(prefix, values[mask.bool()])


def data_metrics(batch: Advantaged) -> dict[str, float]:
    """Scores, rewards, advantages, returns, values and lengths, as verl's `compute_data_metrics`."""
    rollout = batch.rollout
    mask = batch.loss_mask
    response_length = rollout.response_attention_mask.sum(
        -1
    )  # a conversation's tool results count, as in verl
    prompt_length = rollout.prompt_mask.sum(-1)
    metrics: dict[str, float] = {}
    metrics.update(_stats("critic/score", batch.annotated.scored.token_scores.sum(-1)))
    metrics.update(_stats("critic/rewards", batch.token_rewards.sum(-1)))
    metrics.update(_token_stats("critic/advantages", batch.advantages, mask))
    metrics.update(_token_stats("critic/returns", batch.returns, mask))
    metrics.update(_token_stats("critic/values", batch.annotated.values, mask))
    metrics.update(_stats("response_length", response_length))
    metrics["response_length/clip_ratio"] = sum(r == FINISH_LENGTH for r in rollout.finish_reasons) / len(
        batch
    )
    metrics.update(_stats("prompt_length", prompt_length))
    return metrics


def mean_of_lists(metrics: dict[str, list[float]]) -> dict[str, float]:
    """Average each per-micro-batch list into one number for the step."""
    return {name: sum(values) / len(values) for name, values in metrics.items() if values}


def memory_metrics(device: torch.device) -> dict[str, float]:
    """Peak accelerator memory (GPU) and the process's peak resident host memory (GiB)."""
    host = peak_rss_bytes() / 2**30
    if device.type == "cuda":
        return {
            "perf/max_memory_allocated_gb": torch.cuda.max_memory_allocated(device) / 2**30,
            "perf/max_memory_reserved_gb": torch.cuda.max_memory_reserved(device) / 2**30,
            "perf/max_host_memory_gb": host,
        }
    return {"perf/cpu_max_rss_gb": host, "perf/max_host_memory_gb": host}


def plan_metrics(memory: MemoryChoices, largest_tokens: int = 0) -> dict[str, float]:
    """The memory plan's predicted peaks (GiB), to read beside the measured ones of `memory_metrics`.

    `largest_tokens`: tokens of the actor update's largest micro-batch this step; the GPU prediction is read
    there, since a step's batch may fill less than the micro-batch budget the plan allows (0: at the budget).
    torch's peak counts the whole process, so the prediction is the larger of that and the start-up's.
    """
    metrics = {}
    if memory.plan is not None:
        plan = memory.plan
        peak = plan.gpu_peak_at(largest_tokens or plan.max_tokens_per_microbatch)
        metrics["perf/plan_gpu_gb"] = peak / 2**30
    if memory.host_peak_bytes is not None:
        metrics["perf/plan_host_gb"] = memory.host_peak_bytes / 2**30
    return metrics


def memory_report(metrics: dict[str, float]) -> str | None:
    """The line printed after the first step: each predicted peak beside the measured one (GiB)."""
    pairs = [
        ("GPU", "perf/max_memory_allocated_gb", "perf/plan_gpu_gb", " (start-up or the actor's update)"),
        ("host", "perf/max_host_memory_gb", "perf/plan_host_gb", ""),
    ]
    parts = [
        f"{name} peak {metrics[measured]:.2f} GiB measured, {metrics[planned]:.2f} GiB planned{what} "
        f"({(metrics[measured] - metrics[planned]) / metrics[planned]:+.0%})"
        for name, measured, planned, what in pairs
        if measured in metrics and planned in metrics and metrics[planned] > 0
    ]
    return f"memory after the first step: {'; '.join(parts)}" if parts else None


def rollout_gap_report(metrics: dict[str, float], quantization: str | None) -> str | None:
    """The line printed after the first step when the engine generates with quantized weights: how far
    its logprobs of the sampled tokens are from the trainer's (the gap quantization adds, and what
    the update's importance ratios start from)."""
    if quantization is None:
        return None
    if "rollout/logprob_diff_max" not in metrics:
        return f"{quantization} rollout: logprob gap to the trainer not measured at the first step (no old-logprob forward)"
    return (
        f"{quantization} rollout: logprob gap to the trainer at the first step: max "
        f"{metrics['rollout/logprob_diff_max']:.3g}, mean {metrics['rollout/logprob_diff_mean']:.3g} "
        "(rollout/logprob_diff_max, rollout/logprob_diff_mean)"
    )
