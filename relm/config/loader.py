"""Build a `RelmConfig` from a YAML file (or a Hydra-composed one) and verl/Hydra command-line overrides.

Layers, lowest first: the schema's defaults, the demo preset (only when no `data.train_files` nor
`data.val_files` is given anywhere), the `--config` file or the config Hydra composes from
`--config-path DIR --config-name NAME` (`relm.config.hydra_compose`) -- or, for `trainer.val_only=true`
with only a run folder (`trainer.default_local_dir=RUN`), that run's saved `RUN/config.yaml` -- the
overrides in command-line order, parsed by
Hydra's own override grammar (`+key`, `++key`, `~key` included). OmegaConf merges them and resolves
`${...}` interpolations; keys verl renamed are folded onto relm's names (`relm.config.verl_renames`);
the dataclasses are then built here by hand, not by OmegaConf's structured mode, so that every mistake
becomes one `UserError` line naming the key, with a "did you mean" for typos, instead of an OmegaConf
traceback. Last, optional parts the machine lacks (vLLM, a logger's package) are swapped or dropped
(`relm.config.fallbacks`).

Keys of verl's config that relm does not implement are accepted and reported as warnings (see
`relm.config.verl_keys`). So are keys a command line adds to `data` with Hydra's `+` (`+data.KEY=VALUE`,
which verl accepts and hands to its dataset class with the rest of `data`): they reach a `data.custom_cls`
class in its `config` (`DataConfig.plus_keys`), and with relm's own dataset one warning names them. Any other
key the schema lacks stops the run (a typo). `load_config` logs them on the "relm" logger; `load_config_with_warnings`
returns them for a caller that prints them itself.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import logging
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import OverrideType
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.base import Container
from omegaconf.errors import OmegaConfBaseException

from relm.config import engines, verl_keys, verl_renames
from relm.config.fallbacks import fall_back_on_missing_parts
from relm.config.hydra_compose import compose_config, is_group_selection
from relm.config.paths import expand_config_paths
from relm.config.schema import RelmConfig
from relm.config.validate import convert_deprecated
from relm.errors import UserError

logger = logging.getLogger("relm")

DEMO_PRESET = Path(__file__).with_name("demo.yaml")
"""Small sizes for the built-in demo task, layered under the user's values when no data is given."""

RUN_CONFIG_FILE = "config.yaml"
"""The resolved config every training start writes into its run folder (`relm.trainer.run_config`)."""


def load_config(argv: list[str]) -> RelmConfig:
    """Build the run's config from `[--config FILE.yaml] [section.key=value ...]`.

    Warnings (verl keys relm ignores, deprecated keys) go to `logging.getLogger("relm")`.

    Raises:
        UserError: unreadable file, malformed override, unknown key, wrong type, or a verl feature
            relm does not have switched on.
    """
    cfg, warnings = load_config_with_warnings(argv)
    for line in warnings:
        logger.warning(line)
    return cfg


def load_config_with_warnings(argv: list[str]) -> tuple[RelmConfig, list[str]]:
    """`load_config` that returns the warning lines instead of logging them."""
    layers, warnings = _user_layers(argv)
    merged = _merge_layers(layers)
    _drop_unset(merged, NULL_MEANS_UNSET)
    _drop_null_keys(merged, NULL_MEANS_UNSET_KEYS)
    engine = engines.engine_named(merged)
    engine_line = None
    if engine is not None:
        named_by = engines.fold_strategies(merged)
        engines.fold_override_config(merged)
        engine_line = engines.engine_warning(engine, named_by, engines.layout_settings(merged))
    renamed = verl_renames.fold(merged, [layer.values for layer in layers if layer.values is not None])
    ignored: dict[str, list[str]] = {}
    added = tuple(layer.added for layer in layers if layer.added is not None)
    walk = _Walk(root=merged, ignored=ignored, added=added)
    cfg = _build(RelmConfig, merged, "", walk)
    verl_renames.check_built(cfg, renamed)
    cfg.data.plus_keys = _nested(walk.plus_keys, "data.")
    if walk.plus_keys and cfg.data.custom_cls.path is None:
        named = ", ".join(f"`{key}`" for key in walk.plus_keys)
        warnings.append(
            f"{named}: added with `+`, not used by relm's built-in dataset (only a `data.custom_cls` dataset class "
            "reads extra `data.*` keys, in its `config`, as in verl)"
        )
    if engine_line is not None:
        # The engine's line names it and its layout once; the per-section lines keep its other keys.
        ignored = engines.without_engine_keys(ignored)
        warnings.append(engine_line)
    by_reason: dict[
        str, list[str]
    ] = {}  # one line a reason (an engine's dozens of optimizer knobs share one)
    for pattern, keys in ignored.items():
        by_reason.setdefault(verl_keys.ACCEPTED_UNUSED[pattern], []).extend(keys)
    warnings += [
        f"{', '.join(f'`{key}`' for key in keys)}: verl {'keys' if len(keys) > 1 else 'key'} "
        f"not used by relm ({reason})"
        for reason, keys in by_reason.items()
    ]
    expand_config_paths(cfg)
    warnings += _fill_derived(cfg)
    warnings += fall_back_on_missing_parts(cfg)
    return cfg, warnings


