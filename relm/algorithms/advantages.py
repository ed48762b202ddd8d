"""Advantage estimators: token rewards (and values) in, `(advantages, returns)` out.

Conventions shared by every estimator:
- tensors over response tokens are [N, R] with a 0/1 `response_mask`; both outputs are 0 outside it;
- positions outside the mask are skipped when going backwards over tokens: their reward and value
  are ignored and the running quantities pass through them unchanged (no discount either), so a
  multi-turn response with masked observation tokens behaves as if those tokens were not there;
- `group_ids` [N] (int) names the prompt each response answers; responses of one group are compared;
- estimators run under `torch.no_grad()`: advantages are targets, never part of the graph.

A new estimator is a function registered with `@register_adv_estimator("name")`. Its parameters
are picked by name from the inputs of `compute_advantages` (see `_INPUT_NAMES`); any other
parameter must have a default. What the run must build for it is read from the same signature
(`EstimatorNeeds`): a required `values` asks for a critic, a required `baseline_scores` for a greedy
response per prompt, a required `score_components` for the reward function's named numbers, a required
`sum_pi_squared` for the actor's old-logprob forward to compute it (and to run before the update); a
reference is declared with `needs_reference=True`. The loop asks
`estimator_needs(name)` and never compares estimator names.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from relm.algorithms.masked import masked_whiten

AdvEstimator = Callable[..., tuple[torch.Tensor, torch.Tensor]]

ADV_ESTIMATORS: dict[str, AdvEstimator] = {}
"""Estimator name (the value of `algorithm.adv_estimator`) -> function."""


@dataclass(frozen=True)
class EstimatorNeeds:
    """What the run builds for an estimator, beside the token rewards and the response mask."""

    critic: bool = False
    """A value model whose values V(s_t) the estimator reads (`values`); the trainer builds a critic
    only for these."""
    greedy_baseline: bool = False
    """The score of one greedy response per prompt (`baseline_scores`, ReMax)."""
    reference: bool = False
    """Reference-policy logprobs, whatever the KL settings say."""
    score_components: bool = False
    """Several numbers per response from the reward function (`score_components`, GDPO): the values of the
    keys `algorithm.gdpo_reward_keys` names."""
    sum_pi_squared: bool = False
    """Per token, the sum over the vocabulary of the old policy's squared probabilities (`sum_pi_squared`, the
    optimal token baselines), which the actor's old-logprob forward then computes beside the old logprobs
    (`old_logprobs`): that forward runs before the update whatever else the run would skip it for."""


ESTIMATOR_NEEDS: dict[str, EstimatorNeeds] = {}
"""Estimator name -> what it needs; filled by `register_adv_estimator` beside `ADV_ESTIMATORS`."""

_INPUT_NAMES = (
    "token_rewards",
    "response_mask",
    "values",
    "group_ids",
    "gamma",
    "lam",
    "norm_by_std",
    "baseline_scores",
    "score_components",
    "score_weights",
    "old_logprobs",
    "sum_pi_squared",
    "rollout_is_weights",
)


def register_adv_estimator(
    name: str, *, needs_reference: bool = False
) -> Callable[[AdvEstimator], AdvEstimator]:
    """Register an estimator under `name` for `compute_advantages` (a decorator).

    Its needs (`EstimatorNeeds`) are read from its required parameters; `needs_reference` adds a
    reference model (none of the built-in estimators reads one: the KL settings decide).

    Raises:
        ValueError: `name` is taken by another function, or a parameter without default is not
            one of the inputs `compute_advantages` can supply.
    """

    def decorator(fn: AdvEstimator) -> AdvEstimator:
        known = ADV_ESTIMATORS.get(name)
        if known is not None and known is not fn:
            raise ValueError(f"advantage estimator {name!r} is already registered ({known.__qualname__})")
        for param in inspect.signature(fn).parameters.values():
            if param.name not in _INPUT_NAMES and param.default is inspect.Parameter.empty:
                raise ValueError(
                    f"advantage estimator {name!r}: parameter {param.name!r} needs a default; "
                    f"inputs supplied by name are {', '.join(_INPUT_NAMES)}"
                )
        required = {
            param.name
            for param in inspect.signature(fn).parameters.values()
            if param.default is inspect.Parameter.empty
        }
        ADV_ESTIMATORS[name] = fn
        ESTIMATOR_NEEDS[name] = EstimatorNeeds(
            critic="values" in required,
            greedy_baseline="baseline_scores" in required,
            reference=needs_reference,
            score_components="score_components" in required,
            sum_pi_squared="sum_pi_squared" in required,
        )
        return fn

    return decorator


def estimator_needs(estimator: str) -> EstimatorNeeds:
    """What the run must build for `estimator` (validated names only; an unknown one raises KeyError)."""
    return ESTIMATOR_NEEDS[estimator]


def compute_advantages(
    estimator: str,
    *,
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    values: torch.Tensor | None = None,
    group_ids: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std_in_grpo: bool = True,
    baseline_scores: torch.Tensor | None = None,
    score_components: torch.Tensor | None = None,
    score_weights: torch.Tensor | None = None,
    sampled_mask: torch.Tensor | None = None,
    old_logprobs: torch.Tensor | None = None,
    sum_pi_squared: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the estimator named by `algorithm.adv_estimator`, passing it the inputs it declares.

    `response_mask` is the loss mask (the rollout correction's rejections taken out); `sampled_mask`, where
    it differs, the responses as sampled, whose rewards make the outcome estimators' scores (`outcome_scores`).
    `old_logprobs`, `sum_pi_squared` and `rollout_is_weights` ([N, R] each) are read by the optimal token
    baselines only (`relm.algorithms.optimal_token_baseline`).

    Returns:
        (advantages [N, R], returns [N, R]).

    Raises:
        ValueError: unknown estimator (the message lists the valid names), or an input the
            estimator needs is None (e.g. `values` for `gae`, `group_ids` for `grpo`).
    """
    fn = ADV_ESTIMATORS.get(estimator)
    if fn is None:
        raise ValueError(
            f"unknown advantage estimator {estimator!r}; valid names: {', '.join(sorted(ADV_ESTIMATORS))}"
        )
    available = {
        "token_rewards": token_rewards,
        "response_mask": response_mask,
        "values": values,
        "group_ids": group_ids,
        "gamma": gamma,
        "lam": lam,
        "norm_by_std": norm_adv_by_std_in_grpo,
        "baseline_scores": baseline_scores,
        "score_components": score_components,
        "score_weights": score_weights,
        "sampled_mask": sampled_mask,
        "old_logprobs": old_logprobs,
        "sum_pi_squared": sum_pi_squared,
        "rollout_is_weights": rollout_is_weights,
    }
    kwargs = {}
    for param in inspect.signature(fn).parameters.values():
        if param.name not in available:
            continue
        value = available[param.name]
        if value is None:
            if param.default is inspect.Parameter.empty:
                raise ValueError(f"advantage estimator {estimator!r} needs `{param.name}`, which is None")
            continue
        kwargs[param.name] = value
    return fn(**kwargs)


