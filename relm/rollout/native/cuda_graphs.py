"""CUDA graphs of the native engine's decode step, one per (row bucket, length bucket, write mode).

A decode step of an HF model is a few hundred small kernels launched from Python; at the batch
sizes RL uses, launching them costs about as much as running them. A graph records the step once
and replays it with one launch. A graph bakes in shapes and addresses, so the engine keeps its
inputs (token ids, positions, mask, write columns) and the KV cache in fixed buffers and captures
one graph per number of rows, number of cache columns read and write mode (one column for all rows,
or one per row); `run` captures a missing one on first use. Anything that cannot be captured (a host sync inside the model, an op the capture
refuses) disables graphs for the engine with one warning that names the error: decoding then runs
eagerly, slower but the same tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

logger = logging.getLogger("relm")


class DecodeGraphs:
    """Captured decode steps keyed by the step's arguments (rows, kv_length, per_row).

    Args:
        step: runs one decode step for its arguments eagerly, writing only into fixed buffers; the
            same call is what gets captured.
        weights: the tensors whose addresses the graphs read (the model's parameters and buffers);
            `check_weights` drops every graph if one of them has moved.
    """

    def __init__(self, step: Callable[..., None], weights: Callable[[], list[torch.Tensor]]) -> None:
        self._step = step
        self._weights = weights
        self._graphs: dict[tuple[int | bool, ...], torch.cuda.CUDAGraph] = {}
        self._pool: torch.cuda._POOL_HANDLE | None = None
        self._weight_addresses: list[int] = []
        self.disabled_reason: str | None = None
        """Why graphs are off for this engine, once a capture failed; None while they work."""

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    def clear(self) -> None:
        """Forget every graph (the buffers they read are about to be reallocated)."""
        self._graphs.clear()
        self._pool = None

    def check_weights(self) -> None:
        """Drop the graphs if a weight tensor was replaced rather than updated in place.

        Optimizer steps and `sync_weights` write in place, so this is rare (a `load_state_dict`
        with assign, a resharding); replaying a graph over freed weights would read garbage.
        """
        addresses = [t.data_ptr() for t in self._weights()]
        if self._graphs and addresses != self._weight_addresses:
            logger.info("native rollout: model weights moved in memory; recapturing decode graphs")
            self.clear()
        self._weight_addresses = addresses

    def run(self, *key: int | bool) -> bool:
        """Replay (capturing first if needed) the step for the arguments `key` (rows, kv_length, ...).

        Returns:
            True when a graph ran; False when graphs are disabled and the caller must run the step
            eagerly.
        """
        if self.disabled_reason is not None:
            return False
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._capture(key)
            if graph is None:
                return False
            self._graphs[key] = graph
        graph.replay()
        return True

    def _capture(self, key: tuple[int | bool, ...]) -> torch.cuda.CUDAGraph | None:
        # Warm-up on a side stream, as torch.cuda.graph requires: it runs the real step on the real
        # inputs, so what it writes (this step's keys/values) is what the replay writes again.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._step(*key)
        torch.cuda.current_stream().wait_stream(side)
        if self._pool is None:
            # One memory pool for all graphs: they never run at once, so they can share scratch.
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                self._step(*key)
        except Exception as exc:  # noqa: BLE001 - any capture failure means: run eagerly
            self._disable(exc)
            return None
        return graph

    def _disable(self, exc: Exception) -> None:
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        self.disabled_reason = f"{type(exc).__name__}: {reason}"
        self.clear()
        # A failed capture must leave the device usable; if it does not, that is not recoverable here.
        torch.cuda.synchronize()
        logger.warning(
            "native rollout: the decode step could not be captured in a CUDA graph (%s); decoding "
            "eagerly from now on (same tokens, slower)",
            self.disabled_reason,
        )
