"""Versioned weights from the training process to the rollout process, over a two-rank gloo group of their own.

Asynchronous training (docs/async.md) runs the engine in a process of its own, which must generate with
exactly the weights the trainer sent and know which version they are: a sample's staleness is counted in
these versions. The group is built directly on a TCPStore (not `init_process_group`), so it is no
process's default group and leaves a run's data-parallel context alone.

A message is a header `[version]` (int64) and one flat float32 buffer of every tensor in a fixed order
(`WeightLayout`): two sends per update. bf16 and fp16 weights go through float32 exactly. One flat buffer
holds a whole model on the host, which suits the CPU slice built here; a GPU slice would bucket it.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, cast

import torch
import torch.distributed as dist

TRAINER_RANK, ROLLOUT_RANK = 0, 1
_HEADER_TAG, _WEIGHTS_TAG = 0, 1
NO_TIMEOUT = datetime.timedelta(days=7)
"""A receive waits as long as the other side trains or generates; liveness is checked by the processes."""


class PointToPoint(Protocol):
    """The two calls the channel makes on its group."""

    def send(self, tensors: list[torch.Tensor], dst_rank: int, tag: int) -> dist.Work: ...

    def recv(self, tensors: list[torch.Tensor], src_rank: int, tag: int) -> dist.Work: ...


@dataclass(frozen=True)
class WeightLayout:
    """The names, shapes and dtypes of the synced tensors, in send order: fixed for the run, sent once at start."""

    entries: tuple[tuple[str, tuple[int, ...], torch.dtype], ...]

    @staticmethod
    def of(named: Iterable[tuple[str, torch.Tensor]]) -> WeightLayout:
        return WeightLayout(tuple((name, tuple(t.shape), t.dtype) for name, t in named))

    @property
    def numel(self) -> int:
        return sum(math.prod(shape) for _, shape, _ in self.entries)

    def flatten(self, named: Iterable[tuple[str, torch.Tensor]]) -> torch.Tensor:
        """[numel] float32 on the host; the tensors must come in the layout's order and shapes."""
        parts = []
        for (name, tensor), (want, shape, _) in zip(named, self.entries, strict=True):
            if name != want or tuple(tensor.shape) != shape:
                raise RuntimeError(
                    f"weight sync sent {name} {tuple(tensor.shape)} where {want} {shape} was expected"
                )
            parts.append(tensor.detach().reshape(-1).to("cpu", torch.float32))
        return torch.cat(parts)

    def unflatten(self, flat: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """The named tensors of a flat buffer, in their own dtypes."""
        named, offset = [], 0
        for name, shape, dtype in self.entries:
            size = math.prod(shape)
            named.append((name, flat[offset : offset + size].view(shape).to(dtype)))
            offset += size
        return named


def make_store(host: str = "127.0.0.1") -> dist.TCPStore:
    """The trainer's store on a free port (`store.port`), which the rollout process is told."""
    return dist.TCPStore(host, 0, world_size=2, is_master=True, timeout=NO_TIMEOUT, wait_for_workers=False)


def connect_store(host: str, port: int) -> dist.TCPStore:
    """The rollout process's client of the trainer's store."""
    return dist.TCPStore(host, port, world_size=2, is_master=False, timeout=NO_TIMEOUT)


def join_group(store: dist.Store, rank: int) -> PointToPoint:
    """The two-rank gloo group of the trainer (rank 0) and the rollout process (rank 1); blocks until both
    have joined."""
    # gloo's backend object has send and recv at run time; torch's stubs declare them on ProcessGroup only.
    return cast(PointToPoint, dist.ProcessGroupGloo(store, rank, 2, NO_TIMEOUT))


class WeightSender:
    """The trainer's end: `send(version, tensors)` returns at once; the previous message is waited for first,
    so at most one flat copy of the weights is in flight."""

    def __init__(self, group: PointToPoint, layout: WeightLayout) -> None:
        self.group = group
        self.layout = layout
        self._in_flight: list[tuple[dist.Work, torch.Tensor]] = []

    def send(self, version: int, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.wait()
        header = torch.tensor([version], dtype=torch.int64)
        flat = self.layout.flatten(named)
        self._in_flight = [
            (self.group.send([header], ROLLOUT_RANK, _HEADER_TAG), header),
            (self.group.send([flat], ROLLOUT_RANK, _WEIGHTS_TAG), flat),
        ]

    def wait(self) -> None:
        """Until the rollout process has received every message sent so far."""
        for work, _ in self._in_flight:
            work.wait()
        self._in_flight = []


def receive(group: PointToPoint, layout: WeightLayout) -> tuple[int, torch.Tensor]:
    """The rollout process's end: the next message's version and flat buffer (blocks until it comes)."""
    header = torch.empty(1, dtype=torch.int64)
    group.recv([header], TRAINER_RANK, _HEADER_TAG).wait()
    flat = torch.empty(layout.numel, dtype=torch.float32)
    group.recv([flat], TRAINER_RANK, _WEIGHTS_TAG).wait()
    return int(header[0]), flat
