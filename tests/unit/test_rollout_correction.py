"""Rollout correction on numbers worked out by hand, and its keys' checks.

The batch: two responses, the engine's logprobs 0 so that log r = the trainer's logprob.
Response 0 has ratios r = 3, 1, 0.5; response 1 one token with r = 2, then padding holding -inf.
"""

from __future__ import annotations

import math

import pytest
import torch

from relm.algorithms.losses import compute_policy_loss, reinforce_loss
from relm.algorithms.rollout_correction import bypass_policy_loss, correct, importance_weights, rejection_mask
from relm.config.loader import load_config
from relm.config.rollout_correction import RejectionBound, parse_rollout_correction
from relm.config.schema import RolloutCorrectionConfig
from relm.config.validate import validate_config
from relm.errors import UserError

LN3, LN2, LN05 = math.log(3), math.log(2), math.log(0.5)
OLD = torch.tensor([[LN3, 0.0, LN05], [LN2, -math.inf, -math.inf]])
ROLLOUT = torch.zeros(2, 3)
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


def spec(**keys) -> object:
    return parse_rollout_correction(RolloutCorrectionConfig(**keys))


def test_token_weights_are_truncated_at_the_bound():
    weights, metrics = importance_weights(OLD - ROLLOUT, MASK, level="token", upper=2.0)
    torch.testing.assert_close(weights, torch.tensor([[2.0, 1.0, 0.5], [2.0, 0.0, 0.0]]))
    assert float(metrics["rollout_is_mean"]) == pytest.approx(5.5 / 4)
    assert float(metrics["rollout_is_ratio_fraction_high"]) == pytest.approx(1 / 4)  # only r = 3 passes 2
    assert float(metrics["rollout_is_ratio_fraction_low"]) == 0.0  # r = 0.5 is not below 1/2


def test_icepop_zeroes_the_weights_outside_its_bounds():
    weights, metrics = importance_weights(OLD - ROLLOUT, MASK, level="token", upper=2.5, lower=0.6)
    torch.testing.assert_close(weights, torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 0.0]]))
    assert float(metrics["rollout_is_oob_ratio"]) == pytest.approx(2 / 4)


def test_sequence_weights_are_the_product_on_every_token_and_normalize_per_response():
    weights, _ = importance_weights(OLD - ROLLOUT, MASK, level="sequence", upper=2.0)
    torch.testing.assert_close(weights, torch.tensor([[1.5, 1.5, 1.5], [2.0, 0.0, 0.0]]))  # 3 x 1 x 0.5
    normalized, metrics = importance_weights(
        OLD - ROLLOUT, MASK, level="sequence", upper=2.0, batch_normalize=True
    )
    torch.testing.assert_close(normalized, weights / 1.75)  # the mean of the responses' weights 1.5 and 2
    assert float(metrics["rollout_is_batch_norm_factor"]) == pytest.approx(1.75)


def test_token_k1_rejects_tokens_outside_the_ratio_bounds():
    # k1 = -log r = -1.10, 0, 0.69 | -0.69, kept within [log 0.6, log 1.6] = [-0.51, 0.47]
    kept, metrics = rejection_mask(OLD - ROLLOUT, MASK, (RejectionBound("token_k1", upper=1.6, lower=0.6),))
    torch.testing.assert_close(kept, torch.tensor([[0, 1, 0], [0, 0, 0]]))
    assert float(metrics["rollout_rs_masked_fraction"]) == pytest.approx(3 / 4)
    assert float(metrics["rollout_rs_seq_masked_fraction"]) == 1.0


@pytest.mark.parametrize(
    "bound,expected",
    [
        # k3 = r - 1 - log r: response 0's mean (0.901 + 0 + 0.193) / 3 = 0.365 > 0.35; response 1's 0.307
        (RejectionBound("seq_mean_k3", upper=0.35, lower=None), [[0, 0, 0], [1, 0, 0]]),
        # k2 = (log r)^2 / 2: response 0's max 0.604 (r = 3) > 0.5; response 1's 0.240
        (RejectionBound("seq_max_k2", upper=0.5, lower=None), [[0, 0, 0], [1, 0, 0]]),
        # k2 sums: 0.844 and 0.240, both under 1
        (RejectionBound("seq_sum_k2", upper=1.0, lower=None), [[1, 1, 1], [1, 0, 0]]),
    ],
    ids=lambda value: getattr(value, "option", ""),
)
def test_sequence_options_reject_whole_responses(bound, expected):
    kept, _ = rejection_mask(OLD - ROLLOUT, MASK, (bound,))
    torch.testing.assert_close(kept, torch.tensor(expected))


def test_gap_metrics_by_hand():
    metrics = correct(OLD, ROLLOUT, MASK, spec()).metrics
    assert float(metrics["rollout_corr/kl"]) == pytest.approx(-(LN3 + LN05 + LN2) / 4)
    assert float(metrics["rollout_corr/chi2_token"]) == pytest.approx((9 + 1 + 0.25 + 4) / 4 - 1)
    assert float(metrics["rollout_corr/chi2_seq"]) == pytest.approx((1.5**2 + 2**2) / 2 - 1)
    assert not any("rollout_is" in name or "rollout_rs" in name for name in metrics)  # only measured


