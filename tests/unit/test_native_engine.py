"""NativeRolloutEngine against HF `generate`, the HF engine and the trainer's forward.

CPU tests run in fp32, where the native engine's grouped attention and transformers' attention
differ by rounding only, so greedy tokens must be identical. Tests marked `gpu` check the CUDA-graph
path against the eager one on the same device.
"""

from __future__ import annotations

import itertools
import logging

import pytest
import torch
from transformers import AutoModelForCausalLM, GptOssConfig, PreTrainedModel, Qwen2Config

from relm.errors import UserError
from relm.learner.forward import response_logprobs
from relm.memory.rollout_budget import (
    bytes_per_row,
    check_rollout_memory,
    kv_bytes_per_token,
    rows_within_budget,
)
from relm.models.loading import load_causal_lm
from relm.models.zoo import ZOO, materialize_zoo
from relm.rollout.base import FINISH_LENGTH, FINISH_STOP, SamplingParams
from relm.rollout.hf_engine import HFRolloutEngine
from relm.rollout.native.attention import restrict_to_window
from relm.rollout.native.engine import NativeRolloutEngine
from relm.rollout.native.grouped_attention import grouped_attention
from relm.rollout.padding import left_pad

# Lengths around the tiny zoo's sliding window (16): the 30-token prompt and 20 new tokens make the
# window cut in both prefill and decode; the 2-token prompt gives 28 columns of left padding.
PROMPT_LENGTHS = [5, 23, 2, 30]
ARCHITECTURES = [
    name
    for name in (
        "tiny/qwen2",
        "tiny/llama",
        "tiny/gemma2",
        "tiny/mistral",
        "tiny/phi3",
        "tiny/gemma3",
        "tiny/qwen3",
        "tiny/qwen2-moe",
        "tiny/qwen3-moe",
        "tiny/mixtral",
        "tiny/deepseek-v2",
        "tiny/olmoe",
        "tiny/phimoe",
    )
    if name in ZOO
]


def zoo_model(name: str, device: str = "cpu", dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    return load_causal_lm(str(materialize_zoo(f"zoo:{name}")), dtype=dtype, device=device)


def pad_id(model: PreTrainedModel) -> int:
    return model.config.pad_token_id if model.config.pad_token_id is not None else 0


def prompts_for(
    model: PreTrainedModel, lengths: list[int] = PROMPT_LENGTHS, seed: int = 0
) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    high = min(model.config.vocab_size, 60)
    return [torch.randint(3, high, (n,), generator=generator).tolist() for n in lengths]


def native(model: PreTrainedModel, eos: list[int], **kwargs) -> NativeRolloutEngine:
    return NativeRolloutEngine(model, pad_token_id=pad_id(model), eos_token_ids=eos, device="cpu", **kwargs)


def reference(model: PreTrainedModel, eos: list[int]) -> HFRolloutEngine:
    return HFRolloutEngine(model, pad_token_id=pad_id(model), eos_token_ids=eos, device=model.device)


def greedy(max_new_tokens: int = 20, **kwargs) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, do_sample=False, **kwargs)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_greedy_equals_hf_generate_and_hf_engine(name):
    model = zoo_model(name)
    prompts, pad = prompts_for(model), pad_id(model)
    free = native(model, eos=[]).generate(prompts, greedy())
    eos = int(free.response_ids[0, 3])  # row 0 stops after 4 tokens, the others where it appears
    ours = native(model, eos=[eos]).generate(prompts, greedy())
    assert FINISH_STOP in ours.finish_reasons

    theirs = reference(model, eos=[eos]).generate(prompts, greedy())
    assert torch.equal(ours.response_ids, theirs.response_ids)
    assert torch.equal(ours.response_mask, theirs.response_mask)
    assert ours.finish_reasons == theirs.finish_reasons
    torch.testing.assert_close(ours.logprobs, theirs.logprobs, atol=1e-4, rtol=0)

    ids, mask = left_pad(prompts, pad)
    generated = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=20,
        pad_token_id=pad,
        eos_token_id=eos,
    )[:, ids.shape[1] :]
    assert torch.equal(ours.response_ids[:, : generated.shape[1]], generated)
    assert model.config._attn_implementation in ("sdpa", "eager")  # switched back after generating


