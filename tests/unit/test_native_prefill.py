"""The native engine's prefill: forwards grouped by prompt length, the causal path, the output head.

Prompts are left-padded to one width; a prefill forward computes only the columns its longest prompt
uses, a forward of equal-length prompts attends through sdpa's plain causal path, and the output head
reads the last position's states contiguous. Tokens and logprobs must stay the HF engine's.
"""

from __future__ import annotations

import pytest
import torch

from relm.rollout.native.engine import prefill_chunks
from tests.unit.test_native_engine import ARCHITECTURES, greedy, native, prompts_for, reference, zoo_model


@pytest.mark.parametrize("budget", [6, 14, 1000])  # column chunks of 6, rows of 2 prompts, one forward
def test_unpadded_prompts_prefill_through_causal_attention_in_any_chunking(budget):
    # Equal-length prompts: the first column chunk of each row chunk has no padding, so it takes sdpa's
    # plain causal path; later column chunks read the cache under the mask.
    model = zoo_model("tiny/llama").requires_grad_(False)
    prompts, params = prompts_for(model, [7, 7, 7, 7, 7]), greedy(n=2, max_new_tokens=8)
    ours = native(model, eos=[], max_prefill_tokens=budget).generate(prompts, params)
    theirs = reference(model, eos=[]).generate(prompts, params)
    assert torch.equal(ours.response_ids, theirs.response_ids)
    torch.testing.assert_close(ours.logprobs, theirs.logprobs, atol=1e-5, rtol=0)


def test_the_output_head_reads_contiguous_hidden_states_in_prefill():
    # A [u, 1, hidden] slice of the prompts' last positions would run as a batched product reading the
    # head's weight once per prompt; the engine makes it contiguous (one product).
    model = zoo_model("tiny/qwen2").requires_grad_(False)
    seen = []
    model.lm_head.register_forward_hook(lambda _, args, out: seen.append(args[0].is_contiguous()))
    native(model, eos=[]).generate(prompts_for(model), greedy(max_new_tokens=3))
    assert seen and all(seen)
    assert not model.lm_head._forward_pre_hooks  # removed after the call


def sdpa_causal_calls(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Records is_causal of every sdpa call from now on."""
    calls: list[bool] = []
    original = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(bool(kwargs.get("is_causal", False)))
        return original(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return calls


@pytest.mark.parametrize(
    ("name", "lengths", "causal"),
    [
        ("tiny/llama", [7, 7, 7], True),
        ("tiny/llama", [7, 5, 7], False),  # left padding: the mask decides
        ("tiny/gemma2", [7, 7, 7], False),  # soft-capped: sdpa has no soft-capping
        ("tiny/mistral", [30, 30], False),  # a 16-column window inside the prompt
        ("tiny/mistral", [9, 9], True),  # ... or not
    ],
)
def test_prefill_takes_the_causal_path_only_where_it_is_exact(name, lengths, causal, monkeypatch):
    model = zoo_model(name).requires_grad_(False)
    calls = sdpa_causal_calls(monkeypatch)
    native(model, eos=[]).generate(prompts_for(model, lengths), greedy(max_new_tokens=2))
    assert calls.count(True) == (model.config.num_hidden_layers if causal else 0)


def test_prefill_chunks_group_prompts_by_length_within_the_budget():
    # Lengths 3, 8, 5, 8, 2 left-padded to 8 columns, 16 tokens a forward: the two 8s (16 tokens),
    # then 5 and 3 (up to 3 prompts of 5 columns), then 2 alone.
    assert prefill_chunks([3, 8, 5, 8, 2], width=8, budget=16) == [([1, 3], 0), ([2, 0, 4], 3)]
    assert prefill_chunks([3, 8, 5, 8, 2], width=8, budget=10) == [([1], 0), ([3], 0), ([2, 0], 3), ([4], 6)]
    assert prefill_chunks([20, 4], width=20, budget=8) == [([0], 0), ([1], 16)]  # over budget: alone
    assert prefill_chunks([], width=4, budget=8) == []


@pytest.mark.parametrize("budget", [8, 15, 8192])
def test_varied_prompts_prefill_only_the_columns_their_group_uses(budget, monkeypatch):
    model = zoo_model("tiny/mistral").requires_grad_(False)  # a 16-column window: long prompts cross it
    lengths = [5, 23, 2, 30, 5, 5]
    seen_tokens = []
    hook = model.model.embed_tokens.register_forward_hook(
        lambda _, args, out: seen_tokens.append(args[0].numel())
    )
    calls = sdpa_causal_calls(monkeypatch)
    prompts, params = prompts_for(model, lengths), greedy(n=2, max_new_tokens=10)
    ours = native(model, eos=[], max_prefill_tokens=budget).generate(prompts, params)
    hook.remove()
    theirs = reference(model, eos=[]).generate(prompts, params)
    assert torch.equal(ours.response_ids, theirs.response_ids)
    torch.testing.assert_close(ours.logprobs, theirs.logprobs, atol=1e-5, rtol=0)
    prefill_tokens = sum(seen_tokens[: len(seen_tokens) - (params.max_new_tokens - 1)])
    chunks = prefill_chunks(lengths, 30, budget)
    assert prefill_tokens == sum(len(rows) * (30 - start) for rows, start in chunks)
    if budget == 8:  # every prompt in a forward of its own: no padding computed at all
        assert prefill_tokens == sum(lengths)
    if budget == 15:  # the three 5-token prompts share a forward with no padding: causal path
        assert ([0, 4, 5], 25) in chunks and calls.count(True) >= model.config.num_hidden_layers


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_length_grouped_prefill_keeps_every_architectures_tokens(name):
    # A 12-token budget over prompts of 5, 23, 2 and 30 tokens: every forward starts past some left
    # padding, the long prompts go in column chunks that read earlier chunks from the cache.
    model = zoo_model(name).requires_grad_(False)
    prompts, params = prompts_for(model), greedy(n=2, max_new_tokens=12)
    ours = native(model, eos=[], max_prefill_tokens=12).generate(prompts, params)
    theirs = reference(model, eos=[]).generate(prompts, params)
    assert torch.equal(ours.response_ids, theirs.response_ids)
    torch.testing.assert_close(ours.logprobs, theirs.logprobs, atol=1e-5, rtol=0)
