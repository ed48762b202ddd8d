"""verl's rollout correction inside a real step: decoupled weights and rejection land in the batch before the
advantages (attention untouched), and bypass mode's REINFORCE loss trains with its `rollout_corr/` metrics."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from relm.config.loader import load_config
from relm.config.translate import translate
from relm.models.loading import resolve_model_dir
from relm.trainer.collect import collect_experience
from relm.trainer.components import build_components
from relm.trainer.ppo import annotate, estimate_advantages
from tests.integration.conftest import TINY_OVERRIDES, RunResult

pytestmark = pytest.mark.integration

CORRECTION = (
    "algorithm.rollout_correction.rollout_is=token",
    "algorithm.rollout_correction.rollout_is_threshold=2.0",
    "algorithm.rollout_correction.rollout_rs=token_k1",
    "algorithm.rollout_correction.rollout_rs_threshold=0.5_2.0",
)


def test_decoupled_mode_weighs_and_rejects_before_the_advantages(tmp_path: Path) -> None:
    cfg = load_config([*TINY_OVERRIDES, *CORRECTION, f"trainer.default_local_dir={tmp_path}"])
    c = build_components(translate(cfg)[0], resolve_model_dir(cfg.actor_rollout_ref.model.path))
    scored = collect_experience(c.experience_sources, c.loader.next_batch(), 1, {})
    # The engine gave the first token of response 0 a logprob 1 lower than the trainer's: r = e there,
    # truncated to 2, and k1 = -1 < log 0.5, rejected. Elsewhere the engine is the actor (CPU): r = 1.
    engine_logprobs = scored.rollout.rollout_logprobs.clone()
    engine_logprobs[0, 0] -= 1.0
    rollout = replace(scored.rollout, rollout_logprobs=engine_logprobs)
    mask_before, attention_before = rollout.response_mask.clone(), rollout.attention_mask.clone()

    annotated, _ = annotate(c, replace(scored, rollout=rollout))
    batch, metrics = estimate_advantages(c.spec.algorithm, c.kl_ctrl, annotated)

    expected = mask_before.clone()
    expected[0, 0] = 0
    assert torch.equal(batch.loss_mask, expected)
    assert torch.equal(batch.rollout.response_mask, mask_before)  # the rollout's record is as it was made
    assert torch.equal(
        batch.rollout.attention_mask, attention_before
    )  # the model still reads the rejected token
    assert batch.rollout_is_weights is not None and batch.rollout_is_weights[0, 0] == 2.0
    valid = mask_before.bool()
    valid[0, 0] = False
    assert (batch.rollout_is_weights[valid] - 1.0).abs().max() < 1e-4
    assert batch.advantages[0, 0] == 0.0  # out of the mask
    num_valid = int(mask_before.sum())
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1 / num_valid)
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(1 / num_valid)
    # kl = mean of log pi_rollout - log pi_old: -1 on one token
    assert metrics["rollout_corr/kl"] == pytest.approx(-1 / num_valid, abs=1e-5)
    assert metrics["rollout_corr/rollout_is_max"] == 2.0 and not math.isnan(metrics["rollout_corr/chi2_seq"])


def test_bypass_mode_trains_with_reinforce_and_reports_the_gap(train: Callable[..., RunResult]) -> None:
    result = train(
        "algorithm.rollout_correction.bypass_mode=true",
        "algorithm.rollout_correction.loss_type=reinforce",
        "algorithm.rollout_correction.rollout_is=sequence",
        "algorithm.rollout_correction.rollout_is_threshold=5.0",
    )
    assert result.exit_code == 0 and len(result.metrics) == 2
    for step in result.metrics:
        assert "timing_s/old_log_prob" not in step
        assert {"rollout_corr/rollout_is_mean", "rollout_corr/kl", "actor/ppo_kl", "actor/pg_loss"} <= set(
            step
        )
        assert all(math.isfinite(value) for value in step.values() if isinstance(value, float))
