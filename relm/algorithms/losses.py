"""Actor and critic losses on [N, R] token matrices.

Each loss returns `(loss, metrics)`: a scalar to backpropagate and detached 0-dim tensors named
without prefix (the trainer adds `actor/` or `critic/`). A new policy loss is a function registered
with `@register_policy_loss("name")` taking the keyword arguments of `compute_policy_loss`; settings
beyond the clip ranges come in one `LossParams` record (`params`; defined with the specs, which carry it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from relm.algorithms.masked import masked_mean, masked_sum
from relm.config.specs import LossParams

AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)

PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]

POLICY_LOSSES: dict[str, PolicyLoss] = {}
"""Policy loss name (the value of `actor.policy_loss.loss_mode`) -> function."""


@dataclass(frozen=True)
class AggScale:
    """Token and response counts of the whole mini-batch a micro-batch belongs to.

    With gradient accumulation, normalising each micro-batch by its own counts weighs tokens
    unequally when micro-batches hold different numbers of tokens. Dividing every micro-batch's
    sum by the mini-batch's counts instead makes the summed micro-batch losses equal the
    mini-batch loss exactly, whatever the micro-batch size.
    """

    num_tokens: float
    """Valid response tokens in the mini-batch."""
    num_seqs: float
    """Responses in the mini-batch."""

    @staticmethod
    def of(mask: torch.Tensor) -> AggScale:
        """The counts of a whole mini-batch's response mask [N, R]."""
        return AggScale(num_tokens=float((mask != 0).sum()), num_seqs=float(mask.shape[0]))