def trainer_logprobs(model, prompts, out, n: int, temperature: float) -> torch.Tensor:
    prompt_ids, prompt_mask = left_pad([p for p in prompts for _ in range(n)], pad_id(model))
    input_ids = torch.cat([prompt_ids, out.response_ids], dim=1)
    mask = torch.cat([prompt_mask, out.response_mask], dim=1)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    input_ids, mask, positions = (t.to(model.device) for t in (input_ids, mask, positions))
    logprobs, _ = response_logprobs(
        model, input_ids, mask, positions, out.response_ids.shape[1], temperature=temperature
    )
    return logprobs.cpu()


@pytest.mark.parametrize("name", ["tiny/qwen2", "tiny/gemma2"])
@torch.no_grad()
def test_sampled_logprobs_equal_trainer_forward(name):
    model = zoo_model(name)
    prompts = prompts_for(model)
    params = SamplingParams(n=2, max_new_tokens=16, temperature=0.7, top_k=20, top_p=0.9, seed=3)
    out = native(model, eos=[5, 9, 11, 17]).generate(prompts, params)
    expected = trainer_logprobs(model, prompts, out, n=2, temperature=0.7)
    mask = out.response_mask.bool()
    assert mask.sum() > 40
    torch.testing.assert_close(out.logprobs[mask], expected[mask], atol=1e-4, rtol=0)


def test_n_samples_share_prefill_and_match_repeated_prompts_and_hf_engine():
    model = zoo_model("tiny/qwen2")
    prompts = prompts_for(model)
    params = SamplingParams(n=3, max_new_tokens=12, temperature=1.0, seed=5)
    shared = native(model, eos=[7]).generate(prompts, params)
    repeated_prompts = [p for p in prompts for _ in range(3)]
    repeated = native(model, eos=[7]).generate(
        repeated_prompts, SamplingParams(**{**params.__dict__, "n": 1})
    )
    assert torch.equal(shared.response_ids, repeated.response_ids)
    torch.testing.assert_close(shared.logprobs, repeated.logprobs, atol=1e-5, rtol=0)
    # Same seed, same draws: the HF engine samples the same tokens.
    hf = reference(model, eos=[7]).generate(prompts, params)
    assert torch.equal(shared.response_ids, hf.response_ids)
    # The samples of one prompt differ (they are samples, not copies).
    assert not torch.equal(shared.response_ids[0], shared.response_ids[1])


def test_seed_reproduces_and_differs():
    model = zoo_model("tiny/llama")
    engine = native(model, eos=[])
    params = SamplingParams(n=2, max_new_tokens=10, seed=11)
    first, second = engine.generate(prompts_for(model), params), engine.generate(prompts_for(model), params)
    assert torch.equal(first.response_ids, second.response_ids)
    other = engine.generate(prompts_for(model), SamplingParams(n=2, max_new_tokens=10, seed=12))
    assert not torch.equal(first.response_ids, other.response_ids)


def test_all_rows_stopping_ends_early_with_full_width_and_modes_restored():
    model = zoo_model("tiny/qwen2")
    model.train()
    prompts = prompts_for(model, [4, 9])
    first = native(model, eos=[]).generate(prompts, greedy(max_new_tokens=1)).response_ids[:, 0]
    engine = native(model, eos=first.tolist())
    out = engine.generate(prompts, greedy(max_new_tokens=50))
    assert out.response_ids.shape == (2, 50)
    assert out.response_mask.sum(dim=1).tolist() == [1, 1]
    assert out.finish_reasons == [FINISH_STOP, FINISH_STOP]
    assert engine.last_stats["decode_steps"] == 0  # stopped right after the first token
    assert model.training and model.config._attn_implementation == "sdpa"
    ignored = native(model, eos=first.tolist()).generate(prompts, greedy(max_new_tokens=5, ignore_eos=True))
    assert ignored.finish_reasons == [FINISH_LENGTH, FINISH_LENGTH]
    assert ignored.response_mask.sum().item() == 10


