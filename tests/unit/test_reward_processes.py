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
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


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
