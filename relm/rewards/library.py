"""Rule rewards for the common answer formats, named from config without writing a file.

```
custom_reward_function.path=pkg://relm.rewards.library custom_reward_function.name=boxed
```

`pkg://` is verl's spelling of a module where a file path is expected (verl 0.9's `load_extern_object`),
so the same two keys select these functions in both. Each has verl's signature
`(data_source, solution_str, ground_truth, extra_info)` and scores 1.0 for a right final answer, 0.0
otherwise; the `data_source` is not consulted, so one entry serves a dataset whatever its rows call
themselves:

- `boxed`: the last `\\boxed{...}` (or `\\fbox`), compared as relm's MATH scorer compares (normalised
  LaTeX, exact rationals);
- `hash_answer`: the number after the last `####` (GSM8K's format), compared as numbers;
- `answer_line`: the last line that starts with `Answer:` (DAPO's format), compared as `boxed` compares;
- `multiple_choice`: one option letter (`(B)`, `B)`, `Answer: B`, `\\boxed{B}`, `the answer is B`);
- `gsm8k_numeric`: relm's GSM8K scorer (the number after the last `####` in the whole response, compared
  as an exact number); `openai/gsm8k` rows score as verl does by default (relm/rewards/gsm8k_reward.py);
- `math_normalized`: relm's MATH scorer (the last box, normalised LaTeX, exact rationals), which is
  `boxed` but for a reference holding a box, reduced to it first; the MATH sources score as verl does by
  default (relm/rewards/hendrycks_math.py);
- `math_verify`: math-verify alone (`pip install relm[math]`), the reference read as a boxed answer and
  the response's expressions and LaTeX tried against it, as verl's `math_verify.compute_score` does.

They run in the reward workers like any reward, under `reward_model.timeout`: math-verify's symbolic
comparisons are the calls that can run for minutes.
"""

from __future__ import annotations

import re
from typing import Any

from relm.errors import UserError
from relm.rewards.math_reward import last_boxed_answer, math_answers_equal, math_score
from relm.rewards.registry import gsm8k_score

_ANSWER_LINE = re.compile(r"^\s*\**Answer\**\s*:\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_CHOICE_PATTERNS = (
    re.compile(r"\\boxed\{\s*\(?([A-Za-z])\)?\s*\}"),
    re.compile(r"(?i)answer\s*(?:is|:)\s*\(?\s*([A-Za-z])\b\)?"),
    re.compile(r"\(([A-Za-z])\)"),
    re.compile(r"(?<![A-Za-z])([A-Z])\)"),
    re.compile(r"(?m)^\s*([A-Za-z])[).:]?\s*$"),
)
"""Ways a response states its option, most explicit first; within one pattern the last match wins."""


def boxed(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """1.0 when the last `\\boxed{}` equals the reference (normalised LaTeX, exact numbers)."""
    answer = last_boxed_answer(solution_str)
    return float(answer is not None and math_answers_equal(answer, str(ground_truth)))


def hash_answer(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """1.0 when the number after the last `####` equals the reference (GSM8K's format)."""
    return gsm8k_score(solution_str, str(ground_truth), method="strict")


def gsm8k_numeric(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """relm's GSM8K scorer: 1.0 when the last `####` number of the whole response equals the reference as a number.

    Unlike verl's (the default for `openai/gsm8k`), `#### 72.0`, `#### 072`, `#### $72`, `####72` and
    `#### 72.` all score 1 against `72`, and the answer may lie anywhere in a long response.
    """
    return gsm8k_score(solution_str, str(ground_truth), method="strict")


def math_normalized(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """relm's MATH scorer: the last box against the reference, normalised LaTeX and exact rationals."""
    return math_score(solution_str, str(ground_truth))


def answer_line(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """1.0 when the last `Answer: ...` line equals the reference (compared as `boxed` compares)."""
    lines = _ANSWER_LINE.findall(solution_str)
    if not lines:
        return 0.0
    answer = lines[-1].rstrip(".")
    return float(math_answers_equal(last_boxed_answer(answer) or answer, str(ground_truth)))


def extract_choice(solution_str: str) -> str | None:
    """The option letter a response gives (upper case), or None."""
    for pattern in _CHOICE_PATTERNS:
        found = pattern.findall(solution_str)
        if found:
            return found[-1].upper()
    return None


def multiple_choice(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """1.0 when the response's option letter is the reference's (`B`, `(B)` or `b` all name B)."""
    reference = str(ground_truth).strip().strip("()").strip().upper()
    if len(reference) != 1 or not reference.isalpha():
        raise UserError(
            f"multiple_choice reward: ground_truth {ground_truth!r} is not one option letter; give the "
            "letter (A, B, ...) in reward_model.ground_truth"
        )
    return float(extract_choice(solution_str) == reference)


def math_verify(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """math-verify's verdict: the reference as a boxed answer, the response's expressions and LaTeX.

    math-verify's own alarms bound each parse and comparison at 5 s where it runs on a main thread (a
    reward worker's is); `reward_model.timeout` bounds the whole call in any case.
    """
    try:
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    except ImportError as exc:
        raise UserError(
            "custom_reward_function.name=math_verify needs math-verify: pip install 'relm[math]' "
            "(or math-verify[antlr4_9_3])"
        ) from exc
    gold = parse(f"\\boxed{{{ground_truth}}}", (LatexExtractionConfig(),))
    predicted = parse(solution_str, (ExprExtractionConfig(), LatexExtractionConfig()))
    return float(bool(gold and predicted and verify(gold, predicted)))
