"""Graceful stop on SIGTERM / SIGINT: finish the step in progress, save, exit 0.

A job scheduler (SLURM, Kubernetes) sends SIGTERM some seconds before SIGKILL, and a user presses
Ctrl-C; in both cases the hours of work since the last checkpoint should not be lost, yet stopping
in the middle of an optimizer update would leave weights and optimizer state out of step. So the
handler only records the request; the loop looks at it between steps. A second signal means "now":
it raises `KeyboardInterrupt` at once (exit code 130 through `run_guarded`), which is safe because a
save interrupted half-way is never read (see `trainer/checkpoint.py`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

logger = logging.getLogger("relm")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """Whether (and by which signal) the run was asked to stop; set from the signal handler."""

    def __init__(self) -> None:
        self.signal_name: str | None = None

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def handle(self, signum: int, frame: FrameType | None) -> None:
        """First signal: remember it and say so. Second: abort at once."""
        name = signal.Signals(signum).name
        if self.requested:
            raise KeyboardInterrupt(f"second stop signal ({name})")
        self.signal_name = name
        # os.write, not print or logging: the handler may run while the main thread is inside a
        # buffered write to stderr, and re-entering that buffer raises RuntimeError.
        message = (
            f"relm: received {name}: finishing the current step, then saving a checkpoint "
            f"(send {name} again to abort without saving)\n"
        )
        os.write(2, message.encode())


@contextlib.contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """Install the SIGTERM/SIGINT handlers for the duration of the block, then restore the old ones.

    Signal handlers can only be set from the main thread; elsewhere (a training loop driven from a
    worker thread) the block runs with the default behaviour and a request that never comes.
    """
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        logger.debug("not the main thread: SIGTERM/SIGINT keep their default behaviour")
        yield request
        return
    previous = {sig: signal.signal(sig, request.handle) for sig in STOP_SIGNALS}
    try:
        yield request
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
