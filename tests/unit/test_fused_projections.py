"""Fused q/k/v and gate/up products (`relm.rollout.native.fused_projections`) in a frozen engine copy.

The fused product computes every output element from the same weights and inputs as the separate
ones, so in fp32 the native engine's greedy tokens stay those of the HF engine on the unfused model.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from relm.rollout.base import SamplingParams
from relm.rollout.native.engine import NativeRolloutEngine
from relm.rollout.native.fused_projections import FusedProjections, find_groups
from tests.unit.test_native_engine import (
    ARCHITECTURES,
    greedy,
    native,
    pad_id,
    prompts_for,
    reference,
    requires_cuda,
    zoo_model,
)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_fused_engine_copy_generates_what_the_hf_engine_does(name):
    model = zoo_model(name).requires_grad_(False)
    engine = native(model, eos=[])
    # At least q/k/v in every layer (gate/up too where the MLP is dense); Phi-3 stores both fused already.
    expected_groups = 0 if name == "tiny/phi3" else model.config.num_hidden_layers
    assert len(engine.projections.groups) >= expected_groups
    prompts, params = prompts_for(model), greedy(n=2, max_new_tokens=16)
    ours = engine.generate(prompts, params)
    theirs = reference(model, eos=[]).generate(prompts, params)
    assert torch.equal(ours.response_ids, theirs.response_ids)
    torch.testing.assert_close(ours.logprobs, theirs.logprobs, atol=1e-5, rtol=0)


def test_only_frozen_models_are_fused_and_members_become_views():
    trained = zoo_model("tiny/qwen2")
    assert not native(trained, eos=[]).projections.active  # the actor itself: checkpoints need own storage
    model = zoo_model("tiny/qwen2").requires_grad_(False)
    attention = model.model.layers[0].self_attn
    before = [getattr(attention, n).weight.clone() for n in ("q_proj", "k_proj", "v_proj")]
    fused = FusedProjections(model)
    with fused.applied():
        group = next(g for g in fused.groups if g.linears[0] is attention.q_proj)
        assert attention.k_proj.weight.data_ptr() == group.weight[attention.q_proj.out_features].data_ptr()
        assert attention.k_proj.bias.data_ptr() == group.bias[attention.q_proj.out_features :].data_ptr()
    for name, weight in zip(("q_proj", "k_proj", "v_proj"), before, strict=True):
        assert torch.equal(getattr(attention, name).weight, weight)
        assert "forward" not in vars(getattr(attention, name))  # the class's forward is back


def test_in_place_sync_reaches_the_fused_product_and_moved_weights_are_fused_again():
    model = zoo_model("tiny/llama").requires_grad_(False)
    fused = FusedProjections(model)
    mlp = model.model.layers[1].mlp
    x = torch.randn(3, 1, model.config.hidden_size)
    with fused.applied():
        pass
    mlp.up_proj.weight.copy_(torch.randn_like(mlp.up_proj.weight))  # what sync_weights does
    with fused.applied():
        got = mlp(x)
    assert torch.allclose(got, mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x)), atol=1e-6)
    # Parking replaces `.data`: the next applied() notices and fuses the moved weights again.
    mlp.gate_proj.weight.data = mlp.gate_proj.weight.data.clone() * 2
    with fused.applied():
        group = next(g for g in fused.groups if g.linears[0] is mlp.gate_proj)
        assert mlp.gate_proj.weight.data_ptr() == group.weight.data_ptr()
        got = mlp(x)
    assert torch.allclose(got, mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x)), atol=1e-6)


def linear_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Records (weight data_ptr, output features) of every F.linear call from now on."""
    calls: list[tuple[int, int]] = []
    original = torch.nn.functional.linear

    def spy(x, weight, bias=None):
        calls.append((weight.data_ptr(), weight.shape[0]))
        return original(x, weight, bias)

    monkeypatch.setattr(torch.nn.functional, "linear", spy)
    return calls


@pytest.mark.parametrize("name", ["tiny/qwen2", "tiny/gemma2"])
def test_each_group_runs_one_product_per_forward(name, monkeypatch):
    model = zoo_model(name).requires_grad_(False)
    engine = native(model, eos=[])
    calls = linear_calls(monkeypatch)
    engine.generate(prompts_for(model, [5, 9]), greedy(max_new_tokens=4))
    forwards = len([c for c in calls if c[1] == model.config.vocab_size])  # one output head each
    assert forwards >= 4
    for group in engine.projections.groups:
        first = group.linears[0].weight.data_ptr()
        assert calls.count((first, sum(group.sizes))) == forwards  # the group's one product
        assert calls.count((first, group.sizes[0])) == 0  # never a member alone
        for linear in group.linears[1:]:
            assert calls.count((linear.weight.data_ptr(), linear.out_features)) == 0


