"""The native engine's compiled norm/MLP/rotary pieces: what gets compiled, restoring, and parity."""

from __future__ import annotations

import pytest
import torch
import transformers.models.qwen2.modeling_qwen2 as modeling_qwen2
from transformers import AutoModelForCausalLM

from relm.learner import vocab_chunks
from relm.learner.forward import response_logprobs
from relm.learner.vocab_chunks import compiled_pieces
from relm.models.fused_layers import FusedLayers
from relm.models.zoo import zoo_config
from relm.rollout.base import SamplingParams
from relm.rollout.native.engine import NativeRolloutEngine
from tests.tiny_models import tiny_lm

PROMPTS = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10]]


def test_targets_are_norms_dense_mlps_rotary_and_the_trainers_vocabulary_chunks():
    fused = FusedLayers(tiny_lm(seed=0), enabled=True, functions=compiled_pieces())
    assert fused.describe() == (
        "Qwen2MLP.forward, Qwen2RMSNorm.forward, relm.learner.vocab_chunks._token_entropy, "
        "relm.learner.vocab_chunks._token_logprobs, "
        "transformers.models.qwen2.modeling_qwen2.apply_rotary_pos_emb"
    )
    # The engine passes no functions: the learner's pieces are compiled only where a caller asks.
    assert "relm.learner" not in FusedLayers(tiny_lm(seed=0), enabled=True).describe()


def test_routed_experts_stay_eager():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(zoo_config("zoo:tiny/qwen2-moe"))
    described = FusedLayers(model, enabled=True).describe()
    # the shared expert is a dense Qwen2MoeMLP; the sparse block (router + experts) is not compiled
    assert "Qwen2MoeMLP.forward" in described and "SparseMoeBlock" not in described


def test_disabled_compiles_nothing():
    fused = FusedLayers(tiny_lm(seed=0), enabled=False)
    assert not fused.active
    original = modeling_qwen2.Qwen2RMSNorm.forward
    with fused.applied():
        assert modeling_qwen2.Qwen2RMSNorm.forward is original


def test_applied_restores_the_originals_after_an_error():
    fused = FusedLayers(tiny_lm(seed=0), enabled=True)
    originals = (modeling_qwen2.Qwen2RMSNorm.forward, modeling_qwen2.apply_rotary_pos_emb)
    with pytest.raises(RuntimeError, match="inside"), fused.applied():
        assert modeling_qwen2.Qwen2RMSNorm.forward is not originals[0]
        raise RuntimeError("inside")
    assert (modeling_qwen2.Qwen2RMSNorm.forward, modeling_qwen2.apply_rotary_pos_emb) == originals


def test_compiled_engine_matches_eager_engine():
    # One compile on the CPU (~12 s with the C++ backend); on CUDA the same pieces become Triton kernels.
    model = tiny_lm(seed=0).eval()
    eager = NativeRolloutEngine(model, pad_token_id=0, eos_token_ids=[], device="cpu", compile_layers=False)
    fused = NativeRolloutEngine(model, pad_token_id=0, eos_token_ids=[], device="cpu", compile_layers=True)
    for params in (
        SamplingParams(max_new_tokens=10, do_sample=False),
        SamplingParams(max_new_tokens=10, n=2, seed=3),
    ):
        want, got = eager.generate(PROMPTS, params), fused.generate(PROMPTS, params)
        assert fused.last_stats["compiled"] == 1.0 and fused.fused.disabled_reason is None
        assert torch.equal(got.response_ids, want.response_ids)
        torch.testing.assert_close(got.logprobs, want.logprobs, atol=1e-5, rtol=0)


def test_a_failing_compiler_falls_back_to_the_models_own_code():
    def failing_backend(graph_module, example_inputs):
        raise RuntimeError("this compiler cannot lower the graph")

    model = tiny_lm(seed=0).eval()
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        want = model(input_ids=ids).logits
        fused = FusedLayers(model, enabled=True, backend=failing_backend)
        with fused.applied():
            got = model(input_ids=ids).logits
    assert "cannot lower the graph" in fused.disabled_reason
    torch.testing.assert_close(got, want)
    assert fused.compiled(lambda x: x) is None


@pytest.mark.parametrize(("remove_padding", "checkpointing"), [(False, False), (True, False), (True, True)])
def test_compiled_training_forward_backward_matches_eager(remove_padding, checkpointing):
    """Training through the compiled pieces (norms, MLP, rotary and the checkpointed vocabulary chunks,
    recomputed in backward): same logprobs, entropy and gradients as eager (aot_eager keeps CPU fast)."""
    ids = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7], [0, 0, 8, 9, 10, 11, 12, 0]])
    mask = (ids != 0).long()
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    results = []
    eager_token_logprobs = vocab_chunks._token_logprobs
    for compiled in (False, True):
        model = tiny_lm(seed=0)
        if checkpointing:
            model.gradient_checkpointing_enable()
        fused = FusedLayers(model, enabled=compiled, backend="aot_eager", functions=compiled_pieces())
        with fused.applied():
            lp, ent = response_logprobs(
                model, ids, mask, positions, 4, temperature=0.7, compute_entropy=True, vocab_chunk=3,
                remove_padding=remove_padding,
            )  # fmt: skip
            (lp * mask[:, -4:]).sum().backward()
            # the learner's vocabulary-chunk function, passed in by the caller, is the one swapped
            assert (vocab_chunks._token_logprobs is not eager_token_logprobs) == compiled
        assert fused.active == compiled
        assert vocab_chunks._token_logprobs is eager_token_logprobs
        results.append((lp.detach(), ent, [p.grad for p in model.parameters()]))
    (lp0, ent0, grads0), (lp1, ent1, grads1) = results
    torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent1, ent0, atol=1e-5, rtol=1e-5)
    for g1, g0 in zip(grads1, grads0, strict=True):
        torch.testing.assert_close(g1, g0, atol=1e-5, rtol=1e-4)
