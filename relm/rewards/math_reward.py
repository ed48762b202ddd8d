"""relm's MATH scorer (`custom_reward_function.name=math_normalized`): the last `\\boxed{...}` against the reference.

The MATH data sources score as verl does by default (relm/rewards/hendrycks_math.py); this scorer is the
more careful one, and `boxed`, `answer_line` in relm/rewards/library.py compare with it.

MATH-style references are short LaTeX answers (`\\frac{1}{2}`, `10\\text{ cm}`, `x=3`), and models write
the same value many ways. Both sides are normalised (spacing, `\\left`/`\\right`, dollars, units,
`\\dfrac`, `x=` prefixes) and then compared as strings, or as exact rationals when both read as numbers,
so `0.5`, `1/2` and `\\frac{1}{2}` agree without floating-point tolerance.

math-verify is not consulted here, installed or not: a score must not change with what happens to be
installed, and math-verify calls `\\boxed{-(x=5)}` equal to `x=5` (MATH-500's test/algebra/2193). Its
symbolic checks are one config away instead: `custom_reward_function.path=pkg://relm.rewards.library
custom_reward_function.name=math_verify` (relm/rewards/library.py).
"""

from __future__ import annotations

import re
from fractions import Fraction

_BOX_COMMANDS = ("\\boxed", "\\fbox")

# Thin and wide spaces (`\!`, `\,`, `\;`, `\:`, `\ `, `\quad`, `\qquad`), read left to right so that the
# row break `\\` is kept whole: removing `\ ` from `1 \\ 2` would leave `1 \2`, which no longer equals
# `1\\2`, the same matrix written without spaces.
_SPACING = re.compile(r"\\\\|\\(?:[!,;: ]|qquad(?![a-zA-Z])|quad(?![a-zA-Z]))")

_REMOVED = (
    "\\displaystyle",
    "^{\\circ}",
    "^\\circ",
    "\\$",
    "$",
    "\\%",
    "%",
)
"""Display style, degree signs, dollars and percent signs carry no value: dropped on both sides."""

# `\left(` but not `\leftarrow`: only the sizing commands, never a longer command name.
_SIZING = re.compile(r"\\(?:left|right)(?![a-zA-Z])")
# A trailing unit such as `\text{ cm}` or `\mbox{inches}^2`, after something that is the value.
_TRAILING_UNIT = re.compile(
    r"(?<=\S)\s*\\(?:text|textrm|textbf|mbox|mathrm)\{\s*[a-zA-Z][a-zA-Z .]*\}(?:\^\{?\d\}?)?$"
)
_TEXT_WRAPPER = re.compile(r"\\(?:text|textrm|textbf|mbox|mathrm)\{([^{}]*)\}")
# `x=3`, `x_1=3`, `\theta=30`: a single variable name on the left of the only `=`.
_VARIABLE_PREFIX = re.compile(r"^(?:[a-zA-Z]|\\[a-zA-Z]+)(?:_\{?\w+\}?)?\s*=(?!=)\s*")
_FRAC_FIRST = re.compile(r"\\frac(?!\{)([0-9a-zA-Z])")
_FRAC_SECOND = re.compile(r"(\\frac\{[^{}]*\})(?!\{)([0-9a-zA-Z])")
_SQRT = re.compile(r"\\sqrt(?!\{)([0-9a-zA-Z])")
_THOUSANDS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_FRAC_NUMBER = re.compile(r"^([+-]?)\\frac\{([^{}]+)\}\{([^{}]+)\}$")


def last_boxed_answer(text: str) -> str | None:
    """Contents of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, braces balanced.

    `\\boxed 5` (argument without braces) gives the token after the space. None when there is no box,
    or when the last one is never closed: a response cut off inside its answer has not answered.
    """
    start = max(text.rfind(command) for command in _BOX_COMMANDS)
    if start < 0:
        return None
    command = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    rest = text[start + len(command) :]
    if rest.startswith(" "):
        match = re.match(r" +([^\s$]+)", rest)
        return match.group(1) if match else None
    if not rest.startswith("{"):
        return None
    depth = 0
    for position, char in enumerate(rest):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return rest[1:position]
    return None


def normalize_math_answer(answer: str) -> str:
    """A canonical string for a short LaTeX answer, so that equal answers written differently compare equal.

    Example: `$x = \\dfrac{1}{2}\\text{ cm}.$` and `\\frac12` both give `\\frac{1}{2}`.
    """
    text = answer.strip().replace("\n", "").replace("{,}", ",")
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = _SIZING.sub("", text)
    text = _SPACING.sub(lambda match: match.group() if match.group() == "\\\\" else "", text)
    for token in _REMOVED:
        text = text.replace(token, "")
    text = text.strip().rstrip(".")
    # Before the units: in `x = \text{Monday}` the text is the answer, not a unit after `=`.
    if text.count("=") == 1:
        text = _VARIABLE_PREFIX.sub("", text)
    text = _TRAILING_UNIT.sub("", text)
    text = _TEXT_WRAPPER.sub(r"\1", text)
    text = re.sub(r"\s+", "", text)
    text = _FRAC_FIRST.sub(r"\\frac{\1}", text)
    text = _FRAC_SECOND.sub(r"\1{\2}", text)
    text = _SQRT.sub(r"\\sqrt{\1}", text)
    if _THOUSANDS.match(text):
        text = text.replace(",", "")
    return text.rstrip(".")


def as_number(normalized: str) -> Fraction | None:
    """The exact value of a normalised answer that is a number, else None.

    Numbers are `3`, `-0.25`, `1/2` and `\\frac{3}{4}` (integer or decimal parts); `\\frac{x}{2}` is not.
    """
    match = _FRAC_NUMBER.match(normalized)
    if match:
        sign, numerator, denominator = match.groups()
        top, bottom = _plain_number(numerator), _plain_number(denominator)
        if top is None or bottom is None or bottom == 0:
            return None
        return -top / bottom if sign == "-" else top / bottom
    return _plain_number(normalized)


def _plain_number(text: str) -> Fraction | None:
    try:
        return Fraction(text)  # integers, decimals, `a/b`, exponents; never inf or nan
    except (ValueError, ZeroDivisionError):
        return None


def math_answers_equal(answer: str, reference: str) -> bool:
    """Whether two answers agree after normalisation, as strings or as exact numbers."""
    left, right = normalize_math_answer(answer), normalize_math_answer(reference)
    if left == right:
        return True
    left_value, right_value = as_number(left), as_number(right)
    return left_value is not None and right_value is not None and left_value == right_value


def math_score(solution_str: str, ground_truth: str) -> float:
    """1.0 when the response's last boxed answer equals the reference, else 0.0.

    A reference that itself holds a `\\boxed{}` (a whole worked solution) is reduced to its box first.
    """
    answer = last_boxed_answer(solution_str)
    if answer is None:
        return 0.0
    reference = str(ground_truth)
    if any(command in reference for command in _BOX_COMMANDS):
        reference = last_boxed_answer(reference) or reference
    return 1.0 if math_answers_equal(answer, reference) else 0.0
