"""Scoring responses: rule scorers by data_source, user functions, the reward manager and its workers.

The names below are loaded on first use: a reward worker imports modules of this package and must not
pay for torch and transformers, which the manager needs.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "RewardManager": "relm.rewards.manager",
    "RewardResult": "relm.rewards.manager",
    "place_on_last_token": "relm.rewards.manager",
    "load_custom_reward": "relm.rewards.custom",
    "resolve_compute_score": "relm.rewards.custom",
    "default_compute_score": "relm.rewards.registry",
    "register_scorer": "relm.rewards.registry",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'relm.rewards' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
