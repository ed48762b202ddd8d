"""Hydra's `--config-path DIR --config-name NAME`: a verl-style YAML composed by Hydra itself.

A verl config file names others in a `defaults:` list (`- ppo_trainer`, `- actor@actor_rollout_ref.actor:
dp_actor`, `- _self_`) and refers to values with `${...}`. Hydra's compose API builds the tree exactly as
verl's `@hydra.main` would; relm then layers it like a `--config` file, so the schema still decides which
keys exist. A `defaults:` entry `ppo_trainer` that the folder does not hold resolves to relm's own
defaults (which are verl's for every key relm reads), so a recipe's `dapo_trainer.yaml` composes without
a verl checkout. Interpolations stay unresolved here and resolve against the final config.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import warnings
from pathlib import Path
from typing import Any

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from relm.config.schema import RelmConfig
from relm.errors import UserError

VERL_DEFAULT_NAMES = ("ppo_trainer", "_generated_ppo_trainer")
"""verl's default PPO config: relm's own defaults stand for it."""
ENGINE_CONFIG_NAMES = {
    "ppo_megatron_trainer": "megatron",
    "_generated_ppo_megatron_trainer": "megatron",
    "_generated_ppo_veomni_trainer": "veomni",
    "_generated_ppo_torchtitan_trainer": "torchtitan",
}
"""verl's PPO configs for its other engines: relm's defaults with that engine named stand for them, so the
engine's line (`relm.config.engines`) reports the layout the script sets."""


def compose_config(
    config_path: str | None, config_name: str, overrides: list[str] | None = None
) -> tuple[DictConfig | None, list[str], list[str]]:
    """The composed tree of `config_name` in `config_path` (None: relm's defaults), warnings, and the
    overrides Hydra took.

    Of `overrides` (the command line's, raw), the config-group selections go to Hydra with the config, as
    verl's `@hydra.main` would send them: `group@package=option`, `group/sub=option`, and `group=option`
    where the folder holds a `group/` folder (verl 0.9's `model_engine=megatron`). Where the folder is not
    there (verl's scripts pass `--config-path=config`, verl's package folder), a group selection is
    resolved in the installed verl's own config folder.

    Raises:
        UserError: a folder or file that is not there, a group selection with no folder to resolve it
            in, or a file Hydra cannot compose.
    """
    name = config_name.removesuffix(".yaml")
    shown = f"--config-name {config_name}" if config_path is None else f"{config_path}/{name}.yaml"
    directory = Path(config_path).expanduser() if config_path else None
    verl_name = name in VERL_DEFAULT_NAMES or name in ENGINE_CONFIG_NAMES
    if directory is None or not (directory / f"{name}.yaml").is_file():
        groups = [arg for arg in overrides or [] if _is_group_selection(arg, None)]
        package_dir = verl_config_dir()
        if verl_name and not groups:
            if name in VERL_DEFAULT_NAMES:
                return (
                    None,
                    [
                        f"`{shown}`: verl's default PPO config; relm's defaults (verl's, for every key relm reads) apply"
                    ],
                    [],
                )
            engine = ENGINE_CONFIG_NAMES[name]
            return (
                OmegaConf.create({"model_engine": engine}),
                [
                    f"`{shown}`: verl's {engine} PPO config; relm's defaults (verl's, for every key relm reads) apply"
                ],
                [],
            )
        if verl_name and package_dir is not None and (package_dir / f"{name}.yaml").is_file():
            directory = package_dir
        elif verl_name:
            raise UserError(
                f"{_listed(groups)}: a config-group selection is resolved in verl's config folder, which is "
                "not here; pass it (`--config-path .../verl/trainer/config`) or `pip install verl --no-deps`"
            )
        else:
            where = (
                "the folder is not there" if directory is None or not directory.is_dir() else "no such file"
            )
            raise UserError(f"`{shown}`: {where}; `--config-path` is relative to the current folder")
    groups = [arg for arg in overrides or [] if _is_group_selection(arg, directory)]
    stored = _store_relm_defaults(directory)
    GlobalHydra.instance().clear()
    try:
        with (
            warnings.catch_warnings(),
            initialize_config_dir(config_dir=str(directory.resolve()), version_base=None),
        ):
            # verl's recipes add `file://verl/trainer/config` (a verl checkout) to the search path; without
            # one, relm's defaults stand in for what it would hold, so its absence is no news.
            warnings.filterwarnings("ignore", message=r"provider=hydra\.searchpath .* is not available")
            composed = compose(config_name=name, overrides=groups)
    except yaml.YAMLError as err:
        raise UserError(_yaml_message(shown, err)) from err
    except (HydraException, OmegaConfBaseException, ValueError) as err:
        first = " ".join(str(err).strip().splitlines()[0].split()) if str(err).strip() else type(err).__name__
        raise UserError(f"`{shown}`: Hydra cannot compose it ({first})") from err
    finally:
        GlobalHydra.instance().clear()
        for entry in stored:
            ConfigStore.instance().repo.pop(entry, None)
    OmegaConf.set_struct(composed, False)
    return composed, [], groups


