"""verl 0.9.1's remaining outcome estimators over groups: vectorised aliases, GPG and Pass@k.

Registered under verl's names (`algorithm.adv_estimator`), so a verl script that names them runs:

- `grpo_vectorized`: verl's batched GRPO, the same estimator as `grpo` (relm's is batched already);
  verl computes it in float32, so the two agree to float32 precision.
- `rloo_vectorized`: verl's batched RLOO, which differs from `rloo` in one case: a group of one gets
  advantage 0 (`rloo` keeps its raw score).
- `gpg`: Group Policy Gradient (Chu et al. 2025, arXiv:2504.02546).
- `grpo_passk`: Pass@k training (Chen et al. 2025, arXiv:2503.19595).
- `gdpo`: GDPO (arXiv:2601.05242), GRPO on each of several rewards apart, then summed.
"""

from __future__ import annotations

import torch

from relm.algorithms.advantages import (
    _broadcast,
    _group_normalised,
    _group_sum,
    _per_group,
    compute_grpo_outcome,
    outcome_scores,
    register_adv_estimator,
)
from relm.algorithms.masked import masked_whiten

register_adv_estimator("grpo_vectorized")(compute_grpo_outcome)


@register_adv_estimator("rloo_vectorized")
@torch.no_grad()
def compute_rloo_vectorized(
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    sampled_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (score minus the mean of the group's other scores); a group of one gets 0, as verl's vectorised one."""
    scores = outcome_scores(token_rewards, response_mask, sampled_mask)
    inverse, counts = _per_group(group_ids, scores)
    others_mean = (_group_sum(scores, inverse) - scores) / (counts - 1).clamp(min=1)
    advantages = _broadcast(torch.where(counts < 2, 0.0, scores - others_mean), response_mask)
    return advantages, advantages


@register_adv_estimator("gpg")
@torch.no_grad()
def compute_gpg_outcome(
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    f_norm: float = 1.0,
    sampled_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG: advantage = alpha * (score - group mean) / f_norm, no division by the group's std.

    alpha = N / (number of responses with a non-zero score) rescales the batch so that groups whose
    responses all scored 0 (no signal) do not dilute the gradient of the others. A group of one has
    mean 0, as in verl. Returns equal the advantages.
    """
    scores = outcome_scores(token_rewards, response_mask, sampled_mask)
    inverse, counts = _per_group(group_ids, scores)
    alpha = scores.shape[0] / torch.count_nonzero(scores).clamp(min=1)
    mean = torch.where(counts < 2, 0.0, _group_sum(scores, inverse) / counts)
    advantages = _broadcast(alpha * (scores - mean) / f_norm, response_mask)
    return advantages, advantages


@register_adv_estimator("grpo_passk")
@torch.no_grad()
def compute_grpo_passk_outcome(
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    sampled_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k: only the best response of each group gets an advantage, best score minus second best.

    With `norm_by_std` (verl's `norm_adv_by_std_in_grpo`) it is divided by the group's (unbiased) std
    + eps. Every other response gets 0; with a tie at the top the advantage is 0 anyway.

    Raises:
        ValueError: a group has a single response (no second best), as verl raises.
    """
    scores = outcome_scores(token_rewards, response_mask, sampled_mask)
    inverse, counts = _per_group(group_ids, scores)
    if bool((counts < 2).any()):
        raise ValueError(
            "grpo_passk needs at least 2 responses per prompt (actor_rollout_ref.rollout.n >= 2)"
        )
    advantages = torch.zeros_like(scores)
    for group in range(int(inverse.max()) + 1):
        rows = torch.nonzero(inverse == group).squeeze(1)
        group_scores = scores[rows]
        top, top_index = torch.topk(group_scores, 2)
        gap = top[0] - top[1]
        if norm_by_std:
            gap = gap / (group_scores.std() + eps)
        advantages[rows[top_index[0]]] = gap
    advantages = _broadcast(advantages, response_mask)
    return advantages, advantages


@register_adv_estimator("gdpo")
@torch.no_grad()
def compute_gdpo_outcome(
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    score_components: torch.Tensor,
    score_weights: torch.Tensor | None = None,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO, Group reward-Decoupled normalization Policy Optimization (arXiv:2601.05242).

    Summing several rewards (format, accuracy, ...) before GRPO's group normalisation lets the one with the
    largest spread drown the others; GDPO normalises each within the group first (`compute_grpo_outcome`
    on each row of `score_components` [K, N], std division per `norm_by_std`), sums them with
    `score_weights` [K] (default all 1), then whitens the sum over the batch's valid tokens. The token
    rewards are not read: the components are the rewards (verl reads them from the reward function's
    dict, as relm does through `algorithm.gdpo_reward_keys`). Returns equal the advantages.
    """
    weights = torch.ones(len(score_components)) if score_weights is None else score_weights
    # A response's components count in its group's statistics whatever its mask (verl sums them unmasked),
    # so a response the rollout correction rejects still shapes its group's baseline.
    total = torch.zeros(response_mask.shape, dtype=score_components.dtype, device=response_mask.device)
    for weight, scores in zip(weights.tolist(), score_components, strict=True):
        total = total + weight * _group_normalised(scores, group_ids, norm_by_std, eps).unsqueeze(-1)
    advantages = masked_whiten(total, response_mask) * response_mask
    return advantages, advantages
