"""The architectures relm knows: what each one is made of, which are verified, and user registrations.

Three questions are answered here, all from a config (no weights are read):
- `inspect_model_architecture`: what is this model made of (attention kind, soft-capping, sliding
  window, MoE, ...)? The compatibility report and the loader's choices (e.g. eager attention for
  soft-capped models) read it.
- `classify`: can relm train it? `supported` (an architecture the tiny zoo verifies), `probe`
  (a decoder-only model transformers can build: relm runs it and the compat check reports what it
  found, instead of refusing by name), or `unsupported` with the reason.
- `register_model_class`: run a config whose `architectures` names a class transformers does not
  have, e.g. `StarlingLmForCausalLM` that is Mistral inside.
"""

from __future__ import annotations

import importlib
import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import transformers
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from relm.errors import UserError

SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MistralForCausalLM": "mistral",
    "Phi3ForCausalLM": "phi3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "OlmoeForCausalLM": "olmoe",
    "PhimoeForCausalLM": "phimoe",
}
"""Architecture class -> family, for every class a `zoo:tiny/*` model passes `relm compat` with."""

PACKED_FORWARD_VERIFIED: frozenset[str] = frozenset(SUPPORTED_ARCHITECTURES)
"""Architectures whose packed (remove-padding) forward equals the padded one in logprobs, entropy,
values and gradients (tests/unit/test_packing.py runs every `zoo:tiny/*` model): all supported ones.
Packing relies on transformers building a block-diagonal mask from restarting position ids, which
every architecture using its shared masking utilities gets."""

# Bidirectional encoders: some have a `*ForCausalLM` class in transformers, but their pretraining
# never taught left-to-right generation, so RL on them would only train noise.
_ENCODER_ONLY_MODEL_TYPES = frozenset(
    {
        "albert",
        "bert",
        "big_bird",
        "camembert",
        "convbert",
        "data2vec-text",
        "deberta",
        "deberta-v2",
        "distilbert",
        "electra",
        "ernie",
        "esm",
        "megatron-bert",
        "mobilebert",
        "modernbert",
        "mpnet",
        "rembert",
        "roberta",
        "roberta-prelayernorm",
        "xlm-roberta",
        "xlm-roberta-xl",
        "xmod",
    }
)
# Only masked-LM heads mark an encoder: a causal model saved with a classification head (a reward
# model) is still a decoder, and a common critic initialisation.
_ENCODER_HEAD_SUFFIXES = ("ForMaskedLM",)
_REGISTERED: dict[str, type[PreTrainedModel]] = {}
"""User registrations: architecture name in config.json -> the class that builds it."""

Status = Literal["supported", "probe", "unsupported"]


