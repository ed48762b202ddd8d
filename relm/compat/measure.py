"""Measuring a stage: a wall-clock limit that turns a hang into a failure, peak memory, and the
warnings relm logged meanwhile."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator

import torch


class StageTimeout(Exception):
    """A stage ran past its time limit."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise `StageTimeout` inside the block after `seconds` (main thread only; elsewhere no limit).

    SIGALRM interrupts Python between bytecodes, and every stage returns to Python between kernels
    and decoding steps, so a generation loop that never finishes is stopped within one step. A hang
    inside a single C call (a deadlocked collective) is out of its reach; a subprocess would be
    needed for that, at the price of re-importing torch per model.
    """
    usable = (
        seconds > 0 and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    )
    if not usable:
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise StageTimeout(f"ran past its time limit of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class MemoryMeter:
    """Peak memory of a block: CUDA max allocated on a GPU, peak RSS growth (sampled) on CPU.

    RSS growth over the block's start, not absolute RSS, so that a model checked after others is
    not charged for the interpreter, torch and what earlier models left in the allocator's cache.
    """

    def __init__(self, device: torch.device, interval_s: float = 0.005) -> None:
        self.device = device
        self.interval_s = interval_s
        self.peak_mb: float | None = None
        self.kind = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._base = self._peak = 0

    def __enter__(self) -> MemoryMeter:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.kind = "cuda max allocated"
        elif os.path.exists("/proc/self/statm"):
            self.kind = "cpu peak rss growth"
            self._base = self._peak = _rss_bytes()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._peak = max(self._peak, _rss_bytes())

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            self.peak_mb = torch.cuda.max_memory_allocated(self.device) / 2**20
        elif self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._peak = max(self._peak, _rss_bytes())
            self.peak_mb = (self._peak - self._base) / 2**20


class WarningCollector(logging.Handler):
    """Collects the messages of WARNING and above logged under `relm` (pad fallbacks and the like)."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message not in self.messages:
            self.messages.append(message)


@contextlib.contextmanager
def collect_warnings(logger_name: str = "relm") -> Iterator[WarningCollector]:
    log = logging.getLogger(logger_name)
    collector = WarningCollector()
    previous_level = log.level
    if log.getEffectiveLevel() > logging.WARNING:
        log.setLevel(logging.WARNING)
    log.addHandler(collector)
    try:
        yield collector
    finally:
        log.removeHandler(collector)
        log.setLevel(previous_level)
