"""verl's GSM8K scorer, to the digit: what `openai/gsm8k` rows score by default.

verl 0.9.1 (`verl.utils.reward_score.gsm8k`) reads only the last 300 characters of a response, takes
the last `#### ` followed by digits, dots and commas (`strict`) or the last such run anywhere
(`flexible`), drops the commas and compares the *string* with the ground truth as given. So `#### 72.0`,
`#### 072`, `#### $72`, `####72` and `#### 72.` score 0 against `72`, and a ground truth stored as the
integer 72 never matches. A run moved from verl keeps its reward curve only if relm does the same, so
this is the default; relm's number-comparing scorer (`relm.data.gsm8k.gsm8k_score`) stays available as
`custom_reward_function.name=gsm8k_numeric` (relm/rewards/library.py; docs/rewards.md lists the
differences).
"""

from __future__ import annotations

import re
from typing import Any

VERL_WINDOW_CHARS = 300
"""verl scores only this many trailing characters of a response (its `_SOLUTION_CLIP_CHARS`)."""

# The window is short, so these patterns cannot be slow however degenerate the response.
_STRICT = re.compile(r"#### (-?[0-9.,]+)")
_FLEXIBLE = re.compile(r"-?[0-9.,]+")


def extract_gsm8k_answer_as_verl(solution_str: str, method: str = "strict") -> str | None:
    """The answer verl's GSM8K scorer reads from a response, or None.

    `strict`: the run after the last `#### ` in the window, commas (and any `$`) removed. `flexible`:
    the last run of digits, dots and commas that is not a lone `.`, commas kept; when every run is a
    lone `.`, that `.` (verl's loop ends on it).
    """
    if method not in ("strict", "flexible"):
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    window = solution_str[-VERL_WINDOW_CHARS:]
    if method == "strict":
        found = _STRICT.findall(window)
        return found[-1].replace(",", "").replace("$", "") if found else None
    runs = _FLEXIBLE.findall(window)
    if not runs:
        return None
    usable = [run for run in runs if run != "."]
    return usable[-1] if usable else runs[0]


def gsm8k_verl_score(
    solution_str: str,
    ground_truth: Any,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """`score` when the extracted string equals `ground_truth` exactly, `format_score` when it differs, 0 with none."""
    answer = extract_gsm8k_answer_as_verl(solution_str, method)
    if answer is None:
        return 0.0
    return float(score) if answer == ground_truth else float(format_score)
