"""The `math` boxed-answer scorer and the gsm8k scorer, against answers worked out by hand."""

from __future__ import annotations

import time
from fractions import Fraction

import pytest

from relm.rewards.math_reward import (
    as_number,
    last_boxed_answer,
    math_answers_equal,
    math_score,
    normalize_math_answer,
)
from relm.rewards.registry import default_compute_score, extract_gsm8k_answer, gsm8k_score

# --- extracting the boxed answer -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so the answer is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("first \\boxed{1}, on reflection \\boxed{2}", "2"),  # the last box is the answer
        ("\\boxed{\\sqrt{\\frac{a}{b}}} done", "\\sqrt{\\frac{a}{b}}"),  # nested braces stay balanced
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),  # escaped braces pair up too
        ("$\\boxed 5$", "5"),  # argument without braces
        ("\\fbox{7}", "7"),
        ("the answer is 7", None),
        ("\\boxed{1} and then \\boxed{3", None),  # cut off inside the last box: no answer
        ("\\boxed", None),
    ],
)
def test_last_boxed_answer(text, expected):
    assert last_boxed_answer(text) == expected


# --- normalisation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("\\left( 1, 2 \\right)", "(1,2)"),
        ("\\leftarrow", "\\leftarrow"),  # only the sizing commands go
        ("\\dfrac{3}{4}", "\\frac{3}{4}"),
        ("\\tfrac12", "\\frac{1}{2}"),
        ("\\frac1{2}", "\\frac{1}{2}"),
        ("\\frac{1}2", "\\frac{1}{2}"),
        ("\\sqrt3", "\\sqrt{3}"),
        ("10\\text{ cm}", "10"),
        ("5 \\mbox{inches}^2", "5"),
        ("\\text{(B)}", "(B)"),  # a whole-answer \text is the answer, not a unit
        ("x = 3", "3"),
        ("x_1=-2", "-2"),
        ("\\theta = 30^\\circ", "30"),
        ("f(x)=3", "f(x)=3"),  # not a bare variable: kept
        ("$18.$", "18"),
        ("\\$1{,}000", "1000"),
        ("1,000,000.5", "1000000.5"),
        ("1,2", "1,2"),  # not a thousands separator: a pair
        ("50\\%", "50"),
        ("2\\!\\cdot\\!3", "2\\cdot3"),
        ("1\\,000", "1000"),
        ("\\displaystyle\\frac{\\pi}{2}", "\\frac{\\pi}{2}"),
    ],
)
def test_normalize_math_answer(raw, expected):
    assert normalize_math_answer(raw) == expected


def test_as_number_is_exact():
    assert as_number("0.5") == Fraction(1, 2)
    assert as_number("1/2") == Fraction(1, 2)
    assert as_number("\\frac{3}{4}") == Fraction(3, 4)
    assert as_number("-\\frac{3}{4}") == Fraction(-3, 4)
    assert as_number("\\frac{0.5}{2}") == Fraction(1, 4)
    assert as_number("-7") == -7
    assert as_number("\\frac{x}{2}") is None
    assert as_number("\\frac{1}{0}") is None and as_number("1/0") is None
    assert as_number("inf") is None and as_number("nan") is None
    assert as_number("(1,2)") is None


@pytest.mark.parametrize(
    ("answer", "reference", "equal"),
    [
        ("0.5", "\\frac{1}{2}", True),
        ("1/2", "\\dfrac12", True),
        ("0.50", "1/2", True),
        ("\\frac{2}{4}", "0.5", True),  # the same number, whatever the form
        ("x=3", "3", True),
        ("3.0", "3", True),
        ("\\$18.00", "18", True),
        ("(1, 2)", "\\left(1,2\\right)", True),
        ("\\text{(A)}", "(A)", True),
        ("10\\text{ cm}", "10", True),
        ("\\frac{1}{3}", "0.33", False),  # exact comparison, no tolerance
        ("2", "3", False),
        ("\\sqrt{2}", "\\sqrt{3}", False),
        ("(1,2)", "[1,2]", False),
        # A row break is not a space: spaced or not, the same matrix (removing `\\ ` once ate it).
        ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", True),
        ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} 12 \\end{pmatrix}", False),
        ("x = \\text{Monday}", "\\text{Monday}", True),  # the text is the answer, not a unit after `=`
        ("x = 5\\text{ cm}", "5", True),
        ("x = \\text{Monday}", "\\text{Tuesday}", False),
    ],
)
def test_math_answers_equal(answer, reference, equal):
    assert math_answers_equal(answer, reference) is equal


def test_math_score_reads_the_last_box():
    assert math_score("Half of 1 is \\boxed{\\dfrac{1}{2}}.", "0.5") == 1.0
    assert math_score("It is \\boxed{2}. No wait, \\boxed{3}.", "3") == 1.0
    assert math_score("It is \\boxed{3}. No wait, \\boxed{2}.", "3") == 0.0
    assert math_score("The answer is 3.", "3") == 0.0  # unboxed answers do not count
    # A reference holding a whole worked solution is reduced to its box.
    assert math_score("\\boxed{4}", "2 + 2 = \\boxed{4}") == 1.0


