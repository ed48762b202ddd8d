"""The rule-reward library (`custom_reward_function.path=pkg://relm.rewards.library`), by hand."""

from __future__ import annotations

import pytest

from relm.errors import UserError
from relm.rewards import library
from relm.rewards.custom import load_custom_reward, resolve_compute_score


@pytest.mark.parametrize(
    ("response", "reference", "expected"),
    [
        ("so it is \\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{3} then \\boxed{4}", "4", 1.0),  # the last box counts
        ("\\boxed{3} then \\boxed{4}", "3", 0.0),
        ("the answer is 4", "4", 0.0),  # no box, no score
        ("\\fbox{10\\text{ cm}}", "10", 1.0),
    ],
)
def test_boxed(response, reference, expected):
    assert library.boxed("any", response, reference) == expected


@pytest.mark.parametrize(
    ("response", "reference", "expected"),
    [
        ("6 * 3 = 18\n#### 18", "18", 1.0),
        ("#### 1,000", "1000", 1.0),
        ("#### 17\n#### 18", "18", 1.0),
        ("the answer is 18", "18", 0.0),  # strict: only after ####
    ],
)
def test_hash_answer(response, reference, expected):
    assert library.hash_answer("any", response, reference) == expected


@pytest.mark.parametrize(
    ("response", "reference", "expected"),
    [
        ("work\nAnswer: 18", "18", 1.0),
        ("Answer: 17\nno, wait\nAnswer: $18$.", "18", 1.0),  # the last line, dollars and a full stop dropped
        ("**Answer:** \\boxed{\\frac{3}{4}}", "0.75", 1.0),
        ("My answer: 18", "18", 0.0),  # the line must start with Answer:
        ("Answer: 17", "18", 0.0),
    ],
)
def test_answer_line(response, reference, expected):
    assert library.answer_line("any", response, reference) == expected


@pytest.mark.parametrize(
    ("response", "letter"),
    [
        ("The answer is (C).", "C"),
        ("I pick B) because", "B"),
        ("Answer: d", "D"),
        ("so \\boxed{E}", "E"),
        ("(A) looks wrong, (B) too, so\nC\n", "B"),  # a parenthesised option outranks a bare line
        ("no option named here", None),
    ],
)
def test_extract_choice(response, letter):
    assert library.extract_choice(response) == letter


def test_multiple_choice_and_its_reference_check():
    assert library.multiple_choice("any", "The answer is (C).", "C") == 1.0
    assert library.multiple_choice("any", "The answer is (C).", "(c)") == 1.0
    assert library.multiple_choice("any", "The answer is (C).", "B") == 0.0
    with pytest.raises(UserError, match=r"ground_truth '42' is not one option letter"):
        library.multiple_choice("any", "(C)", "42")


def test_math_verify_sees_equivalences_string_rules_miss():
    pytest.importorskip("math_verify")  # installed by `make test` (the `math` extra)
    assert library.math_verify("any", "so \\boxed{\\sqrt{8}}", "2\\sqrt{2}") == 1.0
    assert library.math_verify("any", "the result is $\\frac{6}{8}$", "0.75") == 1.0
    assert library.math_verify("any", "it is 3", "4") == 0.0


@pytest.mark.parametrize("name", ["boxed", "hash_answer", "answer_line", "multiple_choice", "math_verify"])
def test_each_entry_loads_by_its_config_name(name):
    function = load_custom_reward("pkg://relm.rewards.library", name)
    assert function is getattr(library, name)
    assert resolve_compute_score("pkg://relm.rewards.library", name) is function


def test_pkg_paths_name_what_is_wrong():
    with pytest.raises(UserError, match=r"cannot import module 'relm.rewards.no_such'"):
        load_custom_reward("pkg://relm.rewards.no_such", "boxed")
    with pytest.raises(UserError, match=r"defines no function 'boxd' \(functions: .*boxed"):
        load_custom_reward("pkg://relm.rewards.library", "boxd")
