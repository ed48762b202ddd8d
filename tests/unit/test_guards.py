"""Skip guard (consecutive steps with skipped updates) and the all-empty / all-truncated batch warning."""

from __future__ import annotations

from relm.errors import UserError
from relm.trainer.guards import DegenerateBatchReporter, SkipGuard, TrainingDiverged


def skipped(n: int) -> dict[str, float]:
    return {"training/skipped_updates": float(n)}


def test_more_than_max_consecutive_skips_diverges():
    guard = SkipGuard(max_skipped_steps=2)
    outcomes = []
    for step, n in enumerate([1, 0, 3, 1, 0, 1, 1, 1], start=1):
        metrics = skipped(n)
        outcomes.append(guard.update(step, metrics) is not None)
        assert metrics["training/skipped_steps"] == guard.skipped_steps
    # Streaks: 1, 0, 1, 2, 0, 1, 2, 3 -> only the third skip in a row (step 8) is more than 2.
    assert outcomes == [False] * 7 + [True]
    assert guard.skipped_steps == 6


def test_divergence_error_is_one_line_naming_the_knob():
    guard = SkipGuard(max_skipped_steps=0)
    error = guard.update(7, skipped(2))
    assert isinstance(error, TrainingDiverged) and isinstance(error, UserError | RuntimeError)
    message = str(error)
    assert "\n" not in message and "step 7" in message and "trainer.max_skipped_steps=0" in message


def test_negative_limit_never_stops_and_state_round_trips():
    guard = SkipGuard(max_skipped_steps=-1)
    assert all(guard.update(step, skipped(1)) is None for step in range(1, 50))
    resumed = SkipGuard(max_skipped_steps=3)
    resumed.load_state_dict(guard.state_dict())
    assert (resumed.skipped_steps, resumed.consecutive_skipped_steps) == (49, 49)


def test_degenerate_batches_are_reported_once_per_stretch():
    reporter = DegenerateBatchReporter()
    truncated = {"response_length/max": 16.0, "response_length/clip_ratio": 1.0}
    empty = {"response_length/max": 0.0, "response_length/clip_ratio": 0.0}
    fine = {"response_length/max": 9.0, "response_length/clip_ratio": 0.5}
    batches = [truncated, truncated, fine, empty, truncated]
    lines = [reporter.check(step, metrics, 64) for step, metrics in enumerate(batches, start=1)]
    assert lines[1] is None and lines[2] is None
    assert "step 1: all 64 responses were cut at data.max_response_length=16" in lines[0]
    assert "step 4: all 64 responses are empty" in lines[3]
    assert lines[4].startswith("step 5: all 64 responses were cut")
