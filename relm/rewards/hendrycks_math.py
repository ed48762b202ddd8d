"""verl's MATH scorer, to the digit: what `lighteval/MATH` and its copies score by default.

verl 0.9.1 (`verl.utils.reward_score.math_reward`) follows lm-eval's hendrycks_math: the last box of the
response, both sides passed through a fixed string normaliser, compared as strings. Its quirks are kept
on purpose, so a run moved from verl keeps its reward curve:

- `\\fbox{}` never scores, a box after a `\\boxed ` (with a space) anywhere is ignored;
- `\\\\` becomes `\\`, so escaped LaTeX (`\\\\frac`) matches; `\\left` is deleted inside `\\leftarrow`;
- only `\\text{ ...` (with a space) is a unit, and it cuts everything after it; a second one, an empty
  `\\sqrt` or `\\frac` at the end leave both sides compared unnormalised;
- `x=` is dropped only when what stands before `=` has at most two characters; no numeric comparison
  (`2/4`, `3.0`, `1,000` differ from `\\frac{1}{2}`, `3`, `1000`), only `0.5` and `a/b` of integers
  become fractions.

relm's own normaliser (relm/rewards/math_reward.py, exact rationals, units, thin spaces) stays available
as `custom_reward_function.name=math_normalized`; docs/rewards.md lists the differences.
"""

from __future__ import annotations

from typing import Any

_SPACED_BOX = "\\boxed "


class _Unnormalisable(Exception):
    """The normaliser met a string it cannot handle; the caller compares the raw strings instead."""


def last_box_as_verl(text: str) -> str | None:
    """The answer verl reads from a response's boxes, or None when it scores 0 whatever the reference.

    A `\\boxed ` with a space anywhere wins: the text after the last one, up to the next `$`. Otherwise
    the last `\\boxed` (else `\\fbox`), up to the brace that brings the count of braces after it back to
    zero; only a `\\boxed{` box yields an answer.
    """
    if _SPACED_BOX in text:
        return text.split(_SPACED_BOX)[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    depth = 0
    end = None
    for position in range(start, len(text)):
        char = text[position]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                end = position
                break
    if end is None:
        return None
    box = text[start : end + 1]
    if not box.startswith("\\boxed{"):
        return None  # `\fbox{..}` or `\boxed` with text before its brace: verl's unboxing refuses it
    return box[len("\\boxed{") : -1]


def _braced_fracs(text: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\frac1{2}` -> `\\frac{1}{2}`; unchanged when a `\\frac` has < 2 characters after it."""
    head, *pieces = text.split("\\frac")
    out = [head]
    for piece in pieces:
        if not piece:
            raise _Unnormalisable
        if piece[0] == "{":
            out.append("\\frac" + piece)
            continue
        if len(piece) < 2:
            return text
        first, second, rest = piece[0], piece[1], piece[2:]
        if second == "{":
            out.append("\\frac{" + first + "}" + second + rest)
        else:
            out.append("\\frac{" + first + "}{" + second + "}" + rest)
    return "".join(out)


def _slash_fraction(text: str) -> str:
    """`3/4` (two integers, written as Python writes them) -> `\\frac{3}{4}`."""
    parts = text.split("/")
    if len(parts) != 2:
        return text
    try:
        top, bottom = int(parts[0]), int(parts[1])
    except ValueError:
        return text
    if text != f"{top}/{bottom}":
        return text
    return "\\frac{" + str(top) + "}{" + str(bottom) + "}"


def _braced_sqrt(text: str) -> str:
    """`\\sqrt3` -> `\\sqrt{3}` (one character)."""
    if "\\sqrt" not in text:
        return text
    head, *pieces = text.split("\\sqrt")
    out = [head]
    for piece in pieces:
        if not piece:
            raise _Unnormalisable
        out.append("\\sqrt" + piece if piece[0] == "{" else "\\sqrt{" + piece[0] + "}" + piece[1:])
    return "".join(out)


def normalize_as_verl(answer: str) -> str:
    """verl's (lm-eval's hendrycks_math) canonical string of an answer.

    Raises:
        _Unnormalisable: where verl's normaliser raises (two `\\text{ ` units, a trailing `\\sqrt` or `\\frac`).
    """
    text = answer.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    text = text.replace("tfrac", "frac").replace("dfrac", "frac")
    text = text.replace("\\left", "").replace("\\right", "")
    text = text.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "")
    if "\\text{ " in text:
        unit_split = text.split("\\text{ ")
        if len(unit_split) != 2:
            raise _Unnormalisable
        text = unit_split[0]
    text = text.replace("\\\\%", "").replace("\\%", "")
    text = text.replace(" .", " 0.").replace("{.", "{0.")
    if not text:
        return text
    if text.startswith("."):
        text = "0" + text
    sides = text.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        text = sides[1]
    text = _braced_sqrt(text)
    text = text.replace(" ", "")
    text = _braced_fracs(text)
    if text == "0.5":
        text = "\\frac{1}{2}"
    return _slash_fraction(text)


def math_answers_equal_as_verl(answer: str, reference: Any) -> bool:
    """verl's comparison: normalised strings equal, or the raw values equal where either cannot be normalised."""
    if reference is None:
        return False
    try:
        return normalize_as_verl(answer) == normalize_as_verl(reference)
    except (_Unnormalisable, AttributeError, TypeError):  # a reference that is not a string compares as is
        return bool(answer == reference)


def math_verl_score(solution_str: str, ground_truth: Any) -> float:
    """1.0 when the last box equals the reference as verl 0.9.1 compares them, else 0.0."""
    answer = last_box_as_verl(solution_str)
    return 1.0 if answer is not None and math_answers_equal_as_verl(answer, ground_truth) else 0.0
