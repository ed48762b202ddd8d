"""GSM8K's answer format: the number after the last `####`, and the rule score of a response.

It lives with the data because the format is the dataset's own (its references end with `#### N`):
the reward library offers `gsm8k_score` as `gsm8k_numeric` (`openai/gsm8k` rows score as verl does by
default, relm/rewards/gsm8k_reward.py), and the multi-turn GSM8K tool and
interaction (relm/rollout/multi_turn/gsm8k.py), which sit below the rewards, check answers with it too.
"""

from __future__ import annotations

import re
from fractions import Fraction

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
    judging the number on purpose (`gsm8k_numeric`; docs/algorithms.md lists the differences).
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
