"""A pool of reward worker processes: each response scored under a time limit, a dead worker replaced.

A reward is the user's code, and the ways it goes wrong in a long run are a call that never returns
(a regex that backtracks for ever, a symbolic comparison that does not finish), a crash that takes the
process with it, and memory that grows call after call. In the training process any of these stops the
run, so scoring runs in worker processes that the trainer watches:

- a call that takes longer than `timeout_s` ends with its worker killed (SIGKILL: a worker stuck in C
  code ignores everything else); that response is a `timeout`, the rest of the worker's rows go to
  another worker, and a fresh worker takes its place;
- a worker that dies (killed by the OOM killer or a user's `kill -9`) costs the response it was scoring,
  counted as an `error`, and is replaced;
- a worker whose resident memory passes `memory_limit_mb` is killed and replaced the same way.

Workers start with `spawn`: the trainer holds torch's threads and possibly CUDA, which a forked child
must not inherit. They stay up across steps (a start costs about a second of imports), take rows in
chunks and stream one result back per row, so a step pays one message per response, not one round
trip. They ignore SIGINT and SIGTERM: a scheduler may signal every process of a job, and the trainer's
own handler finishes the step (which needs the workers) before it stops.

Each worker leads its own session, holds its orphaned descendants and dies with the trainer; a worker
killed for time or memory, a dead one and every worker at `close` (also on errors and at exit) end
with all the processes the reward started (`process_tree`). A reward that calls `os.kill` on the
trainer ends the run with a `UserError` naming the function and the signal; any other way of
signalling it (a `kill` command, ctypes, a child) fails with EPERM in the kernel (`signal_filter`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing
import os
import platform
import signal
import sys
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from relm.errors import UserError
from relm.rewards import signal_filter
from relm.rewards.calls import Outcome, Row, score_rows
from relm.rewards.process_tree import guard_signals, isolate_worker, kill_tree

logger = logging.getLogger("relm")

_MEMORY_POLL_S = 0.05
"""How often a busy pool reads its workers' resident memory when a limit is set."""
_MAX_LOAD_DEATHS = 3
"""Workers in a row that may die before they finish loading the function before the run ends."""
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class RewardSource:
    """Where a worker finds the scoring function.

    A function loaded from a user's file lives in a module a fresh process cannot import by name, so
    such a function travels as its file and name and each worker loads it; any other function (the
    built-in dispatch, a function in an importable module) travels by reference.
    """

    path: str | None = None
    """`custom_reward_function.path` (a .py file, or `pkg://package.module`)."""
    name: str = "compute_score"
    """`custom_reward_function.name`."""
    function: Callable[..., Any] | None = None
    """An importable function, used when `path` is unset."""
    batched: bool = False
    """verl's `batch` reward manager: one call for many responses, with the plural argument names."""

    def load(self) -> Callable[..., Any]:
        if self.path:
            from relm.rewards.custom import load_custom_reward

            return load_custom_reward(self.path, self.name, batched=self.batched)
        if self.function is None:
            raise ValueError("RewardSource needs a path or a function")
        return self.function

    def describe(self) -> str:
        """How the user named it, for messages."""
        if self.path:
            return f"{self.name} from '{self.path}'"
        return getattr(self.function, "__qualname__", repr(self.function))


def _worker_main(conn: Connection, source: RewardSource, trainer_pid: int) -> None:
    """A worker's life: set itself apart, load the function, say ready, score chunks until told to stop.

    It ends quietly when the trainer is gone (a closed pipe, or the parent-death signal).
    """
    with contextlib.suppress(EOFError, OSError):
        _serve(conn, source, trainer_pid)


