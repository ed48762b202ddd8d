"""Host memory: how much the run may take, and a watchdog that ends it in words before the kernel does.

The kernel's out-of-memory killer ends a process with SIGKILL: no message, no checkpoint, no report. A 7B
PPO check on a 128 GB machine went that way with its pinned offload buffers at 125 GiB. Two things stop
that here. Before loading, the plan's host bytes are compared with what the machine can give
(`host_room`): MemAvailable, and the cgroup's limit where one is set (v2 `memory.max`, v1
`memory.limit_in_bytes`), never MemTotal, which counts memory other processes hold (and on some hosts
starts small and grows). While the run goes, `HostWatchdog` polls the same figures a few times a second
(two small /proc reads) and, when the machine's available memory falls under a floor or the process
passes the user's budget (`trainer.max_host_memory_gb`), interrupts the main thread with
`HostMemoryShort`, a `UserError` that names the phase running (exit 2, one line).
"""

from __future__ import annotations

import _thread
import logging
import os
import resource
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from relm.errors import UserError

logger = logging.getLogger("relm")
GB = 10**9
FLOOR_BYTES = 1 << 30
"""Available memory under which the watchdog stops the run: the handler, the logs and the exit need room,
and the kernel's killer acts near zero."""
POLL_SECONDS = 0.25
"""Between two readings; a reading is two small /proc reads (tens of microseconds)."""
_SIGNAL = signal.SIGUSR1


class HostMemoryShort(UserError):
    """Host memory ran short while the run was going (raised in the main thread by `HostWatchdog`)."""


def available_host_bytes(
    meminfo: Path = Path("/proc/meminfo"), cgroup: Path = Path("/sys/fs/cgroup")
) -> int | None:
    """MemAvailable, or less where a cgroup limit (v2, or v1) leaves less; None where nothing can be read."""
    candidates = []
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                candidates.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    for limit_file, usage_file in (
        ("memory.max", "memory.current"),
        ("memory.limit_in_bytes", "memory.usage_in_bytes"),
    ):
        try:
            limit = (cgroup / limit_file).read_text().strip()
            # v1 writes "no limit" as a huge number (PAGE_COUNTER_MAX pages); anything above 2**60 is none
            if limit != "max" and int(limit) < 1 << 60:
                candidates.append(int(limit) - int((cgroup / usage_file).read_text().strip()))
        except (OSError, ValueError):
            pass
    return min(candidates) if candidates else None


def process_rss_bytes() -> int:
    """The process's resident memory now (pinned buffers included: they are resident by definition)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    """The process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def host_room(budget_bytes: int | None, available: int | None = None, rss: int | None = None) -> int | None:
    """Bytes this process may still take: the machine's available memory, cut by the user's budget.

    Args:
        budget_bytes: `trainer.max_host_memory_gb` in bytes (the whole process's), or None.
        available: `available_host_bytes()` (read when not given).
        rss: `process_rss_bytes()` (read when not given): what the process holds counts against its budget.

    Returns:
        The room, or None where neither a budget is set nor the machine's memory can be read.
    """
    available = available_host_bytes() if available is None else available
    if budget_bytes is not None:
        left = budget_bytes - (process_rss_bytes() if rss is None else rss)
        available = left if available is None else min(available, left)
    return None if available is None else max(available, 0)


class HostWatchdog:
    """A daemon thread that ends the run with `HostMemoryShort` before host memory runs out.

    Started and stopped in the main thread (it installs a handler for SIGUSR1 there, the signal
    `_thread.interrupt_main` simulates). The error names `phase()`, the part of the step that was
    running, and the figures.

    Args:
        phase: what the run is doing now (`"update_actor of step 3"`).
        budget_bytes: the process's budget (`trainer.max_host_memory_gb`), or None.
        floor_bytes: the machine's available memory under which the run stops.
        poll_seconds: time between readings.
    """

    def __init__(
        self,
        phase: Callable[[], str],
        budget_bytes: int | None = None,
        floor_bytes: int = FLOOR_BYTES,
        poll_seconds: float = POLL_SECONDS,
    ) -> None:
        self.phase, self.budget_bytes = phase, budget_bytes
        self.floor_bytes, self.poll_seconds = floor_bytes, poll_seconds
        self.reason: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous_handler: object = None

    def check(self, available: int | None, rss: int) -> str | None:
        """The reason to stop for one reading, or None (a pure function of the reading, for tests)."""
        if self.budget_bytes is not None and rss > self.budget_bytes:
            return (
                f"the process holds {rss / GB:.1f} GB of host memory, over trainer.max_host_memory_gb="
                f"{self.budget_bytes / GB:g}"
            )
        if available is not None and available < self.floor_bytes:
            return (
                f"the machine has {available / GB:.2f} GB of host memory left (the process holds "
                f"{rss / GB:.1f} GB)"
            )
        return None

    def start(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            # only the main thread can take the interruption (an app running training in a thread)
            logger.warning("host-memory watchdog off: training runs outside the main thread")
            return
        self._previous_handler = signal.signal(_SIGNAL, self._raise)
        self._thread = threading.Thread(target=self._watch, name="relm-host-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._previous_handler is not None:
            signal.signal(_SIGNAL, self._previous_handler)  # type: ignore[arg-type]

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            reason = self.check(available_host_bytes(), process_rss_bytes())
            if reason is not None:
                self.reason = f"{reason} during {self.phase()}"
                _thread.interrupt_main(_SIGNAL)
                return

    def _raise(self, signum: int, frame: object) -> None:
        raise HostMemoryShort(
            f"host memory ran short: {self.reason}; the run stopped before the kernel's out-of-memory killer "
            "would end it; shorten data.max_response_length or data.train_batch_size, raise "
            "trainer.max_host_memory_gb, or free host memory (docs/memory.md)"
        )


@contextmanager
def watching(watchdog: HostWatchdog | None) -> Iterator[None]:
    """Run the block under `watchdog` (nothing when None)."""
    if watchdog is None:
        yield
        return
    watchdog.start()
    try:
        yield
    finally:
        watchdog.stop()
