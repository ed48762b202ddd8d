"""HFRolloutEngine against HF `generate`, the trainer's forward, and hand-worked sampling filters."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedModel

from relm.learner.forward import response_logprobs
from relm.rollout.base import FINISH_LENGTH, FINISH_STOP, SamplingParams
from relm.rollout.hf_engine import HFRolloutEngine, filter_top_k_top_p, sample_next_token
from relm.rollout.padding import left_pad
from tests.tiny_models import tiny_lm

PAD = 0
PROMPTS = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10]]


@pytest.fixture(scope="module")
def model() -> PreTrainedModel:
    return tiny_lm(seed=0)


def engine(model: PreTrainedModel, eos: list[int], seed: int = 0) -> HFRolloutEngine:
    return HFRolloutEngine(model, pad_token_id=PAD, eos_token_ids=eos, device="cpu", seed=seed)


def greedy(max_new_tokens: int = 10, **kwargs) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, do_sample=False, **kwargs)


def trainer_logprobs(model, prompts, out, n: int, temperature: float) -> torch.Tensor:
    """The trainer's view: [left-padded prompts | response] through `response_logprobs`."""
    prompt_ids, prompt_mask = left_pad([p for p in prompts for _ in range(n)], PAD)
    input_ids = torch.cat([prompt_ids, out.response_ids], dim=1)
    mask = torch.cat([prompt_mask, out.response_mask], dim=1)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    with torch.no_grad():
        logprobs, _ = response_logprobs(
            model, input_ids, mask, positions, out.response_ids.shape[1], temperature=temperature
        )
    return logprobs


def test_greedy_equals_hf_generate_with_eos_and_padding(model):
    free = engine(model, eos=[]).generate(PROMPTS, greedy())
    eos = int(free.response_ids[0, 1])  # row 0 then stops after 2 tokens, others where it appears
    ours = engine(model, eos=[eos]).generate(PROMPTS, greedy())
    ids, mask = left_pad(PROMPTS, PAD)
    hf = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=10,
        pad_token_id=PAD,
        eos_token_id=eos,
    )[:, ids.shape[1] :]
    assert torch.equal(ours.response_ids[:, : hf.shape[1]], hf)
    assert (ours.response_ids[:, hf.shape[1] :] == PAD).all()


def test_eos_stops_each_row_and_length_stops_the_rest(model):
    free = engine(model, eos=[]).generate(PROMPTS, greedy())
    assert free.finish_reasons == [FINISH_LENGTH] * 3
    eos = int(free.response_ids[0, 1])
    out = engine(model, eos=[eos, 63]).generate(PROMPTS, greedy())
    for row in range(3):
        hits = (free.response_ids[row] == eos).nonzero().flatten().tolist()
        length = hits[0] + 1 if hits else 10  # eos included in the response
        assert out.response_mask[row].tolist() == [1] * length + [0] * (10 - length)
        assert torch.equal(out.response_ids[row, :length], free.response_ids[row, :length])
        assert (out.response_ids[row, length:] == PAD).all()
        assert (out.logprobs[row, length:] == 0).all()
        assert out.finish_reasons[row] == (FINISH_STOP if hits else FINISH_LENGTH)
    assert out.finish_reasons[0] == FINISH_STOP

    ignored = engine(model, eos=[eos]).generate(PROMPTS, greedy(ignore_eos=True))
    assert torch.equal(ignored.response_ids, free.response_ids)
    assert ignored.finish_reasons == [FINISH_LENGTH] * 3


def test_stops_early_when_all_rows_finished(model):
    first_tokens = engine(model, eos=[]).generate(PROMPTS, greedy(max_new_tokens=1)).response_ids[:, 0]
    out = engine(model, eos=first_tokens.tolist()).generate(PROMPTS, greedy(max_new_tokens=50))
    assert out.response_ids.shape == (3, 50)  # width is max_new_tokens even when all stop at once
    assert out.response_mask.sum(dim=1).tolist() == [1, 1, 1]
    assert out.finish_reasons == [FINISH_STOP] * 3


