"""Forwards that run out of GPU memory are split in halves and retried, not fatal."""

from __future__ import annotations

import logging

import pytest
import torch

from relm.trainer.experience import run_halving_on_oom


def memory_limited(max_rows: int, done: list[list[int]]):
    """A forward that, like a GPU with room for `max_rows` rows, raises torch's own OOM error above that."""

    def forward(rows: torch.Tensor) -> None:
        if len(rows) > max_rows:
            raise torch.OutOfMemoryError(f"CUDA out of memory: {len(rows)} rows")
        done.append(rows.tolist())

    return forward


def test_halves_until_the_rows_fit(caplog):
    done: list[list[int]] = []
    with caplog.at_level(logging.WARNING, logger="relm"):
        run_halving_on_oom(torch.arange(7), memory_limited(2, done), "logprob forward")
    # 7 -> 3 + 4 -> (1 + 2) + (2 + 2): every row once, in order
    assert done == [[0], [1, 2], [3, 4], [5, 6]]
    assert "logprob forward: out of GPU memory on 7 rows; retrying as 3 + 4" in caplog.text


def test_a_single_row_that_does_not_fit_is_an_error():
    with pytest.raises(torch.OutOfMemoryError):
        run_halving_on_oom(torch.arange(4), memory_limited(0, []), "value forward")
