"""The actor objective on numbers worked out by hand, in each of its three old-logprob modes."""

from __future__ import annotations

import math

import pytest
import torch

from relm.algorithms.losses import AggScale
from relm.config.rollout_correction import parse_rollout_correction
from relm.config.schema import RolloutCorrectionConfig
from relm.learner.actor_objective import ActorObjective, KLLoss, PolicyTensors, actor_objective
from relm.learner.batch import ActorForward, EngineLogprobs, OldLogprobs, UpdateForward

SPEC = ActorObjective(
    loss_mode="vanilla",
    loss_agg_mode="token-mean",
    clip_ratio_low=0.2,
    clip_ratio_high=0.2,
    clip_ratio_c=3.0,
    entropy_coeff=0.1,
    kl_loss=KLLoss(kind="k1", coef=0.5),
    correction=parse_rollout_correction(RolloutCorrectionConfig()),
)
MASK = torch.tensor([[1, 1, 0]])
SCALE = AggScale(num_tokens=2.0, num_seqs=1.0)


def tensors(old: OldLogprobs) -> PolicyTensors:
    return PolicyTensors(
        loss_mask=MASK,
        advantages=torch.tensor([[1.0, -1.0, 5.0]]),  # the third token is padding: out of every mean
        old_logprobs=old,
        ref_logprobs=torch.zeros(1, 3),
        rollout_is_weights=None,
    )


def policy() -> tuple[torch.Tensor, torch.Tensor]:
    logprobs = torch.tensor([[math.log(1.5), math.log(0.5), -7.0]], requires_grad=True)
    entropy = torch.tensor([[1.0, 3.0, 9.0]])
    return logprobs, entropy


def test_decoupled_objective_matches_the_numbers_worked_by_hand():
    """One response of two tokens (a third is padding), old logprobs 0, so the ratios are 1.5 and 0.5.

    Token 1, A = +1, ratio 1.5: unclipped -1.5, clipped -1 * 1.2 = -1.2; the larger, -1.2, is the clipped one.
    Token 2, A = -1, ratio 0.5: unclipped 0.5, clipped 1 * 0.8 = 0.8; the larger, 0.8 (clipped), is under the
    dual-clip bound -A * c = 3, which does not bind.
    pg_loss = (-1.2 + 0.8) / 2 tokens = -0.2; pg_clipfrac = 2/2 = 1; pg_clipfrac_lower = 0;
    ppo_kl = mean(-log ratio) = (-ln 1.5 - ln 0.5) / 2 = (-0.405465 + 0.693147) / 2 = 0.143841.
    entropy = (1 + 3) / 2 = 2, times entropy_coeff 0.1: -0.2 in the loss.
    k1 KL to a reference with logprobs 0: (ln 1.5 + ln 0.5) / 2 = -0.143841, times kl_coef 0.5: -0.071921.
    loss = -0.2 - 0.2 - 0.071921 = -0.471921.
    """
    logprobs, entropy = policy()
    loss, metrics = actor_objective(logprobs, entropy, tensors(ActorForward(torch.zeros(1, 3))), SPEC, SCALE)
    assert loss.item() == pytest.approx(-0.471921, abs=1e-6)
    assert float(metrics["pg_loss"]) == pytest.approx(-0.2, abs=1e-6)
    assert float(metrics["entropy"]) == pytest.approx(2.0)
    assert float(metrics["pg_clipfrac"]) == 1.0 and float(metrics["pg_clipfrac_lower"]) == 0.0
    assert float(metrics["ppo_kl"]) == pytest.approx(0.143841, abs=1e-6)
    assert float(metrics["kl_loss"]) == pytest.approx(-0.143841, abs=1e-6)
    assert metrics["kl_coef"] == 0.5
    # Both tokens are clipped, so only the KL term carries a gradient: 0.5 * 1/2 per token.
    loss.backward()
    assert logprobs.grad is not None
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.25, 0.25, 0.0]]))


def test_on_policy_objective_takes_its_own_logprobs_as_the_old_ones():
    """`UpdateForward`: the ratio is exactly 1 on every token, so nothing clips and the policy term is
    -mean(A) = -(1 - 1) / 2 = 0 with gradient -A / 2 = (-0.5, +0.5); the KL term adds 0.5 / 2 = 0.25 to each.
    loss = 0 - 0.1 * 2 + 0.5 * (-0.143841) = -0.271921."""
    logprobs, entropy = policy()
    loss, metrics = actor_objective(logprobs, entropy, tensors(UpdateForward()), SPEC, SCALE)
    assert loss.item() == pytest.approx(-0.271921, abs=1e-6)
    assert float(metrics["ppo_kl"]) == 0.0 and float(metrics["pg_clipfrac"]) == 0.0
    loss.backward()
    assert logprobs.grad is not None
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-0.25, 0.75, 0.0]]))