def test_weights_multiply_the_policy_loss():
    logprobs = torch.tensor([[-1.0, -2.0]])
    loss, _ = compute_policy_loss(
        "vanilla", old_logprobs=logprobs, logprobs=logprobs, advantages=torch.ones(1, 2),
        response_mask=torch.ones(1, 2), clip_ratio_low=0.2, clip_ratio_high=0.2,
        rollout_is_weights=torch.tensor([[2.0, 0.5]]),
    )  # fmt: skip
    assert loss.item() == pytest.approx(-(2.0 + 0.5) / 2)  # ratio 1: -A w per token, token mean


def test_reinforce_loss_and_gradient_by_hand():
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, metrics = reinforce_loss(
        rollout_logprobs=torch.tensor([[-1.5, -2.0]]), logprobs=logprobs, advantages=torch.tensor([[1.0, -1.0]]),
        response_mask=torch.ones(1, 2), rollout_is_weights=torch.tensor([[2.0, 0.5]]),
    )  # fmt: skip
    assert loss.item() == pytest.approx((2.0 + -1.0) / 2)  # -A w log pi: 2 and -1
    (grad,) = torch.autograd.grad(loss, logprobs)
    torch.testing.assert_close(grad, torch.tensor([[-1.0, 0.25]]))  # -A w / 2
    assert float(metrics["ppo_kl"]) == pytest.approx(-0.25)


def test_bypass_ppo_clip_is_the_policy_loss_over_the_kept_tokens_without_weights():
    logprobs = OLD.clone().requires_grad_(True)
    advantages = torch.tensor([[1.0, -1.0, 0.5], [2.0, 0.0, 0.0]])
    rs = spec(bypass_mode=True, rollout_is="token", rollout_rs="token_k1", rollout_rs_threshold="0.6_1.6")
    loss, metrics = bypass_policy_loss(
        "vanilla", rs, rollout_logprobs=ROLLOUT, logprobs=logprobs, advantages=advantages, response_mask=MASK,
        clip_ratio_low=0.2, clip_ratio_high=0.2,
    )  # fmt: skip
    # Only the middle token of response 0 is kept (ratio 1): loss = -A = 1 over one token.
    assert loss.item() == pytest.approx(1.0)
    assert float(metrics["rollout_corr/rollout_rs_masked_fraction"]) == pytest.approx(3 / 4)


def test_keys_parse_to_verls_bounds():
    parsed = spec(
        rollout_is="token", rollout_is_threshold="0.5_5.0", rollout_rs="token_k1, seq_max_k2,token_k1",
        rollout_rs_threshold="1.6,2.5",
    )  # fmt: skip
    assert (parsed.is_upper, parsed.is_lower) == (5.0, 0.5)
    assert parsed.rejection == (
        RejectionBound("token_k1", upper=1.6, lower=1 / 1.6),  # one ratio bound u: 1/u to u
        RejectionBound("seq_max_k2", upper=2.5, lower=None),
    )
    assert parsed.changes_update and not spec().changes_update


@pytest.mark.parametrize(
    "keys,culprit",
    [
        ({"rollout_is": "tokens"}, "rollout_is=tokens"),
        ({"rollout_is": "token", "rollout_is_threshold": "5_0.5"}, "rollout_is_threshold=5_0.5"),
        ({"rollout_rs": "token_k4", "rollout_rs_threshold": 1.0}, "token_k4"),
        ({"rollout_rs": "seq_max_k2"}, "needs `algorithm.rollout_correction.rollout_rs_threshold`"),
        ({"rollout_rs": "seq_max_k2", "rollout_rs_threshold": "0.1_2"}, "takes one upper bound"),
        ({"rollout_rs": "token_k1,token_k2", "rollout_rs_threshold": "1,2,3"}, "one per option"),
        ({"loss_type": "ppo"}, "loss_type=ppo"),
    ],
)
def test_wrong_values_name_the_key(keys, culprit):
    with pytest.raises(UserError, match="algorithm.rollout_correction") as err:
        spec(**keys)
    assert culprit in str(err.value)


def test_the_keys_load_from_a_command_line_and_reinforce_refuses_another_loss_mode():
    cfg = load_config(
        ["algorithm.rollout_correction.rollout_is=sequence", "algorithm.rollout_correction.rollout_is_threshold=3",
         "algorithm.rollout_correction.rollout_rs=seq_mean_k1", "algorithm.rollout_correction.rollout_rs_threshold=0.9_1.1"]
    )  # fmt: skip
    section = cfg.algorithm.rollout_correction
    assert (section.rollout_is_threshold, section.rollout_rs_threshold) == (3.0, "0.9_1.1")
    with pytest.raises(UserError, match="must be a number or a string"):
        load_config(["algorithm.rollout_correction.rollout_is_threshold=true"])
    cfg = load_config(
        ["algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.loss_type=reinforce",
         "actor_rollout_ref.actor.policy_loss.loss_mode=gspo"]
    )  # fmt: skip
    with pytest.raises(UserError, match="loss_mode=gspo"):
        validate_config(cfg)


def test_older_verl_spellings_point_to_the_new_keys():
    with pytest.raises(UserError, match="loss_type=reinforce"):
        load_config(["+algorithm.rollout_correction.use_policy_gradient=true"])
    with pytest.raises(UserError, match="lower_upper"):
        load_config(["+algorithm.rollout_correction.rollout_rs_threshold_lower=0.5"])
    load_config(["+algorithm.rollout_correction.rollout_token_veto_threshold=null"])  # off: accepted
