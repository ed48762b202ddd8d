"""Torch's CPU thread count follows the cores other processes leave free."""

from __future__ import annotations

import pytest
import torch

from relm.trainer import cpu_threads
from relm.trainer.cpu_threads import (
    CpuSample,
    CpuThreads,
    choose_num_threads,
    others_busy_cores,
    parse_busy_seconds,
)

STAT = """cpu  900 0 300 5000 100 0 0 0 0 0
cpu0 500 0 100 2000 50 0 0 0 0 0
cpu1 400 0 200 3000 50 0 0 0 0 0
intr 1 2 3
procs_running 3
"""


def test_busy_seconds_of_our_cores_leave_idle_and_iowait_out():
    assert parse_busy_seconds(STAT, {0, 1}, ticks_per_s=100) == pytest.approx(12.0)
    assert parse_busy_seconds(STAT, {1}, ticks_per_s=100) == pytest.approx(6.0)


def test_others_busy_cores_subtract_our_own_cpu_time():
    before = CpuSample(wall_s=0.0, busy_s=0.0, own_s=0.0)
    after = CpuSample(wall_s=10.0, busy_s=15.0, own_s=10.0)  # we used one core, others half of one
    assert others_busy_cores(before, after) == pytest.approx(0.5)
    assert others_busy_cores(after, after) == 0.0


@pytest.mark.parametrize(
    ("others", "threads"),
    [(0.0, 2), (0.15, 2), (0.3, 1), (1.0, 1), (2.0, 1), (5.0, 1)],
)
def test_a_thread_per_core_that_others_leave_free(others: float, threads: int):
    assert choose_num_threads(2, others) == threads


def test_eight_cores_with_two_busy_get_six_threads():
    assert choose_num_threads(8, 2.0) == 6


def test_the_users_omp_num_threads_and_gpu_runs_are_left_alone(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert not CpuThreads("cpu").active
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert not CpuThreads("cuda").active


def test_busy_machine_drops_to_one_thread_and_a_quiet_one_gets_all(monkeypatch, tmp_path):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(cpu_threads.os, "sched_getaffinity", lambda _: {0, 1})
    stat = tmp_path / "stat"
    stat.write_text(STAT)  # procs_running 3: two other processes ready to run
    monkeypatch.setattr(cpu_threads, "PROC_STAT", stat)
    original = torch.get_num_threads()
    try:
        threads = CpuThreads("cpu")
        assert threads.active and torch.get_num_threads() == 1
        # One quiet window of a second: nobody else used CPU time.
        monkeypatch.setattr(
            threads, "_sample", lambda: CpuSample(wall_s=threads._last.wall_s + 2, busy_s=0, own_s=0)
        )
        threads._last = CpuSample(wall_s=threads._last.wall_s, busy_s=0, own_s=0)
        threads.adjust()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(original)
