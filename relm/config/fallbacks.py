"""Optional parts a verl script names that this machine lacks: run without them, saying so once.

Nearly every verl script asks for `rollout.name=vllm` (or `sglang`) and a `wandb` logger. Stopping
there would make the first run of a copied script fail on something that does not change what is
trained; silently swapping would hide it. So the run goes on with relm's native engine, or without
that logger, and one warning line says what was replaced and how to get the original.
"""

from __future__ import annotations

import importlib.util

from relm.config.schema import RelmConfig
from relm.config.validate import LOGGERS_NOT_YET

ENGINES_NOT_PROVIDED = ("sglang",)
"""verl rollout engines relm has no counterpart for: they always fall back."""
LOGGER_MODULES = {"wandb": "wandb", "tensorboard": "tensorboard"}
"""Loggers relm provides through a package it does not depend on: logger name -> module."""
_VLLM_INSTALL = "`make setup-vllm` or `pip install -e .[vllm]`"


def is_installed(module: str) -> bool:
    """Whether `module` can be imported, without importing it (vLLM's import alone takes seconds)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: a module set to None in sys.modules (tests do this)
        return False


def fall_back_on_missing_parts(cfg: RelmConfig) -> list[str]:
    """Swap an engine that is not here for the native one and drop loggers that are not here (in place).

    Returns one warning line per part replaced.
    """
    warnings = []
    rollout = cfg.actor_rollout_ref.rollout
    key = f"`actor_rollout_ref.rollout.name={rollout.name}`"
    if rollout.name in ENGINES_NOT_PROVIDED:
        warnings.append(f"{key}: relm has no {rollout.name} engine; generating with relm's native engine")
        rollout.name = "native"
    elif rollout.name == "vllm" and not is_installed("vllm"):
        warnings.append(
            f"{key}: vLLM is not installed; generating with relm's native engine ({_VLLM_INSTALL} for vLLM)"
        )
        rollout.name = "native"
    kept = []
    for name in cfg.trainer.logger:
        if name in LOGGERS_NOT_YET:
            warnings.append(
                f"`trainer.logger` names `{name}`, which relm does not provide yet; not logging there"
            )
        elif name in LOGGER_MODULES and not is_installed(LOGGER_MODULES[name]):
            warnings.append(
                f"`trainer.logger` names `{name}` but the `{LOGGER_MODULES[name]}` package is not installed; "
                f"not logging there (`pip install {LOGGER_MODULES[name]}` to log there)"
            )
        else:
            kept.append(name)
    cfg.trainer.logger = kept
    return warnings
