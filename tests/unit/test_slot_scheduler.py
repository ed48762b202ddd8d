"""The continuous-batching scheduler's bookkeeping, against schedules worked out by hand."""

from __future__ import annotations

from relm.rollout.native.slot_scheduler import SlotScheduler


def test_three_slots_six_rows_by_hand():
    # 3 prompts x n=2 = rows 0..5 (row r is prompt r // 2), 3 slots, at most 4 tokens a row.
    scheduler = SlotScheduler(num_prompts=3, n=2, num_slots=3, max_new_tokens=4)
    first = scheduler.admit(0)
    assert (first.slots, first.rows, first.prompts) == ([0, 1, 2], [0, 1, 2], [0, 0, 1])
    # Prompt 0 is prefilled once into both its slots; prompt 1 has a sample waiting, so its first
    # logits are stashed from its slot.
    assert (first.prefill_prompts, first.prefill_slots) == ([0, 1], [[0, 1], [2]])
    assert first.stash_slot == 2 and first.copy_targets == [] and first.stash_targets == []
    assert scheduler.admit(1) is None  # no slot is free

    # Row 1 ends by eos at step 1: slot 1 takes row 3 (prompt 1's second sample) by copying slot
    # 2's prompt columns and the stashed logits; nothing is prefilled.
    scheduler.retire([1], step=1)
    second = scheduler.admit(2)
    assert (second.slots, second.rows) == ([1], [3])
    assert (second.copy_source, second.copy_targets, second.stash_targets) == (2, [1], [1])
    assert second.prefill_prompts == [] and second.stash_slot is None
    assert scheduler.longest_response(2) == 3  # rows 0 and 2 started at step 0

    # Step 3: rows 0 and 2 (started at step 0) sample their 4th token. Row 1 was also due at step
    # 3, but it already left slot 1, whose row 3 is not due.
    assert scheduler.reaching_length(3) == [0, 2]
    scheduler.retire([0, 2], step=3)
    third = scheduler.admit(4)
    assert (third.slots, third.rows, third.prefill_prompts, third.prefill_slots) == (
        [0, 2],
        [4, 5],
        [2],
        [[0, 2]],
    )
    assert third.stash_slot is None  # prompt 2 has no sample left waiting
    assert scheduler.reaching_length(5) == [1]  # row 3 started at step 2
    scheduler.retire([1], step=5)
    assert scheduler.admit(6) is None and not scheduler.done  # nothing waits; rows 4 and 5 still decode
    assert scheduler.reaching_length(7) == [0, 2]
    scheduler.retire([0, 2], step=7)
    assert scheduler.done
    assert scheduler.row_slot == [0, 1, 2, 1, 0, 2]
    assert scheduler.row_start == [0, 0, 0, 2, 4, 4]
    assert scheduler.row_end == [4, 2, 4, 6, 8, 8]
    assert scheduler.num_admissions == 3


def test_one_slot_reuses_its_own_prompt_columns():
    # One slot, one prompt, n=3: the slot keeps the prompt's columns, so later samples copy nothing
    # and take the stashed first logits.
    scheduler = SlotScheduler(num_prompts=1, n=3, num_slots=1, max_new_tokens=2)
    first = scheduler.admit(0)
    assert first.prefill_prompts == [0] and first.stash_slot == 0
    for row, step in ((1, 2), (2, 4)):
        assert scheduler.reaching_length(step - 1) == [0]
        scheduler.retire([0], step - 1)
        plan = scheduler.admit(step)
        assert (plan.rows, plan.copy_targets, plan.stash_targets, plan.prefill_prompts) == (
            [row],
            [],
            [0],
            [],
        )
    scheduler.retire(scheduler.reaching_length(5), 5)
    assert scheduler.done and scheduler.row_end == [2, 4, 6]


def test_a_freed_slot_holding_the_split_prompt_takes_its_next_sample():
    # 3 prompts x n=2, 2 slots. Slot 1 frees first and takes row 2 (prompt 1), whose second
    # sample then waits. When both slots free at once, slot 1 (holding prompt 1) takes row 3 with
    # no copy, and slot 0 takes row 4 (prompt 2, prefilled).
    scheduler = SlotScheduler(num_prompts=3, n=2, num_slots=2, max_new_tokens=5)
    scheduler.admit(0)
    scheduler.retire([1], 1)
    plan = scheduler.admit(2)
    assert (plan.slots, plan.rows, plan.prefill_prompts, plan.stash_slot) == ([1], [2], [1], 1)
    scheduler.retire([0, 1], 3)
    plan = scheduler.admit(4)
    assert (plan.slots, plan.rows, plan.prompts) == ([1, 0], [3, 4], [1, 2])
    assert (plan.copy_targets, plan.stash_targets) == ([], [1])
    assert (plan.prefill_prompts, plan.prefill_slots, plan.stash_slot) == ([2], [[0]], 0)
