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


def load_custom_reward(path: str, name: str = "compute_score") -> ComputeScore:
    """Import `name` from the Python file at `path`.

    The file's folder is on `sys.path` while it is imported, so it can import its sibling modules.

    Raises:
        UserError: The file is missing, fails to import, lacks the function, or the function
            cannot take verl's four keyword arguments.
    """
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
    try:
        inspect.signature(function).bind(**_ARGUMENTS)
    except TypeError as exc:
        raise UserError(
            f"custom_reward_function.name: {name}{inspect.signature(function)} in '{path}' cannot be called as "
            f"{name}(data_source=, solution_str=, ground_truth=, extra_info=); add those parameters "
            "(or **kwargs)"
        ) from exc
    except ValueError:
        pass  # builtins without an inspectable signature: trust them
    return function


def resolve_compute_score(path: str | None, name: str = "compute_score") -> ComputeScore:
    """The user's function when `custom_reward_function.path` is set, else the built-in dispatch."""
    return load_custom_reward(path, name) if path else default_compute_score
