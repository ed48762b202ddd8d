"""Gradient accumulation does not change the update: 1, 2 and 4 micro-batches give the same step."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from relm.algorithms.losses import AGG_MODES
from relm.config.rollout_correction import parse_rollout_correction
from relm.config.schema import ActorConfig, CriticConfig, RolloutCorrectionConfig
from relm.learner.actor import update_actor
from relm.learner.actor_objective import ActorObjective, KLLoss
from relm.learner.batch import ActorForward, Advantaged, Annotated, Rollout, Scored
from relm.learner.critic import CriticObjective, update_critic
from relm.learner.microbatch_retry import MicroBatchSize
from relm.learner.trainee import Batching, Trainee
from relm.models.value_model import ValueModel


def tiny_lm() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=32, max_position_embeddings=64,
    )  # fmt: skip
    return Qwen2ForCausalLM(config).eval()


def batch_with_uneven_lengths() -> Advantaged:
    """4 responses of 1, 4, 2 and 3 tokens: micro-batches hold different token counts."""
    rng = torch.Generator().manual_seed(1)
    n, p, r = 4, 3, 4
    response_mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    zeros = torch.zeros(n, r)
    rollout = Rollout(
        prompt_ids=torch.randint(1, 32, (n, p), generator=rng),
        prompt_mask=torch.ones(n, p, dtype=torch.long),
        response_ids=torch.randint(1, 32, (n, r), generator=rng) * response_mask,
        response_mask=response_mask,
        response_attention_mask=response_mask,
        group_ids=torch.tensor([0, 0, 1, 1]),
        data_sources=["t"] * n,
        ground_truths=[None] * n,
        extra_infos=[{}] * n,
        finish_reasons=["stop"] * n,
        rollout_logprobs=zeros,
    )
    old_logprobs = ActorForward(-torch.rand(n, r, generator=rng) * 3)
    ref_logprobs = -torch.rand(n, r, generator=rng) * 3
    advantages = torch.randn(n, r, generator=rng)
    values = torch.randn(n, r, generator=rng)
    annotated = Annotated(
        Scored(rollout, token_scores=zeros, reward_extras=[{}] * n, baseline_scores=None),
        old_logprobs=old_logprobs,
        ref_logprobs=ref_logprobs,
        values=values,
    )
    return Advantaged(
        annotated, token_rewards=zeros, loss_mask=response_mask, rollout_is_weights=None,
        advantages=advantages, returns=torch.randn(n, r, generator=rng),
    )  # fmt: skip


def objective(cfg: ActorConfig) -> ActorObjective:
    """`cfg`'s loss settings (the trainer reads them so from the config: relm.trainer.objectives)."""
    assert cfg.clip_ratio_low is not None and cfg.clip_ratio_high is not None
    return ActorObjective(
        loss_mode=cfg.policy_loss.loss_mode, loss_agg_mode=cfg.loss_agg_mode, clip_ratio_low=cfg.clip_ratio_low,
        clip_ratio_high=cfg.clip_ratio_high, clip_ratio_c=cfg.clip_ratio_c, entropy_coeff=cfg.entropy_coeff,
        kl_loss=KLLoss(cfg.kl_loss_type, cfg.kl_loss_coef) if cfg.use_kl_loss else None,
        correction=parse_rollout_correction(RolloutCorrectionConfig()),
    )  # fmt: skip


def sgd(model: torch.nn.Module) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)


def trainee(
    module: torch.nn.Module,
    cfg: ActorConfig | CriticConfig,
    *,
    rows_per_microbatch: int,
    max_tokens: int | None = None,
    remove_padding: bool = False,
) -> Trainee:
    """`module` as a trainee updated with SGD (lr 1) over mini-batches of the 4 rows, one epoch."""
    name = "actor" if isinstance(cfg, ActorConfig) else "critic"
    batching = Batching(
        rows_per_minibatch=4, rows_per_microbatch=rows_per_microbatch, rows_per_forward=4, num_epochs=1,
        shuffle=False, remove_padding=remove_padding,
    )  # fmt: skip
    size = MicroBatchSize(rows=rows_per_microbatch, max_tokens=max_tokens)
    return Trainee(name, module, *sgd(module), cfg.grad_clip, batching, size)


