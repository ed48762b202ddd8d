"""What the memory plan needs to know of a model: parameter count and the sizes activations scale with.

Read from a built module, or from a config alone: the plan decides the dtype the models are loaded
in (bf16 weights when fp32 ones do not fit), so it has to run before any weight exists. A model
built on the meta device has every parameter's shape and no storage, which counts parameters
exactly (tied embeddings once, biases, norms) for any architecture transformers or the registry knows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PretrainedConfig

from relm.models.fused_layers import compiles
from relm.models.registry import registered_model_class
from relm.models.value_model import ValueModel


@dataclass(frozen=True)
class ModelShape:
    """What the arithmetic needs of a model."""

    num_params: int
    num_layers: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    linears: tuple[tuple[str, int, int], ...] = ()
    """(name, in features, out features) of the Linear layers LoRA may target: every one but the output head
    and a value model's head."""
    head_params: int = 0
    """Parameters of a value model's head, trained whole when the backbone trains with LoRA."""
    autocast_cached_params: int = 0
    """Parameters autocast keeps a bf16 copy of under compiled training pieces: the Linear layers outside
    the compiled MLPs (`relm.models.fused_layers.compiles`), i.e. the attention projections; the MLPs and
    norms cast inside their graphs, the embedding is not cast and the output head is read in compiled
    vocabulary chunks. 0: unknown (the plan then counts every parameter)."""
    tensor_parallel_params: int = 0
    """Parameters of the Linear layers the config's tensor-parallel plan splits (`colwise`/`rowwise` entries of
    `base_model_tp_plan`: attention and MLP projections), which a tensor-parallel generation copy holds 1/N of
    (`relm.rollout.tensor_parallel`); 0 when it declares none."""
    lora_input_bytes_per_token: int = 0
    """Under LoRA, the bf16 copies of each adapted layer's input that its adapter keeps for backward
    (autocast casts the input again for `lora_A`), summed over the layers; 0 without LoRA."""

    @classmethod
    def of(cls, model: nn.Module) -> ModelShape:
        backbone = getattr(model, "backbone", model)  # a value model wraps its causal LM
        config = backbone.config.get_text_config()  # type: ignore[union-attr,operator]  # nn.Module hides the HF model's API
        hidden = _size(config, "hidden_size", "n_embd", "d_model") or _widest_embedding(backbone)
        output = backbone.get_output_embeddings() if hasattr(backbone, "get_output_embeddings") else None  # type: ignore[operator]  # nn.Module hides the HF model's API
        head = getattr(model, "value_head", None)
        return cls(
            num_params=sum(p.numel() for p in model.parameters()),
            num_layers=_size(config, "num_hidden_layers", "n_layer", "num_layers") or 1,
            hidden_size=hidden,
            intermediate_size=_size(config, "intermediate_size") or 4 * hidden,
            vocab_size=_size(config, "vocab_size") or 0,
            linears=tuple(
                (name, module.in_features, module.out_features)
                for name, module in backbone.named_modules()
                if isinstance(module, nn.Linear) and module is not output
            ),
            head_params=sum(p.numel() for p in head.parameters()) if head is not None else 0,
            autocast_cached_params=_eagerly_cast_params(backbone, output),
            tensor_parallel_params=_tensor_parallel_params(backbone, config),
        )

    def lora_params(
        self,
        rank: int,
        target_modules: str | list[str] = "all-linear",
        exclude_modules: str | list[str] | None = None,
    ) -> int:
        """Trainable parameters with LoRA of `rank`: r * (in + out) per target Linear, plus a value head.

        Targets are matched as PEFT matches them: `all-linear` is every Linear but the output head, a list
        names modules by their last name parts (`all-linear` among them: every one), a string is a regex on the full name (as is a string
        `exclude_modules`).
        """

        def named(name: str, patterns: str | list[str] | None) -> bool:
            if patterns is None:
                return False
            if isinstance(patterns, str):
                return patterns == "all-linear" or re.fullmatch(patterns, name) is not None
            return any(p == "all-linear" or name == p or name.endswith(f".{p}") for p in patterns)

        adapters = sum(
            rank * (fan_in + fan_out)
            for name, fan_in, fan_out in self.linears
            if named(name, target_modules)
            and not (exclude_modules is not None and named(name, exclude_modules))
        )
        return adapters + self.head_params

    @classmethod
    def from_config(
        cls, config: PretrainedConfig, *, value_model: bool = False, trust_remote_code: bool = False
    ) -> ModelShape:
        """The shape of the causal LM `config` describes (or of the critic built on it), without weights.

        Args:
            config: the model's HF config, as `relm.models.loading.load_config` returns it.
            value_model: the critic: the backbone without the lm_head, plus the value head.
            trust_remote_code: allow a config whose model class ships in the model folder.
        """
        model_class = registered_model_class((getattr(config, "architectures", None) or [None])[0])
        with torch.device("meta"):
            if model_class is not None:
                model = model_class._from_config(config)
            else:
                model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
            return cls.of(ValueModel(model) if value_model else model)

    def activation_bytes_per_token(self, checkpointing: bool) -> int:
        """Bytes one token's activations keep through a forward+backward (bf16 compute)."""
        one_layer = 2 * (12 * self.hidden_size + 6 * self.intermediate_size)
        if checkpointing:
            # each layer's fp32 residual input, plus one layer's full set while it is recomputed
            lora = self.lora_input_bytes_per_token // max(1, self.num_layers)
            return self.num_layers * 4 * self.hidden_size + one_layer + lora
        return self.num_layers * one_layer + self.lora_input_bytes_per_token

    def with_lora_inputs(self) -> ModelShape:
        """This shape with LoRA's saved inputs counted (every adaptable Linear: `all-linear`, the default;
        fewer targets keep fewer, so the count errs on the side of memory)."""
        return replace(self, lora_input_bytes_per_token=2 * sum(fan_in for _, fan_in, _ in self.linears))


def _size(config: object, *names: str) -> int | None:
    """The first of `names` the config has, as one number: a per-layer list (Gemma-3n's
    intermediate_size) counts as its largest entry, which errs on the side of memory."""
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, list | tuple) and value and all(isinstance(v, int) for v in value):
            value = max(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _widest_embedding(backbone: nn.Module) -> int:
    """The embedding width, for a config that names none (BLT's byte-level patches)."""
    embedding = backbone.get_input_embeddings() if hasattr(backbone, "get_input_embeddings") else None  # type: ignore[operator]  # nn.Module hides the HF model's API
    weight = getattr(embedding, "weight", None)
    return int(weight.shape[1]) if weight is not None else 0


def _tensor_parallel_params(backbone: nn.Module, config: PretrainedConfig) -> int:
    """Parameters of the Linear layers named by the `colwise`/`rowwise` entries of the config's plan."""
    plan = getattr(config, "base_model_tp_plan", None) or {}
    leaves = {
        pattern.rsplit(".", 1)[-1] for pattern, style in plan.items() if style in ("colwise", "rowwise")
    }
    return sum(
        p.numel()
        for name, module in backbone.named_modules()
        if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in leaves
        for p in module.parameters()
    )


def _eagerly_cast_params(backbone: nn.Module, output: nn.Module | None) -> int:
    """Parameters of the Linear layers that run eagerly under the compiled training pieces: every one but
    the output head and those inside a compiled module."""
    inside = {id(child) for module in backbone.modules() if compiles(module) for child in module.modules()}
    return sum(
        p.numel()
        for module in backbone.modules()
        if isinstance(module, nn.Linear) and module is not output and id(module) not in inside
        for p in module.parameters()
    )