def test_setup_failure_leaves_no_patched_forward(monkeypatch):
    model = zoo_model("tiny/qwen2").requires_grad_(False)
    fused = FusedProjections(model)
    last = fused.groups[-1]
    monkeypatch.setattr(last, "ensure_fused", lambda: (_ for _ in ()).throw(torch.OutOfMemoryError("no")))
    with pytest.raises(torch.OutOfMemoryError), fused.applied():
        pass
    for group in fused.groups:
        assert group.weight is None
        assert all("forward" not in vars(linear) for linear in group.linears)


def test_shared_hooked_or_since_trained_linears_are_not_fused():
    model = zoo_model("tiny/qwen2").requires_grad_(False)
    attention = model.model.layers[0].self_attn
    attention.v_proj = attention.k_proj  # one module twice in a group
    other = model.model.layers[1].self_attn
    other.q_proj.forward = other.q_proj.forward  # a forward set on the instance (accelerate's hooks do)
    groups = find_groups(model)
    assert all(g.linears[0] not in (attention.q_proj, other.q_proj) for g in groups)
    fused = FusedProjections(model)
    assert fused.active
    model.model.layers[1].mlp.up_proj.weight.requires_grad_(True)  # trained after the engine was built
    with fused.applied():
        assert all("forward" not in vars(g.linears[1]) for g in fused.groups)


def test_a_member_called_on_another_input_computes_its_own_product():
    model = zoo_model("tiny/qwen2").requires_grad_(False)
    fused = FusedProjections(model)
    attention = model.model.layers[0].self_attn
    x, y = torch.randn(2, 4, model.config.hidden_size), torch.randn(2, 4, model.config.hidden_size)
    with fused.applied():
        q = attention.q_proj(x)
        k = attention.k_proj(y)  # not the input q saw
        q_again = attention.q_proj(y)  # ... but this one is k's
        v = attention.v_proj(x)
    expected = {n: nn.Linear.forward(getattr(attention, n), t) for n, t in (("q_proj", x), ("k_proj", y))}
    assert torch.allclose(q, expected["q_proj"], atol=1e-6) and torch.allclose(
        k, expected["k_proj"], atol=1e-6
    )
    assert torch.allclose(q_again, nn.Linear.forward(attention.q_proj, y), atol=1e-6)
    assert torch.allclose(v, nn.Linear.forward(attention.v_proj, x), atol=1e-6)


def test_linears_with_hooks_or_other_types_are_not_grouped():
    model = zoo_model("tiny/qwen2").requires_grad_(False)
    model.model.layers[0].self_attn.k_proj.register_forward_hook(lambda *args: None)
    groups = find_groups(model)
    assert all(g.linears[0] is not model.model.layers[0].self_attn.q_proj for g in groups)
    assert len(groups) == 2 * model.config.num_hidden_layers - 1


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("name", ["tiny/qwen2", "tiny/gemma2"])
def test_gpu_fused_bf16_copy_graphs_equal_unfused_eager(name):
    model = zoo_model(name, device="cuda", dtype=torch.bfloat16).requires_grad_(False)
    prompts = prompts_for(model, [5, 23, 30])
    params = SamplingParams(n=2, max_new_tokens=40, temperature=0.8, seed=3)
    common = dict(pad_token_id=pad_id(model), eos_token_ids=[9], device="cuda")
    engine = NativeRolloutEngine(model, **common)
    fused = engine.generate(prompts, params)
    assert engine.projections.active and engine.graphs.num_graphs >= 1
    plain = NativeRolloutEngine(model, **common, use_cuda_graphs=False, fuse_projections=False)
    unfused = plain.generate(prompts, params)
    # bf16 products may round differently fused; tokens agree until a near-tie, logprobs closely.
    same = (fused.response_ids == unfused.response_ids).all(dim=1)
    assert same.float().mean() >= 0.5
    torch.testing.assert_close(fused.logprobs[same], unfused.logprobs[same], atol=0.05, rtol=0)


def test_parking_frees_the_fused_buffers_and_the_next_call_fuses_again():
    from relm.memory.offload import ParkedModel

    model = zoo_model("tiny/qwen2").requires_grad_(False)
    engine = native(model, eos=[])
    prompts, params = prompts_for(model), greedy(n=2, max_new_tokens=8)
    first = engine.generate(prompts, params)
    q_proj = model.model.layers[0].self_attn.q_proj
    fused_storage = q_proj.weight.untyped_storage()
    assert all(group.weight is None for group in engine.projections.groups)  # nothing held between calls
    engine.generate(prompts, params)
    assert q_proj.weight.untyped_storage().data_ptr() == fused_storage.data_ptr()  # found again, not re-fused
    parked = ParkedModel(model, torch.device("cpu"))
    parked.park()
    # No parameter lives in the fused buffer any more, and the engine holds none: it can be freed.
    storages = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    assert fused_storage.data_ptr() not in storages
    parked.unpark()
    again = engine.generate(prompts, params)
    assert torch.equal(again.response_ids, first.response_ids)
    assert engine.projections.groups[0].linears[1].weight.untyped_storage().data_ptr() == (
        q_proj.weight.untyped_storage().data_ptr()
    )
