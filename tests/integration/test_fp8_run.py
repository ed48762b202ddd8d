"""A run with `actor_rollout_ref.rollout.quantization=fp8`: it trains, logs the engine's logprob gap to
the trainer at every step and names it after the first one; the refused combinations stop in one line."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.integration.conftest import RunResult

pytestmark = pytest.mark.integration


def test_fp8_run_trains_and_names_the_gap_after_the_first_step(train: Callable[..., RunResult]) -> None:
    result = train("actor_rollout_ref.rollout.quantization=fp8")

    assert result.exit_code == 0 and len(result.metrics) == 2
    lines = [line for line in result.stderr.splitlines() if "fp8 rollout: logprob gap" in line]
    assert len(lines) == 1, result.stderr
    first = result.metrics[0]
    assert f"max {first['rollout/logprob_diff_max']:.3g}" in lines[0]
    # fp32 trainer against the fp8 engine: the gap is fp8's rounding (about 1e-5 without fp8).
    for step in result.metrics:
        assert 1e-4 < step["rollout/logprob_diff_max"] < 0.25


def test_fp8_on_the_hf_engine_is_one_line(train: Callable[..., RunResult]) -> None:
    result = train("actor_rollout_ref.rollout.quantization=fp8", "actor_rollout_ref.rollout.name=hf")

    assert result.exit_code == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "runs on the native engine" in errors[0]
