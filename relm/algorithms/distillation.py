"""On-policy distillation: a frozen teacher scores the student's own samples token by token (verl 0.9.1's
`distillation.distillation_loss`), as pure functions of tensors.

The student samples responses; the teacher reads each prompt and response and gives, per response token,
its log-probability of the token the student sampled (the estimator losses) or its top-k log-probabilities
and their token ids (`forward_kl_topk`). The per-token divergence between the two then trains the student
in one of two ways (Agarwal et al., "On-Policy Distillation of Language Models", arXiv:2306.13649;
Thinking Machines, "On-Policy Distillation", 2025):

- supervised (`use_policy_gradient=false`): the divergence itself is the loss, aggregated like the policy
  loss and backpropagated through the student's log-probabilities (or logits for `forward_kl_topk`);
- as a reward (`use_policy_gradient=true`): the negated, detached divergence is each token's advantage in
  verl's vanilla clipped policy loss, so k1 (log pi_student - log pi_teacher) becomes the per-token
  reverse-KL reward of the Thinking Machines recipe.

`distillation_loss` reduces the per-token divergences to the distillation term; the actor's objective
(relm.learner.actor_objective) adds it to the task's policy loss (times `distillation_loss_coef`) when
`use_task_rewards` is on, or uses it alone.
"""

from __future__ import annotations

import torch

from relm.algorithms.kl import kl_estimate
from relm.algorithms.losses import AggScale, agg_loss, compute_policy_loss
from relm.config.distillation import ESTIMATOR_MODES, LOSS_MODES, TOPK_MODES
from relm.config.specs import DistillationLoss

__all__ = [
    "ESTIMATOR_MODES",
    "LOSS_MODES",
    "TOPK_MODES",
    "DistillationLoss",
    "distillation_loss",
    "forward_kl_over_ids",
    "forward_kl_topk",
    "token_divergences",
]

CLIP_RATIO_C = 3.0
"""The dual-clip bound of the distillation policy loss: verl's vanilla loss reads `clip_ratio_c` from the
distillation loss config, which has no such key, so it takes its default."""


def token_divergences(
    student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, loss_mode: str
) -> torch.Tensor:
    """Per-token estimate of KL(student || teacher) at the sampled tokens, for an estimator loss mode.

    Args:
        student_logprobs: [N, R] log pi_student of the sampled tokens (with gradient for a supervised loss).
        teacher_logprobs: [N, R] log pi_teacher of the same tokens.
        loss_mode: one of `ESTIMATOR_MODES`; `k1` is log pi_student - log pi_teacher, `k3` the non-negative
            r - log r - 1 with r = pi_teacher / pi_student (clamped as verl clamps it).

    Returns:
        [N, R], unmasked.
    """
    if loss_mode not in ESTIMATOR_MODES:
        raise ValueError(f"{loss_mode!r} is not an estimator loss mode ({', '.join(ESTIMATOR_MODES)})")
    return kl_estimate(student_logprobs, teacher_logprobs, loss_mode)


