"""Rollout correction: importance weights and rejection for the gap between the engine's policy and the trainer's.

The engine samples with its own copy of the weights (bf16, FP8, another kernel) so its logprobs
log pi_rollout differ from the trainer's log pi_old of the same tokens; the update, which assumes the
responses came from pi_old, is then biased. With r = pi_old / pi_rollout per token (log r clamped to
+-20 before exp, as verl's SAFETY_BOUND):

- importance sampling (`rollout_is`): weights w = r per token, or w = prod_t r_t for every token of a
  response (`sequence`), truncated at an upper bound (TIS, Yao et al. 2025) or zeroed outside
  [lower, upper] (IcePop), optionally divided by their batch mean; they multiply the per-token policy
  loss (detached: they change the measure, not the objective);
- rejection (`rollout_rs`): a token, or a whole response, leaves the loss mask when a divergence
  estimate is out of bounds: k1 = -log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r (Schulman's
  estimators), read per token or as a response's sum, mean or max.

Formulas, metric names (`rollout_corr/...`) and edge cases are verl 0.9.1's
(`verl/trainer/ppo/rollout_corr_helper.py`, Liu et al. 2025, "When Speed Kills Stability:
Demystifying RL Collapse from the Training-Inference Mismatch"); tests/parity compares them with verl's
functions. One difference: padded positions may hold anything (-inf included) and are selected out with
`torch.where`, where verl multiplies by the mask.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from relm.algorithms.losses import (
    AggScale,
    LossParams,
    compute_policy_loss,
    register_policy_loss,
    reinforce_loss,
)
from relm.algorithms.masked import masked_mean, masked_sum
from relm.config.rollout_correction import RejectionBound, RolloutCorrection

SAFETY_BOUND = 20.0
"""|log r| is clamped to this before exp: exp(20) ~ 4.9e8 keeps weights finite."""

Metrics = dict[str, torch.Tensor]
"""Detached 0-dim tensors; `float()` them to log."""


@dataclass
class Corrected:
    """What `correct` returns for a batch."""

    weights: torch.Tensor | None
    """[N, R] importance weights (0 on padding), or None without `rollout_is`."""
    response_mask: torch.Tensor
    """[N, R] the loss mask with the rejected tokens removed (the input mask without `rollout_rs`)."""
    metrics: Metrics
    """Under verl's names, `rollout_corr/` prefixed."""


def correct(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    spec: RolloutCorrection,
) -> Corrected:
    """Weights, rejection and the gap metrics for one batch; verl's `compute_rollout_correction_and_rejection_mask`.

    Args:
        old_logprobs: [N, R] the trainer's logprobs (pi_old; in bypass mode the current policy's, detached).
        rollout_logprobs: [N, R] the engine's logprobs of the same tokens.
        response_mask: [N, R] 0/1, with at least one valid token.
        spec: the parsed `algorithm.rollout_correction` section.
    """
    log_ratio = torch.where(response_mask != 0, old_logprobs - rollout_logprobs, 0.0)  # [N, R]
    metrics: Metrics = {}
    weights = None
    if spec.is_level is not None:
        weights, is_metrics = importance_weights(
            log_ratio,
            response_mask,
            level=spec.is_level,
            upper=spec.is_upper,
            lower=spec.is_lower,
            batch_normalize=spec.is_batch_normalize,
        )
        metrics.update(is_metrics)
    kept = response_mask
    if spec.rejection:
        kept, rs_metrics = rejection_mask(log_ratio, response_mask, spec.rejection)
        metrics.update(rs_metrics)
    metrics.update(offpolicy_metrics(old_logprobs, rollout_logprobs, response_mask))
    return Corrected(
        weights=weights, response_mask=kept, metrics={f"rollout_corr/{k}": v for k, v in metrics.items()}
    )