def test_shapes_and_grouping(model):
    params = SamplingParams(n=3, max_new_tokens=7, temperature=1.0, seed=5)
    out = engine(model, eos=[4]).generate(PROMPTS, params)
    assert out.response_ids.shape == out.response_mask.shape == out.logprobs.shape == (9, 7)
    assert (out.response_ids.dtype, out.response_mask.dtype, out.logprobs.dtype) == (
        torch.long,
        torch.long,
        torch.float32,
    )
    assert len(out.finish_reasons) == 9
    # the mask is a prefix of ones
    assert torch.equal(out.response_mask, out.response_mask.cummin(dim=1).values)

    grouped = engine(model, eos=[]).generate(PROMPTS, greedy(n=2))
    for i, prompt in enumerate(PROMPTS):
        alone = engine(model, eos=[]).generate([prompt], greedy()).response_ids[0]
        assert torch.equal(grouped.response_ids[2 * i], alone)  # padding of the batch changes nothing
        assert torch.equal(grouped.response_ids[2 * i + 1], alone)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_sampled_logprobs_equal_trainer_forward(model, temperature):
    # top-k/top-p restrict what is sampled, not the reported distribution (see sample_next_token)
    params = SamplingParams(n=2, max_new_tokens=12, temperature=temperature, top_k=20, top_p=0.9, seed=3)
    out = engine(model, eos=[5, 9, 11]).generate(PROMPTS, params)
    assert FINISH_STOP in out.finish_reasons and FINISH_LENGTH in out.finish_reasons
    expected = trainer_logprobs(model, PROMPTS, out, n=2, temperature=temperature)
    mask = out.response_mask.bool()
    torch.testing.assert_close(out.logprobs[mask], expected[mask], atol=1e-4, rtol=0)
    # and the temperature matters: the same tokens score differently at temperature 1 vs 0.6
    other = trainer_logprobs(model, PROMPTS, out, n=2, temperature=1.6 - temperature)
    assert (other[mask] - out.logprobs[mask]).abs().max() > 1e-2


def test_top_k_1_is_greedy(model):
    want = engine(model, eos=[]).generate(PROMPTS, greedy())
    got = engine(model, eos=[]).generate(PROMPTS, SamplingParams(max_new_tokens=10, top_k=1, seed=7))
    assert torch.equal(got.response_ids, want.response_ids)
    torch.testing.assert_close(got.logprobs, want.logprobs)


def test_seeds_reproduce_and_differ(model):
    eng = engine(model, eos=[])
    params = SamplingParams(n=2, max_new_tokens=10, temperature=1.0, seed=11)
    first, second = eng.generate(PROMPTS, params), eng.generate(PROMPTS, params)
    assert torch.equal(first.response_ids, second.response_ids)
    other = eng.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=10, temperature=1.0, seed=12))
    assert not torch.equal(first.response_ids, other.response_ids)
    # seed=None continues the generator: two calls in a row differ, a fresh engine replays both
    unseeded = SamplingParams(n=2, max_new_tokens=10)
    replayed = engine(model, eos=[], seed=1)
    first_call, second_call = replayed.generate(PROMPTS, unseeded), replayed.generate(PROMPTS, unseeded)
    assert not torch.equal(first_call.response_ids, second_call.response_ids)
    fresh = engine(model, eos=[], seed=1)
    assert torch.equal(fresh.generate(PROMPTS, unseeded).response_ids, first_call.response_ids)
    assert torch.equal(fresh.generate(PROMPTS, unseeded).response_ids, second_call.response_ids)


def test_restores_training_mode(model):
    model.train()
    try:
        engine(model, eos=[]).generate(PROMPTS, greedy(max_new_tokens=2))
        assert model.training
    finally:
        model.eval()