def forward_kl_topk(
    student_logits: torch.Tensor,
    teacher_topk_logprobs: torch.Tensor,
    teacher_topk_ids: torch.Tensor,
    log_prob_min_clamp: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Forward KL(teacher || student) over the teacher's top-k tokens at each position.

    sum_k p_t(k) (log p_t(k) - log p_s(k)) over the k ids the teacher ranks highest, with both
    log-probabilities floored at `log_prob_min_clamp` (when set) before the sum. The sum leaves out the
    mass outside the top k, so it can come out negative; it is clamped at 0, as verl clamps it.

    Args:
        student_logits: [N, R, V] the student's logits at the response positions.
        teacher_topk_logprobs: [N, R, K] the teacher's top-k log-probabilities.
        teacher_topk_ids: [N, R, K] int64, their token ids.
        log_prob_min_clamp: floor of both sides' log-probabilities, or None.

    Returns:
        (divergences [N, R] clamped at 0, student_mass [N, R], teacher_mass [N, R]): the masses are the
        probability each side puts on the teacher's top-k ids (before the floor).
    """
    # At least fp32 (verl's log-softmax keeps the logits' dtype, bf16 in its training forward).
    wide = torch.promote_types(student_logits.dtype, torch.float32)
    student_logprobs = torch.log_softmax(student_logits.to(wide), dim=-1)  # [N, R, V]
    student_topk = torch.gather(student_logprobs, -1, teacher_topk_ids)  # [N, R, K]
    return forward_kl_over_ids(student_topk, teacher_topk_logprobs, log_prob_min_clamp)


def forward_kl_over_ids(
    student_topk_logprobs: torch.Tensor,
    teacher_topk_logprobs: torch.Tensor,
    log_prob_min_clamp: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`forward_kl_topk` from the student's log-probabilities already taken at the teacher's top ids (the
    trainer's update forward gathers them, `relm.learner.forward.response_logprobs_at`).

    Args:
        student_topk_logprobs: [N, R, K] log p_student at the teacher's top ids (with gradient).
        teacher_topk_logprobs: [N, R, K] the teacher's log-probabilities of those ids.

    Returns:
        As `forward_kl_topk`.
    """
    student_topk = student_topk_logprobs
    teacher_topk = teacher_topk_logprobs.to(torch.promote_types(teacher_topk_logprobs.dtype, torch.float32))
    student_mass = student_topk.exp().sum(-1)
    teacher_mass = teacher_topk.exp().sum(-1)
    if log_prob_min_clamp is not None:
        student_topk = student_topk.clamp_min(log_prob_min_clamp)
        teacher_topk = teacher_topk.clamp_min(log_prob_min_clamp)
    divergences = (teacher_topk.exp() * (teacher_topk - student_topk)).sum(-1)  # [N, R]
    return divergences.clamp_min(0.0), student_mass, teacher_mass


def distillation_loss(
    divergences: torch.Tensor,
    mask: torch.Tensor,
    settings: DistillationLoss,
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    loss_agg_mode: str,
    scale: AggScale | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The distillation term of the actor's loss from the per-token divergences.

    The divergences are clamped to +-`loss_max_clamp` (k1 can be negative), then either aggregated as
    they are (supervised; `loss_agg_mode` over `mask` with the mini-batch's counts `scale`) or negated,
    detached and used as per-token advantages in the vanilla clipped policy loss with the distillation
    section's clip range (`use_policy_gradient`).

    Args:
        divergences: [N, R] per-token divergences (`token_divergences`, `forward_kl_topk`).
        mask: [N, R] 0/1, the tokens the loss covers.
        logprobs: [N, R] the student's logprobs with gradient (the policy loss's ratio numerator).
        old_logprobs: [N, R] the logprobs the responses were sampled with (the ratio's denominator).
        rollout_is_weights: [N, R] importance weights on the policy loss (decoupled mode), or None.

    Returns:
        (loss, metrics): `distillation/loss_min`, `distillation/loss_max` (before the clamp),
        `distillation/abs_loss` and, with `use_policy_gradient`, the policy loss's metrics under
        `distillation/` (`pg_clipfrac`, `ppo_kl`, `pg_clipfrac_lower`).
    """
    on = mask.bool()
    picked = divergences.detach()[on]
    metrics: dict[str, torch.Tensor] = {}
    if picked.numel():
        metrics["distillation/loss_min"] = picked.min()
        metrics["distillation/loss_max"] = picked.max()
        metrics["distillation/abs_loss"] = picked.abs().mean()
    clamp = settings.loss_max_clamp
    if clamp is not None:
        divergences = divergences.clamp(min=-clamp, max=clamp)
    if not settings.use_policy_gradient:
        return agg_loss(divergences, mask, loss_agg_mode, scale), metrics
    loss, pg_metrics = compute_policy_loss(
        "vanilla",
        old_logprobs=old_logprobs,
        logprobs=logprobs,
        advantages=-divergences.detach(),
        response_mask=mask,
        clip_ratio_low=settings.clip_ratio_low,
        clip_ratio_high=settings.clip_ratio_high,
        clip_ratio_c=CLIP_RATIO_C,
        loss_agg_mode=loss_agg_mode,
        agg_scale=scale,
        rollout_is_weights=rollout_is_weights,
    )
    metrics.update({f"distillation/{name}": value for name, value in pg_metrics.items()})
    return loss, metrics
