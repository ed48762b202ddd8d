"""The DAPO math scorer: `Answer: ...` (or a last `\\boxed{}`) against the reference, +1 or -1.

verl 0.9.1 sends the data sources `math_dapo`, `math`, `math_dapo_reasoning` and every `aime*` to this
scorer (`verl/utils/reward_score/math_dapo.py`, after Minerva's normalisation, Lewkowycz et al. 2022,
arXiv:2206.14858). DAPO (Yu et al. 2025, arXiv:2503.14476) trains with a reward of +1 for a right
answer and -1 for a wrong or missing one, so a wrong answer is pushed down rather than merely not
pushed up. relm reproduces verl's rules exactly (the parity tests compare the two on every MATH-500
row): a run on these data sources scores what the same run scores under verl. Its quirks are verl's:
only the last 300 characters are read, the `\\boxed{}` fallback compares without normalisation, and
`normalize_final_answer` keeps what follows the last `=`.
"""

from __future__ import annotations

import re
from typing import Any

_SOLUTION_TAIL_CHARS = 300
"""Characters at the end of a response that are read (verl's limit; MATH-500's longest answer is 159)."""
_BOX_TAIL_CHARS = 100
"""Characters at the end of the (already cut) response in which the boxed fallback looks."""
_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_INVALID = "[INVALID]"

_SUBSTITUTIONS = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
_REMOVED_EXPRESSIONS = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
)
"""Units and filler words Minerva's normalisation deletes wherever they occur (so `cm` goes from `\\pi cm`)."""


def normalize_final_answer(final_answer: str) -> str:
    """Minerva's normalisation of a final answer (Lewkowycz et al. 2022, appendix D.1), as verl has it.

    Example: `x = \\$1,000 \\text{ dollars}` gives `1000`. The order of the rules matters and is verl's.
    """
    text = final_answer.split("=")[-1]
    for before, after in _SUBSTITUTIONS:
        text = text.replace(before, after)
    for expression in _REMOVED_EXPRESSIONS:
        text = text.replace(expression, "")
    text = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", text)
    text = re.sub(r"(\\text\{)(.*?)(\})", "\\2", text)
    text = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", text)
    text = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", text)
    text = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", text)
    text = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", text)
    text = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


def last_boxed_only(text: str) -> str | None:
    """Contents of the last `\\boxed{...}` with balanced braces; None when there is none or it is open."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for position in range(start, len(text)):
        if text[position] == "{":
            depth += 1
        elif text[position] == "}":
            depth -= 1
            if depth == 0:
                return text[start + len("\\boxed{") : position]
    return None


def _minerva(solution_str: str, ground_truth: str) -> tuple[bool, str]:
    """(correct, prediction) from the last `Answer:` line; the prediction is `[INVALID]` without one."""
    lines = _ANSWER_LINE.findall(solution_str)
    prediction = normalize_final_answer(lines[-1] if lines else _INVALID)
    return prediction == normalize_final_answer(ground_truth), prediction


def _strict_box(solution_str: str, ground_truth: str) -> tuple[bool, str | None]:
    """(correct, prediction) from the last box in the final 100 characters, compared unnormalised."""
    prediction = last_boxed_only(solution_str[-_BOX_TAIL_CHARS:])
    return prediction == ground_truth, prediction


def math_dapo_score(solution_str: str, ground_truth: Any, strict_box_verify: bool = False) -> dict[str, Any]:
    """verl's `math_dapo.compute_score`: `{"score": 1.0 or -1.0, "acc": bool, "pred": str | None}`.

    The `Answer:` line is read first; only when there is none does the last `\\boxed{}` count, and it
    must equal the reference character for character. `strict_box_verify=True` reads the box alone.
    `acc` becomes the `acc` metric; `pred` (what was read) is text and is not reported as a metric.
    """
    solution_str = solution_str[-_SOLUTION_TAIL_CHARS:]
    reference = str(ground_truth)
    if strict_box_verify:
        correct, prediction = _strict_box(solution_str, reference)
    else:
        correct, prediction = _minerva(solution_str, reference)
        if prediction == _INVALID:
            box_correct, box_prediction = _strict_box(solution_str, reference)
            if box_prediction is not None:
                correct, prediction = box_correct, box_prediction
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": prediction}