def test_cache_is_reused_and_grown():
    model = zoo_model("tiny/qwen2")
    engine = native(model, eos=[])
    engine.generate(prompts_for(model, [6, 8]), greedy(max_new_tokens=8))
    buffers = engine._buffers
    assert (buffers.num_rows, buffers.max_length) == (2, 16)
    engine.generate(prompts_for(model, [3]), greedy(max_new_tokens=4))
    assert engine._buffers is buffers  # smaller call, same buffers
    out = engine.generate(prompts_for(model, [6, 8, 12]), greedy(max_new_tokens=8))
    assert (engine._buffers.num_rows, engine._buffers.max_length) == (3, 20)
    hf = reference(model, eos=[]).generate(prompts_for(model, [6, 8, 12]), greedy(max_new_tokens=8))
    assert torch.equal(out.response_ids, hf.response_ids)  # stale columns of the old call do not leak


def test_sync_weights_in_place_and_gradient_checkpointing_model():
    model, other = zoo_model("tiny/qwen2"), zoo_model("tiny/qwen2")
    with torch.no_grad():
        for param in other.parameters():
            param.add_(torch.randn_like(param) * 0.5)
    other.gradient_checkpointing_enable()
    other.train()
    prompts = prompts_for(model)
    want = reference(model, eos=[]).generate(prompts, greedy()).response_ids
    engine = native(other, eos=[])
    assert not torch.equal(engine.generate(prompts, greedy()).response_ids, want)
    addresses = [p.data_ptr() for p in other.parameters()]
    engine.sync_weights(model.named_parameters())
    assert [p.data_ptr() for p in other.parameters()] == addresses  # in place: graphs stay valid
    assert torch.equal(engine.generate(prompts, greedy()).response_ids, want)
    assert other.training


# Continuous batching and chunked prefill must not change a greedy token: sliding windows (gemma2,
# mistral), soft-capping (gemma2), MoE routing (qwen2-moe, mixtral), latent KV heads (deepseek-v2).
CONTINUOUS_ARCHITECTURES = [
    name
    for name in (
        "tiny/qwen2",
        "tiny/gemma2",
        "tiny/mistral",
        "tiny/qwen2-moe",
        "tiny/mixtral",
        "tiny/deepseek-v2",
    )
    if name in ZOO
]


def varied_eos(free: torch.Tensor) -> tuple[tuple[int, int], list[int]]:
    """The eos pair under which greedy rows `free` [N, R] (generated with eos ignored) end at the most
    different lengths, and those lengths."""
    width = free.shape[1]
    first_hit: dict[int, list[int]] = {}  # token -> per row, the length a response ending on it has
    for row, tokens in enumerate(free.tolist()):
        for position in reversed(range(width)):
            first_hit.setdefault(tokens[position], [width] * free.shape[0])[row] = position + 1

    def lengths(eos: tuple[int, int]) -> list[int]:
        return [min(a, b) for a, b in zip(first_hit[eos[0]], first_hit[eos[1]], strict=True)]

    best = max(itertools.combinations(sorted(first_hit), 2), key=lambda eos: len(set(lengths(eos))))
    return best, lengths(best)


def varied_model(name: str) -> tuple[PreTrainedModel, list[list[int]], list[int]]:
    """A zoo model, prompts and eos ids that end its greedy responses at 3 or more different lengths.

    Some tiny random models repeat one token per row under greedy decoding (tiny/qwen2), so no eos
    set varies their lengths; their weights are then perturbed (fixed seed) until responses vary.
    """
    model = zoo_model(name)
    prompts = prompts_for(model)
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        eos, lengths = varied_eos(native(model, eos=[]).generate(prompts, greedy()).response_ids)
        if len(set(lengths)) >= 3:
            return model, prompts, list(eos)
        with torch.no_grad():
            for param in model.parameters():
                param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    raise AssertionError(f"{name}: no eos pair varies the greedy lengths")


@pytest.mark.parametrize("name", CONTINUOUS_ARCHITECTURES)
def test_three_slots_for_eight_rows_equal_all_rows_at_once(name):
    model, prompts, eos = varied_model(name)
    params = greedy(n=2)  # 4 prompts x 2 = 8 rows, grouped [p0, p0, p1, p1, ...]
    at_once = native(model, eos=eos).generate(prompts, params)
    lengths = at_once.response_mask.sum(dim=1).tolist()
    assert len(set(lengths)) >= 3 and FINISH_STOP in at_once.finish_reasons, lengths

    # Checking eos every 3 steps: rows that ended wait for the check before their slot refills.
    engine = native(model, eos=eos, max_num_seqs=3, eos_check_interval=3)
    slotted = engine.generate(prompts, params)
    assert engine.last_stats["slots"] == 3 and engine.last_stats["admissions"] >= 3
    assert torch.equal(slotted.response_ids, at_once.response_ids)  # row order included
    assert torch.equal(slotted.response_mask, at_once.response_mask)
    assert slotted.finish_reasons == at_once.finish_reasons
    torch.testing.assert_close(slotted.logprobs, at_once.logprobs, atol=1e-5, rtol=0)
    # ... and so equal HF generate, which the all-at-once engine is checked against above.
    assert all_at_once_row_order_is_prompt_major(slotted.response_ids)


