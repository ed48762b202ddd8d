"""A tiny config for any model type in transformers' causal-LM mapping, built from its config class.

The compat sweep (`relm.compat.sweep`) checks every type transformers lists in
`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`, so a type a new release adds is checked without anyone writing its
config by hand. Each config class takes a different set of size knobs (`n_embd` or `hidden_size`,
`num_local_experts` or `n_routed_experts`, linear-attention and SSM widths ...): every knob below is
passed where the class's constructor takes it (directly or through its `attribute_map`), so the
class's own `__init__`/`post_init` derives what depends on them (layer types, per-layer lists) as it
would for a published config. Sizes: 2 layers, hidden 64, 4 heads of 16, the character tokenizer's
101-token vocabulary and its pad/bos/eos ids.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

from transformers import CONFIG_MAPPING, PretrainedConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

TINY_KNOBS: dict[str, Any] = {
    # every decoder
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "global_head_dim": 32,  # Gemma-4: full-attention layers wider than sliding ones, as published
    "intermediate_size": 128,
    "vocab_size": 101,
    "max_position_embeddings": 256,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 3,
    # mixtures of experts
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "moe_num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    # latent attention (DeepSeek-V2/V3 style)
    "kv_lora_rank": 16,
    "q_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    # sparse-attention indexers (DeepSeek-V3.2 style)
    "index_n_heads": 2,
    "index_head_dim": 16,
    "index_topk": 128,  # as published (2048), above every sequence here: the selection keeps every key
    # linear attention (Qwen3-Next style gated delta rule)
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    # linear attention (Kimi Linear's KDA): its class's 32 heads of 128 would leave these layers full size
    # (4.5M parameters at hidden 64; transformers' reference chunked kernel materializes [rows, heads,
    # chunks, 64, 64, head_dim] decays): 140 s of compat on one core, against 5 s at 4 heads of 16
    "linear_num_heads": 4,
    "linear_head_dim": 16,
    # state-space layers
    "state_size": 16,
    "ssm_state_size": 16,
    "mamba_d_state": 16,
    "mamba_n_heads": 4,
    "mamba_d_head": 16,
    "mamba_head_dim": 16,
    "n_groups": 1,
    "mamba_n_groups": 1,
    "time_step_rank": 8,
    "is_decoder": True,
    "rotary_dim": 8,  # GPT-J, CodeGen: within head_dim 16
    "attn_layer_indices": [1],  # Bamba: one attention layer of the two
    # hybrids that place attention and expert layers by period and offset (Jamba): one of each in 2 layers
    "attn_layer_period": 2,
    "attn_layer_offset": 1,
    "expert_layer_period": 2,
    "expert_layer_offset": 1,
    # per-layer input embeddings (Gemma-3n/4) and hashed byte groups (BLT)
    "vocab_size_per_layer_input": 101,
    "hidden_size_per_layer_input": 16,
    "encoder_hash_byte_group_vocab": 101,
}
"""Knob name -> tiny value, passed to a config class only where its constructor takes the name."""

_BLT_LOCAL = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 16,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "vocab_size": 260,
    "max_position_embeddings": 256,
}

TYPE_KNOBS: dict[str, dict[str, Any]] = {
    # Classes whose defaults leave the layer plan to the published config.json (`layer_types=None`):
    # one layer of each kind, as the published checkpoints mix them.
    "lfm2_moe": {"num_hidden_layers": 2, "layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
    "granitemoehybrid": {"num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"]},
    # DBRX: the published attn_config carries rope_theta (its attention reads it, its class lacks it) and
    # clip_qkv 8 (its attention clamps unconditionally); experts as wide as the rest.
    "dbrx": {
        "d_model": 64,  # its ffn_config copies d_model when built: set with it, not after
        "attn_config": {"kv_n_heads": 2, "rope_theta": 500000.0, "clip_qkv": 8.0},
        "ffn_config": {"ffn_hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2},
    },
    # Cohere Compass keys RoPE by layer type (published configs do; the class's default is empty), with
    # its 3D sections summing to half of head_dim 16.
    "cohere_compass_text": {
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [3, 3, 2]}
        }
    },
    # Qwen4-Exp's default layer plan has indexed-attention layers but leaves their indexer unset: a QSA
    # indexer with one key head and a token budget above every sequence here (it keeps every key); experts
    # set with their top-k (the class checks them together).
    "qwen4_exp_text": {
        "indexer_n_heads": 2,
        "indexer_kv_heads": 1,
        "indexer_head_dim": 16,
        "head_dim": 16,  # its RoPE must fit the index head
        "indexer_budget": 128,
        "indexer_compress_ratio": 4,
        "num_experts": 4,
        "num_experts_per_tok": 2,
    },
    # LongCat-Flash's head_dim is its rotary width (qk_rope_head_dim, as published), not a head's.
    "longcat_flash": {"head_dim": 8, "qk_rope_head_dim": 8, "zero_expert_num": 2},
    # xLSTM's cache rounds the query/key width (hidden x qk_dim_factor 0.5) up to a multiple of 64, its
    # layers do not: hidden 128 keeps the two equal, as the published 4096 does.
    "xlstm": {"hidden_size": 128, "num_heads": 8},
    # BLT: four sub-models (entropy patcher, local byte encoder and decoder, global transformer over
    # patches), each set small; the local models' hidden 64 times cross_attn_k 2 is the global width.
    "blt": {
        "patcher_config": {**_BLT_LOCAL, "num_hidden_layers": 1},
        "encoder_config": {**_BLT_LOCAL, "num_hidden_layers": 1, "hidden_size_global": 128},
        "decoder_config": {**_BLT_LOCAL, "num_hidden_layers": 1, "hidden_size_global": 128},
        "global_config": {**_BLT_LOCAL, "hidden_size": 128, "head_dim": 32, "intermediate_size": 256},
        "encoder_hash_byte_group_size": [3, 4],
    },
    # Reformer: axial position embeddings factor the 256 positions (16 x 16) and split hidden 64; one
    # local and one LSH layer, chunks of 16, a fixed hash seed (a random one hashes each forward anew).
    # It builds, and relm refuses it (`registry.non_causal_reason`): it trains only on fixed lengths.
    "reformer": {
        "num_hidden_layers": 2,
        "attn_layers": ["local", "lsh"],
        "axial_pos_shape": [16, 16],
        "axial_pos_embds_dim": [32, 32],
        "max_position_embeddings": 256,
        "attention_head_size": 16,
        "feed_forward_size": 128,
        "local_attn_chunk_length": 16,
        "lsh_attn_chunk_length": 16,
        "num_buckets": 4,
        "hash_seed": 0,
        "hidden_dropout_prob": 0.0,
        "local_attention_probs_dropout_prob": 0.0,
    },
    # The shared transformer block is tied across hybrid layers: two of them, or there is nothing to tie.
    "zamba": {"num_hidden_layers": 3, "layers_block_type": ["linear_attention", "hybrid", "hybrid"]},
}
"""Model type -> knobs its class needs beyond `TINY_KNOBS` (a published config sets them; the class's
defaults do not build, or do not build at 2 layers). They are the base the generic knobs are tried on."""


REQUIRED_SUB_CONFIGS: dict[str, dict[str, Any]] = {
    # MusicGen's config class builds nothing without its three sub-models (a published config names them):
    # a T5 text encoder, an EnCodec audio encoder and the audio-codebook decoder.
    "musicgen": {
        "text_encoder": {"model_type": "t5"},
        "audio_encoder": {"model_type": "encodec"},
        "decoder": {"model_type": "musicgen_decoder"},
    },
    "musicgen_melody": {
        "text_encoder": {"model_type": "t5"},
        "audio_encoder": {"model_type": "encodec"},
        "decoder": {"model_type": "musicgen_melody_decoder"},
    },
}
"""Model type -> the sub-configs its class cannot be built without, for the default config too."""


def causal_lm_types() -> list[str]:
    """Every model type the installed transformers maps to a causal-LM class, sorted."""
    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def tiny_config(model_type: str) -> PretrainedConfig:
    """The config of `model_type` with every size knob its class takes set small (see `TINY_KNOBS`).

    Per-layer lists (layer types, per-layer widths) of the default config are cut to one layer of each
    kind in their order, so a hybrid keeps one layer of each kind; knobs the class refuses (its own
    validation) are left at the class's default, one at a time. A composite config's text config is
    shrunk the same way.

    Raises:
        Exception: whatever the config class raises for the smallest sizes it took (the sweep reports it).
    """
    config_class = CONFIG_MAPPING[model_type]
    own = copy.deepcopy({**REQUIRED_SUB_CONFIGS.get(model_type, {}), **TYPE_KNOBS.get(model_type, {})})
    config = _shrunk(config_class, {}, own)
    for name in ("text_config", "decoder"):
        sub = getattr(config, name, None)
        if isinstance(sub, PretrainedConfig):
            setattr(config, name, _shrunk(type(sub), sub.to_dict(), TYPE_KNOBS.get(sub.model_type, {})))
    config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]]
    return config


def _shrunk(
    config_class: type[PretrainedConfig], base: dict[str, Any], own: dict[str, Any]
) -> PretrainedConfig:
    """`config_class` from `base` (a sub-config's values) with `own` (the type's `TYPE_KNOBS`, kept as
    given) and every generic knob the class takes."""
    kept: dict[str, Any] = {**base, **own}
    default = config_class(**copy.deepcopy(kept))  # classes pop keys from sub-config dicts
    layers = {} if "num_hidden_layers" in own else _per_layer_fields(default)  # a type's own layer plan
    knobs = {k: v for k, v in _knobs_for(config_class).items() if k not in own}
    for group in _groups(knobs, layers):
        try:
            config_class(**copy.deepcopy({**kept, **group}))
        except Exception:  # noqa: BLE001 - the class's own validation refused this knob: keep its default
            continue
        kept.update(group)
    return config_class(**copy.deepcopy(kept))


def _groups(knobs: dict[str, Any], layers: dict[str, Any]) -> list[dict[str, Any]]:
    """The knobs in the order they are tried: layer count with its per-layer lists first, then the
    widths together (classes check hidden size against head counts), then one knob at a time."""
    groups: list[dict[str, Any]] = []
    if layers:
        groups.append(layers)
    widths = {k: v for k, v in knobs.items() if k in _WIDTHS}
    groups.append(widths)
    groups += [{k: v} for k, v in knobs.items() if k not in _WIDTHS and k not in layers]
    return groups


_WIDTHS = (
    "num_heads",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
)


def _per_layer_fields(default: PretrainedConfig) -> dict[str, Any]:
    """`num_hidden_layers` and every per-layer list or layer-keyed dict, cut to one layer of each kind."""
    num_layers = getattr(default, "num_hidden_layers", None)
    if not isinstance(num_layers, int) or num_layers < 2:
        return {}
    fields = {
        key: value
        for key, value in default.to_dict().items()
        if isinstance(value, list) and len(value) == num_layers
    }
    kinds = [value for value in fields.values() if all(isinstance(item, str) for item in value)]
    keep: list[int] = [0, 1]
    for kind in kinds:
        for index, item in enumerate(kind):
            if all(kind[i] != item for i in keep) and index not in keep:
                keep.append(index)
    layer_keyed = getattr(default, "per_layer_config", None)
    if isinstance(layer_keyed, dict):
        keep += [int(key) for key in layer_keyed if int(key) not in keep][:1]
    keep.sort()
    out: dict[str, Any] = {"num_hidden_layers": len(keep)}
    if getattr(default, "num_kv_shared_layers", None):
        out["num_kv_shared_layers"] = 0  # layers reading an earlier layer's cache need more layers than 2
    for key, value in fields.items():
        if key in TINY_KNOBS:
            out[key] = [TINY_KNOBS[key]] * len(keep)
        else:
            out[key] = [value[i] for i in keep]
    if isinstance(layer_keyed, dict):
        out["per_layer_config"] = {
            str(keep.index(int(key))): {
                k: (2 * TINY_KNOBS[k] if k in TINY_KNOBS else v) for k, v in value.items()
            }
            for key, value in layer_keyed.items()
            if int(key) in keep
        }
    return out


def _knobs_for(config_class: type[PretrainedConfig]) -> dict[str, Any]:
    parameters = inspect.signature(config_class.__init__).parameters
    aliases = getattr(config_class, "attribute_map", {}) or {}
    knobs: dict[str, Any] = {}
    try:
        source = inspect.getsource(config_class)
    except (OSError, TypeError):
        source = ""
    for name, value in TINY_KNOBS.items():
        if name in parameters or f'"{name}"' in source:  # some knobs are popped from **kwargs
            knobs[name] = value
        elif aliases.get(name) in parameters:
            knobs[aliases[name]] = value
    if "kv_lora_rank" in knobs and "num_key_value_heads" in knobs:
        knobs["num_key_value_heads"] = knobs["num_attention_heads"]  # latent attention expands to every head
    # A state-space mixer's own heads (Mamba-2): hidden 64 x expand 2 = 8 heads of 16.
    if "num_heads" in parameters and "num_heads" not in knobs and "expand" in parameters:
        knobs["num_heads"] = 8
    return knobs


def default_config(model_type: str) -> PretrainedConfig:
    """The config class's defaults (a published model's shape): enough to classify without building."""
    # a copy: config classes pop keys from the sub-config dicts they are given
    config = CONFIG_MAPPING[model_type](**copy.deepcopy(REQUIRED_SUB_CONFIGS.get(model_type, {})))
    config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]]
    return config