@dataclass
class ArchitectureInfo:
    """What a causal LM is made of, derived from its HF config and its module tree (built on meta)."""

    architecture: str
    """Class name the config names (`architectures[0]`), else the one its model_type maps to."""
    model_type: str
    family: str
    """Supported family, the registered target's family, or the model_type for a probed model."""
    attention: str
    """GQA, MHA, MQA or MLA (latent KV compression, DeepSeek-V2)."""
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    sliding_window: int | None
    """Window of the sliding-attention layers; None when every layer attends to all tokens."""
    num_sliding_layers: int
    attn_logit_softcapping: float | None
    final_logit_softcapping: float | None
    norm: str
    """Norm class name of the decoder layers (e.g. Gemma2RMSNorm, which scales by 1 + w)."""
    mlp: str
    """SwiGLU, GeGLU, fused gate_up (...), MoE or MLP (act)."""
    num_experts: int | None
    num_experts_per_token: int | None
    fused_qkv: bool
    tied_embeddings: bool
    position_encoding: str
    """RoPE, learned or unknown."""
    rope_theta: float | None
    rope_scaling: str | None
    """Non-default rope types with their factors, e.g. `llama3 x32`; None for plain RoPE."""
    max_position_embeddings: int | None
    packed_forward_verified: bool
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line for tables: the traits that change how a model must be run."""
        parts = [self.family, f"{self.attention} {self.num_heads}/{self.num_kv_heads}x{self.head_dim}"]
        if self.sliding_window:
            parts.append(f"SWA {self.sliding_window} ({self.num_sliding_layers}/{self.num_layers} layers)")
        caps = [
            f"{name} {cap:g}"
            for name, cap in (("attn", self.attn_logit_softcapping), ("final", self.final_logit_softcapping))
            if cap
        ]
        if caps:
            parts.append("softcap " + ", ".join(caps))
        if self.num_experts:
            parts.append(f"MoE {self.num_experts}e top{self.num_experts_per_token}")
        else:
            parts.append(self.mlp)
        if self.tied_embeddings:
            parts.append("tied")
        return ", ".join(parts)


@dataclass(frozen=True)
class Classification:
    """Whether relm runs a config, and why."""

    status: Status
    architecture: str
    family: str | None
    reason: str


def register_model_class(arch_name: str, cls_or_known_arch: type[PreTrainedModel] | str) -> None:
    """Build configs whose `architectures[0]` is `arch_name` with the given class.

    Args:
        arch_name: The name in the model's config.json, e.g. `StarlingLmForCausalLM`.
        cls_or_known_arch: A `PreTrainedModel` subclass, or the name of a transformers class such as
            `MistralForCausalLM`; the config is read with that class's config class.

    Raises:
        UserError: The target is neither a transformers class name nor a PreTrainedModel subclass.
    """
    target: type[PreTrainedModel] | str | None = cls_or_known_arch
    if isinstance(target, str):
        target = getattr(transformers, target, None)
    if not (isinstance(target, type) and issubclass(target, PreTrainedModel) and target.config_class):
        raise UserError(
            f"register_model_class('{arch_name}', {cls_or_known_arch!r}): the target must be a "
            "PreTrainedModel subclass or a transformers class name, e.g. one of "
            + ", ".join(SUPPORTED_ARCHITECTURES)
        )
    _REGISTERED[arch_name] = target


def unregister_model_class(arch_name: str) -> None:
    """Forget a registration (tests, or a session that registered the wrong target)."""
    _REGISTERED.pop(arch_name, None)


def registered_model_class(arch_name: str | None) -> type[PreTrainedModel] | None:
    """The class registered for `arch_name`, if any."""
    return _REGISTERED.get(arch_name) if arch_name else None


def import_external_lib(module_name: str | None, key: str = "external_lib") -> None:
    """Import the module named by `model.external_lib` (the setting `key` names), where users call
    `register_model_class`.

    Raises:
        UserError: The module cannot be imported.
    """
    if not module_name:
        return
    try:
        importlib.import_module(module_name)
    except ImportError as exc:
        raise UserError(f"`{key}={module_name}` cannot be imported ({exc}); check the module name") from exc


def config_architecture(config: PretrainedConfig) -> str:
    """The class a config names, else the causal-LM class its model_type maps to."""
    names = list(getattr(config, "architectures", None) or [])
    if names:
        return str(names[0])
    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(config, "model_type", ""), "unknown")


def loads_text_model(config: PretrainedConfig) -> bool:
    """Whether transformers' causal-LM class for a composite (vision-language) config is built on its text
    config alone: Qwen3.5, Llama-4, Mllama and Qwen4-Exp map to a `*ForCausalLM` that AutoModelForCausalLM
    fills with the checkpoint's language model (its vision weights are left unread), a text-only decoder
    relm trains and saves as such. Gemma-3's maps to the whole vision-language model: False."""
    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(config, "model_type", ""))
    model_class = getattr(transformers, name, None) if name else None
    text = config.get_text_config(decoder=True)
    config_class = getattr(model_class, "config_class", None)
    return text is not config and isinstance(config_class, type) and isinstance(text, config_class)


def _draft_model_class(config: PretrainedConfig) -> str | None:
    """The causal-LM class of `config`'s model_type when it drafts for a target model (Gemma-4's
    assistants: their forward takes the target's `shared_kv_states` and ignores `input_ids`), else None."""
    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(config, "model_type", ""))
    model_class = getattr(transformers, name, None) if name else None
    if model_class is None or "shared_kv_states" not in inspect.signature(model_class.forward).parameters:
        return None
    return name


