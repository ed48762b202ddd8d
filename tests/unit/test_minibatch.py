"""Micro-batches by token budget (verl's use_dynamic_bsz): the packing and what a row costs."""

from __future__ import annotations

import torch

from relm.learner.minibatch import forward_token_counts, microbatch_indices, token_budget_bins


def test_token_budget_bins_first_fit_decreasing_by_hand():
    rows = torch.tensor([10, 11, 12, 13, 14])
    costs = torch.tensor([5, 3, 8, 2, 7])
    # 8 -> bin A; 7 -> B; 5 -> C (A and B would pass 10); 3 -> B (10); 2 -> A (10)
    bins = token_budget_bins(rows, costs, max_tokens=10)
    assert [b.tolist() for b in bins] == [[10], [11, 14], [12, 13]]
    # a row over the budget goes alone; nothing is dropped
    assert [b.tolist() for b in token_budget_bins(rows[:2], torch.tensor([12, 1]), 10)] == [[10], [11]]


def test_microbatches_by_token_budget_and_forward_costs():
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1], [0, 0, 1, 1]])
    assert forward_token_counts(mask, remove_padding=True).tolist() == [2, 4, 2]
    assert forward_token_counts(mask, remove_padding=False).tolist() == [4, 4, 4]  # padded width
    counts = forward_token_counts(mask, remove_padding=True)
    groups = microbatch_indices(torch.tensor([2, 0, 1]), 1, token_counts=counts, max_tokens=4)
    assert [g.tolist() for g in groups] == [[2, 0], [1]]
