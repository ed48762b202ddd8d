"""`~` and environment variables in path keys, expanded once for the whole config.

verl's own examples write `data.train_files=~/data/gsm8k/train.parquet` and `$HOME/...`; the shell leaves
both alone inside a `key=value` word, so relm expands them itself. Doing it here, on the built config,
means every reader (dataset, reward loader, model loader, checkpoint writer) sees a plain path and none
has to remember to expand it.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

PATH_SUFFIXES = ("path", "_files", "_dir")
"""A key is a path key when its name ends with one of these (`path`, `tokenizer_path`, `train_files`,
`default_local_dir`, `rollout_data_dir`, `resume_from_path`, ...)."""


def expand_path(value: str) -> str:
    """`~` and `$VAR` / `${VAR}` expanded; Hub ids and `zoo:` names pass through unchanged."""
    return os.path.expanduser(os.path.expandvars(value))


def _expanded(value: Any) -> Any:
    if isinstance(value, str):
        return expand_path(value)
    if isinstance(value, list):
        return [expand_path(item) if isinstance(item, str) else item for item in value]
    return value


def expand_config_paths(section: Any) -> None:
    """Expand every path key of a config section (a schema dataclass) and its subsections, in place."""
    for field in dataclasses.fields(section):
        value = getattr(section, field.name)
        if dataclasses.is_dataclass(value):
            expand_config_paths(value)
        elif field.name.endswith(PATH_SUFFIXES):
            setattr(section, field.name, _expanded(value))


def looks_like_local_path(name: str) -> bool:
    """Whether a name that exists nowhere was meant as a local path rather than a Hub id.

    A Hub id is `name` or `org/name`. Anything absolute or relative (`/`, `./`, `../`, `~`), deeper
    than one slash, or whose first part is a folder here (`models/foo` where `models/` exists) is a
    path the user mistyped: reporting it as a failed download would send them to the network.
    """
    if name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name:
        return True
    first, slash, _ = name.partition("/")
    return bool(slash) and Path(first).is_dir()