def _fixed_training_length(config: PretrainedConfig) -> str | None:
    """Why a model that trains only on sequences of set lengths cannot train in relm, or None.

    Reformer's chunked attention (local and LSH layers) refuses, in training mode, a sequence length that
    is not a multiple of its chunk lengths' least common multiple (outside training transformers pads to
    one itself, which breaks when position ids are given: an `arange` from the padded length to the chunk
    length), and its axial position embeddings refuse any length but the product of `axial_pos_shape`
    (65,536 and 524,288 tokens in the published checkpoints), reading positions by column, not by
    position id. relm trains batches padded to their longest row, of any length.
    """
    kinds = set(getattr(config, "attn_layers", None) or [])
    chunks = [
        length
        for kind in ("lsh", "local")
        if kind in kinds and isinstance(length := getattr(config, f"{kind}_attn_chunk_length", None), int)
    ]
    if not chunks:
        return None
    multiple = math.lcm(*chunks)
    shape = getattr(config, "axial_pos_shape", None)
    if getattr(config, "axial_pos_embds", False) and shape:
        return (
            f"trains only on sequences of exactly {math.prod(shape):,} tokens (its axial position embeddings, "
            f"axial_pos_shape {list(shape)}, refuse other lengths in training) and its chunked attention only "
            f"on multiples of {multiple}; relm trains batches padded to their longest sequence"
        )
    return (
        f"trains only on sequence lengths that are multiples of {multiple} (its chunked attention refuses "
        "others in training); relm trains batches padded to their longest sequence"
    )


def non_causal_reason(config: PretrainedConfig, trust_remote_code: bool = False) -> str | None:
    """Why `config` is not a decoder-only text causal LM relm can train (one clause), or None."""
    model_type = getattr(config, "model_type", "")
    architectures = list(getattr(config, "architectures", None) or [])
    if getattr(config, "vision_config", None) is not None and not loads_text_model(config):
        return (
            "is a vision-language model (its config has vision_config); relm trains text-only causal LMs: "
            "pass the text model"
        )
    drafter = _draft_model_class(config)
    if drafter is not None:
        return (
            f"is a speculative-decoding draft model ({drafter}): its forward reads the target model's hidden "
            "states and key-value cache (`shared_kv_states`), not token ids; relm trains standalone causal LMs"
        )
    if getattr(config, "is_encoder_decoder", False):
        return "is an encoder-decoder model; relm trains decoder-only causal LMs"
    fixed = _fixed_training_length(config)
    if fixed is not None:
        return fixed
    encoder_heads = [a for a in architectures if a.endswith(_ENCODER_HEAD_SUFFIXES)]
    causal_heads = [a for a in architectures if a.endswith("ForCausalLM")]
    if model_type in _ENCODER_ONLY_MODEL_TYPES or (encoder_heads and not causal_heads):
        return (
            f"is an encoder-only (BERT-like) model ({', '.join(architectures) or 'no architectures'}) that "
            "cannot generate text; pass a decoder-only causal LM"
        )
    remote_causal = trust_remote_code and "AutoModelForCausalLM" in (getattr(config, "auto_map", None) or {})
    registered = any(registered_model_class(name) is not None for name in architectures)
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not remote_causal and not registered:
        known = [
            name for name in architectures if name.endswith("ForCausalLM") and hasattr(transformers, name)
        ]
        if known:
            # transformers has the class but maps no causal LM to this model_type (Mllama's text model).
            return (
                f"has model_type `{model_type}`, which transformers maps to no causal-LM class although it "
                f"has {known[0]}; build it with that class: `relm compat --register {known[0]}={known[0]}` "
                f"(or relm.models.registry.register_model_class('{known[0]}', '{known[0]}') for training)"
            )
        return (
            f"has model_type `{model_type}`, for which transformers has no causal-LM class; upgrade "
            "transformers, register its architecture (relm.models.registry.register_model_class), or set "
            "`trust_remote_code` for a model that ships code"
        )
    return None


def classify(config: PretrainedConfig, trust_remote_code: bool = False) -> Classification:
    """Supported / probe / unsupported, with the reason, for a config (no weights needed)."""
    arch = config_architecture(config)
    reason = non_causal_reason(config, trust_remote_code)
    if reason is not None:
        return Classification("unsupported", arch, None, reason)
    registered = registered_model_class(arch)
    if registered is not None:
        family = _family_of_class(registered)
        return Classification("supported", arch, family, f"registered as {registered.__name__}")
    if arch in SUPPORTED_ARCHITECTURES:
        return Classification("supported", arch, SUPPORTED_ARCHITECTURES[arch], "verified by the tiny zoo")
    built = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(config, "model_type", ""))
    if built in SUPPORTED_ARCHITECTURES:
        return Classification(
            "supported",
            arch,
            SUPPORTED_ARCHITECTURES[built],
            f"transformers builds {built} from model_type `{config.model_type}`",
        )
    return Classification(
        "probe",
        arch,
        None,
        "decoder-only but not verified by relm: loaded, generated and trained to find out",
    )


