"""`openai/gsm8k` and the MATH sources score as verl 0.9.1 does by default; relm's own scorers keep their names.

The expected values are verl's (tests/parity/test_verl_scorers.py checks them against verl itself); here
they are written out so `make test` catches a change without verl installed.
"""

from __future__ import annotations

import pytest

from relm.rewards.library import gsm8k_numeric, math_normalized
from relm.rewards.registry import default_compute_score

LONG_TAIL = "\n" + "That is the answer. " * 20


@pytest.mark.parametrize(
    ("response", "reference", "verl_value", "numeric_value"),
    [
        ("so #### 72", "72", 1.0, 1.0),
        ("#### 72.0", "72", 0.0, 1.0),
        ("#### 072", "72", 0.0, 1.0),
        ("#### $72", "72", 0.0, 1.0),
        ("####72", "72", 0.0, 1.0),
        ("#### 72.", "72", 0.0, 1.0),
        ("#### 1,000", "1000", 1.0, 1.0),
        ("#### 72" + LONG_TAIL, "72", 0.0, 1.0),  # verl reads the last 300 characters
        ("#### 72", 72, 0.0, 1.0),  # a ground truth that is not a string never equals verl's string
        ("#### 71", "72", 0.0, 0.0),
    ],
)
def test_gsm8k_default_is_verls_and_gsm8k_numeric_compares_numbers(
    response, reference, verl_value, numeric_value
):
    assert default_compute_score("openai/gsm8k", response, reference) == verl_value
    assert gsm8k_numeric("openai/gsm8k", response, reference) == numeric_value


@pytest.mark.parametrize(
    "source", ["lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"]
)
@pytest.mark.parametrize(
    ("response", "reference", "verl_value", "normalized_value"),
    [
        ("\\boxed{\\frac{1}{2}}", "\\frac12", 1.0, 1.0),
        ("\\boxed{x = 5}", "5", 1.0, 1.0),
        ("\\boxed{3.0}", "3", 0.0, 1.0),
        ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", 0.0, 1.0),
        ("\\boxed{1,000}", "1000", 0.0, 1.0),
        ("\\boxed{5.}", "5", 0.0, 1.0),
        ("\\boxed{10\\text{cm}}", "10", 0.0, 1.0),
        ("\\boxed{10\\text{ cm}}", "10", 1.0, 1.0),
        ("\\fbox{5}", "5", 0.0, 1.0),
        ("\\boxed{\\\\frac{1}{2}}", "\\frac{1}{2}", 1.0, 0.0),  # escaped LaTeX
        ("\\boxed{\\leftarrow}", "arrow", 1.0, 0.0),
        ("\\boxed{\\sqrt}", "\\sqrt", 1.0, 1.0),  # verl's normaliser fails: raw strings compared
        ("\\boxed 5$ then \\boxed{6}", "5", 1.0, 0.0),  # a spaced box anywhere wins in verl
        ("\\boxed{6}", "5", 0.0, 0.0),
    ],
)
def test_math_default_is_verls_and_math_normalized_is_relms(
    source, response, reference, verl_value, normalized_value
):
    assert default_compute_score(source, response, reference) == verl_value
    assert math_normalized(source, response, reference) == normalized_value
