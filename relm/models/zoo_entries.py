"""The zoo's entries: each name with the HF config it builds (tiny shapes and published ones).

Kept apart from `relm.models.zoo`, which turns an entry into a folder, because this file is data:
one constructor call per model, every number a published config.json's (or, for `tiny/*`, the
shrunk shape that keeps the family's quirks).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import torch
from transformers import (
    DeepseekV2Config,
    Gemma2Config,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    MixtralConfig,
    OlmoeConfig,
    Phi3Config,
    PhimoeConfig,
    PretrainedConfig,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2MoeConfig,
    Qwen3Config,
    Qwen3MoeConfig,
)

from relm.models.char_tokenizer import build_char_tokenizer
from relm.models.family_tokenizers import load_family_tokenizer
from relm.models.lookup_tokenizer import build_lookup_tokenizer


@dataclass(frozen=True)
class ZooEntry:
    """One named architecture."""

    description: str
    """One line shown when listing the zoo."""
    build_config: Callable[[PreTrainedTokenizerBase], PretrainedConfig]
    """HF config for the given tokenizer (its special-token ids go into the config)."""
    weight_dtype: torch.dtype = torch.float32
    """Dtype of the saved weights; full-size shapes use bf16 to halve disk and build time."""
    build_tokenizer: Callable[[], PreTrainedTokenizerFast] = build_char_tokenizer
    """The tokenizer saved beside the weights; variants reproduce a family's conventions (no pad token)."""
    declared_architecture: str | None = None
    """Written into config.json's `architectures` in place of the class transformers builds: a
    renamed architecture, as fine-tunes publish them."""
    tokenizer_family: str | None = None
    """A family in `relm.models.family_tokenizers.FAMILIES`: the model carries that family's real
    tokenizer files (copied as shipped) and `build_tokenizer` is not used."""

    def tokenizer(self, cache_dir: str | Path | None = None) -> PreTrainedTokenizerBase:
        """The tokenizer this entry's folder holds (a shipped one is unpacked under `cache_dir`).

        A shipped tokenizer is loaded once per process and shared (loading Mistral-Nemo's takes
        seconds): treat it as read-only. Training loads its own copy from the materialized folder.
        """
        if self.tokenizer_family is not None:
            return _shared_family_tokenizer(self.tokenizer_family, str(cache_dir) if cache_dir else None)
        return self.build_tokenizer()


@functools.cache
def _shared_family_tokenizer(family: str, cache_dir: str | None) -> PreTrainedTokenizerBase:
    return load_family_tokenizer(family, cache_dir)


QWEN25, PHI3, MISTRAL_NEMO = "qwen2.5", "phi3", "mistral-nemo"
"""Families whose real tokenizer ships with relm (`relm.models.family_tokenizers`)."""


class _TokenIds(TypedDict):
    pad_token_id: int | None
    bos_token_id: int | None
    eos_token_id: int | None


def _token_ids(tokenizer: PreTrainedTokenizerBase) -> _TokenIds:
    return {
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }


def _tiny_qwen2(tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        **_token_ids(tokenizer),
    )


def _tiny_qwen2_hd64(tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
    # vLLM's CPU attention kernel refuses head_dim 16 (tiny/qwen2); Qwen2Config has no head_dim
    # key, so head_dim 64 needs hidden = 64 * heads.
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        **_token_ids(tokenizer),
    )


def _tiny_llama(tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        **_token_ids(tokenizer),
    )


def _char_tokenizer_without_pad() -> PreTrainedTokenizerFast:
    """The char tokenizer naming no pad token, as Gemma-2 and Mistral checkpoints ship theirs."""
    tokenizer = build_char_tokenizer()
    tokenizer.pad_token = None
    return tokenizer


