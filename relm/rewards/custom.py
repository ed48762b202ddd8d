"""Loading a user's scoring function from a Python file (`custom_reward_function.*`).

The function has verl's signature, `compute_score(data_source, solution_str, ground_truth,
extra_info) -> float | dict`, and is called with those keyword arguments, so files written for
verl work unchanged. Every way the file can be unusable is reported when it is loaded, before any
model is built.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from relm.errors import UserError
from relm.rewards.registry import default_compute_score

ComputeScore = Callable[..., "float | dict[str, Any]"]

_ARGUMENTS: dict[str, Any] = {"data_source": "", "solution_str": "", "ground_truth": None, "extra_info": {}}
_BATCH_ARGUMENTS: dict[str, Any] = {
    "data_sources": [],
    "solution_strs": [],
    "ground_truths": [],
    "extra_infos": [],
}
PKG_PREFIX = "pkg://"
"""verl's spelling of a module path (`pkg://relm.rewards.library`) where a file path is expected."""


def load_custom_reward(path: str, name: str = "compute_score", batched: bool = False) -> ComputeScore:
    """Import `name` from the Python file at `path`, or from the module `pkg://package.module`.

    The file's folder is on `sys.path` while it is imported, so it can import its sibling modules.
    `batched` functions (verl's `batch` reward manager) take the plural names, `data_sources`,
    `solution_strs`, `ground_truths`, `extra_infos`, and return a list.

    Raises:
        UserError: The file is missing, fails to import, lacks the function, or the function
            cannot take verl's four keyword arguments.
    """
    if path.startswith(PKG_PREFIX):
        module_name = path[len(PKG_PREFIX) :].replace("/", ".")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise UserError(
                f"custom_reward_function.path: cannot import module '{module_name}' ({exc}); check the name "
                "after pkg://"
            ) from exc
        return _function_of(module, path, name, batched)
    file = Path(path)
    if not file.is_file():
        raise UserError(f"custom_reward_function.path: file '{path}' does not exist; check the path")
    module_name = "relm_custom_reward_" + hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise UserError(f"custom_reward_function.path: '{path}' is not a Python file; give a .py file")
    module = importlib.util.module_from_spec(spec)
    folder = str(file.resolve().parent)
    sys.path.insert(0, folder)
    sys.modules[module_name] = module  # dataclasses and pickling inside the file look the module up
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        sys.modules.pop(module_name, None)
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        raise UserError(
            f"custom_reward_function.path: importing '{path}' raised {reason}; fix the file"
        ) from exc
    finally:
        if folder in sys.path:
            sys.path.remove(folder)
    return _function_of(module, path, name, batched)


def _function_of(module: Any, path: str, name: str, batched: bool) -> ComputeScore:
    """The module's function `name`, checked to take verl's keyword arguments."""
    function = getattr(module, name, None)
    if not callable(function):
        found = sorted(
            attr
            for attr, value in vars(module).items()
            if inspect.isfunction(value) and not attr.startswith("_")
        )
        raise UserError(
            f"custom_reward_function.name: '{path}' defines no function '{name}' (functions: "
            f"{', '.join(found) or 'none'}); set custom_reward_function.name to one of them"
        )
    arguments = _BATCH_ARGUMENTS if batched else _ARGUMENTS
    try:
        inspect.signature(function).bind(**arguments)
    except TypeError as exc:
        manager = " (reward_model.reward_manager=batch)" if batched else ""
        raise UserError(
            f"custom_reward_function.name: {name}{inspect.signature(function)} in '{path}' cannot be called as "
            f"{name}({'=, '.join(arguments)}=){manager}; add those parameters (or **kwargs)"
        ) from exc
    except ValueError:
        pass  # builtins without an inspectable signature: trust them
    return function


def resolve_compute_score(
    path: str | None, name: str = "compute_score", batched: bool = False
) -> ComputeScore:
    """The user's function when `custom_reward_function.path` is set, else the built-in dispatch.

    Raises:
        UserError: `batched` without a function of the user's (the built-in dispatch scores one
            response at a time).
    """
    if path:
        return load_custom_reward(path, name, batched)
    if batched:
        raise UserError(
            "`reward_model.reward_manager=batch` calls a batched compute_score(data_sources, solution_strs, "
            "ground_truths, extra_infos); set custom_reward_function.path to a file defining one, or use naive"
        )
    return default_compute_score
