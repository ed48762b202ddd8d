"""A run whose updates keep coming out NaN/inf stops after `trainer.max_skipped_steps` with one line."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def test_diverging_run_stops_with_one_line_and_keeps_its_record(train):
    # An absurd learning rate breaks the weights in the first update: every later gradient is NaN.
    result = train(
        "actor_rollout_ref.actor.optim.lr=1e30", "critic.optim.lr=1e30",
        "trainer.max_skipped_steps=1", "trainer.total_training_steps=5", "trainer.logger=[]",
    )  # fmt: skip
    assert result.exit_code == 2, result.stderr
    line = result.stderr_lines[-1]
    assert line.startswith("error: training diverged: 2 steps in a row (up to step 2)"), line
    assert "trainer.max_skipped_steps=1" in line and "optim.lr" in line
    # The diverging steps are on record, with their counters, and drawn.
    assert [(r["step"], r["training/skipped_steps"]) for r in result.metrics] == [(1, 1.0), (2, 2.0)]
    assert all(r["training/skipped_updates"] > 0 for r in result.metrics)
    assert (result.run_dir / "curves.png").is_file()