NULL_MEANS_UNSET = ("reward_model.model", "reward_model.rollout")
"""Sections verl 0.9's default config fills with `null` for "unset" where relm's schema has a default."""


NULL_MEANS_UNSET_KEYS = ("actor_rollout_ref.actor.optim.lr_warmup_steps", "critic.optim.lr_warmup_steps")
"""Keys verl 0.4-0.5's Megatron configs write as `null` for "unset" (take the warm-up ratio), relm's -1."""


def _drop_null_keys(merged: DictConfig, keys: tuple[str, ...]) -> None:
    """Remove each of `keys` that holds `null`, so relm's default stands where verl wrote `null`."""
    for key in keys:
        parent_key, _, leaf = key.rpartition(".")
        parent = OmegaConf.select(merged, parent_key, default=None, throw_on_resolution_failure=False)
        if (
            isinstance(parent, DictConfig)
            and leaf in parent
            and not OmegaConf.is_interpolation(parent, leaf)
            and parent[leaf] is None
        ):
            del parent[leaf]


def _drop_unset(merged: DictConfig, sections: tuple[str, ...]) -> None:
    """Remove the null leaves of `sections`, so relm's defaults stand where verl wrote `null`."""
    for section in sections:
        node = OmegaConf.select(merged, section, default=None, throw_on_resolution_failure=False)
        if isinstance(node, DictConfig):
            for key in [k for k, v in node.items_ex(resolve=False) if v is None]:
                del node[key]


def user_set_keys(argv: list[str]) -> set[str]:
    """Dotted keys the user's file, composed config or overrides set (not the defaults or the demo preset).

    Some sizes follow the model when the user left them alone (`relm.config.context_fit`); this tells them
    apart from a value the user chose, even one equal to the default.
    """
    keys: set[str] = set()
    for layer in _user_layers(argv)[0]:
        if layer.values is not None:
            keys.update(_dotted_leaves(OmegaConf.to_container(layer.values, resolve=False), ""))
    return keys


def _dotted_leaves(node: Any, prefix: str) -> list[str]:
    if isinstance(node, dict) and node:
        return [k for key, value in node.items() for k in _dotted_leaves(value, f"{prefix}{key}.")]
    return [prefix.rstrip(".")]


@dataclasses.dataclass(frozen=True)
class _Layer:
    """One user layer: values to merge, or (Hydra's `~key`) a key to delete; `source` names it in errors."""

    source: str
    values: DictConfig | None = None
    deleted: str | None = None
    deleted_value: Any = None
    """For `~key=value`: delete only when the key holds this value (None: whatever it holds)."""
    added: str | None = None
    """The dotted key of a `+key=value` / `++key=value` override (Hydra's "add a key"), else None."""


_CONFIG_FLAGS = {
    "--config": "config",
    "--config-path": "path",
    "-cp": "path",
    "--config-name": "name",
    "-cn": "name",
}


