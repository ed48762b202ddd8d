"""LoRA adapters on a trained model, through transformers' PEFT integration.

`add_lora` injects PEFT's LoRA layers into the model in place (`PreTrainedModel.add_adapter`), so the
module keeps its class and its forward: the trainer's packed forward, the engines and the memory plan
see the same model with a few small trainable matrices and a frozen base. Three things follow from
keeping the base frozen, and each lives here:

- the reference policy is the same module with its adapters switched off (`adapters_disabled`), so a
  LoRA run holds no second copy of the base;
- an engine with its own copy of the weights (bf16 on a GPU) is built without adapter layers
  (`without_adapters`) and receives, at each sync, only the weights LoRA changes, merged:
  `W + scaling * B @ A` (`merged_weights`);
- that sync is checked (`check_synced`): the failure users of other frameworks meet most is an adapter
  that never reaches the engine, which then keeps sampling the initial policy while training "runs".
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from relm.config.specs import LoraSpec
from relm.errors import UserError
from relm.models.precision import copy_in_dtype

ADAPTER = "default"
"""PEFT's adapter name; relm trains one adapter per model."""
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


class AdapterNotSynced(RuntimeError):
    """The engine's weights did not take the adapter after a sync."""


@dataclass(frozen=True)
class LoraSettings:
    """verl's LoRA keys of one model (`actor_rollout_ref.model.*` or `critic.model.*`)."""

    rank: int
    """`lora_rank`: 0 trains every weight (no LoRA)."""
    alpha: float
    """`lora_alpha`: the update is scaled by alpha / rank."""
    target_modules: str | list[str] = "all-linear"
    """Which Linear layers get adapters: `all-linear` (every one but the output head) or names."""
    exclude_modules: str | list[str] | None = None
    """Names (or a regex) of layers kept without adapters."""
    adapter_path: str | None = None
    """A saved PEFT adapter folder to start from instead of a fresh adapter."""


def lora_settings(spec: LoraSpec) -> LoraSettings | None:
    """A trained model's LoRA spec as peft's settings, or None at rank 0."""
    if not spec.rank:
        return None
    target = list(spec.target_modules)
    return LoraSettings(
        rank=spec.rank,
        alpha=spec.alpha,
        target_modules="all-linear" if target == ["all-linear"] else target,
        exclude_modules=None if spec.exclude_modules is None else list(spec.exclude_modules),
        adapter_path=spec.adapter_path,
    )


def add_lora(model: Any, settings: LoraSettings) -> int:
    """Freeze `model` and give its target layers trainable LoRA adapters (or load saved ones).

    `model` is a transformers `PreTrainedModel` (for the critic: its backbone, whose value head stays
    fully trained). Fresh adapters start with B = 0, so the model computes exactly what it did.

    Returns:
        The number of trainable adapter parameters.
    """
    from peft import LoraConfig  # peft is needed only when LoRA is on

    if settings.adapter_path:
        # The saved adapter's own config (rank, targets), then its weights by name. Not `load_adapter`:
        # it records key renamings on the model that a later `save_pretrained` of the merged model would
        # replay onto the plain weights' names.
        config = LoraConfig.from_pretrained(settings.adapter_path)
        config.inference_mode = False
        model.add_adapter(config, adapter_name=ADAPTER)
        load_adapter_weights(model, settings.adapter_path)
    else:
        target = settings.target_modules
        model.add_adapter(
            LoraConfig(
                r=settings.rank,
                lora_alpha=settings.alpha,  # type: ignore[arg-type]  # peft types it int; it takes a float
                target_modules=target if isinstance(target, str) else list(target),
                exclude_modules=settings.exclude_modules,
                lora_dropout=0.0,
            ),
            adapter_name=ADAPTER,
        )
    for name, param in model.named_parameters():
        param.requires_grad_(".lora_" in name)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def has_lora(model: nn.Module) -> bool:
    """Whether `model` holds LoRA layers."""
    return next(lora_layers(model), None) is not None


def lora_layers(model: nn.Module) -> Iterator[tuple[str, Any]]:
    """(name of the adapted layer, the PEFT LoRA layer) for each adapted layer, in module order."""
    from peft.tuners.lora import LoraLayer

    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            yield name, module


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """The frozen base model, for the reference policy's forward: adapters off inside the block."""
    layers = [layer for _, layer in lora_layers(model)]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for layer in layers:
            layer.enable_adapters(True)


@torch.no_grad()
def merged_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """`(name, W + scaling * B @ A)` of each adapted layer, under the name the plain model uses.

    These are the only weights LoRA changes, so they are all an engine with its own copy needs. The sum
    is formed in fp32 (the base may be bf16) and handed over for the engine to cast.
    """
    for name, layer in lora_layers(model):
        yield f"{name}.weight", _merged(layer)


def _merged(layer: Any) -> torch.Tensor:
    """A PEFT LoRA layer's weight with its adapter merged in, in fp32 (the base may be bf16)."""
    return layer.get_base_layer().weight.float() + layer.get_delta_weight(ADAPTER).float()


