"""Pure tensor functions of the PPO family: masked reductions, advantages, losses, KL."""

from relm.algorithms.advantages import (
    ADV_ESTIMATORS,
    ESTIMATOR_NEEDS,
    EstimatorNeeds,
    compute_advantages,
    compute_gae,
    compute_grpo_outcome,
    compute_opo,
    compute_reinforce_plus_plus,
    compute_reinforce_plus_plus_baseline,
    compute_remax,
    compute_rloo,
    estimator_needs,
    register_adv_estimator,
)
from relm.algorithms.group_variants import compute_gpg_outcome, compute_grpo_passk_outcome
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
    LossParams,
    agg_loss,
    compute_entropy_loss,
    compute_policy_loss,
    compute_value_loss,
    register_policy_loss,
)
from relm.algorithms.masked import masked_mean, masked_sum, masked_var, masked_whiten
from relm.algorithms.optimal_token_baseline import (
    compute_optimal_token_baseline,
    compute_tir_optimal_token_baseline,
)
from relm.algorithms.pg_params import clip_cov_loss, dro_loss, kl_cov_loss, sapo_loss
from relm.algorithms.pg_variants import cispo_loss, dppo_kl_loss, dppo_tv_loss, geo_mean_loss, gpg_loss
from relm.algorithms.rollout_correction import bypass_mode_loss

__all__ = [
    "bypass_mode_loss",
    "clip_cov_loss",
    "dro_loss",
    "kl_cov_loss",
    "sapo_loss",
    "cispo_loss",
    "compute_gpg_outcome",
    "compute_grpo_passk_outcome",
    "compute_optimal_token_baseline",
    "compute_tir_optimal_token_baseline",
    "dppo_kl_loss",
    "dppo_tv_loss",
    "geo_mean_loss",
    "gpg_loss",
    "ADV_ESTIMATORS",
    "AGG_MODES",
    "ESTIMATOR_NEEDS",
    "EstimatorNeeds",
    "KL_KINDS",
    "LossParams",
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
    "estimator_needs",
    "register_adv_estimator",
    "register_policy_loss",
]
