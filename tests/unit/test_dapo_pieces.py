"""DAPO's overlong penalty and group filter, against hand-worked numbers."""

from __future__ import annotations

import pytest
import torch

from relm.algorithms.filtering import groups_with_variance
from relm.rewards.shaping import overlong_penalty


def test_overlong_penalty_is_zero_before_the_buffer_and_linear_inside_it():
    # limit 10, buffer 4: free up to 6 tokens; 8 tokens -> -(8-6)/4 * 0.5 = -0.25; 10 -> -(4/4)*0.5 = -0.5
    lengths = torch.tensor([3, 6, 8, 10])
    penalty = overlong_penalty(lengths, max_response_length=10, buffer_len=4, penalty_factor=0.5)
    assert penalty.tolist() == pytest.approx([0.0, 0.0, -0.25, -0.5])


def test_groups_with_equal_values_are_dropped_row_by_row():
    # group 0: 1, 1 (all equal -> drop); group 5: 0, 1 (keep); group 2: 0.5 alone (one value -> drop)
    group_ids = torch.tensor([0, 0, 5, 5, 2])
    values = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5])
    assert groups_with_variance(group_ids, values).tolist() == [False, False, True, True, False]