def is_group_selection(arg: str) -> bool:
    """Whether a command-line override selects a config group by its form alone (`@` or `/` in its key)."""
    return _is_group_selection(arg, None)


def _is_group_selection(arg: str, directory: Path | None) -> bool:
    key, sep, _ = arg.partition("=")
    key = key.lstrip("+~")
    if not sep or not key:
        return False
    if "@" in key or "/" in key:
        return True
    return directory is not None and "." not in key and (directory / key).is_dir()


def verl_config_dir() -> Path | None:
    """The installed verl's own config folder (`verl/trainer/config`), found without importing verl."""
    try:
        spec = importlib.util.find_spec("verl")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"
    return folder if folder.is_dir() else None


def _listed(overrides: list[str]) -> str:
    return ", ".join(f"`{override}`" for override in overrides) or "it"


def _yaml_message(shown: str, err: yaml.YAMLError) -> str:
    """One line for a file PyYAML refuses: a tag (`!!python/object:...`, `!custom`) or broken syntax.

    Hydra reads with a loader that constructs no Python objects, so a tag is refused, never run; the
    file that holds it may be one the `defaults:` list named, which the error's mark tells.
    """
    mark = getattr(err, "problem_mark", None)
    where = ""
    if mark is not None:
        name = str(getattr(mark, "name", ""))
        in_file = f" of `{name}`" if name and not name.startswith("<") else ""
        where = f" at line {mark.line + 1}{in_file}"
    tag = re.search(r"for the tag '([^']+)'", str(err))
    if tag:
        shown_tag = tag.group(1).replace("tag:yaml.org,2002:", "!!")
        return (
            f"`{shown}`: the YAML tag `{shown_tag}`{where} is not read (a config holds plain values, and "
            "relm constructs no Python objects from YAML); remove the tag"
        )
    first = " ".join(str(err).split())[:200]
    return f"`{shown}`: not readable YAML{where} ({first})"


def _store_relm_defaults(directory: Path) -> list[str]:
    """Offer relm's defaults to `defaults:` lists under verl's names the folder does not hold.

    Only those: Hydra would otherwise treat a stored config as the schema of a file of the same name.
    Returns the store entries made, for removal after composing.
    """
    node = OmegaConf.create(dataclasses.asdict(RelmConfig()))
    stored = []
    standing: dict[str, Any] = {name: node for name in VERL_DEFAULT_NAMES}
    for name, engine in ENGINE_CONFIG_NAMES.items():
        standing[name] = OmegaConf.merge(node, {"model_engine": engine})
    for name, stand_in in standing.items():
        if not (directory / f"{name}.yaml").is_file():
            ConfigStore.instance().store(name=name, node=stand_in)
            stored.append(f"{name}.yaml")
    return stored
