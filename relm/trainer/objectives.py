"""The actor's and the critic's loss settings, read from the config once for the run.

The learner's objectives take these small frozen records (`relm.learner.actor_objective.ActorObjective`,
`relm.learner.critic.CriticObjective`) rather than the config's sections, so a test builds them by hand.
"""

from __future__ import annotations

from relm.config.rollout_correction import parse_rollout_correction
from relm.config.schema import RelmConfig
from relm.learner.actor_objective import ActorObjective, KLLoss
from relm.learner.critic import CriticObjective


def actor_objective_of(cfg: RelmConfig) -> ActorObjective:
    """`actor_rollout_ref.actor`'s loss keys and `algorithm.rollout_correction` as an `ActorObjective`."""
    actor = cfg.actor_rollout_ref.actor
    if actor.clip_ratio_low is None or actor.clip_ratio_high is None:
        raise RuntimeError("the config loader fills clip_ratio_low and clip_ratio_high from clip_ratio")
    return ActorObjective(
        loss_mode=actor.policy_loss.loss_mode,
        loss_agg_mode=actor.loss_agg_mode,
        clip_ratio_low=actor.clip_ratio_low,
        clip_ratio_high=actor.clip_ratio_high,
        clip_ratio_c=actor.clip_ratio_c,
        entropy_coeff=actor.entropy_coeff,
        kl_loss=KLLoss(kind=actor.kl_loss_type, coef=actor.kl_loss_coef) if actor.use_kl_loss else None,
        correction=parse_rollout_correction(cfg.algorithm.rollout_correction),
    )


def critic_objective_of(cfg: RelmConfig) -> CriticObjective:
    """`critic`'s value-loss keys as a `CriticObjective`."""
    if cfg.critic.loss_agg_mode is None:
        raise RuntimeError("the config loader fills critic.loss_agg_mode from the actor's")
    return CriticObjective(cliprange_value=cfg.critic.cliprange_value, loss_agg_mode=cfg.critic.loss_agg_mode)