def without_adapters(model: nn.Module, dtype: torch.dtype | None = None) -> Any:
    """A frozen copy of `model` in `dtype` (None: the model's own), every adapter merged into its layer
    and the adapter layers removed.

    The engine's own copy (bf16 on a GPU) is this: a plain transformers model the native engine's fused
    projections and kernels handle as any other, with parameter names `merged_weights` refreshes. It is
    made tensor by tensor in `dtype` (`copy_in_dtype`), each adapted weight merged in fp32 one layer at a
    time and cast, so building it never holds a second full-precision copy of the model.
    """
    # A weight tied to another module's (an adapted output head tied to the input embedding) is not
    # merged in place, or the copy's embedding would take the adapter too: the copy's head gets its own.
    tied = _tied_weight_ids(model)
    merged = {
        id(weight): functools.partial(_merged, layer)
        for _, layer in lora_layers(model)
        if id(weight := layer.get_base_layer().weight) not in tied
    }
    plain: Any = copy_in_dtype(model, dtype, replaced=merged)
    for (_, layer), (name, copied) in zip(list(lora_layers(model)), list(lora_layers(plain)), strict=True):
        base = copied.get_base_layer()
        if id(layer.get_base_layer().weight) in tied:
            with torch.no_grad():
                own = _merged(layer).to(dtype or base.weight.dtype)
            base.weight = nn.Parameter(own, requires_grad=False)
            plain.config.tie_word_embeddings = False  # saved as two tensors, and nothing re-ties them
        parent_name, _, child = name.rpartition(".")
        setattr(plain.get_submodule(parent_name) if parent_name else plain, child, base)
    # transformers remembers that adapters were added; the copy has none left.
    if hasattr(plain, "_hf_peft_config_loaded"):
        plain._hf_peft_config_loaded = False
    if hasattr(plain, "peft_config"):
        del plain.peft_config
    return plain


def _tied_weight_ids(model: nn.Module) -> set[int]:
    """Ids of the parameters that more than one module holds (a tied embedding and output head)."""
    seen: set[int] = set()
    tied: set[int] = set()
    for _, param in model.named_parameters(remove_duplicate=False):
        (tied if id(param) in seen else seen).add(id(param))
    return tied


def probe_name(model: nn.Module) -> str | None:
    """The weight `check_synced` reads back: the last adapted layer's (the one furthest from the input,
    so a sync that stops part-way is caught too)."""
    last = None
    for name, _ in lora_layers(model):
        last = name
    return None if last is None else f"{last}.weight"


@torch.no_grad()
def check_synced(model: nn.Module, engine_model: nn.Module, name: str) -> None:
    """Raise `AdapterNotSynced` unless the engine's copy of `name` equals the merged weight.

    The engine holds the merged weight cast to its own dtype (`sync_weights` copies into it), so after a
    good sync the two are equal bit for bit; any other value means the adapter did not arrive.
    """
    layer_name = name.removesuffix(".weight")
    layer: Any = model.get_submodule(layer_name)  # a PEFT LoRA layer
    expected = _merged(layer)
    held = engine_model.get_parameter(name)
    if not torch.equal(held, expected.to(device=held.device, dtype=held.dtype)):
        diff = (held.float() - expected.to(held.device)).abs().max().item()
        raise AdapterNotSynced(
            f"the rollout engine's `{name}` is not the actor's merged LoRA weight after the weight sync "
            f"(max difference {diff:.3g}): the engine would keep sampling the old policy"
        )


def load_adapter_weights(model: nn.Module, folder: str | Path) -> None:
    """Load a saved adapter (`adapter_model.safetensors`, PEFT's names) into `model`'s existing adapters.

    Raises:
        UserError: the folder's adapter does not fit the model's (other rank, targets or model).
    """
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    tensors = load_file(str(Path(folder) / ADAPTER_WEIGHTS))
    _check_saved_base_layers(model, tensors, folder)
    tensors = {name: tensor for name, tensor in tensors.items() if ".lora_" in name}
    own = {name for name, _ in model.named_parameters() if ".lora_" in name}
    try:
        result = set_peft_model_state_dict(model, tensors, adapter_name=ADAPTER)
    except RuntimeError as exc:  # a shape mismatch: another rank or model
        raise UserError(
            f"`{folder}`: its LoRA adapter does not fit this model ({' '.join(str(exc).split())[:200]}); "
            "use the lora_rank and target_modules it was trained with, or set trainer.resume_mode=disable"
        ) from exc
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected or len(tensors) != len(own):
        raise UserError(
            f"`{folder}`: its LoRA adapter has {len(tensors)} tensors, this model's {len(own)} "
            f"(first unexpected: {unexpected[:1]}); use the lora_rank and target_modules it was trained with"
        )


def _check_saved_base_layers(model: nn.Module, tensors: dict[str, torch.Tensor], folder: str | Path) -> None:
    """Check the frozen base weights PEFT saves beside an adapter against the model's.

    PEFT saves the base weight of an adapted embedding-like layer too (`save_embedding_layers="auto"`:
    an output head tied to the input embedding, as in docs/lora.md's demo recipe, is saved as
    `lm_head.base_layer.weight`). The base is frozen, so that copy is the base model's own weight and loads
    nothing; it is not an adapter tensor either (counting it made the recipe's export and resume fail with
    "31 tensors, this model's 30"). A copy that differs means the adapter was trained on another base.

    Raises:
        UserError: a saved base weight differs from the model's (another base model).
    """
    own = dict(model.named_parameters())
    for name, saved in tensors.items():
        if ".base_layer." not in name:
            continue
        local = name.removeprefix("base_model.model.")
        held = own.get(local)
        if held is not None and not torch.equal(held.detach().cpu().to(saved.dtype), saved):
            raise UserError(
                f"`{folder}`: its LoRA adapter was trained on another base model (its saved `{local}` differs "
                "from this model's); load it onto the model it was trained from (relm export: --base)"
            )


def is_adapter_folder(folder: str | Path) -> bool:
    """A PEFT adapter folder (what a LoRA run's checkpoint and `relm export` write for the model)."""
    return (Path(folder) / ADAPTER_CONFIG).is_file()
