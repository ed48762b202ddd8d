"""relm's rule scorers against verl 0.9.1's `default_compute_score`, data source by data source.

- `math_dapo`, `math`, `math_dapo_reasoning`, `aime*`: the same dict (score +1/-1, acc, pred) for every
  response, exactly.
- `openai/gsm8k` and the MATH sources: relm is more forgiving on purpose (docs/algorithms.md). Whatever
  verl scores 1, relm scores 1; a wrong answer scores 0 in both; every documented leniency is shown by
  an example where verl gives 0 and relm 1.

Responses come from the real GSM8K and MATH-500 files where ../shared holds them, and from built-in
pieces otherwise; empty responses and responses longer than verl's 300-character window are included.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
from pathlib import Path

import pytest

from relm.rewards.registry import default_compute_score

pytestmark = pytest.mark.verl

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "realworld" / "data"

BUILT_IN_MATH = [
    ("so the answer is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
    ("\\boxed{x = 5}", "5"),
    ("\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
    ("It is \\boxed{\\text{Monday}}", "\\text{Monday}"),
    ("\\boxed{10\\text{ cm}}", "10"),
    ("\\boxed{(3, \\frac{\\pi}{2})}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
]
DAPO_SOURCES = ["math_dapo", "math", "math_dapo_reasoning", "aime2024", "aime_2025"]


def math500() -> list[tuple[str, str]]:
    """(reference solution, answer) of every MATH-500 row, or the built-in pairs without ../shared."""
    path = DATA / "math500" / "test.jsonl"
    if not path.is_file():
        return BUILT_IN_MATH
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [(row["solution"], row["answer"]) for row in rows]


def gsm8k() -> list[tuple[str, str]]:
    """(reference solution, ground truth as verl's preprocessing writes it) of GSM8K rows."""
    path = DATA / "gsm8k" / "test.jsonl"
    if not path.is_file():
        return [("48 + 24 = 72\n#### 72", "72"), ("1,200 * 5 = 6,000\n#### 6,000", "6000"), ("#### -2", "-2")]
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [(row["answer"], row["answer"].split("####")[-1].strip().replace(",", "")) for row in rows]


def verl_score(verl, data_source: str, response: str, reference: str):
    with contextlib.redirect_stdout(io.StringIO()):  # verl's math_reward prints what fails to parse
        return verl.reward_score.default_compute_score(data_source, response, reference)


def dapo_responses(solution: str, answer: str, wrong: str, rng: random.Random) -> list[str]:
    """Ways a model answers under the DAPO prompt (`Answer: ...` on the last line), right and wrong."""
    filler = " ".join(rng.choice(["so", "then", "x = 3", "$y$", "\\frac{1}{2}", "we get"]) for _ in range(80))
    return [
        "",
        solution,
        f"Answer: {answer}",
        f"{solution}\nAnswer: {answer}",
        f"Answer: {wrong}",
        f"answer :  {answer}\n",
        f"Answer: $x = {answer}$",
        f"Answer: {answer} dollars",
        f"\\boxed{{{answer}}}",
        f"{filler} \\boxed{{{answer}}}",  # the box within the last 100 characters
        f"\\boxed{{{answer}}} {filler}",  # the box outside them
        f"Answer: {answer}\n{filler}",  # the answer line beyond the last 300 characters
        f"Answer: {answer}\nAnswer: {wrong}",  # the last answer line counts
    ]


def test_dapo_sources_score_exactly_as_verl(verl):
    rng = random.Random(0)
    pairs = math500() + gsm8k()[:300]
    compared = 0
    for index, (solution, answer) in enumerate(pairs):
        wrong = pairs[(index + 1) % len(pairs)][1]
        source = DAPO_SOURCES[index % len(DAPO_SOURCES)]
        for response in dapo_responses(solution, answer, wrong, rng):
            expected = verl_score(verl, source, response, answer)
            assert default_compute_score(source, response, answer) == expected, (source, response, answer)
            compared += 1
    assert compared >= 13 * len(pairs)


def test_dapo_strict_box_verify_matches_verl(verl):
    from relm.rewards.math_dapo import math_dapo_score

    for solution, answer in math500():
        for response in (solution, f"\\boxed{{{answer}}}", f"Answer: {answer}"):
            expected = verl.math_dapo.compute_score(response, answer, strict_box_verify=True)
            assert math_dapo_score(response, answer, strict_box_verify=True) == expected


def math_variants(answer: str) -> list[str]:
    """The same answer written as models write it."""
    return [
        answer,
        answer.replace("\\frac", "\\dfrac"),
        answer.replace(" ", ""),
        answer.replace(",", ", "),
        f"x = {answer}",
        f"{answer}.",
        answer.replace("\\left", "").replace("\\right", ""),
    ]


@pytest.mark.parametrize(
    "source", ["lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"]
)
def test_math_scorer_accepts_whatever_verl_accepts_and_rejects_wrong_answers(verl, source):
    pairs = math500()
    accepted_by_verl = 0
    for solution, answer in pairs:
        responses = [solution] + [f"so \\boxed{{{variant}}}" for variant in math_variants(answer)]
        for response in responses:
            if verl_score(verl, source, response, answer) == 1.0:
                accepted_by_verl += 1
                assert default_compute_score(source, response, answer) == 1.0, (response, answer)
        wrong = f"\\boxed{{-({answer})}}"  # minus the answer (a digit added would be read as a unit's)
        assert verl_score(verl, source, wrong, answer) == 0.0
        assert default_compute_score(source, wrong, answer) == 0.0, (wrong, answer)
    assert accepted_by_verl >= len(pairs)  # at least the reference solutions


@pytest.mark.parametrize(
    ("answer", "reference"),
    [
        ("3.0", "3"),  # compared as numbers
        ("2/4", "\\frac{1}{2}"),
        ("1,000", "1000"),
        ("1\\,000", "1000"),  # thin spaces
        ("\\$18.00", "18"),
        ("$5$", "5"),
        ("\\text{(A)}", "(A)"),  # a whole-answer \text
        ("\\theta = 30^\\circ", "30"),  # any single variable before `=`, not only two characters
        ("\\displaystyle\\frac{\\pi}{2}", "\\frac{\\pi}{2}"),
    ],
)
def test_math_leniency_documented_in_algorithms_md(verl, answer, reference):
    response = f"\\boxed{{{answer}}}"
    assert verl_score(verl, "lighteval/MATH", response, reference) == 0.0
    assert default_compute_score("lighteval/MATH", response, reference) == 1.0


def test_math_where_verl_is_more_forgiving_by_accident(verl):
    # verl deletes `\left` inside `\leftarrow`; relm removes only the sizing commands.
    assert verl_score(verl, "lighteval/MATH", "\\boxed{\\leftarrow}", "arrow") == 1.0
    assert default_compute_score("lighteval/MATH", "\\boxed{\\leftarrow}", "arrow") == 0.0


def gsm8k_responses(solution: str, reference: str) -> list[str]:
    body = solution.rsplit("####", 1)[0]
    return [
        "",
        solution,
        f"{body}#### {reference}",
        f"{body}#### {int(reference) + 1}",  # a wrong number
        f"{body}The answer is {reference}.",  # no ####: strict gives nothing
        f"{body}#### {reference}\n" + "and that is all. " * 30,  # beyond verl's 300 characters
    ]


@pytest.mark.parametrize("method", ["strict", "flexible"])
def test_gsm8k_scorer_accepts_whatever_verl_accepts(verl, method):
    from relm.rewards.registry import gsm8k_score

    for solution, reference in gsm8k():
        for response in gsm8k_responses(solution, reference):
            verl_value = verl.gsm8k.compute_score(response, reference, method=method)
            relm_value = gsm8k_score(response, reference, method=method)
            if verl_value == 1.0:
                assert relm_value == 1.0, (response, reference)
        wrong = f"{solution.rsplit('####', 1)[0]}#### {int(reference) + 1}"
        assert verl.gsm8k.compute_score(wrong, reference, method=method) == 0.0
        assert gsm8k_score(wrong, reference, method=method) == 0.0


@pytest.mark.parametrize(
    "response",
    [
        "#### 72.0",  # compared as numbers
        "#### 72.",  # a full stop after the number
        "#### $72",  # a dollar sign
        "####72",  # no space after ####
        "####  72",
        "#### 72\n" + "That is the answer. " * 20,  # verl reads only the last 300 characters
    ],
)
def test_gsm8k_leniency_documented_in_algorithms_md(verl, response):
    assert verl_score(verl, "openai/gsm8k", response, "72") == 0.0
    assert default_compute_score("openai/gsm8k", response, "72") == 1.0
