"""verl 0.9.1's estimators and losses that read inputs or keys of their own, in real (tiny) runs.

tests/parity compares the functions with verl's; these check the wiring: GDPO's rewards by name come from the
reward function's dict through the loop, the optimal token baselines' sum of squared probabilities from the
actor's old-logprob forward (and only for them), and each loss with its keys trains a step.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from relm.algorithms import compute_advantages
from relm.config.loader import load_config
from relm.config.translate import translate
from relm.learner.batch import ActorForward
from relm.learner.forward import response_token_stats
from relm.models.loading import resolve_model_dir
from relm.trainer.collect import collect_experience
from relm.trainer.components import build_components
from relm.trainer.ppo import annotate, estimate_advantages
from tests.integration.conftest import TINY_OVERRIDES, RunResult

pytestmark = pytest.mark.integration

NAMED_REWARDS = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    fmt = float(len(solution_str) % 2)
    accuracy = sum(map(ord, solution_str)) % 5 / 4
    return {"score": fmt + accuracy, "fmt": fmt, "accuracy": accuracy}
"""

GDPO = ("algorithm.adv_estimator=gdpo", "+algorithm.gdpo_reward_keys=[fmt,accuracy]")


def test_gdpo_reads_the_reward_functions_numbers_by_name(tmp_path: Path, write_reward) -> None:
    reward = write_reward(NAMED_REWARDS)
    cfg = load_config([
        *TINY_OVERRIDES, *GDPO, "+algorithm.gdpo_reward_weights=[1.0,0.5]", f"custom_reward_function.path={reward}",
        f"trainer.default_local_dir={tmp_path}",
    ])  # fmt: skip
    c = build_components(translate(cfg)[0], resolve_model_dir(cfg.actor_rollout_ref.model.path))
    scored = collect_experience(c.experience_sources, c.loader.next_batch(), 1, {})
    annotated, _ = annotate(c, scored)
    batch, _ = estimate_advantages(c.spec.algorithm, c.kl_ctrl, annotated)

    components = torch.tensor([[row[key] for row in scored.reward_extras] for key in ("fmt", "accuracy")])
    expected, _ = compute_advantages(
        "gdpo", token_rewards=scored.token_scores, response_mask=scored.rollout.response_mask,
        group_ids=scored.rollout.group_ids, score_components=components, score_weights=torch.tensor([1.0, 0.5]),
    )  # fmt: skip
    assert torch.equal(batch.advantages, expected)
    assert components.std() > 0  # the responses differ, so the check above sees non-zero advantages
    assert batch.advantages.abs().sum() > 0


def test_gdpo_trains_and_names_a_key_the_reward_does_not_return(
    train: Callable[..., RunResult], write_reward
) -> None:
    reward = write_reward(NAMED_REWARDS)
    result = train(*GDPO, f"custom_reward_function.path={reward}", "trainer.total_training_steps=1")
    assert result.exit_code == 0, result.stderr
    assert "actor/pg_loss" in result.metrics[0]
    result = train(
        "algorithm.adv_estimator=gdpo", "+algorithm.gdpo_reward_keys=[fmt,style]", f"custom_reward_function.path={reward}",
        "trainer.total_training_steps=1",
    )  # fmt: skip
    assert result.exit_code == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: `algorithm.gdpo_reward_keys` names `style`, which the reward function did not return as a finite "
        "number for every response (its dict keys: acc, accuracy, fmt); return `style` beside `score` or drop it "
        "from the list"
    ], result.stderr


@pytest.mark.parametrize(
    "overrides",
    [
        ("actor_rollout_ref.actor.policy_loss.loss_mode=sapo", "actor_rollout_ref.actor.tau_pos=2.0"),
        (
            "actor_rollout_ref.actor.policy_loss.loss_mode=dro",
            "actor_rollout_ref.actor.policy_loss.dro_beta=0.1",
        ),
        (
            "actor_rollout_ref.actor.policy_loss.loss_mode=clip_cov",
            "actor_rollout_ref.actor.policy_loss.clip_cov_ratio=0.1",
        ),
        (
            "actor_rollout_ref.actor.policy_loss.loss_mode=kl_cov",
            "actor_rollout_ref.actor.policy_loss.kl_cov_ratio=0.1",
        ),
        ("actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode",),
        (
            "actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode",
            "algorithm.rollout_correction.bypass_mode=true",
        ),
    ],
    ids=["sapo", "dro", "clip_cov", "kl_cov", "bypass_mode", "bypass_mode-in-bypass-mode"],
)
def test_each_loss_with_its_keys_trains_a_step(
    train: Callable[..., RunResult], varied_reward, overrides
) -> None:
    result = train(*overrides, varied_reward, "trainer.total_training_steps=1")
    assert result.exit_code == 0, result.stderr
    assert not [
        line for line in result.stderr.splitlines() if "warning" in line.lower() and "policy_loss" in line
    ]
    record = result.metrics[0]
    assert "actor/ppo_kl" in record and record["actor/pg_loss"] == record["actor/pg_loss"]  # not NaN


OTB_ON_POLICY = (
    "algorithm.adv_estimator=optimal_token_baseline",
    # One mini-batch, one epoch: any other estimator would skip the old-logprob forward (on-policy).
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "algorithm.rollout_correction.rollout_is=token",
)


