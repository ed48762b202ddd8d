"""Calling a scoring function on rows and judging what came back, in a worker process or in-process.

Each response ends as one `Outcome`: a score with its extra numbers, or a failure of one kind
(`error`: the function raised or returned something that is not a number; `non_finite`: it returned
NaN or an infinity; `timeout`: set by the pool, never here). A failure costs the one response, not the
run: the reward manager scores it a stated default and counts it. A `UserError` (an unknown
data_source in the built-in dispatch) is the user's configuration, not flaky code, so it is kept apart
and ends the run.

This module is what a reward worker imports: it must stay free of torch and transformers, whose
import would cost every worker seconds and hundreds of MB.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from relm.errors import UserError

OutcomeKind = Literal["ok", "error", "non_finite", "timeout", "user_error"]
FAILURE_METRICS = ("timeouts", "errors", "non_finite")
"""Metric names (`reward/<name>`) of the three counted failures."""


@dataclass(frozen=True)
class Row:
    """One response and its prompt row's fields, as the scoring function takes them."""

    index: int
    data_source: str
    solution_str: str
    ground_truth: Any
    extra_info: Any


@dataclass(frozen=True)
class Outcome:
    """What scoring one response gave."""

    kind: OutcomeKind
    score: float = 0.0
    """The score when `kind == "ok"`."""
    extra: dict[str, float] = field(default_factory=dict)
    """Other numbers the function returned in its dict (`ok` only)."""
    reason: str = ""
    """What went wrong, one line (failures only)."""

    @property
    def metric(self) -> str | None:
        """`timeouts`, `errors` or `non_finite` for a counted failure, else None."""
        return {"timeout": "timeouts", "error": "errors", "non_finite": "non_finite"}.get(self.kind)


def score_rows(
    function: Callable[..., Any], rows: Sequence[Row], batched: bool
) -> Iterator[tuple[int, Outcome]]:
    """Score `rows` with `function`, yielding (row index, outcome) in order as each is done.

    Per-response functions (verl's `naive`/`dapo` managers) are called once a row with verl's keyword
    arguments; a batched one (verl's `batch` manager) once for all rows with the plural names, and
    must return one value per row.
    """
    if not batched:
        for row in rows:
            try:
                value = function(
                    data_source=row.data_source,
                    solution_str=row.solution_str,
                    ground_truth=row.ground_truth,
                    extra_info=row.extra_info,
                )
            except UserError as exc:
                yield row.index, Outcome("user_error", reason=str(exc))
                continue
            except Exception as exc:  # noqa: BLE001 - the user's code may raise anything; it is counted
                yield row.index, Outcome("error", reason=f"raised {_one_line(exc)}")
                continue
            yield row.index, judge(value)
        return
    try:
        values = function(
            data_sources=[row.data_source for row in rows],
            solution_strs=[row.solution_str for row in rows],
            ground_truths=[row.ground_truth for row in rows],
            extra_infos=[row.extra_info for row in rows],
        )
    except UserError as exc:
        yield from ((row.index, Outcome("user_error", reason=str(exc))) for row in rows)
        return
    except Exception as exc:  # noqa: BLE001
        failed = Outcome("error", reason=f"raised {_one_line(exc)} (batched call)")
        yield from ((row.index, failed) for row in rows)
        return
    if not isinstance(values, Sequence) or isinstance(values, str | bytes) or len(values) != len(rows):
        size = f"{type(values).__name__} of {len(values)}" if hasattr(values, "__len__") else _shown(values)
        failed = Outcome(
            "error", reason=f"returned {size} for {len(rows)} responses (one value each expected)"
        )
        yield from ((row.index, failed) for row in rows)
        return
    for row, value in zip(rows, values, strict=True):
        yield row.index, judge(value)


def judge(value: Any) -> Outcome:
    """The outcome of one returned value: a number, or a dict with a `score` and other numbers."""
    score = value.get("score") if isinstance(value, dict) else value
    number = as_number(score)
    if number is None:
        missing = " (no 'score' key)" if isinstance(value, dict) and "score" not in value else ""
        return Outcome(
            "error",
            reason=f"returned {type(value).__name__} {_shown(value)}{missing} (a finite number or a dict with a "
            "finite 'score' is expected)",
        )
    if not math.isfinite(number):
        return Outcome(
            "non_finite", reason=f"returned {type(value).__name__} {_shown(value)} (not a finite number)"
        )
    extra = {}
    if isinstance(value, dict):
        extra = {k: v for k, item in value.items() if k != "score" and (v := as_number(item)) is not None}
    return Outcome("ok", score=number, extra=extra)


def as_number(value: Any) -> float | None:
    """float(value) for real numbers (Python, NumPy, one-element tensors), else None.

    Duck-typed (`__float__`) rather than checking for torch.Tensor, so workers need not import torch.
    """
    if isinstance(value, str | bytes | complex) or value is None:
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    if hasattr(value, "__float__") and getattr(value, "is_complex", lambda: False)() is False:
        try:
            return float(value)
        except (TypeError, ValueError, RuntimeError):
            return None  # tensors of more than one element
    return None


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:200]


def _shown(value: Any) -> str:
    return " ".join(repr(value).split())[:120]
