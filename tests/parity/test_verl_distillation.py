"""relm's distillation losses (relm/algorithms/distillation.py) against verl 0.9.1's
`verl.trainer.distillation.losses.distillation_loss` and its FSDP top-k forward KL, on random batches.

verl's loss reads the student's log-probabilities as its trainer's unpadded model output: one flat
sequence of every row's prompt and response tokens, each token's log-probability one position before it
(`no_padding_2_padding`). The batches here are laid out that way for verl and padded [N, R] for relm, from
the same numbers; the teacher's log-probabilities travel the same way. Compared: the loss, its gradient
with respect to the student's log-probabilities, and the range metrics, for every estimator loss mode,
both ways of using it (supervised where verl allows it, policy gradient), with and without the clamp, and
every aggregation mode with the mini-batch's counts.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from relm.algorithms.distillation import (
    ESTIMATOR_MODES,
    DistillationLoss,
    distillation_loss,
    forward_kl_topk,
    token_divergences,
)
from relm.algorithms.losses import AGG_MODES, AggScale

pytestmark = pytest.mark.verl

NUM_CASES = 40
PROMPT = 3


@pytest.fixture(scope="module")
def verl_distill(verl):
    """verl's distillation modules (imported under the parity fixture's stand-in `ray`)."""
    return (
        importlib.import_module("verl.trainer.distillation.losses"),
        importlib.import_module("verl.trainer.distillation.fsdp.losses"),
        importlib.import_module("verl.workers.config"),
        importlib.import_module("tensordict").TensorDict,
    )


def random_batch(seed: int) -> dict:
    """Student, old and teacher logprobs [N, R] (float64) with right padding of random length (at least one
    token a row: verl's slicing needs a response), teacher log-ratios up to +-6 so the clamps bind."""
    gen = torch.Generator().manual_seed(seed)
    num_rows = int(torch.randint(1, 6, (1,), generator=gen))
    width = int(torch.randint(1, 8, (1,), generator=gen))
    lengths = torch.randint(1, width + 1, (num_rows,), generator=gen)
    mask = (torch.arange(width) < lengths[:, None]).long()
    old = -torch.rand(num_rows, width, generator=gen, dtype=torch.float64) * 4
    student = old + (torch.rand(num_rows, width, generator=gen, dtype=torch.float64) - 0.5)
    teacher = student + (torch.rand(num_rows, width, generator=gen, dtype=torch.float64) - 0.5) * 12
    return {"mask": mask, "old": old, "student": student, "teacher": teacher.clamp(max=0.0)}


def unpadded(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[N, R] response values as verl's model output: per row PROMPT + length positions, the response's
    value at position PROMPT - 1 + t (one before its token), zeros on the prompt's other positions."""
    parts = []
    for row, length in zip(values, mask.sum(1).tolist(), strict=True):
        part = torch.zeros(PROMPT + length, dtype=values.dtype)
        part = torch.cat([part[: PROMPT - 1], row[:length], part[PROMPT - 1 + length :]])
        parts.append(part)
    return torch.cat(parts)


def verl_data(verl_distill, batch: dict, student_flat: torch.Tensor):
    _, _, _, tensordict = verl_distill
    mask = batch["mask"]
    num_rows, width = mask.shape
    scale = AggScale.of(mask)
    data = tensordict(
        {
            "prompts": torch.ones(num_rows, PROMPT, dtype=torch.long),
            "responses": torch.ones(num_rows, width, dtype=torch.long),
            "attention_mask": torch.cat([torch.ones(num_rows, PROMPT, dtype=torch.long), mask], dim=1),
            "response_mask": mask.double(),
            "old_log_probs": batch["old"],
            "teacher_logprobs": unpadded(batch["teacher"], mask)[:, None],
        },
        batch_size=[],  # the flat teacher column is not [N, ...]
    )
    data["dp_size"] = torch.tensor(1)
    data["batch_num_tokens"] = torch.tensor(scale.num_tokens)
    data["global_batch_size"] = torch.tensor(scale.num_seqs)
    return data, {"log_probs": student_flat}


def verl_configs(verl_distill, settings: DistillationLoss, agg_mode: str):
    _, _, config, _ = verl_distill
    actor = config.ActorConfig(
        strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=1, loss_agg_mode=agg_mode
    )
    loss = config.DistillationLossConfig(
        loss_mode=settings.loss_mode, use_policy_gradient=settings.use_policy_gradient,
        loss_max_clamp=settings.loss_max_clamp, clip_ratio=settings.clip_ratio_low,
        clip_ratio_low=settings.clip_ratio_low, clip_ratio_high=settings.clip_ratio_high,
    )  # fmt: skip
    return actor, config.DistillationConfig(enabled=False, distillation_loss=loss)


def losses_agree(verl_distill, settings: DistillationLoss, agg_mode: str, seed: int) -> None:
    losses_module = verl_distill[0]
    batch = random_batch(seed)
    mask = batch["mask"]
    what = f"{settings} {agg_mode} seed {seed}"

    student = batch["student"].clone().requires_grad_(True)
    divergences = token_divergences(student, batch["teacher"], settings.loss_mode)
    relm_loss, relm_metrics = distillation_loss(
        divergences, mask, settings, logprobs=student, old_logprobs=batch["old"], loss_agg_mode=agg_mode,
        scale=AggScale.of(mask),
    )  # fmt: skip
    (relm_grad,) = torch.autograd.grad(relm_loss, student)

    flat = unpadded(batch["student"], mask).requires_grad_(True)
    data, output = verl_data(verl_distill, batch, flat)
    actor, distill = verl_configs(verl_distill, settings, agg_mode)
    verl_loss, verl_metrics = losses_module.distillation_loss(actor, distill, output, data)
    (flat_grad,) = torch.autograd.grad(verl_loss, flat)
    verl_grad = torch.zeros_like(relm_grad)
    offset = 0
    for row, length in enumerate(mask.sum(1).tolist()):
        verl_grad[row, :length] = flat_grad[offset + PROMPT - 1 : offset + PROMPT - 1 + length]
        offset += PROMPT + length

    close = dict(rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(relm_loss.double(), verl_loss.double(), **close, msg=what + " loss")
    torch.testing.assert_close(relm_grad, verl_grad, **close, msg=what + " gradient")
    for key in ("distillation/loss_min", "distillation/loss_max", "distillation/abs_loss"):
        torch.testing.assert_close(
            relm_metrics[key].double(), torch.as_tensor(_value(verl_metrics[key])).double(), **close,
            msg=f"{what} {key}",
        )  # fmt: skip
    if settings.use_policy_gradient:
        for key in ("pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"):
            torch.testing.assert_close(
                torch.as_tensor(float(relm_metrics[f"distillation/{key}"])).double(),
                torch.as_tensor(float(_value(verl_metrics[f"distillation/{key}"]))).double(),
                **close, msg=f"{what} {key}",
            )  # fmt: skip


def _value(metric):
    """A verl `Metric`'s aggregate, or the number itself."""
    return metric.aggregate() if hasattr(metric, "aggregate") else metric


def _settings(loss_mode: str, policy_gradient: bool, clamp: float | None) -> DistillationLoss:
    return DistillationLoss(
        loss_mode=loss_mode, use_policy_gradient=policy_gradient, loss_max_clamp=clamp,
        clip_ratio_low=0.2, clip_ratio_high=0.28,
    )  # fmt: skip


def test_every_estimator_of_verls_registry_is_compared(verl_distill):
    registry = verl_distill[0].DISTILLATION_SETTINGS_REGISTRY
    assert sorted(name for name, s in registry.items() if s.use_estimator) == sorted(ESTIMATOR_MODES)
    assert sorted(name for name, s in registry.items() if s.use_topk) == ["forward_kl_topk"]


@pytest.mark.parametrize("agg_mode", AGG_MODES)
@pytest.mark.parametrize("loss_mode", ESTIMATOR_MODES)
def test_estimator_losses_match_verl(verl_distill, loss_mode, agg_mode):
    for seed in range(NUM_CASES):
        for clamp in (None, 1.5):
            losses_agree(verl_distill, _settings(loss_mode, True, clamp), agg_mode, seed)
            if (
                loss_mode != "k1"
            ):  # verl refuses to backpropagate k1 itself (its gradient ignores the teacher)
                losses_agree(verl_distill, _settings(loss_mode, False, clamp), agg_mode, seed)


def test_forward_kl_topk_matches_verls_fsdp_loss(verl_distill):
    losses_module, fsdp, config, _ = verl_distill
    for seed in range(NUM_CASES):
        gen = torch.Generator().manual_seed(seed)
        lengths = torch.randint(1, 6, (int(torch.randint(1, 4, (1,), generator=gen)),), generator=gen)
        vocab, k = 11, 4
        total = int(lengths.sum())
        logits = torch.randn(1, total, vocab, generator=gen, dtype=torch.float64) * 3
        teacher_logits = torch.randn(total, vocab, generator=gen, dtype=torch.float64) * 3
        teacher_top = torch.log_softmax(teacher_logits, -1).topk(k, dim=-1)
        splits = lengths.tolist()
        nested_logprobs = torch.nested.nested_tensor(
            list(teacher_top.values.split(splits)), layout=torch.jagged
        )
        nested_ids = torch.nested.nested_tensor(list(teacher_top.indices.split(splits)), layout=torch.jagged)
        for floor in (None, -2.0):
            loss = config.DistillationLossConfig(
                loss_mode="forward_kl_topk", topk=k, log_prob_min_clamp=floor
            )
            distill = config.DistillationConfig(enabled=False, distillation_loss=loss)
            student_logits = logits.clone().requires_grad_(True)
            outputs = fsdp.compute_forward_kl_topk(
                student_logits, nested_logprobs, nested_ids, config=distill, data_format="thd"
            )
            verl_losses = outputs["distillation_losses"].clamp_min(0.0)  # verl's registered loss clamps it
            (verl_grad,) = torch.autograd.grad(verl_losses.sum(), student_logits)
            relm_logits = logits.clone().requires_grad_(True)
            divergences, student_mass, teacher_mass = forward_kl_topk(
                relm_logits, teacher_top.values[None], teacher_top.indices[None], floor
            )
            (relm_grad,) = torch.autograd.grad(divergences.sum(), relm_logits)
            what = f"seed {seed} floor {floor}"
            close = dict(rtol=1e-5, atol=1e-6)  # verl sums the divergence in fp32 (`kl_divergence`)
            torch.testing.assert_close(divergences, verl_losses.double(), **close, msg=what)
            torch.testing.assert_close(relm_grad, verl_grad, **close, msg=what + " gradient")
            torch.testing.assert_close(student_mass, outputs["student_mass"], **close, msg=what)
            torch.testing.assert_close(teacher_mass, outputs["teacher_mass"], **close, msg=what)