def _user_layers(argv: list[str]) -> tuple[list[_Layer], list[str]]:
    """The file or composed config (if any) then each override, lowest first; and warnings."""
    flags: dict[str, str] = {}
    raw: list[str] = []
    args = iter(argv)
    for arg in args:
        flag, has_value, inline = arg.partition("=")
        if flag in _CONFIG_FLAGS:
            kind = _CONFIG_FLAGS[flag]
            if kind in flags:
                raise UserError(f"`{arg}`: `{flag}` given twice; pass it once")
            value = inline if has_value else next(args, None)
            if not value:
                raise UserError(
                    f"`{flag}` needs a value: `--config FILE.yaml` or `--config-path DIR --config-name NAME`"
                )
            flags[kind] = value
        elif arg.startswith("-"):
            raise UserError(
                f"`{arg}`: unknown option; relm takes `--config FILE.yaml` (or Hydra's `--config-path DIR "
                "--config-name NAME`) and `section.key=value` overrides"
            )
        else:
            raw.append(arg)
    if "config" in flags and ("path" in flags or "name" in flags):
        raise UserError("`--config` and `--config-path`/`--config-name` both given; use one of the two")
    if "path" in flags and "name" not in flags:
        raise UserError(f"`--config-path {flags['path']}` needs `--config-name NAME` (the YAML file's name)")
    base: list[_Layer] = []
    warnings: list[str] = []
    groups = [arg for arg in raw if is_group_selection(arg)]
    if groups and "config" in flags:
        raise UserError(
            f"`{groups[0]}`: a config-group selection needs Hydra's `--config-path DIR --config-name NAME`, "
            "not `--config FILE`"
        )
    if groups and "name" not in flags:
        flags["name"] = "ppo_trainer"  # verl's main_ppo composes its default config, as here
    if "name" in flags:
        composed, warnings, taken = compose_config(flags.get("path"), flags["name"], raw)
        raw = [arg for arg in raw if arg not in taken]
        if composed is not None:
            base = [_Layer(f"--config-name {flags['name']}", values=composed)]
    overrides = [_parse_override(arg) for arg in raw]
    if "config" in flags:
        base = [_Layer(flags["config"], values=_load_file(flags["config"]))]
    elif "name" not in flags:
        saved = _evaluated_run_config(overrides)
        if saved is not None:
            base = [_Layer(str(saved), values=_load_file(str(saved)))]
            warnings = [
                f"trainer.val_only: validating the run in {saved.parent} with its settings from {saved}"
            ]
    return base + overrides, warnings


def _evaluated_run_config(overrides: list[_Layer]) -> Path | None:
    """`RUN/config.yaml` when the overrides ask to validate a run folder that has one, else None.

    `trainer.val_only=true trainer.default_local_dir=RUN` is all a verl user should need to evaluate a
    run's latest checkpoint: the model, data and sizes it trained with are in the folder already, so the
    saved config stands where a `--config` file would, under the overrides given.
    """
    merged: Container = OmegaConf.create()
    try:
        for layer in overrides:
            if layer.values is not None:
                merged = OmegaConf.merge(merged, layer.values)
        val_only = OmegaConf.select(merged, "trainer.val_only", default=False)
        run_dir = OmegaConf.select(merged, "trainer.default_local_dir", default=None)
    except (OmegaConfBaseException, TypeError, ValueError):
        # An interpolation to resolve later, or overrides that do not fit together (the full merge
        # reports those): not a plain run folder.
        return None
    if val_only is not True or not isinstance(run_dir, str):
        return None
    saved = Path(run_dir).expanduser() / RUN_CONFIG_FILE
    return saved if saved.is_file() else None


_PARSER = OverridesParser.create()
_HOME_PATHS = re.compile(r"(^|[\[,]\s*)(~[^,\]\s]*)")
"""A `~/...` path as a whole value or as a list item (what Hydra's grammar refuses unquoted)."""


