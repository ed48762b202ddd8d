"""Rule scorers chosen by a row's `data_source`, as verl's `default_compute_score` does.

A scorer is `f(solution_str, ground_truth) -> float | dict`, or takes `extra_info` too (the lookup task
reads verl's `extra_info["num_turns"]`); registering one under the data_source names it serves is all a
built-in task needs. Anything else goes through
`custom_reward_function.path`, which replaces this dispatch entirely.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from relm.data.demo_task import DEMO_DATA_SOURCE, letter_share_score
from relm.errors import UserError
from relm.rewards.math_dapo import math_dapo_score
from relm.rewards.math_reward import math_score
from relm.rollout.multi_turn.lookup import LOOKUP_DATA_SOURCE, final_answer_score

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


# A number starts and ends with a digit: a pattern that could start on `.`, `,` or `$` backtracks over
# each run of them from every position, which is quadratic in the degenerate "......" responses
# early RL policies produce (8k dots took 0.2 s, and 10x the dots takes 100x the time).
_NUMBER_PATTERN = r"-?\$?\d(?:[\d.,]*\d)?"
_GSM8K_STRICT = re.compile(r"#### *(" + _NUMBER_PATTERN + ")")
_NUMBER = re.compile(_NUMBER_PATTERN)


def extract_gsm8k_answer(solution_str: str, method: str = "strict") -> str | None:
    """The final answer of a GSM8K response, normalised (no `,` or `$`); None when absent.

    `strict` takes the number after the last `####` (the format GSM8K's references use);
    `flexible` takes the last number anywhere, for models not trained on that format.
    """
    if method not in ("strict", "flexible"):
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    pattern = _GSM8K_STRICT if method == "strict" else _NUMBER
    matches = pattern.findall(solution_str)
    if not matches:
        return None
    return matches[-1].replace(",", "").replace("$", "")


def gsm8k_score(
    solution_str: str,
    ground_truth: str,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """`score` for the right final answer, `format_score` for a wrong one, 0 for none.

    Answers compare as numbers, so `18`, `18.0` and `$18` all match a reference of `18`. verl's scorer
    compares strings and reads only the last 300 characters, so the last two score 0 there; relm keeps
    judging the number on purpose, and whatever verl scores 1 scores 1 here (docs/algorithms.md).
    """
    answer = extract_gsm8k_answer(solution_str, method)
    if answer is None:
        return 0.0
    reference = str(ground_truth).replace(",", "").replace("$", "").strip()
    try:
        # Exact rationals: floats would call 10000000000000001 and 10000000000000000 equal.
        correct = Fraction(answer) == Fraction(reference)
    except (ValueError, ZeroDivisionError):
        correct = answer == reference
    return score if correct else format_score


register_scorer("openai/gsm8k")(gsm8k_score)


# verl's MATH sources: the last box against the reference, 1/0, with relm's normalisation (more forgiving
# than verl's `math_reward`; docs/algorithms.md lists the differences).
register_scorer("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")(math_score)

# The sources verl 0.9.1 routes to its DAPO scorer (`Answer:` line, then the box; +1/-1), scored as verl does.
register_scorer("math_dapo", "math", "math_dapo_reasoning")(math_dapo_score)
register_scorer_prefix("aime")(math_dapo_score)
