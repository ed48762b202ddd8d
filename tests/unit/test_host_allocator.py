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
