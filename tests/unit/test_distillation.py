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
from relm.errors import UserError


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


# --- the keys: verl's checks, as one-line errors -----------------------------------------------------------


def _spec(*overrides: str):
    from relm.config.loader import load_config_with_warnings
    from relm.config.translate import translate

    cfg, warnings = load_config_with_warnings(list(overrides))
    spec, more = translate(cfg)
    return spec.distillation, warnings + more


TEACHER = "distillation.teacher_models.teacher_model.model_path=/tmp/teacher"


def test_one_teacher_scores_everything_and_verls_pool_keys_warn():
    spec, warnings = _spec(
        "distillation.enabled=true", TEACHER, "distillation.teacher_models.teacher_model.inference.name=vllm",
        "distillation.n_gpus_per_node=4", "distillation.nnodes=1",
    )  # fmt: skip
    assert [(t.name, t.key, t.path) for t in spec.teachers] == [("teacher_model", "default", "/tmp/teacher")]
    assert spec.loss.loss_mode == "k3" and not spec.loss.use_policy_gradient and spec.use_task_rewards
    assert any("teacher_model.inference" in line and "not used" in line for line in warnings)
    assert any("distillation.n_gpus_per_node=4" in line for line in warnings)


def test_added_teachers_drop_the_default_one_and_need_keys():
    spec, _ = _spec(
        "distillation.enabled=true", TEACHER,
        "+distillation.teacher_models.a.key=src/a", "+distillation.teacher_models.a.model_path=/tmp/a",
        "+distillation.teacher_models.b.key=src/b", "+distillation.teacher_models.b.model_path=/tmp/b",
    )  # fmt: skip
    assert [(t.name, t.key) for t in spec.teachers] == [("a", "src/a"), ("b", "src/b")]
    with pytest.raises(UserError, match=r"`distillation.teacher_models.b.key` is not set"):
        _spec(
            "distillation.enabled=true",
            "+distillation.teacher_models.a.key=src/a", "+distillation.teacher_models.a.model_path=/tmp/a",
            "+distillation.teacher_models.b.model_path=/tmp/b",
        )  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ((), r"teacher_model.model_path` is not set"),
        (
            (TEACHER, "distillation.distillation_loss.loss_mode=k1"),
            r"loss_mode=k1` with use_policy_gradient=false",
        ),
        (
            (TEACHER, "distillation.distillation_loss.loss_mode=jsd"),
            r"not a distillation loss; choose one of",
        ),
        (
            (
                TEACHER,
                "distillation.distillation_loss.loss_mode=forward_kl_topk",
                "distillation.distillation_loss.topk=0",
            ),
            r"set topk >= 1",
        ),
        ((TEACHER, "distillation.distillation_loss.policy_loss_mode=gspo"), r"takes only `vanilla`"),
        ((TEACHER, "distillation.teacher_key=ability"), r"data_source only"),
    ],
)
def test_what_verl_refuses_stops_with_one_line(overrides, message):
    with pytest.raises(UserError, match=message):
        _spec("distillation.enabled=true", *overrides)


def test_topk_is_read_only_by_the_top_k_loss():
    spec, _ = _spec("distillation.enabled=true", TEACHER, "distillation.distillation_loss.topk=8")
    assert spec.topk is None  # k3, the default
    spec, _ = _spec(
        "distillation.enabled=true", TEACHER, "distillation.distillation_loss.loss_mode=forward_kl_topk",
        "distillation.distillation_loss.topk=8", "distillation.distillation_loss.log_prob_min_clamp=-10",
    )  # fmt: skip
    assert spec.topk == 8 and spec.log_prob_min_clamp == -10.0


def test_the_update_forward_gives_the_student_logprobs_at_the_teachers_top_ids():
    """One forward gives the sampled tokens' logprobs (as `response_logprobs`) and the logprobs at given ids;
    at temperature 1 those at a model's own top ids are its `response_topk` values, largest first."""
    from relm.learner.forward import response_logprobs, response_logprobs_at, response_topk
    from relm.models.loading import load_causal_lm, resolve_model_dir

    torch.manual_seed(0)
    model = load_causal_lm(resolve_model_dir("zoo:tiny/qwen2"), dtype=torch.float32, device="cpu")
    ids = torch.randint(0, 100, (3, 9))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding in one row
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    values, top_ids = response_topk(model, ids, mask, positions, 4, 5, vocab_limit=100)
    assert top_ids.shape == (3, 4, 5) and bool((values[..., :-1] >= values[..., 1:]).all())
    sampled, _ = response_logprobs(model, ids, mask, positions, 4, temperature=0.7, vocab_limit=100)
    again, entropy, at_ids = response_logprobs_at(
        model, ids, mask, positions, 4, top_ids, temperature=0.7, compute_entropy=True, vocab_limit=100
    )
    torch.testing.assert_close(again, sampled)
    assert entropy is not None and entropy.shape == (3, 4)
    _, _, at_one = response_logprobs_at(model, ids, mask, positions, 4, top_ids, vocab_limit=100)
    torch.testing.assert_close(at_one, values)
    at_ids.sum().backward()  # the gathered logprobs carry the gradient to the weights
    assert next(model.parameters()).grad is not None


def test_off_by_default_and_nothing_checked_when_off():
    spec, _ = _spec("distillation.distillation_loss.loss_mode=k1")
    assert not spec.enabled and spec.teachers == ()


class _Rows:
    """What routing reads of a rollout: its rows' data sources."""

    def __init__(self, data_sources: list[str]) -> None:
        self.data_sources = data_sources

    def __len__(self) -> int:
        return len(self.data_sources)


def test_several_teachers_route_rows_by_data_source():
    from torch import nn

    from relm.trainer.teachers import Teachers

    a, b = nn.Linear(1, 1), nn.Linear(1, 1)
    teachers = Teachers(by_key={"src/a": a, "src/b": b}, group=nn.ModuleList([a, b]))
    rows = _Rows(["src/b", "src/a", "src/b"])
    assert teachers.rows_of(rows) == {"src/a": [1], "src/b": [0, 2]}  # type: ignore[arg-type]
    rows.data_sources.append("src/c")
    with pytest.raises(UserError, match=r"data_source `src/c` has no teacher"):
        teachers.rows_of(rows)  # type: ignore[arg-type]
    lone = Teachers(by_key={"default": a}, group=nn.ModuleList([a]))
    assert lone.rows_of(rows) == {"default": [0, 1, 2, 3]}  # type: ignore[arg-type]