def _family_of_class(cls: type[PreTrainedModel]) -> str:
    return SUPPORTED_ARCHITECTURES.get(cls.__name__) or str(getattr(cls.config_class, "model_type", "custom"))


def _first(config: PretrainedConfig, *names: str, default: Any = None) -> Any:
    for name in names:
        value = _read(config, name)
        if value is not None:
            return value
    return default


def _read(config: PretrainedConfig, name: str) -> Any:
    """`config.name`; for a per-layer attribute (Gemma-4's head_dim, which transformers refuses to read
    globally) or a per-layer list (Gemma-3n's intermediate_size), the largest layer's value."""
    try:
        value = getattr(config, name, None)
    except Exception:  # noqa: BLE001 - transformers' heterogeneous configs raise on a global read
        value = config.to_dict().get(name)
        layers = getattr(config, "per_layer_config", None)
        entries = layers.values() if isinstance(layers, dict) else layers or []
        values = [_read(entry, name) if not isinstance(entry, dict) else entry.get(name) for entry in entries]
        value = max([v for v in [value, *values] if isinstance(v, int | float)], default=value)
    if isinstance(value, list | tuple) and value and all(isinstance(v, int | float) for v in value):
        return max(value)
    return value


def inspect_model_architecture(config: PretrainedConfig) -> ArchitectureInfo:
    """The capability record of a causal-LM config.

    Counts and flags come from the config; how the MLP, projections and norms are built comes from
    the module tree of the model instantiated on the meta device (no memory, milliseconds even for
    a 47B MoE), so a model relm has never seen is described by what it is, not by its name.
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    arch = config_architecture(config)
    num_layers = int(_first(text, "num_hidden_layers", "n_layer", default=0))
    hidden = int(_first(text, "hidden_size", "n_embd", "d_model", default=0))
    num_heads = int(_first(text, "num_attention_heads", "n_head", default=1))
    num_kv_heads = int(_first(text, "num_key_value_heads", "num_kv_heads", default=num_heads))
    kv_lora_rank = getattr(text, "kv_lora_rank", None)
    if kv_lora_rank:
        head_dim = int(text.qk_nope_head_dim) + int(text.qk_rope_head_dim)
    else:
        head_dim = int(_first(text, "head_dim", default=hidden // max(num_heads, 1)))
    if kv_lora_rank:
        attention = "MLA"
    elif num_kv_heads == num_heads:
        attention = "MHA"
    elif num_kv_heads == 1:
        attention = "MQA"
    else:
        attention = "GQA"

    window, num_sliding = _sliding_window(text, num_layers)
    num_experts = _first(text, "num_local_experts", "num_experts", "n_routed_experts")
    num_experts = int(num_experts) if num_experts else None
    structure = _module_structure(config)
    activation = str(_first(text, "hidden_activation", "hidden_act", "activation_function", default="?"))
    if num_experts:
        mlp = "MoE"
    elif structure["fused_gate_up"]:
        mlp = f"fused gate_up ({_glu_name(activation)})"
    elif structure["gated"]:
        mlp = _glu_name(activation)
    else:
        mlp = f"MLP ({activation})"
    rope_theta, rope_scaling = _rope(text)
    family = classify(config).family or str(getattr(config, "model_type", "unknown"))
    notes = _notes(text, structure, num_experts, activation)
    return ArchitectureInfo(
        architecture=arch,
        model_type=str(getattr(config, "model_type", "unknown")),
        family=family,
        attention=attention,
        num_layers=num_layers,
        hidden_size=hidden,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        vocab_size=int(_first(text, "vocab_size", default=0)),
        sliding_window=window,
        num_sliding_layers=num_sliding,
        attn_logit_softcapping=_first(text, "attn_logit_softcapping"),
        final_logit_softcapping=_first(text, "final_logit_softcapping"),
        norm=structure["norm"],
        mlp=mlp,
        num_experts=num_experts,
        num_experts_per_token=_first(text, "num_experts_per_tok") if num_experts else None,
        fused_qkv=structure["fused_qkv"],
        tied_embeddings=bool(
            getattr(config, "tie_word_embeddings", getattr(text, "tie_word_embeddings", False))
        ),
        position_encoding="RoPE" if rope_theta is not None else structure["positions"],
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=_first(text, "max_position_embeddings", "n_positions"),
        packed_forward_verified=arch in PACKED_FORWARD_VERIFIED,
        notes=notes,
    )


def _sliding_window(text: PretrainedConfig, num_layers: int) -> tuple[int | None, int]:
    """(window, number of layers that use it); Qwen2 keeps a window value it does not use."""
    window = getattr(text, "sliding_window", None)
    if not window or getattr(text, "use_sliding_window", True) is False:
        return None, 0
    layer_types = getattr(text, "layer_types", None)
    if layer_types is None:
        return int(window), num_layers  # Mistral / Phi-3 style: every layer slides
    num_sliding = sum(kind == "sliding_attention" for kind in layer_types)
    return (int(window), num_sliding) if num_sliding else (None, 0)


def _glu_name(activation: str) -> str:
    if activation in ("silu", "swish"):
        return "SwiGLU"
    if activation.startswith("gelu"):
        return "GeGLU"
    return f"GLU ({activation})"


def _rope(text: PretrainedConfig) -> tuple[float | None, str | None]:
    """(rope_theta, description of non-default scaling) from transformers 5's rope_parameters."""
    params = getattr(text, "rope_parameters", None)
    if not isinstance(params, dict) or not params:
        theta = getattr(text, "rope_theta", None)
        return (float(theta) if theta is not None else None), None
    # Gemma 3 keeps one parameter set per layer type; the others keep one.
    per_type = params if all(isinstance(v, dict) for v in params.values()) else {"": params}
    thetas, scalings = [], []
    for layer_type, entry in per_type.items():
        thetas.append(float(entry.get("rope_theta", 10000.0)))
        kind = entry.get("rope_type", "default")
        if kind != "default":
            factor = entry.get("factor")
            label = f"{kind} x{factor:g}" if isinstance(factor, int | float) else kind
            scalings.append(f"{layer_type}: {label}" if layer_type else label)
    return max(thetas), ("; ".join(scalings) or None)


