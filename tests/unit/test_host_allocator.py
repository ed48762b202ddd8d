"""A CPU run keeps freed host memory: a big tensor allocated again, step after step, is not faulted in anew."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import resource, sys, torch
from relm.memory.host_allocator import keep_freed_host_memory
if sys.argv[1] == "keep":
    assert keep_freed_host_memory()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(2):  # 256 MiB, freed at once (glibc settles its heap over the first two)
    torch.ones(64 << 20)
before = faults()
torch.ones(64 << 20)
print(faults() - before)
"""


def _faults_of_second_allocation(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1])


def test_freed_big_blocks_are_reused_without_page_faults():
    # 256 MiB is 65,536 pages of 4 KiB: glibc's mmap/munmap faults each in again (fewer with huge pages)
    assert _faults_of_second_allocation("default") > 10_000
    assert _faults_of_second_allocation("keep") < 1_000
