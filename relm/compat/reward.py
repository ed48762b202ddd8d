"""A dense stand-in reward for the update stage of `relm compat`.

A random-weight model almost never earns the demo task's reward. With every score 0 the advantages
are 0, the policy gradient is exactly 0, and "one update with finite losses" would prove nothing.
This score differs from response to response and is deterministic, so every checked model gets a
real gradient through the actor, the critic head and (from the second step) the critic backbone.
The ground truth's first character counts too: a random full-size model paired with the zoo's
character tokenizer samples ids the tokenizer cannot decode, so its responses can all decode to
"", and only the prompt then tells their scores apart.
"""

from __future__ import annotations

from typing import Any


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """Mean of (character code mod 7) / 6 over the ground truth's first character and the response."""
    chars = str(ground_truth or "")[:1] + solution_str
    if not chars:
        return 0.0
    return sum(ord(char) % 7 for char in chars) / (6 * len(chars))