def _module_structure(config: PretrainedConfig) -> dict[str, Any]:
    """Projection fusion, MLP gating, norm class and position embedding, read off a meta-device model."""
    found: dict[str, Any] = {"fused_qkv": False, "fused_gate_up": False, "gated": False}
    found |= {"norm": "unknown", "positions": "unknown", "experts_fused": False}
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception:  # noqa: BLE001 - a config transformers cannot build is reported, not raised, here
        found["norm"] = "unknown (transformers cannot build this config)"
        return found
    names = [name for name, _ in model.named_parameters()]
    found["fused_qkv"] = any(
        n.rsplit(".", 2)[-2] in ("qkv_proj", "query_key_value", "c_attn", "Wqkv") for n in names if "." in n
    )
    found["fused_gate_up"] = any(".mlp.gate_up_proj." in n for n in names)
    found["gated"] = (
        any(n.endswith(("gate_proj.weight", "w3.weight")) for n in names) or found["fused_gate_up"]
    )
    found["experts_fused"] = any(n.endswith("experts.gate_up_proj") for n in names)
    if any(n.endswith(("wpe.weight", "embed_positions.weight")) for n in names):
        found["positions"] = "learned"
    norms = [type(m).__name__ for m in model.modules() if "Norm" in type(m).__name__]
    if norms:
        found["norm"] = norms[0]
    return found


def _notes(
    text: PretrainedConfig, structure: dict[str, Any], num_experts: int | None, activation: str
) -> list[str]:
    """What a user (or an engine's weight loader) must know beyond the fields."""
    notes = []
    if getattr(text, "attn_logit_softcapping", None):
        notes.append("attention soft-capping: sdpa would silently skip it, so relm loads eager attention")
    if structure["fused_qkv"]:
        notes.append("fused qkv_proj: engines that shard q/k/v separately need a weight-name map")
    if structure["fused_gate_up"]:
        notes.append("fused gate_up_proj in the MLP")
    if num_experts and structure["experts_fused"]:
        notes.append("experts stored as fused 3-D tensors (experts.gate_up_proj / down_proj)")
    if num_experts and not getattr(text, "output_router_logits", False):
        notes.append("router load-balancing loss off (output_router_logits false), as in inference")
    if getattr(text, "query_pre_attn_scalar", None):
        notes.append(f"attention scaled by query_pre_attn_scalar {text.query_pre_attn_scalar}^-0.5")
    if activation == "?":
        notes.append("activation not named in the config")
    return notes