def _returns_to_go(token_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_{t+1} over valid tokens; [N, R], 0 outside the mask."""
    valid = response_mask != 0  # [N, R]
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])  # [N]
    for t in reversed(range(token_rewards.shape[1])):
        running = torch.where(valid[:, t], token_rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    return torch.where(valid, returns, 0.0)


def _per_group(group_ids: torch.Tensor, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Group index of each row ([N], 0..G-1) and each row's group size ([N], float)."""
    _, inverse = torch.unique(torch.as_tensor(group_ids, device=scores.device), return_inverse=True)
    counts = torch.zeros(int(inverse.max()) + 1, dtype=scores.dtype, device=scores.device)
    counts.index_add_(0, inverse, torch.ones_like(scores))
    return inverse, counts[inverse]


def _group_sum(values: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """Sum of `values` [N] over each row's group, broadcast back to [N]."""
    sums = torch.zeros(int(inverse.max()) + 1, dtype=values.dtype, device=values.device)
    return sums.index_add_(0, inverse, values)[inverse]


def outcome_scores(
    token_rewards: torch.Tensor, response_mask: torch.Tensor, sampled_mask: torch.Tensor | None
) -> torch.Tensor:
    """A response's score for the outcome estimators, [N]: the sum of its token rewards over the response as
    sampled (`sampled_mask`; `response_mask` where not given). verl sums a response's rewards whatever its
    mask, so a response the rollout correction rejects (its mask dropped, its reward kept) still counts in
    its group's statistics while its own advantage is masked out; padding never counts."""
    return torch.where(
        (response_mask if sampled_mask is None else sampled_mask) != 0, token_rewards, 0.0
    ).sum(dim=-1)


def _broadcast(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Per-response scalar [N] onto its valid tokens [N, R]."""
    return torch.where(response_mask != 0, scores.unsqueeze(-1), 0.0)


@register_adv_estimator("gae")
@torch.no_grad()
def compute_gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2016, arXiv:1506.02438).

    delta_t = r_t + gamma * V_{t+1} - V_t and A_t = delta_t + gamma * lam * A_{t+1}, with V after the
    last valid token taken as 0 (the episode ends with the response). Returns are A + V before
    whitening (the critic's target); the advantages are then whitened over the batch's valid tokens,
    as verl does, so the policy step size does not depend on the reward scale.
    """
    valid = response_mask != 0  # [N, R]
    advantages = torch.zeros_like(token_rewards)  # [N, R]
    running = torch.zeros_like(token_rewards[:, 0])  # [N] A_{t+1}
    next_value = torch.zeros_like(values[:, 0])  # [N] V_{t+1}, 0 past the end
    for t in reversed(range(token_rewards.shape[1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        running = torch.where(valid[:, t], delta + gamma * lam * running, running)
        next_value = torch.where(valid[:, t], values[:, t], next_value)
        advantages[:, t] = running
    returns = torch.where(valid, advantages + values, 0.0)
    return masked_whiten(advantages, response_mask), returns


@register_adv_estimator("grpo")
@torch.no_grad()
def compute_grpo_outcome(
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    sampled_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

    Score = sum of a response's token rewards; advantage = (score - group mean) / (group std + eps),
    std unbiased as `torch.std`. A group of one gets mean 0 and std 1 (its raw score), as verl does.
    `norm_by_std=False` drops the division: Dr. GRPO (Liu et al. 2025, arXiv:2503.20783) shows it
    biases updates towards too easy and too hard prompts. Returns equal the advantages.
    """
    scores = outcome_scores(token_rewards, response_mask, sampled_mask)  # [N]
    advantages = _broadcast(_group_normalised(scores, group_ids, norm_by_std, eps), response_mask)
    return advantages, advantages


def _group_normalised(
    scores: torch.Tensor, group_ids: torch.Tensor, norm_by_std: bool, eps: float
) -> torch.Tensor:
    """GRPO's per-response advantage [N]: score minus its group's mean, over the group's std + eps."""
    inverse, counts = _per_group(group_ids, scores)
    single = counts < 2
    mean = torch.where(single, 0.0, _group_sum(scores, inverse) / counts)  # [N]
    sq_dev = _group_sum((scores - mean) ** 2, inverse)
    std = torch.where(single, 1.0, (sq_dev / (counts - 1).clamp(min=1)).sqrt())  # [N]
    centred = scores - mean
    return centred / (std + eps) if norm_by_std else centred


@register_adv_estimator("rloo")
@torch.no_grad()
def compute_rloo(
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    sampled_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE Leave-One-Out (Ahmadian et al. 2024, arXiv:2402.14740; Kool et al. 2019).

    Baseline of response i = mean score of the other responses of its group, so the baseline is
    independent of the response it judges. A group of one keeps its raw score (baseline 0), as
    verl does. Returns equal the advantages.
    """
    scores = outcome_scores(token_rewards, response_mask, sampled_mask)  # [N]
    inverse, counts = _per_group(group_ids, scores)
    others_mean = (_group_sum(scores, inverse) - scores) / (counts - 1).clamp(min=1)
    advantages = _broadcast(scores - torch.where(counts < 2, 0.0, others_mean), response_mask)
    return advantages, advantages


@register_adv_estimator("reinforce_plus_plus")
@torch.no_grad()
def compute_reinforce_plus_plus(
    token_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): discounted return-to-go, whitened over the batch.

    The batch-wide (not per-group) normalisation is the paper's point: it avoids overfitting
    per-prompt baselines. Returns are the unwhitened returns-to-go.
    """
    returns = _returns_to_go(token_rewards, response_mask, gamma)  # [N, R]
    return masked_whiten(returns, response_mask), returns


@register_adv_estimator("reinforce_plus_plus_baseline")
@torch.no_grad()
def compute_reinforce_plus_plus_baseline(
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    sampled_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group-mean baseline (Hu 2025, arXiv:2501.03262).

    Score minus its group's mean (0 for a group of one), broadcast over the tokens, then whitened
    over all valid tokens of the batch (so longer responses weigh more in the statistics, as verl).
    Returns equal the advantages.
    """
    scores = outcome_scores(token_rewards, response_mask, sampled_mask)  # [N]
    inverse, counts = _per_group(group_ids, scores)
    mean = torch.where(counts < 2, 0.0, _group_sum(scores, inverse) / counts)
    advantages = masked_whiten(_broadcast(scores - mean, response_mask), response_mask)
    return advantages, advantages


@register_adv_estimator("remax")
@torch.no_grad()
def compute_remax(
    token_rewards: torch.Tensor, response_mask: torch.Tensor, baseline_scores: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023, arXiv:2310.10505): undiscounted return-to-go minus a greedy baseline.

    `baseline_scores` [N] is the reward of the greedy response to the same prompt, which the
    trainer generates separately. Returns are the returns-to-go.
    """
    returns = _returns_to_go(token_rewards, response_mask, 1.0)  # [N, R]
    advantages = returns - _broadcast(baseline_scores.to(returns.dtype), response_mask)
    return advantages, returns


@register_adv_estimator("opo")
@torch.no_grad()
def compute_opo(
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    sampled_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """On-Policy RL with Optimal reward baseline (Hao et al. 2025, arXiv:2505.23585).

    Baseline = length-weighted mean of the group's scores, sum_j |y_j| s_j / sum_j |y_j|, the
    variance-minimising baseline under the paper's assumption that gradient norm grows with length.
    A group of one gets baseline 0, as verl. Returns equal the advantages.
    """
    valid = response_mask != 0  # [N, R]
    scores = outcome_scores(token_rewards, response_mask, sampled_mask)  # [N]
    lengths = valid.to(scores.dtype).sum(dim=-1)  # [N]
    inverse, counts = _per_group(group_ids, scores)
    baseline = _group_sum(lengths * scores, inverse) / _group_sum(lengths, inverse).clamp(min=1)
    advantages = _broadcast(scores - torch.where(counts < 2, 0.0, baseline), response_mask)
    return advantages, advantages
