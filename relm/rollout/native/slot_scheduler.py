"""Which row the native engine decodes in which slot, and from which step: continuous batching's
host-side bookkeeping (plain Python, no tensors).

A rollout batch has `num_prompts x n` rows, in the order outputs come back (prompt by prompt, the
`n` samples of a prompt next to each other). With fewer slots than rows, rows enter slots in that
order, and a slot whose row has finished (eos, or `max_new_tokens` tokens) takes the next waiting
row between two decode steps.

The `n` samples of a prompt share one prefill. Rows of a prompt admitted together are prefilled once
into all their slots. Because rows enter in order, only the prompt at the head of the queue can have
rows decoding while others wait (the *split* prompt), and its prompt columns are still intact in a
slot that took one of its rows: a slot's prompt columns are rewritten only when the slot takes a new
row, and the next rows to take slots are that prompt's. A later sample of the split prompt therefore
copies those columns, and the engine keeps the prompt's first-token logits for it, instead of a
second prefill.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field


@dataclass
class Admission:
    """What the engine does between two decode steps to start waiting rows in free slots.

    The engine applies it in this order: copies (they read a slot a prefill may rewrite), prefills,
    then the new rows' decode state.
    """

    slots: list[int] = field(default_factory=list)
    """Slot of each admitted row."""
    rows: list[int] = field(default_factory=list)
    """The admitted rows (index into prompts x n), in order."""
    prompts: list[int] = field(default_factory=list)
    """Prompt of each admitted row."""
    copy_source: int | None = None
    """A slot holding the split prompt's columns, for `copy_targets`."""
    copy_targets: list[int] = field(default_factory=list)
    """Slots that take the split prompt's columns by copy (those not holding them already)."""
    stash_targets: list[int] = field(default_factory=list)
    """Slots of the split prompt's rows: their first logits are the stashed ones."""
    prefill_prompts: list[int] = field(default_factory=list)
    """Prompts to prefill, each once."""
    prefill_slots: list[list[int]] = field(default_factory=list)
    """The slots each prefilled prompt is written into."""
    stash_slot: int | None = None
    """After the prefill, keep this slot's first logits: its prompt has samples still waiting."""


class SlotScheduler:
    """Rows of `num_prompts x n` through `num_slots` slots, each row at most `max_new_tokens` steps.

    Steps count sampling rounds from 0; a row admitted for step t samples its k-th token (from 0) at
    step t + k, and its last allowed one at t + max_new_tokens - 1.
    """

    def __init__(self, num_prompts: int, n: int, num_slots: int, max_new_tokens: int) -> None:
        num_rows = num_prompts * n
        self.n = n
        self.max_new_tokens = max_new_tokens
        self.slot_row: list[int | None] = [None] * num_slots
        """The row each slot decodes now (None: free)."""
        self.row_slot = [-1] * num_rows
        self.row_start = [0] * num_rows
        """Step of each row's first token."""
        self.row_end = [0] * num_rows
        """Step after each row's last recorded step (set when it retires)."""
        self.num_admissions = 0
        self.num_active = 0
        """Slots decoding a row now."""
        self._waiting = deque(range(num_rows))
        self._slot_prompt: list[int | None] = [None] * num_slots  # whose prompt columns a slot holds
        self._split_prompt: int | None = None
        self._due: dict[int, list[tuple[int, int]]] = defaultdict(list)  # step -> (slot, row) at length
        self._oldest_start = 0

    @property
    def done(self) -> bool:
        """Every row has finished and retired."""
        return not self._waiting and not self.num_active

    @property
    def active_slots(self) -> list[int]:
        return [slot for slot, row in enumerate(self.slot_row) if row is not None]

    def longest_response(self, step: int) -> int:
        """Tokens the longest-running active row has after sampling at `step` (0 when none is active)."""
        return step - self._oldest_start + 1 if self.num_active else 0

    def reaching_length(self, step: int) -> list[int]:
        """Slots whose row samples its last allowed token at `step` (known without looking at tokens)."""
        return [slot for slot, row in self._due.pop(step, []) if self.slot_row[slot] == row]

    def retire(self, slots: list[int], step: int) -> None:
        """The rows in `slots` finished at or before `step`: free their slots."""
        for slot in slots:
            row = self.slot_row[slot]
            if row is None:
                continue
            self.row_end[row] = step + 1
            self.slot_row[slot] = None
            self.num_active -= 1
        self._update_oldest()

    def admit(self, step: int) -> Admission | None:
        """Give free slots the next waiting rows, whose first token is sampled at `step`.

        Returns:
            The plan, or None when no row waits or no slot is free.
        """
        if not self._waiting or self.num_active == len(self.slot_row):
            return None
        free = [slot for slot, row in enumerate(self.slot_row) if row is None]
        split = self._split_prompt
        # A free slot that already holds the split prompt takes its next row: no copy needed.
        free.sort(key=lambda slot: self._slot_prompt[slot] != split)
        source = next((slot for slot, p in enumerate(self._slot_prompt) if p == split), None)
        plan = Admission()
        prefills: dict[int, list[int]] = {}
        for slot in free[: len(self._waiting)]:
            row = self._waiting.popleft()
            prompt = row // self.n
            if prompt == split:
                if source is None:
                    raise AssertionError(f"prompt {prompt} has waiting samples but no slot holds it")
                if self._slot_prompt[slot] != prompt:
                    plan.copy_targets.append(slot)
                plan.stash_targets.append(slot)
            else:
                prefills.setdefault(prompt, []).append(slot)
            plan.slots.append(slot)
            plan.rows.append(row)
            plan.prompts.append(prompt)
            self._start(slot, row, step)
        plan.copy_source = source if plan.copy_targets else None
        plan.prefill_prompts = list(prefills)
        plan.prefill_slots = list(prefills.values())
        head = self._waiting[0] if self._waiting else None
        self._split_prompt = head // self.n if head is not None and head % self.n else None
        if self._split_prompt in prefills:
            plan.stash_slot = prefills[self._split_prompt][0]
        self._update_oldest()
        self.num_admissions += 1
        return plan

    def _start(self, slot: int, row: int, step: int) -> None:
        self.slot_row[slot] = row
        self.num_active += 1
        self._slot_prompt[slot] = row // self.n
        self.row_slot[row] = slot
        self.row_start[row] = step
        self._due[step + self.max_new_tokens - 1].append((slot, row))

    def _update_oldest(self) -> None:
        starts = [self.row_start[row] for row in self.slot_row if row is not None]
        self._oldest_start = min(starts, default=0)
