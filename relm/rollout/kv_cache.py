"""A KV cache preallocated for a whole rollout batch and written in place.

transformers' own caches grow (DynamicCache: a `torch.cat` per layer per step) or keep their own
write position per layer (StaticCache), and both hand attention the whole buffer. The native engine
needs three things they do not give together:

- fixed addresses, so one decode step can be captured in a CUDA graph and replayed;
- prefill of each *unique* prompt written straight into the `n` rows that sample from it, so the
  `n` samples of a prompt share one prefill;
- a decode view of only the first `kv_length` columns (a length bucket), so attention reads the
  live part of the cache rather than all of it.

Layout: one [rows, kv_heads, max_length, head_dim] buffer per layer for keys and one for values.
Column c holds the token at column c of the left-padded `[prompt | response]` row, the same column
layout as the trainer's batch; the attention mask (built by the engine) says which columns count.
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
        """[1] the column a decode step writes; a tensor so a captured graph reads its current value."""
        self._mode: tuple[Any, ...] | None = None
        self._seen_columns = 0

    def begin_prefill(self, first_row: int, repeats: int) -> None:
        """The next forward is a prefill of prompts [u, P]: prompt i fills rows
        `first_row + i * repeats ... + repeats - 1`, columns 0 .. P-1."""
        self._mode = ("prefill", first_row, repeats)

    def begin_decode(self, num_rows: int, kv_length: int) -> None:
        """The next forward decodes one token for rows [0, num_rows), written at `write_column`;
        attention then sees columns [0, kv_length)."""
        if num_rows > self.num_rows or kv_length > self.max_length:
            raise ValueError(
                f"decode of {num_rows} rows x {kv_length} columns exceeds the cache "
                f"({self.num_rows} x {self.max_length})"
            )
        self._mode = ("decode", num_rows, kv_length)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store one layer's new keys/values ([b, kv_heads, q, head_dim]) and return what attention reads."""
        if self._mode is None:
            raise RuntimeError("PreallocatedKVCache.update outside begin_prefill/begin_decode")
        if self._mode[0] == "prefill":
            _, first_row, repeats = self._mode
            self._write_prefill(layer_idx, key_states, value_states, first_row, repeats)
            self._seen_columns = key_states.shape[2]
            # Prefill attends within the prompt block only, so it reads the fresh states.
            return key_states, value_states
        _, num_rows, kv_length = self._mode
        keys, values = self.key_buffers[layer_idx], self.value_buffers[layer_idx]
        # index_copy_ with a device index keeps the write position out of the captured graph's
        # constants: replaying the graph writes wherever `write_column` points now.
        keys[:num_rows].index_copy_(2, self.write_column, key_states)
        values[:num_rows].index_copy_(2, self.write_column, value_states)
        return keys[:num_rows, :, :kv_length], values[:num_rows, :, :kv_length]

    def _write_prefill(
        self, layer_idx: int, keys: torch.Tensor, values: torch.Tensor, first_row: int, repeats: int
    ) -> None:
        num_prompts, _, width, _ = keys.shape
        last_row = first_row + num_prompts * repeats
        if last_row > self.num_rows or width > self.max_length:
            raise ValueError(
                f"prefill of rows {first_row}..{last_row - 1} x {width} columns exceeds the cache "
                f"({self.num_rows} x {self.max_length})"
            )
        for source, buffers in ((keys, self.key_buffers), (values, self.value_buffers)):
            if layer_idx not in buffers:
                heads, dim = source.shape[1], source.shape[3]
                buffers[layer_idx] = torch.zeros(
                    self.num_rows, heads, self.max_length, dim, dtype=source.dtype, device=self.device
                )
            target = buffers[layer_idx][first_row:last_row]  # [u * n, heads, L, dim]
            # Broadcast each prompt's states over its n rows; no repeated copy is materialized.
            target.view(num_prompts, repeats, *target.shape[1:])[:, :, :, :width].copy_(source.unsqueeze(1))

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
