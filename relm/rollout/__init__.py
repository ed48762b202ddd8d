"""Rollout engines behind one protocol (`relm.rollout.base.RolloutEngine`)."""

from relm.rollout.base import FINISH_LENGTH, FINISH_STOP, GenerationOutput, RolloutEngine, SamplingParams

__all__ = ["FINISH_LENGTH", "FINISH_STOP", "GenerationOutput", "RolloutEngine", "SamplingParams"]
