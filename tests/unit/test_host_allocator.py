"""A CPU run keeps freed host memory: a big block freed and asked for again is not faulted in anew."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import ctypes, resource, sys
from relm.memory.host_allocator import keep_freed_host_memory
if sys.argv[1] == "keep":
    assert keep_freed_host_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
faults = []
for _ in range(3):  # 256 MiB written, then freed, as a step's logits are
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(256 << 20)
    ctypes.memset(block, 1, 256 << 20)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    libc.free(block)
print(faults[-1])
"""


def _faults_of_a_repeated_block(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1])


def test_freed_big_blocks_are_reused_without_page_faults():
    # 256 MiB is 65,536 pages of 4 KiB: glibc's default mmap/munmap faults each in again every time
    assert _faults_of_a_repeated_block("default") > 10_000
    assert _faults_of_a_repeated_block("keep") < 1_000


FRAGMENTS = """
import ctypes
from relm.memory import host_allocator
from relm.memory.host_allocator import keep_freed_host_memory, release_heap_fragments
assert keep_freed_host_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
MIB = 1 << 20
def written(size):
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    return block
def holes(size, count):  # blocks freed with a small live allocation after each: holes nothing bigger fits
    pins = []
    for _ in range(count):
        block = written(size)
        pins.append(written(4096))
        libc.free(block)
    return pins
pins = holes(64 * MIB, 2)
first = release_heap_fragments()  # the first micro-batch sets the allowance: ~128 MiB resident and free
pins += holes(96 * MIB, 3)  # 288 MiB more of holes: a bigger block fits none of the earlier ones
def resident_free():
    return (host_allocator._resident_bytes() - host_allocator._kept.used_bytes()) // MIB
before = resident_free()
second = release_heap_fragments()
after = resident_free()
print(first, second, before, after, release_heap_fragments())
"""


def test_a_fragmented_kept_heap_gives_its_holes_back_past_the_allowance():
    # blocks over glibc's 32 MiB mmap threshold stay in the heap; freed between small live ones they leave
    # holes a later, larger block cannot use, so the heap (and the process's peak) would grow run after run
    done = subprocess.run([sys.executable, "-c", FRAGMENTS], capture_output=True, text=True, check=True)
    first, second, free_before, free_after, third = done.stdout.split()
    assert (first, second, third) == ("False", "True", "False")
    # resident but unallocated MiB (the interpreter's own pages count too): the holes are gone after
    assert int(free_before) - int(free_after) > 128, (free_before, free_after)


RETURNED = """
import ctypes, resource, sys
from relm.memory.host_allocator import set_host_allocator
if sys.argv[1] == "several":
    assert set_host_allocator(world_size=4)
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
faults = []
for _ in range(3):  # 8 MiB blocks, as FSDP's gathered weights and gradients of one layer
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(8 << 20)
    ctypes.memset(block, 1, 8 << 20)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    libc.free(block)
print(faults[-1])
"""


def test_a_data_parallel_cpu_run_gives_freed_blocks_back():
    def faults(mode: str) -> int:
        done = subprocess.run(
            [sys.executable, "-c", RETURNED, mode], capture_output=True, text=True, check=True
        )
        return int(done.stdout.split()[-1])

    # glibc's dynamic threshold moves a freed 8 MiB block to the heap, which keeps it (reused: no faults);
    # with several ranks every such block is unmapped when freed, so the next one faults its 2,048 pages in
    assert faults("default") < 500
    assert faults("several") > 2_000
