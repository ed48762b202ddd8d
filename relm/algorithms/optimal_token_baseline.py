"""verl 0.9.1's optimal token baseline estimators: a baseline per token position, weighted by path variance.

Registered under verl's names (`algorithm.adv_estimator`):

- `optimal_token_baseline`: for each prompt's group and each response column t,

      G_t = sum_{s >= t} r_s                          (undiscounted return-to-go over the valid tokens)
      w_j = 1 - 2 pi(y_j) + sum_v pi(v)^2             (the squared norm of d log pi(y_j) / d logits)
      W_t = sum_{j <= t, valid} w_j                   (path-variance proxy accumulated up to t)
      B_t = sum_i G_t,i W_t,i / (sum_i W_t,i + eps)   (over the group's responses valid at t)
      A_t = G_t - B_t

  B_t is the baseline that minimises the variance of the policy gradient when the squared norm of a
  trajectory's score function is approximated by W_t: responses whose path has been uncertain so far
  weigh more. A group of one keeps its return (baseline 0). With `handle_zero_tail` (verl's default) the
  one longest response of a group gets baseline 0 past the second longest's length, where it would be
  its own baseline (and its advantage 0).
- `tir_optimal_token_baseline`: the same over each response's valid tokens counted from its first one
  (the k-th valid token of one response is compared with the k-th of the others), so tool results
  between turns (masked) do not misalign the responses of a multi-turn group; empty responses are left
  out of their group.

With the rollout correction's importance weights (`algorithm.rollout_correction.rollout_is`) each w_j is
multiplied by rho_j^2, as verl does. `pi` is the old policy, at the rollout temperature: the actor's
old-logprob forward computes sum_v pi(v)^2 (`relm.learner.vocab_chunks.sum_pi_squared`) only for these
estimators (`EstimatorNeeds.sum_pi_squared`).
"""

from __future__ import annotations

import torch

from relm.algorithms.advantages import register_adv_estimator


