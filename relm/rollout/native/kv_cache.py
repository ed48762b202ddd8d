"""A KV cache preallocated for a whole rollout batch and written in place.

transformers' own caches grow (DynamicCache: a `torch.cat` per layer per step) or keep their own
write position per layer (StaticCache), and both hand attention the whole buffer. The native engine
needs three things they do not give together:

- fixed addresses, so one decode step can be captured in a CUDA graph and replayed;
- prefill of each *unique* prompt written straight into the `n` rows that sample from it (or, for
  a sample admitted later, copied from a row that holds it), so the `n` samples of a prompt share
  one prefill, in chunks of columns for long prompts;
- a decode view of only the first `kv_length` columns (a length bucket), so attention reads the
  live part of the cache rather than all of it;
- decode writes either at one column shared by every row (lock-step: all rows started together)
  or at a column per row (continuous batching: a row that takes over a slot starts its response
  while the other slots are mid-way through theirs).

Layout: one [rows, kv_heads, max_length, head_dim] buffer per layer for keys and one for values.
Column c holds the token at column c of the left-padded `[prompt | response]` row, the same column
layout as the trainer's batch; the attention mask (built by the engine) says which columns count.
Every row's prompt is left-padded to the same width, so its response starts at the same column
whichever step the row was admitted at; only the write position differs between rows.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache


class PreallocatedKVCache(Cache):
    """Keys and values for `num_rows` sequences of up to `max_length` columns.

    Buffers are allocated per layer on the first prefill, from the shapes the layer produces, so
    architectures whose layers differ (head sizes, latent KV) need no description here. They start
    at zero and are never freed while the cache lives: unwritten columns stay finite, which matters
    because masked attention still multiplies them by a zero weight, and 0 * NaN would be NaN.

    Args:
        num_rows: rows the buffers hold (the engine's row capacity, padded rows included).
        max_length: columns the buffers hold (prompt width + response length, at least).
        device: where the buffers live.
    """

    def __init__(self, num_rows: int, max_length: int, device: torch.device | str) -> None:
        super().__init__(layers=[])
        self.num_rows = num_rows
        self.max_length = max_length
        self.device = torch.device(device)
        self.key_buffers: dict[int, torch.Tensor] = {}
        self.value_buffers: dict[int, torch.Tensor] = {}
        self.write_column = torch.zeros(1, dtype=torch.long, device=self.device)
        """[1] the column a lock-step decode step writes; a tensor so a captured graph reads its
        current value."""
        self.write_columns = torch.zeros(num_rows, dtype=torch.long, device=self.device)
        """[num_rows] the column each row writes in a per-row decode step (continuous batching)."""
        self._mode: tuple[Any, ...] | None = None
        self._seen_columns = 0

    def begin_prefill(self, targets: torch.Tensor, first_column: int = 0, start_column: int = 0) -> None:
        """The next forward is a prefill of prompts [u, q] at columns `first_column .. + q - 1`;
        prompt i fills the rows `targets[i]` ([u, r] long, on the cache's device; a row may repeat).

        Columns before `start_column` are left padding in every one of these prompts: never written,
        never read. With `first_column` > `start_column` (a later chunk of long prompts) attention
        reads columns `start_column .. first_column - 1` from the rows `targets[:, 0]`, which earlier
        chunks filled.
        """
        # [r, u]: one contiguous index of rows per repeat, what index_copy_ and index_select take.
        self._mode = ("prefill", targets.t().contiguous(), first_column, start_column)
        self._seen_columns = first_column

    def begin_decode(self, num_rows: int, kv_length: int, per_row: bool = False) -> None:
        """The next forward decodes one token for rows [0, num_rows), written at `write_column`
        (or, with `per_row`, row i at `write_columns[i]`); attention then sees columns [0, kv_length)."""
        if num_rows > self.num_rows or kv_length > self.max_length:
            raise ValueError(
                f"decode of {num_rows} rows x {kv_length} columns exceeds the cache "
                f"({self.num_rows} x {self.max_length})"
            )
        self._mode = ("decode", num_rows, kv_length, per_row)

    def copy_prompt(self, source_row: int, target_rows: torch.Tensor, width: int) -> None:
        """Copy columns [0, width) of `source_row` into `target_rows` ([m] long) in every layer: a
        prompt already prefilled for a sibling sample, given to a row admitted later."""
        for buffers in (self.key_buffers, self.value_buffers):
            for buffer in buffers.values():
                # A copy first: index_copy_ refuses a source that overlaps what it writes.
                source = buffer[source_row, :, :width].clone().unsqueeze(0)  # [1, heads, width, dim]
                buffer[:, :, :width].index_copy_(0, target_rows, source.expand(len(target_rows), -1, -1, -1))

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store one layer's new keys/values ([b, kv_heads, q, head_dim]) and return what attention reads."""
        if self._mode is None:
            raise RuntimeError("PreallocatedKVCache.update outside begin_prefill/begin_decode")
        if self._mode[0] == "prefill":
            _, repeats, first_column, start_column = self._mode
            end = first_column + key_states.shape[2]
            self._write_prefill(layer_idx, key_states, value_states, repeats, first_column)
            self._seen_columns = end
            if first_column == start_column:
                # A first chunk attends within itself only, so it reads the fresh states.
                return key_states, value_states
            rows = repeats[0]
            keys, values = self.key_buffers[layer_idx], self.value_buffers[layer_idx]
            window = slice(start_column, end)
            return keys[:, :, window].index_select(0, rows), values[:, :, window].index_select(0, rows)
        _, num_rows, kv_length, per_row = self._mode
        keys, values = self.key_buffers[layer_idx], self.value_buffers[layer_idx]
        # Writes through a device index keep the write position out of the captured graph's
        # constants: replaying the graph writes wherever `write_column(s)` point now.
        if per_row:
            heads, dim = key_states.shape[1], key_states.shape[3]
            columns = self.write_columns[:num_rows].view(num_rows, 1, 1, 1)
            keys[:num_rows].scatter_(2, columns.expand(num_rows, heads, 1, dim), key_states)
            value_columns = columns.expand(num_rows, value_states.shape[1], 1, value_states.shape[3])
            values[:num_rows].scatter_(2, value_columns, value_states)
        else:
            keys[:num_rows].index_copy_(2, self.write_column, key_states)
            values[:num_rows].index_copy_(2, self.write_column, value_states)
        return keys[:num_rows, :, :kv_length], values[:num_rows, :, :kv_length]

    def _write_prefill(
        self,
        layer_idx: int,
        keys: torch.Tensor,
        values: torch.Tensor,
        repeats: torch.Tensor,
        first_column: int,
    ) -> None:
        end = first_column + keys.shape[2]
        if end > self.max_length:
            raise ValueError(f"prefill up to column {end} exceeds the cache's {self.max_length} columns")
        for source, buffers in ((keys, self.key_buffers), (values, self.value_buffers)):
            if layer_idx not in buffers:
                heads, dim = source.shape[1], source.shape[3]
                buffers[layer_idx] = torch.zeros(
                    self.num_rows, heads, self.max_length, dim, dtype=source.dtype, device=self.device
                )
            columns = buffers[layer_idx][:, :, first_column:end]  # [rows, heads, q, dim]
            # One write per repeat: the same bytes as broadcasting each prompt over its rows, and
            # no repeated copy is materialized; a row listed twice is written twice, identically.
            for rows in repeats:
                columns.index_copy_(0, rows, source)

    def nbytes(self) -> int:
        """Bytes held by the allocated buffers."""
        buffers = [*self.key_buffers.values(), *self.value_buffers.values()]
        return sum(b.numel() * b.element_size() for b in buffers)

    # The rest of the Cache surface a model may consult. The engine passes position ids and 4D
    # masks, so transformers never needs these to build masks; they answer sensibly anyway.
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._seen_columns

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self._seen_columns + query_length, 0

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return self.max_length

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return self.max_length

    @property
    def is_compileable(self) -> bool:
        return False