def test_sync_weights_copies_by_name_and_checks(model):
    own_copy = tiny_lm(seed=1)
    eng = engine(own_copy, eos=[])
    want = engine(model, eos=[]).generate(PROMPTS, greedy()).response_ids
    assert not torch.equal(eng.generate(PROMPTS, greedy()).response_ids, want)
    eng.sync_weights(model.named_parameters())
    assert torch.equal(eng.generate(PROMPTS, greedy()).response_ids, want)
    assert not any(
        p.data_ptr() == q.data_ptr() for p, q in zip(own_copy.parameters(), model.parameters(), strict=True)
    )

    colocated = engine(model, eos=[])
    colocated.sync_weights(model.named_parameters())  # the same tensors: nothing to copy, no error
    assert torch.equal(colocated.generate(PROMPTS, greedy()).response_ids, want)

    with pytest.raises(KeyError, match="model.not_a_layer"):
        eng.sync_weights([("model.not_a_layer", torch.zeros(1))])
    with pytest.raises(ValueError, match="lm_head.weight"):
        eng.sync_weights([("lm_head.weight", torch.zeros(3, 3))])
    with pytest.raises(ValueError, match="lm_head.weight"):
        eng.sync_weights([("lm_head.weight", torch.zeros(64, 32, dtype=torch.long))])


def test_filter_top_k_top_p_by_hand():
    # probabilities 0.05, 0.5, 0.15, 0.3 at vocab ids 0..3 (order scrambled to test the scatter back)
    logits = torch.tensor([[0.05, 0.5, 0.15, 0.3]]).log()
    kept = lambda k, p: torch.isfinite(filter_top_k_top_p(logits, k, p))[0].tolist()  # noqa: E731
    assert kept(-1, 1.0) == [True, True, True, True]
    assert kept(2, 1.0) == [False, True, False, True]
    assert kept(-1, 0.7) == [False, True, False, True]  # 0.5 < 0.7 <= 0.5 + 0.3
    assert kept(-1, 0.85) == [False, True, True, True]  # 0.8 < 0.85 <= 0.95
    assert kept(-1, 0.4) == [False, True, False, False]
    assert kept(-1, 0.0) == [False, True, False, False]  # the most likely token always stays
    # top-p over the renormalised top-3 (0.5, 0.3, 0.15)/0.95: 0.8/0.95 = 0.842 < 0.9
    assert kept(3, 0.9) == [False, True, True, True]
    assert kept(3, 0.8) == [False, True, False, True]


def test_sampling_frequencies_follow_the_filtered_distribution():
    logits = torch.tensor([0.05, 0.5, 0.15, 0.3]).log().repeat(40_000, 1)
    generator = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=1.0, top_k=3)
    tokens, logprobs = sample_next_token(logits, params, generator)
    freqs = torch.bincount(tokens, minlength=4).float() / tokens.numel()
    torch.testing.assert_close(freqs, torch.tensor([0.0, 0.5, 0.15, 0.3]) / 0.95, atol=0.01, rtol=0)
    # reported logprobs are unfiltered: log 0.5 for token 1, not log(0.5 / 0.95)
    torch.testing.assert_close(logprobs[tokens == 1], torch.full_like(logprobs[tokens == 1], 0.5).log())
    # temperature 0.5 squares and renormalises the probabilities
    hot = SamplingParams(temperature=0.5)
    tokens, _ = sample_next_token(logits, hot, generator)
    squared = torch.tensor([0.05, 0.5, 0.15, 0.3]) ** 2
    freqs = torch.bincount(tokens, minlength=4).float() / tokens.numel()
    torch.testing.assert_close(freqs, squared / squared.sum(), atol=0.01, rtol=0)


def test_rejects_empty_prompt(model):
    with pytest.raises(ValueError, match="empty prompt"):
        engine(model, eos=[]).generate([[1, 2], []], greedy())