def _returns_to_go(token_rewards: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[N, R] sum of the valid rewards from t on (a masked column inside a response carries the later sum, as
    verl's; relm's outputs zero it afterwards)."""
    return torch.where(valid, token_rewards, 0.0).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])


def _path_weights(
    valid: torch.Tensor,
    old_logprobs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None,
) -> torch.Tensor:
    """[N, R] W_t: the cumulative sum over valid tokens of 1 - 2 pi(y_j) + sum pi^2 (times rho_j^2). Whatever
    sits at padded positions (verl multiplies by the mask, so a NaN there would spread) is never read."""
    per_token = 1 - 2 * torch.exp(old_logprobs) + sum_pi_squared  # [N, R]
    if rollout_is_weights is not None:
        per_token = per_token * rollout_is_weights**2
    return torch.where(valid, per_token, 0.0).cumsum(dim=-1)


def _group_baseline(
    returns: torch.Tensor, weights: torch.Tensor, inverse: torch.Tensor, counts: torch.Tensor, epsilon: float
) -> torch.Tensor:
    """[n, L] per-column weighted mean of the group's returns (`weights` 0 where a row is not valid); 0 for a
    group of one. `inverse` [n] the group of each row, `counts` [n] its size."""
    num_groups = int(inverse.max()) + 1
    numerator = returns.new_zeros(num_groups, returns.shape[1]).index_add_(0, inverse, returns * weights)
    denominator = weights.new_zeros(num_groups, weights.shape[1]).index_add_(0, inverse, weights) + epsilon
    return torch.where(counts[:, None] < 2, 0.0, (numerator / denominator)[inverse])


def _zero_tails(baseline: torch.Tensor, lengths: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """`baseline` [n, L] with 0 from column `second longest length` on, in the row of a group's single longest
    response (groups of two or more; a tie for the longest changes nothing)."""
    num_groups = int(inverse.max()) + 1
    longest = lengths.new_zeros(num_groups).scatter_reduce(0, inverse, lengths, "amax", include_self=False)
    at_longest = lengths == longest[inverse]  # [n]
    num_longest = torch.zeros(num_groups, dtype=torch.long, device=lengths.device)
    num_longest.index_add_(0, inverse, at_longest.long())
    others = torch.where(at_longest, -1, lengths)
    second = lengths.new_full((num_groups,), -1).scatter_reduce(0, inverse, others, "amax", include_self=True)
    tail_row = at_longest & (num_longest[inverse] == 1) & (second[inverse] >= 0)  # [n]
    columns = torch.arange(baseline.shape[1], device=baseline.device)
    in_tail = tail_row[:, None] & (columns[None, :] >= second[inverse][:, None])  # [n, L]
    return torch.where(in_tail, 0.0, baseline)


def _groups(group_ids: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Group index of each row ([n], 0..G-1) and its group's size ([n])."""
    _, inverse, counts = torch.unique(
        torch.as_tensor(group_ids, device=device), return_inverse=True, return_counts=True
    )
    return inverse, counts[inverse]


@register_adv_estimator("optimal_token_baseline")
@torch.no_grad()
def compute_optimal_token_baseline(
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    old_logprobs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimal token baseline, per response column (module docstring); verl 0.9.1's
    `compute_optimal_token_baseline_advantage`.

    Args:
        token_rewards, response_mask, group_ids: as every estimator's ([N, R], [N, R] loss mask, [N]).
        old_logprobs: [N, R] the old policy's logprobs of the sampled tokens.
        sum_pi_squared: [N, R] sum over the vocabulary of the old policy's squared probabilities.
        rollout_is_weights: [N, R] the rollout correction's importance weights, or None.

    Returns:
        (advantages [N, R], returns-to-go [N, R]), both 0 outside the mask (verl's returns keep the later
        rewards' sum at a masked position inside a response, which nothing reads).
    """
    valid = response_mask != 0
    returns = _returns_to_go(token_rewards, valid)  # [N, R]
    weights = torch.where(valid, _path_weights(valid, old_logprobs, sum_pi_squared, rollout_is_weights), 0.0)
    inverse, counts = _groups(group_ids, returns.device)
    baseline = _group_baseline(returns, weights, inverse, counts, epsilon)  # [N, R]
    if handle_zero_tail:
        baseline = _zero_tails(baseline, valid.sum(dim=-1), inverse)
    return torch.where(valid, returns - baseline, 0.0), torch.where(valid, returns, 0.0)


@register_adv_estimator("tir_optimal_token_baseline")
@torch.no_grad()
def compute_tir_optimal_token_baseline(
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    old_logprobs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimal token baseline over each response's valid tokens in order (module docstring); verl 0.9.1's
    `compute_multi_turn_optimal_token_baseline_advantage`. Arguments and returns as
    `compute_optimal_token_baseline`."""
    valid = response_mask != 0
    returns = _returns_to_go(token_rewards, valid)  # [N, R]
    weights = _path_weights(valid, old_logprobs, sum_pi_squared, rollout_is_weights)
    lengths = valid.sum(dim=-1)  # [N]
    advantages = torch.zeros_like(returns)
    kept = torch.nonzero(lengths > 0).squeeze(1)  # [n] empty responses belong to no group
    if len(kept) == 0:
        return advantages, advantages.clone()
    # The k-th valid token of each kept response at column k of a compact [n, L] layout.
    rows, cols = torch.nonzero(valid[kept], as_tuple=True)
    rank = valid[kept].long().cumsum(dim=-1)[rows, cols] - 1
    compact_returns = returns.new_zeros(len(kept), int(lengths.max()))
    compact_weights = torch.zeros_like(compact_returns)
    compact_returns[rows, rank] = returns[kept[rows], cols]
    compact_weights[rows, rank] = weights[kept[rows], cols]
    inverse, counts = _groups(torch.as_tensor(group_ids, device=returns.device)[kept], returns.device)
    baseline = _group_baseline(compact_returns, compact_weights, inverse, counts, epsilon)  # [n, L]
    if handle_zero_tail:
        baseline = _zero_tails(baseline, lengths[kept], inverse)
    advantages[kept[rows], cols] = (compact_returns - baseline)[rows, rank]
    return advantages, torch.where(valid, returns, 0.0)