def _serve(conn: Connection, source: RewardSource, trainer_pid: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    isolate_worker(trainer_pid)
    guard_signals(trainer_pid, lambda what: conn.send(("signalled_trainer", what)))
    signal_filter.install(trainer_pid)  # the kernel's backstop: a `kill` command, ctypes, children
    try:
        function = source.load()
    except BaseException as exc:  # noqa: BLE001 - reported to the trainer, which names it
        conn.send(("load_failed", " ".join(f"{type(exc).__name__}: {exc}".split())[:300]))
        return
    conn.send(("ready",))
    while True:
        rows = conn.recv()
        if rows is None:
            return
        for index, outcome in score_rows(function, rows, source.batched):
            conn.send((index, outcome))


@dataclass
class _Worker:
    process: multiprocessing.process.BaseProcess
    conn: Connection
    ready: bool = False
    pending: deque[int] = field(default_factory=deque)
    """Row indices sent and not yet answered, in the order the worker scores them."""
    deadline: float = math.inf
    """When the row the worker is on (all of them, for a batched call) runs out of time."""
    answered: int = 0
    """Rows it has scored: none yet means what it holds is the loaded file's, not a leak."""


class RewardPool:
    """`num_workers` reward processes that score rows with `source`'s function.

    Args:
        source: The scoring function.
        num_workers: Processes (at least 1).
        timeout_s: Time limit of one call (one response; one chunk for a batched function).
        memory_limit_mb: Resident memory past which a worker is replaced (None: no limit).
    """

    def __init__(
        self,
        source: RewardSource,
        num_workers: int,
        timeout_s: float,
        memory_limit_mb: float | None = None,
    ) -> None:
        self.source = source
        self.timeout_s = timeout_s
        self.memory_limit_mb = memory_limit_mb
        self._context = multiprocessing.get_context("spawn")
        if sys.platform.startswith("linux") and not signal_filter.supported():
            logger.warning(
                "reward workers on %s have no seccomp filter: reward code can signal the trainer "
                "other than through os.kill (docs/security.md)",
                platform.machine(),
            )
        self._workers: list[_Worker] = [self._start() for _ in range(num_workers)]
        self._load_deaths = 0
        self.num_replaced = 0
        """Workers replaced since the pool started (killed for time or memory, or died)."""
        self._finalizer = weakref.finalize(self, _stop_all, self._workers)

    def _start(self) -> _Worker:
        # Not a daemon: a user's function may start processes of its own (verl's math_verify does).
        parent, child = self._context.Pipe()
        process = self._context.Process(
            target=_worker_main, args=(child, self.source, os.getpid()), name="relm-reward"
        )
        process.start()
        child.close()
        return _Worker(process, parent)

    @property
    def pids(self) -> list[int]:
        """Process ids of the live workers (tests kill them)."""
        return [w.process.pid for w in self._workers if w.process.pid is not None]

    def score(self, rows: Sequence[Row]) -> list[Outcome]:
        """Score every row; each gets an outcome, a `timeout` or `error` one when its call failed.

        Raises:
            UserError: A worker could not load the function.
        """
        outcomes: dict[int, Outcome] = {}
        by_index = {row.index: row for row in rows}
        chunk = max(1, math.ceil(len(rows) / (2 * len(self._workers))))
        queue = deque(list(rows[start : start + chunk]) for start in range(0, len(rows), chunk))
        while len(outcomes) < len(rows):
            self._dispatch(queue)
            busy = [w for w in self._workers if w.pending]
            now = time.monotonic()
            limit = min((w.deadline for w in busy), default=math.inf) - now
            if self.memory_limit_mb is not None:
                limit = min(limit, _MEMORY_POLL_S)
            watched = [w.conn for w in self._workers] + [w.process.sentinel for w in self._workers]
            wait(watched, timeout=None if math.isinf(limit) else max(0.0, limit))
            for worker in list(self._workers):
                self._read(worker, outcomes, queue, by_index)
            self._expire(outcomes, queue, by_index)
        return [outcomes[row.index] for row in rows]

    def _dispatch(self, queue: deque[list[Row]]) -> None:
        for worker in self._workers:
            if queue and worker.ready and not worker.pending:
                rows = queue.popleft()
                try:
                    worker.conn.send(rows)
                except OSError:  # died idle (BrokenPipeError): `_read` replaces it, the rows wait
                    queue.appendleft(rows)
                    continue
                worker.pending.extend(row.index for row in rows)
                worker.deadline = time.monotonic() + self.timeout_s

    def _read(
        self, worker: _Worker, outcomes: dict[int, Outcome], queue: deque[list[Row]], by_index: dict[int, Row]
    ) -> None:
        """Take every message the worker has sent; replace it if it died."""
        ended = False
        try:
            while worker.conn.poll():
                message = worker.conn.recv()
                if message[0] == "ready":
                    worker.ready = True
                    self._load_deaths = 0
                elif message[0] == "load_failed":
                    raise UserError(
                        f"reward function {self.source.describe()}: a reward worker could not load it "
                        f"({message[1]}); fix the file or custom_reward_function.name"
                    )
                elif message[0] == "signalled_trainer":
                    raise UserError(
                        f"reward function {self.source.describe()} sent {message[1]}; a reward must not "
                        "signal relm's processes: remove that call from the reward"
                    )
                else:
                    index, outcome = message
                    outcomes[index] = outcome
                    worker.pending.remove(index)
                    worker.answered += 1
                    if not self.source.batched:
                        worker.deadline = time.monotonic() + self.timeout_s
        except (EOFError, OSError):
            ended = True  # every message it sent is read; the exit code below says how it ended
        if not ended and worker.process.is_alive():
            return
        worker.process.join(timeout=1.0)
        _end(worker)
        code = worker.process.exitcode
        if not worker.ready:
            # Killed while it loaded (the OOM killer, a user's kill): start another, unless loading is what
            # kills it (a crash in an extension module, an os._exit in the file).
            self._load_deaths += 1
            if self._load_deaths > _MAX_LOAD_DEATHS:
                raise UserError(
                    f"reward function {self.source.describe()}: reward workers exited while loading it "
                    f"{self._load_deaths} times in a row (last: {_exit_name(code)}); run the file on its own to see why"
                )
        self._replace(
            worker, outcomes, queue, by_index, "error", f"its reward worker died ({_exit_name(code)})"
        )

    def _expire(
        self, outcomes: dict[int, Outcome], queue: deque[list[Row]], by_index: dict[int, Row]
    ) -> None:
        """Kill workers over their time or memory limit."""
        now = time.monotonic()
        for worker in list(self._workers):
            if worker.pending and now > worker.deadline:
                _end(worker)
                self._replace(
                    worker, outcomes, queue, by_index, "timeout", f"took more than {self.timeout_s:g} s"
                )
            elif self.memory_limit_mb is not None and worker.ready:
                used_mb = _resident_mb(worker.process.pid)
                if used_mb is not None and used_mb > self.memory_limit_mb and not worker.answered:
                    # A fresh worker over the limit: every replacement would be too, and would be
                    # replaced again before it scores a row.
                    raise UserError(
                        f"reward_model.memory_limit_mb={self.memory_limit_mb:g}: a reward worker holds "
                        f"{used_mb:.0f} MB before scoring its first response (loading "
                        f"{self.source.describe()}); raise the limit above that"
                    )
                if used_mb is not None and used_mb > self.memory_limit_mb:
                    _end(worker)
                    reason = (
                        f"its reward worker used {used_mb:.0f} MB, over reward_model.memory_limit_mb="
                        f"{self.memory_limit_mb:g}"
                    )
                    self._replace(worker, outcomes, queue, by_index, "error", reason)

    def _replace(
        self,
        worker: _Worker,
        outcomes: dict[int, Outcome],
        queue: deque[list[Row]],
        by_index: dict[int, Row],
        kind: str,
        reason: str,
    ) -> None:
        """The row the worker was on fails with `reason` (all of them for a batched call); the rest
        go back to the queue; a fresh worker takes the dead one's place."""
        pending = list(worker.pending)
        failed = pending if self.source.batched else pending[:1]
        for index in failed:
            outcomes[index] = Outcome(kind, reason=reason)  # type: ignore[arg-type]
        rest = [by_index[index] for index in pending[len(failed) :]]
        if rest:
            queue.appendleft(rest)
        worker.conn.close()
        self._workers[self._workers.index(worker)] = self._start()
        self.num_replaced += 1
        logger.debug("reward worker %s replaced: %s", worker.process.pid, reason)

    def close(self) -> None:
        """Stop every worker (asked first, killed after a second)."""
        self._finalizer()


def _end(worker: _Worker) -> None:
    """Kill the worker (unless already reaped: its pid may be another's) and every process its reward
    started, then reap it."""
    if worker.process.pid is not None:
        kill_tree(worker.process.pid, keep_root=worker.process.exitcode is not None)
    worker.process.join()


def _stop_all(workers: list[_Worker]) -> None:
    """The processes each reward started are killed first (an idle worker is still their subreaper,
    so none has left the tree yet), then the workers are asked to exit, and killed after a second."""
    for worker in workers:
        if worker.process.pid is not None and worker.process.is_alive():
            kill_tree(worker.process.pid, keep_root=not worker.pending)
        with contextlib.suppress(OSError, ValueError):  # already dead, or its pipe closed
            worker.conn.send(None)
    deadline = time.monotonic() + 1.0
    for worker in workers:
        worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
        _end(worker)  # and whatever it started on its way out
        worker.conn.close()


def _resident_mb(pid: int | None) -> float | None:
    """Resident memory of a process in MB, from /proc (None where there is no /proc)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE_BYTES / 2**20
    except (OSError, ValueError, IndexError):
        return None


def _exit_name(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"exit code {code}"