def importance_weights(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    level: str,
    upper: float,
    lower: float | None = None,
    batch_normalize: bool = False,
) -> tuple[torch.Tensor, Metrics]:
    """[N, R] detached weights from log r = log pi_old - log pi_rollout [N, R], and their metrics.

    `level`: `token` (w_t = r_t) or `sequence` (every token of a response gets prod_t r_t). `lower` None:
    weights are truncated at `upper` (TIS); else zeroed outside [lower, upper] (IcePop). `batch_normalize`
    divides by the batch mean (over tokens, or over responses for `sequence`).
    """
    valid = response_mask != 0
    if level == "token":
        log_for_metrics = log_ratio  # [N, R]
        raw = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()
    elif level == "sequence":
        log_for_metrics = masked_sum(log_ratio, valid, dim=-1).unsqueeze(-1)  # [N, 1]
        raw = log_for_metrics.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp().expand_as(log_ratio)
    else:
        raise ValueError(f"unknown rollout_is level {level!r}; valid: token, sequence")
    raw = torch.where(valid, raw, 0.0)
    if lower is None:
        weights = raw.clamp(max=upper)
    else:
        weights = torch.where((raw >= lower) & (raw <= upper), raw, 0.0)
    metrics = _is_metrics(weights, raw, log_for_metrics, valid, level=level, upper=upper, lower=lower)
    weights = weights.detach()
    if batch_normalize:
        if level == "token":
            mean = masked_mean(weights, valid)
        else:
            has_tokens = valid.any(dim=-1)
            mean = masked_mean(masked_mean(weights, valid, dim=-1), has_tokens)
        if mean > 1e-8:
            weights = weights / mean
            metrics["rollout_is_batch_norm_factor"] = mean
        else:
            metrics["rollout_is_batch_norm_factor"] = torch.ones(())
    return weights, metrics


def _is_metrics(
    weights: torch.Tensor,
    raw: torch.Tensor,
    log_for_metrics: torch.Tensor,
    valid: torch.Tensor,
    *,
    level: str,
    upper: float,
    lower: float | None,
) -> Metrics:
    """verl's `compute_is_metrics` (plus IcePop's out-of-bounds share)."""
    low = 1.0 / upper if lower is None else lower  # the fraction-low bound when truncating
    m: Metrics = {"rollout_is_mean": masked_mean(weights, valid)}
    if level == "sequence":
        # Over every response, empty ones included (their log-ratio sum is 0), as verl counts them.
        m["rollout_is_max"] = log_for_metrics.max().clamp(max=SAFETY_BOUND).exp()
        m["rollout_is_min"] = log_for_metrics.min().exp()
        m["rollout_is_ratio_fraction_high"] = (log_for_metrics > math.log(upper)).float().mean()
        m["rollout_is_ratio_fraction_low"] = (log_for_metrics < math.log(low)).float().mean()
    else:
        m["rollout_is_ratio_fraction_high"] = masked_mean((raw > upper).float(), valid)
        m["rollout_is_ratio_fraction_low"] = masked_mean((raw < low).float(), valid)
        m["rollout_is_max"] = weights.masked_fill(~valid, float("-inf")).max()
        m["rollout_is_min"] = weights.masked_fill(~valid, float("inf")).min()
    bounded = weights.clamp(0.0, upper)
    bounded_mean = masked_mean(bounded, valid)
    if valid.sum() > 1:
        variance = masked_mean(bounded.square(), valid) - bounded_mean.square()
        m["rollout_is_std"] = variance.clamp(min=0.0).sqrt()
    else:
        m["rollout_is_std"] = torch.zeros(())
    spread = masked_mean((bounded / (bounded_mean + 1e-8)).square(), valid)
    # Every weight zeroed by IcePop: no effective sample (verl divides by zero here and raises).
    m["rollout_is_eff_sample_size"] = torch.where(spread > 0, 1.0 / spread, 0.0)
    seq_means = masked_mean(weights, valid, dim=-1)  # [N]
    m["rollout_is_seq_mean"] = seq_means.mean()
    m["rollout_is_seq_std"] = seq_means.std() if seq_means.numel() > 1 else torch.zeros(())
    m["rollout_is_seq_max"] = seq_means.max()
    m["rollout_is_seq_min"] = seq_means.min()
    m["rollout_is_seq_max_deviation"] = (seq_means - 1.0).abs().max()
    # The raw means: a mean of truncated weights can never pass the bound.
    raw_seq_means = masked_mean(raw, valid, dim=-1)
    m["rollout_is_seq_fraction_high"] = (raw_seq_means > upper).float().mean()
    m["rollout_is_seq_fraction_low"] = (raw_seq_means < low).float().mean()
    if lower is not None:
        m["rollout_is_oob_ratio"] = masked_mean(((raw < lower) | (raw > upper)).float(), valid)
    return {name: value.detach() for name, value in m.items()}


