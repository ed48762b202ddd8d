"""A watchdog that turns a generation without progress into an error naming the stage and the engine's state.

The failure users of RL frameworks report most about vLLM rollouts is a run that stops moving ("engine
stuck at waiting for new requests") and sits there until someone notices. Here every `generate` call of
the trainer runs under `StallWatchdog.guard`: engines call `beat()` whenever a token is produced, and when
no beat comes for `actor_rollout_ref.rollout.timeout_s` the generating thread gets `RolloutStalled`, whose
message says which stage was generating and what the engine was doing (requests waiting, running, ...).

The exception is raised asynchronously in the generating thread, so it lands at its next Python bytecode:
vLLM's scheduler loop, relm's decode loops. A thread stuck inside one C call (a deadlocked collective, a
GPU kernel that never ends) never runs another bytecode; for that case the watchdog prints the same
message and ends the process after `grace_s`, so a run never hangs silently.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from relm.rollout.base import GenerationOutput, RolloutEngine, SamplingParams

STALL_EXIT_CODE = 1
"""Exit code when the generating thread could not be interrupted (it was stuck inside a C call)."""


class RolloutStalled(RuntimeError):
    """Generation made no progress for `rollout.timeout_s` seconds."""


class _Interrupt(BaseException):
    """Injected into the generating thread; `guard` turns it into `RolloutStalled` with the message.

    A BaseException, so that no `except Exception` between the engine's loop and `guard` swallows it.
    """


class StallWatchdog:
    """Raises `RolloutStalled` in a thread that runs `guard` and stops calling `beat` for `timeout_s`.

    Args:
        timeout_s: seconds without a beat before the generating thread is interrupted.
        grace_s: seconds the interrupted thread has to leave `guard` before the process is ended.
        poll_s: how often the watchdog thread looks at the clock; None is min(1 s, timeout_s / 4).
    """

    def __init__(self, timeout_s: float, *, grace_s: float = 30.0, poll_s: float | None = None) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self.grace_s = grace_s
        self.poll_s = poll_s if poll_s is not None else min(1.0, timeout_s / 4)
        self.num_beats = 0
        """Beats within the current `guard` (decoding steps that produced tokens)."""
        self._last_beat = time.monotonic()

    def beat(self) -> None:
        """Progress was made (called by engines from their step loops)."""
        self.num_beats += 1
        self._last_beat = time.monotonic()

    @contextlib.contextmanager
    def guard(self, stage: str, describe_state: Callable[[], str]) -> Iterator[None]:
        """Watch the block run in this thread; `describe_state` is called once, when it has stalled."""
        self.num_beats, self._last_beat = 0, time.monotonic()
        watcher = _Watcher(self, threading.get_ident(), stage, describe_state)
        watcher.start()
        try:
            try:
                yield
            finally:
                if watcher.finish():
                    # Interrupted as the block ended: the exception may still be pending; clear it so
                    # that it cannot land in the caller.
                    _set_async_exception(watcher.thread_id, None)
        except _Interrupt:
            watcher.finish()  # it may have landed inside the `finally` above, before `finish` ran
            raise RolloutStalled(watcher.message) from None


class _Watcher(threading.Thread):
    """The thread behind one `guard`: sleeps, checks the last beat, interrupts, and if need be exits."""

    def __init__(
        self, dog: StallWatchdog, thread_id: int, stage: str, describe_state: Callable[[], str]
    ) -> None:
        super().__init__(name="relm-rollout-watchdog", daemon=True)
        self.dog, self.thread_id, self.stage, self.describe_state = dog, thread_id, stage, describe_state
        self.message = ""
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._interrupted = False

    def finish(self) -> bool:
        """Stop watching; True when the generating thread was interrupted."""
        with self._lock:
            self._done.set()
            return self._interrupted

    def run(self) -> None:
        while not self._done.wait(self.dog.poll_s):
            idle = time.monotonic() - self.dog._last_beat
            if idle < self.dog.timeout_s:
                continue
            self.message = self._describe(idle)
            with self._lock:
                if self._done.is_set():
                    return
                self._interrupted = True
                _set_async_exception(self.thread_id, _Interrupt)
            if not self._done.wait(self.dog.grace_s):
                # The thread runs no bytecode, so the exception cannot land: say why and end the run.
                print(
                    f"error: {self.message}; the generating thread did not return to Python within "
                    f"{self.dog.grace_s:g} s, so relm ends the process",
                    file=sys.stderr,
                    flush=True,
                )
                sys.stdout.flush()
                os._exit(STALL_EXIT_CODE)
            return

    def _describe(self, idle: float) -> str:
        try:
            state = self.describe_state()
        except Exception as exc:  # noqa: BLE001 - the state is a courtesy; the stall is the error
            state = f"state unavailable ({type(exc).__name__}: {exc})"
        return (
            f"{self.stage}: generation made no progress for {idle:.1f} s "
            f"(actor_rollout_ref.rollout.timeout_s={self.dog.timeout_s:g}) after {self.dog.num_beats} "
            f"decoding steps; engine state: {state}"
        )


def _set_async_exception(thread_id: int, exception: type[BaseException] | None) -> None:
    """Raise `exception` in the thread at its next bytecode; None clears a pending one."""
    target = ctypes.py_object(exception) if exception is not None else None
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), target)


class WatchedEngine:
    """A `RolloutEngine` whose `generate` runs under a `StallWatchdog`; everything else is the engine's.

    The trainer holds this wrapper, so the watchdog covers every engine without each engine knowing
    about it. Engines that can tell progress finely have a `heartbeat` attribute (a callable they
    invoke per decoding step); it is pointed at the watchdog's `beat`. For any other engine the whole
    `generate` call must finish within the timeout.

    Args:
        engine: the engine to watch.
        timeout_s: seconds without progress before `RolloutStalled`; None turns the watchdog off.
        grace_s: see `StallWatchdog`.
    """

    def __init__(self, engine: RolloutEngine, timeout_s: float | None, *, grace_s: float = 30.0) -> None:
        self.engine = engine
        self.stage = "generation"
        """What the trainer is generating for (`rollout of step 3`, `validation`); set via `engine_stage`."""
        self.watchdog = StallWatchdog(timeout_s, grace_s=grace_s) if timeout_s else None
        if self.watchdog is not None and hasattr(engine, "heartbeat"):
            engine.heartbeat = self.watchdog.beat

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> GenerationOutput:
        if self.watchdog is None:
            return self.engine.generate(prompts, params)

        def describe() -> str:
            own = getattr(self.engine, "describe_state", None)
            call = (
                f"{type(self.engine).__name__} generating for {len(prompts)} prompts x n={params.n}, "
                f"max_new_tokens={params.max_new_tokens}"
            )
            return f"{call}; {own()}" if callable(own) else call

        with self.watchdog.guard(self.stage, describe):
            return self.engine.generate(prompts, params)

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.engine.sync_weights(named_tensors)

    def release_memory(self) -> None:
        self.engine.release_memory()

    def __getattr__(self, name: str) -> Any:
        # Engine-specific attributes (last_stats, fallback_reason, ...) read through the wrapper.
        if name == "engine":  # not set yet (a half-built or copied wrapper): no recursion
            raise AttributeError(name)
        return getattr(self.engine, name)


@contextlib.contextmanager
def engine_stage(engine: Any, stage: str) -> Iterator[None]:
    """Name what `engine` generates for inside the block (shown when it stalls); any engine accepted,
    including a wrapper that holds the watched engine as `.engine` (the data-parallel engine)."""
    while not isinstance(engine, WatchedEngine) and getattr(engine, "engine", None) is not None:
        engine = engine.engine
    if not isinstance(engine, WatchedEngine):
        yield
        return
    previous, engine.stage = engine.stage, stage
    try:
        yield
    finally:
        engine.stage = previous
