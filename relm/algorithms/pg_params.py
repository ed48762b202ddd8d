"""verl 0.9.1's policy losses that read settings of their own (`relm.algorithms.losses.LossParams`).

Registered under verl's names (`actor_rollout_ref.actor.policy_loss.loss_mode`):

- `sapo`: Soft Adaptive Policy Optimization (arXiv:2511.20347): a sigmoid gate of the ratio replaces the
  clip, so far off-policy tokens fade out smoothly instead of dropping at a hard edge; temperatures
  `actor.tau_pos` / `actor.tau_neg`;
- `dro`: Direct Reward Optimization: -A log pi plus a quadratic penalty on the log-ratio, weight
  `policy_loss.dro_beta`;
- `clip_cov`, `kl_cov` (Cui et al. 2025, arXiv:2505.22617, "The Entropy Mechanism of Reinforcement Learning
  for Reasoning Language Models"): the tokens whose advantage and logprob covary most drive the entropy
  collapse; Clip-Cov takes a few of them out of the gradient, KL-Cov puts a KL penalty on them.

Padded positions may hold -inf logprobs in relm; each loss zeroes them before any arithmetic.
"""

from __future__ import annotations

import torch

from relm.algorithms.losses import AggScale, LossParams, _weighted, agg_loss, register_policy_loss
from relm.algorithms.masked import masked_mean
from relm.algorithms.pg_variants import Metrics, _valid_logprobs


def _zero(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=like.dtype, device=like.device)


@register_policy_loss("sapo")
def sapo_loss(
    *,
    old_logprobs: torch.Tensor,
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    agg_scale: AggScale | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    params: LossParams | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """SAPO: per token -A * f(ratio) with the gate f(r) = sigmoid(tau (r - 1)) * 4 / tau.

    f(1) = 2 / tau and f'(1) = 1, so near the old policy the gradient is PPO's; as the ratio leaves 1 the
    gradient decays smoothly rather than being cut at a clip edge. tau = `tau_pos` where A > 0, `tau_neg`
    elsewhere (a larger tau_neg damps negative updates faster). Always aggregated `seq-mean-token-mean`,
    whatever `loss_agg_mode` says, as in verl. Clip keys unused; `pg_clipfrac` and `pg_clipfrac_lower` are 0.
    """
    p = LossParams() if params is None else params
    logprobs, old_logprobs = _valid_logprobs(logprobs, old_logprobs, response_mask)
    log_ratio = (logprobs - old_logprobs).clamp(min=-20.0, max=20.0)
    ratio = log_ratio.exp()
    tau = torch.where(advantages > 0, advantages.new_tensor(p.tau_pos), advantages.new_tensor(p.tau_neg))
    gates = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    losses = _weighted(-gates * advantages, rollout_is_weights)
    loss = agg_loss(losses, response_mask, "seq-mean-token-mean", agg_scale)
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": _zero(loss),
            "ppo_kl": masked_mean(-log_ratio, response_mask),
            "pg_clipfrac_lower": _zero(loss),
        }
    return loss, metrics


