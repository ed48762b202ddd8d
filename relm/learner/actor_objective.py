"""The actor's objective on one micro-batch: policy loss, entropy bonus, KL loss and (on-policy distillation) the
teacher's term, as a pure function.

`actor_objective` takes the policy's logprobs and entropy of a micro-batch (from the update's forward),
that micro-batch's tensors and the objective's settings, and returns the loss to backpropagate and its
metrics; it reads no model, config or global state, so a test can work its numbers out by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from relm.algorithms.distillation import TOPK_MODES, distillation_loss, forward_kl_over_ids, token_divergences
from relm.algorithms.kl import kl_estimate
from relm.algorithms.losses import AggScale, agg_loss, compute_policy_loss
from relm.algorithms.rollout_correction import bypass_policy_loss
from relm.config.rollout_correction import RolloutCorrection
from relm.config.specs import DistillationLoss, LossParams
from relm.learner.batch import ActorForward, EngineLogprobs, OldLogprobs

Metrics = dict[str, torch.Tensor | float]


@dataclass(frozen=True)
class KLLoss:
    """verl's `use_kl_loss`: a KL penalty to the reference policy inside the actor's loss (GRPO)."""

    kind: str
    """`actor.kl_loss_type`: the estimator (`relm.algorithms.kl.kl_estimate`)."""
    coef: float
    """`actor.kl_loss_coef`."""


@dataclass(frozen=True)
class DistillationTerm:
    """verl's `distillation.distillation_loss`: the teacher's term in the actor's loss."""

    loss: DistillationLoss
    """How the per-token divergences become the term (`relm.algorithms.distillation.distillation_loss`)."""
    use_task_rewards: bool
    """The task's loss (policy loss, entropy bonus, KL loss) stays and the term is added times `coef`; else
    the term alone is the loss."""
    coef: float
    log_prob_min_clamp: float | None = None
    """`forward_kl_topk`: floor of both sides' top-k logprobs."""


@dataclass(frozen=True)
class ActorObjective:
    """The actor loss's settings (verl's `actor_rollout_ref.actor` keys of the same names)."""

    loss_mode: str
    """`policy_loss.loss_mode`: the registered policy loss (`relm.algorithms.losses`)."""
    loss_agg_mode: str
    """How per-token losses reduce to a scalar (`relm.algorithms.losses.agg_loss`)."""
    clip_ratio_low: float
    clip_ratio_high: float
    clip_ratio_c: float
    """Dual-clip bound for negative advantages."""
    entropy_coeff: float
    """Weight of the entropy bonus (0: entropy is a metric only, kept out of backward)."""
    kl_loss: KLLoss | None
    """The KL loss to the reference; absent when `use_kl_loss` is off."""
    correction: RolloutCorrection
    """`algorithm.rollout_correction`, applied in the loss when the old logprobs are the engine's."""
    params: LossParams = field(default_factory=LossParams)
    """Settings of the policy losses that read their own (`sapo`, `dro`, `clip_cov`, `kl_cov`)."""
    distillation: DistillationTerm | None = None
    """The teacher's term (`distillation.enabled`); absent without distillation."""


@dataclass(frozen=True)
class PolicyTensors:
    """A micro-batch's tensors the objective reads, all [n, R] on the forward's device."""

    loss_mask: torch.Tensor
    advantages: torch.Tensor
    old_logprobs: OldLogprobs
    ref_logprobs: torch.Tensor | None
    """Present when the run has a reference model; `ActorObjective.kl_loss` needs it."""
    rollout_is_weights: torch.Tensor | None
    """Decoupled mode's importance weights; absent when `rollout_is` is off."""
    teacher_logprobs: torch.Tensor | None = None
    """The teacher's logprobs of the sampled tokens; an estimator `ActorObjective.distillation` needs them."""
    teacher_topk_logprobs: torch.Tensor | None = None
    """[n, R, K] the teacher's logprobs of its top ids (`forward_kl_topk`)."""


