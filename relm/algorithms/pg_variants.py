"""verl 0.9.1's policy losses beyond PPO and GSPO that need no setting of their own.

Registered under verl's names (`actor_rollout_ref.actor.policy_loss.loss_mode`); each reads the clip
settings PPO reads (`clip_ratio_low` / `clip_ratio_high` / `clip_ratio_c`), so no new key is needed:

- `gpg`: Group Policy Gradient (Chu et al. 2025, arXiv:2504.02546): plain -A log pi, no ratio;
- `cispo`: CISPO (MiniMax-M1, arXiv:2506.13585): the clipped ratio as a detached weight on -A log pi,
  so clipped tokens still get a gradient;
- `geo_mean`: GMPO (Zhao et al. 2025, arXiv:2507.20673): the geometric mean of the clipped token ratios
  per response times the response's mean advantage, averaged over responses (`loss_agg_mode` unused,
  as in verl);
- `dppo_tv`, `dppo_kl`: DPPO (arXiv:2602.04879): -A * sg[min(ratio, clip_ratio_c)] * log pi on the tokens
  whose probability moved less than `clip_ratio_low/high` from the old one, measured as a difference of
  probabilities (`tv`) or a binary KL (`kl`); tokens past it get no gradient.

Padded positions may hold -inf logprobs in relm; each loss zeroes them before any arithmetic.
"""

from __future__ import annotations

import torch

from relm.algorithms.losses import AggScale, LossParams, _weighted, agg_loss, register_policy_loss
from relm.algorithms.masked import masked_mean

Metrics = dict[str, torch.Tensor]


def _valid_logprobs(logprobs: torch.Tensor, old_logprobs: torch.Tensor, response_mask: torch.Tensor):
    """(logprobs, old_logprobs) with padded positions set to 0, so -inf there cannot become NaN."""
    valid = response_mask != 0
    return torch.where(valid, logprobs, 0.0), torch.where(valid, old_logprobs, 0.0)