@register_policy_loss("dro")
def dro_loss(
    *,
    old_logprobs: torch.Tensor,
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    agg_scale: AggScale | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    params: LossParams | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """DRO: per token -(A log pi - beta / 2 * (log pi - log pi_old)^2), beta = `dro_beta`.

    The quadratic term is a trust region in log space: no ratio, no clip (clip keys unused). Metric `ppo_kl`.

    Raises:
        ValueError: `dro_beta` unset or not positive (the config check says so first, naming the key).
    """
    beta = LossParams().dro_beta if params is None else params.dro_beta
    if beta is None or beta <= 0:
        raise ValueError(f"the dro policy loss needs policy_loss.dro_beta > 0, got {beta}")
    logprobs, old_logprobs = _valid_logprobs(logprobs, old_logprobs, response_mask)
    log_ratio = logprobs - old_logprobs
    losses = _weighted(-(logprobs * advantages - 0.5 * beta * log_ratio.square()), rollout_is_weights)
    loss = agg_loss(losses, response_mask, loss_agg_mode, agg_scale)
    with torch.no_grad():
        metrics = {"ppo_kl": masked_mean(-log_ratio, response_mask)}
    return loss, metrics


@register_policy_loss("clip_cov")
def clip_cov_loss(
    *,
    old_logprobs: torch.Tensor,
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    agg_scale: AggScale | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    params: LossParams | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """Clip-Cov: PPO's clipped surrogate (no dual clip) with a few high-covariance tokens taken out.

    Per valid token, cov = (A - mean A) (log pi - mean log pi) over the batch's valid tokens. Among the tokens
    PPO's clip left alone with `clip_cov_lb` < cov < `clip_cov_ub`, max(1, int(`clip_cov_ratio` * valid
    tokens)) drawn at random lose their gradient (their loss is multiplied by 0). The draw uses torch's
    global CPU generator, as verl's does, so a seeded run is repeatable. No log-ratio clamp, as in verl.
    Metrics: `pg_clipfrac` = share of valid tokens taken out; `ppo_kl`.
    """
    p = LossParams() if params is None else params
    if p.clip_cov_ratio <= 0:
        raise ValueError(
            f"the clip_cov policy loss needs policy_loss.clip_cov_ratio > 0, got {p.clip_cov_ratio}"
        )
    logprobs, old_logprobs = _valid_logprobs(logprobs, old_logprobs, response_mask)
    valid = response_mask != 0
    log_ratio = logprobs - old_logprobs
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    with torch.no_grad():
        cov = (advantages - masked_mean(advantages, valid)) * (logprobs - masked_mean(logprobs, valid))
        candidates = valid & ~(clipped > unclipped) & (cov > p.clip_cov_lb) & (cov < p.clip_cov_ub)
        positions = candidates.nonzero()  # [M, 2], row-major as verl's
        keep = torch.ones_like(advantages)
        if len(positions) > 0:  # verl draws only then: the generator's state stays in step with it
            budget = max(int(p.clip_cov_ratio * int(valid.sum())), 1)
            drawn = positions[torch.randperm(len(positions))[:budget].to(positions.device)]
            keep[drawn[:, 0], drawn[:, 1]] = 0.0
    losses = _weighted(torch.maximum(unclipped, clipped) * keep, rollout_is_weights)
    loss = agg_loss(losses, response_mask, loss_agg_mode, agg_scale)
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((keep == 0).to(loss.dtype), response_mask),
            "ppo_kl": masked_mean(-log_ratio, response_mask),
        }
    return loss, metrics


@register_policy_loss("kl_cov")
def kl_cov_loss(
    *,
    old_logprobs: torch.Tensor,
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    agg_scale: AggScale | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    params: LossParams | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """KL-Cov: the unclipped surrogate -A ratio, plus `ppo_kl_coef` * |log ratio| on the top-covariance tokens.

    cov as in `clip_cov`; the max(1, int(`kl_cov_ratio` * valid tokens)) valid tokens with the largest cov get
    the penalty, which pulls them back toward the old policy instead of cutting their gradient. No clip
    (clip keys unused), no log-ratio clamp, as in verl. Metric `ppo_kl` = mean |log ratio| (verl's choice).
    """
    p = LossParams() if params is None else params
    if p.kl_cov_ratio <= 0:
        raise ValueError(f"the kl_cov policy loss needs policy_loss.kl_cov_ratio > 0, got {p.kl_cov_ratio}")
    logprobs, old_logprobs = _valid_logprobs(logprobs, old_logprobs, response_mask)
    valid = response_mask != 0
    log_ratio = logprobs - old_logprobs
    plain = -advantages * log_ratio.exp()
    penalised = plain + p.ppo_kl_coef * log_ratio.abs()
    with torch.no_grad():
        flat_valid = valid.reshape(-1)
        positions = flat_valid.nonzero().squeeze(-1)  # valid tokens, row-major
        chosen = torch.zeros_like(flat_valid)
        if positions.numel() > 0:
            adv = advantages.reshape(-1)[positions]
            logp = logprobs.reshape(-1)[positions]
            cov = (adv - adv.mean()) * (logp - logp.mean())
            count = max(1, int(positions.numel() * p.kl_cov_ratio))
            chosen[positions[torch.topk(cov, count).indices]] = True
    losses = _weighted(torch.where(chosen.view_as(valid), penalised, plain), rollout_is_weights)
    loss = agg_loss(losses, response_mask, loss_agg_mode, agg_scale)
    with torch.no_grad():
        metrics = {"ppo_kl": masked_mean(log_ratio.abs(), response_mask)}
    return loss, metrics