def rejection_mask(
    log_ratio: torch.Tensor, response_mask: torch.Tensor, bounds: tuple[RejectionBound, ...]
) -> tuple[torch.Tensor, Metrics]:
    """The loss mask [N, R] with the tokens (token options) or responses (seq options) out of bounds set to 0.

    Every option must pass. k1 = -log r is kept within [log lower, log upper]; k2 and k3 (never negative)
    at or below `upper`. Sequence options read a response's sum, mean or max of the token statistic.
    """
    valid = response_mask != 0
    safe = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    token_stats = {"k1": -safe, "k2": 0.5 * safe.square(), "k3": safe.exp() - 1.0 - safe}  # each [N, R]
    has_tokens = valid.any(dim=-1)  # [N]
    keep_all = torch.ones_like(log_ratio)
    metrics: Metrics = {}
    for bound in bounds:
        where, estimator = bound.option.rsplit("_", 1)
        token_stat = token_stats[estimator]
        seq_stat = None
        if where == "token":
            stat = token_stat
        else:
            seq_stat = _per_response(where, token_stat, valid)  # [N]
            stat = seq_stat.unsqueeze(-1).expand_as(log_ratio)
        if estimator == "k1":
            assert bound.lower is not None, "k1 options carry both bounds"
            low, high = math.log(bound.lower), math.log(bound.upper)
            keep = (stat >= low) & (stat <= high)
        else:
            low, high = 0.0, bound.upper
            keep = stat <= high
        keep_float = keep.to(log_ratio.dtype)
        keep_all = keep_all * keep_float
        prefix = f"rollout_rs_{bound.option}"
        metrics.update(
            _rs_metrics(
                prefix, stat, seq_stat, valid, has_tokens, low=low, high=high, two_sided=estimator == "k1"
            )
        )
        metrics[f"{prefix}_masked_fraction"] = masked_mean(1.0 - keep_float, valid)
        # A response counts as rejected when any of its valid tokens is.
        seq_kept = (keep | ~valid).all(dim=-1).to(log_ratio.dtype)
        metrics[f"{prefix}_seq_masked_fraction"] = masked_mean(1.0 - seq_kept, has_tokens)
    metrics["rollout_rs_masked_fraction"] = masked_mean(1.0 - keep_all, valid)
    metrics["rollout_rs_seq_masked_fraction"] = ((keep_all <= 0.5) & valid).any(dim=-1).float().mean()
    kept = torch.where(keep_all > 0.5, response_mask, torch.zeros_like(response_mask))
    return kept, {name: value.detach() for name, value in metrics.items()}


