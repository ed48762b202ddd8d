"""verl 0.9.1's estimators and losses relm added under verl's names: hand-computed values, and the config keys.

tests/parity compares each with verl's own function on random batches (values and gradients); these
cases are small enough to check by hand, so `make test` covers them without verl installed.
"""

from __future__ import annotations

import math

import pytest
import torch

from relm.algorithms import ADV_ESTIMATORS, POLICY_LOSSES, LossParams, compute_advantages, compute_policy_loss
from relm.config.loader import load_config
from relm.config.validate import ADV_ESTIMATORS as VALID_ESTIMATORS
from relm.config.validate import POLICY_LOSS_MODES, validate_config
from relm.errors import UserError


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


def test_gdpo_normalises_each_reward_in_its_group_before_the_sum():
    # Two groups of two one-token responses. Reward a: (1, 0 | 5, 5); reward b: (0, 3 | 2, 0).
    # GRPO per reward (std of two values d apart is d / sqrt 2): a -> (+-1/sqrt2 | 0, 0), b -> (-+1/sqrt2 | +-1/sqrt2)
    # (less eps). With weights (1, 1): (0, 0, 1/sqrt2, -1/sqrt2), then whitened over the four tokens.
    components = torch.tensor([[1.0, 0.0, 5.0, 5.0], [0.0, 3.0, 2.0, 0.0]], dtype=torch.float64)
    mask = torch.ones(4, 1)
    advantages, _ = compute_advantages(
        "gdpo", token_rewards=torch.zeros(4, 1), response_mask=mask, group_ids=torch.tensor([0, 0, 1, 1]),
        score_components=components,
    )  # fmt: skip
    summed = torch.tensor([0.0, 0.0, 1.0, -1.0], dtype=torch.float64) / math.sqrt(2)
    expected = (summed - summed.mean()) / (summed.var() + 1e-8).sqrt()  # relm's whitening: unbiased variance
    torch.testing.assert_close(advantages.squeeze(-1), expected, atol=1e-5, rtol=1e-5)
    # A weight of 0 on reward b leaves reward a alone: the second group, all equal, gets 0 before whitening.
    weighted, _ = compute_advantages(
        "gdpo", token_rewards=torch.zeros(4, 1), response_mask=mask, group_ids=torch.tensor([0, 0, 1, 1]),
        score_components=components, score_weights=torch.tensor([1.0, 0.0], dtype=torch.float64),
    )  # fmt: skip
    assert weighted[0, 0] > 0 > weighted[1, 0] and weighted[2, 0] == weighted[3, 0]


def test_sapo_gate_gives_ppos_gradient_at_ratio_one_and_fades_off_policy():
    # f(r) = sigmoid(tau (r - 1)) * 4 / tau: f(1) = 2 / tau, f'(1) = 1, so d(-A f(r)) / d log pi = -A r f'(r) = -A.
    loss, grad, metrics = loss_and_grad("sapo", 0.0, 2.0)
    assert (loss, grad) == (pytest.approx(-2.0 * 2.0 / 1.0), pytest.approx(-2.0))
    assert float(metrics["pg_clipfrac"]) == 0.0
    # A < 0 uses tau_neg = 1.05; far off-policy (r = e^3) the gradient is nearly gone.
    _, grad_far, _ = loss_and_grad("sapo", 3.0, -1.0)
    ratio = math.exp(3.0)
    gate = 1 / (1 + math.exp(-1.05 * (ratio - 1)))
    assert grad_far == pytest.approx(ratio * 4 * gate * (1 - gate), rel=1e-6) and grad_far < 1e-6


def test_dro_penalises_the_squared_log_ratio():
    old = torch.tensor([[math.log(0.5)]], dtype=torch.float64)
    logprobs = (old + 0.3).requires_grad_(True)
    loss, metrics = compute_policy_loss(
        "dro", old_logprobs=old, logprobs=logprobs, advantages=torch.tensor([[2.0]], dtype=torch.float64),
        response_mask=torch.ones(1, 1), clip_ratio_low=0.2, clip_ratio_high=0.28, params=LossParams(dro_beta=0.5),
    )  # fmt: skip
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert float(loss.detach()) == pytest.approx(-(2.0 * (math.log(0.5) + 0.3) - 0.25 * 0.09))
    assert float(grad) == pytest.approx(-2.0 + 0.5 * 0.3)
    assert float(metrics["ppo_kl"]) == pytest.approx(-0.3)


