"""The experience stage's forward passes keep each result's trailing shape and dtype (`_in_forward_passes`), and
the padded forward's k-targets path gives the sum of squared probabilities per position."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedModel

from relm.learner.batch import Rollout
from relm.learner.forward import _padded_token_stats, response_token_stats, response_topk
from relm.rollout.padding import left_pad
from relm.trainer.experience import batched_logprobs_and_sum_pi_squared, batched_topk, unpack_topk
from tests.tiny_models import tiny_lm

PAD = 0
R = 4
PROMPTS = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10]]
RESPONSES = [[11, 12, 13, 14], [15, 16], [17]]


@pytest.fixture(scope="module")
def model() -> PreTrainedModel:
    torch.manual_seed(0)
    return tiny_lm()


def rollout() -> Rollout:
    prompt_ids, prompt_mask = left_pad(PROMPTS, PAD)
    response_ids = torch.full((len(RESPONSES), R), PAD)
    response_mask = torch.zeros((len(RESPONSES), R), dtype=torch.long)
    for row, resp in enumerate(RESPONSES):
        response_ids[row, : len(resp)] = torch.tensor(resp)
        response_mask[row, : len(resp)] = 1
    n = len(RESPONSES)
    return Rollout(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
        response_mask=response_mask, response_attention_mask=response_mask, group_ids=torch.arange(n),
        data_sources=["t"] * n, ground_truths=[None] * n, extra_infos=[{}] * n, finish_reasons=["stop"] * n,
        rollout_logprobs=torch.zeros(n, R),
    )  # fmt: skip


def test_k_targets_give_logprobs_per_id_and_squares_per_position(model):
    batch = rollout()
    ids, mask, positions = batch.input_ids, batch.attention_mask, batch.position_ids
    with torch.no_grad():
        one = response_token_stats(
            model, ids, mask, positions, R, temperature=0.7, compute_sum_pi_squared=True
        )
        targets = torch.stack([ids[:, -R:], (ids[:, -R:] + 5) % 64], dim=-1)  # [N, R, 2]
        many = _padded_token_stats(
            model, ids, mask, positions, R, targets, temperature=0.7, compute_entropy=True, entropy_grad=False,
            vocab_chunk=3, vocab_limit=None, compute_sum_pi_squared=True,
        )  # fmt: skip
    assert many.logprobs.shape == (3, R, 2) and many.entropy is not None and many.entropy.shape == (3, R)
    assert one.sum_pi_squared is not None and many.sum_pi_squared is not None
    assert many.sum_pi_squared.shape == (3, R)
    torch.testing.assert_close(many.logprobs[..., 0], one.logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(many.sum_pi_squared, one.sum_pi_squared, atol=1e-6, rtol=0)


def test_passes_of_one_row_stack_logprobs_and_squares_like_one_forward(model):
    batch = rollout()
    got = batched_logprobs_and_sum_pi_squared(
        model, batch, rows_per_forward=1, temperature=1.0, device=torch.device("cpu")
    )
    with torch.no_grad():
        want = response_token_stats(
            model, batch.input_ids, batch.attention_mask, batch.position_ids, R, compute_sum_pi_squared=True
        )
    assert got.shape == (3, R, 2) and got.dtype == torch.float32
    assert want.sum_pi_squared is not None
    torch.testing.assert_close(got[..., 0], want.logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(got[..., 1], want.sum_pi_squared, atol=1e-6, rtol=0)


def test_top_k_passes_keep_float64_so_every_id_comes_back_exactly(model):
    batch = rollout()
    packed = batched_topk(model, batch, 3, rows_per_forward=2, device=torch.device("cpu"))
    assert packed.shape == (3, R, 3, 2) and packed.dtype == torch.float64
    top = unpack_topk(packed)
    values, ids = response_topk(model, batch.input_ids, batch.attention_mask, batch.position_ids, R, 3)
    assert torch.equal(top.ids, ids)
    torch.testing.assert_close(top.logprobs, values)
