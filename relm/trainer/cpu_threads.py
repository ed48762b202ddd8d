"""How many threads torch's CPU kernels use, chosen from how busy the machine's cores are.

torch starts one OpenMP thread per core. Every parallel kernel ends at a barrier where all of them
wait for the slowest; when another process holds one of the cores, the thread on it runs only when the
scheduler lets it, and each of the thousands of small kernels in a step waits for that. Measured on a
2-core machine shared with other work: five demo steps took 492 s of step time with 2 threads and 37 s
with one (docs/benchmarks.md). One thread never waits for a second, so on a busy machine it is the
fast choice; on an idle one every core helps larger models.

So the trainer starts with as many threads as there are cores other processes leave free, and before
every step looks at how much CPU time other processes took during the last one (from /proc/stat and
its own CPU time) and adjusts. `OMP_NUM_THREADS`, when set, is the user's choice and is left alone.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger("relm")

PROC_STAT = Path("/proc/stat")
FREE_SHARE_FOR_A_THREAD = 0.8
"""A core counts as free for one more thread when other processes used less than 20% of it."""
MIN_WINDOW_S = 1.0
"""Shorter windows are too coarse for /proc/stat's 10 ms ticks: the next call measures a longer one."""


@dataclass(frozen=True)
class CpuSample:
    """CPU time spent so far, in seconds: by all processes on our cores, and by this process."""

    wall_s: float
    busy_s: float
    own_s: float


def parse_busy_seconds(stat_text: str, cpus: set[int], ticks_per_s: float) -> float:
    """Non-idle time of the given cores from /proc/stat's `cpuN` lines (idle and iowait excluded)."""
    busy_ticks = 0
    for line in stat_text.splitlines():
        name, _, rest = line.partition(" ")
        if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus):
            continue
        # user nice system idle iowait irq softirq steal [guest guest_nice: already inside user/nice]
        fields = [int(v) for v in rest.split()[:8]]
        busy_ticks += sum(fields) - fields[3] - fields[4]
    return busy_ticks / ticks_per_s


def others_busy_cores(before: CpuSample, after: CpuSample) -> float:
    """Cores' worth of CPU that other processes used between two samples."""
    wall = after.wall_s - before.wall_s
    if wall <= 0:
        return 0.0
    others = (after.busy_s - before.busy_s) - (after.own_s - before.own_s)
    return max(0.0, others / wall)


def choose_num_threads(num_cpus: int, others_busy: float) -> int:
    """One thread per core that other processes leave (almost) free, and at least one."""
    return max(1, min(num_cpus, math.floor(num_cpus - others_busy + (1 - FREE_SHARE_FOR_A_THREAD))))


class CpuThreads:
    """Keeps `torch.set_num_threads` at the number of cores other processes leave free.

    Call `adjust()` before each training step. Inactive (does nothing) off Linux, off CPU training, or
    when `OMP_NUM_THREADS` is set.
    """

    def __init__(self, device: torch.device | str) -> None:
        self._cpus = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()
        self._ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.active = (
            torch.device(device).type == "cpu"
            and not os.environ.get("OMP_NUM_THREADS")
            and PROC_STAT.is_file()
            and len(self._cpus) > 1
        )
        self._last: CpuSample | None = None
        if self.active:
            self._set(choose_num_threads(len(self._cpus), self._runnable_others()), "at start")
            self._last = self._sample()

    def _sample(self) -> CpuSample:
        busy = parse_busy_seconds(PROC_STAT.read_text(), self._cpus, self._ticks)
        return CpuSample(wall_s=time.monotonic(), busy_s=busy, own_s=time.process_time())

    def _runnable_others(self) -> float:
        """Processes other than this one ready to run now (median of a few looks at procs_running)."""
        counts = []
        for _ in range(5):
            for line in PROC_STAT.read_text().splitlines():
                if line.startswith("procs_running "):
                    counts.append(int(line.split()[1]) - 1)  # minus this thread
            time.sleep(0.01)
        return float(sorted(counts)[len(counts) // 2]) if counts else 0.0

    def _set(self, num_threads: int, why: str) -> None:
        if num_threads != torch.get_num_threads():
            logger.debug("CPU threads: %d of %d cores (%s)", num_threads, len(self._cpus), why)
            torch.set_num_threads(num_threads)

    def adjust(self) -> None:
        """Re-choose the thread count from other processes' CPU use since the last call."""
        if not self.active or self._last is None:
            return
        now = self._sample()
        if now.wall_s - self._last.wall_s < MIN_WINDOW_S:
            return
        others = others_busy_cores(self._last, now)
        self._last = now
        self._set(choose_num_threads(len(self._cpus), others), f"others used {others:.2f} cores")
