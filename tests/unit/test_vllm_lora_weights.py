"""What a LoRA actor hands the vLLM engine, without vLLM: the base or merged weights under the plain model's
names, the adapter under PEFT's saved names, and which adapted layers vLLM's LoRA would refuse."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from relm.errors import UserError
from relm.learner.lora import LoraSettings, add_lora
from relm.learner.weight_sync import adapter_tensors, plain_weights, vllm_lora
from relm.rollout.vllm_lora import vllm_lora_rank

pytest.importorskip("peft")

LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def tiny_model(tied: bool = True) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=48,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=tied,
    )
    return Qwen2ForCausalLM(config).eval()


def lora_model(targets: str | list[str]) -> Qwen2ForCausalLM:
    model = tiny_model()
    add_lora(model, LoraSettings(rank=4, alpha=8, target_modules=targets))
    with torch.no_grad():  # trained adapters: B away from its zero start
        for name, parameter in model.named_parameters():
            # PEFT starts a linear adapter's B at zero, an embedding adapter's A.
            if ".lora_B" in name or ".lora_embedding_" in name:
                parameter.normal_(0, 0.1)
    return model


def test_the_base_goes_under_the_plain_names_and_the_adapter_under_peft_saved_names() -> None:
    model = lora_model("all-linear")
    plain = dict(plain_weights(model, merged=False))
    # Exactly the weights a plain model of this shape has (the tied head once, as vLLM ties it).
    assert list(plain) == [name for name, _ in tiny_model().named_parameters()]
    base = model.get_submodule("model.layers.1.mlp.down_proj").get_base_layer().weight
    assert plain["model.layers.1.mlp.down_proj.weight"] is base

    adapter = dict(adapter_tensors(model))
    assert len(adapter) == 2 * 2 * len(LINEAR)  # A and B of 7 layers in 2 decoder layers
    assert all(name.startswith("base_model.model.model.layers.") for name in adapter)
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in adapter


@pytest.mark.parametrize("head_or_embedding", ["lm_head", "embed_tokens"])
def test_an_adapted_head_or_embedding_is_merged_and_untied(head_or_embedding: str) -> None:
    model = lora_model([*LINEAR, head_or_embedding])
    lora = vllm_lora(model)
    assert lora is not None and not lora.served and lora.untie_lm_head
    weights = dict(lora.weights())
    # Every weight of the plain model, the output head under its own name; adapted ones merged by hand.
    assert sorted(weights) == sorted(
        name for name, _ in tiny_model().named_parameters(remove_duplicate=False)
    )
    embedding = model.get_input_embeddings()
    for layer_name in ("lm_head", "model.embed_tokens", "model.layers.1.mlp.down_proj"):
        layer = model.get_submodule(layer_name)
        if hasattr(layer, "get_delta_weight"):  # adapted
            expected = layer.get_base_layer().weight + layer.get_delta_weight("default")
        else:  # the tied head that is not adapted computes with the base embedding
            expected = getattr(embedding, "base_layer", embedding).weight
        torch.testing.assert_close(weights[f"{layer_name}.weight"], expected, rtol=0, atol=0, msg=layer_name)
    assert not torch.equal(weights["lm_head.weight"], weights["model.embed_tokens.weight"])


def test_linear_adapters_are_served_by_vllm() -> None:
    lora = vllm_lora(lora_model("all-linear"))
    assert lora is not None and lora.served and not lora.untie_lm_head and lora.rank == 4
    assert vllm_lora_rank(4) == 8 and vllm_lora_rank(64) == 64
    with pytest.raises(UserError, match="lora_rank=600` is above the largest rank vLLM's LoRA serves"):
        vllm_lora_rank(600)
