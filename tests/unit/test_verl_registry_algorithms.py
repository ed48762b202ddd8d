"""verl 0.9.1's estimators and losses relm added under verl's names: hand-computed values, and the config keys.

tests/parity compares each with verl's own function on random batches (values and gradients); these
cases are small enough to check by hand, so `make test` covers them without verl installed.
"""

from __future__ import annotations

import math

import pytest
import torch

from relm.algorithms import ADV_ESTIMATORS, POLICY_LOSSES, compute_advantages, compute_policy_loss
from relm.config.loader import load_config
from relm.config.validate import ADV_ESTIMATORS as VALID_ESTIMATORS
from relm.config.validate import POLICY_LOSS_MODES, validate_config


def outcome(scores: list[float], groups: list[int], estimator: str, **kwargs) -> torch.Tensor:
    """Advantages of one-token responses with these scores."""
    rewards = torch.tensor(scores, dtype=torch.float64).unsqueeze(-1)
    advantages, returns = compute_advantages(
        estimator, token_rewards=rewards, response_mask=torch.ones_like(rewards),
        group_ids=torch.tensor(groups), **kwargs,
    )  # fmt: skip
    assert torch.equal(advantages, returns)
    return advantages.squeeze(-1)


def test_gpg_rescales_by_the_share_of_non_zero_scores_without_std():
    # One of four responses scored: alpha = 4 / 1; group means 0.5 and 0.
    assert outcome([1, 0, 0, 0], [0, 0, 1, 1], "gpg").tolist() == [2.0, -2.0, 0.0, 0.0]
    assert outcome([1, 0, 1, 0], [0, 0, 1, 1], "gpg").tolist() == [1.0, -1.0, 1.0, -1.0]


def test_grpo_passk_rewards_only_the_best_by_its_lead_over_the_second():
    advantages = outcome([3, 1, 2], [0, 0, 0], "grpo_passk")  # std of (3, 1, 2) is 1
    assert advantages.tolist() == pytest.approx([1 / (1 + 1e-6), 0.0, 0.0])
    assert outcome([3, 1, 2], [0, 0, 0], "grpo_passk", norm_adv_by_std_in_grpo=False).tolist() == [
        1.0,
        0.0,
        0.0,
    ]
    with pytest.raises(ValueError, match="at least 2 responses"):
        outcome([3, 1, 2], [0, 0, 1], "grpo_passk")


def test_rloo_vectorized_gives_a_group_of_one_zero_where_rloo_keeps_its_score():
    assert outcome([1, 3, 5], [0, 0, 1], "rloo").tolist() == [-2.0, 2.0, 5.0]
    assert outcome([1, 3, 5], [0, 0, 1], "rloo_vectorized").tolist() == [-2.0, 2.0, 0.0]
    assert torch.equal(
        outcome([1, 3, 5], [0, 0, 0], "grpo_vectorized"), outcome([1, 3, 5], [0, 0, 0], "grpo")
    )


def loss_and_grad(loss_mode: str, log_ratio: float, advantage: float) -> tuple[float, float, dict]:
    """One token whose old logprob is log 0.5."""
    old = torch.tensor([[math.log(0.5)]], dtype=torch.float64)
    logprobs = (old + log_ratio).requires_grad_(True)
    loss, metrics = compute_policy_loss(
        loss_mode, old_logprobs=old, logprobs=logprobs, advantages=torch.tensor([[advantage]], dtype=torch.float64),
        response_mask=torch.ones(1, 1), clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0,
    )  # fmt: skip
    (grad,) = torch.autograd.grad(loss, logprobs)
    return float(loss.detach()), float(grad), metrics


def test_gpg_and_cispo_losses():
    loss, grad, metrics = loss_and_grad("gpg", 0.1, 2.0)
    assert (loss, grad, metrics) == (pytest.approx(-2.0 * (math.log(0.5) + 0.1)), pytest.approx(-2.0), {})
    # CISPO: the ratio e^1 is clipped to 1.28, which stays as a detached weight, so the token keeps a gradient.
    loss, grad, metrics = loss_and_grad("cispo", 1.0, 2.0)
    assert grad == pytest.approx(-1.28 * 2.0) and float(metrics["pg_clipfrac"]) == 1.0


def test_geo_mean_clips_the_log_ratio_the_pessimistic_way():
    loss, grad, _ = loss_and_grad("geo_mean", 0.1, 1.0)  # inside [-0.2, 0.28]
    assert (loss, grad) == (pytest.approx(-math.exp(0.1), rel=1e-6), pytest.approx(-math.exp(0.1), rel=1e-6))
    loss, grad, metrics = loss_and_grad("geo_mean", 1.0, 1.0)  # clipped at 0.28 for A > 0: no gradient
    assert (loss, grad) == (pytest.approx(-math.exp(0.28), rel=1e-6), 0.0)
    assert float(metrics["pg_clipfrac"]) == 1.0


@pytest.mark.parametrize("loss_mode", ["dppo_tv", "dppo_kl"])
def test_dppo_drops_tokens_that_moved_too_far_in_the_advantages_direction(loss_mode):
    # 0.5 -> 0.55 (a small move): kept, weight sg[ratio] = 1.1.
    _, grad, metrics = loss_and_grad(loss_mode, math.log(1.1), 1.0)
    assert grad == pytest.approx(-1.1) and float(metrics["pg_clipfrac"]) == 0.0
    # 0.5 -> 0.95 with A > 0: dropped; the same move with A < 0 pushes the probability back: kept.
    _, grad, metrics = loss_and_grad(loss_mode, math.log(1.9), 1.0)
    assert grad == 0.0 and float(metrics["pg_clipfrac"]) == 1.0
    _, grad, _ = loss_and_grad(loss_mode, math.log(1.9), -1.0)
    assert grad == pytest.approx(1.9)


def test_the_config_accepts_verls_names_and_each_has_a_function():
    assert set(VALID_ESTIMATORS) <= set(ADV_ESTIMATORS)
    assert set(POLICY_LOSS_MODES) <= set(POLICY_LOSSES)
    for key, value in [
        ("actor_rollout_ref.actor.policy_loss.loss_mode", "cispo"),
        ("algorithm.adv_estimator", "gpg"),
    ]:
        validate_config(load_config([f"{key}={value}", "actor_rollout_ref.rollout.n=8"]))
