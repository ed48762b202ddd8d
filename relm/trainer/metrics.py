"""Step metrics under verl's names, computed from the finished `ExperienceBatch`."""

from __future__ import annotations

import torch

from relm.learner.batch import ExperienceBatch
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


def data_metrics(batch: ExperienceBatch) -> dict[str, float]:
    """Scores, rewards, advantages, returns, values and lengths, as verl's `compute_data_metrics`."""
    mask = batch.response_mask
    response_length = batch.response_tokens.sum(-1)  # a conversation's tool results count, as in verl
    prompt_length = batch.prompt_mask.sum(-1)
    metrics: dict[str, float] = {}
    if batch.token_scores is not None:
        metrics.update(_stats("critic/score", batch.token_scores.sum(-1)))
    if batch.token_rewards is not None:
        metrics.update(_stats("critic/rewards", batch.token_rewards.sum(-1)))
    metrics.update(_token_stats("critic/advantages", batch.advantages, mask))
    metrics.update(_token_stats("critic/returns", batch.returns, mask))
    metrics.update(_token_stats("critic/values", batch.values, mask))
    metrics.update(_stats("response_length", response_length))
    metrics["response_length/clip_ratio"] = sum(r == FINISH_LENGTH for r in batch.finish_reasons) / len(batch)
    metrics.update(_stats("prompt_length", prompt_length))
    return metrics


def mean_of_lists(metrics: dict[str, list[float]]) -> dict[str, float]:
    """Average each per-micro-batch list into one number for the step."""
    return {name: sum(values) / len(values) for name, values in metrics.items() if values}


def memory_metrics(device: torch.device) -> dict[str, float]:
    """Peak accelerator memory (GPU) or the process's peak resident memory (CPU)."""
    if device.type == "cuda":
        return {
            "perf/max_memory_allocated_gb": torch.cuda.max_memory_allocated(device) / 2**30,
            "perf/max_memory_reserved_gb": torch.cuda.max_memory_reserved(device) / 2**30,
        }
    import resource

    # ru_maxrss is in KiB on Linux.
    return {"perf/cpu_max_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