def _parse_override(arg: str) -> _Layer:
    """One command-line override in Hydra's grammar: `key=value`, `+key=value`, `++key=value`, `~key`.

    Hydra's `+` (add a key) and `++` (add or override) are both assignments here: relm's schema, not a
    default file, decides which keys exist. The layer remembers the key a `+` added: under `data` verl
    accepts any such key and hands it to the dataset class, so relm does too (`_accept_unimplemented`).
    """
    key, sep, value = arg.partition("=")
    if not sep and not arg.startswith("~"):
        raise UserError(f"`{arg}`: an override must look like `section.key=value` (no `=` found)")
    bare = key.lstrip("+~")
    if not bare or any(not part for part in bare.split(".")):
        raise UserError(f"`{arg}`: malformed key `{bare}`; use dotted names like `data.train_batch_size=64`")
    try:
        override = _PARSER.parse_override(arg)
    except HydraException as err:
        if "~" in value and "'" not in value:
            # Home-relative paths, which Hydra's grammar only takes quoted (alone or in a list); relm
            # expands `~` in paths.
            quoted = _HOME_PATHS.sub(lambda m: f"{m[1]}'{m[2]}'", value)
            if quoted != value:
                return _parse_override(f"{key}={quoted}")
        raise UserError(f"`{arg}`: cannot parse the value ({_one_line(err)})") from err
    if override.is_sweep_override():
        raise UserError(f"`{arg}`: a sweep (several values) needs Hydra's --multirun; relm runs one value")
    if override.type == OverrideType.DEL:
        return _Layer(arg, deleted=override.key_or_group, deleted_value=override.value() if sep else None)
    layer = OmegaConf.create()
    try:
        OmegaConf.update(layer, override.key_or_group, override.value(), merge=True, force_add=True)
    except (OmegaConfBaseException, ValueError) as err:
        raise UserError(f"`{arg}`: cannot parse the value ({_one_line(err)})") from err
    adds = override.type in (OverrideType.ADD, OverrideType.FORCE_ADD)
    return _Layer(arg, values=layer, added=override.key_or_group if adds else None)


def _load_file(path: str) -> DictConfig:
    file = Path(path).expanduser()
    if not file.is_file():
        raise UserError(f"`{path}`: config file not found")
    try:
        loaded = OmegaConf.load(file)
    except (OmegaConfBaseException, yaml.YAMLError, UnicodeDecodeError) as err:
        raise UserError(f"`{path}`: not a readable YAML config ({_one_line(err)})") from err
    if not isinstance(loaded, DictConfig):
        raise UserError(f"`{path}`: the top level must be a mapping of sections (`data:`, `trainer:`, ...)")
    return loaded


_ABSENT = object()


def _merge_layers(layers: list[_Layer]) -> DictConfig:
    """Defaults, then the demo preset when no layer names data, then the user's layers.

    Naming only `data.val_files` (validating a model on one's own prompts) is naming data: the demo's
    small sizes would otherwise replace the user's defaults under their prompts."""
    merged: Container  # OmegaConf.merge's type: any config node (a DictConfig here, checked at the end)
    files: dict[str, Any] = {"data.train_files": None, "data.val_files": None}
    for layer in layers:
        for key in files:
            if layer.deleted == key:
                files[key] = None
            elif layer.values is not None:
                value = OmegaConf.select(
                    layer.values, key, default=_ABSENT, throw_on_resolution_failure=False
                )
                if value is not _ABSENT:
                    files[key] = value  # a later `data.train_files=null` unsets an earlier value
    merged = OmegaConf.create(dataclasses.asdict(RelmConfig()))
    if all(value is None for value in files.values()):
        merged = OmegaConf.merge(merged, OmegaConf.load(DEMO_PRESET))
    for layer in layers:
        if layer.deleted is not None:
            _delete(merged, layer)
            continue
        try:
            merged = OmegaConf.merge(merged, layer.values)
        except (OmegaConfBaseException, TypeError, ValueError) as err:
            raise UserError(
                f"`{layer.source}`: does not fit the config's shape ({_one_line(err)}); a section takes keys, "
                "a key takes a value"
            ) from err
    assert isinstance(merged, DictConfig)
    if files["data.train_files"] is not None and not any(
        _sets(layer, "trainer.experiment_name") for layer in layers
    ):
        # Before `${...}` resolves, so `default_local_dir` (and any key naming the experiment) follows.
        merged.trainer.experiment_name = experiment_name_for(
            OmegaConf.select(merged, "data.train_files", default=None, throw_on_resolution_failure=False),
            OmegaConf.select(
                merged, "actor_rollout_ref.model.path", default="", throw_on_resolution_failure=False
            ),
        )
    return merged


def _sets(layer: _Layer, key: str) -> bool:
    """Whether a user layer gives `key` a value (`~key` does not: the default applies again)."""
    if layer.values is None:
        return False
    node: Any = OmegaConf.to_container(layer.values, resolve=False)  # `${...}` may not resolve in one layer
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


