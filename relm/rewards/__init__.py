"""Scoring responses: rule scorers by data_source, user functions, and the reward manager."""

from relm.rewards.custom import load_custom_reward, resolve_compute_score
from relm.rewards.manager import RewardManager, RewardResult, place_on_last_token
from relm.rewards.registry import default_compute_score, register_scorer

__all__ = [
    "RewardManager",
    "RewardResult",
    "default_compute_score",
    "load_custom_reward",
    "place_on_last_token",
    "register_scorer",
    "resolve_compute_score",
]