def all_at_once_row_order_is_prompt_major(response_ids: torch.Tensor) -> bool:
    """Greedy samples of one prompt are equal: rows 2i and 2i+1 hold the same response."""
    return torch.equal(response_ids[0::2], response_ids[1::2])


@pytest.mark.parametrize("name", ["tiny/qwen2", "tiny/gemma2"])
@torch.no_grad()
def test_continuous_batching_sampled_logprobs_equal_trainer_forward(name):
    model = zoo_model(name)
    prompts = prompts_for(model)
    params = SamplingParams(n=3, max_new_tokens=16, temperature=0.7, seed=3)
    engine = native(model, eos=[5, 9, 11, 17], max_num_seqs=4, eos_check_interval=2)
    out = engine.generate(prompts, params)
    assert engine.last_stats["admissions"] >= 2
    expected = trainer_logprobs(model, prompts, out, n=3, temperature=0.7)
    mask = out.response_mask.bool()
    assert mask.sum() > 60 and FINISH_STOP in out.finish_reasons
    torch.testing.assert_close(out.logprobs[mask], expected[mask], atol=1e-4, rtol=0)
    assert torch.equal(engine.generate(prompts, params).response_ids, out.response_ids)  # same seed


@pytest.mark.parametrize("name", ["tiny/qwen2", "tiny/gemma2", "tiny/qwen2-moe"])
def test_chunked_prefill_equals_whole_prompts(name):
    model = zoo_model(name)
    prompts = prompts_for(model)  # up to 30 tokens: chunks of 8 columns cross gemma2's 16-token window
    whole = native(model, eos=[]).generate(prompts, greedy(n=2))
    for slots in (None, 3):
        engine = native(model, eos=[], max_prefill_tokens=8, max_num_seqs=slots)
        chunked = engine.generate(prompts, greedy(n=2))
        assert torch.equal(chunked.response_ids, whole.response_ids)
        torch.testing.assert_close(chunked.logprobs, whole.logprobs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["tiny/qwen2", "tiny/gemma2"])
