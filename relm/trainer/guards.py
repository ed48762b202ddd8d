"""Run-level guards read from each step's metrics: diverged updates and degenerate response batches.

One skipped update (a non-finite gradient norm; see `learner/optim.py::clip_and_step`) is noise a run
survives. Many steps in a row with skips mean the run has diverged: every further step only burns
compute, so the run stops with one line naming the knob to turn.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from relm.errors import UserError

logger = logging.getLogger("relm")

SKIPPED_UPDATES_KEY = "training/skipped_updates"
"""Optimizer updates skipped in one step (reported by `ppo_step`)."""


class TrainingDiverged(UserError, RuntimeError):
    """Too many consecutive steps had an update skipped for a non-finite loss or gradient.

    A `UserError` (exit code 2, one `error:` line) because the way out is a change to the run's input:
    a lower learning rate, tighter clipping, other data or a larger `trainer.max_skipped_steps`. It is
    also a `RuntimeError` so code that treats runtime failures alike still catches it.
    """


@dataclass
class SkipGuard:
    """Counts steps with skipped updates; flags divergence past `max_skipped_steps` of them in a row.

    Its two counters go into every checkpoint so a resumed run counts on where it stopped.
    """

    max_skipped_steps: int
    skipped_steps: int = 0
    """Steps with at least one skipped update, over the whole run."""
    consecutive_skipped_steps: int = 0
    """Steps with a skipped update since the last step without one."""

    def update(self, step: int, metrics: dict[str, float]) -> TrainingDiverged | None:
        """Count this step and add `training/skipped_steps` to `metrics`.

        Returns the error to raise when the run diverged; the loop raises it after logging the step,
        so the diverging step's metrics are on record.
        """
        if metrics.get(SKIPPED_UPDATES_KEY, 0.0) > 0:
            self.skipped_steps += 1
            self.consecutive_skipped_steps += 1
        else:
            self.consecutive_skipped_steps = 0
        metrics["training/skipped_steps"] = float(self.skipped_steps)
        if 0 <= self.max_skipped_steps < self.consecutive_skipped_steps:
            return TrainingDiverged(
                f"training diverged: {self.consecutive_skipped_steps} steps in a row (up to step {step}) "
                "had updates skipped for a NaN/inf loss or gradient, more than trainer.max_skipped_steps="
                f"{self.max_skipped_steps}; lower actor_rollout_ref.actor.optim.lr (and critic.optim.lr) "
                "or resume from an earlier checkpoint"
            )
        return None

    def state_dict(self) -> dict[str, int]:
        return {
            "skipped_steps": self.skipped_steps,
            "consecutive_skipped_steps": self.consecutive_skipped_steps,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self.consecutive_skipped_steps = int(state.get("consecutive_skipped_steps", 0))


class DegenerateBatchReporter:
    """Warns when every response of a step is empty or every one hit the length limit.

    Either way the batch carries little learning signal (all empty: nothing to score; all cut: no
    response ends, so an EOS-based reward never fires), and a user staring at a flat reward curve needs
    to know which. The warning comes once when such a stretch of steps begins, not on every step of it:
    a model that has not learned to stop yet can stay truncated for hundreds of steps.
    """

    def __init__(self) -> None:
        self._ongoing: str | None = None

    def check(self, step: int, metrics: dict[str, float], num_responses: int) -> str | None:
        """Returns the warning line logged for this step, or None."""
        kind, message = None, None
        if metrics.get("response_length/max", 1.0) == 0:
            kind = "empty"
            message = (
                f"step {step}: all {num_responses} responses are empty (the model emits EOS first); "
                "check the chat template and the model's eos/pad tokens"
            )
        elif metrics.get("response_length/clip_ratio", 0.0) >= 1.0:
            kind = "truncated"
            message = (
                f"step {step}: all {num_responses} responses were cut at data.max_response_length="
                f"{int(metrics.get('response_length/max', 0))} tokens (none ended with EOS); raise "
                "data.max_response_length if answers need more room (said once while it lasts)"
            )
        if kind == self._ongoing:
            return None
        self._ongoing = kind
        if message:
            logger.warning(message)
        return message
