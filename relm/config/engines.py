"""verl's other training engines (Megatron, MindSpeed, VeOmni, TorchTitan) on relm's FSDP2 path.

verl picks its training engine with `model_engine=megatron|veomni|torchtitan` (0.9's config group; the
older `--config-name ppo_megatron_trainer`, `actor.strategy=megatron` and MindSpeed's `model_engine=mindspeed`
on Ascend) and then reads the engine's own section (`actor_rollout_ref.actor.megatron.*`, `.veomni.*`, ...).
What such a script trains -- the model, data, algorithm, batch sizes, optimizer -- is in the keys the
engines share with FSDP, which relm reads as they are. What the engine adds is mostly *how* the model is
split over GPUs: tensor, pipeline, context, expert and sequence parallelism. relm has one way to split a
model (FSDP2 shards over data-parallel ranks, `fsdp_config.fsdp_size`), so a script for another engine
trains on that path, and the layout keys it set are named in one warning line instead of one line per
section (the reference's copies of the actor's layout are interpolations and are not repeated).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from relm.errors import UserError

ENGINES = ("megatron", "mindspeed", "veomni", "torchtitan", "automodel")
"""verl's training engines other than FSDP (`dp`); each keeps its settings in a section of its name."""

FSDP_NAMES = (None, "dp", "fsdp", "fsdp2")
"""Engine and strategy names that mean relm's own path."""

ENGINE_KEYS = ("model_engine", "actor_rollout_ref.actor.model_engine")
STRATEGY_KEYS = ("actor_rollout_ref.actor.strategy", "actor_rollout_ref.ref.strategy", "critic.strategy")
_OWNERS = ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic", "reward_model")

LAYOUT_LEAVES = frozenset(
    {
        # Megatron (and MindSpeed, which takes Megatron's names)
        "tensor_model_parallel_size",
        "expert_model_parallel_size",
        "expert_tensor_parallel_size",
        "pipeline_model_parallel_size",
        "virtual_pipeline_model_parallel_size",
        "context_parallel_size",
        "sequence_parallel",
        "dynamic_context_parallel",
        "max_seqlen_per_dp_cp_rank",
        "use_distributed_optimizer",
        "use_megatron_fsdp",
        # VeOmni
        "fsdp_size",
        "ulysses_parallel_size",
        "expert_parallel_size",
        "enable_full_shard",
        # TorchTitan
        "data_parallel_size",
        "data_parallel_replicate_size",
        "data_parallel_shard_size",
        "tensor_parallel_size",
        "pipeline_parallel_size",
    }
)
"""Leaf names, inside an engine's section, that set how the model is split over GPUs."""


def _trivial(value: Any) -> bool:
    """Whether a layout value splits nothing: off, one GPU per copy, or "all ranks" for a shard size."""
    if isinstance(value, bool):
        return not value
    return value is None or value in (1, -1)


def is_layout_key(dotted: str) -> bool:
    """Whether a dotted key is a parallel-layout key of an engine section (`...megatron.context_parallel_size`)."""
    parts = dotted.split(".")
    return len(parts) >= 2 and parts[-2] in ENGINES and parts[-1] in LAYOUT_LEAVES


def engine_named(merged: DictConfig) -> str | None:
    """The non-FSDP engine the config asks for (None: verl's `dp`), from any of the keys that name one.

    Raises:
        UserError: an engine key names no engine verl has (a typo would otherwise train silently).
    """
    found = None
    for key in ENGINE_KEYS:
        value = _select(merged, key)
        if value not in FSDP_NAMES and value not in ENGINES:
            choices = ", ".join(str(name) for name in (*FSDP_NAMES[1:], *ENGINES))
            raise UserError(f"`{key}={value}`: not one of verl's engines; choose one of: {choices}")
        found = found or (value if value in ENGINES else None)
    for key in STRATEGY_KEYS:
        value = _select(merged, key)
        found = found or (value if isinstance(value, str) and value in ENGINES else None)
    return found