def agg_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    scale: AggScale | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss [N, R] to a scalar, as verl 0.9.1's `loss_agg_mode` values define it.

    With `scale` (the mini-batch's counts), means divide by the mini-batch's totals, so summing
    the results over a mini-batch's micro-batches gives the mini-batch value (see `AggScale`); its
    response count includes empty responses, as verl's trainer counts `ppo_mini_batch_size`. Without
    it the counts are this batch's own, and the `seq-mean` modes count only responses with at least
    one valid token, as verl's `agg_loss` does when given no global batch size.

    - `token-mean`: mean over all valid tokens of the batch (every token weighs the same; DAPO).
      No valid token gives 0 (verl divides by zero: NaN).
    - `token-sum`: sum over all valid tokens, no normalisation.
    - `seq-mean-token-sum`: per-response token sum, mean over responses.
    - `seq-mean-token-mean`: per-response token mean, mean over responses (every response weighs
      the same; the original GRPO). An empty response counts as 0.
    - `seq-mean-token-sum-norm`: `seq-mean-token-sum` divided by the constant `loss_scale_factor`
      (default R, the padded width, i.e. `max_response_length`): Dr. GRPO (Liu et al. 2025,
      arXiv:2503.20783), whose constant divisor removes the length normalisation bias. verl 0.9.1
      divides by the responses as well; earlier relm (and verl) summed over responses instead, so
      `ones(2, 4)` gives 1.0 now where it gave 2.0.
    """
    valid = mask != 0  # [N, R]
    if mode == "token-mean":
        if scale is None:  # counted on the device: no host sync per micro-batch
            return masked_sum(loss_mat, valid) / valid.sum().clamp(min=1)
        return masked_sum(loss_mat, valid) / max(scale.num_tokens, 1.0)
    if mode == "token-sum":
        return masked_sum(loss_mat, valid)
    seq_sums = masked_sum(loss_mat, valid, dim=-1)  # [N]
    lengths = valid.to(loss_mat.dtype).sum(dim=-1)  # [N]
    # Counted on the device without a scale: no host sync per micro-batch.
    num_seqs = (lengths > 0).sum().clamp(min=1) if scale is None else max(scale.num_seqs, 1.0)
    if mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        loss = seq_sums.sum() / num_seqs
        if mode == "seq-mean-token-sum":
            return loss
        return loss / (loss_mat.shape[-1] if loss_scale_factor is None else loss_scale_factor)
    if mode == "seq-mean-token-mean":
        return (seq_sums / lengths.clamp(min=1)).sum() / num_seqs
    raise ValueError(f"unknown loss_agg_mode {mode!r}; valid modes: {', '.join(AGG_MODES)}")


def register_policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    """Register a policy loss under `name` for `compute_policy_loss` (a decorator)."""

    def decorator(fn: PolicyLoss) -> PolicyLoss:
        known = POLICY_LOSSES.get(name)
        if known is not None and known is not fn:
            raise ValueError(f"policy loss {name!r} is already registered ({known.__qualname__})")
        POLICY_LOSSES[name] = fn
        return fn

    return decorator


def compute_policy_loss(
    loss_mode: str,
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
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Run the policy loss named by `actor.policy_loss.loss_mode`.

    `rollout_is_weights` [N, R] (detached; `relm.algorithms.rollout_correction`) multiply the per-token
    losses before aggregation, as verl 0.9.1 applies its rollout importance weights.

    Returns:
        (loss, {"pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"}).

    Raises:
        ValueError: unknown `loss_mode` (the message lists the valid ones).
    """
    fn = POLICY_LOSSES.get(loss_mode)
    if fn is None:
        raise ValueError(
            f"unknown policy loss {loss_mode!r}; valid names: {', '.join(sorted(POLICY_LOSSES))}"
        )
    return fn(
        old_logprobs=old_logprobs,
        logprobs=logprobs,
        advantages=advantages,
        response_mask=response_mask,
        clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high,
        clip_ratio_c=clip_ratio_c,
        loss_agg_mode=loss_agg_mode,
        agg_scale=agg_scale,
        rollout_is_weights=rollout_is_weights,
        params=LossParams() if params is None else params,
    )


def _weighted(losses: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    return losses if rollout_is_weights is None else losses * rollout_is_weights


@register_policy_loss("vanilla")
def ppo_clip_loss(
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
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate (Schulman et al. 2017, arXiv:1707.06347) with dual clip (Ye et al.
    2020, arXiv:1912.09729).

    Per token, with ratio = pi / pi_old: loss = max(-A ratio, -A clip(ratio, 1 - low, 1 + high)).
    For A < 0 that max grows without bound as the ratio grows, so dual clip caps it at -A c.
    Asymmetric `low`/`high` give DAPO's clip-higher (Yu et al. 2025).

    Metrics: `pg_clipfrac` = share of valid tokens where the clipped term is the larger one;
    `pg_clipfrac_lower` = share where the dual clip binds; `ppo_kl` = mean of log pi_old - log pi.
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must exceed 1 for dual-clip PPO, got {clip_ratio_c}")
    # Padded positions may hold -inf logprobs; zeroing them keeps NaN out of the backward pass.
    log_ratio = torch.where(response_mask != 0, logprobs - old_logprobs, 0.0)  # [N, R]
    # exp of a huge log-ratio on a broken token would overflow to inf; `ppo_kl` reads the clamped one, as verl's.
    log_ratio = log_ratio.clamp(min=-20.0, max=20.0)
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio  # [N, R]
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    ppo_losses = torch.maximum(unclipped, clipped)
    dual_bound = -advantages * clip_ratio_c
    negative = advantages < 0
    losses = torch.where(negative, torch.minimum(ppo_losses, dual_bound), ppo_losses)
    loss = agg_loss(_weighted(losses, rollout_is_weights), response_mask, loss_agg_mode, agg_scale)
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((clipped > unclipped).float(), response_mask),
            "ppo_kl": masked_mean(-log_ratio, response_mask),
            "pg_clipfrac_lower": masked_mean((negative & (ppo_losses > dual_bound)).float(), response_mask),
        }
    return loss, metrics


@register_policy_loss("gspo")
def gspo_loss(
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
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Group Sequence Policy Optimization (Zheng et al. 2025, arXiv:2507.18071).

    The importance ratio is per sequence: s_i = (pi(y_i) / pi_old(y_i)) ^ (1 / |y_i|), the
    geometric mean of the token ratios, so one off-policy token cannot dominate a long response.
    Written in the paper's token-level form s_{i,t} = sg[s_i] * pi(y_t) / sg[pi(y_t)]: the value
    is s_i at every token, the gradient s_i * grad log pi(y_t). Clipped like PPO (the paper uses
    much smaller ranges, e.g. 3e-4 / 4e-4); no dual clip, so `clip_ratio_c` is unused and
    `pg_clipfrac_lower` is 0. The paper aggregates with `seq-mean-token-mean`; `loss_agg_mode`
    is honoured as given.
    """
    valid = response_mask != 0  # [N, R]
    logprobs = torch.where(valid, logprobs, 0.0)  # padded -inf would give NaN in lp - sg[lp]
    log_ratio = torch.where(valid, logprobs - old_logprobs, 0.0)  # [N, R]
    seq_log_ratio = masked_mean(log_ratio, valid, dim=-1)  # [N]
    token_log_ratio = logprobs - logprobs.detach() + seq_log_ratio.detach().unsqueeze(-1)  # [N, R]
    ratio = token_log_ratio.clamp(max=10.0).exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    losses = _weighted(torch.maximum(unclipped, clipped), rollout_is_weights)
    loss = agg_loss(losses, response_mask, loss_agg_mode, agg_scale)
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((clipped > unclipped).float(), response_mask),
            "ppo_kl": masked_mean(-log_ratio, response_mask),
            "pg_clipfrac_lower": torch.zeros((), dtype=loss.dtype, device=loss.device),
        }
    return loss, metrics


def reinforce_loss(
    *,
    rollout_logprobs: torch.Tensor,
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    agg_scale: AggScale | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """REINFORCE with optional importance weights (Williams 1992): per token -w * A * log pi, no ratio, no clip.

    verl 0.9.1's `compute_policy_loss_reinforce`, the loss of bypass mode's `loss_type=reinforce`: the weights
    w = pi / pi_rollout (truncated, detached) carry the off-policy correction that PPO's ratio carries in
    `ppo_clip`. Metrics: `ppo_kl` = mean of log pi_rollout - log pi over valid tokens.
    """
    valid = response_mask != 0
    logprobs = torch.where(valid, logprobs, 0.0)  # a padded -inf times a zero advantage would be NaN
    losses = _weighted(-advantages * logprobs, rollout_is_weights)
    loss = agg_loss(losses, response_mask, loss_agg_mode, agg_scale)
    with torch.no_grad():
        metrics = {"ppo_kl": masked_mean(rollout_logprobs - logprobs, response_mask)}
    return loss, metrics


def compute_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    agg_scale: AggScale | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss (PPO2 baselines; as verl): 0.5 * max((V - G)^2, (V_clip - G)^2).

    V_clip = V_old + clip(V - V_old, -c, c) keeps the critic from moving far from the values the
    advantages were computed with; taking the max makes the clip a pessimistic bound, not a cap.

    Args:
        values: [N, R] current critic values (with grad).
        old_values: [N, R] values at rollout time.
        returns: [N, R] targets.
        response_mask: [N, R].
        cliprange_value: c (`critic.cliprange_value`).
        loss_agg_mode: see `agg_loss`.

    Returns:
        (loss, {"vf_clipfrac": share of valid tokens where the clipped error is the larger}).
    """
    # Clamping V itself (not V_old + the clamped step) leaves an unclipped V bit for bit equal, so
    # `vf_clipfrac` counts only real clips: V_old + (V - V_old) can differ from V in the last bit.
    clipped_values = values.clamp(old_values - cliprange_value, old_values + cliprange_value)
    unclipped_err = (values - returns).square()  # [N, R]
    clipped_err = (clipped_values - returns).square()
    loss = 0.5 * agg_loss(torch.maximum(unclipped_err, clipped_err), response_mask, loss_agg_mode, agg_scale)
    with torch.no_grad():
        clipfrac = masked_mean((clipped_err > unclipped_err).float(), response_mask)
    return loss, {"vf_clipfrac": clipfrac}


def compute_entropy_loss(
    entropy: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str, agg_scale: AggScale | None = None
) -> torch.Tensor:
    """Aggregate per-token entropy [N, R] like the policy loss, so the bonus weighs tokens alike."""
    return agg_loss(entropy, response_mask, loss_agg_mode, agg_scale)
