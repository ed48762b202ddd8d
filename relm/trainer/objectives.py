"""The actor's and the critic's loss settings, from the run's specs (translated once from the config).

The learner's objectives take these small frozen records (`relm.learner.actor_objective.ActorObjective`,
`relm.learner.critic.CriticObjective`) rather than the config's sections, so a test builds them by hand.
"""

from __future__ import annotations

from relm.config.specs import RunSpec
from relm.learner.actor_objective import ActorObjective, DistillationTerm, KLLoss
from relm.learner.critic import CriticObjective


def actor_objective_of(spec: RunSpec) -> ActorObjective:
    """`actor_rollout_ref.actor`'s loss keys, `algorithm.rollout_correction` and `distillation.distillation_loss`
    as an `ActorObjective`."""
    loss = spec.actor_loss
    return ActorObjective(
        loss_mode=loss.loss_mode,
        loss_agg_mode=spec.actor.update.loss_agg_mode,
        clip_ratio_low=loss.clip_ratio_low,
        clip_ratio_high=loss.clip_ratio_high,
        clip_ratio_c=loss.clip_ratio_c,
        entropy_coeff=loss.entropy_coeff,
        kl_loss=KLLoss(kind=loss.kl_loss_type, coef=loss.kl_loss_coef) if loss.use_kl_loss else None,
        correction=spec.algorithm.rollout_correction,  # parsed once, by relm.config.translate
        params=loss.params,
        distillation=DistillationTerm(
            loss=spec.distillation.loss,
            use_task_rewards=spec.distillation.use_task_rewards,
            coef=spec.distillation.coef,
            log_prob_min_clamp=spec.distillation.log_prob_min_clamp,
        )
        if spec.distillation.enabled
        else None,
    )


def critic_objective_of(spec: RunSpec) -> CriticObjective:
    """`critic`'s value-loss keys as a `CriticObjective`."""
    return CriticObjective(
        cliprange_value=spec.critic_loss.cliprange_value, loss_agg_mode=spec.critic.update.loss_agg_mode
    )
