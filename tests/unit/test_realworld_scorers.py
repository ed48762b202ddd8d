"""The gsm8k and math scorers on every row of the real GSM8K and MATH-500 files (../shared/realworld).

A scorer that fails a dataset's own reference answers punishes right responses in training; one that
passes a changed answer rewards wrong ones. Each row is scored both ways. The whole of GSM8K (8,792
rows) and MATH-500 takes under two seconds.
"""

from __future__ import annotations

import json
import re
from fractions import Fraction
from pathlib import Path

import pytest

from relm.rewards.registry import default_compute_score

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "realworld" / "data"


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        pytest.skip(f"{path} is absent: the real datasets live in ../shared/realworld beside the repository")
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_gsm8k_scorer_accepts_every_reference_solution_and_rejects_a_changed_number():
    rows = read_jsonl(DATA / "gsm8k" / "train.jsonl") + read_jsonl(DATA / "gsm8k" / "test.jsonl")
    assert len(rows) == 8792
    failures = []
    for index, row in enumerate(rows):
        solution = row["answer"]
        reference = solution.split("####")[-1].strip().replace(",", "")  # verl's preprocessing
        changed = re.sub(r"####.*$", f"#### {Fraction(reference) + 1}", solution, flags=re.S)
        right = default_compute_score("openai/gsm8k", solution, reference)
        wrong = default_compute_score("openai/gsm8k", changed, reference)
        if (right, wrong) != (1.0, 0.0):
            failures.append((index, reference, right, wrong))
    assert not failures, f"{len(failures)} rows scored wrong, first: {failures[:5]}"


def test_math_scorer_matches_the_reference_box_of_math500_rows_to_their_answer():
    from relm.rewards.math_reward import last_boxed_answer

    rows = read_jsonl(DATA / "math500" / "test.jsonl")
    assert len(rows) == 500
    missed = {}
    for row in rows:
        assert last_boxed_answer(row["solution"]) is not None  # every reference solution has a box
        if default_compute_score("HuggingFaceH4/MATH-500", row["solution"], row["answer"]) != 1.0:
            missed[row["unique_id"]] = row["answer"]
        # Minus the answer is another answer (the one negation no row's answer survives).
        negated = f"\\boxed{{-({row['answer']})}}"
        assert default_compute_score("HuggingFaceH4/MATH-500", negated, row["answer"]) == 0.0, row[
            "unique_id"
        ]
    # Issue 15 asks for 495 of 500; all 500 match (docs/algorithms.md would list any exception).
    assert not missed, f"{len(missed)} reference answers missed: {missed}"