def test_the_optimal_token_baseline_reads_the_old_forwards_squared_probabilities(
    tmp_path: Path, varied_reward
) -> None:
    cfg = load_config(
        [*TINY_OVERRIDES, *OTB_ON_POLICY, varied_reward, f"trainer.default_local_dir={tmp_path}"]
    )
    c = build_components(translate(cfg)[0], resolve_model_dir(cfg.actor_rollout_ref.model.path))
    scored = collect_experience(c.experience_sources, c.loader.next_batch(), 1, {})
    annotated, _ = annotate(c, scored)
    batch, _ = estimate_advantages(c.spec.algorithm, c.kl_ctrl, annotated)

    old = annotated.old_logprobs
    assert isinstance(old, ActorForward) and old.sum_pi_squared is not None
    rollout = scored.rollout
    with torch.no_grad():
        stats = response_token_stats(
            c.actor.module, rollout.input_ids, rollout.attention_mask, rollout.position_ids, rollout.response_width,
            temperature=c.sizes.logprob_temperature, vocab_limit=len(c.tokenizer), compute_sum_pi_squared=True,
        )  # fmt: skip
    valid = rollout.response_mask.bool()
    torch.testing.assert_close(old.sum_pi_squared[valid], stats.sum_pi_squared[valid], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(old.logprobs[valid], stats.logprobs[valid], atol=1e-5, rtol=1e-5)
    assert batch.rollout_is_weights is not None  # the rollout correction's weights scale the path weights
    expected, _ = compute_advantages(
        "optimal_token_baseline", token_rewards=batch.token_rewards, response_mask=batch.loss_mask,
        group_ids=rollout.group_ids, old_logprobs=old.logprobs, sum_pi_squared=old.sum_pi_squared,
        rollout_is_weights=batch.rollout_is_weights,
    )  # fmt: skip
    assert torch.equal(batch.advantages, expected) and batch.advantages.abs().sum() > 0


def test_other_estimators_do_not_compute_it(tmp_path: Path) -> None:
    cfg = load_config([*TINY_OVERRIDES, f"trainer.default_local_dir={tmp_path}"])  # grpo, two mini-batches
    c = build_components(translate(cfg)[0], resolve_model_dir(cfg.actor_rollout_ref.model.path))
    annotated, _ = annotate(c, collect_experience(c.experience_sources, c.loader.next_batch(), 1, {}))
    assert isinstance(annotated.old_logprobs, ActorForward) and annotated.old_logprobs.sum_pi_squared is None


@pytest.mark.parametrize("estimator", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_each_optimal_token_baseline_trains_on_the_demo(
    train: Callable[..., RunResult], varied_reward, estimator
):
    result = train(f"algorithm.adv_estimator={estimator}", varied_reward)
    assert result.exit_code == 0, result.stderr
    assert len(result.metrics) == 2
    for record in result.metrics:
        assert record["actor/pg_loss"] == record["actor/pg_loss"] and "timing_s/old_log_prob" in record


def test_an_optimal_token_baseline_trains_beside_a_top_k_teacher(
    train: Callable[..., RunResult], varied_reward
):
    """Both read extra tensors from forwards before the update: the actor's squared-probability sums ([N, R, 2]
    passes) and the teacher's top ids (float64 [N, R, k, 2] passes); the task's advantages and the distillation
    term train together."""
    result = train(
        "algorithm.adv_estimator=optimal_token_baseline",
        varied_reward,
        "trainer.total_training_steps=1",
        "distillation.enabled=true",
        "distillation.teacher_models.teacher_model.model_path=zoo:tiny/qwen2",
        "distillation.distillation_loss.loss_mode=forward_kl_topk",
        "distillation.distillation_loss.topk=4",
        "distillation.distillation_loss.use_task_rewards=true",
    )
    assert result.exit_code == 0, result.stderr
    record = result.metrics[0]
    assert "timing_s/old_log_prob" in record and "timing_s/teacher" in record
    assert record["actor/pg_loss"] == record["actor/pg_loss"] and "distillation/loss" in record


NAMED_BY_EXPERIMENT = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    # As verl's rlla.py scorer (examples/gdpo_trainer), the chat format comes from the experiment's name.
    if "qwen" not in extra_info["experiment_name"]:
        raise NotImplementedError(f"unknown model name: {extra_info['experiment_name']}")
    fmt = float(len(solution_str) % 2)
    accuracy = sum(map(ord, solution_str)) % 5 / 4
    return {"score": fmt + accuracy, "fmt": fmt, "accuracy": accuracy}
"""


def test_the_gdpo_reward_manager_hands_the_scorer_the_experiment_name(
    train: Callable[..., RunResult], write_reward
) -> None:
    reward = write_reward(NAMED_BY_EXPERIMENT)
    common = (*GDPO, f"custom_reward_function.path={reward}", "trainer.total_training_steps=1")
    result = train(*common, "reward.reward_manager.name=gdpo", "trainer.experiment_name=qwen3_gdpo")
    assert result.exit_code == 0, result.stderr
    assert result.metrics[0]["reward/errors"] == 0 and "actor/pg_loss" in result.metrics[0]
    result = train(*common, "trainer.experiment_name=qwen3_gdpo")  # naive: no experiment_name
    assert result.exit_code == 2
    assert "KeyError: 'experiment_name'" in result.stderr