def without_engine_keys(ignored: dict[str, list[str]]) -> dict[str, list[str]]:
    """The ignored keys by pattern, less the engine's names and layout (its own line lists those)."""
    kept: dict[str, list[str]] = {}
    for pattern, keys in ignored.items():
        rest = [key for key in keys if key not in ENGINE_KEYS and not is_layout_key(key)]
        if rest:
            kept[pattern] = rest
    return kept


def fold_strategies(merged: DictConfig) -> list[str]:
    """Set an engine-named `strategy` (verl's engine configs write `megatron`, ...) to relm's `fsdp`, in place.

    Returns `key=value` for each key that named the engine (`model_engine` and the strategies), for its line.
    """
    named = [f"{key}={value}" for key in ENGINE_KEYS if (value := _select(merged, key)) in ENGINES]
    for key in STRATEGY_KEYS:
        value = _select(merged, key)
        if isinstance(value, str) and value in ENGINES:
            OmegaConf.update(merged, key, "fsdp", force_add=True)
            named.append(f"{key}={value}")
    return named


OVERRIDE_SECTIONS = ("actor_rollout_ref.model.override_config", "critic.model.override_config")
"""Where verl's Megatron configs nest the model's overrides as `model_config: {...}` and `moe_config: {...}`."""


def fold_override_config(merged: DictConfig) -> None:
    """Lift Megatron's `override_config.model_config.*` (the Hugging Face config's overrides, as verl's
    Megatron workers apply them) to `override_config.*`, where relm reads them, in place; drop
    `moe_config` at its off value.

    Raises:
        UserError: `moe_config.freeze_moe_router=true`, which would change what is trained.
    """
    for section in OVERRIDE_SECTIONS:
        node = _select(merged, section)
        if not isinstance(node, DictConfig):
            continue
        if "moe_config" in node:
            freeze = _select(node, "moe_config.freeze_moe_router")
            if freeze:
                raise UserError(
                    f"`{section}.moe_config.freeze_moe_router={_show(freeze)}`: freezing the MoE router is not "
                    "supported; set it to false"
                )
            del node["moe_config"]
        if "model_config" in node:
            inner = node["model_config"]
            del node["model_config"]
            lifted = OmegaConf.to_container(inner, resolve=False) if isinstance(inner, DictConfig) else {}
            assert isinstance(lifted, dict)
            for key, value in lifted.items():
                node[str(key)] = value


def layout_settings(merged: DictConfig) -> list[str]:
    """`key=value` for each layout key an engine section sets to a value that splits the model."""
    found = []
    for owner in _OWNERS:
        for engine in ENGINES:
            section = _select(merged, f"{owner}.{engine}")
            if not isinstance(section, DictConfig):
                continue
            for leaf in sorted(str(key) for key in section):
                if leaf not in LAYOUT_LEAVES or OmegaConf.is_interpolation(section, leaf):
                    continue
                value = _select(section, leaf)
                if not _trivial(value):
                    found.append(f"{owner}.{engine}.{leaf}={_show(value)}")
    return found


def engine_warning(engine: str, named_by: list[str], layout: list[str]) -> str:
    """The one line a run for another engine starts with; `named_by`: the `key=value`s that chose it."""
    unused = (
        f"parallel-layout keys not used: {', '.join(f'`{item}`' for item in layout)}"
        if layout
        else "no parallel layout set"
    )
    return (
        f"{', '.join(f'`{item}`' for item in named_by)}: relm trains on its FSDP2 path (each data-parallel rank "
        f"holds a shard, `fsdp_config.fsdp_size`), not {engine}'s; {unused}"
    )


def _select(tree: DictConfig, key: str) -> Any:
    try:
        return OmegaConf.select(tree, key, default=None, throw_on_missing=False)
    except OmegaConfBaseException:
        return None  # an interpolation that does not resolve: the build names it if relm reads the key


def _show(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
