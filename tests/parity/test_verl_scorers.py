"""relm's rule scorers against verl 0.9.1's `default_compute_score`, data source by data source.

- `math_dapo`, `math`, `math_dapo_reasoning`, `aime*`: the same dict (score +1/-1, acc, pred) for every
  response, exactly.
- `openai/gsm8k` and the MATH sources: the same score for every response, exactly, over the real rows,
  their usual rewritings and the edge cases where relm's own scorers differ. relm's more forgiving
  scorers (`gsm8k_numeric`, `math_normalized`, docs/rewards.md) are shown to differ on each documented
  case.

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
    """The same answer written as models write it, and the edge cases where relm's own normaliser differs."""
    return [
        answer,
        answer.replace("\\frac", "\\dfrac"),
        answer.replace(" ", ""),
        answer.replace(",", ", "),
        f"x = {answer}",
        f"{answer}.",
        f"{answer}\\text{{ cm}}",
        answer.replace("\\left", "").replace("\\right", ""),
        answer.replace("\\", "\\\\"),  # escaped LaTeX
    ]


MATH_SOURCES = ["lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"]

MATH_EDGE_CASES = [
    ("\\boxed{3.0}", "3"),
    ("\\boxed{2/4}", "\\frac{1}{2}"),
    ("\\boxed{1/2}", "\\frac{1}{2}"),
    ("\\boxed{0.5}", "\\frac{1}{2}"),
    ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}"),
    ("\\boxed{1,000}", "1000"),
    ("\\boxed{1\\,000}", "1000"),
    ("\\boxed{\\$18.00}", "18"),
    ("\\boxed{10\\text{ cm}}", "10"),
    ("\\boxed{10\\text{cm}}", "10"),
    ("\\boxed{10\\text{ cm}\\text{ m}}", "10"),
    ("\\boxed{5.}", "5"),
    ("\\fbox{5}", "5"),
    ("\\boxed 5$ and more", "5"),
    ("\\boxed 5 \\boxed{6}", "6"),
    ("\\boxed{\\\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{\\leftarrow}", "arrow"),
    ("\\boxed{\\theta = 30^\\circ}", "30"),
    ("\\boxed{k = 3}", "3"),
    ("\\boxed{\\sqrt3}", "\\sqrt{3}"),
    ("\\boxed{\\sqrt}", "\\sqrt"),
    ("\\boxed{\\frac12}", "\\frac{1}{2}"),
    ("\\boxed{\\frac1}", "\\frac{1}{}"),
    ("\\boxed{.5}", "0.5"),
    ("\\boxed{50\\%}", "50"),
    ("\\boxed{\\text{(A)}}", "(A)"),
    ("\\boxed{5", "5"),
    ("\\boxed{5}", 5),
    ("no box", "5"),
    ("", ""),
]


@pytest.mark.parametrize("source", MATH_SOURCES)
def test_math_sources_score_exactly_as_verl(verl, source):
    pairs = math500()
    compared = 0
    for index, (solution, answer) in enumerate(pairs):
        wrong = pairs[(index + 1) % len(pairs)][1]
        responses = [solution, f"so \\boxed{{{wrong}}}", f"\\fbox{{{answer}}}"]
        responses += [f"so \\boxed{{{variant}}}" for variant in math_variants(answer)]
        for response in responses:
            expected = verl_score(verl, source, response, answer)
            assert default_compute_score(source, response, answer) == expected, (response, answer)
            compared += 1
    for response, reference in MATH_EDGE_CASES:
        expected = verl_score(verl, source, response, reference)
        assert default_compute_score(source, response, reference) == expected, (response, reference)
    assert compared >= 12 * len(pairs)


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
def test_math_normalized_leniency_documented_in_rewards_md(verl, answer, reference):
    from relm.rewards.library import math_normalized

    response = f"\\boxed{{{answer}}}"
    assert verl_score(verl, "lighteval/MATH", response, reference) == 0.0
    assert default_compute_score("lighteval/MATH", response, reference) == 0.0
    assert math_normalized("lighteval/MATH", response, reference) == 1.0