def actor_step(micro: int, mode: str, max_tokens: int | None = None) -> dict[str, torch.Tensor]:
    model = tiny_lm()
    cfg = ActorConfig(
        loss_agg_mode=mode, clip_ratio_low=0.2, clip_ratio_high=0.28, entropy_coeff=0.01,
        use_kl_loss=True, grad_clip=1e9,
    )  # fmt: skip
    actor = trainee(
        model, cfg, rows_per_microbatch=micro, max_tokens=max_tokens, remove_padding=max_tokens is not None
    )
    update_actor(
        actor, batch_with_uneven_lengths(), objective(cfg), temperature=1.0, device=torch.device("cpu")
    )
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("mode", AGG_MODES)
def test_actor_step_is_the_same_for_1_2_and_4_micro_batches(mode: str):
    whole = actor_step(4, mode)
    for micro in (1, 2):
        split = actor_step(micro, mode)
        for name, value in whole.items():
            torch.testing.assert_close(split[name], value, rtol=1e-5, atol=1e-6, msg=f"{name} micro={micro}")
    assert any(not torch.equal(whole[k], v) for k, v in tiny_lm().state_dict().items())  # it did move


@pytest.mark.parametrize("mode", AGG_MODES)
def test_actor_step_is_the_same_with_token_budget_micro_batches(mode: str):
    # rows cost 4, 7, 5 and 6 real tokens (3 prompt + 1, 4, 2, 3 response); budgets of 7, 11 and 100
    # make 4, 2 and 1 micro-batches of different sizes, and the step must not change
    whole = actor_step(4, mode)
    for budget in (7, 11, 100):
        split = actor_step(4, mode, max_tokens=budget)
        for name, value in whole.items():
            torch.testing.assert_close(
                split[name], value, rtol=1e-5, atol=1e-6, msg=f"{name} budget={budget}"
            )


def critic_step(micro: int) -> dict[str, torch.Tensor]:
    critic = ValueModel(tiny_lm())
    torch.nn.init.normal_(
        critic.value_head.weight, std=0.1
    )  # zero-init would leave the backbone without grads
    cfg = CriticConfig(cliprange_value=0.5, grad_clip=1e9, loss_agg_mode="token-mean")
    update_critic(
        trainee(critic, cfg, rows_per_microbatch=micro),
        batch_with_uneven_lengths(),
        CriticObjective(cliprange_value=0.5, loss_agg_mode="token-mean"),
        device=torch.device("cpu"),
    )
    return {k: v.detach().clone() for k, v in critic.state_dict().items()}


def test_critic_step_is_the_same_for_1_2_and_4_micro_batches():
    torch.manual_seed(0)
    whole = critic_step(4)
    for micro in (1, 2):
        torch.manual_seed(0)
        split = critic_step(micro)
        for name, value in whole.items():
            torch.testing.assert_close(split[name], value, rtol=1e-5, atol=1e-6, msg=f"{name} micro={micro}")


def test_reported_loss_is_the_minibatch_loss_whatever_the_split():
    results = []
    for micro in (1, 2, 4):
        model = tiny_lm()
        cfg = ActorConfig(clip_ratio_low=0.2, clip_ratio_high=0.2)
        actor = trainee(model, cfg, rows_per_microbatch=micro)
        batch = batch_with_uneven_lengths()
        result = update_actor(actor, batch, objective(cfg), temperature=1.0, device=torch.device("cpu"))
        results.append(result.metrics["actor/pg_loss"][0])
    assert results[0] == pytest.approx(results[2], rel=1e-5) and results[1] == pytest.approx(
        results[2], rel=1e-5
    )
