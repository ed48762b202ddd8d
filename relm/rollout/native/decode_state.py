"""The native engine's decode state: fixed buffers a (captured) decode step reads, and how rows enter,
advance in and leave them.

Two ways of advancing, chosen per generate call by the engine:

- lock-step (every row has a slot): all rows started together, so one write column serves them all
  and the mask gains the same column in every row each step;
- per row (continuous batching): a slot's row may have started at any step, so each slot keeps its
  own write column and position in device tensors, advanced by `advance` (1 for a slot decoding a
  row, 0 for an idle one) with no host involvement; rows enter and leave only between steps.

Rows whose output matters always attend at least their prompt; rows that do not (idle slots, the
row-bucket padding) attend at least one written column too, so no softmax sees an empty row and
no NaN ever reaches the cache (masked attention multiplies unused columns by 0, and 0 * NaN = NaN).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from relm.rollout.base import FINISH_LENGTH, FINISH_STOP, GenerationOutput
from relm.rollout.native.kv_cache import PreallocatedKVCache
from relm.rollout.native.slot_scheduler import Admission, SlotScheduler


@dataclass
class DecodeBuffers:
    """Everything a decode step reads or writes, at fixed addresses (what a CUDA graph needs)."""

    cache: PreallocatedKVCache
    input_ids: torch.Tensor  # [rows_cap, 1] long
    position_ids: torch.Tensor  # [rows_cap, 1] long
    mask: torch.Tensor  # [rows_cap, 1, 1, L_cap] bool, True = attend
    advance: torch.Tensor  # [rows_cap] long: per-row mode, 1 where a slot decodes a row
    logits: torch.Tensor | None = None  # [rows_cap, V] model dtype, allocated at the first prefill

    @classmethod
    def allocate(cls, rows: int, length: int, pad_token_id: int, device: torch.device) -> DecodeBuffers:
        return cls(
            cache=PreallocatedKVCache(rows, length, device),
            input_ids=torch.full((rows, 1), pad_token_id, dtype=torch.long, device=device),
            position_ids=torch.zeros(rows, 1, dtype=torch.long, device=device),
            mask=torch.zeros(rows, 1, 1, length, dtype=torch.bool, device=device),
            advance=torch.zeros(rows, dtype=torch.long, device=device),
        )

    @property
    def num_rows(self) -> int:
        return self.cache.num_rows

    @property
    def max_length(self) -> int:
        return self.cache.max_length

    def lock_step_inputs(self, column: int, token: torch.Tensor, positions: torch.Tensor) -> None:
        """Inputs of the next lock-step decode: every row's token [N] goes to `column`, at `positions` [N]."""
        num_rows = token.shape[0]
        self.mask[:, 0, 0, column] = True
        self.cache.write_column.fill_(column)
        self.input_ids[:num_rows, 0].copy_(token)
        self.position_ids[:num_rows, 0].copy_(positions)

    def reset_slots(self, pad_token_id: int) -> None:
        """Every row idle: it writes and attends column 0 only, until a row is admitted into it."""
        self.mask.zero_()
        self.mask[:, 0, 0, 0] = True
        self.cache.write_columns.zero_()
        self.advance.zero_()
        self.input_ids.fill_(pad_token_id)
        self.position_ids.zero_()

    def park(self, slots: list[int], prompt_width: int) -> None:
        """Stop the slots' write columns and positions where they are (their rows finished): a slot
        past its row's last column would write beyond the cache.

        An idle slot still writes its column every decode step, so that column must not be a prompt
        column: a row that ended at its first token still stands one column before its first write,
        on the prompt's last column, and a sibling sample admitted later reads that slot's prompt
        columns as they are. Such a slot writes the first response column instead (`prompt_width`).
        """
        index = _to_device(slots, self.advance.device)
        self.advance.index_fill_(0, index, 0)
        columns = self.cache.write_columns
        columns.index_copy_(0, index, columns.index_select(0, index).clamp_min(prompt_width))

    def per_row_inputs(self, token: torch.Tensor) -> None:
        """Inputs of the next per-row decode: slot i's token `token[i]` goes one column and one
        position past its last, where `advance` says it decodes (device ops only, no host sync)."""
        self.cache.write_columns.add_(self.advance)
        self.position_ids[:, 0].add_(self.advance)
        self.mask.scatter_(3, self.cache.write_columns.view(-1, 1, 1, 1), True)
        self.input_ids[: token.shape[0], 0].copy_(token)


@dataclass
class Prompts:
    """The call's unique prompts, left-padded to one width, on the engine's device."""

    ids: torch.Tensor  # [U, P] long
    mask: torch.Tensor  # [U, P] long, 1 on prompt tokens

    @property
    def width(self) -> int:
        return self.ids.shape[1]