def _per_response(where: str, token_stat: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    if where == "seq_sum":
        return masked_sum(token_stat, valid, dim=-1)
    if where == "seq_mean":
        return masked_mean(token_stat, valid, dim=-1)
    highest = token_stat.masked_fill(~valid, float("-inf")).max(dim=-1).values
    return torch.where(highest == float("-inf"), 0.0, highest)  # an empty response's max is 0, as verl's


def _rs_metrics(
    prefix: str,
    stat: torch.Tensor,
    seq_stat: torch.Tensor | None,
    valid: torch.Tensor,
    has_tokens: torch.Tensor,
    *,
    low: float,
    high: float,
    two_sided: bool,
) -> Metrics:
    """verl's `compute_rs_metrics` for one option: `stat` [N, R] per token (a response's value repeated for
    seq options), `seq_stat` [N] per response (None for token options: then each response's token mean)."""
    per_response = masked_mean(stat, valid, dim=-1) if seq_stat is None else seq_stat
    seqs = per_response[has_tokens]
    m: Metrics = {f"{prefix}_mean": masked_mean(stat, valid)}
    sequence_level = seq_stat is not None and seqs.numel() > 0
    if sequence_level:
        m[f"{prefix}_max"], m[f"{prefix}_min"] = seqs.max(), seqs.min()
        m[f"{prefix}_fraction_high"] = (seqs > high).float().mean()
        m[f"{prefix}_fraction_low"] = (seqs < low).float().mean() if two_sided else torch.zeros(())
    else:
        m[f"{prefix}_max"] = stat.masked_fill(~valid, float("-inf")).max()
        m[f"{prefix}_min"] = stat.masked_fill(~valid, float("inf")).min()
        m[f"{prefix}_fraction_high"] = masked_mean((stat > high).float(), valid)
        m[f"{prefix}_fraction_low"] = (
            masked_mean((stat < low).float(), valid) if two_sided else torch.zeros(())
        )
    if valid.sum() > 1:
        bounded = stat.clamp(min=low if two_sided else 0.0, max=high)
        variance = masked_mean(bounded.square(), valid) - masked_mean(bounded, valid).square()
        m[f"{prefix}_std"] = variance.clamp(min=0.0).sqrt()
    else:
        m[f"{prefix}_std"] = torch.zeros(())
    if seqs.numel() > 0:
        m[f"{prefix}_seq_mean"] = seqs.mean()
        m[f"{prefix}_seq_std"] = seqs.std() if seqs.numel() > 1 else torch.zeros(())
        m[f"{prefix}_seq_max"], m[f"{prefix}_seq_min"] = seqs.max(), seqs.min()
        m[f"{prefix}_seq_max_deviation"] = seqs.abs().max()
        m[f"{prefix}_seq_fraction_high"] = (seqs > high).float().mean()
        if two_sided:
            m[f"{prefix}_seq_fraction_low"] = (seqs < low).float().mean()
    return m


def offpolicy_metrics(
    old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, response_mask: torch.Tensor
) -> Metrics:
    """The gap between the two policies on the sampled tokens (verl's `compute_offpolicy_metrics`).

    `kl` = mean of log pi_rollout - log pi_old (KL(rollout || old), the engine's own estimator), `k3_kl` the
    k3 estimate of it; `training_ppl` / `rollout_ppl`: mean over responses of exp(-token mean logprob), with
    their logs; `log_ppl_diff` (mean, |mean|, max, min over responses) = rollout minus training token-mean
    logprob; `ppl_ratio` = mean of its exp; `chi2_token` = E[r^2] - 1 and `chi2_seq` = E[(prod r)^2] - 1.
    """
    valid = response_mask != 0
    old = torch.where(valid, old_logprobs, 0.0)
    rollout = torch.where(valid, rollout_logprobs, 0.0)
    log_ratio = old - rollout
    train_mean = masked_mean(old, valid, dim=-1)  # [N]
    rollout_mean = masked_mean(rollout, valid, dim=-1)
    log_ppl_diff = rollout_mean - train_mean
    seq_log_ratio = masked_sum(log_ratio, valid, dim=-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    m: Metrics = {
        "training_ppl": (-train_mean).exp().mean(),
        "training_log_ppl": (-train_mean).mean(),
        "kl": masked_mean(rollout - old, valid),
        "k3_kl": masked_mean(log_ratio.exp() - log_ratio - 1.0, valid),
        "rollout_ppl": (-rollout_mean).exp().mean(),
        "rollout_log_ppl": (-rollout_mean).mean(),
        "log_ppl_diff": log_ppl_diff.mean(),
        "log_ppl_abs_diff": log_ppl_diff.abs().mean(),
        "log_ppl_diff_max": log_ppl_diff.max(),
        "log_ppl_diff_min": log_ppl_diff.min(),
        "ppl_ratio": log_ppl_diff.exp().mean(),
        "chi2_token": masked_mean(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp().square(), valid) - 1.0,
        "chi2_seq": (2.0 * seq_log_ratio).exp().mean() - 1.0,
    }
    return {name: value.detach() for name, value in m.items()}


def bypass_policy_loss(
    loss_mode: str,
    spec: RolloutCorrection,
    *,
    rollout_logprobs: torch.Tensor,
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    agg_scale: AggScale | None = None,
    params: LossParams | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """Bypass mode's loss (verl's `compute_policy_loss_bypass_mode`): the engine's logprobs are the old ones.

    The weights and rejection are computed per micro-batch against the current policy (detached logprobs).
    `ppo_clip`: the `loss_mode` policy loss (`vanilla` for verl's own name `bypass_mode`, the loss verl's
    bypass mode always runs) against the engine's logprobs over the kept tokens, with no weights (its
    ratio pi / pi_rollout is already the correction); `reinforce`: `reinforce_loss` with the weights.
    Metrics: the loss's own, plus `rollout_corr/...`.
    """
    if response_mask.any():
        corrected = correct(logprobs.detach(), rollout_logprobs, response_mask, spec)
    else:  # a micro-batch of empty responses: nothing to weigh or measure (verl raises here)
        corrected = Corrected(weights=None, response_mask=response_mask, metrics={})
    if spec.loss_type == "reinforce":
        loss, metrics = reinforce_loss(
            rollout_logprobs=rollout_logprobs,
            logprobs=logprobs,
            advantages=advantages,
            response_mask=corrected.response_mask,
            loss_agg_mode=loss_agg_mode,
            agg_scale=agg_scale,
            rollout_is_weights=corrected.weights,
        )
    else:
        loss, metrics = compute_policy_loss(
            "vanilla" if loss_mode == "bypass_mode" else loss_mode,
            old_logprobs=rollout_logprobs,
            logprobs=logprobs,
            advantages=advantages,
            response_mask=corrected.response_mask,
            clip_ratio_low=clip_ratio_low,
            clip_ratio_high=clip_ratio_high,
            clip_ratio_c=clip_ratio_c,
            loss_agg_mode=loss_agg_mode,
            agg_scale=agg_scale,
            params=params,
        )
    return loss, {**metrics, **corrected.metrics}


DEFAULT_CORRECTION = RolloutCorrection(
    is_level="sequence", is_upper=2.0, is_lower=None, is_batch_normalize=False, rejection=(), bypass=False,
    loss_type="ppo_clip",
)  # fmt: skip
"""verl's `policy_loss.rollout_correction` default (its dataclass's: `rollout_is=sequence`, threshold 2, no
rejection, `ppo_clip`): with `ppo_clip` the weights are not applied, so it only adds their metrics."""


@register_policy_loss("bypass_mode")
def bypass_mode_loss(
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
    """verl's `bypass_mode` loss name: `bypass_policy_loss` of `vanilla`, `old_logprobs` taken as the rollout's.

    verl's bypass mode sets this name itself; relm's bypass mode calls `bypass_policy_loss` with
    `algorithm.rollout_correction` instead (reading this name as `vanilla`), so this function runs when the
    name is given outside bypass mode, with `params.correction`: None in relm's runs, which is verl's
    `policy_loss.rollout_correction` default (`DEFAULT_CORRECTION`) there. `rollout_is_weights` are ignored,
    as in verl: the weights are computed here.
    """
    return bypass_policy_loss(
        "vanilla", DEFAULT_CORRECTION if params is None or params.correction is None else params.correction,
        rollout_logprobs=old_logprobs, logprobs=logprobs, advantages=advantages, response_mask=response_mask,
        clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high, clip_ratio_c=clip_ratio_c,
        loss_agg_mode=loss_agg_mode, agg_scale=agg_scale, params=params,
    )  # fmt: skip