def test_engine_logprobs_go_through_the_bypass_loss():
    """`EngineLogprobs` (bypass mode, no weights or rejection configured): the same clipped loss against the
    engine's logprobs as the decoupled one above, plus the `rollout_corr/` gap metrics measured against the
    current policy: here the engine's logprobs are 0, so its KL estimate k1 = mean(0 - log pi) = 0.143841."""
    logprobs, entropy = policy()
    loss, metrics = actor_objective(
        logprobs, entropy, tensors(EngineLogprobs(torch.zeros(1, 3))), SPEC, SCALE
    )
    assert loss.item() == pytest.approx(-0.471921, abs=1e-6)
    assert float(metrics["rollout_corr/kl"]) == pytest.approx(0.143841, abs=1e-6)


def test_distillation_term_joins_the_task_loss_or_stands_alone():
    """On-policy (ratio 1), k1 as a per-token reward: divergences s - t with teacher logprobs 0 are ln 1.5 and
    ln 0.5; the clipped loss is -mean(A) = mean(divergence) = (ln 1.5 + ln 0.5) / 2 = -0.143841.
    With the task's loss: pg_loss 0 (ratio 1: -mean(A) = 0), entropy -0.2, k1 KL -0.071921, plus 2 x term.
    Alone: the term itself, and its gradient is the divergence / 2 tokens on each token."""
    from dataclasses import replace

    from relm.config.specs import DistillationLoss
    from relm.learner.actor_objective import DistillationTerm

    loss_spec = DistillationLoss(
        loss_mode="k1", use_policy_gradient=True, loss_max_clamp=None, clip_ratio_low=0.2, clip_ratio_high=0.2
    )
    batch = replace(tensors(UpdateForward()), teacher_logprobs=torch.zeros(1, 3))
    term = -0.143841
    with_task = replace(SPEC, distillation=DistillationTerm(loss=loss_spec, use_task_rewards=True, coef=2.0))
    logprobs, entropy = policy()
    loss, metrics = actor_objective(logprobs, entropy, batch, with_task, SCALE)
    assert loss.item() == pytest.approx(0.0 - 0.2 - 0.071921 + 2 * term, abs=1e-6)
    assert metrics["distillation/loss"].item() == pytest.approx(term, abs=1e-6)
    alone = replace(SPEC, distillation=DistillationTerm(loss=loss_spec, use_task_rewards=False, coef=2.0))
    logprobs, entropy = policy()
    loss, _ = actor_objective(logprobs, entropy, batch, alone, SCALE)
    assert loss.item() == pytest.approx(term, abs=1e-6)
    (grad,) = torch.autograd.grad(loss, logprobs)
    torch.testing.assert_close(grad, torch.tensor([[math.log(1.5) / 2, math.log(0.5) / 2, 0.0]]))
    with pytest.raises(RuntimeError, match="teachers' logprobs"):
        actor_objective(*policy(), tensors(UpdateForward()), alone, SCALE)


def test_forward_kl_topk_term_reads_the_students_logprobs_at_the_teachers_ids():
    """Supervised top-k forward KL alone: teacher top-2 probabilities 0.5 and 0.25 on both tokens, student
    probabilities 0.25 and 0.25 there: per token 0.5 ln 2 + 0.25 ln 1 = 0.346574, the loss their token mean."""
    from dataclasses import replace

    from relm.config.specs import DistillationLoss
    from relm.learner.actor_objective import DistillationTerm

    loss_spec = DistillationLoss(
        loss_mode="forward_kl_topk", use_policy_gradient=False, loss_max_clamp=None, clip_ratio_low=0.2,
        clip_ratio_high=0.2,
    )  # fmt: skip
    term = DistillationTerm(loss=loss_spec, use_task_rewards=False, coef=1.0, log_prob_min_clamp=None)
    teacher = torch.log(torch.tensor([0.5, 0.25])).expand(1, 3, 2)
    batch = replace(tensors(UpdateForward()), teacher_topk_logprobs=teacher)
    student = torch.log(torch.full((1, 3, 2), 0.25)).requires_grad_(True)
    loss, metrics = actor_objective(
        *policy(), batch, replace(SPEC, distillation=term), SCALE, student_topk=student
    )
    assert loss.item() == pytest.approx(0.5 * math.log(2), abs=1e-6)
    assert metrics["distillation/teacher_mass"].item() == pytest.approx(0.75)
    assert metrics["distillation/student_mass"].item() == pytest.approx(0.5)
    (grad,) = torch.autograd.grad(loss, student)
    # d/d log p_s of -p_t log p_s, over 2 tokens; the padded third token gets none
    torch.testing.assert_close(grad, torch.tensor([[[-0.25, -0.125], [-0.25, -0.125], [0.0, 0.0]]]))
    with pytest.raises(RuntimeError, match="top-k"):
        actor_objective(*policy(), batch, replace(SPEC, distillation=term), SCALE)