def test_kl_cov_penalises_only_the_top_covariance_token():
    # Advantages and logprobs both largest at token 1: its covariance is the largest, so it alone (one token of
    # four at kl_cov_ratio 0.25) gets coef * |log ratio| = 1.0 * 0.5 added.
    old = torch.zeros(1, 4, dtype=torch.float64)
    logprobs = torch.tensor([[-2.0, 0.5, -1.0, -1.5]], dtype=torch.float64)
    advantages = torch.tensor([[-1.0, 2.0, 0.0, -1.0]], dtype=torch.float64)
    common = dict(old_logprobs=old, logprobs=logprobs, advantages=advantages, response_mask=torch.ones(1, 4),
                  clip_ratio_low=0.2, clip_ratio_high=0.28)  # fmt: skip
    plain = (-advantages * logprobs.exp()).mean()
    loss, _ = compute_policy_loss("kl_cov", **common, params=LossParams(kl_cov_ratio=0.25, ppo_kl_coef=1.0))
    assert float(loss) == pytest.approx(float(plain) + 0.5 / 4)


def test_clip_cov_takes_a_drawn_candidate_out_of_the_gradient():
    # Covariances (A - 0)(log pi + 1.2625): 0, 3.79, -0.21, 3.48; token 3 (A < 0, ratio e^-2) is clipped, so
    # token 1 alone is a candidate in (lb, ub) = (1, 5): it is the one taken out.
    old = torch.tensor([[-1.0, -1.0, -1.0, -1.0]], dtype=torch.float64)
    logprobs = torch.tensor([[-1.0, 0.0, -1.05, -3.0]], dtype=torch.float64).requires_grad_(True)
    advantages = torch.tensor([[0.0, 3.0, -1.0, -2.0]], dtype=torch.float64)
    loss, metrics = compute_policy_loss(
        "clip_cov", old_logprobs=old, logprobs=logprobs, advantages=advantages, response_mask=torch.ones(1, 4),
        clip_ratio_low=0.2, clip_ratio_high=10.0, params=LossParams(clip_cov_ratio=0.25),
    )  # fmt: skip
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert grad[0, 1] == 0.0 and grad[0, 2] != 0.0 and float(metrics["pg_clipfrac"]) == 0.25


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["actor_rollout_ref.actor.policy_loss.loss_mode=dro"],
            r"`actor_rollout_ref\.actor\.policy_loss\.dro_beta=null`",
        ),
        (
            ["actor_rollout_ref.actor.policy_loss.loss_mode=sapo", "actor_rollout_ref.actor.tau_neg=0"],
            r"tau_neg=0",
        ),
        (
            [
                "actor_rollout_ref.actor.policy_loss.loss_mode=kl_cov",
                "actor_rollout_ref.actor.policy_loss.kl_cov_ratio=0",
            ],
            r"kl_cov_ratio=0",
        ),
        (["algorithm.adv_estimator=gdpo"], r"gdpo_reward_keys=\[key1,key2\]"),
        (
            [
                "algorithm.adv_estimator=gdpo",
                "+algorithm.gdpo_reward_keys=[a,b]",
                "+algorithm.gdpo_reward_weights=[1.0]",
            ],
            r"1 entries for 2",
        ),
    ],
)
def test_the_settings_a_loss_or_gdpo_reads_are_checked_with_one_line(overrides, message):
    with pytest.raises(UserError, match=message):
        validate_config(load_config([*overrides, "actor_rollout_ref.rollout.n=8"]))


def test_the_new_losses_and_gdpo_pass_the_config_check_with_their_keys():
    for overrides in (
        [
            "actor_rollout_ref.actor.policy_loss.loss_mode=dro",
            "actor_rollout_ref.actor.policy_loss.dro_beta=0.1",
        ],
        ["actor_rollout_ref.actor.policy_loss.loss_mode=sapo", "actor_rollout_ref.actor.tau_pos=2.0"],
        ["actor_rollout_ref.actor.policy_loss.loss_mode=clip_cov"],
        ["actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode"],
        [
            "algorithm.adv_estimator=gdpo",
            "+algorithm.gdpo_reward_keys=[a,b]",
            "+algorithm.gdpo_reward_weights=[1.0,2.0]",
        ],
    ):
        validate_config(load_config([*overrides, "actor_rollout_ref.rollout.n=8"]))


@pytest.mark.parametrize("name", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_the_optimal_token_baselines_pass_the_check_and_refuse_bypass_mode_in_one_line(name):
    validate_config(load_config([f"algorithm.adv_estimator={name}", "actor_rollout_ref.rollout.n=8"]))
    # verl 0.9.1's example sets calculate_sum_pi_squared; relm computes it for these estimators either way.
    validate_config(
        load_config(
            [f"algorithm.adv_estimator={name}", "actor_rollout_ref.actor.calculate_sum_pi_squared=true"]
        )
    )
    with pytest.raises(UserError) as err:
        validate_config(
            load_config([f"algorithm.adv_estimator={name}", "algorithm.rollout_correction.bypass_mode=true"])
        )
    assert str(err.value) == (
        f"`algorithm.adv_estimator={name}` reads each token's sum of squared probabilities from the actor's "
        "old-logprob forward, which `algorithm.rollout_correction.bypass_mode=true` skips (verl stops there too): "
        "set bypass_mode=false (decoupled mode) or choose another estimator"
    )
