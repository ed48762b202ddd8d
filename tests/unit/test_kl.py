"""KL estimators, KL controllers and the in-reward KL penalty against hand-worked numbers."""

from __future__ import annotations

import math

import pytest
import torch

from relm.algorithms.kl import (
    KL_KINDS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_estimate,
    make_kl_controller,
)


def t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def close(actual: torch.Tensor, expected: list | float, atol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# log pi = -1, -2; log pi_ref = -1.5, -1; so log pi - log pi_ref = 0.5, -1.
LOGP, REF = t([[-1.0, -2.0]]), t([[-1.5, -1.0]])


@pytest.mark.parametrize(
    ("kinds", "expected"),
    [
        (("kl", "k1"), [[0.5, -1.0]]),
        (("abs",), [[0.5, 1.0]]),
        (("mse", "k2"), [[0.125, 0.5]]),  # 0.5 * 0.25, 0.5 * 1
        # log r = ref - logp = -0.5, 1: e^-0.5 + 0.5 - 1 = 0.106531; e^1 - 1 - 1 = 0.718282.
        (("low_var_kl", "k3"), [[math.exp(-0.5) - 0.5, math.e - 2.0]]),
    ],
)
def test_kl_estimators_hand_worked(kinds, expected):
    for kind in kinds:
        close(kl_estimate(LOGP, REF, kind), expected)


def test_straight_through_kinds_keep_the_value_and_take_the_k2_gradient():
    # k3+ at d = 0.5, -1: the value is k3's; the gradient is k2's, d/dlogp 0.5 d^2 = d = 0.5, -1
    # (k3's own would be 1 - e^-d = 0.393469, -1.718282).
    logprobs = LOGP.clone().requires_grad_(True)
    value = kl_estimate(logprobs, REF, "k3+")
    close(value.detach(), [[math.exp(-0.5) - 0.5, math.e - 2.0]])
    (grad,) = torch.autograd.grad(value.sum(), logprobs)
    close(grad, [[0.5, -1.0]])
    for kind in ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"):
        assert kind + "+" in KL_KINDS
        close(kl_estimate(LOGP, REF, kind + "+"), kl_estimate(LOGP, REF, kind))
    with pytest.raises(ValueError, match="'k4\\+'"):
        kl_estimate(LOGP, REF, "k4+")


def test_low_var_kl_is_clamped():
    # log r = 30 would give e^20 - 21 after the inner clamp; the outer clamp caps it at 10.
    close(kl_estimate(t([[-30.0]]), t([[0.0]]), "low_var_kl"), [[10.0]])


def test_unknown_kl_kind_lists_the_kinds():
    with pytest.raises(ValueError, match="'k4'.*low_var_kl"):
        kl_estimate(LOGP, REF, "k4")
    assert "k3" in KL_KINDS


def test_fixed_controller_never_moves():
    ctrl = make_kl_controller("fixed", kl_coef=0.05, target_kl=0.1, horizon=100)
    assert isinstance(ctrl, FixedKLController)
    ctrl.update(current_kl=5.0, n_steps=1000)
    assert ctrl.value == 0.05


def test_adaptive_controller_moves_towards_the_target():
    # coef 0.1, target 0.1, horizon 100, batches of 10:
    #   KL 0.15: error clip(0.15/0.1 - 1 = 0.5, +-0.2) = 0.2; mult 1 + 0.2*10/100 = 1.02 -> 0.102
    #   KL 0.09: error -0.1; mult 1 - 0.1*10/100 = 0.99 -> 0.102 * 0.99 = 0.10098
    #   KL 0.1:  error 0; unchanged.
    ctrl = make_kl_controller("adaptive", kl_coef=0.1, target_kl=0.1, horizon=100)
    assert isinstance(ctrl, AdaptiveKLController)
    ctrl.update(current_kl=0.15, n_steps=10)
    assert ctrl.value == pytest.approx(0.102)
    ctrl.update(current_kl=0.09, n_steps=10)
    assert ctrl.value == pytest.approx(0.10098)
    ctrl.update(current_kl=0.1, n_steps=10)
    assert ctrl.value == pytest.approx(0.10098)


def test_controller_state_round_trips():
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.1, horizon=100)
    ctrl.update(current_kl=1.0, n_steps=10)
    fresh = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.1, horizon=100)
    fresh.load_state_dict(ctrl.state_dict())
    assert fresh.value == ctrl.value == pytest.approx(0.102)
    fixed = FixedKLController(0.3)
    fixed.load_state_dict({"value": 0.2})
    assert fixed.state_dict() == {"value": 0.2}


def test_controller_config_errors():
    with pytest.raises(ValueError, match="'pid'.*fixed, adaptive"):
        make_kl_controller("pid", kl_coef=0.1, target_kl=0.1, horizon=100)
    with pytest.raises(ValueError, match="horizon"):
        make_kl_controller("adaptive", kl_coef=0.1, target_kl=0.1, horizon=0)
    with pytest.raises(ValueError, match="target_kl"):
        make_kl_controller("adaptive", kl_coef=0.1, target_kl=0.0, horizon=10)


def test_apply_kl_penalty_hand_worked():
    # kind kl, coef 0.5; log pi - log pi_ref per token:
    #   row 0: 0.1, 0.2, 0.3 (then padding)   scores 0, 0, 1
    #   row 1: -0.4, 0.2 (then padding)       scores 0, 2
    #   row 2: all padding (an empty response)
    # rewards row 0: 0 - 0.05, 0 - 0.1, 1 - 0.15 = -0.05, -0.1, 0.85
    #         row 1: 0 + 0.2, 2 - 0.1          =  0.2, 1.9
    # per-response KL: (0.1 + 0.2 + 0.3)/3 = 0.2 and (-0.4 + 0.2)/2 = -0.1; the empty row is left
    # out, so reward_kl = (0.2 - 0.1) / 2 = 0.05.
    ref = t([[-1.0, -1.0, -1.0, -1.0], [-2.0, -2.0, -2.0, -2.0], [0.0, 0.0, 0.0, 0.0]])
    diff = t([[0.1, 0.2, 0.3, 99.0], [-0.4, 0.2, 99.0, -math.inf], [5.0, 5.0, 5.0, 5.0]])
    scores = t([[0.0, 0.0, 1.0, 0.0], [0.0, 2.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    rewards, metrics = apply_kl_penalty(scores, ref + diff, ref, mask, kl_coef=0.5, kind="kl")
    close(rewards, [[-0.05, -0.1, 0.85, 0.0], [0.2, 1.9, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert set(metrics) == {"reward_kl"}
    close(metrics["reward_kl"], 0.05)
    assert metrics["reward_kl"].dim() == 0


def test_apply_kl_penalty_with_zero_coef_keeps_scores():
    scores = t([[0.0, 3.0]])
    rewards, _ = apply_kl_penalty(scores, t([[-1.0, -1.0]]), t([[-3.0, -0.2]]), torch.ones(1, 2), 0.0, "k3")
    close(rewards, scores.tolist())