def _tiny(config_class: Callable[..., PretrainedConfig], **fields: Any) -> Callable:
    """A 2-layer config of `config_class`: hidden 128, 2 heads / 1 kv head of head_dim 64 (the width
    every engine's attention kernel accepts), the char vocabulary, plus the family's quirks."""

    def build(tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
        shape: dict[str, Any] = dict(
            vocab_size=len(tokenizer),
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=256,
        )
        return config_class(**{**shape, **_token_ids(tokenizer), **fields})

    return build


# Windows of 16 tokens are shorter than the demo's 20-token prompt, so sliding attention is exercised.
_TINY_WINDOW = 16
TINY_ZOO: dict[str, ZooEntry] = {
    "tiny/qwen3": ZooEntry("Qwen3, head_dim 64, q/k norm", _tiny(Qwen3Config, head_dim=64)),
    "tiny/mistral": ZooEntry(
        "Mistral, sliding window 16 on every layer, no pad token",
        _tiny(MistralConfig, head_dim=64, sliding_window=_TINY_WINDOW),
        build_tokenizer=_char_tokenizer_without_pad,
    ),
    "tiny/phi3": ZooEntry(
        "Phi-3, fused qkv_proj and gate_up_proj, MHA, sliding window 16",
        _tiny(Phi3Config, num_key_value_heads=2, sliding_window=_TINY_WINDOW),
    ),
    "tiny/gemma2": ZooEntry(
        "Gemma-2, soft-capping 50/30, sliding/full layers (window 16), GeGLU, no pad token",
        _tiny(
            Gemma2Config,
            head_dim=64,
            query_pre_attn_scalar=64,
            sliding_window=_TINY_WINDOW,
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
        ),
        build_tokenizer=_char_tokenizer_without_pad,
    ),
    "tiny/gemma3": ZooEntry(
        "Gemma-3 text, q/k norm, sliding/full layers (window 16) with per-type RoPE",
        _tiny(
            Gemma3TextConfig,
            head_dim=64,
            query_pre_attn_scalar=64,
            sliding_window=_TINY_WINDOW,
            layer_types=["sliding_attention", "full_attention"],
        ),
    ),
    "tiny/qwen2-moe": ZooEntry(
        "Qwen2-MoE (Qwen1.5-MoE), 4 experts top-2 plus a gated shared expert",
        _tiny(
            Qwen2MoeConfig,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            shared_expert_intermediate_size=128,
        ),
    ),
    "tiny/qwen3-moe": ZooEntry(
        "Qwen3-MoE, 4 experts top-2, normalised top-k",
        _tiny(
            Qwen3MoeConfig,
            head_dim=64,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            norm_topk_prob=True,
        ),
    ),
    "tiny/mixtral": ZooEntry(
        "Mixtral, 4 experts top-2",
        _tiny(MixtralConfig, head_dim=64, num_local_experts=4, num_experts_per_tok=2),
    ),
    "tiny/starling": ZooEntry(
        "Mistral inside, config.json names StarlingLmForCausalLM (a fine-tune's renamed architecture)",
        _tiny(MistralConfig, head_dim=64, sliding_window=_TINY_WINDOW),
        declared_architecture="StarlingLmForCausalLM",
    ),
    "tiny/deepseek-v2": ZooEntry(
        "DeepSeek-V2 (Lite), MLA: kv latent rank 32, no q latent, q/k head 32 nope + 32 rope, v 64; "
        "layer 0 dense, layer 1 MoE 4 experts top-2 + 1 shared",
        _tiny(
            DeepseekV2Config,
            num_key_value_heads=2,
            kv_lora_rank=32,
            q_lora_rank=None,
            qk_nope_head_dim=32,
            qk_rope_head_dim=32,
            v_head_dim=64,
            n_routed_experts=4,
            n_shared_experts=1,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            first_k_dense_replace=1,
        ),
    ),
    "tiny/olmoe": ZooEntry(
        "OLMoE, 4 experts top-2 (no shared expert, un-normalised top-k), q/k norm over all heads",
        _tiny(OlmoeConfig, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, intermediate_size=64),
    ),
    "tiny/phimoe": ZooEntry(
        "Phi-3.5-MoE, 4 experts top-2 (sparsemixer routing), LayerNorm, q/k/v/o and lm_head biases",
        _tiny(
            PhimoeConfig,
            num_key_value_heads=1,
            num_local_experts=4,
            num_experts_per_tok=2,
            attention_bias=True,
            lm_head_bias=True,
        ),
    ),
}


def _published(config_class: Callable[..., PretrainedConfig], **fields: Any) -> Callable:
    """A published model's config (numbers from its config.json); special-token ids are the entry's
    tokenizer's: the family's own where relm ships it, else the char tokenizer's, which fit inside
    every published vocabulary."""

    def build(tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
        return config_class(**fields, **_token_ids(tokenizer))

    return build


def _qwen25(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int) -> Callable:
    def build(tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
        return Qwen2Config(
            vocab_size=151936,
            hidden_size=hidden,
            intermediate_size=intermediate,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            max_position_embeddings=32768,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            tie_word_embeddings=True,
            **_token_ids(tokenizer),
        )

    return build


def _llama32_1b(tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
    return LlamaConfig(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        tie_word_embeddings=True,
        **_token_ids(tokenizer),
    )


_QWEN_ROPE = {"rope_type": "default", "rope_theta": 1000000.0}
_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
_GEMMA2 = dict(
    vocab_size=256000,
    head_dim=256,
    query_pre_attn_scalar=256,  # 9B too: its config.json was corrected from 224 to 256 in July 2024
    sliding_window=4096,
    attn_logit_softcapping=50.0,
    final_logit_softcapping=30.0,
    max_position_embeddings=8192,
    rms_norm_eps=1e-6,
    hidden_activation="gelu_pytorch_tanh",
    tie_word_embeddings=True,
)
_PHI3_4K = dict(
    vocab_size=32064,
    max_position_embeddings=4096,
    original_max_position_embeddings=4096,
    sliding_window=2047,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)
_MISTRAL_7B = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)
# The study's models (a public compatibility study of verl), config.json numbers as published.
STUDY_ZOO: dict[str, ZooEntry] = {
    "Qwen/Qwen2.5-0.5B-Instruct": ZooEntry(
        "Qwen2.5-0.5B-Instruct shape, Qwen2.5 tokenizer",
        _qwen25(896, 4864, 24, 14, 2),
        torch.bfloat16,
        tokenizer_family=QWEN25,
    ),
    "Qwen/Qwen2.5-1.5B-Instruct": ZooEntry(
        "Qwen2.5-1.5B-Instruct shape, Qwen2.5 tokenizer",
        _qwen25(1536, 8960, 28, 12, 2),
        torch.bfloat16,
        tokenizer_family=QWEN25,
    ),
    "Qwen/Qwen2.5-3B-Instruct": ZooEntry(
        "Qwen2.5-3B-Instruct shape (3.09B), Qwen2.5 tokenizer",
        _qwen25(2048, 11008, 36, 16, 2),
        torch.bfloat16,
        tokenizer_family=QWEN25,
    ),
    "Qwen/Qwen2.5-7B-Instruct": ZooEntry(
        "Qwen2.5-7B-Instruct shape (7.62B, untied, vocab 152064), Qwen2.5 tokenizer",
        _published(
            Qwen2Config,
            vocab_size=152064,
            hidden_size=3584,
            intermediate_size=18944,
            num_hidden_layers=28,
            num_attention_heads=28,
            num_key_value_heads=4,
            max_position_embeddings=32768,
            rms_norm_eps=1e-6,
            rope_parameters=_QWEN_ROPE,
            tie_word_embeddings=False,
        ),
        torch.bfloat16,
        tokenizer_family=QWEN25,
    ),
    "meta-llama/Llama-3.2-1B-Instruct": ZooEntry("Llama-3.2-1B-Instruct shape", _llama32_1b, torch.bfloat16),
    "meta-llama/Llama-3.2-3B-Instruct": ZooEntry(
        "Llama-3.2-3B-Instruct shape (3.21B)",
        _published(
            LlamaConfig,
            vocab_size=128256,
            hidden_size=3072,
            intermediate_size=8192,
            num_hidden_layers=28,
            num_attention_heads=24,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=131072,
            rms_norm_eps=1e-5,
            rope_parameters=_LLAMA3_ROPE,
            tie_word_embeddings=True,
        ),
        torch.bfloat16,
    ),
    "microsoft/Phi-3-mini-4k-instruct": ZooEntry(
        "Phi-3-mini-4k-instruct shape (3.82B, MHA, fused qkv/gate_up, window 2047), Phi-3 tokenizer",
        _published(
            Phi3Config,
            hidden_size=3072,
            intermediate_size=8192,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
            **_PHI3_4K,
        ),
        torch.bfloat16,
        tokenizer_family=PHI3,
    ),
    "microsoft/Phi-3-medium-4k-instruct": ZooEntry(
        "Phi-3-medium-4k-instruct shape (14B, 40 heads / 10 kv heads), Phi-3 tokenizer",
        _published(
            Phi3Config,
            hidden_size=5120,
            intermediate_size=17920,
            num_hidden_layers=40,
            num_attention_heads=40,
            num_key_value_heads=10,
            **_PHI3_4K,
        ),
        torch.bfloat16,
        tokenizer_family=PHI3,
    ),
    "google/gemma-2-2b-it": ZooEntry(
        "Gemma-2-2b-it shape (2.61B, soft-capping, window 4096)",
        _published(
            Gemma2Config,
            hidden_size=2304,
            intermediate_size=9216,
            num_hidden_layers=26,
            num_attention_heads=8,
            num_key_value_heads=4,
            **_GEMMA2,
        ),
        torch.bfloat16,
        build_tokenizer=_char_tokenizer_without_pad,
    ),
    "google/gemma-2-9b-it": ZooEntry(
        "Gemma-2-9b-it shape (9.24B, soft-capping, window 4096)",
        _published(
            Gemma2Config,
            hidden_size=3584,
            intermediate_size=14336,
            num_hidden_layers=42,
            num_attention_heads=16,
            num_key_value_heads=8,
            **_GEMMA2,
        ),
        torch.bfloat16,
        build_tokenizer=_char_tokenizer_without_pad,
    ),
    "berkeley-nest/Starling-LM-7B-alpha": ZooEntry(
        "Starling-LM-7B-alpha shape (Mistral-7B-v0.1 + 2 tokens, window 4096)",
        _published(
            MistralConfig,
            vocab_size=32002,
            max_position_embeddings=8192,
            sliding_window=4096,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            **_MISTRAL_7B,
        ),
        torch.bfloat16,
    ),
    "Qwen/Qwen1.5-MoE-A2.7B": ZooEntry(
        "Qwen1.5-MoE-A2.7B shape (14.3B, 60 experts top-4 + shared expert)",
        _published(
            Qwen2MoeConfig,
            vocab_size=151936,
            hidden_size=2048,
            intermediate_size=5632,
            num_hidden_layers=24,
            num_attention_heads=16,
            num_key_value_heads=16,
            num_experts=60,
            num_experts_per_tok=4,
            moe_intermediate_size=1408,
            shared_expert_intermediate_size=5632,
            norm_topk_prob=False,
            max_position_embeddings=8192,
            rms_norm_eps=1e-6,
            rope_parameters=_QWEN_ROPE,
            tie_word_embeddings=False,
        ),
        torch.bfloat16,
    ),
    "mistralai/Mixtral-8x7B-Instruct-v0.1": ZooEntry(
        "Mixtral-8x7B-Instruct shape (46.7B, 8 experts top-2)",
        _published(
            MixtralConfig,
            vocab_size=32000,
            num_local_experts=8,
            num_experts_per_tok=2,
            max_position_embeddings=32768,
            sliding_window=None,
            rope_parameters=_QWEN_ROPE,
            **_MISTRAL_7B,
        ),
        torch.bfloat16,
    ),
}


_MISTRAL_NEMO = dict(
    vocab_size=131072,
    hidden_size=5120,
    intermediate_size=14336,
    num_hidden_layers=40,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=1024000,
    sliding_window=None,
    rms_norm_eps=1e-5,
    rope_parameters=_QWEN_ROPE,
    tie_word_embeddings=False,
)
# Full-size entries of a family whose real tokenizer the package ships (issue 15): the family's
# tokenizer fits the published embedding (Qwen2.5: 151,665 tokens in 151,936 or 152,064 rows; Phi-3:
# 32,011 in 32,064; Mistral-Nemo: 131,072 in 131,072).
REAL_TOKENIZER_ZOO: dict[str, ZooEntry] = {
    "mistralai/Mistral-Nemo-Instruct-2407": ZooEntry(
        "Mistral-Nemo-Instruct-2407 shape (12.2B, 32 heads / 8 kv heads x 128, vocab 131072, no sliding "
        "window, rope 1e6), Tekken tokenizer (no pad token)",
        _published(MistralConfig, **_MISTRAL_NEMO),
        torch.bfloat16,
        tokenizer_family=MISTRAL_NEMO,
    ),
}


_QWEN3 = dict(
    vocab_size=151936,
    head_dim=128,
    max_position_embeddings=40960,
    rms_norm_eps=1e-6,
    rope_parameters=_QWEN_ROPE,
)
# The further models (issue 2, part 5). Numbers are their config.json values as published
# (sources in docs/models.md); where a number could not be confirmed the description says so.
MORE_ZOO: dict[str, ZooEntry] = {
    "01-ai/Yi-1.5-6B-Chat": ZooEntry(
        "Yi-1.5-6B-Chat shape (6.06B, Llama class, 32 heads / 4 kv heads, vocab 64000; "
        "rms_norm_eps 1e-6 not confirmed from a stored config.json)",
        _published(
            LlamaConfig,
            vocab_size=64000,
            hidden_size=4096,
            intermediate_size=11008,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=4,
            max_position_embeddings=4096,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 5000000.0},
            tie_word_embeddings=False,
        ),
        torch.bfloat16,
    ),
    "deepseek-ai/deepseek-llm-7b-chat": ZooEntry(
        "deepseek-llm-7b-chat shape (6.91B, Llama class, MHA 32 heads, 30 layers, vocab 102400; "
        "rms_norm_eps 1e-6 not confirmed from a stored config.json)",
        _published(
            LlamaConfig,
            vocab_size=102400,
            hidden_size=4096,
            intermediate_size=11008,
            num_hidden_layers=30,
            num_attention_heads=32,
            num_key_value_heads=32,
            max_position_embeddings=4096,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            tie_word_embeddings=False,
        ),
        torch.bfloat16,
    ),
    "mistralai/Mistral-7B-Instruct-v0.3": ZooEntry(
        "Mistral-7B-Instruct-v0.3 shape (7.25B, vocab 32768, no sliding window, rope 1e6, no pad token)",
        _published(
            MistralConfig,
            vocab_size=32768,
            max_position_embeddings=32768,
            sliding_window=None,
            rope_parameters=_QWEN_ROPE,
            **_MISTRAL_7B,
        ),
        torch.bfloat16,
        build_tokenizer=_char_tokenizer_without_pad,
    ),
    "Qwen/Qwen3-0.6B": ZooEntry(
        "Qwen3-0.6B shape (596M, q/k norm, 16 heads / 8 kv heads x 128, tied)",
        _published(
            Qwen3Config,
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            tie_word_embeddings=True,
            **_QWEN3,
        ),
        torch.bfloat16,
    ),
    "Qwen/Qwen3-4B": ZooEntry(
        "Qwen3-4B shape (4.02B, q/k norm, 32 heads / 8 kv heads x 128, tied)",
        _published(
            Qwen3Config,
            hidden_size=2560,
            intermediate_size=9728,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            tie_word_embeddings=True,
            **_QWEN3,
        ),
        torch.bfloat16,
    ),
    "google/gemma-3-1b-it": ZooEntry(
        "Gemma-3-1b-it shape (1.00B, MQA 4 heads x 256, 5 sliding (512) : 1 full, rope 1e4 local / 1e6 global)",
        _published(
            Gemma3TextConfig,
            vocab_size=262144,
            hidden_size=1152,
            intermediate_size=6912,
            num_hidden_layers=26,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=256,
            query_pre_attn_scalar=256,
            sliding_window=512,
            sliding_window_pattern=6,
            max_position_embeddings=32768,
            rms_norm_eps=1e-6,
            hidden_activation="gelu_pytorch_tanh",
            tie_word_embeddings=True,
        ),
        torch.bfloat16,
    ),
    "Qwen/Qwen3-30B-A3B": ZooEntry(
        "Qwen3-30B-A3B shape (30.5B, 128 experts top-8 normalised, 32 heads / 4 kv heads x 128)",
        _published(
            Qwen3MoeConfig,
            hidden_size=2048,
            intermediate_size=6144,
            moe_intermediate_size=768,
            num_hidden_layers=48,
            num_attention_heads=32,
            num_key_value_heads=4,
            num_experts=128,
            num_experts_per_tok=8,
            norm_topk_prob=True,
            tie_word_embeddings=False,
            **_QWEN3,
        ),
        torch.bfloat16,
    ),
    "microsoft/Phi-3.5-MoE-instruct": ZooEntry(
        "Phi-3.5-MoE-instruct shape (41.9B, 16 experts top-2, attention and lm_head biases); its longrope "
        "short/long factor lists were not found, so RoPE is unscaled (shapes and counts are unaffected)",
        _published(
            PhimoeConfig,
            vocab_size=32064,
            hidden_size=4096,
            intermediate_size=6400,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            num_local_experts=16,
            num_experts_per_tok=2,
            max_position_embeddings=131072,
            sliding_window=131072,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            attention_bias=True,
            lm_head_bias=True,
            tie_word_embeddings=False,
        ),
        torch.bfloat16,
    ),
    "deepseek-ai/DeepSeek-V2-Lite-Chat": ZooEntry(
        "DeepSeek-V2-Lite-Chat shape (15.7B, MLA kv rank 512, 64 experts top-6 + 2 shared, "
        "layer 0 dense, yarn x40)",
        _published(
            DeepseekV2Config,
            vocab_size=102400,
            hidden_size=2048,
            intermediate_size=10944,
            moe_intermediate_size=1408,
            num_hidden_layers=27,
            num_attention_heads=16,
            num_key_value_heads=16,
            kv_lora_rank=512,
            q_lora_rank=None,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            v_head_dim=128,
            n_routed_experts=64,
            n_shared_experts=2,
            num_experts_per_tok=6,
            first_k_dense_replace=1,
            norm_topk_prob=False,
            routed_scaling_factor=1.0,
            topk_method="greedy",
            max_position_embeddings=163840,
            rms_norm_eps=1e-6,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 40.0,
                "original_max_position_embeddings": 4096,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "mscale": 0.707,
                "mscale_all_dim": 0.707,
            },
            tie_word_embeddings=False,
        ),
        torch.bfloat16,
    ),
    "allenai/OLMoE-1B-7B-0924": ZooEntry(
        "OLMoE-1B-7B-0924 shape (6.92B, 64 experts top-8, MHA 16 heads with q/k norm)",
        _published(
            OlmoeConfig,
            vocab_size=50304,
            hidden_size=2048,
            intermediate_size=1024,
            num_hidden_layers=16,
            num_attention_heads=16,
            num_key_value_heads=16,
            num_experts=64,
            num_experts_per_tok=8,
            norm_topk_prob=False,
            max_position_embeddings=4096,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            tie_word_embeddings=False,
        ),
        torch.bfloat16,
    ),
}


ZOO: dict[str, ZooEntry] = {
    "tiny/qwen2": ZooEntry("Qwen2, 2 layers, hidden 64, 4 heads / 2 kv heads, char vocab", _tiny_qwen2),
    "tiny/qwen2-hd64": ZooEntry("Qwen2, 2 layers, hidden 128, head_dim 64 (vLLM CPU)", _tiny_qwen2_hd64),
    "tiny/qwen2-lookup": ZooEntry(
        "tiny/qwen2 with the lookup task's 16-token vocabulary (docs/multi_turn.md)",
        _tiny_qwen2,
        build_tokenizer=build_lookup_tokenizer,
    ),
    "tiny/llama": ZooEntry("Llama, 2 layers, hidden 64, 4 heads / 2 kv heads, char vocab", _tiny_llama),
    "Qwen/Qwen2.5-0.5B": ZooEntry(
        "Qwen2.5-0.5B shape (494M parameters, Qwen2.5-Instruct tokenizer)",
        _qwen25(896, 4864, 24, 14, 2),
        torch.bfloat16,
        tokenizer_family=QWEN25,
    ),
    "Qwen/Qwen2.5-1.5B": ZooEntry(
        "Qwen2.5-1.5B shape (1.54B parameters, Qwen2.5-Instruct tokenizer)",
        _qwen25(1536, 8960, 28, 12, 2),
        torch.bfloat16,
        tokenizer_family=QWEN25,
    ),
    "meta-llama/Llama-3.2-1B": ZooEntry("Llama-3.2-1B shape (1.24B parameters)", _llama32_1b, torch.bfloat16),
    **TINY_ZOO,
    **STUDY_ZOO,
    **MORE_ZOO,
    **REAL_TOKENIZER_ZOO,
}
