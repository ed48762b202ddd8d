"""The trainer forward against a hand computation on the full model output."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import PreTrainedModel

from relm.learner.forward import response_logprobs, response_values
from relm.models.value_model import ValueModel
from relm.rollout.padding import left_pad
from tests.tiny_models import tiny_lm

PAD = 0
R = 4  # response width


@pytest.fixture(scope="module")
def model() -> PreTrainedModel:
    return tiny_lm()


def experience(prompts: list[list[int]], responses: list[list[int]]):
    """[left-padded prompts | right-padded responses] ids, mask, positions, as the trainer builds them."""
    prompt_ids, prompt_mask = left_pad(prompts, PAD)
    response_ids = torch.full((len(responses), R), PAD)
    response_mask = torch.zeros((len(responses), R), dtype=torch.long)
    for row, resp in enumerate(responses):
        response_ids[row, : len(resp)] = torch.tensor(resp)
        response_mask[row, : len(resp)] = 1
    ids = torch.cat([prompt_ids, response_ids], dim=1)
    mask = torch.cat([prompt_mask, response_mask], dim=1)
    return ids, mask, (mask.cumsum(dim=1) - 1).clamp(min=0)


PROMPTS = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10]]  # rows 1 and 2 are left-padded
RESPONSES = [[11, 12, 13, 14], [15, 16], [17]]  # rows 1 and 2 are right-padded


def by_hand(model, ids, mask, positions, temperature):
    """log_softmax over the whole [N, T, V] output, then the response slice: the obvious way."""
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits / temperature
    logp = torch.log_softmax(logits.float(), dim=-1)[:, -R - 1 : -1]  # [N, R, V]
    chosen = logp.gather(-1, ids[:, -R:, None]).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return chosen, entropy


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("vocab_chunk", [None, 3, 8])  # whole, column slices of a row, two rows a block
def test_logprobs_and_entropy_equal_hand_computation(model, temperature, vocab_chunk):
    ids, mask, positions = experience(PROMPTS, RESPONSES)
    with torch.no_grad():
        want_lp, want_ent = by_hand(model, ids, mask, positions, temperature)
        got_lp, got_ent = response_logprobs(
            model,
            ids,
            mask,
            positions,
            R,
            temperature=temperature,
            compute_entropy=True,
            vocab_chunk=vocab_chunk,
        )
    assert got_lp.shape == got_ent.shape == (3, R) and got_lp.dtype == torch.float32
    torch.testing.assert_close(got_lp, want_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(got_ent, want_ent, atol=1e-5, rtol=0)
    assert (got_ent > 0).all() and (got_ent < torch.log(torch.tensor(64.0))).all()


def test_left_padding_does_not_change_logprobs(model):
    ids, mask, positions = experience(PROMPTS, RESPONSES)
    with torch.no_grad():
        batched, _ = response_logprobs(model, ids, mask, positions, R)
        for row in (1, 2):
            alone_ids, alone_mask, alone_pos = experience([PROMPTS[row]], [RESPONSES[row]])
            alone, _ = response_logprobs(model, alone_ids, alone_mask, alone_pos, R)
            n = len(RESPONSES[row])
            torch.testing.assert_close(batched[row, :n], alone[0, :n], atol=1e-5, rtol=0)


def test_no_entropy_unless_asked(model):
    ids, mask, positions = experience(PROMPTS, RESPONSES)
    with torch.no_grad():
        _, entropy = response_logprobs(model, ids, mask, positions, R)
    assert entropy is None


def test_chunked_gradients_equal_hand_computation(model):
    """The checkpointed chunks must backpropagate exactly like the unchunked formula."""
    ids, mask, positions = experience(PROMPTS, RESPONSES)
    weights = mask[:, -R:].float()
    lp, ent = response_logprobs(
        model, ids, mask, positions, R, temperature=0.7, compute_entropy=True, vocab_chunk=3
    )
    got = torch.autograd.grad(((lp + 0.1 * ent) * weights).sum(), list(model.parameters()))
    want_lp, want_ent = by_hand(model, ids, mask, positions, 0.7)
    want = torch.autograd.grad(((want_lp + 0.1 * want_ent) * weights).sum(), list(model.parameters()))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("remove_padding", [False, True])
def test_entropy_as_a_metric_only_stays_out_of_backward(model, remove_padding):
    """`entropy_grad=False` (entropy_coeff 0): same values, an entropy without a graph, and the
    logprob gradients equal the hand computation's."""
    ids, mask, positions = experience(PROMPTS, RESPONSES)
    weights = mask[:, -R:].float()
    lp, ent = response_logprobs(
        model, ids, mask, positions, R, temperature=0.7, compute_entropy=True, entropy_grad=False,
        vocab_chunk=3, remove_padding=remove_padding,
    )  # fmt: skip
    assert not ent.requires_grad
    want_lp, want_ent = by_hand(model, ids, mask, positions, 0.7)
    torch.testing.assert_close(ent * weights, want_ent.detach() * weights, atol=1e-5, rtol=1e-5)
    got = torch.autograd.grad((lp * weights).sum(), list(model.parameters()))
    want = torch.autograd.grad((want_lp * weights).sum(), list(model.parameters()))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


class WithoutLogitsToKeep(nn.Module):
    """A causal LM whose forward has no `logits_to_keep`, like some remote-code models."""

    def __init__(self, inner: PreTrainedModel) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask, position_ids, use_cache=False):
        return self.inner(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=use_cache
        )


def test_model_without_logits_to_keep_gives_the_same_logprobs(model):
    ids, mask, positions = experience(PROMPTS, RESPONSES)
    with torch.no_grad():
        want, _ = response_logprobs(model, ids, mask, positions, R)
        got, _ = response_logprobs(WithoutLogitsToKeep(model), ids, mask, positions, R)
    torch.testing.assert_close(got, want)


def test_bad_response_width(model):
    ids, mask, positions = experience(PROMPTS, RESPONSES)
    with pytest.raises(ValueError, match="response_width"):
        response_logprobs(model, ids, mask, positions, ids.shape[1])


def test_values_are_those_of_the_state_before_each_token():
    value_model = ValueModel(tiny_lm(seed=2))
    with torch.no_grad():
        value_model.value_head.weight.normal_()
        value_model.value_head.bias.fill_(0.5)
    ids, mask, positions = experience(PROMPTS, RESPONSES)
    with torch.no_grad():
        values = response_values(value_model, ids, mask, positions, R)
        full = value_model(ids, mask, positions)
        assert values.shape == (3, R) and values.dtype == torch.float32
        torch.testing.assert_close(values, full[:, -R - 1 : -1])
        # value t must depend only on the prompt and tokens < t: cut the sequence just before token t
        prompt_width = ids.shape[1] - R
        for t in range(R):
            cut = prompt_width + t
            prefix = value_model(ids[:, :cut], mask[:, :cut], positions[:, :cut])[:, -1]
            torch.testing.assert_close(values[:, t], prefix, atol=1e-5, rtol=0)