@pytest.mark.parametrize(
    ("response", "reference"),
    [("\\boxed{\\leftarrow}", "arrow"), ("\\boxed{\\\\frac{1}{2}}", "\\frac{1}{2}")],
)
def test_math_where_verl_is_more_forgiving_than_math_normalized(verl, response, reference):
    from relm.rewards.library import math_normalized

    # verl deletes `\left` inside `\leftarrow` and reads `\\` as `\`; relm's own normaliser does neither.
    assert verl_score(verl, "lighteval/MATH", response, reference) == 1.0
    assert default_compute_score("lighteval/MATH", response, reference) == 1.0
    assert math_normalized("lighteval/MATH", response, reference) == 0.0


GSM8K_EDGE_CASES = [
    "#### 72",
    "#### 72.0",
    "#### 072",
    "#### $72",
    "####72",
    "####  72",
    "#### 72.",
    "#### 7,2",
    "#### -72",
    "The answer is 72.",
    "72 . . .",
    ". . .",
    "#### 72\n" + "That is the answer. " * 20,  # beyond verl's last 300 characters
    "x" * 299 + "#### 72",
    "",
]


def gsm8k_responses(solution: str, reference: str) -> list[str]:
    body = solution.rsplit("####", 1)[0]
    return [
        "",
        solution,
        f"{body}#### {reference}",
        f"{body}#### {int(reference) + 1}",  # a wrong number
        f"{body}#### {reference}.0",
        f"{body}#### ${reference}",
        f"{body}####{reference}",
        f"{body}The answer is {reference}.",  # no ####: strict gives nothing
        f"{body}#### {reference}\n" + "and that is all. " * 30,  # beyond verl's 300 characters
    ]


def test_gsm8k_source_scores_exactly_as_verl(verl):
    compared = 0
    for solution, reference in gsm8k():
        for response in gsm8k_responses(solution, reference):
            expected = verl_score(verl, "openai/gsm8k", response, reference)
            assert default_compute_score("openai/gsm8k", response, reference) == expected, (
                response,
                reference,
            )
            compared += 1
    for response in GSM8K_EDGE_CASES:
        for reference in ("72", "-72", 72):
            expected = verl_score(verl, "openai/gsm8k", response, reference)
            assert default_compute_score("openai/gsm8k", response, reference) == expected, (
                response,
                reference,
            )
    assert compared >= 9 * len(gsm8k())


@pytest.mark.parametrize("method", ["strict", "flexible"])
def test_gsm8k_methods_score_exactly_as_verl(verl, method):
    from relm.rewards.gsm8k_reward import gsm8k_verl_score

    for solution, reference in gsm8k()[:500]:
        for response in gsm8k_responses(solution, reference):
            expected = verl.gsm8k.compute_score(response, reference, method=method)
            assert gsm8k_verl_score(response, reference, method=method) == expected, (response, reference)
    for response in GSM8K_EDGE_CASES:
        expected = verl.gsm8k.compute_score(response, "72", method=method, format_score=0.1)
        assert gsm8k_verl_score(response, "72", method=method, format_score=0.1) == expected, response


@pytest.mark.parametrize(
    "response",
    [
        "#### 72.0",  # compared as numbers
        "#### 072",
        "#### 72.",  # a full stop after the number
        "#### $72",  # a dollar sign
        "####72",  # no space after ####
        "####  72",
        "#### 72\n" + "That is the answer. " * 20,  # verl reads only the last 300 characters
    ],
)
def test_gsm8k_numeric_leniency_documented_in_rewards_md(verl, response):
    from relm.rewards.library import gsm8k_numeric

    assert verl_score(verl, "openai/gsm8k", response, "72") == 0.0
    assert default_compute_score("openai/gsm8k", response, "72") == 0.0
    assert gsm8k_numeric("openai/gsm8k", response, "72") == 1.0
