"""Processes that reward code starts end with its worker, and reward code cannot signal the trainer.

Each reward writes the pids of what it starts into a folder, so the test can see them end (and kill
what is left, so a failing run leaves no `sleep` behind).
"""

from __future__ import annotations

import contextlib
import os
import signal
import textwrap
import time
from pathlib import Path

import pytest

from relm.errors import UserError
from relm.processes import read_process
from relm.rewards.calls import Row
from relm.rewards.pool import RewardPool, RewardSource

# A plain child (holds the worker's stdout) and a daemon that double-forks and leaves the session.
SPAWNING = """
import os
import subprocess

def compute_score(data_source, solution_str, ground_truth, extra_info):
    child = subprocess.Popen(["sleep", "600"])
    open(os.path.join({pids!r}, f"{{extra_info['i']}}-{{child.pid}}"), "w").close()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            open(os.path.join({pids!r}, f"{{extra_info['i']}}-{{os.getpid()}}"), "w").close()
            os.execvp("sleep", ["sleep", "601"])
        os._exit(0)
    if data_source == "sleeps":
        os.wait()
        import time
        time.sleep(10_000)
    return 1.0
"""


def _rows(*data_sources: str) -> list[Row]:
    return [Row(i, data_source, "s", "a", {"i": i}) for i, data_source in enumerate(data_sources)]


def _alive(pid: int) -> bool:
    row = read_process(pid)
    return row is not None and row.state != "Z"


@pytest.fixture
def pids(tmp_path: Path):
    folder = tmp_path / "pids"
    folder.mkdir()
    yield folder
    for entry in folder.iterdir():  # whatever the test left behind
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(entry.name.split("-")[1]), signal.SIGKILL)


def _pool(tmp_path: Path, source: str, **kwargs) -> RewardPool:
    path = tmp_path / "reward.py"
    path.write_text(textwrap.dedent(source))
    return RewardPool(RewardSource(path=str(path)), **kwargs)


def _started(pids: Path, row: str = "") -> list[int]:
    return [int(entry.name.split("-")[1]) for entry in pids.glob(f"{row or '*'}-*")]


def _wait_gone(started: list[int], seconds: float = 3.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(pid) for pid in started):
        time.sleep(0.05)
    return [pid for pid in started if _alive(pid)]


def test_children_and_escaped_daemons_end_at_close_and_with_a_timed_out_worker(tmp_path: Path, pids: Path):
    pool = _pool(tmp_path, SPAWNING.format(pids=str(pids)), num_workers=2, timeout_s=2.0)
    try:
        outcomes = pool.score(_rows("ok", "ok", "ok", "sleeps"))
        assert [o.kind for o in outcomes] == ["ok", "ok", "ok", "timeout"]
        started = _started(pids)
        assert len(started) == 8
        # The timed-out worker's processes went with it (those of row 3 at least); the rest live until close.
        assert _wait_gone(_started(pids, row="3"), seconds=0.5) == []
    finally:
        pool.close()
    assert _wait_gone(started) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_reward_that_signals_the_trainer_is_a_user_error_and_no_signal_arrives(tmp_path: Path, sig):
    received: list[int] = []
    catchable = (signal.SIGTERM, signal.SIGINT)
    previous = {s: signal.signal(s, lambda signum, frame: received.append(signum)) for s in catchable}
    pool = _pool(
        tmp_path,
        f"""
        import os

        def compute_score(data_source, solution_str, ground_truth, extra_info):
            try:
                os.kill(os.getppid(), {int(sig)})
            except BaseException:
                pass  # a reward that swallows everything does not get to go on
            return 1.0
        """,
        num_workers=1,
        timeout_s=10.0,
    )
    try:
        with pytest.raises(
            UserError,
            match=rf"reward function compute_score from '.*reward.py' sent {sig.name} to the trainer",
        ):
            pool.score(_rows("ok", "ok"))
        time.sleep(0.2)
    finally:
        pool.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    assert received == []


# Signals sent without os.kill. The `-1` case (every process) runs only in a worker whose seccomp filter
# is on, in a shell it starts, and with SIGWINCH (ignored by default): should the filter let it through
# on this shared machine, nothing but this test would notice.
SIGNALLING_AROUND_OS_KILL = """
import ctypes
import os
import signal
import subprocess

def _filtered():
    with open("/proc/self/status", encoding="utf-8") as f:
        return "Seccomp:\\t2" in f.read()

def compute_score(data_source, solution_str, ground_truth, extra_info):
    trainer = os.getppid()
    if data_source == "filtered":
        return float(_filtered())
    if data_source == "kill_command":  # a child process that sends it
        return float(subprocess.run(["kill", "-TERM", str(trainer)], capture_output=True).returncode)
    if data_source == "ctypes":
        libc = ctypes.CDLL(None, use_errno=True)
        return float(ctypes.get_errno()) if libc.kill(trainer, int(signal.SIGTERM)) != 0 else 0.0
    if data_source == "exists":  # signal 0 sends nothing and stays allowed
        return float(ctypes.CDLL(None, use_errno=True).kill(trainer, 0) == 0)
    if data_source == "everyone":
        if not _filtered():
            return -1.0
        return float(os.system("kill -WINCH -1 2>/dev/null") != 0)
    return 7.0
"""


def test_a_reward_cannot_signal_the_trainer_with_a_kill_command_ctypes_or_kill_minus_1(tmp_path: Path):
    received: list[int] = []
    recorded = (signal.SIGTERM, signal.SIGINT, signal.SIGWINCH)
    previous = {s: signal.signal(s, lambda signum, frame: received.append(signum)) for s in recorded}
    pool = _pool(tmp_path, SIGNALLING_AROUND_OS_KILL, num_workers=1, timeout_s=10.0)
    try:
        names = ["filtered", "kill_command", "ctypes", "exists", "everyone"]
        got = {name: (o.kind, o.score) for name, o in zip(names, pool.score(_rows(*names)), strict=True)}
        # The worker's seccomp filter is on, and each call failed: `kill` exits 1, errno is EPERM (1).
        assert got == {name: ("ok", 1.0) for name in names}
        time.sleep(0.2)
        assert [(o.kind, o.score) for o in pool.score(_rows("ok", "ok"))] == [("ok", 7.0), ("ok", 7.0)]
        assert pool.num_replaced == 0  # the worker went on scoring
    finally:
        pool.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    assert received == []
