"""Pure tensor functions of the PPO family: masked reductions, advantages, losses, KL."""

from relm.algorithms.advantages import (
    ADV_ESTIMATORS,
    ESTIMATORS_WITH_CRITIC,
    compute_advantages,
    compute_gae,
    compute_grpo_outcome,
    compute_opo,
    compute_reinforce_plus_plus,
    compute_reinforce_plus_plus_baseline,
    compute_remax,
    compute_rloo,
    register_adv_estimator,
)
from relm.algorithms.kl import (
    KL_KINDS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_estimate,
    make_kl_controller,
)
from relm.algorithms.losses import (
    AGG_MODES,
    POLICY_LOSSES,
    agg_loss,
    compute_entropy_loss,
    compute_policy_loss,
    compute_value_loss,
    register_policy_loss,
)
from relm.algorithms.masked import masked_mean, masked_sum, masked_var, masked_whiten

__all__ = [
    "ADV_ESTIMATORS",
    "AGG_MODES",
    "ESTIMATORS_WITH_CRITIC",
    "KL_KINDS",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "FixedKLController",
    "agg_loss",
    "apply_kl_penalty",
    "compute_advantages",
    "compute_entropy_loss",
    "compute_gae",
    "compute_grpo_outcome",
    "compute_opo",
    "compute_policy_loss",
    "compute_reinforce_plus_plus",
    "compute_reinforce_plus_plus_baseline",
    "compute_remax",
    "compute_rloo",
    "compute_value_loss",
    "kl_estimate",
    "make_kl_controller",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "register_adv_estimator",
    "register_policy_loss",
]
