"""Reductions over the valid tokens of a padded [N, R] batch.

Every tensor over response tokens carries padding (right padding after EOS, and possibly masked
observation tokens inside multi-turn responses). Padded positions may hold anything, including
`-inf` logprobs, so these helpers select with `torch.where` instead of multiplying by the mask:
`inf * 0` is NaN and would leak padding into every statistic.
"""

from __future__ import annotations

import torch


def _valid(mask: torch.Tensor) -> torch.Tensor:
    """Mask as bool, whatever dtype (int64 from the batch, float from a caller) it arrives in."""
    return mask if mask.dtype == torch.bool else mask != 0


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `x` over positions where `mask` is nonzero.

    Args:
        x: [N, R] (any shape matching `mask`).
        mask: same shape, 0/1 (bool, int or float).
        dim: reduce along this dim; None reduces everything to a 0-dim tensor.
    """
    picked = torch.where(_valid(mask), x, 0.0)
    return picked.sum() if dim is None else picked.sum(dim=dim)


def _count(mask: torch.Tensor, dtype: torch.dtype, dim: int | None) -> torch.Tensor:
    valid = _valid(mask).to(dtype)
    return valid.sum() if dim is None else valid.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `x` over valid positions; 0 where there are none.

    An empty selection gives 0 rather than NaN because an all-padding row (a response the engine
    cut at length 0) must not turn a whole step's loss into NaN.
    """
    return masked_sum(x, mask, dim) / _count(mask, x.dtype, dim).clamp(min=1)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of `x` over all valid positions (a 0-dim tensor).

    With `unbiased`, Bessel's correction n / (n - 1) is applied as `torch.var` does. Fewer than two
    valid positions give 0 instead of raising or returning NaN: the centred values are all zero
    then, so whitening yields zeros (no learning signal) instead of poisoning the step.
    """
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        count = _count(mask, x.dtype, None)
        var = var * torch.where(count > 1, count / (count - 1).clamp(min=1), torch.ones_like(count))
    return var


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Normalise `x` to zero mean and unit variance over the valid positions.

    Statistics come from valid positions only, and the result is 0 at padded positions so callers
    can sum it without re-masking.

    Args:
        x: [N, R].
        mask: [N, R] 0/1.
        shift_mean: False adds the mean back (scale only), as verl's flag does.
        eps: added to the variance before the square root.

    Returns:
        [N, R] whitened values, 0 outside the mask.
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask, unbiased=True)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(_valid(mask), whitened, 0.0)
