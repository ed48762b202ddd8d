"""The fp32 log-softmax, entropy and sum of squared probabilities over chunks of vocabulary rows, shared by the
padded and packed forwards.

`relm.learner.forward` (padded rows) and `relm.learner.packing` (one packed row) both cut their logits
into chunks of token positions and call `vocab_chunk_stats` on each; it lives apart from both so that
neither has to import the other for it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from types import ModuleType

import torch
from torch.utils.checkpoint import checkpoint

from relm.memory.cpu_batching import CPU_CHUNK_VALUES

# Token positions whose fp32 vocabulary rows are materialized at once when no chunk is given:
# 2^26 fp32 values = 256 MiB per intermediate, whatever the vocabulary size.
DEFAULT_CHUNK_VALUES = 1 << 26


def chunk_values(device: torch.device) -> int:
    """fp32 values a chunk's intermediates hold when the caller gives no chunk: `CPU_CHUNK_VALUES` on CPU
    (why: its docstring), `DEFAULT_CHUNK_VALUES` elsewhere."""
    return CPU_CHUNK_VALUES if device.type == "cpu" else DEFAULT_CHUNK_VALUES


@dataclass(frozen=True)
class TokenStats:
    """Per response token statistics of a training-side forward, [N, R] fp32 each (finite but meaningless at
    padded positions); a statistic the caller did not ask for is None."""

    logprobs: torch.Tensor
    """[N, R], or [N, R, k] where the padded path was given k target ids a position (distillation's top-k)."""
    entropy: torch.Tensor | None
    sum_pi_squared: torch.Tensor | None
    """Sum over the vocabulary of the squared probabilities (`sum_pi_squared`), without gradient."""


def vocab_chunk_stats(
    logits: torch.Tensor,
    targets: torch.Tensor,
    scale: float,
    compute_entropy: bool,
    entropy_grad: bool,
    use_checkpoint: bool,
    compute_sum_pi_squared: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Logprob of `targets` (and entropy, and sum of squared probabilities) of one chunk of logits
    [..., c, V] -> [..., c] fp32 each (the logprob [..., c, k] for [..., c, k] targets; the other two stay
    per position); None for a statistic not asked for.

    With `use_checkpoint` only the model-dtype logits view is saved; the fp32 softmax is recomputed
    in backward. An entropy without gradient is computed apart, under no_grad, so the backward
    neither recomputes nor differentiates it; so is the sum of squared probabilities (always without
    gradient: the optimal token baselines read it as a constant).
    """
    with_entropy = compute_entropy and entropy_grad
    if use_checkpoint:
        logprob, entropy = checkpoint(
            _token_logprobs, logits, targets, scale, with_entropy, use_reentrant=False
        )
    else:
        logprob, entropy = _token_logprobs(logits, targets, scale, with_entropy)
    if compute_entropy and not entropy_grad:
        with torch.no_grad():
            entropy = _token_entropy(logits, scale)
    squared = None
    if compute_sum_pi_squared:
        with torch.no_grad():
            squared = _token_sum_pi_squared(logits, scale)
    return logprob, (entropy if compute_entropy else None), squared


def _token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, scale: float, compute_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, c, V] logits, [n, c] targets -> ([n, c] logprob, [n, c] entropy or zeros when not asked).

    `targets` may also be [n, c, k] (several ids a position: the sampled one and a teacher's top ids);
    the logprob is then [n, c, k].

    The trainer has `relm.models.fused_layers` swap in a compiled copy of this and `_token_entropy`
    on CUDA (`compiled_pieces`): eager, each line is a pass over [n, c, V] fp32 values; compiled, the
    chunk is read about once.
    """
    scaled = logits.float() / scale  # [n, c, V]
    log_norm = torch.logsumexp(scaled, dim=-1)  # [n, c]
    if targets.dim() == scaled.dim():  # [n, c, k]
        logprob = scaled.gather(-1, targets) - log_norm.unsqueeze(-1)
    else:
        logprob = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_norm  # [n, c]
    if not compute_entropy:
        return logprob, torch.zeros_like(logprob)
    return logprob, _entropy_of(scaled, log_norm)


def _token_entropy(logits: torch.Tensor, scale: float) -> torch.Tensor:
    """[n, c, V] logits -> [n, c] entropy of softmax(logits / scale)."""
    scaled = logits.float() / scale
    return _entropy_of(scaled, torch.logsumexp(scaled, dim=-1))


def _entropy_of(scaled: torch.Tensor, log_norm: torch.Tensor) -> torch.Tensor:
    # H = -sum p log p = log Z - sum p * z, which needs no second [n, c, V] log-prob tensor.
    probs = torch.softmax(scaled, dim=-1)  # [n, c, V]
    return log_norm - (probs * scaled).sum(dim=-1)  # [n, c]


def _token_sum_pi_squared(logits: torch.Tensor, scale: float) -> torch.Tensor:
    """[n, c, V] logits -> [n, c] fp32 sum over the vocabulary of softmax(logits / scale)^2.

    Eager even where the other pieces are compiled: it runs once a step, in the no-grad old-logprob forward of
    an optimal-token-baseline run. One fp32 copy of the chunk, shifted and doubled in place (beside the
    temporary each logsumexp makes), as the log-softmax of the same chunk holds."""
    scaled = logits.float() / scale  # [n, c, V], a new tensor: the in-place steps below leave `logits` alone
    return _sum_pi_squared_shifting(scaled)


def sum_pi_squared(logits: torch.Tensor) -> torch.Tensor:
    """[..., V] logits -> [...] sum over the vocabulary of softmax(logits)^2, in the logits' dtype.

    sum_v p_v^2 = sum_v exp(2 z_v) / (sum_v exp(z_v))^2 = exp(logsumexp(2 z) - 2 logsumexp(z)): two
    reductions and no normalised probability tensor (verl's `calculate_sum_pi_squared_from_logits`). It is 1
    for a one-hot distribution and 1/V for a uniform one; 1 - 2 pi(y) + sum pi^2 is the squared norm of the
    gradient of log pi(y) with respect to the logits, which the optimal token baselines accumulate along a
    response.
    """
    return _sum_pi_squared_shifting(logits.clone())


def _sum_pi_squared_shifting(logits: torch.Tensor) -> torch.Tensor:
    """`sum_pi_squared` of `logits`, which it overwrites. Shifted by the row's largest logit first: both
    log-sums are then O(log V), so their difference keeps the precision that subtracting two O(max logit)
    numbers would lose (fp32 logits in the hundreds)."""
    logits -= logits.amax(dim=-1, keepdim=True)
    log_norm = torch.logsumexp(logits, dim=-1)
    return torch.exp(torch.logsumexp(logits.mul_(2.0), dim=-1) - 2.0 * log_norm)


def compiled_pieces() -> list[tuple[ModuleType, str]]:
    """The (module, function name) pairs a training step's `FusedLayers` swaps for compiled copies.

    Passed by the caller (`FusedLayers(..., functions=compiled_pieces())`) rather than looked up by
    `relm.models.fused_layers` itself: models/ sits below learner/ and must not import it. Eager, each
    line of these is a pass over [positions, vocab] fp32 values (152k columns for Qwen); compiled,
    about one. `vocab_chunk_stats` calls them through this module's globals, so the swap reaches it.
    """
    module = sys.modules[__name__]
    return [(module, "_token_logprobs"), (module, "_token_entropy")]
