"""The distillation losses (relm/algorithms/distillation.py) on numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from relm.algorithms.distillation import (
    DistillationLoss,
    distillation_loss,
    forward_kl_topk,
    token_divergences,
)


def _settings(**changes) -> DistillationLoss:
    base = dict(
        loss_mode="k1", use_policy_gradient=True, loss_max_clamp=None, clip_ratio_low=0.2, clip_ratio_high=0.2
    )
    base.update(changes)
    return DistillationLoss(**base)


def test_k1_and_k3_per_token():
    student = torch.tensor([[math.log(0.5), math.log(0.25)]])
    teacher = torch.tensor([[math.log(0.25), math.log(0.5)]])
    # k1 = log s - log t: log 2, -log 2
    k1 = token_divergences(student, teacher, "k1")
    torch.testing.assert_close(k1, torch.tensor([[math.log(2), -math.log(2)]]))
    # k3 = r - log r - 1 with r = t / s: r = 1/2 -> 0.5 + log 2 - 1; r = 2 -> 1 - log 2
    k3 = token_divergences(student, teacher, "k3")
    torch.testing.assert_close(k3, torch.tensor([[math.log(2) - 0.5, 1 - math.log(2)]]))
    with pytest.raises(ValueError, match="not an estimator"):
        token_divergences(student, teacher, "forward_kl_topk")


def test_supervised_loss_is_the_masked_mean_of_the_clamped_divergences():
    divergences = torch.tensor([[3.0, -1.0, 7.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0]])
    logprobs = torch.zeros(1, 3)
    settings = _settings(loss_mode="k3", use_policy_gradient=False, loss_max_clamp=2.0)
    loss, metrics = distillation_loss(
        divergences, mask, settings, logprobs=logprobs, old_logprobs=logprobs, loss_agg_mode="token-mean"
    )
    # clamp to [-2, 2]: (2 + -1) / 2 tokens
    assert loss.item() == pytest.approx(0.5)
    # the range is taken before the clamp, over the masked tokens only
    assert metrics["distillation/loss_max"].item() == 3.0
    assert metrics["distillation/loss_min"].item() == -1.0
    assert metrics["distillation/abs_loss"].item() == pytest.approx(2.0)
    (grad,) = torch.autograd.grad(loss, divergences)
    torch.testing.assert_close(grad, torch.tensor([[0.0, 0.5, 0.0]]))  # the clamped token passes none


def test_policy_gradient_uses_the_negated_divergence_as_each_tokens_advantage():
    # On-policy (ratio 1): loss = -mean(A * ratio) = mean(divergence); gradient wrt logprobs = -A / n = div / n
    divergences = torch.tensor([[0.4, -0.2, 5.0]])
    mask = torch.tensor([[1, 1, 1]])
    logprobs = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    loss, metrics = distillation_loss(
        divergences, mask, _settings(loss_max_clamp=1.0), logprobs=logprobs, old_logprobs=logprobs.detach(),
        loss_agg_mode="token-mean",
    )  # fmt: skip
    assert loss.item() == pytest.approx((0.4 - 0.2 + 1.0) / 3)
    (grad,) = torch.autograd.grad(loss, logprobs)
    torch.testing.assert_close(grad, torch.tensor([[0.4, -0.2, 1.0]]) / 3)
    assert metrics["distillation/pg_clipfrac"].item() == 0.0


def test_policy_gradient_clips_with_the_distillation_sections_range():
    # ratio e^0.5 = 1.65 > 1.2 with a positive advantage: the clipped term (1.2 A) wins, no gradient
    divergences = torch.tensor([[-1.0]])
    old = torch.tensor([[-1.0]])
    logprobs = torch.tensor([[-0.5]], requires_grad=True)
    loss, metrics = distillation_loss(
        divergences, torch.ones(1, 1), _settings(), logprobs=logprobs, old_logprobs=old,
        loss_agg_mode="token-mean",
    )  # fmt: skip
    assert loss.item() == pytest.approx(-1.2)
    assert metrics["distillation/pg_clipfrac"].item() == 1.0
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert grad.item() == 0.0


def test_forward_kl_over_the_teachers_top_k():
    # Vocabulary of 3, student uniform; teacher's top 2: ids 0 and 2 with probabilities 0.5 and 0.25.
    logits = torch.zeros(1, 1, 3)
    teacher = torch.log(torch.tensor([[[0.5, 0.25]]]))
    ids = torch.tensor([[[0, 2]]])
    divergences, student_mass, teacher_mass = forward_kl_topk(logits, teacher, ids, None)
    expected = 0.5 * math.log(0.5 * 3) + 0.25 * math.log(0.25 * 3)
    assert divergences.item() == pytest.approx(expected)
    assert student_mass.item() == pytest.approx(2 / 3)
    assert teacher_mass.item() == pytest.approx(0.75)
    # A floor above both sides' log-probabilities makes them equal: the divergence is 0.
    floored, _, _ = forward_kl_topk(logits, teacher, ids, -0.1)
    assert floored.item() == 0.0
    # Student confident on the teacher's ids beyond the teacher: negative sum, clamped at 0.
    confident, _, _ = forward_kl_topk(torch.tensor([[[5.0, -9.0, 5.0]]]), teacher, ids, None)
    assert confident.item() == 0.0