GENERIC_DATA_NAMES = {"train", "training", "test", "val", "validation", "data", "dataset"}
"""File stems that say nothing about the data: the folder's name says it instead (`gsm8k/train.parquet`)."""


def experiment_name_for(train_files: Any, model_path: Any) -> str:
    """`DATA-MODEL` from the first training file and the model, e.g. `gsm8k-tiny-qwen2.5`.

    A run that leaves `trainer.experiment_name` unset gets this, and so its own default run folder
    (`checkpoints/relm/gsm8k-tiny-qwen2.5`) rather than the demo's name shared by every run.
    """
    first = train_files[0] if isinstance(train_files, list | tuple) and train_files else train_files
    data = Path(str(first or "data"))
    data_name = (
        data.parent.name if data.stem.lower() in GENERIC_DATA_NAMES and data.parent.name else data.stem
    )
    model_name = str(model_path or "model").rstrip("/").replace("zoo:", "").split("/")[-1]
    name = f"{data_name}-{model_name}"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._-") or "run"


def _delete(tree: Container, layer: _Layer) -> None:
    """Hydra's `~key` / `~key=value`: the key goes, so the schema's default applies again."""
    assert layer.deleted is not None
    parent_key, _, leaf = layer.deleted.rpartition(".")
    parent = OmegaConf.select(tree, parent_key, throw_on_resolution_failure=False) if parent_key else tree
    if not isinstance(parent, DictConfig) or leaf not in parent:
        raise UserError(f"`{layer.source}`: there is no key `{layer.deleted}` to delete")
    if layer.deleted_value is not None:
        current = OmegaConf.select(tree, layer.deleted, throw_on_resolution_failure=False)
        if current != layer.deleted_value:
            raise UserError(
                f"`{layer.source}`: `{layer.deleted}` is {current!r}, not {layer.deleted_value!r}"
            )
    del parent[leaf]


@dataclasses.dataclass
class _Walk:
    """State shared while building: the merged tree (for lookups) and ignored verl keys by pattern."""

    root: DictConfig
    ignored: dict[str, list[str]]
    added: tuple[str, ...] = ()
    """Dotted keys the command line added with `+` / `++`."""
    plus_keys: dict[str, Any] = dataclasses.field(default_factory=dict)
    """`data.*` leaves the schema and verl's known keys lack that a `+` added, with their values."""


def _build(cls: type, node: DictConfig, prefix: str, walk: _Walk) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for raw_key in node:
        key = str(raw_key)
        dotted = prefix + key
        if key == verl_keys.HYDRA_TARGET_KEY:
            continue
        if key not in hints:
            _accept_unimplemented(node, key, dotted, walk)
        elif dataclasses.is_dataclass(hints[key]):
            section = _value(node, key, dotted, to_container=False)
            if not isinstance(section, DictConfig):
                example = dataclasses.fields(hints[key])[0].name
                raise UserError(
                    f"`{dotted}` is a section, not a value; set its keys, e.g. `{dotted}.{example}=...`"
                )
            kwargs[key] = _build(hints[key], section, dotted + ".", walk)
        else:
            kwargs[key] = _coerce(dotted, _value(node, key, dotted), hints[key])
    return cls(**kwargs)