@register_policy_loss("gpg")
def gpg_loss(
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
    """GPG's loss: per token -A log pi (no ratio, no clip); no metrics, as verl reports none."""
    logprobs, _ = _valid_logprobs(logprobs, old_logprobs, response_mask)
    losses = _weighted(-logprobs * advantages, rollout_is_weights)
    return agg_loss(losses, response_mask, loss_agg_mode, agg_scale), {}


@register_policy_loss("cispo")
def cispo_loss(
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
    """CISPO: per token -sg[clip(ratio, 1 - low, 1 + high)] * A * log pi.

    Metrics: `pg_clipfrac` = share of valid tokens whose ratio was clipped; `ppo_kl`; `pg_clipfrac_lower` 0.
    """
    logprobs, old_logprobs = _valid_logprobs(logprobs, old_logprobs, response_mask)
    log_ratio = (logprobs - old_logprobs).clamp(min=-20.0, max=20.0)
    ratio = log_ratio.exp()
    clipped = ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    losses = _weighted(-clipped.detach() * advantages * logprobs, rollout_is_weights)
    loss = agg_loss(losses, response_mask, loss_agg_mode, agg_scale)
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((ratio != clipped).float(), response_mask),
            "ppo_kl": masked_mean(-log_ratio, response_mask),
            "pg_clipfrac_lower": torch.zeros((), dtype=loss.dtype, device=loss.device),
        }
    return loss, metrics


@register_policy_loss("geo_mean")
def geo_mean_loss(
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
    """GMPO: -mean over responses of A_i * exp(mean_t clip(log ratio)), clipped the pessimistic way for A's sign.

    Token log-ratios are clipped to [-low, high] in log space; the sequence advantage is the mean of A
    over the response's valid tokens. Rollout weights enter as their geometric mean per response.
    Metrics: `pg_clipfrac` / `pg_clipfrac_lower` = share of valid tokens clipped with A > 0 / A < 0.
    """
    logprobs, old_logprobs = _valid_logprobs(logprobs, old_logprobs, response_mask)
    mask = response_mask.to(logprobs.dtype)
    log_ratio = logprobs - old_logprobs
    sign = torch.sign(advantages)
    log_ratio_clipped = log_ratio.clamp(-clip_ratio_low, clip_ratio_high)
    pessimistic = sign * torch.min(sign * log_ratio, sign * log_ratio_clipped)
    lengths = mask.sum(dim=-1) + 1e-8  # verl's denominators, kept for equal values on empty responses
    seq_ratio = torch.exp((pessimistic * mask).sum(dim=-1) / lengths)
    seq_advantage = (advantages * mask).sum(dim=-1) / lengths
    losses = -seq_advantage * seq_ratio
    if rollout_is_weights is not None:
        losses = losses * torch.exp((torch.log(rollout_is_weights + 1e-10) * mask).sum(dim=-1) / lengths)
    loss = losses.mean()
    with torch.no_grad():
        clipped = log_ratio != log_ratio_clipped
        metrics = {
            "pg_clipfrac": masked_mean((clipped & (advantages > 0)).float(), response_mask),
            "ppo_kl": masked_mean(-log_ratio, response_mask),
            "pg_clipfrac_lower": masked_mean((clipped & (advantages < 0)).float(), response_mask),
        }
    return loss, metrics


def _dppo_loss(
    kind: str,
    *,
    old_logprobs: torch.Tensor,
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float,
    loss_agg_mode: str,
    agg_scale: AggScale | None,
    rollout_is_weights: torch.Tensor | None,
) -> tuple[torch.Tensor, Metrics]:
    logprobs, old_logprobs = _valid_logprobs(logprobs, old_logprobs, response_mask)
    log_ratio = (logprobs - old_logprobs).clamp(min=-20.0, max=20.0)
    ratio = log_ratio.exp()
    truncated = ratio.clamp(max=clip_ratio_c).detach()
    with torch.no_grad():
        prob, old_prob = logprobs.exp(), old_logprobs.exp()
        if kind == "tv":
            keep_up = (prob - old_prob) <= clip_ratio_high
            keep_down = (prob - old_prob) >= -clip_ratio_low
        else:
            binary_kl = old_prob * (old_logprobs - logprobs) + (1 - old_prob) * torch.log(
                (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8)
            )
            keep_up = (binary_kl <= clip_ratio_high) | (prob <= old_prob)
            keep_down = (binary_kl <= clip_ratio_low) | (prob >= old_prob)
        keep = torch.where(advantages > 0, keep_up, keep_down).to(logprobs.dtype)
    losses = _weighted(-advantages * truncated * logprobs * keep, rollout_is_weights)
    loss = agg_loss(losses, response_mask, loss_agg_mode, agg_scale)
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean(1.0 - keep, response_mask),
            "ppo_kl": masked_mean(-log_ratio, response_mask),
            "pg_clipfrac_lower": masked_mean((ratio > clip_ratio_c).to(keep.dtype) * keep, response_mask),
        }
    return loss, metrics


@register_policy_loss("dppo_tv")
def dppo_tv_loss(
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
    """DPPO-Binary-TV: tokens whose probability rose more than `high` (A > 0) or fell more than `low` (A < 0) are dropped.

    Metrics: `pg_clipfrac` = share dropped; `pg_clipfrac_lower` = share kept whose ratio passed `clip_ratio_c`.
    """
    return _dppo_loss(
        "tv", old_logprobs=old_logprobs, logprobs=logprobs, advantages=advantages, response_mask=response_mask,
        clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high, clip_ratio_c=clip_ratio_c,
        loss_agg_mode=loss_agg_mode, agg_scale=agg_scale, rollout_is_weights=rollout_is_weights,
    )  # fmt: skip


@register_policy_loss("dppo_kl")
def dppo_kl_loss(
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
    """DPPO-Binary-KL: as `dppo_tv`, the move measured as the binary KL of the token's probability.

    A token is dropped when that KL passes `high` while its probability rose (A > 0) or `low` while it fell (A < 0).
    """
    return _dppo_loss(
        "kl", old_logprobs=old_logprobs, logprobs=logprobs, advantages=advantages, response_mask=response_mask,
        clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high, clip_ratio_c=clip_ratio_c,
        loss_agg_mode=loss_agg_mode, agg_scale=agg_scale, rollout_is_weights=rollout_is_weights,
    )  # fmt: skip