def test_continuous_batching_with_the_buckets_cuda_graphs_use(name):
    # What graphs add on CUDA, here on CPU: a padding row past the 3 slots, attention over rounded-up
    # lengths (idle and finished slots' columns beyond what they attend), eos checked every 8 steps.
    model, prompts, eos = varied_model(name)
    at_once = native(model, eos=eos).generate(prompts, greedy(n=2))
    engine = native(model, eos=eos, max_num_seqs=3, eos_check_interval=8)
    engine._row_bucket = lambda num_rows: 1 << (num_rows - 1).bit_length()
    engine._length_bucket = lambda live_columns, max_length: min(max_length, -(-live_columns // 16) * 16)
    out = engine.generate(prompts, greedy(n=2))
    assert engine._buffers.num_rows == 4 and engine.last_stats["admissions"] >= 2
    assert torch.equal(out.response_ids, at_once.response_ids)
    torch.testing.assert_close(out.logprobs, at_once.logprobs, atol=1e-5, rtol=0)
    assert all(torch.isfinite(keys).all() for keys in engine._buffers.cache.key_buffers.values())


def test_rows_that_fit_decode_in_lock_step():
    model = zoo_model("tiny/qwen2")
    prompts = prompts_for(model)
    params = SamplingParams(n=2, max_new_tokens=12, seed=5)
    engine = native(model, eos=[7], max_num_seqs=8)  # exactly the 8 rows
    out = engine.generate(prompts, params)
    assert engine.last_stats["slots"] == 8 and engine.last_stats["admissions"] == 0
    # Lock-step draws are the HF engine's draws.
    assert torch.equal(out.response_ids, reference(model, eos=[7]).generate(prompts, params).response_ids)
    assert not engine._buffers.cache.write_columns.any()  # the per-row write path never ran


def test_restrict_to_window_by_hand():
    # One row, left padding at column 0, queries at columns 1..3 (their own column is the last True).
    mask = torch.tensor(
        [[False, True, False, False], [False, True, True, False], [False, True, True, True]]
    ).view(1, 1, 3, 4)
    got = restrict_to_window(mask, window=2)[0, 0].int().tolist()
    # window 2: column q attends q-1 and q only
    assert got == [[0, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]


def test_grouped_attention_matches_repeated_kv_softmax():
    torch.manual_seed(0)
    query, key, value = torch.randn(2, 6, 3, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    mask = torch.rand(2, 1, 3, 5) > 0.3
    mask[..., 0] = True
    for softcap in (None, 2.0):
        got = grouped_attention(query, key, value, mask, 0.5, softcap)  # [B, Q, H, D]
        k, v = (
            key.repeat_interleave(3, dim=1),
            value.repeat_interleave(3, dim=1),
        )  # head h uses KV head h // 3
        scores = query @ k.transpose(-1, -2) * 0.5
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        want = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v
        torch.testing.assert_close(got, want.transpose(1, 2), atol=1e-6, rtol=1e-6)


def test_attention_sinks_fall_back_to_hf_engine_with_a_warning(caplog):
    config = GptOssConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=8,
        max_position_embeddings=128,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    engine = native(model, eos=[])
    with caplog.at_level(logging.WARNING, logger="relm"):
        out = engine.generate([[1, 2, 3], [4, 5]], greedy(max_new_tokens=6))
    assert "s_aux" in engine.fallback_reason and "HF engine" in caplog.text
    hf = reference(model, eos=[]).generate([[1, 2, 3], [4, 5]], greedy(max_new_tokens=6))
    assert torch.equal(out.response_ids, hf.response_ids)
    assert model.config._attn_implementation == "eager"


def test_memory_budget_by_hand():
    config = Qwen2Config(
        vocab_size=1000, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2
    )
    # keys + values x 3 layers x 2 KV heads x head_dim 16 x 2 bytes (bf16)
    assert kv_bytes_per_token(config, dtype_bytes=2) == 2 * 3 * 2 * 16 * 2 == 384
    # 8 rows x 100 tokens: KV 307,200 bytes; sampling 8 x 1000 x 4 bytes x 4 rows = 128,000; weights 1e6
    need = 1_000_000 + 307_200 + 128_000
    fits = dict(weight_bytes=1_000_000, dtype_bytes=2, rows=8, length=100, total_bytes=10 * need)
    check_rollout_memory(config, gpu_memory_utilization=0.1, **fits)  # exactly the share
    with pytest.raises(UserError, match=r"gpu_memory_utilization=0.09 .* 8 rows x 100 tokens"):
        check_rollout_memory(config, gpu_memory_utilization=0.09, **fits)


def test_rows_within_budget_by_hand():
    config = Qwen2Config(
        vocab_size=1000, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2
    )
    # A row of 100 tokens: KV 100 x 384 = 38,400 bytes, sampling 1000 x 4 x 4 = 16,000: 54,400 bytes.
    common = dict(weight_bytes=1_000_000, dtype_bytes=2, length=100, total_bytes=10_000_000)
    assert rows_within_budget(config, gpu_memory_utilization=0.5, **common) == 4_000_000 // 54_400 == 73
    assert rows_within_budget(config, gpu_memory_utilization=0.1, **common) == 0  # weights alone fill it


def test_cuda_graphs_need_cuda():
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        native(zoo_model("tiny/qwen2"), eos=[], use_cuda_graphs=True)


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("name", ["tiny/qwen2", "tiny/gemma2", "tiny/mistral", "tiny/phi3", "tiny/qwen2-moe"])
def test_gpu_graphs_equal_eager_and_hf_engine(name):
    model = zoo_model(name, device="cuda")
    prompts = prompts_for(model, [5, 23, 30])  # 3 prompts x n=2: 6 rows, a row bucket of 8
    params = SamplingParams(n=2, max_new_tokens=40, temperature=0.8, seed=3)
    engine = NativeRolloutEngine(model, pad_token_id=pad_id(model), eos_token_ids=[9], device="cuda")
    graphed = engine.generate(prompts, params)
    if "moe" in name:
        # fp32 MoE takes transformers' grouped-matmul fallback, which reads expert offsets on the
        # host: not capturable, so it must have fallen back to eager decoding (bf16 captures).
        assert engine.graphs.disabled_reason is not None or engine.graphs.num_graphs >= 1
    else:
        assert engine.graphs.disabled_reason is None and engine.graphs.num_graphs >= 1
    eager = NativeRolloutEngine(
        model, pad_token_id=pad_id(model), eos_token_ids=[9], device="cuda", use_cuda_graphs=False
    ).generate(prompts, params)
    hf = reference(model, eos=[9]).generate(prompts, params)
    assert torch.equal(graphed.response_ids, eager.response_ids)
    assert torch.equal(graphed.response_ids, hf.response_ids)
    torch.testing.assert_close(graphed.logprobs, hf.logprobs, atol=1e-4, rtol=0)
    again = engine.generate(prompts, params)  # replays the graphs captured by the first call
    assert torch.equal(again.response_ids, graphed.response_ids)


@pytest.mark.gpu
@requires_cuda
def test_gpu_uncapturable_step_decodes_eagerly_with_a_warning(caplog):
    # Dynamic RoPE compares the longest position with a Python number: a host sync a graph refuses.
    model = zoo_model("tiny/qwen2", device="cuda")
    model.config.rope_parameters = {**model.config.rope_parameters, "rope_type": "dynamic", "factor": 2.0}
    model = AutoModelForCausalLM.from_config(model.config).to("cuda").eval()
    prompts, params = prompts_for(model), greedy(max_new_tokens=12)
    engine = NativeRolloutEngine(model, pad_token_id=pad_id(model), eos_token_ids=[], device="cuda")
    with caplog.at_level(logging.WARNING, logger="relm"):
        out = engine.generate(prompts, params)
    assert engine.graphs.disabled_reason is not None and "CUDA graph" in caplog.text
    assert torch.equal(out.response_ids, reference(model, eos=[]).generate(prompts, params).response_ids)


@pytest.mark.gpu
@requires_cuda
def test_gpu_cache_over_the_memory_share_is_refused():
    model = zoo_model("tiny/qwen2", device="cuda")
    engine = NativeRolloutEngine(
        model, pad_token_id=pad_id(model), eos_token_ids=[], device="cuda", gpu_memory_utilization=1e-9
    )
    with pytest.raises(UserError, match="rollout.gpu_memory_utilization=1e-09"):
        engine.generate(prompts_for(model), greedy())


@pytest.mark.gpu
@requires_cuda
def test_gpu_bf16_greedy_follows_hf_generate_until_a_near_tie():
    model = zoo_model("tiny/qwen2-hd64" if "tiny/qwen2-hd64" in ZOO else "tiny/qwen2", "cuda", torch.bfloat16)
    prompts, pad = prompts_for(model, [5, 23, 2, 30, 11, 17, 8, 3]), pad_id(model)
    ours = NativeRolloutEngine(model, pad_token_id=pad, eos_token_ids=[], device="cuda").generate(
        prompts, greedy(max_new_tokens=32)
    )
    ids, mask = left_pad(prompts, pad)
    theirs = model.generate(
        input_ids=ids.cuda(), attention_mask=mask.cuda(), do_sample=False, max_new_tokens=32, pad_token_id=pad
    )[:, ids.shape[1] :].cpu()
    # Where the two first differ, HF's own top-2 logits there must be within bf16 rounding of a tie.
    full = torch.cat([ids, theirs], dim=1).cuda()
    full_mask = torch.ones_like(full)
    full_mask[:, : ids.shape[1]] = mask
    with torch.no_grad():
        logits = model(input_ids=full, attention_mask=full_mask).logits.float()
    for row in range(len(prompts)):
        differs = (ours.response_ids[row] != theirs[row]).nonzero().flatten()
        if differs.numel() == 0:
            continue
        step = int(differs[0])
        top2 = logits[row, ids.shape[1] + step - 1].topk(2).values
        assert float(top2[0] - top2[1]) < 0.1, f"row {row} diverged at step {step} without a near-tie"


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("name", ["tiny/qwen2", "tiny/gemma2", "tiny/qwen2-moe"])
@torch.no_grad()
def test_gpu_continuous_batching_graphs_equal_eager_trainer_and_lock_step(name):
    model = zoo_model(name, device="cuda")
    prompts = prompts_for(model)  # 4 prompts x n=2 = 8 rows through 3 slots (a row bucket of 4)
    sampled = SamplingParams(n=2, max_new_tokens=40, temperature=0.8, seed=3)
    slotted = dict(pad_token_id=pad_id(model), eos_token_ids=[9, 17], device="cuda", max_num_seqs=3)
    engine = NativeRolloutEngine(model, **slotted)
    graphed = engine.generate(prompts, sampled)
    assert engine.last_stats["slots"] == 3 and engine.last_stats["admissions"] >= 2
    if "moe" not in name:  # fp32 MoE decodes eagerly (see test_gpu_graphs_equal_eager_and_hf_engine)
        assert engine.graphs.disabled_reason is None and engine.graphs.num_graphs >= 1
    eager = NativeRolloutEngine(model, use_cuda_graphs=False, **slotted).generate(prompts, sampled)
    assert torch.equal(graphed.response_ids, eager.response_ids)
    mask = graphed.response_mask.bool()
    expected = trainer_logprobs(model, prompts, graphed, n=2, temperature=0.8)
    torch.testing.assert_close(graphed.logprobs[mask], expected[mask], atol=1e-4, rtol=0)
    # Greedy: the same tokens as all rows at once in lock-step.
    lock_step = NativeRolloutEngine(model, **{**slotted, "max_num_seqs": None})
    params = greedy(n=2, max_new_tokens=40)
    assert torch.equal(
        engine.generate(prompts, params).response_ids, lock_step.generate(prompts, params).response_ids
    )


@pytest.mark.gpu
@requires_cuda
def test_gpu_continuous_batching_when_rows_exceed_the_memory_share():
    model = zoo_model("tiny/qwen2", device="cuda")
    prompts, params = prompts_for(model), greedy(n=2, max_new_tokens=20)  # 8 rows
    weight_bytes = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    row_bytes = bytes_per_row(model.config, 4, max(map(len, prompts)) + 20)
    share = (weight_bytes + 2.5 * row_bytes) / torch.cuda.get_device_properties(0).total_memory  # 2 rows fit
    common = dict(pad_token_id=pad_id(model), eos_token_ids=[], device="cuda")
    engine = NativeRolloutEngine(model, gpu_memory_utilization=share, **common)
    out = engine.generate(prompts, params)
    assert engine.last_stats["slots"] == 2 and engine._buffers.num_rows == 2
    assert torch.equal(
        out.response_ids, NativeRolloutEngine(model, **common).generate(prompts, params).response_ids
    )


@torch.no_grad()
def test_a_row_ending_at_its_first_token_leaves_its_prompt_intact_for_the_next_sample():
    # Three slots for two prompts x 2 samples: the second prompt's first sample shares its slot's
    # prompt columns with the waiting second sample (which takes them without a copy or a prefill).
    # Ending at its first token, that row was parked one column before its first write, on the
    # prompt's last column, and the next decode step (the first prompt's rows still running) wrote
    # the pad token's keys there: every later token of the second sample attended a wrong prompt
    # (logprob gap 0.026 in the test_rollout_options run that found it).
    model = zoo_model("tiny/qwen2")
    prompts = prompts_for(model, [7, 5])
    params = SamplingParams(n=2, max_new_tokens=6, temperature=1.0, seed=0)
    first = native(model, eos=[], max_num_seqs=3).generate(prompts, params).response_ids[2, 0].item()
    engine = native(model, eos=[first], max_num_seqs=3, eos_check_interval=1)
    out = engine.generate(prompts, params)
    lengths = out.response_mask.sum(dim=1).tolist()
    assert lengths[2] == 1 and lengths[3] > 2 and min(lengths[:2]) > 2, lengths  # the premise
    expected = trainer_logprobs(model, prompts, out, n=2, temperature=1.0)
    mask = out.response_mask.bool()
    torch.testing.assert_close(out.logprobs[mask], expected[mask], atol=1e-4, rtol=0)
