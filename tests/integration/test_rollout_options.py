"""Rollout choices every engine shares: where the old logprobs come from (the actor, or the engine in verl's
bypass mode), and `rollout.name=vllm` on a machine without vLLM (the native engine, with a warning)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from relm.config.loader import load_config
from relm.config.translate import translate
from relm.learner.batch import ActorForward, EngineLogprobs
from relm.models.loading import resolve_model_dir
from relm.trainer.collect import collect_experience
from relm.trainer.components import build_components
from relm.trainer.ppo import annotate
from tests.integration.conftest import TINY_OVERRIDES, RunResult

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("bypass", [False, True], ids=["recompute", "bypass"])
def test_old_logprobs_come_from_the_actor_or_in_bypass_mode_from_the_engine(
    bypass: bool, tmp_path: Path
) -> None:
    cfg = load_config(
        [
            *TINY_OVERRIDES,
            f"algorithm.rollout_correction.bypass_mode={str(bypass).lower()}",
            f"trainer.default_local_dir={tmp_path}",
        ]
    )
    c = build_components(translate(cfg)[0], resolve_model_dir(cfg.actor_rollout_ref.model.path))
    scored = collect_experience(c.experience_sources, c.loader.next_batch(), 1, {})
    # A distinct engine value: were old logprobs recomputed, they could not equal it.
    rollout = scored.rollout
    rollout = replace(rollout, rollout_logprobs=rollout.rollout_logprobs - 0.25 * rollout.response_mask)

    batch, metrics = annotate(c, replace(scored, rollout=rollout))

    mask = rollout.response_mask.bool()
    if bypass:
        assert isinstance(batch.old_logprobs, EngineLogprobs)
        assert torch.equal(batch.old_logprobs.logprobs, rollout.rollout_logprobs)
        assert "timing_s/old_log_prob" not in metrics and "rollout/logprob_diff_max" not in metrics
    else:
        assert isinstance(batch.old_logprobs, ActorForward)
        assert (batch.old_logprobs.logprobs - rollout.rollout_logprobs)[mask].sub(0.25).abs().max() < 1e-4
        assert metrics["rollout/logprob_diff_max"] == pytest.approx(0.25, abs=1e-4)
        assert metrics["rollout/logprob_diff_mean"] == pytest.approx(0.25, abs=1e-4)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_without_vllm_installed_trains_on_the_native_engine_saying_so(
    train: Callable[..., RunResult],
) -> None:
    result = train("actor_rollout_ref.rollout.name=vllm", "trainer.logger=[console,wandb,swanlab]")

    assert result.exit_code == 0 and len(result.metrics) >= 1
    notes = [line for line in result.stderr.splitlines() if "rollout.name=vllm" in line]
    assert len(notes) == 1 and "vLLM is not installed; generating with relm's native engine" in notes[0]
    assert sum("`swanlab`" in line for line in result.stderr.splitlines()) == 1


def test_max_num_seqs_continuously_batches_the_native_engine_and_matches_the_actor(tmp_path: Path) -> None:
    # 4 prompts x n=2 = 8 rows through 3 slots, prompts prefilled 4 columns at a time.
    cfg = load_config(
        [
            *TINY_OVERRIDES,
            "actor_rollout_ref.rollout.max_num_seqs=3",
            "actor_rollout_ref.rollout.max_num_batched_tokens=4",
            f"trainer.default_local_dir={tmp_path}",
        ]
    )
    c = build_components(translate(cfg)[0], resolve_model_dir(cfg.actor_rollout_ref.model.path))
    _, metrics = annotate(c, collect_experience(c.experience_sources, c.loader.next_batch(), 1, {}))

    engine = c.engine.engine  # inside the stall watchdog
    assert engine.max_num_seqs == 3 and engine.max_prefill_tokens == 4
    assert engine.last_stats["slots"] == 3 and engine.last_stats["admissions"] >= 2
    # The rows came back in prompts x n order: the actor scores each response after its own prompt.
    assert metrics["rollout/logprob_diff_max"] < 1e-4
