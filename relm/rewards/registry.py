"""Rule scorers chosen by a row's `data_source`, as verl's `default_compute_score` does.

A scorer is `f(solution_str, ground_truth) -> float | dict`, or takes `extra_info` too (the lookup task
reads verl's `extra_info["num_turns"]`); registering one under the data_source names it serves is all a
built-in task needs. Anything else goes through
`custom_reward_function.path`, which replaces this dispatch entirely.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from relm.data.demo_task import DEMO_DATA_SOURCE, letter_share_score
from relm.data.gsm8k import extract_gsm8k_answer as extract_gsm8k_answer  # where callers found it
from relm.data.gsm8k import gsm8k_score as gsm8k_score  # relm's number-comparing scorer (`gsm8k_numeric`)
from relm.data.lookup_task import LOOKUP_DATA_SOURCE, final_answer_score
from relm.errors import UserError
from relm.rewards.gsm8k_reward import gsm8k_verl_score
from relm.rewards.hendrycks_math import math_verl_score
from relm.rewards.math_dapo import math_dapo_score

Scorer = Callable[[str, Any], "float | dict[str, Any]"]

_SCORERS: dict[str, Scorer] = {}
_PREFIX_SCORERS: dict[str, Scorer] = {}
"""Data-source prefixes (verl sends every `aime...` source to its DAPO scorer) -> scorer."""


def register_scorer(*data_sources: str) -> Callable[[Scorer], Scorer]:
    """Decorator: serve rows whose data_source is any of `data_sources` with the function."""

    def register(scorer: Scorer) -> Scorer:
        for source in data_sources:
            if _SCORERS.get(source, scorer) is not scorer:
                raise ValueError(f"data_source {source!r} already has scorer {_SCORERS[source].__name__}")
            _SCORERS[source] = scorer
        return scorer

    return register


def register_scorer_prefix(prefix: str) -> Callable[[Scorer], Scorer]:
    """Decorator: serve rows whose data_source starts with `prefix` (and has no exact scorer)."""

    def register(scorer: Scorer) -> Scorer:
        if _PREFIX_SCORERS.get(prefix, scorer) is not scorer:
            raise ValueError(f"prefix {prefix!r} already has scorer {_PREFIX_SCORERS[prefix].__name__}")
        _PREFIX_SCORERS[prefix] = scorer
        return scorer

    return register


def registered_data_sources() -> list[str]:
    """Data sources with a built-in scorer, sorted (prefixes shown as `aime*`)."""
    return sorted(_SCORERS) + sorted(f"{prefix}*" for prefix in _PREFIX_SCORERS)


def _scorer_for(data_source: str) -> Scorer | None:
    scorer = _SCORERS.get(data_source)
    if scorer is not None:
        return scorer
    return next((f for prefix, f in _PREFIX_SCORERS.items() if data_source.startswith(prefix)), None)


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None
) -> float | dict[str, Any]:
    """Score one response with the scorer registered for its data_source.

    Raises:
        UserError: No scorer is registered for `data_source`.
    """
    scorer = _scorer_for(data_source)
    if scorer is None:
        raise UserError(
            f"data_source '{data_source}' has no built-in scorer (built-in: "
            f"{', '.join(registered_data_sources())}); pass custom_reward_function.path=FILE.py "
            "defining compute_score(data_source, solution_str, ground_truth, extra_info)"
        )
    if _takes_extra_info(scorer):
        return scorer(solution_str, ground_truth, extra_info)  # type: ignore[call-arg]  # checked just above
    return scorer(solution_str, ground_truth)


@functools.cache
def _takes_extra_info(scorer: Scorer) -> bool:
    return "extra_info" in inspect.signature(scorer).parameters


register_scorer(DEMO_DATA_SOURCE)(letter_share_score)
register_scorer(LOOKUP_DATA_SOURCE)(final_answer_score)


# verl's GSM8K and MATH sources score exactly as verl 0.9.1 scores them (string comparisons, verl's last
# 300 characters, lm-eval's MATH normaliser), so a run moved from verl keeps its reward curve. relm's more
# careful scorers are `gsm8k_numeric` and `math_normalized` in relm/rewards/library.py (docs/rewards.md).
register_scorer("openai/gsm8k")(gsm8k_verl_score)
register_scorer("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")(
    math_verl_score
)

# The sources verl 0.9.1 routes to its DAPO scorer (`Answer:` line, then the box; +1/-1), scored as verl does.
register_scorer("math_dapo", "math", "math_dapo_reasoning")(math_dapo_score)
register_scorer_prefix("aime")(math_dapo_score)
