"""A reward worker's process tree: set apart at start, ended whole at shutdown, kept off the trainer.

A reward is the user's code, and user code starts processes (verl's math_verify does; so does a
`subprocess.Popen(["sleep", "600"])`). Those children inherit the trainer's stdout, so a child left
behind keeps `relm train | tee log` open long after the run ended. Each worker therefore:

- leads its own session (`setsid`): its pid is the process group and session id of everything it
  starts that does not leave them, and a Ctrl-C in the terminal no longer reaches that code directly;
- is a child subreaper (`PR_SET_CHILD_SUBREAPER`): a grandchild whose parent exits (a double-forked
  daemon, a `setsid` that escapes the session) is reparented to the worker, so it stays in the
  worker's tree while the worker lives;
- dies with the trainer (`PR_SET_PDEATHSIG`, SIGKILL): a trainer killed outright takes its workers;
- cannot signal the trainer through `os.kill`/`os.killpg`: the call is refused, reported to the
  trainer (which ends the run naming the function and the signal) and the worker exits; other ways
  (a `kill` command, ctypes, a child) fail in the kernel (`signal_filter`, installed by the pool).

`kill_tree` ends a worker and all of this: it stops every descendant (SIGSTOP, so none forks while it
is being collected), kills them, the worker's session and the worker. What escapes, and is documented
in docs/security.md: processes started through a service outside the tree (systemd-run, ssh, a
container runtime), descendants that left the session after their worker died (a subreaper only
holds them while it lives), descendants of a worker whose trainer was SIGKILLed (nobody is left to
collect them), and signals sent from outside the worker's tree.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Callable

from relm.processes import list_processes

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def tree_of(root: int) -> set[int]:
    """`root`'s descendants and every process in the session `root` leads (root itself excluded)."""
    processes = list_processes()
    children: dict[int, list[int]] = {}
    for proc in processes:
        children.setdefault(proc.ppid, []).append(proc.pid)
    found = {proc.pid for proc in processes if proc.session == root and proc.pid != root}
    stack = [root, *found]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found and child != root:
                found.add(child)
                stack.append(child)
    found.discard(os.getpid())  # never the caller (a trainer that is itself in the tree's session)
    return found


def kill_tree(root: int, *, keep_root: bool = False) -> None:
    """SIGKILL `root`'s descendants and session, then `root` unless `keep_root` (an idle worker that
    is about to be asked to exit; see the module docstring).

    `root` and its descendants are stopped first and collected again until no new one appears, so a
    process that forks in a loop cannot outrun the kill. `root` itself is left for its parent to reap.
    """
    if not keep_root:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(root, signal.SIGSTOP)
    stopped: set[int] = set()
    for _ in range(50):  # each round stops what the last one saw; a fork bomb still ends in a few
        new = tree_of(root) - stopped
        if not new:
            break
        for pid in new:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= new
    for pid in stopped if keep_root else {*stopped, root}:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def isolate_worker(trainer_pid: int) -> None:
    """In a fresh worker: its own session, a subreaper, killed with the trainer (Linux; else only setsid)."""
    with contextlib.suppress(OSError):  # already a session leader
        os.setsid()
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != trainer_pid:  # the trainer died before the line above took effect
        os._exit(0)


def guard_signals(trainer_pid: int, report: Callable[[str], None]) -> None:
    """Refuse `os.kill`/`os.killpg` calls that would reach the trainer: `report` what was sent, then exit.

    The trainer's process group is refused too (the worker left it, so the trainer is in it), and
    `kill(-1, ...)`, which reaches every process the user may signal. The exit is `os._exit`: a
    reward that catches exceptions must not get to go on.
    """
    trainer_group = os.getpgid(trainer_pid)
    real_kill, real_killpg = os.kill, os.killpg

    def refuse(call: str, sig: int) -> None:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        report(f"{name} to the trainer (pid {trainer_pid}) through {call}")
        os._exit(3)

    def kill(pid: int, sig: int) -> None:
        if sig != 0 and pid in (trainer_pid, -trainer_group, -1):
            refuse(f"os.kill({pid}, ...)", sig)
        real_kill(pid, sig)

    def killpg(pgid: int, sig: int) -> None:
        if sig != 0 and pgid == trainer_group:
            refuse(f"os.killpg({pgid}, ...)", sig)
        real_killpg(pgid, sig)

    os.kill, os.killpg = kill, killpg
