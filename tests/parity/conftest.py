"""verl 0.9.1 itself, imported for the parity tests, with a stand-in `ray`.

verl's algorithm and reward modules run on CPU without Ray, but `verl/protocol.py` imports `ray` at its
top and names `ray.ObjectRef` in a type annotation. `make setup-verl` installs verl without its
dependencies (no Ray), so a stand-in module with that one name sits in `sys.modules` while these tests
import verl, and only then: nothing in relm sees it, and a real Ray, where installed, is used as is.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
import types
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

VERL_VERSION = "0.9.1"
"""The release relm's numbers follow (docs/algorithms.md); another one may differ on purpose."""


def _stand_in_ray() -> types.ModuleType:
    ray = types.ModuleType("ray")
    ray.__doc__ = "Stand-in for the parity tests: verl names ray.ObjectRef in an annotation at import."
    ray.ObjectRef = type("ObjectRef", (), {})
    return ray


@pytest.fixture(scope="session")
def verl() -> Iterator[SimpleNamespace]:
    """verl's `core_algos`, `reward_score`, `rollout_corr_helper`, `torch_functional` and configs; skips when verl 0.9.1 is not installed."""
    if importlib.util.find_spec("verl") is None:
        pytest.skip(
            f"verl {VERL_VERSION} is not installed; `make setup-verl` installs it for the parity tests"
        )
    version = importlib.metadata.version("verl")
    if version != VERL_VERSION:
        pytest.skip(f"verl {version} is installed; the parity tests compare with {VERL_VERSION}")
    with pytest.MonkeyPatch.context() as patch:
        if importlib.util.find_spec("ray") is None:
            patch.setitem(sys.modules, "ray", _stand_in_ray())
        core_algos = importlib.import_module("verl.trainer.ppo.core_algos")
        reward_score = importlib.import_module("verl.utils.reward_score")
        yield SimpleNamespace(
            core_algos=core_algos,
            reward_score=reward_score,
            gsm8k=importlib.import_module("verl.utils.reward_score.gsm8k"),
            math_reward=importlib.import_module("verl.utils.reward_score.math_reward"),
            math_dapo=importlib.import_module("verl.utils.reward_score.math_dapo"),
            ActorConfig=importlib.import_module("verl.workers.config").ActorConfig,
            PolicyLossConfig=importlib.import_module("verl.workers.config").PolicyLossConfig,
            rollout_corr=importlib.import_module("verl.trainer.ppo.rollout_corr_helper"),
            torch_functional=importlib.import_module("verl.utils.torch_functional"),
            RolloutCorrectionConfig=importlib.import_module(
                "verl.trainer.config.algorithm"
            ).RolloutCorrectionConfig,
        )
