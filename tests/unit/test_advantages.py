"""Masked reductions and advantage estimators against numbers worked out by hand."""

from __future__ import annotations

import pytest
import torch

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
    register_adv_estimator,
)
from relm.algorithms.masked import masked_mean, masked_sum, masked_var, masked_whiten

INF, NAN = float("inf"), float("nan")


def t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def close(actual: torch.Tensor, expected: list | float, atol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# --- masked reductions -------------------------------------------------------------------------

# Valid entries 1, 2 | 3; padding holds 100, inf and nan, which must never show up.
X = t([[1.0, 2.0, 100.0], [3.0, INF, NAN]])
M = torch.tensor([[1, 1, 0], [1, 0, 0]])


def test_masked_sum_and_mean_ignore_padding_even_inf_and_nan():
    close(masked_sum(X, M), 6.0)  # 1 + 2 + 3
    close(masked_sum(X, M, dim=-1), [3.0, 3.0])  # 1 + 2 | 3
    close(masked_mean(X, M), 2.0)  # 6 / 3
    close(masked_mean(X, M, dim=-1), [1.5, 3.0])  # 3 / 2 | 3 / 1
    close(masked_mean(X, M.float()), 2.0)  # a float mask means the same


def test_masked_mean_of_nothing_is_zero_not_nan():
    close(masked_mean(X, torch.zeros_like(M)), 0.0)
    close(masked_mean(X, torch.tensor([[1, 0, 0], [0, 0, 0]]), dim=-1), [1.0, 0.0])


def test_masked_var_unbiased_and_biased():
    # values 1, 2, 3: mean 2, squared deviations 1 + 0 + 1 = 2; unbiased 2 / 2 = 1, biased 2 / 3.
    close(masked_var(X, M), 1.0)
    close(masked_var(X, M, unbiased=False), 2.0 / 3.0)
    # One valid value: no spread to measure; 0 rather than NaN.
    close(masked_var(X, torch.tensor([[1, 0, 0], [0, 0, 0]])), 0.0)


def test_masked_whiten():
    # (x - 2) / sqrt(1 + 1e-8): 1 -> -1, 2 -> 0, 3 -> 1; padding -> 0.
    close(masked_whiten(X, M), [[-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    # shift_mean=False adds the mean 2 back: -1 + 2, 0 + 2, 1 + 2.
    close(masked_whiten(X, M, shift_mean=False), [[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]])


# --- GAE ---------------------------------------------------------------------------------------

# Row 0: three tokens, reward 1 on the last; row 1: two tokens, reward -1 on the last.
# Position 3 of row 0 and 2..3 of row 1 are padding holding junk that must not leak.
GAE_REWARDS = t([[0.0, 0.0, 1.0, 5.0], [0.0, -1.0, 7.0, 7.0]])
GAE_VALUES = t([[0.5, 0.4, 0.6, 9.0], [0.2, -0.3, 9.0, 9.0]])
GAE_MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
# gamma = 0.9, lam = 0.8, so gamma * lam = 0.72. Value after the last token is 0.
# Row 0, backwards:
#   t=2: delta = 1 + 0.9*0   - 0.6 =  0.4    A2 = 0.4
#   t=1: delta = 0 + 0.9*0.6 - 0.4 =  0.14   A1 = 0.14 + 0.72*0.4   =  0.428
#   t=0: delta = 0 + 0.9*0.4 - 0.5 = -0.14   A0 = -0.14 + 0.72*0.428 = 0.16816
#   returns = A + V = 0.66816, 0.828, 1.0
# Row 1:
#   t=1: delta = -1 + 0          - (-0.3) = -0.7   A1 = -0.7
#   t=0: delta =  0 + 0.9*(-0.3) - 0.2    = -0.47  A0 = -0.47 + 0.72*(-0.7) = -0.974
#   returns = -0.774, -1.0
GAE_RAW = [0.16816, 0.428, 0.4, -0.974, -0.7]


def test_gae_hand_worked():
    adv, ret = compute_gae(GAE_REWARDS, GAE_VALUES, GAE_MASK, gamma=0.9, lam=0.8)
    close(ret, [[0.66816, 0.828, 1.0, 0.0], [-0.774, -1.0, 0.0, 0.0]])
    # Whitened over the 5 valid tokens: mean = (0.16816 + 0.428 + 0.4 - 0.974 - 0.7) / 5 = -0.135568.
    raw = torch.tensor(GAE_RAW)
    white = ((raw - (-0.135568)) / raw.std()).tolist()
    close(adv, [white[:3] + [0.0], white[3:] + [0.0, 0.0]], atol=1e-4)


def test_gae_skips_a_masked_token_inside_the_response():
    # Row [valid, masked observation, valid] behaves like the two-token row [0.5 -> 0.6, reward 1]:
    #   t=2: A = 1 - 0.6 = 0.4; t=1 masked: A and V_next pass through unchanged (0.4, 0.6)
    #   t=0: delta = 0 + 0.9*0.6 - 0.5 = 0.04, A0 = 0.04 + 0.72*0.4 = 0.328; returns 0.828, 1.0.
    rewards, values = t([[0.0, 7.0, 1.0]]), t([[0.5, 9.0, 0.6]])
    _, ret = compute_gae(rewards, values, torch.tensor([[1, 0, 1]]), gamma=0.9, lam=0.8)
    close(ret, [[0.828, 0.0, 1.0]])


def test_gae_lambda_one_returns_are_monte_carlo_returns():
    # With gamma = lam = 1 the value terms telescope: A_t + V_t = sum of rewards from t on.
    rewards = t([[0.5, 0.0, 2.0], [1.0, 3.0, 0.0]])
    values = t([[0.3, -1.0, 4.0], [2.0, 0.1, 0.0]])
    _, ret = compute_gae(rewards, values, torch.tensor([[1, 1, 1], [1, 1, 0]]), gamma=1.0, lam=1.0)
    close(ret, [[2.5, 2.0, 2.0], [4.0, 3.0, 0.0]])


# --- outcome estimators ------------------------------------------------------------------------

# Scores 1 (reward split 0.5 + 0.5), 0, 0 in group 7 and 2 alone in group 3; padding holds junk.
OUT_REWARDS = t([[0.5, 0.5, 9.0], [0.0, 0.0, 9.0], [0.0, 0.0, 0.0], [0.0, 2.0, 9.0]])
OUT_MASK = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 1], [1, 1, 0]])
OUT_GROUPS = torch.tensor([7, 7, 7, 3])


def per_token(row_values: list[float], mask: torch.Tensor = OUT_MASK) -> torch.Tensor:
    return torch.tensor(row_values).unsqueeze(-1) * mask


def test_grpo_hand_worked():
    # Group 7: scores 1, 0, 0; mean 1/3; unbiased std = sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3).
    #   (2/3) / sqrt(1/3) = 1.154701, (-1/3) / sqrt(1/3) = -0.577350.
    # Group 3 has one response: mean 0, std 1, so its advantage is its score 2 / (1 + 1e-6).
    adv, ret = compute_grpo_outcome(OUT_REWARDS, OUT_MASK, OUT_GROUPS)
    close(adv, per_token([1.154701, -0.577350, -0.577350, 2.0]))
    assert torch.equal(adv, ret)


def test_dr_grpo_does_not_divide_by_std():
    # score - group mean: 1 - 1/3, 0 - 1/3, 0 - 1/3; the lone response keeps 2.
    adv, _ = compute_grpo_outcome(OUT_REWARDS, OUT_MASK, OUT_GROUPS, norm_by_std=False)
    close(adv, per_token([2 / 3, -1 / 3, -1 / 3, 2.0]))


def test_grpo_group_of_equal_scores_gets_zero_advantage():
    adv, _ = compute_grpo_outcome(t([[0.0, 1.0], [1.0, 0.0], [0.5, 0.5]]), torch.ones(3, 2), torch.zeros(3))
    close(adv, torch.zeros(3, 2).tolist())


def test_rloo_hand_worked():
    # Group 7, baseline = mean of the others: 1 - (0 + 0)/2 = 1, 0 - (1 + 0)/2 = -0.5 (twice).
    # Group 3 has nobody else: baseline 0, advantage 2.
    adv, ret = compute_rloo(OUT_REWARDS, OUT_MASK, OUT_GROUPS)
    close(adv, per_token([1.0, -0.5, -0.5, 2.0]))
    assert torch.equal(adv, ret)


def test_opo_hand_worked():
    # Group 7: lengths 2, 2, 3 and scores 1, 0, 0: baseline = (2*1 + 2*0 + 3*0) / 7 = 2/7.
    #   1 - 2/7 = 5/7, 0 - 2/7 = -2/7 (twice). Group 3 alone: baseline 0, advantage 2.
    adv, ret = compute_opo(OUT_REWARDS, OUT_MASK, OUT_GROUPS)
    close(adv, per_token([5 / 7, -2 / 7, -2 / 7, 2.0]))
    assert torch.equal(adv, ret)


def test_reinforce_plus_plus_hand_worked():
    # gamma = 0.5. Row 0 rewards 1, 0, 2: G2 = 2, G1 = 0 + 0.5*2 = 1, G0 = 1 + 0.5*1 = 1.5.
    # Row 1 rewards 0, 4 (then padding): G1 = 4, G0 = 0 + 0.5*4 = 2.
    # Whiten 1.5, 1, 2, 2, 4: mean 10.5/5 = 2.1; deviations -0.6, -1.1, -0.1, -0.1, 1.9;
    # squares sum 0.36 + 1.21 + 0.01 + 0.01 + 3.61 = 5.2; unbiased var 5.2/4 = 1.3, std 1.140175.
    rewards, mask = t([[1.0, 0.0, 2.0], [0.0, 4.0, 8.0]]), torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = compute_reinforce_plus_plus(rewards, mask, gamma=0.5)
    close(ret, [[1.5, 1.0, 2.0], [2.0, 4.0, 0.0]])
    close(adv, [[-0.526235, -0.964764, -0.087706], [-0.087706, 1.666411, 0.0]])


def test_reinforce_plus_plus_baseline_hand_worked():
    # Groups {0, 1} with scores 1, 0 -> 0.5, -0.5; group {2, 3} with scores 3, 3 -> 0, 0.
    # Tokens (lengths 2, 1, 1, 2): 0.5, 0.5, -0.5, 0, 0, 0; mean 0.5/6 = 1/12.
    # Deviations 5/12 (x2), -7/12, -1/12 (x3); squares (50 + 49 + 3)/144 = 102/144; /5 -> var 0.141667,
    # std 0.376386: 5/12 / std = 1.107019, -7/12 / std = -1.549826, -1/12 / std = -0.221404.
    rewards = t([[0.0, 1.0, 9.0], [0.0, 9.0, 9.0], [3.0, 9.0, 9.0], [1.0, 2.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 0, 0], [1, 1, 0]])
    adv, ret = compute_reinforce_plus_plus_baseline(rewards, mask, torch.tensor([0, 0, 1, 1]))
    a, b, c = 1.107019, -1.549826, -0.221404
    close(adv, [[a, a, 0.0], [b, 0.0, 0.0], [c, 0.0, 0.0], [c, c, 0.0]])
    assert torch.equal(adv, ret)


def test_remax_hand_worked():
    # Row 0 rewards 0, 1, 2: returns-to-go 3, 3, 2; greedy baseline 2 -> 1, 1, 0.
    # Row 1 rewards 1, 0 (then padding): returns-to-go 1, 0; baseline 0.5 -> 0.5, -0.5.
    rewards, mask = t([[0.0, 1.0, 2.0], [1.0, 0.0, 6.0]]), torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = compute_remax(rewards, mask, torch.tensor([2.0, 0.5]))
    close(ret, [[3.0, 3.0, 2.0], [1.0, 0.0, 0.0]])
    close(adv, [[1.0, 1.0, 0.0], [0.5, -0.5, 0.0]])


# --- properties every estimator shares ---------------------------------------------------------


def _inputs(rewards: torch.Tensor, values: torch.Tensor) -> dict:
    return dict(
        token_rewards=rewards,
        response_mask=GAE_MASK,
        values=values,
        group_ids=torch.tensor([0, 0]),
        gamma=0.9,
        lam=0.8,
        baseline_scores=torch.tensor([0.3, -0.2]),
        score_components=torch.tensor([[1.0, 0.0], [0.2, 0.7]]),
        # The optimal token baselines' inputs, NaN in the padding where `values` is.
        old_logprobs=-values.abs(),
        sum_pi_squared=values.abs() / 10,
    )


@pytest.mark.parametrize("name", sorted(ADV_ESTIMATORS))
def test_padding_neither_leaks_in_nor_out(name):
    adv, ret = compute_advantages(name, **_inputs(GAE_REWARDS, GAE_VALUES))
    junk = GAE_MASK == 0
    adv2, ret2 = compute_advantages(
        name, **_inputs(GAE_REWARDS.masked_fill(junk, -INF), GAE_VALUES.masked_fill(junk, NAN))
    )
    torch.testing.assert_close(adv, adv2)
    torch.testing.assert_close(ret, ret2)
    assert not adv[junk].any() and not ret[junk].any()


def test_compute_advantages_dispatches_and_maps_config_names():
    kwargs = dict(token_rewards=OUT_REWARDS, response_mask=OUT_MASK, group_ids=OUT_GROUPS)
    adv, _ = compute_advantages("grpo", **kwargs, norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(adv, compute_grpo_outcome(OUT_REWARDS, OUT_MASK, OUT_GROUPS, False)[0])


def test_estimators_declare_what_the_run_builds_for_them():
    """Read from each estimator's required inputs: only gae asks for a critic, only remax for a greedy baseline."""
    needs = {name: ESTIMATOR_NEEDS[name] for name in ADV_ESTIMATORS}
    assert {name for name, need in needs.items() if need.critic} == {"gae"}
    assert {name for name, need in needs.items() if need.greedy_baseline} == {"remax"}
    assert {name for name, need in needs.items() if need.score_components} == {"gdpo"}
    assert {name for name, need in needs.items() if need.sum_pi_squared} == {
        "optimal_token_baseline",
        "tir_optimal_token_baseline",
    }
    assert not any(need.reference for need in needs.values())


def test_compute_advantages_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"'nope'.*gae.*grpo"):
        compute_advantages("nope", token_rewards=OUT_REWARDS, response_mask=OUT_MASK)
    with pytest.raises(ValueError, match=r"'gae' needs `values`"):
        compute_advantages("gae", token_rewards=OUT_REWARDS, response_mask=OUT_MASK)
    with pytest.raises(ValueError, match=r"'grpo' needs `group_ids`"):
        compute_advantages("grpo", token_rewards=OUT_REWARDS, response_mask=OUT_MASK)
    with pytest.raises(ValueError, match=r"'remax' needs `baseline_scores`"):
        compute_advantages("remax", token_rewards=OUT_REWARDS, response_mask=OUT_MASK)


def test_user_registered_estimator_is_dispatched():
    @register_adv_estimator("test_sign")
    def sign_of_score(token_rewards, response_mask, scale: float = 2.0):
        adv = scale * (token_rewards * response_mask).sum(-1).sign().unsqueeze(-1) * response_mask
        return adv, adv

    @register_adv_estimator("test_ref", needs_reference=True)
    def with_values(token_rewards, response_mask, values):
        return values, values

    try:
        assert ESTIMATOR_NEEDS["test_sign"] == EstimatorNeeds()
        assert ESTIMATOR_NEEDS["test_ref"] == EstimatorNeeds(critic=True, reference=True)
        adv, _ = compute_advantages("test_sign", token_rewards=OUT_REWARDS, response_mask=OUT_MASK)
        close(adv, per_token([2.0, 0.0, 0.0, 2.0]))
        with pytest.raises(ValueError, match="already registered"):
            register_adv_estimator("test_sign")(lambda token_rewards: None)
        with pytest.raises(ValueError, match="'temperature' needs a default"):
            register_adv_estimator("test_bad")(lambda token_rewards, temperature: None)
    finally:
        for name in ("test_sign", "test_ref"):
            ADV_ESTIMATORS.pop(name, None)
            ESTIMATOR_NEEDS.pop(name, None)
    assert "test_bad" not in ADV_ESTIMATORS
