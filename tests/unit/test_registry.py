"""The architecture registry: inspection of each zoo architecture, classification, registration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import (
    BertConfig,
    DeepseekV2Config,
    GPT2Config,
    LlavaConfig,
    MistralConfig,
    MistralForCausalLM,
    PretrainedConfig,
    Qwen2Config,
    T5Config,
)

from relm.errors import UserError
from relm.models.loading import load_causal_lm
from relm.models.registry import (
    SUPPORTED_ARCHITECTURES,
    classify,
    config_architecture,
    import_external_lib,
    inspect_model_architecture,
    register_model_class,
    registered_model_class,
    unregister_model_class,
)
from relm.models.zoo import ZOO, zoo_config

# name: (architecture, attention, heads, kv heads, head_dim, window, sliding layers, attn cap, final cap),
#       (mlp, experts, experts per token, fused qkv, tied, norm)
# Worked out from each zoo entry's constructor arguments and transformers' defaults for the rest.
EXPECTED = {
    "tiny/qwen2": (("Qwen2ForCausalLM", "GQA", 4, 2, 16, None, 0, None, None),
                   ("SwiGLU", None, None, False, True, "Qwen2RMSNorm")),
    "tiny/llama": (("LlamaForCausalLM", "GQA", 4, 2, 16, None, 0, None, None),
                   ("SwiGLU", None, None, False, True, "LlamaRMSNorm")),
    "tiny/qwen3": (("Qwen3ForCausalLM", "MQA", 2, 1, 64, None, 0, None, None),
                   ("SwiGLU", None, None, False, False, "Qwen3RMSNorm")),
    "tiny/mistral": (("MistralForCausalLM", "MQA", 2, 1, 64, 16, 2, None, None),
                     ("SwiGLU", None, None, False, False, "MistralRMSNorm")),
    # Phi-3: q/k/v in one qkv_proj and gate/up in one gate_up_proj; 2 kv heads = 2 heads is MHA.
    "tiny/phi3": (("Phi3ForCausalLM", "MHA", 2, 2, 64, 16, 2, None, None),
                  ("fused gate_up (SwiGLU)", None, None, True, False, "Phi3RMSNorm")),
    # Gemma-2: layer 0 slides, layer 1 attends to all; gelu_pytorch_tanh gate; embeddings tied by default.
    "tiny/gemma2": (("Gemma2ForCausalLM", "MQA", 2, 1, 64, 16, 1, 50.0, 30.0),
                    ("GeGLU", None, None, False, True, "Gemma2RMSNorm")),
    "tiny/gemma3": (("Gemma3ForCausalLM", "MQA", 2, 1, 64, 16, 1, None, None),
                    ("GeGLU", None, None, False, True, "Gemma3RMSNorm")),
    "tiny/qwen2-moe": (("Qwen2MoeForCausalLM", "MQA", 2, 1, 64, None, 0, None, None),
                       ("MoE", 4, 2, False, False, "Qwen2MoeRMSNorm")),
    "tiny/qwen3-moe": (("Qwen3MoeForCausalLM", "MQA", 2, 1, 64, None, 0, None, None),
                       ("MoE", 4, 2, False, False, "Qwen3MoeRMSNorm")),
    "tiny/mixtral": (("MixtralForCausalLM", "MQA", 2, 1, 64, None, 0, None, None),
                     ("MoE", 4, 2, False, False, "MixtralRMSNorm")),
    "tiny/starling": (("StarlingLmForCausalLM", "MQA", 2, 1, 64, 16, 2, None, None),
                      ("SwiGLU", None, None, False, False, "MistralRMSNorm")),
    # MLA: the q/k head is 32 nope + 32 rope; the kv cache holds a 32-wide latent, not kv heads.
    "tiny/deepseek-v2": (("DeepseekV2ForCausalLM", "MLA", 2, 2, 64, None, 0, None, None),
                         ("MoE", 4, 2, False, False, "DeepseekV2RMSNorm")),
    "tiny/olmoe": (("OlmoeForCausalLM", "MHA", 2, 2, 64, None, 0, None, None),
                   ("MoE", 4, 2, False, False, "OlmoeRMSNorm")),
    # Phi-3.5-MoE normalises with LayerNorm (mean and bias), not RMSNorm.
    "tiny/phimoe": (("PhimoeForCausalLM", "MQA", 2, 1, 64, None, 0, None, None),
                    ("MoE", 4, 2, False, False, "LayerNorm")),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_inspection_of_each_tiny_architecture(name):
    info = inspect_model_architecture(zoo_config(f"zoo:{name}"))
    attention = (
        info.architecture, info.attention, info.num_heads, info.num_kv_heads, info.head_dim,
        info.sliding_window, info.num_sliding_layers, info.attn_logit_softcapping,
        info.final_logit_softcapping,
    )  # fmt: skip
    rest = (
        info.mlp,
        info.num_experts,
        info.num_experts_per_token,
        info.fused_qkv,
        info.tied_embeddings,
        info.norm,
    )
    assert (attention, rest) == EXPECTED[name]
    assert (info.num_layers, info.vocab_size, info.max_position_embeddings) == (2, 101, 256)
    assert info.position_encoding == "RoPE"
    # Verified per architecture class; the renamed Mistral is not a class relm lists.
    assert info.packed_forward_verified is (name != "tiny/starling")


def test_every_supported_architecture_has_a_tiny_zoo_model():
    """SUPPORTED_ARCHITECTURES claims what the tiny zoo (run by relm compat) verifies, no more."""
    tiny = {config_architecture(zoo_config(f"zoo:{name}")) for name in ZOO if name.startswith("tiny/")}
    assert set(SUPPORTED_ARCHITECTURES) <= tiny


def test_inspection_of_published_shapes():
    llama = inspect_model_architecture(zoo_config("zoo:meta-llama/Llama-3.2-1B"))
    assert (llama.rope_theta, llama.rope_scaling, llama.max_position_embeddings) == (
        500000.0,
        "llama3 x32",
        131072,
    )
    assert (llama.attention, llama.num_heads, llama.num_kv_heads, llama.head_dim) == ("GQA", 32, 8, 64)
    # Qwen2 configs carry a window value with use_sliding_window false: no layer slides.
    qwen = inspect_model_architecture(zoo_config("zoo:Qwen/Qwen2.5-0.5B"))
    assert qwen.sliding_window is None and qwen.rope_theta == 1e6
    gemma = inspect_model_architecture(zoo_config("zoo:google/gemma-2-9b-it"))
    assert (gemma.sliding_window, gemma.num_sliding_layers, gemma.num_layers) == (4096, 21, 42)
    mixtral = inspect_model_architecture(zoo_config("zoo:mistralai/Mixtral-8x7B-Instruct-v0.1"))
    assert (mixtral.mlp, mixtral.num_experts, mixtral.num_experts_per_token) == ("MoE", 8, 2)
    assert any("fused 3-D" in note for note in mixtral.notes)
    # Gemma 3: every 6th layer is full (layers 6, 12, 18, 24 of 26), the rest slide over 512 tokens.
    gemma3 = inspect_model_architecture(zoo_config("zoo:google/gemma-3-1b-it"))
    assert (gemma3.sliding_window, gemma3.num_sliding_layers, gemma3.attention) == (512, 22, "MQA")
    assert gemma3.rope_theta == 1e6  # the global layers'; the sliding ones use 1e4
    # MLA q/k head = 128 nope + 64 rope; yarn x40 from 4096 positions.
    lite = inspect_model_architecture(zoo_config("zoo:deepseek-ai/DeepSeek-V2-Lite-Chat"))
    assert (lite.attention, lite.head_dim, lite.num_experts, lite.num_experts_per_token) == (
        "MLA",
        192,
        64,
        6,
    )
    assert (lite.rope_scaling, lite.max_position_embeddings) == ("yarn x40", 163840)
    qwen3_moe = inspect_model_architecture(zoo_config("zoo:Qwen/Qwen3-30B-A3B"))
    assert (qwen3_moe.num_kv_heads, qwen3_moe.head_dim, qwen3_moe.num_experts) == (4, 128, 128)


def test_inspection_of_an_mla_config_and_a_learned_position_model():
    mla = inspect_model_architecture(
        DeepseekV2Config(
            vocab_size=64, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
            num_hidden_layers=2, num_attention_heads=4, kv_lora_rank=16, q_lora_rank=None,
            qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=4,
            num_experts_per_tok=2, first_k_dense_replace=1,
        )
    )  # fmt: skip
    assert (mla.attention, mla.head_dim, mla.num_experts) == ("MLA", 24, 4)  # nope 16 + rope 8
    gpt2 = inspect_model_architecture(
        GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    )
    assert (gpt2.architecture, gpt2.position_encoding, gpt2.mlp) == (
        "GPT2LMHeadModel",
        "learned",
        "MLP (gelu_new)",
    )
    assert gpt2.fused_qkv and gpt2.norm == "LayerNorm" and gpt2.max_position_embeddings == 64


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        (
            BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4),
            "encoder-only",
        ),
        (T5Config(vocab_size=64, d_model=32, num_layers=1, num_heads=2), "encoder-decoder"),
        (LlavaConfig(), "vision-language"),
    ],
)
def test_classify_refuses_non_decoders_with_the_reason(config, reason):
    verdict = classify(config)
    assert verdict.status == "unsupported" and reason in verdict.reason and verdict.family is None


def test_classify_supported_probe_and_renamed():
    assert classify(Qwen2Config()).status == "supported"
    probe = classify(GPT2Config())
    assert (probe.status, probe.architecture) == ("probe", "GPT2LMHeadModel")
    renamed = classify(zoo_config("zoo:tiny/starling"))
    assert (renamed.status, renamed.family) == ("supported", "mistral")
    assert renamed.reason == "transformers builds MistralForCausalLM from model_type `mistral`"


def _renamed_mistral_folder(folder: Path) -> str:
    """A config-only folder whose model_type and architecture transformers has never heard of."""
    config = MistralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64,
    )  # fmt: skip
    config.save_pretrained(folder)
    raw = json.loads((folder / "config.json").read_text())
    raw |= {"model_type": "starling_lm", "architectures": ["StarlingLmForCausalLM"]}
    (folder / "config.json").write_text(json.dumps(raw))
    return str(folder)


@pytest.fixture
def starling_registration():
    yield
    unregister_model_class("StarlingLmForCausalLM")


def load(path: str):
    return load_causal_lm(path, dtype=torch.float32, device="cpu")


def test_register_model_class_makes_an_unknown_architecture_load(tmp_path, starling_registration):
    folder = _renamed_mistral_folder(tmp_path)
    with pytest.raises(
        UserError, match=r"model_type `starling_lm`.*register_model_class\('StarlingLmForCausalLM'"
    ):
        load(folder)
    register_model_class("StarlingLmForCausalLM", "MistralForCausalLM")
    model = load(folder)
    assert type(model) is MistralForCausalLM and model.config.model_type == "mistral"
    assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 64)
    assert classify(model.config).reason == "registered as MistralForCausalLM"


def test_register_a_class_object(tmp_path, starling_registration):
    class StarlingLmForCausalLM(MistralForCausalLM):
        pass

    register_model_class("StarlingLmForCausalLM", StarlingLmForCausalLM)
    assert registered_model_class("StarlingLmForCausalLM") is StarlingLmForCausalLM
    assert type(load(_renamed_mistral_folder(tmp_path))) is StarlingLmForCausalLM


def test_register_refuses_what_is_not_a_model_class():
    for target in ("NoSuchForCausalLM", "AutoConfig", int):
        with pytest.raises(
            UserError, match="must be a PreTrainedModel subclass or a transformers class name"
        ):
            register_model_class("X", target)
    assert registered_model_class("X") is None


def test_external_lib_module_registers_before_loading(tmp_path, monkeypatch, starling_registration):
    (tmp_path / "my_archs.py").write_text(
        "from relm.models.registry import register_model_class\n"
        "register_model_class('StarlingLmForCausalLM', 'MistralForCausalLM')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import_external_lib("my_archs")
    assert type(load(_renamed_mistral_folder(tmp_path / "model"))) is MistralForCausalLM
    with pytest.raises(UserError, match="`external_lib=no_such_module_xyz` cannot be imported"):
        import_external_lib("no_such_module_xyz")


def _scaled_gemma2_logits(model) -> torch.Tensor:
    # Random init keeps attention scores near 0, where tanh capping is the identity; scaled q/k
    # weights make scores large enough for the cap to matter.
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(300)
            layer.self_attn.k_proj.weight.mul_(30)
        return model(torch.arange(5, 29)[None]).logits


def test_soft_capped_models_load_with_eager_attention_because_sdpa_drops_the_cap():
    gemma = load("zoo:tiny/gemma2")
    assert gemma.config._attn_implementation == "eager"
    assert load("zoo:tiny/qwen3").config._attn_implementation == "sdpa"
    forced = load_causal_lm(
        "zoo:tiny/gemma2", dtype=torch.float32, device="cpu", override_config={"attn_implementation": "sdpa"}
    )
    assert forced.config._attn_implementation == "sdpa"  # an explicit choice is the user's
    assert not torch.allclose(_scaled_gemma2_logits(gemma), _scaled_gemma2_logits(forced), atol=1e-2)


def test_configs_of_every_zoo_entry_classify_as_supported():
    for name in ZOO:
        config: PretrainedConfig = zoo_config(f"zoo:{name}")
        assert classify(config).status == "supported", name