def actor_objective(
    logprobs: torch.Tensor,
    entropy: torch.Tensor,
    batch: PolicyTensors,
    spec: ActorObjective,
    scale: AggScale,
    student_topk: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """Loss = policy loss - entropy_coeff * entropy + kl_coef * KL(pi || ref), each aggregated by
    `spec.loss_agg_mode` over `batch.loss_mask` with the mini-batch's counts `scale`. With distillation
    (`spec.distillation`), plus coef * the distillation term, or the distillation term alone when
    `use_task_rewards` is off (verl's `distillation_ppo_loss`).

    The policy loss's old logprobs come from `batch.old_logprobs`: an `ActorForward`'s tensor (with the
    importance weights, decoupled mode); the engine's, through `bypass_policy_loss` with `spec.correction`
    (bypass mode); or, `UpdateForward` (on-policy), `logprobs` itself, detached, so the ratio is 1.

    Args:
        logprobs: [n, R] the policy's logprobs of the responses, with gradient.
        entropy: [n, R] the policy's entropy at each response position.
        student_topk: [n, R, K] the policy's logprobs at the teacher's top ids, with gradient
            (`forward_kl_topk` only).

    Returns:
        (loss, metrics): `pg_loss`, `entropy`, the policy loss's own metrics, with a KL loss `kl_loss` and
        `kl_coef`, with distillation `distillation/loss` and the term's own (`distillation/...`).
    """
    mask = batch.loss_mask
    clips = dict(
        clip_ratio_low=spec.clip_ratio_low,
        clip_ratio_high=spec.clip_ratio_high,
        clip_ratio_c=spec.clip_ratio_c,
    )
    old = batch.old_logprobs
    old_logprobs = old.logprobs if isinstance(old, ActorForward | EngineLogprobs) else logprobs.detach()
    if isinstance(old, EngineLogprobs):
        pg_loss, pg_metrics = bypass_policy_loss(
            spec.loss_mode, spec.correction, rollout_logprobs=old.logprobs, logprobs=logprobs,
            advantages=batch.advantages, response_mask=mask, loss_agg_mode=spec.loss_agg_mode, agg_scale=scale,
            params=spec.params, **clips,
        )  # fmt: skip
    else:
        pg_loss, pg_metrics = compute_policy_loss(
            spec.loss_mode, old_logprobs=old_logprobs, logprobs=logprobs, advantages=batch.advantages,
            response_mask=mask, loss_agg_mode=spec.loss_agg_mode, agg_scale=scale,
            rollout_is_weights=batch.rollout_is_weights, params=spec.params, **clips,
        )  # fmt: skip
    entropy_loss = agg_loss(entropy, mask, spec.loss_agg_mode, scale)
    loss = pg_loss - spec.entropy_coeff * entropy_loss
    metrics: Metrics = {"pg_loss": pg_loss.detach(), "entropy": entropy_loss.detach(), **pg_metrics}
    if spec.kl_loss is not None:
        if batch.ref_logprobs is None:
            raise RuntimeError("a KL loss needs the reference's logprobs: the run builds a reference model")
        kl = kl_estimate(logprobs, batch.ref_logprobs, spec.kl_loss.kind)
        kl_loss = agg_loss(kl, mask, spec.loss_agg_mode, scale)
        loss = loss + spec.kl_loss.coef * kl_loss
        metrics.update(kl_loss=kl_loss.detach(), kl_coef=spec.kl_loss.coef)
    term = spec.distillation
    if term is not None:
        divergences, topk_metrics = _divergences(logprobs, batch, term, student_topk)
        distill, distill_metrics = distillation_loss(
            divergences, mask, term.loss, logprobs=logprobs, old_logprobs=old_logprobs,
            loss_agg_mode=spec.loss_agg_mode, scale=scale, rollout_is_weights=batch.rollout_is_weights,
        )  # fmt: skip
        loss = loss + term.coef * distill if term.use_task_rewards else distill
        metrics.update(distill_metrics)
        metrics.update(topk_metrics)
        metrics["distillation/loss"] = distill.detach()
    return loss, metrics


def _divergences(
    logprobs: torch.Tensor, batch: PolicyTensors, term: DistillationTerm, student_topk: torch.Tensor | None
) -> tuple[torch.Tensor, Metrics]:
    """[n, R] per-token divergences of the student from the teacher, and (top-k) the masses' means."""
    mode = term.loss.loss_mode
    if mode not in TOPK_MODES:
        if batch.teacher_logprobs is None:
            raise RuntimeError(
                "a distillation loss needs the teachers' logprobs: the run builds its teachers"
            )
        return token_divergences(logprobs, batch.teacher_logprobs, mode), {}
    if student_topk is None or batch.teacher_topk_logprobs is None:
        raise RuntimeError(
            "forward_kl_topk needs the teacher's top-k logprobs and the student's at those ids"
        )
    divergences, student_mass, teacher_mass = forward_kl_over_ids(
        student_topk, batch.teacher_topk_logprobs, term.log_prob_min_clamp
    )
    on = batch.loss_mask.bool()
    masses: Metrics = {}
    if on.any():
        masses = {
            "distillation/student_mass": student_mass.detach()[on].mean(),
            "distillation/teacher_mass": teacher_mass[on].mean(),
        }
    return divergences, masses
