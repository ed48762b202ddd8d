"""Keep freed host memory in the process on CPU runs, so a step does not fault its big tensors in anew.

glibc serves every allocation over 32 MiB (its largest mmap threshold) with a fresh `mmap` and returns
it with `munmap` when freed. A CPU training step allocates vocabulary-sized tensors over and over (the
[rows, response, vocabulary] logits, their gradient, the fp32 chunks: 151,665 entries a position at
Qwen2.5's vocabulary), so each one is page-faulted and zeroed by the kernel again: in README's verl
block on the tiny Qwen2.5-vocabulary model that was 47 s of system time beside 57 s of user time.
With mmap off (`M_MMAP_MAX` 0) and the heap never trimmed, freed blocks are reused; system time fell to
3 s. The cost: the process keeps its peak (which is what the host-memory plan budgets anyway), and a heap
that never gives memory back fragments: a big block that fits no hole extends it, so between micro-batches
of an update `release_heap_fragments` gives the holes back once the free memory passes a bound.

A data-parallel CPU run takes the opposite setting (`return_freed_host_memory`): FSDP2 gathers each
block's weights and its gradients into fresh buffers of many sizes, forward after forward, and a heap that
keeps them holds far more than the rank's shards. Measured on a 135M-parameter Qwen2 GRPO step with a
KL-loss reference over 4 gloo ranks (tests/sharded_memory.py's run, 2 cores): each rank peaked at
3.1-3.4 GiB with freed memory kept (one process holding the whole model: 3.2 GiB), 2.1-2.6 GiB with
glibc's defaults (whose dynamic threshold sends blocks under 32 MiB to the heap), 1.76 GiB with every
block of 1 MiB or more mapped on its own and unmapped when freed: 0.15 GiB above what the rank held after
the step with its heap trimmed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger("relm")
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
RETURNED_BLOCK_BYTES = 1 << 20
"""Data-parallel CPU runs: blocks of this size and up are mapped on their own and given back when freed."""
NEVER_TRIM = 2**31 - 1
"""The trim threshold (mallopt takes an int): a free top of the heap under 2 GiB stays."""


def keep_freed_host_memory() -> bool:
    """Tell glibc's malloc to serve big blocks from the heap and keep freed ones; False where it is not glibc."""
    libc = _glibc()
    if libc is None:
        return False
    mallopt = libc.mallopt
    done = mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, NEVER_TRIM) == 1
    logger.debug("host allocator: big blocks from the heap, freed memory kept (%s)", done)
    if done:
        _watch_heap(libc)
    return done


def return_freed_host_memory() -> bool:
    """Tell glibc's malloc to map every block of `RETURNED_BLOCK_BYTES` or more on its own and unmap it when
    freed (a fixed threshold: glibc's dynamic one stops growing at 32 MiB); False where it is not glibc."""
    libc = _glibc()
    done = libc is not None and libc.mallopt(M_MMAP_THRESHOLD, RETURNED_BLOCK_BYTES) == 1
    logger.debug("host allocator: blocks of 1 MiB and up given back when freed (%s)", done)
    return done


def set_host_allocator(world_size: int) -> bool:
    """The CPU run's allocator setting: keep freed memory in one process, give it back with several
    (see the module docstring)."""
    return keep_freed_host_memory() if world_size == 1 else return_freed_host_memory()


def _glibc() -> ctypes.CDLL | None:
    """The C library with `mallopt(int, int)` typed; None where there is none (not glibc)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return libc


def _watch_heap(libc: ctypes.CDLL) -> None:
    """Arm `release_heap_fragments` where glibc reports its free memory (mallinfo2, glibc 2.33+)."""
    global _kept
    try:
        mallinfo2, malloc_trim = libc.mallinfo2, libc.malloc_trim
    except AttributeError:
        return
    mallinfo2.argtypes, mallinfo2.restype = [], _Mallinfo2
    malloc_trim.argtypes, malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    _kept = _KeptHeap(malloc_trim=malloc_trim, used_bytes=lambda: int(mallinfo2().uordblks))


class _Mallinfo2(ctypes.Structure):
    """glibc's `struct mallinfo2` (2.33 and later): the heap's sizes as size_t."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def heap_info() -> _Mallinfo2 | None:
    """glibc's heap sizes now (`mallinfo2`, summed over every arena), or None where the C library has no
    mallinfo2 (not glibc, or glibc before 2.33). For measuring what a heap holds (bench/host_memory_trace.py)."""
    libc = _glibc()
    mallinfo2 = getattr(libc, "mallinfo2", None) if libc is not None else None
    if mallinfo2 is None:
        return None
    mallinfo2.argtypes, mallinfo2.restype = [], _Mallinfo2
    return mallinfo2()


@dataclass
class _KeptHeap:
    """The heap `keep_freed_host_memory` told glibc to keep, and how much free memory it may hold."""

    malloc_trim: Callable[[int], int]
    used_bytes: Callable[[], int]
    allowance: int | None = None
    """Resident bytes beyond the heap's allocated ones the process may hold between micro-batches:
    KEEP_FACTOR times what it held after the first."""
    trims: int = 0


KEEP_FACTOR = 1.25
"""How far the free memory between micro-batches may grow past what the first one left before the holes
are given back. Measured on README's verl block (one thread): without a bound the heap's free memory grew
from 1.07 to 2.39 GiB over 32 micro-batches (each [257, 151,665] fp32 block that fits no hole extends the
heap) and the peak varied from 2.7 to 4.7 GiB between identical runs; giving the holes back after every
micro-batch kept the peak at 2.55 GiB but tripled system time (7.5 s to 29 s). The host-memory plan counts
this much free memory beside a micro-batch's live vocabulary-sized tensors (`relm.memory.plan.cpu_logit_bytes`)."""

_kept: _KeptHeap | None = None


def release_heap_fragments() -> bool:
    """Between micro-batches of a CPU update: give the heap's free pages back to the kernel when it holds
    more than KEEP_FACTOR times the resident free memory the first micro-batch left, so a heap that keeps freed
    memory (`keep_freed_host_memory`) cannot grow without bound through fragmentation. True when it trimmed;
    a no-op where freed memory is not kept."""
    kept = _kept
    if kept is None:
        return False
    # resident, not free, bytes: a trimmed hole stays free in the heap's books but leaves the process
    free = _resident_bytes() - kept.used_bytes()
    if kept.allowance is None:
        kept.allowance = int(KEEP_FACTOR * free)
        return False
    if free <= kept.allowance:
        return False
    kept.malloc_trim(0)
    kept.trims += 1
    logger.debug(
        "host allocator: %.2f GiB free in the heap, over %.2f GiB: given back",
        free / 2**30,
        kept.allowance / 2**30,
    )
    return True


def _resident_bytes() -> int:
    """The process's resident set (Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE_SIZE


PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