def _value(node: DictConfig, key: str, dotted: str, to_container: bool = True) -> Any:
    # A `???` placeholder never reaches here as such: merging it keeps the default beneath it, and an
    # interpolation that points at one fails below.
    try:
        value = node[key]
        if to_container and OmegaConf.is_config(value):
            value = OmegaConf.to_container(value, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as err:
        raise UserError(f"`{dotted}`: cannot resolve its value ({_one_line(err)})") from err
    return value


def _accept_unimplemented(node: DictConfig, key: str, dotted: str, walk: _Walk) -> None:
    """Record every leaf under a key the schema lacks, or fail on the first that verl does not have."""
    for leaf in _leaf_keys(node, key, dotted):
        pattern = verl_keys.match_accepted(leaf)
        if pattern is None and _plus_data_key(leaf, walk.added):
            walk.plus_keys[leaf] = _select(walk.root, leaf)
            continue
        if pattern is None:
            raise _unknown_key(leaf)
        walk.ignored.setdefault(pattern, []).append(leaf)
        reason = verl_keys.UNSUPPORTED_WHEN_ENABLED.get(leaf)
        if reason is None:
            continue
        value = OmegaConf.select(walk.root, leaf, throw_on_resolution_failure=False, throw_on_missing=False)
        if not verl_keys.is_off(leaf, value):
            raise UserError(f"`{leaf}={value}`: {reason}")


def _plus_data_key(leaf: str, added: tuple[str, ...]) -> bool:
    """Whether `leaf` lies under `data` and a `+` override added it (or a section above it)."""
    return leaf.startswith("data.") and any(leaf == key or leaf.startswith(key + ".") for key in added)


def _select(root: DictConfig, dotted: str) -> Any:
    """The resolved value at `dotted` (a plain container where it is a section)."""
    try:
        value = OmegaConf.select(root, dotted, throw_on_missing=True)
        return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    except OmegaConfBaseException as err:
        raise UserError(f"`{dotted}`: cannot resolve its value ({_one_line(err)})") from err


def _nested(leaves: dict[str, Any], prefix: str) -> dict[str, Any]:
    """`{"data.a.b": 1}` -> `{"a": {"b": 1}}` (with `prefix` "data." taken off)."""
    tree: dict[str, Any] = {}
    for dotted, value in leaves.items():
        *parents, leaf = dotted.removeprefix(prefix).split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def _leaf_keys(node: DictConfig, key: str, dotted: str) -> Iterator[str]:
    # Interpolations and `???` count as leaves: looking inside would resolve them, and an ignored
    # key must never fail the run over a value relm does not read.
    plain = not (OmegaConf.is_missing(node, key) or OmegaConf.is_interpolation(node, key))
    child = node[key] if plain else None
    if isinstance(child, DictConfig) and len(child) > 0:
        for child_key in child:
            if child_key == verl_keys.HYDRA_TARGET_KEY:
                continue
            yield from _leaf_keys(child, str(child_key), f"{dotted}.{child_key!s}")
    else:
        yield dotted


def _unknown_key(dotted: str) -> UserError:
    close = difflib.get_close_matches(dotted, _known_key_names(), n=1, cutoff=0.6)
    hint = f"did you mean `{close[0]}`?" if close else "docs/configuration.md lists the keys relm reads"
    return UserError(f"unknown key `{dotted}`; {hint}")


@functools.cache
def _known_key_names() -> list[str]:
    return _schema_keys(RelmConfig, "") + verl_keys.accepted_key_names()


def _schema_keys(cls: type, prefix: str) -> list[str]:
    keys: list[str] = []
    for name, hint in typing.get_type_hints(cls).items():
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            keys += _schema_keys(hint, f"{prefix}{name}.")
        else:
            keys.append(prefix + name)
    return keys


def _coerce(dotted: str, value: Any, hint: Any) -> Any:
    """Check one value against its field's type, converting only where no meaning can be lost."""
    nullable = False
    choices = [hint]
    if isinstance(hint, types.UnionType):
        nullable = type(None) in typing.get_args(hint)
        # `float | str` (verl's thresholds: a number or a "lower_upper" text): the first that fits wins.
        choices = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    if value is None:
        if nullable:
            return None
        raise _type_error(dotted, value, choices, nullable)
    for choice in choices:
        converted = _convert(value, choice)
        if converted is not _INVALID:
            return converted
    raise _type_error(dotted, value, choices, nullable)


_INVALID = object()


def _convert(value: Any, hint: Any) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if hint is bool:
        return value if isinstance(value, bool) else _INVALID
    if hint is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _INVALID
    if hint is float:
        return float(value) if is_number else _INVALID
    if hint is str:
        # An unquoted `experiment_name=123` parses as an int; the user meant the text.
        return str(value) if isinstance(value, str) or (is_number and isinstance(value, int)) else _INVALID
    if origin is list:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            return _INVALID
        converted = [_convert(item, args[0]) for item in items]
        return _INVALID if any(item is _INVALID for item in converted) else converted
    if origin is dict:
        return dict(value) if isinstance(value, dict) else _INVALID
    if origin is tuple:
        if not isinstance(value, list | tuple) or len(value) != len(args):
            return _INVALID
        converted = [_convert(item, arg) for item, arg in zip(value, args, strict=True)]
        return _INVALID if any(item is _INVALID for item in converted) else tuple(converted)
    raise TypeError(f"schema type {hint!r} has no converter")  # a schema change the loader must learn


def _type_error(dotted: str, value: Any, hints: list[Any], nullable: bool) -> UserError:
    expected = " or ".join(_describe(hint) for hint in hints) + (" or null" if nullable else "")
    return UserError(f"`{dotted}` must be {expected}, got {_show(value)}")


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    simple = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    if hint in simple:
        return simple[hint]
    if origin is list:
        return f"a list of {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s (or a single one)"
    if origin is dict:
        return "a mapping (`{key: value}`)"
    if origin is tuple:
        return f"a list of {len(args)} {_describe(args[0]).removeprefix('a ')}s"
    return str(hint)


def _show(value: Any) -> str:
    kinds = {type(None): "null", bool: "a boolean", int: "an integer", float: "a float", str: "a string"}
    kind = kinds.get(type(value), "a list" if isinstance(value, list | tuple) else "a mapping")
    if isinstance(value, tuple):  # a list merged over a tuple default comes back as a tuple
        value = list(value)
    shown = "null" if value is None else str(value).lower() if isinstance(value, bool) else repr(value)
    return f"{shown} ({kind})"


def _one_line(err: BaseException) -> str:
    if isinstance(err, yaml.MarkedYAMLError) and err.problem_mark is not None:
        mark = err.problem_mark
        return f"{err.problem} at line {mark.line + 1}, column {mark.column + 1}"
    # OmegaConf appends `full_key:`/`object_type=` lines; the first line carries the meaning.
    return " ".join(str(err).strip().splitlines()[0].split()) or type(err).__name__


def _fill_derived(cfg: RelmConfig) -> list[str]:
    """Fill keys whose documented default is another key's value; returns deprecation warnings.

    Done once here so that every consumer reads plain values and none re-implements a fallback. The
    defaults that are no key's value (16 responses per micro-batch when the actor's size is unset, the
    logprob temperature, the step count from the epochs) are resolved once, into frozen records, by
    `relm.trainer.components.compute_sizes`.
    """
    warnings = convert_deprecated(cfg)
    data, actor = cfg.data, cfg.actor_rollout_ref.actor
    rollout, ref, critic = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.ref, cfg.critic
    if rollout.prompt_length is None:
        rollout.prompt_length = data.max_prompt_length
    if rollout.response_length is None:
        rollout.response_length = data.max_response_length
    if actor.clip_ratio_low is None:
        actor.clip_ratio_low = actor.clip_ratio
    if actor.clip_ratio_high is None:
        actor.clip_ratio_high = actor.clip_ratio
    if critic.ppo_mini_batch_size is None:
        critic.ppo_mini_batch_size = actor.ppo_mini_batch_size
    if critic.ppo_micro_batch_size_per_gpu is None:
        critic.ppo_micro_batch_size_per_gpu = actor.ppo_micro_batch_size_per_gpu
    if critic.forward_micro_batch_size_per_gpu is None:
        critic.forward_micro_batch_size_per_gpu = critic.ppo_micro_batch_size_per_gpu
    if critic.ppo_epochs is None:
        critic.ppo_epochs = actor.ppo_epochs
    if critic.use_dynamic_bsz is None:
        critic.use_dynamic_bsz = actor.use_dynamic_bsz
    if critic.shuffle is None:
        critic.shuffle = actor.shuffle
    if critic.loss_agg_mode is None:
        critic.loss_agg_mode = actor.loss_agg_mode
    for log_prob in (ref, rollout):
        if log_prob.log_prob_micro_batch_size_per_gpu is None:
            log_prob.log_prob_micro_batch_size_per_gpu = actor.ppo_micro_batch_size_per_gpu
    if rollout.max_model_len is None:
        rollout.max_model_len = data.max_prompt_length + data.max_response_length
    for optim in (actor.optim, critic.optim):
        if optim.min_lr_ratio is None:  # verl writes null for "no floor"
            optim.min_lr_ratio = 0.0
    if data.seed is None:
        data.seed = cfg.seed
    return warnings