@pytest.mark.parametrize(
    "source", ["lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"]
)
def test_math_sources_dispatch_to_the_boxed_scorer(source):
    assert default_compute_score(source, "so \\boxed{x = 5}", "5") == 1.0
    assert default_compute_score(source, "so \\boxed{6}", "5") == 0.0


@pytest.mark.parametrize("source", ["math", "math_dapo", "math_dapo_reasoning", "aime2024", "aime25"])
def test_dapo_sources_score_plus_or_minus_one_as_verl_0_9_1(source):
    # verl 0.9.1 routes these to its DAPO scorer: the `Answer:` line first, +1 right and -1 wrong.
    assert default_compute_score(source, "so\nAnswer: x = 5", "5") == {"score": 1.0, "acc": True, "pred": "5"}
    assert default_compute_score(source, "Answer: 6", "5")["score"] == -1.0
    # No `Answer:` line: the last box, compared character for character with the reference.
    assert default_compute_score(source, "so \\boxed{5}", "5")["score"] == 1.0
    assert default_compute_score(source, "so \\boxed{x = 5}", "5")["score"] == -1.0
    assert default_compute_score(source, "no answer", "5") == {
        "score": -1.0,
        "acc": False,
        "pred": "[INVALID]",
    }


# --- gsm8k (verl: strict reads the number after ####, flexible the last number) -----------------------


def test_gsm8k_follows_verl_semantics():
    response = "Natalia sold 48/2 = 24 clips in May.\n48 + 24 = 72\n#### 72"
    assert gsm8k_score(response, "72") == 1.0
    assert gsm8k_score(response, "73") == 0.0
    assert gsm8k_score(response, "73", format_score=0.1) == 0.1  # right format, wrong number
    assert gsm8k_score("48 + 24 = 72", "72", format_score=0.1) == 0.0  # no #### at all: nothing
    assert gsm8k_score("48 + 24 = 72", "72", method="flexible") == 1.0
    assert gsm8k_score(response, "72", score=2.0) == 2.0


def test_gsm8k_answer_forms_by_hand():
    assert extract_gsm8k_answer("#### 1,234.") == "1234"  # thousands comma and full stop dropped
    assert extract_gsm8k_answer("####-$5") == "-5"
    assert extract_gsm8k_answer("#### . and no number") is None
    assert extract_gsm8k_answer("The answer is 42.", method="flexible") == "42"  # not "42."
    assert extract_gsm8k_answer("1, 2, 3 ...", method="flexible") == "3"
    assert extract_gsm8k_answer("no digits here...", method="flexible") is None
    # Exact comparison: as floats these two are the same number.
    assert gsm8k_score("#### 10000000000000001", "10000000000000000") == 0.0
    assert gsm8k_score("#### 0.50", "0.5") == 1.0


def test_gsm8k_extraction_is_linear_on_degenerate_responses():
    # The old pattern took ~4 s on 32k dots (quadratic); 200k must stay far below a second.
    for text in ("." * 200_000, "#### " + ",$" * 100_000, "1" + "." * 200_000):
        start = time.perf_counter()
        extract_gsm8k_answer(text, method="flexible")
        extract_gsm8k_answer(text, method="strict")
        assert time.perf_counter() - start < 0.5


# --- math_dapo (verl 0.9.1's DAPO scorer, reproduced rule for rule) ---------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("x = \\$1,000 \\text{ dollars}", "1000"),  # what follows the last `=`, dollars, units, commas
        ("\\frac12", "\\frac{1}{2}"),
        ("\\sqrt3", "\\sqrt{3}"),
        ("5 \\text{cm}", "5"),
        ("\\boxed{7}", "7"),
        ("a square", ""),  # `a ` and `square` both go: filler words, as in Minerva
    ],
)
def test_dapo_normalization_by_hand(raw, expected):
    from relm.rewards.math_dapo import normalize_final_answer

    assert normalize_final_answer(raw) == expected


def test_dapo_score_reads_only_the_end_of_the_response():
    from relm.rewards.math_dapo import math_dapo_score

    assert math_dapo_score("Answer: 5" + " " * 300, "5")["score"] == -1.0  # beyond the last 300 characters
    assert math_dapo_score("\\boxed{5}" + "." * 91, "5")["score"] == 1.0  # the box ends the last 100
    assert math_dapo_score("\\boxed{5}" + "." * 92, "5")["score"] == -1.0  # its backslash is cut off
    assert math_dapo_score("Answer: 4\nAnswer: 5", "5")["acc"] is True  # the last answer line counts
    # The answer line wins over a box, and a box inside it is unwrapped into it, as in verl.
    assert math_dapo_score("Answer: 5 \\boxed{4}", "5") == {"score": -1.0, "acc": False, "pred": "54"}
    assert math_dapo_score("\\boxed{x=5}", "5", strict_box_verify=True) == {
        "score": -1.0,
        "acc": False,
        "pred": "x=5",
    }