def admit_rows(
    plan: Admission,
    buffers: DecodeBuffers,
    prompts: Prompts,
    finished: torch.Tensor,
    stash: torch.Tensor | None,
    prefill: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None],
) -> torch.Tensor | None:
    """Apply an admission between two steps: prompt columns and first logits into the new rows' slots,
    and their decode state reset.

    Args:
        finished: [slots] bool, reset to False for the admitted slots.
        stash: [V] first logits of the split prompt (see `relm.rollout.native.slot_scheduler`), or None.
        prefill: the engine's prefill(ids [u, P], mask [u, P], target slots [u, r]).

    Returns:
        The stash for the next admission.
    """
    device, width = buffers.mask.device, prompts.width
    # Every index in one host-to-device transfer (pinned and asynchronous on CUDA: no host sync).
    groups = [plan.copy_targets, plan.stash_targets, plan.prefill_prompts, plan.slots, plan.prompts]
    flat = _to_device([i for group in groups for i in group], device).split([len(g) for g in groups])
    copy_targets, stash_targets, prefill_prompts, slots, row_prompts = flat
    if plan.copy_targets:
        assert plan.copy_source is not None, "an admission that copies names its source"
        buffers.cache.copy_prompt(plan.copy_source, copy_targets, width)
    if plan.stash_targets:
        assert buffers.logits is not None and stash is not None, "a stash is taken before it is used"
        buffers.logits.index_copy_(0, stash_targets, stash.expand(len(plan.stash_targets), -1))
    if plan.prefill_prompts:
        repeats = max(len(group) for group in plan.prefill_slots)
        # A prompt with fewer slots lists its last one again: rewriting a row with the same states.
        targets = [group + group[-1:] * (repeats - len(group)) for group in plan.prefill_slots]
        target_tensor = _to_device([s for group in targets for s in group], device).view(-1, repeats)
        prefill(prompts.ids[prefill_prompts], prompts.mask[prefill_prompts], target_tensor)
        if plan.stash_slot is not None:
            assert buffers.logits is not None, "the prefill just wrote them"
            stash = buffers.logits[plan.stash_slot].clone()
    if plan.slots:
        new_mask = torch.zeros(len(plan.slots), 1, 1, buffers.max_length, dtype=torch.bool, device=device)
        new_mask[:, 0, 0, :width] = prompts.mask[row_prompts].bool()
        buffers.mask.index_copy_(0, slots, new_mask)
        # One step before the row's first: the step's `per_row_inputs` moves them to column P and
        # position len(prompt), where the first sampled token goes.
        buffers.cache.write_columns.index_fill_(0, slots, width - 1)
        buffers.position_ids.index_copy_(0, slots, prompts.mask[row_prompts].sum(dim=1, keepdim=True) - 1)
        buffers.advance.index_fill_(0, slots, 1)
        finished.index_fill_(0, slots, False)
    return stash


def gather_rows(
    tokens: list[torch.Tensor],
    masks: list[torch.Tensor],
    logprobs: list[torch.Tensor],
    scheduler: SlotScheduler,
    width: int,
    pad_token_id: int,
    eos_token_ids: torch.Tensor | None,
) -> GenerationOutput:
    """Per-step slot columns ([slots] each) -> CPU outputs per row, in prompts x n order.

    Row r's tokens are slot `row_slot[r]`'s from step `row_start[r]` until it retired, at most
    `width`; steps after its eos (mask 0 there) and after it retired are padding. A row stopped
    when its last token is an eos (`eos_token_ids` None: eos ignored).
    """
    slot_tokens = torch.stack(tokens, dim=1).cpu()  # [S, T]
    slot_live = torch.stack(masks, dim=1).cpu().bool()
    slot_logprobs = torch.stack(logprobs, dim=1).float().cpu()
    slot = torch.tensor(scheduler.row_slot)[:, None]  # [N, 1]
    start = torch.tensor(scheduler.row_start)[:, None]
    length = torch.tensor(scheduler.row_end)[:, None] - start
    offsets = torch.arange(width)  # [R]
    steps = (start + offsets).clamp(max=slot_tokens.shape[1] - 1)  # [N, R]
    keep = slot_live[slot, steps] & (offsets < length)
    response_ids = torch.where(keep, slot_tokens[slot, steps], pad_token_id)
    response_logprobs = torch.where(keep, slot_logprobs[slot, steps], 0.0)
    last = response_ids.gather(1, (keep.sum(dim=1, keepdim=True) - 1).clamp(min=0)).squeeze(1)
    stopped = torch.isin(last, eos_token_ids.cpu()) if eos_token_ids is not None else torch.zeros_like(last)
    reasons = [FINISH_STOP if stop else FINISH_LENGTH for stop in stopped.tolist()]
    return GenerationOutput(response_ids, keep.long(), response_logprobs, reasons)


def _to_device(values: list[int], device: torch.device) -> torch.Tensor:
    """[len(values)] long on `device`; on CUDA through pinned memory, so the copy does not wait for
    the work already queued."""
    host = torch.tensor(values, dtype=torch.long)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
